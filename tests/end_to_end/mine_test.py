"""`python -m bert_jax.mine` as a user runs it (slow): one process on 8 devices writes the rows
sentence-transformers' mine_hard_negatives gives (read back by the embedding task's reader),
says what it read, mined and wrote and the next command, refuses to overwrite; a 2-process pod
(launch.local_pod, gloo) writes the same file byte for byte."""

import json
import os
import subprocess
import sys

import pytest

import tests
from data_pipelines.tasks import pairs
from tests.testlib import mining_testlib
from tests.testlib import pod_testlib
from tests.testlib import xla_test_flags

ROOT = tests.ROOT
SETTINGS = ["--num_negatives=3", "--range_min=1", "--range_max=12", "--relative_margin=0.01",
            "--output_format=n-tuple", "--output_scores", "--batch_size=8", "--block_size=16"]


def _env(cache, devices=None):
  env = {k: v for k, v in os.environ.items()
         if k not in ("XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL", "JAX_COMPILATION_CACHE_DIR")}
  env.update(JAX_PLATFORMS="cpu", PYTHONPATH=ROOT, BERT_JAX_CACHE=str(cache),
             XLA_FLAGS=xla_test_flags.with_devices(devices) if devices
             else xla_test_flags.SUBPROCESS)   # local_pod adds each host's devices
  return env


@pytest.mark.slow
def test_mine_cli_one_process_and_a_pod_write_st_rows(tmp_path):
  splits = mining_testlib.docstring_rows(str(tmp_path / "data"))
  train = str(tmp_path / "data" / "train.jsonl")
  folder = mining_testlib.st_folder(tmp_path / "model", splits["train"])
  args = [f"--init_checkpoint={folder}", f"--input_file={train}", *SETTINGS]
  one = str(tmp_path / "one.jsonl")
  r = subprocess.run([sys.executable, "-m", "bert_jax.mine", *args, f"--output_file={one}"],
                     cwd=ROOT, env=_env(tmp_path / "cache", 8), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  out = r.stdout.splitlines()
  assert "corpus blocks" in r.stderr                                  # tqdm's bar
  assert any(l.startswith(f"loaded {tmp_path}") and "pooling mean" in l for l in out), out
  assert f"read {train}: 50 rows, 50 distinct queries; corpus 50 distinct texts (the " \
         "positives)" in out, out
  assert any(l.startswith("searching: 8 devices (1 processes), blocks of 16 texts") for l in out)
  assert any(l.startswith("mined ") for l in out) and out[-2].startswith(f"wrote {one}: ")
  assert out[-1].startswith("next: python -m bert_jax.finetune --config=bert_jax/configs/"
                            "finetune.py:custom --config.custom.type=embedding "
                            f"--config.data_dir={tmp_path} --config.custom.train_file=one.jsonl "
                            f"--config.custom.dev_file={tmp_path}/data/dev.jsonl ")
  # The rows are sentence-transformers' (columns and scores), and the embedding task reads them
  with open(one, encoding="utf-8") as f:
    ours = [json.loads(l) for l in f]
  theirs = mining_testlib.st_mine(splits["train"], folder, num_negatives=3, range_min=1,
                                  range_max=12, relative_margin=0.01, output_format="n-tuple",
                                  output_scores=True)
  assert len(ours) >= 9 and mining_testlib.same_rows(theirs, ours) <= 1
  read = pairs.read_pairs(one)
  assert [len(p.negatives) for p in read] == [3] * len(ours)
  assert read[0].anchor == ours[0]["query"] and read[0].negatives[2] == ours[0]["negative_3"]
  # An existing output: one line, before anything is read or written
  again = subprocess.run([sys.executable, "-m", "bert_jax.mine", *args, f"--output_file={one}"],
                         cwd=ROOT, env=_env(tmp_path / "cache", 8), capture_output=True,
                         text=True, timeout=120)
  assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
  assert "already exists; pass --overwrite" in again.stderr
  # A 2-process pod (4 devices each; the folder's converted copy is in the cache by now)
  pod = str(tmp_path / "pod.jsonl")
  r = subprocess.run([*pod_testlib.pod_command(), "--timeout_seconds=240", "--",
                      "bert_jax.mine", *args, f"--output_file={pod}", "--noprogress"],
                     cwd=ROOT, env=_env(tmp_path / "cache"), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, pod_testlib.failure(r)
  assert "searching: 8 devices (2 processes)" in r.stdout, r.stdout[-2000:]
  with open(one, "rb") as a, open(pod, "rb") as b:
    assert a.read() == b.read()
