"""BERT's pre-training heads on model.py's encoder, and BertForPreTraining, which composes them.

  MaskedLMHead      mlm  dense + act + LayerNorm, then logits against the tied word table
  (a dense(2))      nsp / sop  on the pooled [CLS] (BertForPreTraining's {sentence}_head)
  SpanBoundaryHead  sbo  SpanBERT's span-boundary objective
then BertForPreTraining's forward on a batch dict (pretraining_outputs / pretraining_forward, the
trainer's) and google-research/bert's MLM + NSP loss (pretraining_loss; the composed,
objective-aware loss is objectives.py). model.py keeps the encoder (embeddings, attention,
feed-forward, layers, BertModel); `model.BertForPreTraining` and the other names here still
resolve there (model.__getattr__).

Einsum letters as model.py's: B batch, T position, P masked position, H hidden, E embedding
width (= H; ALBERT's E = 128), V vocabulary; K instances of a packed row (their [CLS]).

Parameter tree of BertForPreTraining beside bert/ (BertModel's, model.py's docstring):
  mlm_head/{transform/{kernel,bias}, transform_layer_norm, output_bias}    (decoder tied to
           bert/embeddings/word_embeddings; NeoBERT: mlm_head/{decoder [V, H], output_bias},
           the mlm_transform / tie_word_embeddings fields)
  nsp_head/{kernel,bias}   (ALBERT: sop_head)
  sbo_head/{position_embeddings, dense_1, layer_norm_1, dense_2, layer_norm_2, output_bias}
"""

from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

# model.py's building blocks (the house Dense, init, norm, activation) and encoder.
from bert_jax.models.model import (  # pylint: disable=g-importing-member
    PACKED_ROW_KEYS, BertConfig, BertModel, _activation, _constrain, _dense, _init, _layer_norm,
    _zeros, gather_positions)


