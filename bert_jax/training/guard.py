"""The non-finite guard: a step whose loss, gradient norm or new parameters are NaN/Inf is skipped.

Inside the jitted step (`select`): after a bad step the parameters and optimizer state are those
before it, bit for bit (a `jnp.where` over every leaf of the whole state). `optax.apply_if_finite`
is not used: it applies a zero update, and p + 0.0 turns a -0.0 parameter into +0.0, so it is not
bit-exact. The step counter does advance: a step is one batch of the data stream, consumed
whether or not it was applied, so resume positions and the schedule stay those of the loop.

On the host (`SkipTracker`): skipped steps are counted (`skipped_steps`, logged and written to
TensorBoard) and after `max_consecutive_skips` in a row the run stops with one line naming the
first bad step and its input position. Since a bad step never reaches the state, no checkpoint
holds a non-finite state.
"""

import jax
import jax.numpy as jnp
import optax

from bert_jax_core import errors


class NonFiniteError(errors.UserError):
  """Too many consecutive steps had a NaN/Inf loss or gradient."""


def select(state, new_state, metrics):
  """(state to keep, metrics + `skipped` 0/1): `new_state` if the step is finite, else `state`."""
  finite = (jnp.isfinite(metrics["loss"]) & jnp.isfinite(metrics["grad_norm"])
            & jnp.isfinite(optax.tree.norm(new_state["params"])))
  kept = jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_state, state)
  kept["step"] = new_state["step"]
  return kept, dict(metrics, skipped=jnp.where(finite, 0, 1).astype(jnp.int32))


class SkipTracker:
  """Counts skipped steps on the host; raises NonFiniteError after too many in a row.

  Both loops call `step_done(step, metrics["skipped"])` after each step and `flush()` at each
  log: a step's (device) flag is read one step late, when it is ready, so that reading it never
  stalls the step in flight; step s read input position s - 1.
  """

  def __init__(self, max_consecutive_skips, what="training"):
    self.max_consecutive = int(max_consecutive_skips)
    self.what = what
    self.total = 0
    self.consecutive = 0
    self.first_bad = None       # (step, input position) of the current run of bad steps
    self._held = None           # (step, input position, device flag) not read yet

  def step_done(self, step, skipped):
    """After step `step`: counts the step before it (its flag is ready by now) and holds this
    one's, whose step is still in flight."""
    if self._held is not None:
      self.update(*self._held)
    self._held = (step, step - 1, skipped)

  def flush(self):
    """Counts the held step (every logged step is counted); returns the total skipped."""
    if self._held is not None:
      self.update(*self._held)
      self._held = None
    return self.total

  def update(self, step, input_position, skipped):
    if int(skipped):
      self.total += 1
      self.consecutive += 1
      if self.first_bad is None:
        self.first_bad = (step, input_position)
      if self.max_consecutive > 0 and self.consecutive >= self.max_consecutive:
        first_step, first_pos = self.first_bad
        raise NonFiniteError(
            f"{self.what} stopped at step {step}: the loss or gradient was NaN/Inf for "
            f"{self.consecutive} consecutive steps (max_consecutive_skips="
            f"{self.max_consecutive}), first at step {first_step} (input position "
            f"{first_pos}); the parameters are those before it and no checkpoint holds a "
            "non-finite state: lower the learning rate or inspect that batch.")
    else:
      self.consecutive = 0
      self.first_bad = None
