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


def test_a_copied_workdir_describes_itself_from_where_it_is(tmp_path, capsys):
  """Issue 49: a finished pre-training workdir copied elsewhere printed the original's model,
  summary and next commands (report, and the trainer's "nothing to do"). summary.json records
  its workdir; on read, its paths are re-rooted at the workdir it is read from."""
  import shutil
  from bert_jax.configs import pretrain as pretrain_config
  from bert_jax.evaluation import train_report
  original = _workdir(tmp_path / "run")
  config = pretrain_config.get_config("tiny")
  metrics_writer.write_summary(original, dict(
      program="train", status="finished", wall_time_sec=12.0, start_step=0, final_step=3,
      total_steps=3, final_eval={}, model=f"{original} (checkpoint 3)",
      outputs={"tensorboard": os.path.join(original, "tensorboard")},
      next=train_report.next_commands(config, original, 3, stopped=False)))
  copy = str(tmp_path / "elsewhere" / "copy")
  shutil.copytree(original, copy)
  capsys.readouterr()
  _, summary = report.load(copy)
  lines = "\n".join(metrics_writer.summary_lines(summary))
  train_report.nothing_to_do(config, copy, 3, is_main=True)
  printed = capsys.readouterr().out
  for text in (lines, printed):
    assert original not in text, text
    assert f"model: {copy} (checkpoint 3)" in text
    assert f"this summary: {copy}/summary.json" in text
    assert f"tensorboard: {copy}/tensorboard" in text
    assert f"--init_checkpoint={copy} fill-mask" in text and f"--input={copy} " in text
  # Where it was written, and a summary from before the record: as they are.
  assert report.load(original)[1]["model"] == f"{original} (checkpoint 3)"
  assert metrics_writer.reroot({"model": "/a/run"}, None, copy) == {"model": "/a/run"}
  # A path is the workdir as a whole name: runs/q-ft and hf/q are not under runs/q.
  assert metrics_writer.reroot(
      ["--workdir=runs/q-ft --output=hf/q", "python -m bert_jax.report runs/q  # x",
       "runs/q/best_epoch2"], "runs/q/", "b/q2") == [
           "--workdir=runs/q-ft --output=hf/q", "python -m bert_jax.report b/q2  # x",
           "b/q2/best_epoch2"]


@pytest.mark.slow   # subprocesses
def test_an_existing_output_is_refused_unless_overwrite_and_the_default_is_redrawn(tmp_path):
  """Issue 49: a user-named --output that exists is refused in one line before the events are
  read; --overwrite replaces it. WORKDIR/report.png, the run's own file, is redrawn each time."""
  workdir = _workdir(tmp_path / "run")
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")
  out = tmp_path / "curves.png"
  out.write_bytes(b"old")
  (tmp_path / "run" / "report.png").write_bytes(b"old")
  run = lambda *flags: subprocess.run(  # noqa: E731
      [sys.executable, "-m", "bert_jax.report", workdir, *flags], cwd=ROOT, env=env,
      capture_output=True, text=True, timeout=300)
  r = run(f"--output={out}")
  assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
      f"error: --output={out}: already exists; pass --overwrite to replace it, or choose "
      "another path."), r.stderr
  assert out.read_bytes() == b"old"
  r = run(f"--output={out}", "--overwrite")
  assert r.returncode == 0 and out.read_bytes()[:4] == b"\x89PNG", r.stderr[-2000:]
  r = run()
  assert r.returncode == 0 and (tmp_path / "run" / "report.png").read_bytes()[:4] == b"\x89PNG"


def test_a_file_a_folder_inside_the_workdir_or_a_non_png_output_is_one_line(tmp_path):
  """Issue 49 item 7: a file given as WORKDIR was "no such directory"; WORKDIR/checkpoints said
  only "no scalars"; --output=curves.pdf (or .txt) got PNG bytes under that name silently."""
  workdir = _workdir(tmp_path / "run")
  (tmp_path / "run" / "checkpoints").mkdir()
  with pytest.raises(report.ReportError) as e:
    report.load(os.path.join(workdir, "summary.json"))
  assert str(e.value) == (f"{workdir}/summary.json: is a file, not a directory; pass a "
                          "pre-training or fine-tuning --workdir (the folder that holds "
                          "tensorboard/).")
  for inside in ("checkpoints", "tensorboard/", "tensorboard"):
    path = os.path.join(workdir, inside)
    if inside.startswith("tensorboard"):   # tensorboard/ itself: no tensorboard/ under it
      assert not os.path.isdir(os.path.join(path, "tensorboard"))
    with pytest.raises(report.ReportError) as e:
      report.load(path)
    assert str(e.value) == (f"{path}: is a folder inside the run's workdir; pass the workdir "
                            f"itself: python -m bert_jax.report {workdir}")
  for name in ("curves.pdf", "curves.txt", "curves"):
    with pytest.raises(report.ReportError) as e:
      report.check_output_name(str(tmp_path / name))
    stem = str(tmp_path / name).rsplit(".", 1)[0] if "." in name else str(tmp_path / name)
    assert str(e.value) == (f"--output={tmp_path / name}: the report is a PNG image; name a "
                            f".png file (e.g. --output={stem}.png).")
  report.check_output_name(str(tmp_path / "curves.PNG"))
