"""MobileBERT's network (Sun et al. 2020, arXiv 2004.02984) as transformers' MobileBertModel and
MobileBertForPreTraining have it (models/mobilebert/modeling_mobilebert.py), and its config
record: BertConfig plus MobileBERT's own fields, which live here and nowhere else.

Shapes of the `mobilebert` preset: V 30,522, E 128 (embedding_size), H 512 (hidden_size, the
width between layers), B 128 (intra_bottleneck_size, the width inside a layer: the "true hidden
size" attention and the FFNs run at), I 512 (intermediate_size), N 4 heads of B / N = 32, F 4
stacked FFNs a layer, L 24.

  embeddings  word [V, E] -> trigram [x_{t+1}; x_t; x_{t-1}] [T, 3E] -> dense [3E, H]
              + position [T, H] + token type [T, H] -> norm           ("embedding_transformation")
  layer       bottleneck/input: dense H -> B + norm                  (the residual, "layer input")
              bottleneck/attention: dense H -> B + norm              (q and k, key_query_shared)
              attention: q, k [B -> B], v [H -> B] (v from the layer's H-wide input), N heads;
                         output dense B -> B + norm(+ layer input)
              F - 1 FFNs (ffn_j): dense B -> I, act, dense I -> B + norm(+ input)
              intermediate B -> I, act; output I -> B + norm(+ attention out)
              output/bottleneck: dense B -> H + dropout + norm(+ the layer's input)
  pooler      tanh(dense H -> H) on [CLS] (classifier_activation), else [CLS] itself
  MLM head    dense H -> H + act + LayerNorm, then logits against [word table [V, E] | dense
              [H - E, V]^T]: the decoder is the E-wide word table widened by H - E rows of its own
              (MobileBertLMPredictionHead's `dense`), + bias [V]
  NSP head    dense H -> 2 on the pooled [CLS]

"norm" is NoNorm (x * scale + bias, elementwise: the paper's replacement of LayerNorm for
latency) with normalization_type="no_norm", else LayerNorm. transformers builds two of the
LayerNorms without config.layer_norm_eps (the embeddings' and the layer output's: torch's
default 1e-5); so does this file (`_DEFAULT_EPS`), so a layer_norm MobileBERT matches too.

Parameter names follow transformers' module names (layer_{i} for layer.{i}, ffn_{j} for
ffn.{j}; kernels [in, out]), so families/mobilebert/convert.py's name table is a rename.
"""

import dataclasses

import jax.numpy as jnp
from flax import linen as nn

from bert_jax.layers import attention as attention_lib
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads

NORMALIZATIONS = ("no_norm", "layer_norm")
_DEFAULT_EPS = 1e-5   # torch.nn.LayerNorm's, where transformers passes no eps


