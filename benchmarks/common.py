"""Shared timing for the side-by-side benchmarks."""

import time

import jax


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
