"""The data stream is a function of the files, the seed and the step, whatever the host count.

Fast tests check the stored layout; the slow one trains on real multi-file records (packed, the
default) as 1 process x 8 devices and as a 2 x 4 local pod (jax.distributed on localhost, gloo),
and resumes on the other host count: ALBERT-tiny (n-gram masking, SOP head) and SpanBERT-tiny
(span masking, SBO head), the in-graph masking schemes that draw the most per batch; and
ELECTRA-tiny, whose step also samples the generator's replacements with the step's key (two
networks, one optimizer). BERT's token masking on a 2-process pod is
tests/end_to_end/multihost_train_test.py's.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines.input import pretrain_input as pi
from tests.testlib import pod_testlib
from tests.testlib import xla_test_flags

ROOT = tests.ROOT


def test_layout_is_stored_and_reused_on_another_host_count():
  fresh = pi.stream_layout(num_files=4, global_batch=16, process_count=2, pack=True,
                           seq_length=32)
  assert fresh == dict(num_logical_shards=4, global_batch=16, pack=True,
                       max_instances_per_pack=2, pack_chunk_size=1024)
  # Resumed on 1 host with the defaults: the same layout, so the same stream.
  assert pi.stream_layout(num_files=4, global_batch=16, process_count=1, pack=True,
                          seq_length=32, stored=fresh) == fresh
  # A run whose default would differ (8 files now) keeps the checkpoint's 4 shards.
  assert pi.stream_layout(num_files=8, global_batch=16, process_count=1, pack=True,
                          seq_length=32, stored=fresh)["num_logical_shards"] == 4


def test_layout_changes_that_change_the_stream_are_errors():
  stored = pi.stream_layout(num_files=4, global_batch=16, process_count=1, seq_length=32)
  with pytest.raises(pi.InputPipelineError,
                     match=r"checkpoint vs now: num_logical_shards 4 vs 2\); resuming"):
    pi.stream_layout(num_files=4, global_batch=16, process_count=1, num_logical_shards=2,
                     stored=stored)
  with pytest.raises(pi.InputPipelineError, match=r"global_batch 16 vs 32, pack False vs True"):
    pi.stream_layout(num_files=4, global_batch=32, process_count=1, pack=True, stored=stored)
  with pytest.raises(pi.InputPipelineError, match=r"num_logical_shards=4 \(from the checkpoint\) "
                                                  r"is not divisible by the 8 hosts"):
    pi.stream_layout(num_files=4, global_batch=16, process_count=8, stored=stored)


# ----------------------------------------------------------------------------------------------
# Slow: real trainings.
# ----------------------------------------------------------------------------------------------
def _write_records(root, pairs):
  from tests.data_pipelines.input.masking_test import write_vocab
  from tests.data_pipelines.input.pretrain_input_test import make_instances, write_records
  vocab = write_vocab(root / "vocab.txt")
  rng = np.random.default_rng(0)
  for i in range(4):
    instances = make_instances(vocab, 40, rng)
    if not pairs:
      for inst in instances:
        inst["next_sentence_labels"][:] = 0
    write_records(root / f"part-{i}.tfrecord", instances)
  return root


@pytest.fixture(scope="module")
def records(tmp_path_factory):
  """4 files of 40 sentence pairs (next_sentence_labels 0 or 1): ALBERT's SOP trains on them."""
  return _write_records(tmp_path_factory.mktemp("stream"), pairs=True)


@pytest.fixture(scope="module")
def sentences(tmp_path_factory):
  """The same rows with every next_sentence_labels 0: records without a dataset_info.json that
  hold pairs are refused for a model without a sentence objective (SpanBERT, ELECTRA)."""
  return _write_records(tmp_path_factory.mktemp("sentences"), pairs=False)


def _args(records, workdir, steps, preset="albert-tiny"):
  return ["bert_jax.train", f"--config=bert_jax/configs/pretrain.py:{preset},runlocal",
          f"--workdir={workdir}", f"--config.train_input_files={records}/part-*",
          f"--config.vocab_file={records}/vocab.txt", "--config.seq_length=32",
          "--config.max_predictions_per_seq=5", "--config.batch_size=16",
          "--config.shuffle_buffer=20", "--config.warmup_steps=2", "--config.log_every=1",
          "--config.checkpoint_every=3", "--config.async_checkpointing=False",
          "--config.model.hidden_dropout_prob=0", "--config.model.attention_dropout_prob=0",
          f"--config.num_train_steps={steps}"]


def _env():
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
  env["XLA_FLAGS"] = xla_test_flags.SUBPROCESS   # local_pod adds each host's devices
  return env


def _train(records, workdir, steps, hosts, preset="albert-tiny"):
  if hosts == 1:
    cmd = [sys.executable, "-m", *_args(records, workdir, steps, preset)]
    env = dict(_env(), XLA_FLAGS=xla_test_flags.with_devices(8))
  else:
    cmd = [*pod_testlib.pod_command(hosts, 8 // hosts), "--timeout_seconds=500", "--",
           *_args(records, workdir, steps, preset)]
    env = _env()
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=560)
  assert r.returncode == 0, pod_testlib.failure(r)
  return r.stdout + r.stderr


