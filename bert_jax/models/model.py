"""BERT (Devlin et al., 2018) in Flax linen: embeddings, attention, feed-forward, encoder, pooler.

The same modules are ALBERT (embedding_size E > 0: tables of width E projected to H;
share_layers: one layer applied L times, or its attention / FFN half shared) and SpanBERT (the
SBO head), chosen by BertConfig's family fields; ELECTRA (bert_jax/families/electra/objective.py) composes them into
a generator and a discriminator sharing the embeddings (the generator_* fields); docs/models.md.

Reads top to bottom (BertConfig and the presets are in bert_config.py, re-exported here): the
modules from the bottom of the network (embeddings) to the top (BertModel: the encoder and its
pooler); the pre-training heads on top of it (MLM, NSP/SOP, SBO) and BertForPreTraining, which
composes them, are in pretraining_heads.py. Numerics follow google-research/bert `modeling.py`:
post-LayerNorm layers, LayerNorm epsilon 1e-12, truncated-normal(0.02) init. GELU defaults to the
exact erf form, as HF transformers' "gelu"; google's modeling.py `gelu()` is the tanh
approximation ("gelu_tanh" here; the two differ by up to 4.7e-4 per activation).

Einsum letters used throughout:
  B batch, T query position, S key position, P masked position, N heads, D head dim (kv),
  H hidden (embed), V vocabulary.

Parameter tree of BertForPreTraining (fine-tuning loads `params["bert"]` only; the heads are
pretraining_heads.py's):
  bert/embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding, layer_norm
  bert/encoder/layer_{i}/attention/{query,key,value,output}/{kernel,bias}, attention_layer_norm,
                         intermediate/{kernel,bias}, output/{kernel,bias}, output_layer_norm
  bert/pooler/{kernel,bias}
  mlm_head/{transform/{kernel,bias}, transform_layer_norm, output_bias}    (decoder tied to words;
           NeoBERT: mlm_head/{decoder [V, H], output_bias}, the mlm_transform/tie fields)
  nsp_head/{kernel,bias}
ALBERT adds bert/embeddings/projection and names its shared layer bert/encoder/layer_shared (or
shared_attention / shared_ffn beside layer_{i}); sop_head replaces nsp_head; SpanBERT has
sbo_head/{position_embeddings, dense_1, layer_norm_1, dense_2, layer_norm_2, output_bias}.
The modern encoder's fields (ModernBERT, NeoBERT: bert_jax/families/modernbert/__init__.py) change the
same tree: position_embedding="rope" drops position_embeddings (q and k turned instead, rope.py);
ffn="geglu"/"swiglu" puts layer_{i}/mlp/{Wi [H, 2I], Wo [I, H]} (modern_layers.py) in place of
intermediate/output; use_bias=False drops every bias but mlm_head/output_bias; norm= picks the
norms' kind (layer_norm_no_bias, rms_norm: scale only); prenorm=True adds bert/encoder/final_norm
and, after a normalised embedding, layer_0 has no attention_layer_norm (HF's Identity).

Every parameter carries logical axis names and activations carry logical constraints; the rules
table in `bert_jax/parallel/sharding.py` maps them to mesh axes (they are no-ops outside a mesh).
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bert_jax.layers import attention as attention_lib
from bert_jax.layers import fp8 as fp8_lib
from bert_jax.layers import fused_ops
from bert_jax.layers import modern_layers
from bert_jax.layers import rope as rope_lib

# The config and the presets live in bert_config.py (this module re-exports them).
from bert_jax.models.bert_config import (  # noqa: F401  pylint: disable=unused-import
    ACTIVATIONS, FAMILY_FIELDS, FFNS, GENERATOR_FIELDS, MODERN_FIELDS, OBJECTIVES,
    POSITION_EMBEDDINGS, SHARE_LAYERS, BertConfig, get_bert_config)
from bert_jax.models import bert_config as _bert_config


# The pre-training heads, BertForPreTraining and init_params moved to pretraining_heads.py
# (2026-11-26). That module imports this one, so this one cannot import it back, not even inside
# a function (tests/layers_test.py: no import cycle): an old `model.BertForPreTraining` is an
# AttributeError that names the new home.
# pretraining_loss went on to objectives.py (2026-11-27: the loss imports the heads, not back).
_MOVED = {name: ("bert_jax.models", "pretraining_heads") for name in (
    "MaskedLMHead", "SpanBoundaryHead", "BertForPreTraining", "pretraining_outputs",
    "pretraining_forward", "init_params", "VOCAB_PAD", "HEAD_BF16_BACKWARD")}
_MOVED["pretraining_loss"] = ("bert_jax.objectives", "pretraining")


def __getattr__(name):
  """PRESETS and FAMILIES, read from the registry each time (bert_config.py says how)."""
  if name in _MOVED:
    package, module = _MOVED[name]
    raise AttributeError(f"bert_jax.models.model.{name} moved to {package}.{module}.{name}: "
                         f"`from {package} import {module}`")
  return _bert_config.__getattr__(name)


# ----------------------------------------------------------------------------------------------
# Building blocks.
# ----------------------------------------------------------------------------------------------
def _init(config, names):
  """Truncated normal(initializer_range), as google's `create_initializer`, with logical axes."""
  return nn.with_logical_partitioning(
      nn.initializers.truncated_normal(config.initializer_range), names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _activation(name):
  if name == "gelu":
    return lambda x: jax.nn.gelu(x, approximate=False)  # 0.5x(1+erf(x/sqrt2)), as HF "gelu"
  if name == "gelu_tanh":
    return lambda x: jax.nn.gelu(x, approximate=True)   # google modeling.py gelu(); HF "gelu_new"
  return jax.nn.relu


def _dense(config, features, names, name, dtype=None, fp8=False):
  """Dense with kernel [in, out] named `names` and bias named names[1:]. fp8: an encoder matmul
  that config.fp8 runs in FP8 (bert_jax/layers/fp8.py)."""
  return nn.Dense(features, dtype=dtype or config.dtype, param_dtype=config.param_dtype,
                  use_bias=config.use_bias, kernel_init=_init(config, names),
                  bias_init=_zeros(names[1:]), name=name,
                  dot_general_cls=fp8_lib.dot_general_cls(config) if fp8 else None)


def _layer_norm(config, name):
  # Statistics and normalisation in float32 even under bfloat16 compute; callers cast back.
  if config.norm != "layer_norm":   # ModernBERT's bias-free LayerNorm, NeoBERT's RMSNorm
    return modern_layers.norm(config.norm, eps=config.layer_norm_eps, name=name,
                              param_dtype=config.param_dtype)
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.float32,
                      param_dtype=config.param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              ("norm",)),
                      bias_init=_zeros(("norm",)), name=name)