@dataclasses.dataclass(frozen=True)
class MobileBertConfig(model_lib.BertConfig):
  """BertConfig + MobileBERT's fields (transformers' MobileBertConfig names and defaults; the
  shared fields keep their BertConfig names: num_layers, num_heads, attention_dropout_prob).
  embedding_size E is BertConfig's (the word table's width)."""
  trigram_input: bool = True                # the word embeddings of t-1, t, t+1 side by side
  use_bottleneck: bool = True               # layers run at intra_bottleneck_size inside
  intra_bottleneck_size: int = 128          # B: the "true hidden size" when use_bottleneck
  use_bottleneck_attention: bool = False    # q, k, v all from the input bottleneck
  key_query_shared_bottleneck: bool = True  # q and k from one bottleneck of their own
  num_feedforward_networks: int = 4         # F: F - 1 extra FFNs before the layer's own
  normalization_type: str = "no_norm"       # no_norm (elementwise scale + bias) | layer_norm
  classifier_activation: bool = True        # the pooler's tanh dense (False: [CLS] as it is)

  def __post_init__(self):
    # MobileBERT's sizes first: its heads split the true hidden size, not hidden_size.
    if self.normalization_type not in NORMALIZATIONS:
      raise ValueError(f"MobileBertConfig: normalization_type={self.normalization_type!r} is "
                       f"not one of {NORMALIZATIONS}.")
    if self.intra_bottleneck_size < 1 or self.num_feedforward_networks < 1:
      raise ValueError(f"MobileBertConfig: intra_bottleneck_size={self.intra_bottleneck_size}, "
                       f"num_feedforward_networks={self.num_feedforward_networks}; both >= 1.")
    if self.true_hidden_size % self.num_heads:
      raise ValueError(
          f"MobileBertConfig: the true hidden size {self.true_hidden_size} ("
          + ("intra_bottleneck_size" if self.use_bottleneck else "hidden_size")
          + f") is not divisible by num_heads={self.num_heads}; pick heads that divide it "
          "(mobilebert: 128 / 4 heads of 32).")
    if (self.use_bottleneck and not self.use_bottleneck_attention
        and not self.key_query_shared_bottleneck and self.hidden_size != self.true_hidden_size):
      raise ValueError("MobileBertConfig: use_bottleneck with neither use_bottleneck_attention "
                       "nor key_query_shared_bottleneck feeds H-wide queries to projections "
                       f"transformers builds {self.true_hidden_size} wide (hidden_size="
                       f"{self.hidden_size}); set one of the two.")
    if self.embedding_size > self.hidden_size:
      raise ValueError(f"MobileBertConfig: embedding_size={self.embedding_size} > hidden_size="
                       f"{self.hidden_size}; the MLM decoder is the word table widened to H.")
    if self.objective_list not in (("mlm", "nsp"), ("mlm",)):
      raise ValueError(f"MobileBertConfig: objectives={self.objectives!r}; MobileBERT trains "
                       "'mlm,nsp' (MobileBertForPreTraining) or 'mlm' (MobileBertForMaskedLM).")
    super().__post_init__()

  @property
  def true_hidden_size(self) -> int:
    return self.intra_bottleneck_size if self.use_bottleneck else self.hidden_size

  @property
  def embed_dim(self) -> int:
    return self.embedding_size or self.hidden_size


class NoNorm(nn.Module):
  """x * scale + bias, elementwise (transformers' NoNorm: weight, bias)."""
  features: int
  param_dtype: str = "float32"

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("norm",)),
                       (self.features,), self.param_dtype)
    bias = self.param("bias", model_lib._zeros(("norm",)), (self.features,), self.param_dtype)
    return x * scale.astype(x.dtype) + bias.astype(x.dtype)


def _norm(c, features, name="LayerNorm", eps=None):
  """The config's norm over the last axis (float32 statistics for LayerNorm, as model.py's)."""
  if c.normalization_type == "no_norm":
    return NoNorm(features, c.param_dtype, name=name)
  return nn.LayerNorm(epsilon=c.layer_norm_eps if eps is None else eps, dtype=jnp.float32,
                      param_dtype=c.param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              ("norm",)),
                      bias_init=model_lib._zeros(("norm",)), name=name)


def _dense(c, features, axes, name="dense"):
  return model_lib._dense(c, features, axes, name)


def _axis(c, width):
  """The logical axis of a width: H "embed", the bottleneck B "kv" (replicated: 128 wide)."""
  return "embed" if width == c.hidden_size else "kv"


class DenseNorm(nn.Module):
  """norm(dropout(dense(x)) + residual): transformers' SelfOutput, FFNOutput, OutputBottleneck."""
  config: MobileBertConfig
  features: int
  dropout: bool = False
  eps: float = None

  @nn.compact
  def __call__(self, x, residual, deterministic=True):
    c = self.config
    y = _dense(c, self.features, ("mlp", _axis(c, self.features)))(x)
    if self.dropout:
      y = nn.Dropout(c.hidden_dropout_prob)(y, deterministic=deterministic)
    return _norm(c, self.features, eps=self.eps)(y + residual).astype(c.dtype)


class Intermediate(nn.Module):
  """act(dense B -> I): transformers' MobileBertIntermediate."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    x = _dense(c, c.intermediate_size, (_axis(c, x.shape[-1]), "mlp"))(x)
    return model_lib._activation(c.hidden_act)(x)


class BottleneckLayer(nn.Module):
  """norm(dense H -> B)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    y = _dense(c, c.intra_bottleneck_size, ("embed", "kv"))(x)
    return _norm(c, c.intra_bottleneck_size)(y).astype(c.dtype)


