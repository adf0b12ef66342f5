"""Learning-rate schedule and optimizer (AdamW or LAMB) with BERT's weight-decay exclusions.

The paper's recipe: Adam(b1=0.9, b2=0.999), L2 weight decay 0.01 decoupled from the gradient
(AdamW), linear warmup over the first 10,000 steps then linear decay to 0, gradient clipping at
global norm 1.0. google-research/bert uses eps=1e-6 and excludes LayerNorm and biases from
weight decay; both are the defaults here. Other recipes pick theirs: config.schedule linear
(BERT's), wsd (ModernBERT's warmup-stable-decay) or cosine (NeoBERT's), and
config.weight_decay_all_tensors (NeoBERT: norms and biases decay too).

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

Fine-tuning may add ELECTRA's layer-wise learning-rate decay (layerwise_lr_decay < 1; the section
at the end): lower rates for layers closer to the input, the final update of each parameter
times decay^(L + 2 - depth).
"""

import re
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


def decay_all_mask_fn(params):
  """Every tensor decays (config.weight_decay_all_tensors=True): NeoBERT's torch AdamW over
  model.parameters(), its RMSNorm scales and decoder bias included."""
  return jax.tree.map(lambda _: True, params)


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
                     weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0,
                     layerwise_lr_decay=1.0, num_layers=0, schedule="linear", decay_steps=0,
                     final_lr_fraction=0.0, weight_decay_all_tensors=False):
  """Returns (optax.GradientTransformation, schedule) for UNBOXED (plain array) params.

  One update per optimizer step: gradient accumulation happens before, inside the jitted train
  step (trainer_lib.train_step), so the schedule and Adam's count advance once per step.
  layerwise_lr_decay < 1 (fine-tuning; num_layers = the encoder's L): ELECTRA's per-layer rates,
  scale_by_layer_depth. weight_decay_all_tensors=True decays norms and biases too (NeoBERT's torch
  AdamW over model.parameters()); False keeps BERT's exclusions (decay_mask_fn).
  """
  _check_decay_value(layerwise_lr_decay)
  schedule = create_schedule(schedule, learning_rate, warmup_steps, num_train_steps,
                             decay_steps, final_lr_fraction)
  if not isinstance(weight_decay_all_tensors, bool):
    raise OptimizerError(f"config.weight_decay_all_tensors={weight_decay_all_tensors!r}: "
                         "expected True (decay every tensor, NeoBERT) or False (not norms and "
                         "biases, BERT).")
  mask = decay_all_mask_fn if weight_decay_all_tensors else decay_mask_fn
  if optimizer == "stable_adamw":
    # ModernBERT's StableAdamW: per-tensor update clipping (scale_by_stable_adam below).
    tx = stable_adamw(schedule, peak_learning_rate=learning_rate, b1=b1, b2=b2, eps=eps,
                      weight_decay=weight_decay, mask=mask)
  elif optimizer == "adamw_google":
    # google-research/bert optimization.py: update = m / (sqrt(v) + eps) + decay * param, times
    # the learning rate, on the clipped gradient; no bias correction, google's schedule.
    schedule = create_google_schedule(learning_rate, warmup_steps, num_train_steps)
    tx = optax.chain(scale_by_adam_without_bias_correction(b1, b2, eps),
                     optax.add_decayed_weights(weight_decay, mask=mask),
                     optax.scale_by_learning_rate(schedule))
  elif optimizer == "adamw":
    tx = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay, mask=mask)
  elif optimizer == "lamb":
    tx = _lamb(schedule, b1, b2, eps, weight_decay, mask)
  else:
    raise OptimizerError(f"config.optimizer={optimizer!r}: unknown; use 'adamw', 'lamb', "
                         "'stable_adamw' (ModernBERT) or 'adamw_google' (google-research/bert's "
                         "update and schedule, exactly).")
  if clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  # Only when on: at 1.0 the chain (and so opt_state's tree, which checkpoints store) is
  # exactly the one without the feature, and a run resumes from a checkpoint saved before it.
  if layerwise_lr_decay != 1.0:
    tx = optax.chain(tx, scale_by_layer_depth(layerwise_lr_decay, num_layers))
  return tx, schedule