def _residual_norm(config, name, x, y):
  """LN(x + y) as `name` (post-LN's residual and norm). config.fused_residual_norm: the same
  parameters through fused_ops.ResidualLayerNorm (written-out backward); float32 out."""
  if config.fused_residual_norm and config.norm == "layer_norm":
    return fused_ops.ResidualLayerNorm(config.layer_norm_eps, config.param_dtype, name=name)(x, y)
  return _layer_norm(config, name)(x + y)


def _constrain(x, *names):
  return nn.with_logical_constraint(x, names)


class _HeadsDense(nn.Module):
  """An einsum projection to/from heads: kernel [H, N, D] or [N, D, H], plus a bias.

  Same parameter names and shapes as nn.DenseGeneral, written out because flax's DenseGeneral
  creates its kernel flat ([H, N*D]) and reshapes it after the logical-partitioning box has
  applied its 3-axis sharding constraint, which fails under a mesh (flax 0.12).
  """
  config: BertConfig
  equation: str
  kernel_shape: tuple
  kernel_axes: tuple
  bias_shape: tuple
  bias_axes: tuple

  @nn.compact
  def __call__(self, x):
    c = self.config
    # config.fp8: the einsum in FP8 with its scales in their own collection (bert_jax/layers/fp8.py).
    einsum = fp8_lib.Einsum(name="fp8") if c.fp8 else jnp.einsum
    kernel = self.param("kernel", _init(c, self.kernel_axes), self.kernel_shape, c.param_dtype)
    if not c.use_bias:   # ModernBERT: attention_bias=False
      x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=c.dtype)
      return einsum(self.equation, x, kernel)
    bias = self.param("bias", _zeros(self.bias_axes), self.bias_shape, c.param_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=c.dtype)
    return einsum(self.equation, x, kernel) + bias


