"""A 2-host pod simulated on localhost (gloo collectives) trains exactly like 1 host (slow)."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.testlib import pod_testlib
from tests.testlib import xla_test_flags

ROOT = tests.ROOT

TRAIN_ARGS = [*pod_testlib.TINY_SYNTHETIC_TRAIN, "--config.warmup_steps=2",
              "--config.checkpoint_every=4"]


def _env():
  # As a user runs them: no TF_CPP_MIN_LOG_LEVEL (it hid what the programs print, issue 32).
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL")}
  env["JAX_PLATFORMS"] = "cpu"
  env["XLA_FLAGS"] = xla_test_flags.SUBPROCESS   # local_pod adds each host's devices
  return env


def _assert_only_ours(out):
  """A pod's output holds no library line: before issue 32's fix a 2-step pre-training pod printed
  16 `[Gloo] Rank R is connected to N peer ranks` and 3 jax.distributed INFO lines (19 of its 36
  lines), a 1-epoch fine-tune the same 19 (of 40)."""
  assert pod_testlib.library_lines(out) == [], out[-3000:]


def _pod(workdir, steps):
  r = subprocess.run(
      [*pod_testlib.pod_command(), "--timeout_seconds=500", "--", *TRAIN_ARGS,
       f"--workdir={workdir}", f"--config.num_train_steps={steps}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=560)
  assert r.returncode == 0, pod_testlib.failure(r)
  _assert_only_ours(r.stdout + r.stderr)
  return r.stdout + r.stderr


def _single(workdir, steps):
  # No JAX_PLATFORMS, as a user types it: on a CPU host with libtpu installed (the test
  # requirements) bert_jax_core/platforms.py picks the CPU, and the run says nothing on stderr.
  env = {k: v for k, v in _env().items() if k != "JAX_PLATFORMS"}
  env["XLA_FLAGS"] = xla_test_flags.with_devices(8)
  r = subprocess.run([sys.executable, "-m", *TRAIN_ARGS, f"--workdir={workdir}",
                      f"--config.num_train_steps={steps}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
  assert r.stderr == "", r.stderr[-3000:]
  return r.stdout


def _losses(workdir):
  from bert_jax.evaluation import metrics_writer
  scalars = metrics_writer.read_scalars(os.path.join(workdir, "tensorboard"))
  return [v for _, v in sorted(scalars["train/loss"])], scalars


@pytest.mark.slow
def test_two_process_pod_matches_one_process_and_resumes(tmp_path):
  pod_dir, one_dir = str(tmp_path / "pod"), str(tmp_path / "one")
  out = _pod(pod_dir, 4)
  one = _single(one_dir, 4)
  # The global batch is the configured 16 whatever the host count; each host feeds its 8 rows.
  assert "[p0] mesh {'data': 8, 'fsdp': 1, 'tensor': 1} on 8 devices, 2 host(s); global " \
         "batch 16 = 2 x 8 rows per host" in out, out[-3000:]
  assert "global batch 16 = 1 x 16 rows per host" in one
  # Only process 0 prints progress and writes summaries.
  assert "[p0] step 4/4" in out and "[p1] step" not in out, out[-3000:]
  assert "[p0] summary (train): finished: steps 0 -> 4 of 4" in out, out[-3000:]
  pod_losses, one_losses = _losses(pod_dir)[0], _losses(one_dir)[0]
  assert len(pod_losses) == 4
  np.testing.assert_allclose(pod_losses, one_losses, rtol=1e-5)
  # One checkpoint, written once; both processes resume from it and go on to step 6.
  assert os.path.isdir(os.path.join(pod_dir, "checkpoints", "4"))
  out2 = _pod(pod_dir, 6)
  assert "[p0] resuming from step 4" in out2 and "[p1] resuming from step 4" in out2, out2[-3000:]
  assert "[p0] step 6/6" in out2


FINETUNE_ARGS = [
    "bert_jax.finetune", "--config=bert_jax/configs/finetune.py:glue_sst2,runlocal",
    "--config.max_seq_length=32", "--config.batch_size=8", "--config.eval_batch_size=8",
    "--config.num_train_epochs=2", "--config.learning_rate=1e-3", "--config.do_predict=false",
    "--config.mesh_shape=(1,8,1)",  # FSDP over all 8 devices: no host holds every parameter
]


@pytest.mark.slow
def test_two_process_fsdp_finetune_exports_the_one_process_parameters(tmp_path):
  # The best-epoch export used to gather the params on each host (np.asarray), which raises for
  # an array sharded across hosts: a 2-host FSDP fine-tune crashed at its first export.
  import jax
  from flax import linen as nn
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.models import model as model_lib
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test
  from tests.testlib import tasks_testlib
  vocab_file = tasks_testlib.write_vocab(str(tmp_path), " ".join(finetune_test.WORDS) + " .")
  vocab = tasks_testlib.ReferenceTokenizer(vocab_file).vocab
  cfg = model_lib.get_bert_config("tiny", vocab_size=vocab.size, max_position_embeddings=128,
                                  hidden_size=64, num_heads=2, intermediate_size=128)
  export = ckpt_lib.save_params(str(tmp_path / "export"),
                                nn.unbox(pretraining_heads.init_params(cfg,
                                                                       jax.random.PRNGKey(0))), cfg,
                                meta={"do_lower_case": True})
  (tmp_path / "sst").mkdir()
  finetune_test._sst2(tmp_path / "sst", np.random.default_rng(0), 64, 16)  # pylint: disable=protected-access
  args = [*FINETUNE_ARGS, f"--config.init_checkpoint={export}",
          f"--config.vocab_file={vocab_file}", f"--config.data_dir={tmp_path / 'sst'}"]
  r = subprocess.run([*pod_testlib.pod_command(), "--timeout_seconds=300", "--", *args,
                      f"--workdir={tmp_path / 'pod'}"],
                     cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=360)
  assert r.returncode == 0, pod_testlib.failure(r)
  _assert_only_ours(r.stdout + r.stderr)
  assert "[p0] summary (finetune): finished: steps 0 -> 16 of 16" in r.stdout, r.stdout[-3000:]
  env = dict(_env(), XLA_FLAGS=xla_test_flags.with_devices(8))
  r = subprocess.run([sys.executable, "-m", *args, f"--workdir={tmp_path / 'one'}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
  pod = json.load(open(tmp_path / "pod" / "eval_results.json"))
  one = json.load(open(tmp_path / "one" / "eval_results.json"))
  assert pod["best_epoch"] == one["best_epoch"]
  a, _, meta = ckpt_lib.load_params(pod["best_checkpoint"])  # verified against its manifest
  b, _, _ = ckpt_lib.load_params(one["best_checkpoint"])
  assert meta["epoch"] == pod["best_epoch"]
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(x, y, atol=1e-6)
  assert not [p for p in os.listdir(tmp_path / "pod") if ".tmp-export" in p]