def from_config(config, *, num_train_steps, warmup_steps, model_config=None):
  """create_optimizer with the config's optimizer fields (pre-training and fine-tuning alike).

  model_config (a BertConfig): its depth for fine-tuning's config.layerwise_lr_decay, a field
  pre-training configs do not have (absent = 1.0, off).
  """
  decay = config.get("layerwise_lr_decay", 1.0)
  if decay != 1.0:
    check_layerwise_lr_decay(decay, model_config)
  return create_optimizer(
      learning_rate=config.learning_rate, warmup_steps=warmup_steps,
      num_train_steps=num_train_steps, optimizer=config.optimizer,
      weight_decay=config.weight_decay, b1=config.b1, b2=config.b2, eps=config.eps,
      clip_norm=config.clip_norm, layerwise_lr_decay=decay,
      num_layers=model_config.num_layers if model_config is not None else 0,
      # Absent from a config (fine-tuning's, older ones): BERT's linear schedule.
      schedule=config.get("schedule", "linear"), decay_steps=config.get("decay_steps", 0),
      final_lr_fraction=config.get("final_lr_fraction", 0.0),
      weight_decay_all_tensors=config.get("weight_decay_all_tensors", False))


SCHEDULES = ("linear", "wsd", "cosine", "hf_cosine")


def create_schedule(schedule, learning_rate, warmup_steps, num_train_steps, decay_steps=0,
                    final_lr_fraction=0.0) -> optax.Schedule:
  """config.schedule by name, each checked (one-line OptimizerError) before any compute."""
  if schedule == "linear":   # BERT's: linear warmup, linear decay to 0 at num_train_steps
    return create_learning_rate_schedule(learning_rate, warmup_steps, num_train_steps)
  if schedule == "wsd":      # ModernBERT's warmup-stable-decay, 1-sqrt decay over decay_steps
    return create_wsd_schedule(learning_rate, warmup_steps, decay_steps, num_train_steps,
                               final_lr_fraction)
  if schedule == "cosine":   # NeoBERT's: cosine to final_lr_fraction by step decay_steps
    return create_cosine_schedule(learning_rate, warmup_steps, decay_steps, num_train_steps,
                                  final_lr_fraction)
  if schedule == "hf_cosine":   # transformers' cosine with warmup (modernbert-embed's stage 1)
    return create_hf_cosine_schedule(learning_rate, warmup_steps, num_train_steps)
  raise OptimizerError(f"config.schedule={schedule!r}: unknown; use 'linear' (BERT), 'wsd' "
                       "(warmup-stable-decay with 1-sqrt decay, ModernBERT), 'cosine' "
                       "(warmup, cosine to final_lr_fraction, NeoBERT) or 'hf_cosine' "
                       "(transformers' cosine with warmup, to 0 at the last step).")


def create_hf_cosine_schedule(learning_rate: float, warmup_steps: int,
                              num_train_steps: int) -> optax.Schedule:
  """transformers' get_cosine_schedule_with_warmup (num_cycles=0.5), which get_scheduler
  ("cosine", ...) builds and nomic's contrastors trains modernbert-embed's stage 1 with:
    t < w   lr x t / w
    t >= w  lr x (1 + cos(pi (t - w) / (T - w))) / 2      (0 at T = num_train_steps)
  NeoBERT's "cosine" above differs: its warmup starts at 1e-4 x lr, and its cosine's period of D
  steps counts from the warmup's end but is cut at step D, just above its floor."""
  if learning_rate <= 0:
    raise OptimizerError(f"learning_rate={learning_rate}: must be > 0.")
  if not 0 <= warmup_steps < num_train_steps:
    raise OptimizerError(f"warmup_steps={warmup_steps}, num_train_steps={num_train_steps}: "
                         "hf_cosine needs 0 <= warmup_steps < num_train_steps (set "
                         "--config.warmup_steps lower, or train more steps).")
  return optax.warmup_cosine_decay_schedule(0.0, learning_rate, warmup_steps, num_train_steps,
                                            end_value=0.0)