class Bottleneck(nn.Module):
  """(query, key, value, layer input) of a layer's H-wide input x (transformers' Bottleneck)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    layer_input = BottleneckLayer(c, name="input")(x)                  # [B, T, B]
    # transformers builds the shared q/k bottleneck whenever key_query_shared_bottleneck, also
    # when use_bottleneck_attention leaves it unused: made here too (XLA drops the dead value),
    # so the parameters and counts are its.
    shared = BottleneckLayer(c, name="attention")(x) if c.key_query_shared_bottleneck else None
    if c.use_bottleneck_attention:
      return layer_input, layer_input, layer_input, layer_input
    if c.key_query_shared_bottleneck:
      return shared, shared, x, layer_input                            # [B, T, B] q, k
    return x, x, x, layer_input


class SelfAttention(nn.Module):
  """N heads of true_hidden_size / N over query/key/value tensors of their own widths."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, q_in, k_in, v_in, attention_ids, deterministic, block_diagonal):
    c = self.config
    n, d = c.num_heads, c.true_hidden_size // c.num_heads
    proj = lambda x, name: _dense(c, n * d, (_axis(c, x.shape[-1]), "heads"), name)(x).reshape(
        *x.shape[:-1], n, d)
    q, k, v = proj(q_in, "query"), proj(k_in, "key"), proj(v_in, "value")   # [B, T, N, D]
    dropout = 0.0 if deterministic else c.attention_dropout_prob
    rng = self.make_rng("dropout") if dropout > 0 else None
    if self.is_mutable_collection("attention_scores") and not self.is_initializing():
      # Layer-wise distillation reads each layer's pre-softmax scores [B, N, T, S]
      # (bert_jax/objectives/layerwise.py; model.SelfAttention does the same).
      ctx, scores = attention_lib.scored_attention(q, k, v, attention_ids, packed=block_diagonal,
                                                   dropout_rate=dropout, dropout_rng=rng)
      self.sow("attention_scores", "scores", scores)
    else:
      backend = c.attention
      if backend == "auto":
        backend = attention_lib.select_backend("auto", packed=block_diagonal, dtype=c.dtype,
                                               seq_len=q.shape[1], dropout=dropout).backend
      ctx = attention_lib.dot_product_attention(
          q, k, v, attention_ids, packed=block_diagonal, backend=backend, dropout_rate=dropout,
          dropout_rng=rng, deterministic=deterministic)                       # [B, T, N, D]
    return ctx.reshape(*ctx.shape[:-2], n * d)                               # [B, T, B]


class Attention(nn.Module):
  config: MobileBertConfig

  @nn.compact
  def __call__(self, q, k, v, layer_input, attention_ids, deterministic, block_diagonal):
    c = self.config
    ctx = SelfAttention(c, name="self")(q, k, v, attention_ids, deterministic, block_diagonal)
    # transformers drops out here only without bottlenecks (MobileBertSelfOutput).
    return DenseNorm(c, c.true_hidden_size, dropout=not c.use_bottleneck, name="output")(
        ctx, layer_input, deterministic)


class FFN(nn.Module):
  """One of the F - 1 extra feed-forward networks: norm(dense(act(dense(x))) + x)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x):
    c = self.config
    return DenseNorm(c, c.true_hidden_size, name="output")(Intermediate(c, name="intermediate")(x),
                                                           x)


class Output(nn.Module):
  """The layer's last FFN half and output bottleneck (transformers' MobileBertOutput)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, intermediate, attention_output, layer_in, deterministic):
    c = self.config
    y = _dense(c, c.true_hidden_size, ("mlp", _axis(c, c.true_hidden_size)))(intermediate)
    if not c.use_bottleneck:
      y = nn.Dropout(c.hidden_dropout_prob)(y, deterministic=deterministic)
      return _norm(c, c.true_hidden_size, eps=_DEFAULT_EPS)(y + attention_output).astype(c.dtype)
    y = _norm(c, c.true_hidden_size, eps=_DEFAULT_EPS)(y + attention_output).astype(c.dtype)
    return DenseNorm(c, c.hidden_size, dropout=True, name="bottleneck")(y, layer_in,
                                                                        deterministic)


