"""StableAdamW and the warmup-stable-decay schedule (bert_jax/training/optimizer.py, ModernBERT's recipe)
against their formulas: optimi's StableAdamW step written out in numpy, and the schedule's
pieces evaluated by hand."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.training import optimizer as opt_lib


def _optimi_stableadamw(params, grads_per_step, lrs, *, b1, b2, eps, wd, decays, max_lr,
                        decouple_lr):
  """optimi's _single_param_stableadamw, tensor by tensor, in float64: debiased betas
  (beta_hat = (beta^t - beta) / (beta^t - 1)), exp_avg.lerp_(g, 1 - b1_hat), exp_avg_sq =
  b2_hat v + (1 - b2_hat) g^2, lr' = lr / max(1, sqrt(mean(g^2 / max(v, eps^2)))), decay, step.
  Returns the params after each step and the largest RMS seen."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  history, max_rms = [], 0.0
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    debias = lambda beta: (beta ** t - beta) / (beta ** t - 1)
    b1_hat, b2_hat = debias(b1), debias(b2)
    for k in params:
      g = np.asarray(grads[k], np.float64)
      m[k] = m[k] + (1 - b1_hat) * (g - m[k])                            # lerp
      v[k] = b2_hat * v[k] + (1 - b2_hat) * g * g
      rms = np.sqrt(np.mean(g * g / np.maximum(v[k], eps ** 2)))
      max_rms = max(max_rms, rms)
      step_lr = lr / max(1.0, rms)
      if decays[k]:
        params[k] = params[k] * (1 - (step_lr / max_lr if decouple_lr else step_lr) * wd)
      params[k] = params[k] - step_lr * m[k] / (np.sqrt(v[k]) + eps)
    history.append({k: p.copy() for k, p in params.items()})
  return history, max_rms


def _toy(seed=0):
  rng = np.random.default_rng(seed)
  params = {"kernel": rng.normal(size=(4, 3)), "bias": rng.normal(size=(3,)),
            "scale": rng.normal(size=(3,)) + 1}
  grads = [{k: rng.normal(size=p.shape) * 0.1 for k, p in params.items()} for _ in range(5)]
  grads[3]["kernel"] = grads[3]["kernel"] * 50                           # a spike: RMS > 1
  return params, grads


@pytest.mark.parametrize("decouple_lr", [True, False], ids=["fully_decoupled", "decoupled"])
def test_stable_adamw_equals_optimi_formula(decouple_lr):
  params, grads = _toy()
  lrs = [1e-3, 2e-3, 3e-3, 3e-3, 1.5e-3]
  schedule = lambda count: jnp.asarray(lrs)[count]
  wd = 0.1 if decouple_lr else 1.0                                       # visible at 5 steps
  tx = opt_lib.stable_adamw(schedule, peak_learning_rate=3e-3, b1=0.9, b2=0.98, eps=1e-6,
                            weight_decay=wd, decouple_lr=decouple_lr)
  expected, max_rms = _optimi_stableadamw(
      params, grads, lrs, b1=0.9, b2=0.98, eps=1e-6, wd=wd, max_lr=3e-3,
      decays={"kernel": True, "bias": False, "scale": False}, decouple_lr=decouple_lr)
  assert max_rms > 1.5, max_rms                                          # the clip did act

  p = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
  state = tx.init(p)
  for step, g in enumerate(grads):
    updates, state = tx.update({k: jnp.asarray(v, jnp.float32) for k, v in g.items()}, state, p)
    p = optax.apply_updates(p, updates)
    for k in p:
      np.testing.assert_allclose(p[k], expected[step][k], rtol=1e-5, atol=1e-6,
                                 err_msg=f"{k} after step {step + 1}")


def test_the_clip_halves_a_spike_that_adamw_takes_whole():
  # Three equal gradients (v_hat = g^2, RMS = 1: no clip, StableAdamW = AdamW), then 50 x g on
  # the kernel only: v_hat = b2_hat g^2 + (1 - b2_hat) 2,500 g^2 with b2_hat = 0.742 at step 4
  # (b2 = 0.98), RMS = sqrt(2,500 / 644.7) = 1.97, so StableAdamW's 4th step on the kernel is
  # AdamW's / 1.97 and the bias's (no spike) is AdamW's.
  params, grads = _toy()
  g = {k: jnp.full_like(jnp.asarray(v, jnp.float32), 0.1) for k, v in params.items()}
  spike = {**g, "kernel": g["kernel"] * 50}
  p0 = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}

  def fourth_step(tx):
    p, state = p0, tx.init(p0)
    for grad in (g, g, g, spike):
      updates, state = tx.update(grad, state, p)
      p = optax.apply_updates(p, updates)
    return updates

  stable = fourth_step(opt_lib.stable_adamw(1e-3, peak_learning_rate=1e-3, weight_decay=0.0))
  adamw = fourth_step(optax.adamw(1e-3, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.0))
  b2_hat = (0.98 ** 4 - 0.98) / (0.98 ** 4 - 1)
  rms = np.sqrt(2500 / (b2_hat + (1 - b2_hat) * 2500))
  assert 1.9 < rms < 2.0
  np.testing.assert_allclose(stable["kernel"], adamw["kernel"] / rms, rtol=1e-4)
  np.testing.assert_allclose(stable["bias"], adamw["bias"], rtol=1e-5)


