"""SIGKILL a pre-training run at random moments (some during async checkpoint writes), restart it:
the final parameters equal an uninterrupted run's bit for bit (BERT-tiny, and ELECTRA-tiny: both
networks).

A kill during a write leaves Orbax's temporary step directory (removed at the next start), never a
committed step without its manifest; a kill between steps loses the steps since the last commit,
which the restarted run recomputes from the same data position and rng.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import glob
import os
import random
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from bert_jax.checkpoint import store as ckpt_lib

ROOT = tests.ROOT
STEPS = 30
FLAGS = dict(train_input_files="synthetic", **{"model.vocab_size": 512}, seq_length=32,
             max_predictions_per_seq=6, batch_size=8, num_train_steps=STEPS, warmup_steps=2,
             log_every=1, checkpoint_every=2, keep_checkpoints=2, eval_every=1000,
             async_checkpointing=True)


def _command(workdir, preset="tiny"):
  return ([sys.executable, "-u", "-m", "bert_jax.train",
           f"--config=bert_jax/configs/pretrain.py:{preset},runlocal", f"--workdir={workdir}"]
          + [f"--config.{k}={v}" for k, v in FLAGS.items()])


def _params(workdir):
  params, _, meta = ckpt_lib.load_params(workdir)  # the latest step, verified against its manifest
  return params, meta


def _wait_for(proc, predicate, timeout=300):
  t0 = time.time()
  while not predicate():
    if proc.poll() is not None:
      return False
    if time.time() - t0 > timeout:
      raise TimeoutError("the training run made no progress")
    time.sleep(0.002)
  return True


def _writing(workdir):
  return bool(glob.glob(os.path.join(workdir, "checkpoints", "*.orbax-checkpoint-tmp*")))


def _committed(workdir):
  return [int(os.path.basename(p)) for p in glob.glob(os.path.join(workdir, "checkpoints", "*"))
          if os.path.basename(p).isdigit()]


@pytest.mark.slow
# electra-tiny: two networks in one checkpoint, and the generator's replacements drawn from the
# step's key, so the restarted run must replay them too.
@pytest.mark.parametrize("preset", ["tiny", "electra-tiny"])
def test_sigkill_at_random_moments_resumes_bit_exactly(tmp_path, preset):
  # Each asynchronous save stays open 0.3 s before its manifest is written (fault injection), so
  # a kill "during a write" lands inside one; the numbers trained are not affected.
  plain = dict(os.environ, JAX_PLATFORMS="cpu")
  env = dict(plain, **{ckpt_lib.SLOW_SAVE_ENV: "0.3"})
  reference = str(tmp_path / "reference")
  # The reference and the last run are never killed: they save at full speed (the reference's
  # 15 saves wait 4.5 s fewer).
  ref = subprocess.run(_command(reference, preset), cwd=ROOT, env=plain, check=True,
                       capture_output=True, text=True, timeout=300)
  (tmp_path / "reference.log").write_text(ref.stdout + ref.stderr)
  killed = str(tmp_path / "killed")
  seed = int(os.environ.get("KILL_TEST_SEED", time.time_ns() % 10_000))
  rng = random.Random(seed)
  # Three kills: during an asynchronous checkpoint write, at a random moment after a new commit,
  # and during a write again; then the run goes to the end.
  kills = []
  for i, moment in enumerate(["during_write", "random", "during_write"]):
    before = max(_committed(killed), default=0)
    with open(tmp_path / f"run{i}.log", "w") as log:  # kept for a failure's diagnosis
      proc = subprocess.Popen(_command(killed, preset), cwd=ROOT, env=env, stdout=log,
                              stderr=subprocess.STDOUT)
      try:
        # A new commit first, so that every restart makes progress.
        alive = _wait_for(proc, lambda: max(_committed(killed), default=0) > before)
        if alive and moment == "during_write":
          alive = _wait_for(proc, lambda: _writing(killed))
        elif alive:
          time.sleep(rng.uniform(0.0, 0.5))
          alive = proc.poll() is None
        if alive:
          proc.send_signal(signal.SIGKILL)
          kills.append((moment, _writing(killed), sorted(_committed(killed))))
      finally:
        proc.wait(timeout=60)
  assert len(kills) == 3, f"the run finished before it could be killed (seed {seed}): {kills}"
  assert sum(writing for _, writing, _ in kills) >= 2, f"seed {seed}: {kills}"
  last = subprocess.run(_command(killed, preset), cwd=ROOT, env=plain, check=True,
                        capture_output=True, text=True, timeout=300)
  (tmp_path / "final.log").write_text(last.stdout + last.stderr)
  assert "resuming from step" in last.stdout

  want, want_meta = _params(reference)
  got, got_meta = _params(killed)
  assert got_meta["step"] == want_meta["step"] == STEPS
  leaves_g = dict(jax.tree_util.tree_leaves_with_path(got))
  for path, w in jax.tree_util.tree_leaves_with_path(want):
    np.testing.assert_array_equal(leaves_g[path], w, err_msg=f"{path} (seed {seed}, {kills})")
