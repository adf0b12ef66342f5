"""Tests for bert_jax/optimizer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from bert_jax import model as model_lib
from bert_jax import optimizer as opt_lib


def test_schedule_values():
  s = opt_lib.create_learning_rate_schedule(1e-4, warmup_steps=100, num_train_steps=1100)
  for step, expected in [(0, 0.0), (50, 5e-5), (100, 1e-4), (600, 5e-5), (1100, 0.0),
                         (5000, 0.0), (1, 1e-6), (1099, 1e-7)]:
    np.testing.assert_allclose(s(step), expected, rtol=1e-4, atol=1e-12, err_msg=f"step {step}")
  no_warmup = opt_lib.create_learning_rate_schedule(2e-5, 0, 10)
  np.testing.assert_allclose([no_warmup(0), no_warmup(5), no_warmup(10)], [2e-5, 1e-5, 0.0])


def test_schedule_errors():
  with pytest.raises(ValueError, match="warmup_steps=20, num_train_steps=10"):
    opt_lib.create_learning_rate_schedule(1e-4, 20, 10)
  with pytest.raises(ValueError, match="learning_rate=0"):
    opt_lib.create_learning_rate_schedule(0, 0, 10)
  with pytest.raises(ValueError, match="optimizer='sgd'"):
    opt_lib.create_optimizer(learning_rate=1e-4, warmup_steps=0, num_train_steps=10,
                             optimizer="sgd")


def test_decay_mask_on_bert_params():
  params = nn.meta.unbox(model_lib.init_params(model_lib.get_bert_config("tiny", vocab_size=50),
                                               jax.random.key(0)))
  mask = opt_lib.decay_mask_fn(params)
  flat = {jax.tree_util.keystr(k, simple=True, separator="/"): v
          for k, v in jax.tree_util.tree_leaves_with_path(mask)}
  decayed = sorted(k for k, v in flat.items() if v)
  for k, v in flat.items():
    is_ln = "layer_norm" in k
    is_bias = k.endswith("bias")
    assert v == (not is_ln and not is_bias), k
    assert v == (k.endswith("kernel") or k.endswith("embedding")), k
  assert "bert/embeddings/word_embeddings/embedding" in decayed
  assert "bert/encoder/layer_1/attention/query/kernel" in decayed
  assert not flat["mlm_head/output_bias"]
  assert not flat["bert/encoder/layer_0/output_layer_norm/scale"]
  assert not flat["nsp_head/bias"]
  # 2 layers x 6 kernels + 3 embeddings + pooler + transform + nsp = 18.
  assert len(decayed) == 18


def _toy():
  params = {"dense": {"kernel": jnp.array([[0.5, -1.0], [2.0, 0.25]]),
                      "bias": jnp.array([0.1, -0.2])},
            "layer_norm": {"scale": jnp.array([1.0, 1.0])}}
  grads = {"dense": {"kernel": jnp.array([[3.0, -4.0], [0.0, 1.0]]),
                     "bias": jnp.array([2.0, 0.5])},
           "layer_norm": {"scale": jnp.array([-1.0, 0.0])}}
  return params, grads


def test_adamw_single_update_by_hand():
  params, grads = _toy()
  lr, wd, eps, clip = 1e-2, 0.1, 1e-6, 1.0
  tx, _ = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=0, num_train_steps=10,
                                   weight_decay=wd, eps=eps, clip_norm=clip)
  updates, _ = tx.update(grads, tx.init(params), params)
  new = optax.apply_updates(params, updates)

  norm = np.sqrt(sum(float((g ** 2).sum()) for g in jax.tree.leaves(grads)))  # sqrt(37)
  for path, decay in [(("dense", "kernel"), True), (("dense", "bias"), False),
                      (("layer_norm", "scale"), False)]:
    p, g = np.asarray(params[path[0]][path[1]]), np.asarray(grads[path[0]][path[1]])
    g = g * clip / norm                               # clip_by_global_norm
    m, v = 0.1 * g / (1 - 0.9), 0.001 * g ** 2 / (1 - 0.999)   # bias-corrected moments
    step = m / (np.sqrt(v) + eps) + (wd * p if decay else 0.0)  # decoupled decay
    np.testing.assert_allclose(new[path[0]][path[1]], p - lr * step, rtol=1e-5, atol=1e-7,
                               err_msg=str(path))


def test_lamb_trust_ratio_skips_bias_and_layer_norm():
  params, grads = _toy()
  lr = 1e-2
  tx, _ = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=0, num_train_steps=10,
                                   optimizer="lamb", weight_decay=0.0, clip_norm=0)
  updates, _ = tx.update(grads, tx.init(params), params)
  adam = jax.tree.map(lambda g: g / (np.abs(g) + 1e-6), grads)  # first Adam step
  # Bias: plain Adam step; kernel: scaled by ||w|| / ||adam step||.
  np.testing.assert_allclose(updates["dense"]["bias"], -lr * adam["dense"]["bias"], rtol=1e-5)
  k, u = params["dense"]["kernel"], adam["dense"]["kernel"]
  ratio = np.linalg.norm(k) / np.linalg.norm(u)
  np.testing.assert_allclose(updates["dense"]["kernel"], -lr * ratio * u, rtol=1e-5)


def test_from_config_uses_the_config_fields():
  import ml_collections
  c = ml_collections.ConfigDict(dict(learning_rate=2e-3, optimizer="adamw", weight_decay=0.0,
                                     b1=0.9, b2=0.999, eps=1e-6, clip_norm=0.0))
  tx, schedule = opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)
  np.testing.assert_allclose([schedule(1), schedule(2), schedule(10)], [1e-3, 2e-3, 0.0],
                             rtol=1e-6)
  c.optimizer = "sgd"
  with pytest.raises(opt_lib.OptimizerError, match="config.optimizer='sgd'"):
    opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)


def _google_reference(params, grads_per_step, *, lr, warmup, total, wd, b1=0.9, b2=0.999,
                      eps=1e-6, clip=1.0):
  """google-research/bert optimization.py (TF1), written out in numpy: create_optimizer's
  schedule, tf.clip_by_global_norm and AdamWeightDecayOptimizer.apply_gradients, with its
  exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"]."""
  flat = {"/".join(k): np.asarray(v, np.float64) for k, v in _flatten(params)}
  m = {k: np.zeros_like(v) for k, v in flat.items()}
  v2 = {k: np.zeros_like(v) for k, v in flat.items()}
  for step, grads in enumerate(grads_per_step):   # global_step before its increment
    g = {"/".join(k): np.asarray(x, np.float64) for k, x in _flatten(grads)}
    norm = np.sqrt(sum((x ** 2).sum() for x in g.values()))
    g = {k: x * clip / max(norm, clip) for k, x in g.items()}
    rate = lr * (1 - min(step, total) / total)                 # polynomial_decay, power 1
    if warmup and step < warmup:
      rate = lr * step / warmup
    for k in flat:
      m[k] = b1 * m[k] + (1 - b1) * g[k]
      v2[k] = b2 * v2[k] + (1 - b2) * g[k] ** 2
      update = m[k] / (np.sqrt(v2[k]) + eps)
      if not any(x in k for x in ("LayerNorm", "layer_norm", "bias")):
        update = update + wd * flat[k]
      flat[k] = flat[k] - rate * update
  return flat


