"""Tests for bert_jax/models/model.py on tiny configs (CPU, seconds)."""

import dataclasses
import functools
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.models import model as model_lib
from bert_jax.objectives import pretraining as objectives
from bert_jax.models import pretraining_heads

TINY = model_lib.get_bert_config("tiny", vocab_size=99, max_position_embeddings=32)


def _batch(batch=2, seq=12, num_pred=3, vocab=99, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, (batch, seq)).astype(np.int32)
  lengths = np.array([seq, seq - 5] + [seq - 2] * (batch - 2))[:batch]
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  ids = ids * mask
  segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  positions = np.stack([rng.choice(l, num_pred, replace=False) for l in lengths]).astype(np.int32)
  return ids, mask, segments, positions


@functools.lru_cache(maxsize=None)
def _init(config, seed=0):  # cached: the tests only read the params
  return pretraining_heads.init_params(config, jax.random.key(seed))


def test_shapes_and_dtypes():
  params = _init(TINY)
  ids, mask, seg, pos = _batch()
  out = model_lib.BertModel(TINY).apply({"params": params["bert"]}, ids, mask, seg,
                                        output_hidden_states=True)
  assert out["sequence_output"].shape == (2, 12, 128)
  assert out["pooled_output"].shape == (2, 128)
  assert len(out["hidden_states"]) == TINY.num_layers + 1
  np.testing.assert_array_equal(out["hidden_states"][-1], out["sequence_output"])
  assert "hidden_states" not in model_lib.BertModel(TINY).apply(
      {"params": params["bert"]}, ids, mask, seg)
  mlm, nsp = pretraining_heads.BertForPreTraining(TINY).apply({"params": params}, ids, mask, seg,
                                                              pos)
  assert mlm.shape == (2, 3, 99) and mlm.dtype == jnp.float32
  assert nsp.shape == (2, 2) and nsp.dtype == jnp.float32


def test_mlm_logits_only_at_masked_positions_and_tied_to_word_embeddings():
  params = nn.meta.unbox(_init(TINY))
  ids, mask, seg, pos = _batch()
  mlm, _ = pretraining_heads.BertForPreTraining(TINY).apply({"params": params}, ids, mask, seg, pos)
  seq = model_lib.BertModel(TINY).apply({"params": params["bert"]}, ids, mask, seg)[
      "sequence_output"]
  h = params["mlm_head"]
  x = seq[np.arange(2)[:, None], pos] @ h["transform"]["kernel"] + h["transform"]["bias"]
  x = jax.nn.gelu(x, approximate=False)
  mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
  x = (x - mu) / np.sqrt(var + 1e-12) * h["transform_layer_norm"]["scale"] + \
      h["transform_layer_norm"]["bias"]
  expected = x @ params["bert"]["embeddings"]["word_embeddings"]["embedding"].T + h["output_bias"]
  np.testing.assert_allclose(mlm, expected, atol=1e-4)


def test_padding_invariance():
  params = _init(TINY)
  ids, mask, seg, pos = _batch()
  changed = np.where(mask == 1, ids, 7 + np.arange(12)[None] % 50).astype(np.int32)
  changed_seg = np.where(mask == 1, seg, 1).astype(np.int32)
  model = model_lib.BertModel(TINY)
  a = model.apply({"params": params["bert"]}, ids, mask, seg)
  b = model.apply({"params": params["bert"]}, changed, mask, changed_seg)
  valid = mask.astype(bool)
  np.testing.assert_allclose(a["sequence_output"][valid], b["sequence_output"][valid], atol=1e-5)
  np.testing.assert_allclose(a["pooled_output"], b["pooled_output"], atol=1e-5)
  # The pad tokens themselves do change (a check that `changed` really differs).
  assert not np.allclose(a["sequence_output"][~valid], b["sequence_output"][~valid])


