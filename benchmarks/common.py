"""Shared timing for the side-by-side benchmarks."""

import json
import os
import subprocess
import sys
import time

import jax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_isolated(module, args, label):
  """Runs `python -m module *args` (one framework per process, so none warms another's caches or
  holds its memory) and returns the dict it printed on its `RESULT {json}` line, or None after
  printing `label: FAILED` and its stderr's tail."""
  r = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  line = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
  if r.returncode or not line:
    print(f"{label}: FAILED\n{r.stderr[-2000:]}")
    return None
  return json.loads(line[0][len("RESULT "):])


def time_jax_steps(train_step, state, batch, *, warmup, steps):
  """Seconds for `steps` calls of a jitted (state, batch) -> (state, metrics) step.

  `warmup` calls first (compilation and caches), and a device sync on both sides of the timed
  window so asynchronous dispatch is not mistaken for speed.
  """
  m = None
  for _ in range(warmup):
    state, m = train_step(state, batch)
  jax.block_until_ready((state, m))
  t0 = time.perf_counter()
  for _ in range(steps):
    state, m = train_step(state, batch)
  jax.block_until_ready(m)
  return time.perf_counter() - t0
