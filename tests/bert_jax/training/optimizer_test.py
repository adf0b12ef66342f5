"""Tests for bert_jax/training/optimizer.py."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax.training import optimizer as opt_lib


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


def _cosine_closed_form(t, lr, w, d, f):
  # NeoBERT's get_scheduler (optimizer.py's section comment), written out.
  if t < w:
    return lr * (1e-4 + (1 - 1e-4) * t / w)
  if t < d:
    return lr * (f + (1 - f) * (1 + np.cos(np.pi * (t - w) / d)) / 2)
  return lr * f


def test_cosine_schedule_values():
  lr, w, d, n, f = 1e-4, 2_000, 900_000, 1_000_000, 0.1      # the neobert preset's
  s = opt_lib.create_cosine_schedule(lr, w, d, n, f)
  # warmup's start and end, a quarter, half and the end of the cosine's period, its last step
  # before the cut (0.1000110 of the peak), the cut, the run's end and beyond.
  for t in (0, 1_000, w, 227_000, 452_000, 677_000, d - 1, d, n, 2 * n):
    np.testing.assert_allclose(s(t), _cosine_closed_form(t, lr, w, d, f), rtol=1e-5,
                               atol=1e-6 * lr, err_msg=f"step {t}")
  np.testing.assert_allclose([s(w), s(452_000), s(d), s(n)], [1e-4, 5.5e-5, 1e-5, 1e-5],
                             rtol=1e-5)
  # The reference's own numbers: NeoBERT's scheduler.py get_scheduler run under torch 2.13 with
  # warmup_steps 20, decay_steps 90, final_ratio 0.1, lr read before each of 100 steps.
  small = opt_lib.create_cosine_schedule(1.0, 20, 90, 100, 0.1)
  torch_lr = {0: 1e-4, 1: 0.050095, 10: 0.50005, 20: 1.0, 21: 0.9997258721585932,
              55: 0.703909064496551, 65: 0.55, 89: 0.21558482853517286, 90: 0.1, 99: 0.1}
  for t, want in torch_lr.items():
    np.testing.assert_allclose(small(t), want, rtol=1e-5, atol=1e-7, err_msg=f"step {t}")
  # decay_steps 0: the cosine ends with the run; warmup 0: it starts at the peak.
  whole = opt_lib.create_cosine_schedule(1e-3, 0, 0, 10, 0.0)
  np.testing.assert_allclose([whole(0), whole(5), whole(10)], [1e-3, 5e-4, 0.0], atol=1e-9)


@pytest.mark.parametrize("kwargs,match", [
    (dict(warmup_steps=90, decay_steps=90, num_train_steps=100),
     "warmup_steps=90, config.decay_steps=90"),
    (dict(warmup_steps=10, decay_steps=101, num_train_steps=100), "decay_steps=101"),
    (dict(warmup_steps=-1, decay_steps=90, num_train_steps=100), "warmup_steps=-1"),
    (dict(warmup_steps=10, decay_steps=90, num_train_steps=100, final_fraction=1.5),
     "final_lr_fraction=1.5"),
    (dict(warmup_steps=10, decay_steps=90, num_train_steps=100, final_fraction=-0.1),
     "final_lr_fraction=-0.1")])
def test_cosine_schedule_errors(kwargs, match):
  with pytest.raises(opt_lib.OptimizerError, match=match) as e:
    opt_lib.create_cosine_schedule(1e-4, **kwargs)
  assert "\n" not in str(e.value)


def test_from_config_picks_the_schedule_by_name():
  import ml_collections  # pylint: disable=g-import-not-at-top
  c = ml_collections.ConfigDict(dict(learning_rate=1e-3, optimizer="adamw", weight_decay=0.01,
                                     b1=0.9, b2=0.999, eps=1e-6, clip_norm=1.0,
                                     schedule="cosine", decay_steps=8, final_lr_fraction=0.1))
  _, s = opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)
  for t in (0, 1, 2, 5, 8, 10):
    np.testing.assert_allclose(s(t), _cosine_closed_form(t, 1e-3, 2, 8, 0.1), rtol=1e-5)
  c.schedule = "polynomial"
  with pytest.raises(opt_lib.OptimizerError, match="config.schedule='polynomial': unknown") as e:
    opt_lib.from_config(c, num_train_steps=10, warmup_steps=2)
  assert "'cosine'" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("optimizer", ["adamw", "lamb", "stable_adamw", "adamw_google"])
def test_weight_decay_all_tensors_decays_norms_and_biases(optimizer):
  """Zero gradients: Adam's step is 0, so the update is -lr x wd x param on the decayed tensors
  and exactly 0 on the rest (LAMB: its trust ratio ||p|| / ||wd x p||, on the same mask, makes
  that -lr x param)."""
  params, _ = _toy()
  zeros = jax.tree.map(jnp.zeros_like, params)
  lr, wd = 1e-2, 0.1
  for all_tensors in (False, True):
    tx, _ = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=0, num_train_steps=10,
                                     optimizer=optimizer, weight_decay=wd, clip_norm=0,
                                     weight_decay_all_tensors=all_tensors)
    updates, _ = tx.update(zeros, tx.init(params), params)
    for mod, leaf in (("dense", "kernel"), ("dense", "bias"), ("layer_norm", "scale")):
      decays = all_tensors or leaf == "kernel"
      # stable_adamw's decay is fully decoupled: wd / peak lr per unit of rate.
      rate = {"stable_adamw": wd / lr, "lamb": 1.0}.get(optimizer, wd)
      want = -lr * rate * params[mod][leaf]
      np.testing.assert_allclose(updates[mod][leaf], want if decays else 0.0, rtol=1e-5,
                                 err_msg=f"{optimizer} all={all_tensors} {mod}/{leaf}")
  with pytest.raises(opt_lib.OptimizerError, match="config.weight_decay_all_tensors='yes'"):
    opt_lib.create_optimizer(learning_rate=lr, warmup_steps=0, num_train_steps=10,
                             weight_decay_all_tensors="yes")


def test_decay_mask_on_bert_params():
  params = nn.meta.unbox(pretraining_heads.init_params(model_lib.get_bert_config("tiny",
                                                                                 vocab_size=50),
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


# ELECTRA's layer-wise learning-rate decay (google-research/electra model/optimization.py).
def _electra_reference_lr(name, lr, layer_decay, n_layers):
  """google-research/electra `_get_layer_lrs` + `apply_gradients`' substring lookup, verbatim
  but for the names: our heads (top-level modules but `bert`) are their "task_specific/<task>/"
  scope. None where no key matches (a ValueError there)."""
  key_to_depths = {"/embeddings/": 0, "/embeddings_project/": 0, "task_specific/": n_layers + 2}
  for layer in range(n_layers):
    key_to_depths["encoder/layer_" + str(layer) + "/"] = layer + 1
  lrs = {key: lr * (layer_decay ** (n_layers + 2 - depth)) for key, depth in key_to_depths.items()}
  name = name if name.startswith("bert/") else "task_specific/glue/" + name
  hits = [v for k, v in lrs.items() if k in name]
  assert len(hits) <= 1, name   # one group per variable, or it would be updated twice
  return hits[0] if hits else None


def _head_params(preset, family="classification"):
  from bert_jax.models import heads
  config = model_lib.get_bert_config(preset, vocab_size=50)
  model = heads.create_model(family, config)
  ids, mask, segments = heads.dummy_inputs(family, 8)
  shapes = jax.eval_shape(lambda: model.init(jax.random.key(0), ids, mask, segments,
                                             deterministic=True))   # paths only: no compute
  return config, nn.meta.unbox(shapes["params"])


def _by_name(tree):
  return {jax.tree_util.keystr(k, simple=True, separator="/"): v
          for k, v in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("preset,family", [("electra-small", "classification"),
                                           ("electra-small", "span"),
                                           ("tiny", "classification"),
                                           ("distilbert-mini", "classification")])
def test_layerwise_multipliers_equal_electras_get_layer_lrs(preset, family):
  config, params = _head_params(preset, family)
  n, d = config.num_layers, 0.8
  got = _by_name(opt_lib.layerwise_lr_multipliers(params, d, n))
  for name, factor in got.items():
    want = _electra_reference_lr(name, 1.0, d, n)
    if name.startswith("bert/pooler/"):   # BERT only: ELECTRA has no pooler, so no key
      assert want is None and factor == d, name
    else:
      assert want is not None, name
      np.testing.assert_allclose(factor, want, rtol=1e-12, err_msg=name)
  if preset == "electra-small":   # L=12 (layer_1 vs layer_10/11: their trailing '/')
    assert got["bert/embeddings/word_embeddings/embedding"] == pytest.approx(0.8 ** 14)
    assert got["bert/embeddings/projection/kernel"] == pytest.approx(0.8 ** 14)  # E=128 -> H
    assert got["bert/encoder/layer_0/attention/query/kernel"] == pytest.approx(0.8 ** 13)
    assert got["bert/encoder/layer_1/output/bias"] == pytest.approx(0.8 ** 12)
    assert got["bert/encoder/layer_11/intermediate/kernel"] == pytest.approx(0.8 ** 2)
    head = "classifier/dense/kernel" if family == "classification" else "qa_outputs/kernel"
    assert got[head] == 1.0
  assert not any(v > 1 for v in got.values())


def _layered_toy():
  """A 2-layer {bert: embeddings, encoder/layer_{0,1}, pooler; classifier} tree and grads."""
  rng = np.random.default_rng(0)
  shapes = {"bert": {"embeddings": {"word_embeddings": {"embedding": (5, 3)},
                                    "layer_norm": {"scale": (3,), "bias": (3,)}},
                     "encoder": {f"layer_{i}": {"intermediate": {"kernel": (3, 4), "bias": (4,)},
                                                "output_layer_norm": {"scale": (3,)}}
                                 for i in range(2)},
                     "pooler": {"kernel": (3, 3), "bias": (3,)}},
            "classifier": {"kernel": (3, 2), "bias": (2,)}}
  is_shape = lambda x: isinstance(x, tuple)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s), jnp.float32), shapes,
                        is_leaf=is_shape)
  grads = jax.tree.map(lambda s: jnp.asarray(rng.normal(size=s) * 3, jnp.float32), shapes,
                       is_leaf=is_shape)
  return params, grads


@pytest.mark.parametrize("optimizer", ["adamw", "adamw_google", "lamb"])
def test_layerwise_decay_scales_each_update_by_its_factor(optimizer):
  params, grads = _layered_toy()
  kw = dict(learning_rate=1e-2, warmup_steps=0, num_train_steps=10, optimizer=optimizer,
            weight_decay=0.1)
  plain, _ = opt_lib.create_optimizer(**kw)
  decayed, _ = opt_lib.create_optimizer(**kw, layerwise_lr_decay=0.8, num_layers=2)
  state_p, state_d = plain.init(params), decayed.init(params)
  for _ in range(2):   # the second step's Adam moments are the plain run's too
    up, state_p = plain.update(grads, state_p, params)
    ud, state_d = decayed.update(grads, state_d, params)
    u_p, u_d = _by_name(up), _by_name(ud)
    for name, factor in [("bert/embeddings/word_embeddings/embedding", 0.8 ** 4),
                         ("bert/embeddings/layer_norm/bias", 0.8 ** 4),
                         ("bert/encoder/layer_0/intermediate/kernel", 0.8 ** 3),
                         ("bert/encoder/layer_1/intermediate/kernel", 0.8 ** 2),
                         ("bert/encoder/layer_1/output_layer_norm/scale", 0.8 ** 2),
                         ("bert/pooler/kernel", 0.8), ("classifier/kernel", 1.0)]:
      np.testing.assert_allclose(u_d[name], u_p[name] * factor, rtol=1e-6, err_msg=name)
      assert not np.allclose(u_p[name], 0), name


def test_layerwise_decay_one_electra_step_by_hand():
  # ELECTRA's AdamWeightDecayOptimizer (no bias correction, google's schedule: lr at step 0
  # with warmup 0) at the layer's rate: p - lr x 0.8^(L+1-i) x (m / (sqrt(v) + eps) + wd x p),
  # after clip_by_global_norm(1.0). The decoupled weight decay is scaled too.
  params, grads = _layered_toy()
  lr, wd, eps = 1e-2, 0.1, 1e-6
  tx, _ = opt_lib.create_optimizer(learning_rate=lr, warmup_steps=0, num_train_steps=10,
                                   optimizer="adamw_google", weight_decay=wd,
                                   layerwise_lr_decay=0.8, num_layers=2)
  new = _by_name(optax.apply_updates(params, tx.update(grads, tx.init(params), params)[0]))
  norm = np.sqrt(sum(float((g ** 2).sum()) for g in jax.tree.leaves(grads)))
  p0, g0 = _by_name(params), _by_name(grads)
  for name in ["bert/encoder/layer_0/intermediate/kernel", "bert/encoder/layer_1/intermediate/bias",
               "bert/embeddings/word_embeddings/embedding"]:
    p, g = np.asarray(p0[name], np.float64), np.asarray(g0[name], np.float64) / max(norm, 1.0)
    m, v = 0.1 * g, 0.001 * g ** 2
    update = m / (np.sqrt(v) + eps) + (0.0 if name.endswith("bias") else wd * p)
    rate = _electra_reference_lr(name, lr, 0.8, 2)
    np.testing.assert_allclose(new[name], p - rate * update, rtol=1e-5, atol=1e-7, err_msg=name)


def test_layerwise_decay_one_is_bit_identical_to_the_plain_optimizer():
  params, grads = _layered_toy()
  kw = dict(learning_rate=1e-2, warmup_steps=2, num_train_steps=10, weight_decay=0.01)
  plain, _ = opt_lib.create_optimizer(**kw)
  same, _ = opt_lib.create_optimizer(**kw, layerwise_lr_decay=1.0, num_layers=2)
  s1, s2 = plain.init(params), same.init(params)
  # The same opt_state tree: checkpoints saved before the flag existed still resume.
  assert jax.tree.structure(s1) == jax.tree.structure(s2)
  for _ in range(3):
    u1, s1 = plain.update(grads, s1, params)
    u2, s2 = same.update(grads, s2, params)
    for a, b in zip(jax.tree.leaves(u1), jax.tree.leaves(u2)):
      np.testing.assert_array_equal(a, b)


def test_from_config_wires_layerwise_lr_decay():
  import ml_collections
  from bert_jax.configs import finetune as finetune_configs
  assert finetune_configs.get_config("glue_mrpc").layerwise_lr_decay == 1.0   # off by default
  params, grads = _layered_toy()
  model_config = model_lib.get_bert_config("tiny", vocab_size=50)   # L=2, as _layered_toy
  c = ml_collections.ConfigDict(dict(learning_rate=1e-2, optimizer="adamw", weight_decay=0.0,
                                     b1=0.9, b2=0.999, eps=1e-6, clip_norm=0.0,
                                     layerwise_lr_decay=0.5))
  tx, _ = opt_lib.from_config(c, num_train_steps=10, warmup_steps=0, model_config=model_config)
  u = _by_name(tx.update(grads, tx.init(params), params)[0])
  adam = -1e-2 * np.sign(np.asarray(grads["bert"]["encoder"]["layer_0"]["intermediate"]["kernel"]))
  np.testing.assert_allclose(u["bert/encoder/layer_0/intermediate/kernel"], 0.5 ** 3 * adam,
                             rtol=1e-4)
  with pytest.raises(opt_lib.OptimizerError, match="needs the model's depth"):
    opt_lib.from_config(c, num_train_steps=10, warmup_steps=0)


def test_layerwise_decay_refuses_albert_shared_layers():
  albert = model_lib.get_bert_config("albert-tiny", vocab_size=50)   # share_layers="all"
  with pytest.raises(opt_lib.OptimizerError,
                     match=r"layerwise_lr_decay=0.8 with share_layers='all'.*"
                           r"--config.layerwise_lr_decay=1.0\.$"):
    opt_lib.check_layerwise_lr_decay(0.8, albert)
  assert opt_lib.check_layerwise_lr_decay(1.0, albert) == ""   # off: nothing to refuse
  # Without the config check, the shared layer's path itself has no depth.
  _, params = _head_params("albert-tiny")
  with pytest.raises(opt_lib.OptimizerError, match="bert/encoder/layer_shared/.* has no depth"):
    opt_lib.layerwise_lr_multipliers(params, 0.8, albert.num_layers)
  line = opt_lib.check_layerwise_lr_decay(0.8, model_lib.get_bert_config("electra-base"))
  assert line == ("layer-wise learning-rate decay 0.8 (ELECTRA): embeddings x0.044, layer_0 "
                  "x0.055 ... layer_11 x0.64, head x1")


@pytest.mark.parametrize("bad", [0.0, -0.5, 1.5, None])
def test_layerwise_decay_refuses_values_outside_0_1(bad):
  tiny = model_lib.get_bert_config("tiny", vocab_size=50)
  for call in (lambda: opt_lib.check_layerwise_lr_decay(bad, tiny),
               lambda: opt_lib.create_optimizer(learning_rate=1e-4, warmup_steps=0,
                                                num_train_steps=10, layerwise_lr_decay=bad,
                                                num_layers=2)):
    with pytest.raises(opt_lib.OptimizerError,
                       match=rf"^config.layerwise_lr_decay={bad!r}: must be in \(0, 1\]"):
      call()
  with pytest.raises(opt_lib.OptimizerError, match="num_layers=0"):
    opt_lib.create_optimizer(learning_rate=1e-4, warmup_steps=0, num_train_steps=10,
                             layerwise_lr_decay=0.8)