def test_explicit_attention_matches_dot_product_attention():
  # The xla backend's dropout path (einsum and softmax spelt out, bert_jax/layers/attention.py) equals
  # the fused call when nothing is dropped (keep probability 1 - 1e-9 = 1.0 in float32).
  from bert_jax.layers import attention as attention_lib
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 6, 3, 8)), jnp.float32) for _ in range(3))
  ids = jnp.asarray(np.arange(6)[None] < np.array([6, 2])[:, None], jnp.int32)
  spelt = attention_lib.xla_attention(q, k, v, ids, packed=False, dropout_rate=1e-9,
                                      dropout_rng=jax.random.key(0))
  np.testing.assert_allclose(spelt, jax.nn.dot_product_attention(
      q, k, v, mask=ids.astype(bool)[:, None, None, :]), atol=1e-6)


def test_attention_dropout_path_matches_fused_path_without_drops():
  # A rate so small no element is ever dropped (keep prob rounds to 1.0 in float32) runs the
  # explicit einsum/softmax/dropout path; it must match the dot_product_attention path.
  config = model_lib.get_bert_config("tiny", vocab_size=99, hidden_dropout_prob=0.0,
                                     attention_dropout_prob=1e-9)
  params = _init(config)
  ids, mask, seg, pos = _batch()
  model = pretraining_heads.BertForPreTraining(config)
  fused = model.apply({"params": params}, ids, mask, seg, pos, deterministic=True)
  explicit = model.apply({"params": params}, ids, mask, seg, pos, deterministic=False,
                         rngs={"dropout": jax.random.key(3)})
  for a, b in zip(fused, explicit):
    np.testing.assert_allclose(a, b, atol=1e-4)


def test_dropout_depends_on_rng():
  params = _init(TINY)
  ids, mask, seg, pos = _batch()
  model = pretraining_heads.BertForPreTraining(TINY)
  run = lambda seed: model.apply({"params": params}, ids, mask, seg, pos, deterministic=False,
                                 rngs={"dropout": jax.random.key(seed)})[0]
  np.testing.assert_array_equal(run(1), run(1))
  assert not np.allclose(run(1), run(2))
  assert not np.allclose(run(1), model.apply({"params": params}, ids, mask, seg, pos)[0])


def test_remat_same_output_and_grads():
  # With dropout on (deterministic=False, a static argument of the rematerialised layer) and the
  # same rng, remat must reproduce the loss and the gradients.
  # One layer keeps the two jit compilations short; remat wraps each layer the same way.
  plain = model_lib.get_bert_config("tiny", vocab_size=99, max_position_embeddings=32,
                                    num_layers=1)
  rematted = dataclasses.replace(plain, remat=True)
  params = nn.meta.unbox(_init(plain))
  ids, mask, seg, pos = _batch()

  def loss(p, config):
    mlm, nsp = pretraining_heads.BertForPreTraining(config).apply(
        {"params": p}, ids, mask, seg, pos, deterministic=False,
        rngs={"dropout": jax.random.key(0)})
    return (mlm ** 2).mean() + nsp.sum()

  l1, g1 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, plain)
  l2, g2 = jax.jit(jax.value_and_grad(loss), static_argnums=1)(params, rematted)
  np.testing.assert_allclose(l1, l2, rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), g1, g2)


def test_bfloat16_compute_float32_params_and_logits():
  config = model_lib.get_bert_config("tiny", vocab_size=99, max_position_embeddings=32,
                                     dtype="bfloat16")
  params = _init(config)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nn.meta.unbox(params)))
  ids, mask, seg, pos = _batch()
  mlm16, nsp16 = pretraining_heads.BertForPreTraining(config).apply({"params": params}, ids, mask,
                                                                     seg, pos)
  mlm32, nsp32 = pretraining_heads.BertForPreTraining(TINY).apply({"params": params}, ids, mask,
                                                                   seg, pos)
  assert mlm16.dtype == jnp.float32 and nsp16.dtype == jnp.float32
  # bf16 has an 8-bit mantissa: logits of this size agree to a few 1e-2.
  np.testing.assert_allclose(mlm16, mlm32, atol=0.1)
  assert not np.array_equal(mlm16, mlm32)  # the bf16 path really ran
  seq = model_lib.BertModel(config).apply({"params": params["bert"]}, ids, mask, seg)
  assert seq["sequence_output"].dtype == jnp.bfloat16


