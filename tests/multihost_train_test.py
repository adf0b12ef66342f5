"""A 2-host pod simulated on localhost (gloo collectives) trains exactly like 1 host (slow)."""

import os
import subprocess
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TRAIN_ARGS = [
    "bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny,runlocal",
    "--config.train_input_files=synthetic", "--config.model.vocab_size=512",
    "--config.seq_length=32", "--config.max_predictions_per_seq=6", "--config.batch_size=16",
    "--config.warmup_steps=2", "--config.log_every=1", "--config.checkpoint_every=4",
    "--config.async_checkpointing=False",
]


def _env():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
  env.pop("XLA_FLAGS", None)
  return env


def _pod(workdir, steps):
  r = subprocess.run(
      [sys.executable, "-m", "launch.local_pod", "--num_processes=2", "--devices_per_process=4",
       "--timeout_seconds=500", "--", *TRAIN_ARGS, f"--workdir={workdir}",
       f"--config.num_train_steps={steps}"],
      cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=560)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
  return r.stdout + r.stderr


def _single(workdir, steps):
  env = dict(_env(), XLA_FLAGS="--xla_force_host_platform_device_count=8")
  r = subprocess.run([sys.executable, "-m", *TRAIN_ARGS, f"--workdir={workdir}",
                      f"--config.num_train_steps={steps}"],
                     cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
  return r.stdout


def _losses(workdir):
  from bert_jax import metrics_writer
  scalars = metrics_writer.read_scalars(os.path.join(workdir, "tensorboard"))
  return [v for _, v in sorted(scalars["loss"])], scalars


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
  pod_losses, one_losses = _losses(pod_dir)[0], _losses(one_dir)[0]
  assert len(pod_losses) == 4
  np.testing.assert_allclose(pod_losses, one_losses, rtol=1e-5)
  # One checkpoint, written once; both processes resume from it and go on to step 6.
  assert os.path.isdir(os.path.join(pod_dir, "checkpoints", "4"))
  out2 = _pod(pod_dir, 6)
  assert "[p0] resuming from step 4" in out2 and "[p1] resuming from step 4" in out2, out2[-3000:]
  assert "[p0] step 6/6" in out2