class Layer(nn.Module):
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal):
    c = self.config
    if c.use_bottleneck:
      q, k, v, layer_input = Bottleneck(c, name="bottleneck")(x)
    else:
      q = k = v = layer_input = x
    h = Attention(c, name="attention")(q, k, v, layer_input, attention_ids, deterministic,
                                       block_diagonal)                        # [B, T, B]
    for j in range(c.num_feedforward_networks - 1):
      h = FFN(c, name=f"ffn_{j}")(h)                                          # [B, T, B]
    y = Intermediate(c, name="intermediate")(h)                               # [B, T, I]
    return Output(c, name="output")(y, h, x, deterministic)                   # [B, T, H]


class Embeddings(nn.Module):
  """word [V, E] -> trigram [T, 3E] -> dense to H, + position + token type, norm, dropout."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None,
               instance_ids=None):
    c = self.config
    e, h = c.embed_dim, c.hidden_size
    table = lambda n, width, axes, name: nn.Embed(
        n, width, dtype=jnp.float32, param_dtype=c.param_dtype,
        embedding_init=model_lib._init(c, axes), name=name)
    words = table(c.vocab_size, e, ("vocab", "embed"), "word_embeddings")
    x = words(input_ids)                                                       # [B, T, E]
    if c.trigram_input:
      # transformers' cat([x[t + 1], x[t], x[t - 1]]) with zeros past either end. A packed row
      # gives each instance what its own right-padded row gives it: zeros before its first
      # token; after its last one the padding id 0's embedding (trained, not zero, in a model
      # initialised here: zeros instead moved a tiny MobileBERT's contrastive loss by 1e-4 and
      # its gradient by 11%), or zeros when the instance fills a row of T on its own.
      nxt = jnp.pad(x[:, 1:], ((0, 0), (0, 1), (0, 0)))
      prev = jnp.pad(x[:, :-1], ((0, 0), (1, 0), (0, 0)))
      if instance_ids is not None:
        same = instance_ids[:, 1:] == instance_ids[:, :-1]                      # [B, T - 1]
        prev = prev * jnp.pad(same, ((0, 0), (1, 0)))[..., None]
        ends = (instance_ids != 0) & ~jnp.pad(same, ((0, 0), (0, 1)))          # [B, T] last
        own = (position_ids if position_ids is not None
               else jnp.arange(input_ids.shape[1])[None])                      # [B, T]
        pad = words(jnp.zeros((), jnp.int32))                                  # [E]
        nxt = jnp.where((ends & (own < input_ids.shape[1] - 1))[..., None], pad,
                        nxt * jnp.pad(same, ((0, 0), (0, 1)))[..., None])
      x = jnp.concatenate([nxt, x, prev], -1)                                  # [B, T, 3E]
    if c.trigram_input or e != h:
      x = _dense(c, h, ("mlp", "embed"), "embedding_transformation")(x)       # [B, T, H]
    if position_ids is None:
      position_ids = jnp.arange(input_ids.shape[1])[None]
    x = x + table(c.max_position_embeddings, h, ("pos", "embed"),
                  "position_embeddings")(position_ids)
    x = x + table(c.type_vocab_size, h, ("type", "embed"), "token_type_embeddings")(segment_ids)
    x = _norm(c, h, eps=_DEFAULT_EPS)(x)
    return nn.Dropout(c.hidden_dropout_prob)(x, deterministic=deterministic).astype(c.dtype)


class MobileBertModel(nn.Module):
  """The body, with BertModel's call and outputs (sequence_output, pooled_output, cls_output,
  hidden_states with output_hidden_states: the embeddings' output and each layer's, L + 1)."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
               position_ids=None, cls_positions=None, deterministic=True,
               output_hidden_states=False) -> dict:
    c = self.config
    packed = instance_ids is not None
    x = Embeddings(c, name="embeddings")(input_ids, segment_ids, deterministic, position_ids,
                                         instance_ids)                       # [B, T, H]
    block_diagonal = cls_positions.shape[1] if packed and cls_positions is not None else packed
    ids = instance_ids if packed else input_mask
    hidden = [x]
    layer = nn.remat(Layer, static_argnums=(3, 4)) if c.remat else Layer
    for i in range(c.num_layers):
      x = layer(c, name=f"layer_{i}")(x, ids, deterministic, block_diagonal)
      hidden.append(x)
    cls = x[:, 0] if cls_positions is None else model_lib.gather_positions(x, cls_positions)
    pooled = cls
    if c.classifier_activation:
      pooled = jnp.tanh(_dense(c, c.hidden_size, ("embed", "embed2"), "pooler")(cls))
    out = {"sequence_output": x, "pooled_output": pooled, "cls_output": cls}
    if output_hidden_states:
      out["hidden_states"] = hidden
    return out


