"""Tests for bert_jax/objectives/pretraining.py: the pre-training loss composed from its parts."""

import jax
import numpy as np
import optax
import pytest

from bert_jax.objectives import pretraining as objectives


def _batch(rng, b=3, p=4, v=11):
  w = (rng.random((b, p)) < 0.7).astype(np.float32)
  return dict(masked_lm_ids=rng.integers(0, v, (b, p)).astype(np.int32), masked_lm_weights=w,
              next_sentence_labels=rng.integers(0, 2, b).astype(np.int32))


def test_bert_loss_is_google_research_berts_mlm_plus_nsp():
  rng = np.random.default_rng(0)
  batch = _batch(rng)
  mlm, nsp = rng.normal(size=(3, 4, 11)), rng.normal(size=(3, 2))
  loss, m = objectives.pretraining_loss({"mlm": mlm, "nsp": nsp}, batch)
  w = batch["masked_lm_weights"]
  ce = optax.softmax_cross_entropy_with_integer_labels(mlm, batch["masked_lm_ids"])
  mlm_loss = np.sum(ce * w) / (np.sum(w) + 1e-5)
  nsp_loss = np.mean(-jax.nn.log_softmax(nsp)[np.arange(3), batch["next_sentence_labels"]])
  np.testing.assert_allclose(loss, mlm_loss + nsp_loss, rtol=1e-6)
  np.testing.assert_allclose(m["mlm_loss"], mlm_loss, rtol=1e-6)
  np.testing.assert_allclose(m["nsp_accuracy"], np.mean(
      np.argmax(nsp, -1) == batch["next_sentence_labels"]))
  assert set(m) == {"loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"}


def test_parts_are_named_by_objective_and_weighted():
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  out = {"mlm": rng.normal(size=(3, 4, 11)), "sop": rng.normal(size=(3, 2)),
         "sbo": rng.normal(size=(3, 4, 11))}
  loss, m = objectives.pretraining_loss(out, batch)
  assert {"sop_loss", "sop_accuracy", "sbo_loss", "sbo_accuracy"} <= set(m)
  assert "nsp_loss" not in m
  np.testing.assert_allclose(loss, m["mlm_loss"] + m["sop_loss"] + m["sbo_loss"], rtol=1e-6)
  weighted, _ = objectives.pretraining_loss(out, batch, weights={"sbo": 0.5})
  np.testing.assert_allclose(weighted, m["mlm_loss"] + m["sop_loss"] + 0.5 * m["sbo_loss"],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="no part for outputs \\['dae'\\]"):
    objectives.pretraining_loss({"dae": out["mlm"]}, batch)


def test_packed_sentence_loss_is_a_mean_over_instances():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 3, 2))
  labels = rng.integers(0, 2, (2, 3)).astype(np.int32)
  w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  _, m = objectives.sentence("sop", logits, dict(next_sentence_labels=labels, nsp_weights=w))
  ce = -jax.nn.log_softmax(logits)[np.arange(2)[:, None], np.arange(3)[None], labels]
  np.testing.assert_allclose(m["sop_loss"], np.sum(ce * w) / 3, rtol=1e-6)


# ----------------------------------------------------------------------------------------------
# The chunked MLM loss (config.model.mlm_loss_chunk; issue 42 item 4).
# ----------------------------------------------------------------------------------------------
def _head_pieces(rng, b=3, p=7, e=16, v=53):
  x = rng.normal(size=(b, p, e)).astype(np.float32)
  w = (0.3 * rng.normal(size=(v, e))).astype(np.float32)
  bias = (0.1 * rng.normal(size=v)).astype(np.float32)
  return x, w, bias


@pytest.mark.parametrize("chunk", [1, 3, 7, 10])   # 7 = P (one chunk); 3, 10: P padded
def test_chunked_mlm_loss_and_gradients_equal_the_plain_ones(chunk):
  from bert_jax.models import pretraining_heads
  rng = np.random.default_rng(3)
  x, w, bias = _head_pieces(rng)
  batch = _batch(rng, b=3, p=7, v=53)

  def plain(x, w, bias):
    logits = jax.numpy.einsum("BPE,VE->BPV", x, w) + bias
    return objectives.masked_lm("mlm", logits, batch)

  def chunked(x, w, bias):
    return objectives.masked_lm("mlm", pretraining_heads.mlm_chunks(x, w, bias, chunk), batch)

  (want, want_m), want_g = jax.value_and_grad(plain, (0, 1, 2), has_aux=True)(x, w, bias)
  (got, got_m), got_g = jax.value_and_grad(chunked, (0, 1, 2), has_aux=True)(x, w, bias)
  np.testing.assert_allclose(got, want, rtol=1e-6)
  assert got_m["mlm_accuracy"] == want_m["mlm_accuracy"]
  for g, h in zip(got_g, want_g):
    np.testing.assert_allclose(g, h, rtol=1e-5, atol=1e-7)


