"""Learning-rate schedule and optimizer (AdamW or LAMB) with BERT's weight-decay exclusions.

The paper's recipe: Adam(b1=0.9, b2=0.999), L2 weight decay 0.01 decoupled from the gradient
(AdamW), linear warmup over the first 10,000 steps then linear decay to 0, gradient clipping at
global norm 1.0. google-research/bert uses eps=1e-6 and excludes LayerNorm and biases from
weight decay; both are the defaults here.

optimizer="adamw" (the default) differs from google-research/bert's `optimization.py` in two
ways, both as HF's AdamW:
  * Bias correction: google's AdamWeightDecayOptimizer omits Adam's bias correction, optax keeps
    it. For a steady gradient google's step is (1 - b1^t) / sqrt(1 - b2^t) times optax's: 3.2x at
    step 1, 6.5x at step 10, 3.2x at 100, 1.26x at 1,000, 1.03x at 3,000, ~1 after the 10,000
    warmup steps. The early steps differ most, where warmup keeps the learning rate small.
  * Schedule: google decays lr * (1 - step / num_train_steps) from step 0 and lets warmup
    override it, so the peak at the end of warmup is lr * (1 - warmup / total) (1% low for
    10k / 1M) and the curve jumps there. Here the decay starts at the peak (continuous).
optimizer="adamw_google" reproduces google's update (no bias correction) and schedule exactly,
for runs that must match a TF1 google-research/bert run step for step.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from bert_jax_core import errors


class OptimizerError(errors.UserError):
  pass


def create_learning_rate_schedule(learning_rate: float, warmup_steps: int,
                                  num_train_steps: int) -> optax.Schedule:
  """Linear warmup 0 -> learning_rate over warmup_steps, then linear decay to 0 at the end.

  E.g. lr=1e-4, warmup 10,000, 1,000,000 steps: step 5,000 -> 5e-5, step 10,000 -> 1e-4,
  step 505,000 -> 5e-5, step 1,000,000 and beyond -> 0.
  """
  if learning_rate <= 0:
    raise OptimizerError(f"learning_rate={learning_rate}: must be > 0.")
  if num_train_steps <= 0 or warmup_steps < 0 or warmup_steps > num_train_steps:
    raise OptimizerError(f"warmup_steps={warmup_steps}, num_train_steps={num_train_steps}: "
                         "need 0 <= warmup_steps <= num_train_steps and num_train_steps > 0.")
  decay = optax.linear_schedule(learning_rate, 0.0, num_train_steps - warmup_steps)
  if warmup_steps == 0:
    return decay
  warmup = optax.linear_schedule(0.0, learning_rate, warmup_steps)
  return optax.join_schedules([warmup, decay], boundaries=[warmup_steps])


def create_google_schedule(learning_rate: float, warmup_steps: int,
                           num_train_steps: int) -> optax.Schedule:
  """google-research/bert's optimization.create_optimizer schedule, exactly.

  lr * (1 - min(step, total) / total) (tf.train.polynomial_decay, power 1, to 0), replaced by
  lr * step / warmup while step < warmup. E.g. lr=1e-4, warmup 10,000, 1,000,000 steps: step
  5,000 -> 5e-5, step 10,000 -> 9.9e-5 (not 1e-4), step 505,000 -> 4.95e-5.
  """
  create_learning_rate_schedule(learning_rate, warmup_steps, num_train_steps)  # same checks

  def schedule(step):
    step = jnp.asarray(step, jnp.float32)
    decayed = learning_rate * (1.0 - jnp.minimum(step, num_train_steps) / num_train_steps)
    if not warmup_steps:
      return decayed
    return jnp.where(step < warmup_steps, learning_rate * step / warmup_steps, decayed)
  return schedule


class _AdamNoBiasCorrectionState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_without_bias_correction(b1, b2, eps) -> optax.GradientTransformation:
  """google's AdamWeightDecayOptimizer moments: m / (sqrt(v) + eps), m and v never bias-corrected
  (optax.scale_by_adam has no switch for that)."""
  def init(params):
    zeros = lambda p: jnp.zeros_like(p, jnp.float32)
    return _AdamNoBiasCorrectionState(jax.tree.map(zeros, params), jax.tree.map(zeros, params))

  def update(updates, state, params=None):
    del params
    mu = jax.tree.map(lambda m, g: b1 * m + (1 - b1) * g, state.mu, updates)
    nu = jax.tree.map(lambda v, g: b2 * v + (1 - b2) * jnp.square(g), state.nu, updates)
    out = jax.tree.map(lambda m, v, g: (m / (jnp.sqrt(v) + eps)).astype(g.dtype), mu, nu, updates)
    return out, _AdamNoBiasCorrectionState(mu, nu)
  return optax.GradientTransformation(init, update)


def _path_names(path):
  return [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]


def _decays(path, _):
  names = _path_names(path)
  # LayerNorm scale/bias live under modules named "*layer_norm*" (google: "LayerNorm");
  # every bias ("bias", MLM "output_bias") is excluded, as google's
  # exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"].
  if any("layer_norm" in n.lower() or "layernorm" in n.lower() for n in names):
    return False
  leaf = names[-1].lower() if names else ""
  return not (leaf.endswith("bias") or leaf == "scale")


def decay_mask_fn(params):
  """Pytree of bools like `params` (plain arrays): True for kernels/embeddings, False for
  LayerNorm parameters and all biases."""
  return jax.tree_util.tree_map_with_path(_decays, params)


def _lamb(schedule, b1, b2, eps, weight_decay, mask):
  # optax.lamb applies the trust ratio to every parameter; the LAMB paper's BERT recipe
  # (and tf-models' LAMB, exclude_from_layer_adaptation defaulting to the weight-decay
  # exclusions) skips it for LayerNorm and bias, whose norms are ~1 or ~0 and make the
  # ratio meaningless. optax.masked passes the masked-out updates through unchanged.
  return optax.chain(
      optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
      optax.add_decayed_weights(weight_decay, mask=mask),
      optax.masked(optax.scale_by_trust_ratio(), mask),
      optax.scale_by_learning_rate(schedule),
  )


def create_optimizer(*, learning_rate, warmup_steps, num_train_steps, optimizer="adamw",
                     weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0):
  """Returns (optax.GradientTransformation, schedule) for UNBOXED (plain array) params.

  One update per optimizer step: gradient accumulation happens before, inside the jitted train
  step (trainer_lib.train_step), so the schedule and Adam's count advance once per step.
  """
  schedule = create_learning_rate_schedule(learning_rate, warmup_steps, num_train_steps)
  if optimizer == "adamw_google":
    # google-research/bert optimization.py: update = m / (sqrt(v) + eps) + decay * param, times
    # the learning rate, on the clipped gradient; no bias correction, google's schedule.
    schedule = create_google_schedule(learning_rate, warmup_steps, num_train_steps)
    tx = optax.chain(scale_by_adam_without_bias_correction(b1, b2, eps),
                     optax.add_decayed_weights(weight_decay, mask=decay_mask_fn),
                     optax.scale_by_learning_rate(schedule))
  elif optimizer == "adamw":
    tx = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                     mask=decay_mask_fn)
  elif optimizer == "lamb":
    tx = _lamb(schedule, b1, b2, eps, weight_decay, decay_mask_fn)
  else:
    raise OptimizerError(f"config.optimizer={optimizer!r}: unknown; use 'adamw', 'lamb' or "
                         "'adamw_google' (google-research/bert's update and schedule, exactly).")
  if clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  return tx, schedule


def from_config(config, *, num_train_steps, warmup_steps):
  """create_optimizer with the config's optimizer fields (pre-training and fine-tuning alike)."""
  return create_optimizer(
      learning_rate=config.learning_rate, warmup_steps=warmup_steps,
      num_train_steps=num_train_steps, optimizer=config.optimizer,
      weight_decay=config.weight_decay, b1=config.b1, b2=config.b2, eps=config.eps,
      clip_norm=config.clip_norm)