class MaskedLMHead(nn.Module):
  """dense + act + LayerNorm, then logits against the (tied) word embeddings + bias [V].

  The transform maps H -> E (= H for BERT; ALBERT's E=128, as HF's AlbertMLMHead), so the
  decoder is the [V, E] word table either way. NeoBERT's head (mlm_transform=False,
  tie_word_embeddings=False): its own `decoder` [V, H] (torch's decoder.weight) on x as it is.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x, word_embeddings, chunked=False):
    c = self.config
    if c.mlm_transform:
      x = _dense(c, c.embed_dim, ("embed", "embed2"), "transform")(x)    # [B, P, E]
      x = _activation(c.hidden_act)(x)
      x = _layer_norm(c, "transform_layer_norm")(x).astype(c.dtype)
    if not c.tie_word_embeddings:
      word_embeddings = self.param("decoder", _init(c, ("vocab", "embed")),
                                   (c.vocab_size, c.embed_dim), c.param_dtype)   # [V, E]
    return _tied_logits(c, self, x, word_embeddings, chunked)


# Issue 29's MLM-head levers, A/B knobs of benchmarks/accelerator.py (`@vpad128`, `@headbf16`),
# off until a run on the chip keeps them. The profile of 2026-11-26 (H200, base128) found the
# head's three GEMMs at ~180 TFLOP/s (5.4 ms/step for ~1 TFLOP): V = 30,522 rows are not
# 16-byte aligned for bf16 (cuBLAS ran an `align1` kernel), and the float32 logits' cotangent
# makes both backward GEMMs float32 (a TF32 `s1688gemm` kernel among them).
VOCAB_PAD = 1            # pad V to a multiple of this inside the matmul (128: 30,522 -> 30,592)
HEAD_BF16_BACKWARD = False   # backward GEMMs on the cotangent cast to the compute dtype


def _vocab_matmul(x, w):
  """[B, P, E] @ [V, E]^T -> float32 [B, P, V], under the two knobs above. Padding is exact
  (zero rows, sliced off: params, exports and predictions keep V)."""
  v = w.shape[0]
  pad = (-v) % VOCAB_PAD
  if pad:
    w = jnp.pad(w, ((0, pad), (0, 0)))
  logits = (_bf16_backward_matmul(x, w) if HEAD_BF16_BACKWARD else
            jnp.einsum("BPH,VH->BPV", x, w, preferred_element_type=jnp.float32))
  return logits[..., :v] if pad else logits


@jax.custom_vjp
def _bf16_backward_matmul(x, w):
  return jnp.einsum("BPH,VH->BPV", x, w, preferred_element_type=jnp.float32)


def _bf16_backward_fwd(x, w):
  return _bf16_backward_matmul(x, w), (x, w)


def _bf16_backward_bwd(res, g):
  # The cotangent (softmax - one-hot, in [-1, 1]) in the compute dtype, as every other layer's
  # is; float32 accumulation. The forward logits stay float32 for the loss.
  x, w = res
  g = g.astype(x.dtype)
  dx = jnp.einsum("BPV,VH->BPH", g, w, preferred_element_type=jnp.float32).astype(x.dtype)
  dw = jnp.einsum("BPV,BPH->VH", g, x, preferred_element_type=jnp.float32).astype(w.dtype)
  return dx, dw


_bf16_backward_matmul.defvjp(_bf16_backward_fwd, _bf16_backward_bwd)


def _tied_logits(c, module, x, word_embeddings, chunked=False):
  """[B, P, E] @ [V, E]^T + output_bias [V] -> float32 logits [B, P, V] (the decoder [V, E]:
  the word table, or NeoBERT's own).

  The vocabulary projection is the largest matmul of the heads (H x 30522): bf16 inputs,
  float32 accumulation and float32 logits for the loss.

  chunked (config.mlm_loss_chunk > 0, the training forward only): no logits here; the pieces
  they are made of, {"hidden" [B, n, C, E], "decoder" [V, E], "bias" [V]}, for
  `chunked_cross_entropy` to make C predictions' logits at a time inside the loss.
  """
  bias = module.param("output_bias", _zeros(("vocab",)), (c.vocab_size,), c.param_dtype)
  if chunked:
    # The decoder rounded to the compute dtype as below, but held in the parameters' float32:
    # each chunk casts it down, so its gradient sums over the chunks in float32, not bf16.
    decoder = word_embeddings.astype(c.dtype).astype(word_embeddings.dtype)
    return mlm_chunks(x, decoder, bias, c.mlm_loss_chunk)
  logits = _vocab_matmul(x, word_embeddings.astype(c.dtype))
  logits = logits + bias.astype(jnp.float32)
  return _constrain(logits, "activation_batch", "activation_length", "activation_vocab")


# ----------------------------------------------------------------------------------------------
# The MLM loss a chunk of predictions at a time (issue 42 item 4; config.model.mlm_loss_chunk).
# ----------------------------------------------------------------------------------------------
# A 256k vocabulary (mmBERT, Gemma) makes the head's float32 logits the step's largest tensor:
# modernbert-base at 8,192 tokens has 2,498 predictions a row, 2,498 x 256,000 x 4 B = 2.56 GB a
# row, and the backward holds their cotangent too. Chunked, the loss is a lax.scan over the
# predictions, C a row at a time: each chunk's logits [B, C, V] are made, reduced to (sum of
# weighted cross-entropy, sum of weighted hits) and dropped; the body is rematerialised
# (jax.checkpoint), so the backward saves only each chunk's inputs and remakes its logits.
# Every prediction still sees the whole vocabulary at once (its own full softmax and argmax):
# the sums are the plain loss's, up to float32 summation order.
def mlm_chunks(x, decoder, bias, chunk):
  """[B, P, E] -> {"hidden": [B, n, C, E] (P padded with zero rows to n x C), "decoder" [V, E],
  "bias" [V]}: the chunk width travels in the shape, so the loss needs no static argument."""
  b, p, e = x.shape
  n = -(-p // chunk)
  x = jnp.pad(x, ((0, 0), (0, n * chunk - p), (0, 0)))
  return {"hidden": x.reshape(b, n, chunk, e), "decoder": decoder, "bias": bias}


def chunked_cross_entropy(parts, labels, weights):
  """(sum over predictions of weights x cross-entropy, sum of weights x [argmax == label]) of the
  logits `parts` (mlm_chunks') stand for, C predictions a row at a time. labels, weights [B, P]."""
  hidden, decoder, bias = parts["hidden"], parts["decoder"], parts["bias"]
  b, n, c, _ = hidden.shape
  pad = n * c - labels.shape[1]
  labels = jnp.pad(labels, ((0, 0), (0, pad))).reshape(b, n, c)
  weights = jnp.pad(weights.astype(jnp.float32), ((0, 0), (0, pad))).reshape(b, n, c)

  @jax.checkpoint   # the backward remakes a chunk's logits instead of storing every chunk's
  def body(sums, xs):
    h, y, w = xs                                                 # [B, C, E], [B, C], [B, C]
    logits = (_vocab_matmul(h, decoder.astype(jnp.promote_types(h.dtype, jnp.bfloat16)))
              + bias.astype(jnp.float32))                          # [B, C, V] float32
    logits = _constrain(logits, "activation_batch", "activation_length", "activation_vocab")
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y)      # [B, C]
    hit = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
    return (sums[0] + jnp.sum(ce * w), sums[1] + jnp.sum(hit * w)), None

  xs = (jnp.moveaxis(hidden, 1, 0), jnp.moveaxis(labels, 1, 0), jnp.moveaxis(weights, 1, 0))
  zero = jnp.zeros((), jnp.float32)
  (ce_sum, hit_sum), _ = jax.lax.scan(body, (zero, zero), xs)
  return ce_sum, hit_sum


class SpanBoundaryHead(nn.Module):
  """SpanBERT's span-boundary objective (Joshi et al. 2019, eq. 1-2): each masked token of a span
  is predicted from the span's two boundary tokens x_{s-1}, x_{e+1} and its offset in the span:
    h = LN(GeLU(W1 [x_{s-1}; x_{e+1}; p_{i-s}])),  y = LN(GeLU(W2 h)),
  then logits against the tied word embeddings (its own bias). Offsets past sbo_max_targets - 1
  share the last position embedding.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, sequence_output, positions, left, right, word_embeddings):
    c = self.config
    table = self.param("position_embeddings", _init(c, ("pos", "embed")),
                       (c.sbo_max_targets, c.hidden_size), c.param_dtype)
    offset = jnp.clip(positions - left - 1, 0, c.sbo_max_targets - 1)   # [B, P]
    x = jnp.concatenate([gather_positions(sequence_output, left),        # [B, P, H]
                         gather_positions(sequence_output, right),       # [B, P, H]
                         table[offset].astype(sequence_output.dtype)], -1)  # [B, P, 3H]
    act = _activation("gelu")
    x = _dense(c, c.hidden_size, ("mlp", "embed"), "dense_1")(x)        # [B, P, H]
    x = _layer_norm(c, "layer_norm_1")(act(x)).astype(c.dtype)
    x = _dense(c, c.embed_dim, ("embed", "embed2"), "dense_2")(x)       # [B, P, E]
    x = _layer_norm(c, "layer_norm_2")(act(x)).astype(c.dtype)
    return _tied_logits(c, self, x, word_embeddings)


class BertForPreTraining(nn.Module):
  """BertModel + the heads of config.objectives (bert_jax/objectives/pretraining.py composes their losses):
    mlm  MaskedLMHead on the masked positions                          mlm_head
    nsp  / sop  dense(2) on the pooled [CLS] (same shape, other data)   nsp_head / sop_head
    sbo  SpanBoundaryHead on the masked positions                      sbo_head

  Returns (mlm_logits, sentence_logits) as before -- sentence_logits is None without a sentence
  task -- or, with return_dict=True, {objective: logits} (what `pretraining_forward` gives the
  loss). Packed rows (instance_ids, position_ids, cls_positions [B, K] given) get one sentence
  prediction per instance, read at its own [CLS]: [B, K, 2] instead of [B, 2].
  output_sequence=True (with return_dict) adds "sequence_output", the last hidden states
  [B, T, H] (distill_cos reads the student's and the teacher's; bert_jax/objectives/layerwise.py).
  chunked_mlm=True (with return_dict; the training forward when config.mlm_loss_chunk > 0): "mlm"
  is mlm_chunks' pieces instead of the [B, P, V] logits, for objectives.masked_lm's chunked loss.
  output_hidden_states=True (with return_dict) adds "hidden_states" [B, L+1, T, H], or [B, L+1,
  T, F] through a learned `fit_dense` [H, F] with fit_size=F > 0: what bert_jax/objectives/layerwise.py's
  objective reads of a student (a distilbert-* one; MobileBERT's network takes the same keywords).
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
               instance_ids=None, position_ids=None, cls_positions=None, span_left=None,
               span_right=None, deterministic=True, return_dict=False, output_sequence=False,
               chunked_mlm=False, output_hidden_states=False, fit_size=0):
    c = self.config
    bert = BertModel(c, name="bert")
    out = bert(input_ids, input_mask, segment_ids, instance_ids=instance_ids,
               position_ids=position_ids, cls_positions=cls_positions,
               deterministic=deterministic, output_hidden_states=output_hidden_states)
    # Gather first: [B, P, H] with P = max_predictions_per_seq (20 for T=128), so the
    # H x V projection runs on ~15% of the positions instead of all T.
    masked = gather_positions(out["sequence_output"], masked_lm_positions)
    table = bert.embeddings.word_embeddings.embedding                     # [V, E], tied
    chunked = chunked_mlm and return_dict and not self.is_initializing()
    logits = {"mlm": MaskedLMHead(c, name="mlm_head")(masked, table, chunked)}  # [B, P, V] f32
    sentence = c.sentence_objective
    if sentence:
      logits[sentence] = _dense(c, 2, ("embed", "classes"), f"{sentence}_head",
                                dtype=jnp.float32)(out["pooled_output"])  # [B, (K,) 2] float32
    # SBO logits are computed where they are returned (the loss's dict) or created (init); the
    # tuple form (predict's fill-mask) has no use for them and needs no span boundaries.
    if "sbo" in c.objective_list and (return_dict or self.is_initializing()):
      if span_left is None:
        if not self.is_initializing():   # never a silent SBO on made-up boundaries
          raise ValueError("BertForPreTraining: objectives include sbo but the batch has no "
                           "masked_lm_span_left/right (span masking adds them: "
                           "--config.masking=span).")
        span_left = span_right = jnp.zeros_like(masked_lm_positions)  # shapes for init
      logits["sbo"] = SpanBoundaryHead(c, name="sbo_head")(
          out["sequence_output"], masked_lm_positions, span_left, span_right, table)
    if return_dict and output_hidden_states:
      hidden = jnp.stack(out["hidden_states"], axis=1)                     # [B, L+1, T, H]
      if fit_size:   # layer-wise distillation's W_h to a teacher of another width
        hidden = _dense(c, fit_size, ("embed", "embed2"), "fit_dense")(hidden)   # [B, L+1, T, F]
      logits["hidden_states"] = hidden
    if return_dict:
      return {**logits, "sequence_output": out["sequence_output"]} if output_sequence else logits
    return logits["mlm"], logits.get(sentence)


def __getattr__(name):
  """pretraining_loss moved to objectives.py (2026-11-27): objectives imports this module, so
  this one cannot import it back (tests/layers_test.py); the old name says where it went."""
  if name == "pretraining_loss":
    raise AttributeError("bert_jax.models.pretraining_heads.pretraining_loss moved to "
                         "bert_jax.objectives.pretraining.pretraining_loss: "
                         "`from bert_jax.objectives import pretraining`")
  raise AttributeError(f"module 'bert_jax.models.pretraining_heads' has no attribute {name!r}")


# Batch keys the model reads, besides input_ids/input_mask/segment_ids/masked_lm_positions.
_FORWARD_KEYS = {**{k: k for k in PACKED_ROW_KEYS}, "masked_lm_span_left": "span_left",
                 "masked_lm_span_right": "span_right"}


def pretraining_outputs(module, batch, deterministic, chunked_mlm=None):
  """BertForPreTraining on a batch dict, packed or unpacked -> {objective: logits} (use as
  `apply(..., method=)`; what the trainer's loss reads). With config.mlm_loss_chunk > 0, "mlm"
  holds the pieces of the logits (mlm_chunks), made a chunk at a time in the loss."""
  extra = {arg: batch[k] for k, arg in _FORWARD_KEYS.items() if k in batch}
  return module(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                batch["masked_lm_positions"], deterministic=deterministic, return_dict=True,
                chunked_mlm=(module.config.mlm_loss_chunk > 0 if chunked_mlm is None else
                             chunked_mlm), **extra)


def pretraining_forward(module, batch, deterministic):
  """The same -> (mlm_logits, sentence_logits or None), the tuple of BertForPreTraining (whole
  logits, whatever config.mlm_loss_chunk says)."""
  out = pretraining_outputs(module, batch, deterministic, chunked_mlm=False)
  return out["mlm"], out.get(module.config.sentence_objective)


def init_params(config, rng, seq_len=8, num_predictions=2, model_cls=None) -> Any:
  """Boxed (LogicallyPartitioned) params of `model_cls` (default BertForPreTraining)."""
  model = (model_cls or BertForPreTraining)(config)
  ids = jnp.zeros((1, seq_len), jnp.int32)
  args = (ids, jnp.ones_like(ids), ids)
  if model_cls in (None, BertForPreTraining):
    args += (jnp.zeros((1, num_predictions), jnp.int32),)
  return model.init(rng, *args)["params"]
