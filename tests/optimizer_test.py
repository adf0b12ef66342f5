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
