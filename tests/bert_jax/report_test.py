"""bert_jax/report.py: a PNG of the curves and the summary table from a real workdir."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import pytest

from bert_jax.evaluation import metrics_writer
from bert_jax import report

ROOT = tests.ROOT


def _workdir(d):
  w = metrics_writer.MetricsWriter(str(d))
  for step in (1, 2, 3):
    w.write_scalars(step, {"train/loss": 5.0 - step, "train/learning_rate": 1e-4 * step,
                           "train/sequences_per_sec": 100.0 + step, "train/mlm_accuracy": 0.1})
  w.write_scalars(3, {"eval/mlm_accuracy": 0.2, "eval/mlm_loss": 4.0})
  w.write_text("config", "{}")
  w.close()
  metrics_writer.write_summary(str(d), dict(
      program="train", status="finished", wall_time_sec=12.0, start_step=0, final_step=3,
      total_steps=3, final_eval={"eval/mlm_accuracy": 0.2}, final_eval_step=3,
      model=f"{d} (checkpoint 3)", next=["python -m bert_jax.predict ..."]))
  return str(d)


def test_draws_every_panel_and_prints_the_summary(tmp_path):
  workdir = _workdir(tmp_path / "run")
  scalars, summary = report.load(workdir)
  assert summary["final_step"] == 3 and [s for s, _ in scalars["train/loss"]] == [1, 2, 3]
  drawn = report.draw(scalars, str(tmp_path / "c.png"), "t")
  assert drawn == {"loss": ["eval/mlm_loss", "train/loss"],
                   "accuracy and eval scores": ["eval/mlm_accuracy", "train/mlm_accuracy"],
                   "learning rate": ["train/learning_rate"],
                   "throughput (sequences/s)": ["train/sequences_per_sec"]}
  with open(tmp_path / "c.png", "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"
  assert any(line.startswith("train/loss") and line.endswith(" 2") for line in
             report.table(scalars))


def test_cli_writes_the_png_and_a_bad_workdir_is_one_line(tmp_path):
  workdir = _workdir(tmp_path / "run")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  r = subprocess.run([sys.executable, "-m", "bert_jax.report", workdir], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert os.path.getsize(os.path.join(workdir, "report.png")) > 10_000
  assert "summary (train): finished: steps 0 -> 3 of 3" in r.stdout
  assert f"wrote {workdir}/report.png" in r.stdout
  r = subprocess.run([sys.executable, "-m", "bert_jax.report", str(tmp_path)], cwd=ROOT, env=env,
                     capture_output=True, text=True, timeout=300)
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith(
      f"error: {tmp_path}: no scalars in"), r.stderr


def test_empty_workdir_is_a_user_error(tmp_path):
  with pytest.raises(report.ReportError, match="no such directory"):
    report.load(str(tmp_path / "missing"))