def _checkpoint_3_of(source, workdir):
  """A new workdir holding only `source`'s step-3 checkpoint: a run there resumes at step 3."""
  shutil.copytree(os.path.join(source, "checkpoints", "3"),
                  os.path.join(workdir, "checkpoints", "3"))
  return workdir


def _losses(workdir, part="loss"):
  from bert_jax.evaluation import metrics_writer
  scalars = metrics_writer.read_scalars(os.path.join(workdir, "tensorboard"))
  return dict(scalars[f"train/{part}"])


@pytest.mark.slow
def test_one_and_two_hosts_train_on_the_same_stream_and_resume_on_each_other(records, sentences,
                                                                            tmp_path):
  one, two = str(tmp_path / "one"), str(tmp_path / "two")
  out = _train(records, one, 6, hosts=1)
  assert "4 logical shards" in out and "real tokens per slot" in out, out[-3000:]
  _train(records, two, 6, hosts=2)
  want = _losses(one)
  assert sorted(want) == [1, 2, 3, 4, 5, 6]
  np.testing.assert_allclose([_losses(two)[s] for s in range(1, 7)],
                             [want[s] for s in range(1, 7)], rtol=1e-5)

  assert set(_losses(one, "sop_loss")) == set(want)   # ALBERT's loss has its SOP part

  # Checkpointed at step 3 on 2 hosts, resumed on 1: the uninterrupted losses (ALBERT).
  # SpanBERT: 3 steps on 1 host, resumed on 2 hosts, equal to 6 uninterrupted steps on 1 host
  # (so its 2-host stream is the 1-host one, SBO targets included). Step 3's checkpoint is the
  # one the uninterrupted run wrote (checkpoint_every=3), not a 3-step run's: two runs fewer.
  span = str(tmp_path / "span_one")
  _train(sentences, span, 6, hosts=1, preset="spanbert-tiny")
  assert set(_losses(span, "sbo_loss")) == set(want)
  for source, first, then, preset, baseline, data in (
      (two, 2, 1, "albert-tiny", one, records), (span, 1, 2, "spanbert-tiny", span, sentences)):
    workdir = _checkpoint_3_of(source, str(tmp_path / f"{preset}_{first}to{then}"))
    out = _train(data, workdir, 6, hosts=then, preset=preset)
    assert "resuming from step 3" in out, out[-3000:]
    got, expected = _losses(workdir), _losses(baseline)
    np.testing.assert_allclose([got[s] for s in range(4, 7)], [expected[s] for s in range(4, 7)],
                               rtol=1e-5, err_msg=f"{preset}: {first} -> {then} hosts")

  # A different logical-shard count would read another stream: refused before any compute.
  r = subprocess.run([sys.executable, "-m", *_args(records, one, 9),
                      "--config.num_logical_shards=2"], cwd=ROOT, env=_env(),
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2, r.stderr[-3000:]
  assert "num_logical_shards 4 vs 2" in r.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_electra_one_and_two_hosts_give_the_same_losses_and_resume_on_each_other(sentences,
                                                                                tmp_path):
  """electra-tiny on 1 host x 8 devices and on a 2 x 4 local pod: the same losses (generator MLM
  and replaced-token detection: the replacements are drawn from the step's key whatever the
  host count), and a run checkpointed at step 3 on either host count resumes on the other into
  the uninterrupted losses. Four runs, not six: steps 1-3 of the run started on 2 hosts are the
  2-host losses, steps 4-6 of the run resumed on 2 hosts (from the 1-host run's own step-3
  checkpoint) the 2-host losses after a move."""
  one = str(tmp_path / "one")
  _train(sentences, one, 6, hosts=1, preset="electra-tiny")
  for first, then in ((2, 1), (1, 2)):
    moved = str(tmp_path / f"{first}to{then}")
    if first == 2:
      _train(sentences, moved, 3, hosts=first, preset="electra-tiny")
    else:   # the 1-host run's own step-3 checkpoint (checkpoint_every=3): one run fewer
      _checkpoint_3_of(one, moved)
    out = _train(sentences, moved, 6, hosts=then, preset="electra-tiny")
    assert "resuming from step 3" in out, out[-3000:]
    steps = [1, 2, 3, 4, 5, 6] if first == 2 else [4, 5, 6]
    for part in ("loss", "mlm_loss", "rtd_loss"):
      got, want = _losses(moved, part), _losses(one, part)
      assert sorted(want) == [1, 2, 3, 4, 5, 6] and sorted(got) == steps, part
      np.testing.assert_allclose([got[s] for s in steps], [want[s] for s in steps],
                                 rtol=1e-5, err_msg=f"{part}: {first} -> {then} hosts")
