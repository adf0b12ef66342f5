"""End to end on real text: corpus -> vocab -> records -> pre-training -> resume (slow)."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import glob
import os
import subprocess
import sys

import pytest

from bert_jax.evaluation import metrics_writer

ROOT = tests.ROOT


def _run(*args, timeout=600):
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=timeout)
  assert r.returncode == 0, f"{args[0]} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
  return r.stdout


@pytest.mark.slow
def test_pretrain_on_stdlib_docstrings_learns_and_resumes(tmp_path):
  corpus = tmp_path / "corpus"
  _run("data_pipelines.stdlib_corpus", f"--output_dir={corpus}", "--num_files=4")
  train_glob = str(corpus / "stdlib-0[0-2]-of-04.txt")
  _run("data_pipelines.build_vocab", f"--input_file={train_glob}", "--vocab_size=4000",
       "--lower_case", f"--output={tmp_path / 'vocab.txt'}")
  for name, glob_, dupe in (("train", train_glob, 2), ("eval", str(corpus / "stdlib-03*"), 1)):
    _run("data_pipelines.create_pretraining_data", f"--input_file={glob_}",
         f"--output_dir={tmp_path / name}", f"--vocab_file={tmp_path / 'vocab.txt'}",
         "--do_lower_case=true", "--max_seq_length=64", f"--dupe_factor={dupe}",
         "--num_shards=2", "--num_workers=1")
  records = lambda name: ",".join(sorted(
      p for p in glob.glob(str(tmp_path / name / "*")) if not p.endswith(".json")))
  common = ["bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny,runlocal",
            f"--workdir={tmp_path / 'work'}", f"--config.vocab_file={tmp_path / 'vocab.txt'}",
            f"--config.train_input_files={records('train')}",
            f"--config.eval_input_files={records('eval')}",
            "--config.seq_length=64", "--config.max_predictions_per_seq=10",
            "--config.eval_every=100", "--config.eval_steps=5", "--config.checkpoint_every=100"]
  work = tmp_path / "work"
  out = _run(*common, "--config.num_train_steps=200")
  # Read what the run recorded (event files, summary.json), not its printed wording.
  first = metrics_writer.read_scalars(str(work / "tensorboard"))
  evals = sorted(first["eval/mlm_accuracy"])
  assert [s for s, _ in evals] == [0, 100, 200], out[-2000:]
  evals = [v for _, v in evals]
  # Held-out MLM accuracy must clearly rise: from ~0 (random init over a 4k vocab) to ~0.05 by
  # step 100. At step 200 it sits at 0.048-0.052 depending on the dropout draw (measured on
  # 2026-11-24 with the same initial parameters: 0.0521 at 70037bf, 0.0481 after the model's
  # heads were restructured), so a fixed +0.05 at the last step was inside that noise.
  assert evals[0] < 0.01 and min(evals[1:]) > evals[0] + 0.04, evals
  assert os.path.isdir(work / "checkpoints" / "200")
  summary = metrics_writer.read_summary(str(work))
  assert (summary["status"], summary["start_step"], summary["final_step"]) == ("finished", 0, 200)
  assert summary["final_eval"]["eval/mlm_accuracy"] == pytest.approx(evals[-1])
  # A second run with more steps resumes from step 200 instead of starting over (and says so).
  out2 = _run(*common, "--config.num_train_steps=250")
  assert "resuming from step 200" in out2, out2[-2000:]
  summary = metrics_writer.read_summary(str(work))
  assert (summary["status"], summary["start_step"], summary["final_step"]) == ("finished", 200, 250)
  logged = [s for s, _ in metrics_writer.read_scalars(str(work / "tensorboard"))["train/loss"]]
  assert sorted(logged) == sorted([s for s, _ in first["train/loss"]]
                                  + [s for s in logged if s > 200]), "steps <= 200 trained again"
  assert max(logged) == 250, logged