BTH = ("activation_batch", "activation_length", "activation_embed")
BTND = ("activation_batch", "activation_length", "activation_heads", "activation_kv")


class BertEmbeddings(nn.Module):
  """word + learned position + token type (segment) embeddings, LayerNorm, dropout.

  ALBERT (embedding_size E > 0): the tables are [., E], LayerNorm and dropout run at width E and
  a dense E -> H (`projection`, HF's encoder.embedding_hidden_mapping_in) follows.
  position_embedding="rope" (ModernBERT, NeoBERT): no position table (the attention turns q and
  k instead); embedding_norm=False (NeoBERT): no norm here (layer 0 normalises its input).
  """
  config: BertConfig

  def setup(self):
    c = self.config
    # The lookups run in float32 (a gather, cheap) so the sum and LayerNorm are float32.
    embed = lambda n, names: nn.Embed(n, c.embed_dim, dtype=jnp.float32,
                                      param_dtype=c.param_dtype,
                                      embedding_init=_init(c, names))
    self.word_embeddings = embed(c.vocab_size, ("vocab", "embed"))
    if c.position_embedding == "learned":
      self.position_embeddings = embed(c.max_position_embeddings, ("pos", "embed"))
    if c.type_vocab_size:   # DistilBERT (0) has no segment table and ignores segment_ids
      self.token_type_embeddings = embed(c.type_vocab_size, ("type", "embed"))
    if c.embedding_norm:
      self.layer_norm = _layer_norm(c, None)
    self.dropout = nn.Dropout(c.hidden_dropout_prob)
    if c.factorised:
      self.projection = _dense(c, c.hidden_size, ("embed2", "embed"), None)  # [E, H]

  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None, project=True):
    """project=False: the [B, T, E] sum before the projection (ELECTRA's shared embeddings)."""
    seq_len = input_ids.shape[1]
    if seq_len > self.config.max_position_embeddings:
      raise ValueError(f"BertEmbeddings: sequence length {seq_len} exceeds "
                       f"max_position_embeddings={self.config.max_position_embeddings}.")
    x = self.word_embeddings(input_ids)                                  # [B, T, E]
    if self.config.position_embedding == "learned":
      # Packed rows restart positions at each instance ([B, T]); unpacked rows count 0..T-1.
      x = x + (self.position_embeddings(jnp.arange(seq_len))[None]       # [1, T, E]
               if position_ids is None else self.position_embeddings(position_ids))  # [B, T, E]
    if self.config.type_vocab_size:
      x = x + self.token_type_embeddings(segment_ids)                    # [B, T, E]
    if self.config.embedding_norm:
      x = self.layer_norm(x)
    x = x.astype(self.config.dtype)
    x = self.dropout(x, deterministic=deterministic)
    if self.config.factorised and project:
      x = self.projection(x)                                             # [B, T, H]
    return _constrain(x, *BTH)


# Which keys each query sees, from segment-ids-style ids [B, T] (0 = padding): a key padding mask
# for unpacked rows, block-diagonal for packed ones (see bert_jax/layers/attention.py).
attention_mask = attention_lib.attention_mask