# ----------------------------------------------------------------------------------------------
# ELECTRA's layer-wise learning-rate decay (Clark et al. 2020; fine-tuning only).
# ----------------------------------------------------------------------------------------------
# google-research/electra model/optimization.py `_get_layer_lrs(learning_rate, layer_decay,
# n_layers)`: key_to_depths = {"/embeddings/": 0, "/embeddings_project/": 0, "task_specific/":
# n_layers + 2, "encoder/layer_{i}/": i + 1} and a variable's rate is
# `learning_rate * (layer_decay ** (n_layers + 2 - depth))`, its key matched by substring (a
# variable no key matches is a ValueError there). Their configure_finetuning.py uses 0.8, and 0.9
# for large. ELECTRA-base (L=12) at 0.8: embeddings x0.8^14 = 0.044, layer_0 x0.8^13 = 0.055,
# layer_11 x0.8^2 = 0.64, the head x1.
#
# Depth n_layers + 1 has no key there: ELECTRA has no pooler (modeling.py: `self.pooled_output =
# self.sequence_output[:, 0]`; our ELECTRA fine-tunes without one too, heads.py). BERT's
# pre-trained tanh pooler (bert/pooler, the family's only layer between encoder and head) takes
# that free slot here: one step above the last layer, x decay, below the fresh head's x1.
#
# ELECTRA's AdamWeightDecayOptimizer updates by lr x (adam + wd x param), so a per-variable rate
# scales the decoupled weight decay as well: multiplying each parameter's final update (after
# the schedule and weight decay, any optimizer= here) is that, exactly.
_LAYER = re.compile(r"layer_(\d+)")


def _check_decay_value(decay):
  if not (isinstance(decay, (int, float)) and 0 < decay <= 1):
    raise OptimizerError(f"config.layerwise_lr_decay={decay!r}: must be in (0, 1]; ELECTRA "
                         "fine-tunes with 0.8 (small, base) or 0.9 (large), 1.0 turns it off.")


def layer_depth(names, num_layers) -> int:
  """ELECTRA's depth of the parameter at path `names` ("bert", "encoder", "layer_3", ...): 0 the
  embeddings (with ELECTRA-small's / ALBERT's E -> H projection, as their "/embeddings_project/"),
  i + 1 bert/encoder/layer_i, num_layers + 1 bert/pooler, num_layers + 2 a task head (every
  top-level module but `bert`, as their "task_specific/")."""
  if not names or names[0] != "bert":
    return num_layers + 2
  part = names[1] if len(names) > 1 else ""
  if part == "embeddings":
    return 0
  if part == "pooler":
    return num_layers + 1
  m = _LAYER.fullmatch(names[2]) if part == "encoder" and len(names) > 2 else None
  if m and int(m.group(1)) < num_layers:
    return int(m.group(1)) + 1
  raise OptimizerError(f"config.layerwise_lr_decay: parameter {'/'.join(names)} has no depth (expected "
                       f"bert/embeddings/..., bert/encoder/layer_{{0..{num_layers - 1}}}/..., "
                       "bert/pooler/... or a head outside bert/); set "
                       "--config.layerwise_lr_decay=1.0.")


def layerwise_lr_multipliers(params, decay, num_layers):
  """Pytree of Python floats like `params` (arrays or ShapeDtypeStructs; only the paths are
  read): decay ** (num_layers + 2 - depth), the factor on each parameter's learning rate."""
  _check_decay_value(decay)
  return jax.tree_util.tree_map_with_path(
      lambda path, _: float(decay) ** (num_layers + 2 - layer_depth(_path_names(path),
                                                                     num_layers)), params)