def test_stable_adamw_state_is_adams_and_jits():
  params, grads = _toy()
  p = {k: jnp.asarray(v, jnp.float32) for k, v in params.items()}
  tx = opt_lib.stable_adamw(opt_lib.create_wsd_schedule(1e-3, 2, 2, 10), peak_learning_rate=1e-3)
  state = tx.init(p)
  adam = state[0].inner[0]
  assert isinstance(adam, optax.ScaleByAdamState)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  updates, state = step({k: jnp.asarray(v, jnp.float32) for k, v in grads[0].items()}, state, p)
  assert int(state[0].inner[0].count) == 1
  assert all(bool(jnp.isfinite(u).all()) for u in jax.tree.leaves(updates))
  with pytest.raises(opt_lib.OptimizerError, match="learning_rate=0"):
    opt_lib.stable_adamw(0.0, peak_learning_rate=0.0)


def test_wsd_schedule_values():
  lr, f = 8e-4, 0.1
  s = opt_lib.create_wsd_schedule(lr, warmup_steps=100, decay_steps=400, num_train_steps=1000,
                                  final_fraction=f)
  one_minus_sqrt = lambda n: lr * (f + (1 - f) * (1 - np.sqrt(n / 400)))
  for step, expected in [(0, 0.0), (50, lr / 2), (100, lr), (350, lr), (600, lr),
                         (700, one_minus_sqrt(100)), (800, one_minus_sqrt(200)),
                         (999, one_minus_sqrt(399)), (1000, f * lr), (5000, f * lr)]:
    np.testing.assert_allclose(s(step), expected, rtol=1e-5, atol=1e-12, err_msg=f"step {step}")
  # 1-sqrt falls fast first: a quarter of the way into the decay, half of it is done.
  np.testing.assert_allclose(s(700), lr * (f + (1 - f) * 0.5), rtol=1e-6)
  # No warmup, no decay: the pieces that are left.
  np.testing.assert_allclose([opt_lib.create_wsd_schedule(1e-3, 0, 0, 10)(k) for k in (0, 9)],
                             [1e-3, 1e-3])
  np.testing.assert_allclose(opt_lib.create_wsd_schedule(1e-3, 0, 10, 10)(0), 1e-3)
  np.testing.assert_allclose(opt_lib.create_wsd_schedule(1e-3, 0, 10, 10)(10), 0.0)


@pytest.mark.parametrize("kwargs,match", [
    (dict(warmup_steps=600, decay_steps=500, num_train_steps=1000), "warmup_steps=600"),
    (dict(warmup_steps=10, decay_steps=-1, num_train_steps=1000), "decay_steps=-1"),
    (dict(warmup_steps=10, decay_steps=10, num_train_steps=100, final_fraction=1.5),
     "final_fraction=1.5"),
])
def test_wsd_schedule_errors(kwargs, match):
  with pytest.raises(opt_lib.OptimizerError, match=match) as e:
    opt_lib.create_wsd_schedule(1e-3, **kwargs)
  assert "\n" not in str(e.value)


def test_from_config_builds_stable_adamw_on_the_wsd_schedule():
  """--config.optimizer=stable_adamw --config.schedule=wsd: the same updates as the pieces built
  by hand; an unknown schedule is one OptimizerError naming the field."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict(dict(
      learning_rate=8e-4, optimizer="stable_adamw", weight_decay=1e-5, b1=0.9, b2=0.98,
      eps=1e-6, clip_norm=0.0, schedule="wsd", decay_steps=4, final_lr_fraction=0.1))
  tx, schedule = opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)
  want_schedule = opt_lib.create_wsd_schedule(8e-4, 2, 4, 10, 0.1)
  for step in (0, 1, 3, 7, 9, 10):
    np.testing.assert_allclose(schedule(step), want_schedule(step), rtol=1e-6)
  ref = opt_lib.stable_adamw(want_schedule, peak_learning_rate=8e-4, b1=0.9, b2=0.98,
                               eps=1e-6, weight_decay=1e-5)
  params = {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), params)
  a, _ = tx.update(grads, tx.init(params), params)
  b, _ = ref.update(grads, ref.init(params), params)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), a, b)
  c.schedule = "polynomial"
  with pytest.raises(opt_lib.OptimizerError, match="config.schedule='polynomial'"):
    opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)