class SelfAttention(nn.Module):
  """Multi-head self-attention over keys with the same id (see `attention_mask`).

  position_embedding="rope": q and k turned by their positions (`position_ids` [B, T], each
  instance's own in a packed row; None: 0..T-1) at layer `index`'s theta; a local layer
  (config.layer_attention) also masks keys farther than local_window/2 (attention.py's window).
  """
  config: BertConfig
  index: int = 0   # the layer's, for its window and RoPE theta

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False, position_ids=None):
    c = self.config
    n, d = c.num_heads, c.head_dim
    qkv = lambda name: _HeadsDense(c, "BTH,HND->BTND", (c.hidden_size, n, d),
                                   ("embed", "heads", "kv"), (n, d), ("heads", "kv"), name=name)
    q = _constrain(qkv("query")(x), *BTND)   # [B, T, N, D]
    k = _constrain(qkv("key")(x), *BTND)     # [B, S, N, D]
    v = _constrain(qkv("value")(x), *BTND)   # [B, S, N, D]
    window = None
    if c.position_embedding == "rope":
      window, theta = c.layer_attention(self.index)
      q, k = rope_lib.apply_rope(q, k, position_ids, theta=theta)        # [B, T, N, D] each

    # Masking constant: google-research/bert adds -10000.0 to the logits; HF adds
    # finfo(dtype).min; jax.nn.dot_product_attention *replaces* them with -0.7 * float32 max.
    # After the max-subtracting softmax, exp(-10000 - max) and exp(-3e38) both underflow to
    # exactly 0 in float32 whenever a row has one unmasked key, and every real query has one
    # (its own token), so all three give the same probabilities to float tolerance.
    # Dropout on the probabilities (BERT's attention_probs_dropout_prob=0.1) runs on the xla
    # backend only; a fused kernel asked for it is an error, never a silent skip.
    dropout = 0.0 if deterministic else c.attention_dropout_prob
    backend = c.attention
    if backend == "auto":   # the same choice train.py's start-up line prints
      backend = attention_lib.select_backend("auto", packed=block_diagonal, dtype=c.dtype,
                                             seq_len=x.shape[1], dropout=dropout,
                                             window=window).backend
    if self.is_mutable_collection("attention_scores") and not self.is_initializing():
      # Layer-wise distillation (bert_jax/objectives/layerwise.py) applies the model with this collection
      # mutable to read each layer's pre-softmax scores [B, N, T, S] (TinyBERT's): the xla path,
      # which makes them anyway (its start-up check refuses a fused kernel). Not asked (and in
      # init, where every collection is mutable): the path below, unchanged.
      ctx, scores = attention_lib.scored_attention(
          q, k, v, attention_ids, packed=block_diagonal, window=window, dropout_rate=dropout,
          dropout_rng=self.make_rng("dropout") if dropout > 0 else None)
      self.sow("attention_scores", "scores", scores)
    else:
      ctx = attention_lib.dot_product_attention(
          q, k, v, attention_ids, packed=block_diagonal, backend=backend, dropout_rate=dropout,
          dropout_rng=self.make_rng("dropout") if dropout > 0 else None,
          deterministic=deterministic, window=window)                     # [B, T, N, D]
    ctx = _constrain(ctx, *BTND)
    out = _HeadsDense(c, "BTND,NDH->BTH", (n, d, c.hidden_size), ("heads", "kv", "embed"),
                      (c.hidden_size,), ("embed",), name="output")(ctx)
    return _constrain(out, *BTH)


def _attention_block(c, x, attention_ids, deterministic, block_diagonal, position_ids=None,
                     index=0):
  """x = LN(x + Attn(x)), or pre-norm x + Attn(LN(x)). Called inside a module's compact method:
  creates its `attention` and `attention_layer_norm` there (BertLayer's names, or a shared
  block's). Pre-norm layer 0 after a normalised embedding has no norm (ModernBERT's Identity)."""
  attention = SelfAttention(c, index, name="attention")
  if c.prenorm:
    h = x if index == 0 and c.embedding_norm else (
        _layer_norm(c, "attention_layer_norm")(x).astype(c.dtype))
    y = attention(h, attention_ids, deterministic, block_diagonal, position_ids)
    y = nn.Dropout(c.hidden_dropout_prob)(y, deterministic=deterministic)
    return _constrain(x + y, *BTH)                                       # [B, T, H]
  y = attention(x, attention_ids, deterministic, block_diagonal, position_ids)
  y = nn.Dropout(c.hidden_dropout_prob)(y, deterministic=deterministic)
  x = _residual_norm(c, "attention_layer_norm", x, y).astype(c.dtype)   # [B, T, H]
  return _constrain(x, *BTH)