def scale_by_layer_depth(decay, num_layers) -> optax.GradientTransformation:
  """The last link of the chain: each update times its parameter's layerwise_lr_multipliers
  factor. Stateless (optax.EmptyState: nothing to checkpoint); the factors are trace-time
  constants read off the updates' paths, so the compiled step only gains one multiply a leaf."""
  if num_layers <= 0:
    raise OptimizerError(f"config.layerwise_lr_decay={decay}: needs the encoder's depth "
                         f"(num_layers={num_layers}); pass from_config's model_config, or set "
                         "--config.layerwise_lr_decay=1.0.")

  def scale(updates, params=None):
    del params
    factors = layerwise_lr_multipliers(updates, decay, num_layers)
    return jax.tree.map(lambda u, f: u * jnp.asarray(f, u.dtype), updates, factors)
  return optax.stateless(scale)


def check_layerwise_lr_decay(decay, model_config) -> str:
  """Fine-tuning's set-up check of config.layerwise_lr_decay against the model (one-line
  OptimizerError before any compute); returns the start-up line naming the factors ("" at 1.0)."""
  _check_decay_value(decay)
  if decay == 1.0:
    return ""
  if model_config is None:
    raise OptimizerError(f"config.layerwise_lr_decay={decay}: needs the model's depth; pass "
                         "from_config's model_config, or set --config.layerwise_lr_decay=1.0.")
  if model_config.share_layers not in ("none", ""):
    raise OptimizerError(f"config.layerwise_lr_decay={decay} with share_layers="
                         f"{model_config.share_layers!r} (ALBERT): one shared layer runs at every "
                         "depth, so there is no per-layer rate to give it; set "
                         "--config.layerwise_lr_decay=1.0.")
  n = model_config.num_layers
  last = f" ... layer_{n - 1} x{decay ** 2:.3g}" if n > 1 else ""
  pooler = f", pooler x{decay:g}" if model_config.has_pooler else ""
  return (f"layer-wise learning-rate decay {decay:g} (ELECTRA): embeddings "
          f"x{decay ** (n + 2):.3g}, layer_0 x{decay ** (n + 1):.3g}{last}{pooler}, head x1")


# ----------------------------------------------------------------------------------------------
# ModernBERT's recipe (issue 30): StableAdamW and the warmup-stable-decay schedule, 1-sqrt decay.
# ----------------------------------------------------------------------------------------------
# StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale
# vision-language models", Alg. 2) is AdamW whose step is divided, tensor by tensor, by
# max(1, RMS_t), RMS_t = sqrt(mean(g_t^2 / max(v_hat_t, eps^2))): AdaFactor's update clipping,
# which replaces global gradient clipping. ModernBERT trains with optimi's StableAdamW
# (answerdotai/ModernBERT src/optimizer.py, "decoupled_stableadamw" = decouple_lr=True), per
# tensor and step t, with lr_t the scheduled rate and max_lr the peak:
#   m_hat, v_hat = Adam's bias-corrected moments (optimi folds the correction into its betas)
#   lr' = lr_t / max(1, sqrt(mean(g^2 / max(v_hat, eps^2))))
#   p <- p * (1 - lr' / max_lr * wd)          fully decoupled decay (decouple_lr=True), or
#   p <- p * (1 - lr' * wd)                   decoupled (AdamW's, decouple_lr=False)
#   p <- p - lr' * m_hat / (sqrt(v_hat) + eps)
# As optax: -lr_t / max(1, RMS) x (scale_by_adam + wd' x p), wd' = wd / max_lr or wd. The clip
# wraps optax's own scale_by_adam + add_decayed_weights and reads v_hat from Adam's state, so the
# optimizer state is Adam's (no second copy of v). ModernBERT's repo yamls: betas (0.9, 0.98),
# eps 1e-6, weight decay 1e-5, none on biases and norms (filter_bias_norm_wd); peak lr 8e-4 for
# base (its paper).
class _StableState(NamedTuple):
  inner: optax.OptState        # (ScaleByAdamState, add_decayed_weights' state)