def _flatten(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flatten(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def test_adamw_google_equals_google_research_bert_step_for_step():
  params, _ = _toy()
  rng = np.random.default_rng(0)
  steps = [jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape) * 3, jnp.float32), params)
           for _ in range(30)]
  lr, warmup, total, wd = 1e-2, 10, 30, 0.01
  tx, schedule = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=warmup,
                                          num_train_steps=total, weight_decay=wd,
                                          optimizer="adamw_google")
  state, p = tx.init(params), params
  for g in steps:
    updates, state = tx.update(g, state, p)
    p = optax.apply_updates(p, updates)
  want = _google_reference(params, steps, lr=lr, warmup=warmup, total=total, wd=wd)
  for k, v in _flatten(p):
    np.testing.assert_allclose(v, want["/".join(k)], rtol=2e-5, atol=1e-7, err_msg=str(k))
  # The default (bias-corrected, continuous schedule) does not: this test can fail.
  tx2, _ = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=warmup, num_train_steps=total,
                                    weight_decay=wd)
  state, p2 = tx2.init(params), params
  for g in steps:
    updates, state = tx2.update(g, state, p2)
    p2 = optax.apply_updates(p2, updates)
  assert not np.allclose(p2["dense"]["kernel"], want["dense/kernel"], rtol=1e-3)


def test_google_schedule_values():
  s = opt_lib.create_google_schedule(1e-4, 10_000, 1_000_000)
  for step, want in [(0, 0.0), (5_000, 5e-5), (9_999, 1e-4 * 9_999 / 10_000),
                     (10_000, 9.9e-5), (505_000, 4.95e-5), (1_000_000, 0.0), (2_000_000, 0.0)]:
    np.testing.assert_allclose(float(s(step)), want, rtol=1e-5, atol=1e-12, err_msg=str(step))


def test_unknown_optimizer_names_the_choices():
  with pytest.raises(opt_lib.OptimizerError, match="'adamw_google'"):
    opt_lib.create_optimizer(learning_rate=1e-4, warmup_steps=0, num_train_steps=10,
                             optimizer="adam")