def _ffn(c, x, deterministic):
  """The feed-forward [B, T, H] -> [B, T, H]: BERT's `intermediate` + act + `output`, or the
  gated GeGLU/SwiGLU `mlp` (Wi [H, 2I], Wo [I, H]; modern_layers.py), dropout on its output."""
  if c.ffn != "dense":
    return modern_layers.GatedFeedForward(
        c.hidden_size, c.intermediate_size, c.hidden_act if c.ffn == "geglu" else "silu",
        use_bias=c.use_bias, dropout_rate=c.hidden_dropout_prob, dtype=c.dtype,
        param_dtype=c.param_dtype, kernel_init=nn.initializers.truncated_normal(
            c.initializer_range), dot_general_cls=fp8_lib.dot_general_cls(c),
        name="mlp")(x, deterministic)
  y = _dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate", fp8=True)(x)
  # fused_bias_gelu: the tanh GELU spelt as XLA's GEMM rewriter fuses it with the dense's bias
  # (fused_ops.py; BertConfig requires hidden_act="gelu_tanh" with it).
  act = fused_ops.gelu_tanh if c.fused_bias_gelu else _activation(c.hidden_act)
  y = _constrain(act(y),
                 "activation_batch", "activation_length", "activation_mlp")  # [B, T, I]
  y = _dense(c, c.hidden_size, ("mlp", "embed"), "output", fp8=True)(y)  # [B, T, H]
  return nn.Dropout(c.hidden_dropout_prob)(y, deterministic=deterministic)


def _ffn_block(c, x, deterministic):
  """x = LN(x + FFN(x)), or pre-norm x + FFN(LN(x)); creates the FFN and `output_layer_norm`
  in the caller."""
  if c.prenorm:
    h = _layer_norm(c, "output_layer_norm")(x).astype(c.dtype)
    return _constrain(x + _ffn(c, h, deterministic), *BTH)
  x = _residual_norm(c, "output_layer_norm", x, _ffn(c, x, deterministic)).astype(c.dtype)
  return _constrain(x, *BTH)


class BertLayer(nn.Module):
  """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x)); prenorm=True:
  x = x + Attn(LN(x)); x = x + FFN(LN(x)) (ModernBERT, NeoBERT)."""
  config: BertConfig
  index: int = 0   # the layer's place in the encoder (its window and RoPE theta)

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False, position_ids=None):
    x = _attention_block(self.config, x, attention_ids, deterministic, block_diagonal,
                         position_ids, self.index)
    return _ffn_block(self.config, x, deterministic)


class AttentionBlock(nn.Module):
  """The attention half of a layer, as its own module (ALBERT's share_layers="attention")."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False):
    return _attention_block(self.config, x, attention_ids, deterministic, block_diagonal)


class FFNBlock(nn.Module):
  """The feed-forward half of a layer, as its own module (share_layers="ffn")."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, deterministic):
    return _ffn_block(self.config, x, deterministic)


class BertEncoder(nn.Module):
  """L layers. share_layers (ALBERT, Lan et al. 2019 section 3.1 and Table 4):
    none       layer_{i}: L independent layers (BERT)
    all        layer_shared: one layer applied L times (ALBERT's default)
    attention  shared_attention (attention + its LayerNorm) + layer_{i} (FFN + its LayerNorm)
    ffn        layer_{i} (attention + its LayerNorm) + shared_ffn (FFN + its LayerNorm)
  A flax module called several times reuses its parameters, which is all sharing takes.
  """
  config: BertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False, position_ids=None):
    c = self.config
    # static_argnums counts `self` as 0: (x=1, attention_ids=2, deterministic=3,
    # block_diagonal=4), and for FFNBlock (x=1, deterministic=2). Static flags keep the Python
    # `if`s legal inside jax.checkpoint.
    remat = (lambda cls, argnums: nn.remat(cls, static_argnums=argnums)) if c.remat else (
        lambda cls, argnums: cls)
    layer_cls, attn_cls = remat(BertLayer, (3, 4)), remat(AttentionBlock, (3, 4))
    ffn_cls = remat(FFNBlock, (2,))
    if c.share_layers == "all":
      shared = layer_cls(c, name="layer_shared")
      layers = [shared] * c.num_layers
    elif c.share_layers == "attention":
      attn = attn_cls(c, name="shared_attention")
      ffns = [ffn_cls(c, name=f"layer_{i}") for i in range(c.num_layers)]
      layers = [functools.partial(_two_blocks, attn, ffn) for ffn in ffns]
    elif c.share_layers == "ffn":
      ffn = ffn_cls(c, name="shared_ffn")
      attns = [attn_cls(c, name=f"layer_{i}") for i in range(c.num_layers)]
      layers = [functools.partial(_two_blocks, attn, ffn) for attn in attns]
    else:
      layers = [layer_cls(c, i, name=f"layer_{i}") for i in range(c.num_layers)]
    # RoPE reads each token's position ([B, T], per instance when packed; None: 0..T-1).
    rope = (position_ids,) if c.position_embedding == "rope" else ()
    hidden_states = [x]
    for layer in layers:
      x = layer(x, attention_ids, deterministic, block_diagonal, *rope)
      hidden_states.append(x)
    if c.prenorm:   # pre-norm's final norm (hidden_states keep the layers' outputs, as HF's)
      x = _layer_norm(c, "final_norm")(x).astype(c.dtype)
    return x, tuple(hidden_states)