def test_every_param_has_logical_axis_names():
  params = _init(TINY)
  leaves = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
  assert leaves and all(isinstance(x, nn.LogicallyPartitioned) for x in leaves)
  for x in leaves:
    assert len(x.names) == x.value.ndim and all(x.names), x.names
  specs = nn.get_partition_spec(params)
  assert specs["bert"]["encoder"]["layer_0"]["attention"]["query"]["kernel"] == \
      jax.sharding.PartitionSpec("embed", "heads", "kv")
  assert specs["mlm_head"]["output_bias"] == jax.sharding.PartitionSpec("vocab")


def test_initialisation_like_google_bert():
  params = nn.meta.unbox(_init(model_lib.get_bert_config("tiny")))
  words = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"])
  # Truncated at 2 stddev; the std of a N(0, 0.02) cut at +-2 sigma is 0.02 * 0.880.
  assert np.abs(words).max() <= 0.04 + 1e-6
  np.testing.assert_allclose(words.std(), 0.02 * 0.8796, rtol=0.02)
  layer = params["bert"]["encoder"]["layer_0"]
  np.testing.assert_array_equal(layer["attention_layer_norm"]["scale"], 1.0)
  np.testing.assert_array_equal(layer["attention_layer_norm"]["bias"], 0.0)
  np.testing.assert_array_equal(layer["intermediate"]["bias"], 0.0)
  np.testing.assert_array_equal(params["mlm_head"]["output_bias"], 0.0)


def _abstract_count(config, model_cls=None):
  shapes = jax.eval_shape(lambda: pretraining_heads.init_params(config, jax.random.key(0),
                                                        model_cls=model_cls))
  return model_lib.count_params(shapes)


def test_param_counts_of_presets():
  base = model_lib.get_bert_config("base")
  # google-research/bert BERT-base: 110.1M with the pre-training heads, 109.48M without.
  assert _abstract_count(base) == 110_106_428
  assert _abstract_count(base, model_lib.BertModel) == 109_482_240
  assert abs(_abstract_count(model_lib.get_bert_config("large")) - 335e6) < 1.5e6


@pytest.mark.parametrize("name", ["tiny", "L-4_H-256", "base", "large"])
def test_param_counts_match_transformers(name):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = model_lib.get_bert_config(name)
  hf_config = transformers.BertConfig(
      vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_hidden_layers=c.num_layers,
      num_attention_heads=c.num_heads, intermediate_size=c.intermediate_size,
      max_position_embeddings=c.max_position_embeddings, type_vocab_size=c.type_vocab_size)
  with torch.device("meta"):  # shapes only: no memory for the 335M large model
    hf = transformers.BertForPreTraining(hf_config)
  hf_count = sum(p.numel() for p in hf.parameters())  # tied decoder weight/bias counted once
  assert _abstract_count(c) == hf_count


def test_config_round_trip_and_errors():
  c = model_lib.get_bert_config("L-6_H-512", dtype="bfloat16")
  assert (c.num_layers, c.hidden_size, c.num_heads, c.intermediate_size) == (6, 512, 8, 2048)
  assert model_lib.BertConfig.from_dict(c.to_dict()) == c
  with pytest.raises(ValueError, match="unknown keys \\['hidden_layers'\\]"):
    model_lib.BertConfig.from_dict({"hidden_layers": 3})
  with pytest.raises(ValueError, match="Unknown BERT model 'huge'.*L-12_H-768"):
    model_lib.get_bert_config("huge")
  with pytest.raises(ValueError, match="not divisible"):
    model_lib.BertConfig(hidden_size=100, num_heads=3)
  with pytest.raises(ValueError, match="hidden_act"):
    model_lib.BertConfig(hidden_act="swish")
  assert len([n for n in model_lib.PRESETS if n.startswith("L-")]) == 24


