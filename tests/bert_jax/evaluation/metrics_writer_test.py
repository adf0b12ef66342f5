"""bert_jax.evaluation.metrics_writer: TensorBoard event files written without TensorFlow."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import numpy as np
from tensorboard.backend.event_processing import event_accumulator

from bert_jax.evaluation import metrics_writer

ROOT = tests.ROOT

WRITE = """
import sys
from bert_jax.evaluation import metrics_writer
w = metrics_writer.MetricsWriter(sys.argv[1])
w.write_text("config", '{"seq_length": 128}')
w.write_scalars(1, {"train/loss": 2.5, "train/learning_rate": 1e-4})
w.write_scalars(2, {"train/loss": 2.0, "train/learning_rate": 2e-4})
w.close()
metrics_writer.MetricsWriter(sys.argv[1]).close()   # a second writer in the same second
print(sorted(m for m in sys.modules if m.split(".")[0] == "tensorflow"))
"""


def test_events_are_tensorboards_and_writing_them_imports_no_tensorflow(tmp_path):
  # A fresh process: the pytest process has TensorFlow imported by other tests already. A run on
  # synthetic input imported it only for these files (8 CPU s a process on the 2-core box).
  r = subprocess.run([sys.executable, "-c", WRITE, str(tmp_path)], cwd=ROOT, env=dict(
      os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=120, check=True)
  assert r.stdout.strip() == "[]", r.stdout
  assert r.stderr == ""
  logdir = str(tmp_path / "tensorboard")
  assert len(os.listdir(logdir)) == 2           # two writers, two files: nothing overwritten
  assert metrics_writer.read_scalars(logdir) == {   # simple_value is a float32
      "train/loss": [(1, 2.5), (2, 2.0)],
      "train/learning_rate": [(1, float(np.float32(1e-4))), (2, float(np.float32(2e-4)))]}
  # TensorBoard's own reader: the scalars as scalars, the config as tf.summary.text writes it
  # (a string tensor under the "text" plugin).
  acc = event_accumulator.EventAccumulator(logdir)
  acc.Reload()
  assert acc.Tags()["scalars"] == ["train/loss", "train/learning_rate"]
  assert acc.Tags()["tensors"] == ["config"]
  (event,) = acc.Tensors("config")
  assert event.tensor_proto.string_val == [b'{"seq_length": 128}']
  assert acc.SummaryMetadata("config").plugin_data.plugin_name == "text"


def test_a_writer_off_process_writes_nothing(tmp_path):
  w = metrics_writer.MetricsWriter(str(tmp_path), enabled=False)
  w.write_scalars(1, {"train/loss": 1.0})
  w.write_text("config", "{}")
  w.close()
  assert not os.path.exists(tmp_path / "tensorboard")