def _two_blocks(attn, ffn, x, attention_ids, deterministic, block_diagonal):
  return ffn(attn(x, attention_ids, deterministic, block_diagonal), deterministic)


class BertModel(nn.Module):
  """The encoder body: embeddings, L layers, pooler (tanh dense on [CLS]; DistilBERT has none:
  pooled_output None, cls_output the [CLS] hidden state).

  Unpacked rows: (input_ids, input_mask, segment_ids) [B, T]; pooled_output [B, H] from
  position 0. Packed rows (data_pipelines/records/packing.py) add instance_ids [B, T] (0 = padding,
  attention within an instance only), position_ids [B, T] (restarting per instance) and
  cls_positions [B, K] (each instance's [CLS]); pooled_output is then [B, K, H].
  """
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = BertEmbeddings(c)
    self.encoder = BertEncoder(c)
    if c.has_pooler:
      self.pooler = _dense(c, c.hidden_size, ("embed", "embed2"), None)

  def __call__(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
               position_ids=None, cls_positions=None, deterministic=True,
               output_hidden_states=False) -> dict:
    packed = instance_ids is not None
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)  # [B, T, H]
    # Attention ids in the contract of an attention backend: segment-ids style, 0 = padding.
    # A packed row holds at most K instances, K = cls_positions' width (data_pipelines/records/packing.py):
    # the bound cuDNN's packed attention sizes its per-instance bookkeeping by (attention.py).
    block_diagonal = cls_positions.shape[1] if packed and cls_positions is not None else packed
    x, hidden_states = self.encoder(x, instance_ids if packed else input_mask, deterministic,
                                    block_diagonal, position_ids)
    cls = x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)
    pooled = (jnp.tanh(self.pooler(cls))                     # [B, H] or [B, K, H] from [CLS]
              if self.config.has_pooler else None)           # DistilBERT: no pooler
    # cls_output: the [CLS] hidden state before any pooler (what a DistilBERT classifier reads,
    # as ELECTRA's body gives it; bert_jax/models/heads.py).
    out = {"sequence_output": x, "pooled_output": pooled, "cls_output": cls}
    if output_hidden_states:
      out["hidden_states"] = hidden_states                                # L+1 x [B, T, H]
    return out


# ----------------------------------------------------------------------------------------------
# Shared with the heads (pretraining_heads.py, heads.py); parameter counts and init.
# ----------------------------------------------------------------------------------------------
def gather_positions(x, positions):
  """[B, T, H], [B, P] int -> [B, P, H]: the hidden states at the masked positions."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


# What a packed row (data_pipelines/records/packing.py) adds that the encoder reads, in pre-training and
# fine-tuning alike: each token's instance, its position within it, each instance's [CLS].
PACKED_ROW_KEYS = ("instance_ids", "position_ids", "cls_positions")


def count_params(params) -> int:
  """Number of scalars in a (boxed or plain, concrete or abstract) param tree."""
  leaves = jax.tree.leaves(nn.meta.unbox(params))
  return int(sum(math.prod(x.shape) for x in leaves))