def scale_by_stable_adam(b1, b2, eps, weight_decay, mask) -> optax.GradientTransformation:
  """Adam's bias-corrected m_hat / (sqrt(v_hat) + eps) plus weight_decay x param (masked), the
  sum divided per tensor by max(1, sqrt(mean(g^2 / max(v_hat, eps^2)))): StableAdamW's update
  before the learning rate (chain optax.scale_by_learning_rate after it)."""
  inner = optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                      optax.add_decayed_weights(weight_decay, mask=mask))

  def init(params):
    return _StableState(inner.init(params))

  def update(grads, state, params=None):
    updates, new_inner = inner.update(grads, state.inner, params)
    adam = new_inner[0]                                        # ScaleByAdamState(count, mu, nu)
    correction = 1.0 - b2 ** adam.count.astype(jnp.float32)    # count: steps including this one

    def clip(u, g, nu):
      v_hat = nu.astype(jnp.float32) / correction
      g = g.astype(jnp.float32)
      rms = jnp.sqrt(jnp.mean(jnp.square(g) / jnp.maximum(v_hat, eps * eps)))
      return (u / jnp.maximum(1.0, rms)).astype(u.dtype)
    return jax.tree.map(clip, updates, grads, adam.nu), _StableState(new_inner)
  return optax.GradientTransformation(init, update)


def stable_adamw(schedule, *, peak_learning_rate, b1=0.9, b2=0.98, eps=1e-6, weight_decay=1e-5,
                 decouple_lr=True, mask=decay_mask_fn) -> optax.GradientTransformation:
  """ModernBERT's optimizer (see the section comment). decouple_lr=True (ModernBERT's): the
  decay is wd x lr_t / peak_learning_rate per step (the schedule's shape, not its size), so
  wd=1e-5 means 1e-5 of each weight per step at the peak."""
  if peak_learning_rate <= 0:
    raise OptimizerError(f"learning_rate={peak_learning_rate}: must be > 0.")
  decay = weight_decay / peak_learning_rate if decouple_lr else weight_decay
  return optax.chain(scale_by_stable_adam(b1, b2, eps, decay, mask),
                     optax.scale_by_learning_rate(schedule))


def create_wsd_schedule(learning_rate: float, warmup_steps: int, decay_steps: int,
                        num_train_steps: int, final_fraction: float = 0.0) -> optax.Schedule:
  """Warmup-stable-decay (trapezoidal) with 1-sqrt decay (Hägele et al. 2024), as ModernBERT:
  linear 0 -> lr over warmup_steps, lr until num_train_steps - decay_steps, then
  lr x (f + (1 - f)(1 - sqrt(n / decay_steps))) over the last decay_steps (n counted from the
  decay's start; f = final_fraction), f x lr after (ModernBERT's OneMinusSqrtScheduler).

  E.g. lr 8e-4, warmup 100, decay 400, 1,000 steps, f 0: step 50 -> 4e-4, 100 ... 600 -> 8e-4,
  700 -> 8e-4 x (1 - sqrt(1/4)) = 4e-4, 1,000 -> 0.
  """
  if learning_rate <= 0:
    raise OptimizerError(f"learning_rate={learning_rate}: must be > 0.")
  if (num_train_steps <= 0 or warmup_steps < 0 or decay_steps < 0
      or warmup_steps + decay_steps > num_train_steps):
    raise OptimizerError(f"warmup_steps={warmup_steps}, decay_steps={decay_steps}, "
                         f"num_train_steps={num_train_steps}: need warmup_steps + decay_steps <= "
                         "num_train_steps, none negative, num_train_steps > 0.")
  if not 0.0 <= final_fraction <= 1.0:
    raise OptimizerError(f"final_fraction={final_fraction}: the decay ends at this fraction of "
                         "the peak learning rate, in [0, 1].")

  def decay(n):
    frac = jnp.clip(jnp.asarray(n, jnp.float32) / max(decay_steps, 1), 0.0, 1.0)
    return learning_rate * (final_fraction + (1.0 - final_fraction) * (1.0 - jnp.sqrt(frac)))

  stable_end = num_train_steps - decay_steps
  pieces, boundaries = [], []
  if warmup_steps:
    pieces.append(optax.linear_schedule(0.0, learning_rate, warmup_steps))
    boundaries.append(warmup_steps)
  pieces.append(optax.constant_schedule(learning_rate))
  if decay_steps:
    boundaries.append(stable_end)
    pieces.append(decay)
  return optax.join_schedules(pieces, boundaries) if boundaries else pieces[0]