class LMHead(nn.Module):
  """transformers' MobileBertLMPredictionHead: transform (dense H -> H, act, LayerNorm), then
  logits against [word table [V, E] | dense [H - E, V]^T] [V, H] + output_bias [V]."""
  config: MobileBertConfig

  @nn.compact
  def __call__(self, x, word_embeddings, chunked=False):
    c = self.config
    x = _dense(c, c.hidden_size, ("embed", "embed2"), "transform")(x)        # [B, P, H]
    x = model_lib._activation(c.hidden_act)(x)
    x = model_lib._layer_norm(c, "transform_layer_norm")(x).astype(c.dtype)
    extra = self.param("dense", model_lib._init(c, ("embed", "vocab")),
                       (c.hidden_size - c.embed_dim, c.vocab_size), c.param_dtype)  # [H-E, V]
    decoder = jnp.concatenate([word_embeddings, extra.T.astype(word_embeddings.dtype)], -1)
    return pretraining_heads._tied_logits(c, self, x, decoder, chunked)      # [B, P, V]


class MobileBertForPreTraining(nn.Module):
  """MobileBertModel + the MLM head (mlm_head) and, with objectives mlm,nsp, the NSP head
  (nsp_head: dense H -> 2 on the pooled [CLS]). BertForPreTraining's call and returns.

  output_hidden_states (with return_dict): "hidden_states" [B, L + 1, T, H], the embeddings'
  output and each layer's, stacked batch first (the form bert_jax/objectives/layerwise.py reads from a
  student or a teacher; fit_size F > 0 adds its `fit_dense` [H, F] projection, mlm=False leaves
  the MLM head out: layerwise.LayerwiseModel's keywords)."""
  config: MobileBertConfig
  layerwise_outputs = True   # layerwise.py may run it as a student or a teacher

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
               instance_ids=None, position_ids=None, cls_positions=None, span_left=None,
               span_right=None, deterministic=True, return_dict=False, output_sequence=False,
               chunked_mlm=False, output_hidden_states=False, fit_size=0, mlm=True):
    del span_left, span_right   # no SBO in MobileBERT (its config refuses the objective)
    c = self.config
    out = MobileBertModel(c, name="bert")(
        input_ids, input_mask, segment_ids, instance_ids=instance_ids, position_ids=position_ids,
        cls_positions=cls_positions, deterministic=deterministic,
        output_hidden_states=output_hidden_states)
    masked = model_lib.gather_positions(out["sequence_output"], masked_lm_positions)  # [B, P, H]
    table = self.variables["params"]["bert"]["embeddings"]["word_embeddings"]["embedding"]
    table = nn.meta.unbox(table)                                              # [V, E]
    chunked = chunked_mlm and return_dict and not self.is_initializing()
    logits = {"mlm": LMHead(c, name="mlm_head")(masked, table, chunked) if mlm else None}
    if c.sentence_objective and mlm:
      logits["nsp"] = model_lib._dense(c, 2, ("embed", "classes"), "nsp_head",
                                       dtype=jnp.float32)(out["pooled_output"])
    if output_hidden_states:
      hidden = jnp.stack(out["hidden_states"], axis=1)                      # [B, L+1, T, H]
      if fit_size:   # layer-wise distillation's W_h to a teacher of another width
        hidden = model_lib._dense(c, fit_size, ("embed", "embed2"), "fit_dense")(hidden)
      logits["hidden_states"] = hidden
    if return_dict:
      return {**logits, "sequence_output": out["sequence_output"]} if output_sequence else logits
    return logits["mlm"], logits.get("nsp")