def test_chunked_mlm_loss_backward_keeps_one_chunk_of_logits():
  """The backward remakes each chunk's logits (jax.checkpoint in the scan): the compiled
  gradient's temporaries are a fraction of the plain loss's, whose [B, P, V] float32 logits
  (2 x 256 x 16,384 x 4 B = 32 MiB) and their cotangent it holds; chunked: a chunk's logits
  (1 MiB) and the decoder's gradient [V, E] (1 MiB) it accumulates. Without the checkpoint the
  scan would store every chunk's logits for the backward and this would fail."""
  from bert_jax.models import pretraining_heads
  rng = np.random.default_rng(4)
  x, w, bias = _head_pieces(rng, b=2, p=256, e=16, v=16_384)
  batch = _batch(rng, b=2, p=256, v=16_384)

  def temp_bytes(make):
    f = jax.jit(jax.grad(lambda x, w, b: objectives.masked_lm("mlm", make(x, w, b), batch)[0],
                         (0, 1, 2)))
    return f.lower(x, w, bias).compile().memory_analysis().temp_size_in_bytes

  plain = temp_bytes(lambda x, w, b: jax.numpy.einsum("BPE,VE->BPV", x, w) + b)
  chunked = temp_bytes(lambda x, w, b: pretraining_heads.mlm_chunks(x, w, b, 8))
  logits_bytes = 2 * 256 * 16_384 * 4
  assert plain >= logits_bytes, plain
  assert chunked < logits_bytes / 4, (chunked, plain)


@pytest.mark.slow   # compiles two tiny models' gradients (a few seconds each on 2 cores)
@pytest.mark.parametrize("preset", ["tiny", "modernbert-tiny"])
def test_chunked_mlm_loss_on_a_tiny_model_equals_the_plain_loss(preset):
  """The whole step's loss and every parameter's gradient, float32, mlm_loss_chunk 0 vs 3
  (P = 8: chunks of 3, 3, 2 and a padded one), on the trainer's forward and loss."""
  from flax import linen as nn
  from bert_jax import train
  from bert_jax.training import input_source
  from bert_jax.models import model as model_lib
  from bert_jax.models import pretraining_heads
  base = dict(vocab_size=97, hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2,
              max_position_embeddings=32, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  batch = next(input_source.synthetic_batches(batch_size=2, seq_length=16,
                                              max_predictions_per_seq=8, vocab_size=97, seed=0))
  results = []
  for chunk in (0, 3):
    cfg = model_lib.get_bert_config(preset, **base, mlm_loss_chunk=chunk)
    module = pretraining_heads.BertForPreTraining(cfg)
    params = nn.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))

    def loss(p, module=module):
      out = module.apply({"params": p}, batch, True, method=pretraining_heads.pretraining_outputs)
      return train.pretraining_loss(out, batch)

    (value, metrics), grads = jax.value_and_grad(loss, has_aux=True)(params)
    assert isinstance(module.apply({"params": params}, batch, True, method=(
        pretraining_heads.pretraining_outputs))["mlm"], dict) == bool(chunk)
    results.append((value, metrics, grads))
  (v0, m0, g0), (v1, m1, g1) = results
  np.testing.assert_allclose(v1, v0, rtol=1e-6)
  assert m1["mlm_accuracy"] == m0["mlm_accuracy"]
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_mlm_loss_chunk_is_how_the_step_runs_not_what_the_model_is():
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("tiny", mlm_loss_chunk=128)
  assert "mlm_loss_chunk" not in cfg.to_dict()   # checkpoints compare equal with it on or off
  with pytest.raises(ValueError, match="mlm_loss_chunk=-1"):
    model_lib.get_bert_config("tiny", mlm_loss_chunk=-1)


@pytest.mark.parametrize("preset", ["electra-tiny", "distilbert-tiny"])
def test_mlm_loss_chunk_is_refused_where_the_step_reads_the_logits(preset):
  """ELECTRA samples its replacements from the generator's logits and DistilBERT compares the
  student's with the teacher's: a chunked loss there would be silently off (train, plan)."""
  from bert_jax import train
  from bert_jax.models import model as model_lib
  from bert_jax.configs import pretrain
  config = pretrain.get_config(preset)
  model_config = model_lib.get_bert_config(preset, mlm_loss_chunk=8)
  with pytest.raises(train.ConfigError, match="mlm_loss_chunk=8: .* set it to 0"):
    train.check_objectives(config, model_config)
  train.check_objectives(config, model_lib.get_bert_config(preset))
  train.check_objectives(pretrain.get_config("modernbert-tiny"),
                         model_lib.get_bert_config("modernbert-tiny", mlm_loss_chunk=8))