# ----------------------------------------------------------------------------------------------
# NeoBERT's schedule (issue 30): linear warmup, then a cosine to a fraction of the peak.
# ----------------------------------------------------------------------------------------------
# chandar-lab/NeoBERT (HEAD ed75b68) src/neobert/scheduler/scheduler.py get_scheduler with
# conf/scheduler/cosine_decay.yaml (warmup_steps 2,000, decay_steps 900,000, decay cosine) and
# its default final_ratio=0.1: torch's SequentialLR of LinearLR(start_factor=1e-4,
# total_iters=warmup_steps), CosineAnnealingLR(T_max=decay_steps, eta_min=lr x final_ratio),
# LambdaLR(final_ratio), milestones [warmup_steps, decay_steps]. Rate at optimizer step t
# (0-based, w = warmup_steps, D = decay_steps, f = final_ratio):
#   t < w        lr x (1e-4 + (1 - 1e-4) t / w)
#   w <= t < D   lr x (f + (1 - f)(1 + cos(pi (t - w) / D)) / 2)
#   t >= D       lr x f
# The cosine's period is D counted from the warmup's end, cut at step D: at D - 1 it stands at
# f + (1 - f) sin^2(pi (w + 1) / 2D) (0.1000110 of the peak for 2,000 / 900,000), then f.
# Checked against the reference's own get_scheduler run under torch 2.13 (w 20, D 90, 100
# steps: largest difference 3e-16 of the peak).
COSINE_WARMUP_START = 1e-4   # LinearLR(start_factor=1e-4): step 0 trains at 1e-4 x lr, not 0


def create_cosine_schedule(learning_rate: float, warmup_steps: int, decay_steps: int,
                           num_train_steps: int, final_fraction: float = 0.1) -> optax.Schedule:
  """NeoBERT's warmup + cosine (the section comment's formula). decay_steps = D, the step where
  the cosine ends and final_fraction x lr holds to the end; 0 = num_train_steps.

  E.g. lr 1e-4, warmup 2,000, D 900,000, f 0.1 (neobert): step 0 -> 1e-8, 2,000 -> 1e-4,
  452,000 -> 5.5e-5 (half the period), 900,000 ... 1,000,000 -> 1e-5.
  """
  decay_steps = decay_steps or num_train_steps
  if learning_rate <= 0:
    raise OptimizerError(f"learning_rate={learning_rate}: must be > 0.")
  if not 0 <= warmup_steps < decay_steps <= num_train_steps:
    raise OptimizerError(f"config.warmup_steps={warmup_steps}, config.decay_steps="
                         f"{decay_steps}, config.num_train_steps={num_train_steps}: the cosine "
                         "schedule needs 0 <= warmup_steps < decay_steps <= num_train_steps "
                         "(decay_steps: the step its cosine ends; 0 = num_train_steps).")
  if not 0.0 <= final_fraction <= 1.0:
    raise OptimizerError(f"config.final_lr_fraction={final_fraction}: the cosine ends at this "
                         "fraction of the peak learning rate, in [0, 1] (NeoBERT: 0.1).")
  pieces = [optax.cosine_decay_schedule(learning_rate, decay_steps, alpha=final_fraction),
            optax.constant_schedule(final_fraction * learning_rate)]
  boundaries = [decay_steps]
  if warmup_steps:
    pieces.insert(0, optax.linear_schedule(COSINE_WARMUP_START * learning_rate, learning_rate,
                                           warmup_steps))
    boundaries.insert(0, warmup_steps)
  return optax.join_schedules(pieces, boundaries)