# ----------------------------------------------------------------------------------------------
# Packed rows (data_pipelines/records/packing.py): equivalence with the same instances unpacked.
# ----------------------------------------------------------------------------------------------
def _instances(lengths, seq=32, num_pred=3, vocab=99, seed=0):
  """Unpacked, masked instances [CLS] a [SEP] b [SEP] as the input pipeline yields them."""
  rng = np.random.default_rng(seed)
  n = len(lengths)
  f = {k: np.zeros((n, seq), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  f.update({k: np.zeros((n, num_pred), np.int32) for k in ("masked_lm_positions",
                                                           "masked_lm_ids")})
  f["masked_lm_weights"] = np.zeros((n, num_pred), np.float32)
  for i, length in enumerate(lengths):
    a = length // 2
    f["input_ids"][i, :length] = rng.integers(5, vocab, length)
    f["input_ids"][i, [0, a, length - 1]] = [2, 3, 3]
    f["input_mask"][i, :length] = 1
    f["segment_ids"][i, a + 1:length] = 1
    k = min(num_pred, max(1, length // 5))
    pos = np.sort(rng.choice(np.arange(1, a), min(k, a - 1), replace=False))
    f["masked_lm_positions"][i, :len(pos)] = pos
    f["masked_lm_ids"][i, :len(pos)] = f["input_ids"][i, pos]
    f["masked_lm_weights"][i, :len(pos)] = 1.0
    f["input_ids"][i, pos] = 4  # [MASK]
  f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int32)
  return f


def _packed(f, max_instances=4, max_preds=8):
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  return packing.pack_arrays(f, 0, max_instances=max_instances, max_preds=max_preds,
                             count_preds=True)


@functools.partial(jax.jit, static_argnums=2)
def _forward(params, batch, config=TINY):
  return pretraining_heads.BertForPreTraining(config).apply(
      {"params": params}, batch, True, method=pretraining_heads.pretraining_forward)


def test_packed_rows_give_each_instance_its_unpacked_logits():
  params = _init(TINY)
  f = _instances([20, 9, 12, 6, 30, 7])
  p = _packed(f)
  assert p["input_ids"].shape[0] < 6  # several instances share rows
  mlm_u, nsp_u = _forward(params, f)
  mlm_p, nsp_p = _forward(params, p)
  assert nsp_p.shape == (p["input_ids"].shape[0], 4, 2)
  # Map every packed NSP slot and prediction back to its instance by its [CLS] position.
  for r in range(p["input_ids"].shape[0]):
    for k in np.flatnonzero(p["nsp_weights"][r]):
      start = p["cls_positions"][r, k]
      length = int(np.sum(p["instance_ids"][r] == k + 1))
      tokens = p["input_ids"][r, start:start + length]
      (i,) = [i for i in range(6) if f["input_mask"][i].sum() == length
              and np.array_equal(f["input_ids"][i, :length], tokens)]
      assert p["next_sentence_labels"][r, k] == f["next_sentence_labels"][i]
      np.testing.assert_allclose(nsp_p[r, k], nsp_u[i], rtol=1e-5, atol=1e-5)
      in_row = np.flatnonzero((p["masked_lm_weights"][r] > 0)
                              & (p["masked_lm_positions"][r] >= start)
                              & (p["masked_lm_positions"][r] < start + length))
      n = int(f["masked_lm_weights"][i].sum())
      assert len(in_row) == n
      np.testing.assert_array_equal(p["masked_lm_positions"][r, in_row] - start,
                                    f["masked_lm_positions"][i, :n])
      np.testing.assert_allclose(mlm_p[r, in_row], mlm_u[i, :n], rtol=1e-5, atol=1e-5)


def test_packed_loss_and_gradients_equal_unpacked():
  config = dataclasses.replace(TINY, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  params = nn.unbox(_init(config))
  f = _instances([20, 9, 12, 6, 30, 7], seed=1)
  p = _packed(f)

  def loss(params, batch):
    return objectives.pretraining_loss(_forward(params, batch, config), batch)

  grad_fn = jax.jit(jax.value_and_grad(loss, has_aux=True))
  (lu, mu), gu = grad_fn(params, f)
  (lp, mp), gp = grad_fn(params, p)
  for k in ("mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy"):
    np.testing.assert_allclose(mp[k], mu[k], rtol=1e-5, err_msg=k)
  np.testing.assert_allclose(lp, lu, rtol=1e-5)
  # Relative to the gradient's scale: some leaves (the key biases) are 0 up to rounding (1e-12).
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(gu))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(gp), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale, err_msg=str(path))


def test_instances_in_a_row_cannot_see_each_other():
  params = _init(TINY)
  p = _packed(_instances([10, 8, 9]), max_instances=4)
  assert p["input_ids"].shape[0] == 1 and p["nsp_weights"][0].sum() == 3
  changed = dict(p)
  target = p["instance_ids"] == 2
  changed["input_ids"] = np.where(target, (p["input_ids"] * 7 + 3) % 90 + 5, p["input_ids"])
  changed["segment_ids"] = np.where(target, 1 - p["segment_ids"], p["segment_ids"])
  model = model_lib.BertModel(TINY)
  args = lambda b: (b["input_ids"], b["input_mask"], b["segment_ids"])  # noqa: E731
  kw = dict(instance_ids=p["instance_ids"], position_ids=p["position_ids"],
            cls_positions=p["cls_positions"])
  apply = jax.jit(model.apply)
  a = apply({"params": params["bert"]}, *args(p), **kw)
  b = apply({"params": params["bert"]}, *args(changed), **kw)
  others = (p["instance_ids"] > 0) & ~target
  np.testing.assert_array_equal(a["sequence_output"][others], b["sequence_output"][others])
  np.testing.assert_array_equal(a["pooled_output"][0, [0, 2]], b["pooled_output"][0, [0, 2]])
  assert not np.allclose(a["sequence_output"][target], b["sequence_output"][target])
  assert not np.allclose(a["pooled_output"][0, 1], b["pooled_output"][0, 1])


def test_attention_mask_forms():
  ids = np.array([[1, 1, 2, 2, 0]])
  np.testing.assert_array_equal(model_lib.attention_mask(ids > 0, False)[0, 0, 0],
                                [True] * 4 + [False])
  block = np.asarray(model_lib.attention_mask(ids, True))[0, 0]
  np.testing.assert_array_equal(block[0], [1, 1, 0, 0, 0])
  np.testing.assert_array_equal(block[3], [0, 0, 1, 1, 0])
  assert not block[4].any()


# ----------------------------------------------------------------------------------------------
# The family: ALBERT (factorised embeddings, shared layers, SOP) and SpanBERT (SBO) presets.
# ----------------------------------------------------------------------------------------------
ALBERT_TINY = model_lib.get_bert_config("albert-tiny", vocab_size=99, max_position_embeddings=32)


def _hf_albert(c, transformers):
  return transformers.AlbertConfig(
      vocab_size=c.vocab_size, embedding_size=c.embedding_size, hidden_size=c.hidden_size,
      num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
      intermediate_size=c.intermediate_size, max_position_embeddings=c.max_position_embeddings,
      type_vocab_size=c.type_vocab_size)


# AlbertModel parameters at the paper's 30k vocab, from transformers 5.23 (the test below
# rebuilds them). The paper's Table 1 rounds: base 12M, large 18M, xlarge 60M, xxlarge 235M.
ALBERT_COUNTS = {"albert-base": 11_683_584, "albert-large": 17_683_968,
                 "albert-xlarge": 58_724_864, "albert-xxlarge": 222_595_584}
# Lan et al. 2019, Table 1, and the signed gap of our (= transformers') count to it, in percent.
ALBERT_PAPER = {"albert-base": (12e6, -2.6), "albert-large": (18e6, -1.8),
                "albert-xlarge": (60e6, -2.1), "albert-xxlarge": (235e6, -5.3)}


def _albert_closed_form(h, v=30_000, e=128, p=512):
  """AlbertModel's parameters at hidden size h (intermediate 4h, one shared layer):
  embeddings V*E + P*E + 2*E + LayerNorm 2E, projection E*H + H, the layer's q/k/v/o
  4(H^2 + H) + LayerNorm 2H + FFN 2*H*I + I + H + LayerNorm 2H, the pooler H^2 + H."""
  i = 4 * h
  return (v * e + p * e + 4 * e) + (e * h + h) + (4 * (h * h + h) + 2 * h + 2 * h * i + i + 3 * h
                                                  ) + (h * h + h)


@pytest.mark.parametrize("name", ["albert-tiny", "albert-base", "albert-large", "albert-xlarge",
                                  "albert-xxlarge"])
def test_albert_param_counts_match_transformers_and_the_paper(name):
  """What is checked, exactly: (1) our encoder and pre-training model have transformers'
  AlbertModel / AlbertForPreTraining counts for the same config (the released
  albert_config.json values), (2) the encoder equals the closed form above, and (3) for the
  paper's four sizes the count and its signed gap to Table 1: base 11.68M and large 17.68M are
  12M and 18M to two significant figures, xlarge 58.72M is 60M to one, and xxlarge 222.60M is
  5.3% below the table's 235M, a gap we could not account for (docs/models.md, "Parameter
  counts")."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = model_lib.get_bert_config(name, vocab_size=30000)
  with torch.device("meta"):
    hf = transformers.AlbertForPreTraining(_hf_albert(c, transformers))
  assert _abstract_count(c) == sum(p.numel() for p in hf.parameters())   # tied decoder once
  assert _abstract_count(c, model_lib.BertModel) == sum(p.numel() for p in hf.albert.parameters())
  assert _abstract_count(c, model_lib.BertModel) == _albert_closed_form(c.hidden_size)
  if name in ALBERT_COUNTS:
    count = _abstract_count(c, model_lib.BertModel)
    assert count == ALBERT_COUNTS[name]
    paper, gap_percent = ALBERT_PAPER[name]
    assert round(100 * (count / paper - 1), 1) == gap_percent


def _param_paths(config):
  return sorted("/".join(str(k.key) for k in path) for path, _ in
                jax.tree_util.tree_leaves_with_path(nn.meta.unbox(_init(config))))


@pytest.mark.parametrize("share,expected,count_layers", [
    ("all", {"layer_shared"}, 1), ("attention", {"shared_attention", "layer_0", "layer_1"}, 2),
    ("ffn", {"shared_ffn", "layer_0", "layer_1"}, 2), ("none", {"layer_0", "layer_1"}, 2)])
def test_albert_layer_sharing(share, expected, count_layers):
  c = dataclasses.replace(ALBERT_TINY, share_layers=share)
  paths = _param_paths(c)
  assert {p.split("/")[2] for p in paths if p.startswith("bert/encoder/")} == expected
  # One shared layer = the params of one layer; 'none' = num_layers of them.
  per_layer = 4 * (128 * 128 + 128) + 2 * 128 + 2 * 128 * 512 + 512 + 128 + 2 * 128
  encoder = sum(np.size(x) for x in jax.tree.leaves(nn.meta.unbox(_init(c))["bert"]["encoder"]))
  if share in ("all", "none"):
    assert encoder == count_layers * per_layer
  # The shared encoder runs num_layers times.
  params = nn.meta.unbox(_init(c))
  ids, mask, seg, _ = _batch(vocab=99)
  out = model_lib.BertModel(c).apply({"params": params["bert"]}, ids, mask, seg,
                                     output_hidden_states=True)
  assert out["sequence_output"].shape == (2, 12, 128)
  assert len(out["hidden_states"]) == c.num_layers + 1


def test_albert_factorised_embeddings_and_mlm_head_shapes():
  params = nn.meta.unbox(_init(ALBERT_TINY))
  emb = params["bert"]["embeddings"]
  assert emb["word_embeddings"]["embedding"].shape == (99, 128)
  assert emb["projection"]["kernel"].shape == (128, 128)
  c = dataclasses.replace(ALBERT_TINY, embedding_size=16)
  params = nn.meta.unbox(_init(c))
  emb = params["bert"]["embeddings"]
  assert emb["word_embeddings"]["embedding"].shape == (99, 16)
  assert emb["layer_norm"]["scale"].shape == (16,)
  assert emb["projection"]["kernel"].shape == (16, 128)
  assert params["mlm_head"]["transform"]["kernel"].shape == (128, 16)
  assert "sop_head" in params and "nsp_head" not in params
  ids, mask, seg, pos = _batch()
  mlm, sop = pretraining_heads.BertForPreTraining(c).apply({"params": params}, ids, mask, seg, pos)
  assert mlm.shape == (2, 3, 99) and sop.shape == (2, 2)


def test_spanbert_sbo_head_reads_the_span_boundaries():
  c = model_lib.get_bert_config("spanbert-tiny", vocab_size=99, max_position_embeddings=32)
  params = nn.meta.unbox(_init(c))
  assert "sbo_head" in params and "nsp_head" not in params
  ids, mask, seg, pos = _batch()
  batch = dict(input_ids=ids, input_mask=mask, segment_ids=seg, masked_lm_positions=pos,
               masked_lm_span_left=np.maximum(pos - 1, 0), masked_lm_span_right=pos + 1)
  apply = lambda b: pretraining_heads.BertForPreTraining(c).apply(  # noqa: E731
      {"params": params}, b, True, method=pretraining_heads.pretraining_outputs)
  out = apply(batch)
  assert set(out) == {"mlm", "sbo"} and out["sbo"].shape == (2, 3, 99)
  moved = dict(batch, masked_lm_span_right=np.minimum(pos + 2, 6))
  assert not np.allclose(apply(moved)["sbo"], out["sbo"])
  np.testing.assert_array_equal(apply(moved)["mlm"], out["mlm"])   # MLM does not read them
  mlm, sentence = pretraining_heads.BertForPreTraining(c).apply(
      {"params": params}, ids, mask, seg, pos, span_left=batch["masked_lm_span_left"],
      span_right=batch["masked_lm_span_right"])
  assert sentence is None and mlm.shape == (2, 3, 99)
  with pytest.raises(ValueError, match="no masked_lm_span_left/right"):   # never made-up spans
    pretraining_heads.BertForPreTraining(c).apply({"params": params}, ids, mask, seg, pos,
                                          return_dict=True)
  # The tuple form (fill-mask) needs no boundaries: MLM logits alone, the same.
  mlm_only, _ = pretraining_heads.BertForPreTraining(c).apply({"params": params}, ids, mask, seg,
                                                              pos)
  np.testing.assert_array_equal(mlm_only, mlm)


def test_family_fields_keep_bert_configs_unchanged_and_validate():
  # A BERT checkpoint's stored config (written before the family fields) still compares equal.
  assert set(TINY.to_dict()) & set(model_lib.FAMILY_FIELDS) == set()
  a = model_lib.get_bert_config("albert-base")
  assert a.to_dict()["share_layers"] == "all" and model_lib.BertConfig.from_dict(a.to_dict()) == a
  assert model_lib.get_bert_config("spanbert").objective_list == ("mlm", "sbo")
  with pytest.raises(ValueError, match="objectives='mlm,nsp,sop'"):
    model_lib.BertConfig(objectives="mlm,nsp,sop")
  with pytest.raises(ValueError, match="objectives='nsp'"):
    model_lib.BertConfig(objectives="nsp")
  with pytest.raises(ValueError, match="set family='albert'"):
    model_lib.BertConfig(share_layers="all")
  with pytest.raises(ValueError, match="share_layers='some'"):
    model_lib.BertConfig(family="albert", share_layers="some")
  # The BERT parameter tree is unchanged by the family code (names the converters rely on).
  paths = _param_paths(TINY)
  assert "bert/encoder/layer_1/attention/query/kernel" in paths
  assert "bert/encoder/layer_0/output_layer_norm/scale" in paths
  assert "nsp_head/kernel" in paths and not any("projection" in p for p in paths)


@pytest.mark.parametrize("share", ["all", "attention", "ffn"])
def test_albert_sharing_with_remat_gives_the_same_outputs_and_gradients(share):
  c = dataclasses.replace(ALBERT_TINY, share_layers=share, hidden_dropout_prob=0.0,
                          attention_dropout_prob=0.0)
  params = nn.meta.unbox(_init(c))
  ids, mask, seg, pos = _batch()

  def loss(p, config):
    mlm, sop = pretraining_heads.BertForPreTraining(config).apply({"params": p}, ids, mask, seg,
                                                                  pos)
    return jnp.sum(mlm[..., 7]) + jnp.sum(sop)

  a, ga = jax.value_and_grad(loss)(params, c)
  b, gb = jax.value_and_grad(loss)(params, dataclasses.replace(c, remat=True))
  np.testing.assert_allclose(a, b, rtol=1e-5)
  for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb)):
    np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)


def test_packed_rows_tell_attention_how_many_instances_a_row_holds(monkeypatch):
  """cuDNN's packed attention sizes its bookkeeping by the instances per row it is told of
  (attention.py _cudnn_packed): the model passes K, the width of cls_positions, not T."""
  from bert_jax.layers import attention
  seen = []
  real = attention.dot_product_attention

  def spy(q, k, v, ids, *, packed, **kw):
    seen.append(packed)
    return real(q, k, v, ids, packed=packed, **kw)

  monkeypatch.setattr(attention, "dot_product_attention", spy)
  params = _init(TINY)
  p = _packed(_instances([20, 9, 12, 6, 30, 7]))
  pretraining_heads.BertForPreTraining(TINY).apply({"params": params}, p, True,
                                           method=pretraining_heads.pretraining_forward)
  assert seen and set(seen) == {p["cls_positions"].shape[1]} == {4}
  seen.clear()
  f = _instances([20, 9])
  pretraining_heads.BertForPreTraining(TINY).apply({"params": params}, f, True,
                                           method=pretraining_heads.pretraining_forward)
  assert set(seen) == {False}


def _head_value_and_grads(x, w, cot):
  f = lambda x, w: jnp.sum(pretraining_heads._vocab_matmul(x, w) * cot)
  return jax.value_and_grad(f, argnums=(0, 1))(x, w), pretraining_heads._vocab_matmul(x, w)


def test_mlm_head_levers_keep_the_logits_and_gradients(monkeypatch):
  """Issue 29's head knobs (off by default): the vocab padded to 128 inside the matmul gives the
  same logits and gradients exactly (V = 1,000 -> 1,024, sliced back); the bf16 backward keeps
  the float32 forward and rounds only the cotangent, so its gradients equal float32's within
  bf16's 2^-8 relative step."""
  rng = np.random.default_rng(0)
  x = jnp.asarray(rng.normal(size=(2, 5, 16)), jnp.bfloat16)
  w = jnp.asarray(rng.normal(size=(1000, 16)), jnp.bfloat16)
  cot = jnp.asarray(rng.normal(size=(2, 5, 1000)) * 0.01, jnp.float32)
  (ref, ref_g), ref_logits = _head_value_and_grads(x, w, cot)
  monkeypatch.setattr(pretraining_heads, "VOCAB_PAD", 128)
  (val, g), logits = _head_value_and_grads(x, w, cot)
  assert logits.shape == (2, 5, 1000) and logits.dtype == jnp.float32
  np.testing.assert_array_equal(logits, ref_logits)
  for a, b in zip(g, ref_g):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=1e-6,
                               atol=1e-6)
  monkeypatch.setattr(pretraining_heads, "HEAD_BF16_BACKWARD", True)
  (val, g), logits = _head_value_and_grads(x, w, cot)
  np.testing.assert_array_equal(logits, ref_logits)
  for a, b in zip(g, ref_g):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert np.max(np.abs(a - b)) <= 2 ** -7 * np.max(np.abs(b))
    assert not np.array_equal(a, b)          # the cotangent really was rounded


def test_a_name_moved_to_pretraining_heads_is_an_error_naming_its_new_home():
  """The pre-training heads, BertForPreTraining and init_params moved to pretraining_heads.py,
  which imports model.py: model.py cannot import it back (tests/layers_test.py, no cycle), so
  an old `model.BertForPreTraining` fails and says where the name went, as do the head's knobs
  (setting model.VOCAB_PAD would otherwise silently change nothing)."""
  for name in ("MaskedLMHead", "SpanBoundaryHead", "BertForPreTraining",
               "pretraining_outputs", "pretraining_forward", "init_params", "VOCAB_PAD",
               "HEAD_BF16_BACKWARD"):
    assert hasattr(pretraining_heads, name), name
    with pytest.raises(AttributeError, match=rf"model\.{name} moved to bert_jax\.models\."
                                             rf"pretraining_heads\.{name}"):
      getattr(model_lib, name)
  # The loss went on to objectives.py (it imports the heads; the heads cannot import it back).
  assert hasattr(objectives, "pretraining_loss")
  for module in (model_lib, pretraining_heads):
    with pytest.raises(AttributeError, match=r"pretraining_loss moved to "
                                             r"bert_jax\.objectives\.pretraining\.pretraining_loss"):
      getattr(module, "pretraining_loss")
  assert model_lib.gather_positions is pretraining_heads.gather_positions   # the encoder's own
