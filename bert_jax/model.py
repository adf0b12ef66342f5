"""BERT (Devlin et al., 2018) in Flax linen: config, embeddings, encoder, pooler, MLM/NSP heads.

Reads top to bottom: BertConfig and the presets, then the modules from the bottom of the network
(embeddings) to the top (MLM/NSP heads). Numerics follow google-research/bert `modeling.py`:
post-LayerNorm layers, LayerNorm epsilon 1e-12, truncated-normal(0.02) init. GELU defaults to the
exact erf form, as HF transformers' "gelu"; google's modeling.py `gelu()` is the tanh
approximation ("gelu_tanh" here; the two differ by up to 4.7e-4 per activation).

Einsum letters used throughout:
  B batch, T query position, S key position, P masked position, N heads, D head dim (kv),
  H hidden (embed), V vocabulary.

Parameter tree of BertForPreTraining (fine-tuning loads `params["bert"]` only):
  bert/embeddings/{word_embeddings,position_embeddings,token_type_embeddings}/embedding, layer_norm
  bert/encoder/layer_{i}/attention/{query,key,value,output}/{kernel,bias}, attention_layer_norm,
                         intermediate/{kernel,bias}, output/{kernel,bias}, output_layer_norm
  bert/pooler/{kernel,bias}
  mlm_head/{transform/{kernel,bias}, transform_layer_norm, output_bias}    (decoder tied to words)
  nsp_head/{kernel,bias}

Every parameter carries logical axis names and activations carry logical constraints; the rules
table in `bert_jax/sharding.py` maps them to mesh axes (they are no-ops outside a mesh).
"""

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn
import optax

from bert_jax import attention as attention_lib

ACTIVATIONS = ("gelu", "gelu_tanh", "relu")


# ----------------------------------------------------------------------------------------------
# Config.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class BertConfig:
  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  hidden_dropout_prob: float = 0.1
  attention_dropout_prob: float = 0.1
  hidden_act: str = "gelu"          # exact erf GELU (HF "gelu"); "gelu_tanh" = google's tanh form
  initializer_range: float = 0.02   # truncated normal stddev (cut at 2 stddev), as google's BERT
  layer_norm_eps: float = 1e-12
  dtype: str = "float32"            # compute dtype; "bfloat16" for mixed precision
  param_dtype: str = "float32"      # parameters (and so optimizer state) stay float32
  remat: bool = False               # rematerialise each layer (jax.checkpoint) to save memory
  # Attention kernel: auto|xla|cudnn|pallas_gpu|splash (bert_jax/attention.py). How the model
  # runs, not what it is: left out of to_dict(), so checkpoints never pin a kernel.
  attention: str = "xla"

  def __post_init__(self):
    if self.hidden_size % self.num_heads:
      raise ValueError(f"BertConfig: hidden_size={self.hidden_size} is not divisible by "
                       f"num_heads={self.num_heads}; pick heads so that H/heads is whole.")
    if self.hidden_act not in ACTIVATIONS:
      raise ValueError(f"BertConfig: hidden_act={self.hidden_act!r} is not one of "
                       f"{ACTIVATIONS}.")
    for f in ("dtype", "param_dtype"):
      if getattr(self, f) not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"BertConfig: {f}={getattr(self, f)!r}; use 'float32' or 'bfloat16'.")
    if self.attention not in attention_lib.BACKENDS:
      raise ValueError(f"BertConfig: attention={self.attention!r} is not one of "
                       f"{attention_lib.BACKENDS}.")

  @property
  def head_dim(self):
    return self.hidden_size // self.num_heads

  def to_dict(self) -> dict:
    """The model's identity (what checkpoints store and resuming compares); no kernel choice."""
    d = dataclasses.asdict(self)
    del d["attention"]
    return d

  @classmethod
  def from_dict(cls, d) -> "BertConfig":
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
      raise ValueError(f"BertConfig.from_dict: unknown keys {unknown}; known keys are "
                       f"{sorted(known)}.")
    return cls(**dict(d))


def _miniatures():
  # The 24 BERT miniatures (Turc et al., 2019): L layers, H hidden, H/64 heads, 4H FFN.
  return {f"L-{l}_H-{h}": dict(num_layers=l, hidden_size=h, num_heads=h // 64,
                               intermediate_size=4 * h)
          for l in (2, 4, 6, 8, 10, 12) for h in (128, 256, 512, 768)}


PRESETS = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, intermediate_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, intermediate_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
    **_miniatures(),
}


def get_bert_config(name: str, **overrides) -> BertConfig:
  """A preset by name ("base", "large", "tiny", ..., "L-4_H-256"), with field overrides."""
  if name not in PRESETS:
    raise ValueError(f"Unknown BERT model {name!r}; known: {', '.join(PRESETS)}.")
  return BertConfig(**{**PRESETS[name], **overrides})


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


def _dense(config, features, names, name, dtype=None):
  """Dense with kernel [in, out] named `names` and bias named names[1:]."""
  return nn.Dense(features, dtype=dtype or config.dtype, param_dtype=config.param_dtype,
                  kernel_init=_init(config, names), bias_init=_zeros(names[1:]), name=name)


def _layer_norm(config, name):
  # Statistics and normalisation in float32 even under bfloat16 compute; callers cast back.
  return nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=jnp.float32,
                      param_dtype=config.param_dtype,
                      scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                              ("norm",)),
                      bias_init=_zeros(("norm",)), name=name)


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
    kernel = self.param("kernel", _init(c, self.kernel_axes), self.kernel_shape, c.param_dtype)
    bias = self.param("bias", _zeros(self.bias_axes), self.bias_shape, c.param_dtype)
    x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=c.dtype)
    return jnp.einsum(self.equation, x, kernel) + bias


BTH = ("activation_batch", "activation_length", "activation_embed")
BTND = ("activation_batch", "activation_length", "activation_heads", "activation_kv")


class BertEmbeddings(nn.Module):
  """word + learned position + token type (segment) embeddings, LayerNorm, dropout."""
  config: BertConfig

  def setup(self):
    c = self.config
    # The lookups run in float32 (a gather, cheap) so the sum and LayerNorm are float32.
    embed = lambda n, names: nn.Embed(n, c.hidden_size, dtype=jnp.float32,
                                      param_dtype=c.param_dtype,
                                      embedding_init=_init(c, names))
    self.word_embeddings = embed(c.vocab_size, ("vocab", "embed"))
    self.position_embeddings = embed(c.max_position_embeddings, ("pos", "embed"))
    self.token_type_embeddings = embed(c.type_vocab_size, ("type", "embed"))
    self.layer_norm = _layer_norm(c, None)
    self.dropout = nn.Dropout(c.hidden_dropout_prob)

  def __call__(self, input_ids, segment_ids, deterministic, position_ids=None):
    seq_len = input_ids.shape[1]
    if seq_len > self.config.max_position_embeddings:
      raise ValueError(f"BertEmbeddings: sequence length {seq_len} exceeds "
                       f"max_position_embeddings={self.config.max_position_embeddings}.")
    # Packed rows restart positions at each instance ([B, T]); unpacked rows count 0..T-1.
    positions = (self.position_embeddings(jnp.arange(seq_len))[None]    # [1, T, H]
                 if position_ids is None else self.position_embeddings(position_ids))  # [B, T, H]
    x = (self.word_embeddings(input_ids)                                 # [B, T, H]
         + positions
         + self.token_type_embeddings(segment_ids))                      # [B, T, H]
    x = self.layer_norm(x).astype(self.config.dtype)
    x = self.dropout(x, deterministic=deterministic)
    return _constrain(x, *BTH)


# Which keys each query sees, from segment-ids-style ids [B, T] (0 = padding): a key padding mask
# for unpacked rows, block-diagonal for packed ones (see bert_jax/attention.py).
attention_mask = attention_lib.attention_mask


class SelfAttention(nn.Module):
  """Multi-head self-attention over keys with the same id (see `attention_mask`)."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False):
    c = self.config
    n, d = c.num_heads, c.head_dim
    qkv = lambda name: _HeadsDense(c, "BTH,HND->BTND", (c.hidden_size, n, d),
                                   ("embed", "heads", "kv"), (n, d), ("heads", "kv"), name=name)
    q = _constrain(qkv("query")(x), *BTND)   # [B, T, N, D]
    k = _constrain(qkv("key")(x), *BTND)     # [B, S, N, D]
    v = _constrain(qkv("value")(x), *BTND)   # [B, S, N, D]

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
                                             seq_len=x.shape[1], dropout=dropout).backend
    ctx = attention_lib.dot_product_attention(
        q, k, v, attention_ids, packed=block_diagonal, backend=backend, dropout_rate=dropout,
        dropout_rng=self.make_rng("dropout") if dropout > 0 else None,
        deterministic=deterministic)                                      # [B, T, N, D]
    ctx = _constrain(ctx, *BTND)
    out = _HeadsDense(c, "BTND,NDH->BTH", (n, d, c.hidden_size), ("heads", "kv", "embed"),
                      (c.hidden_size,), ("embed",), name="output")(ctx)
    return _constrain(out, *BTH)


class BertLayer(nn.Module):
  """Post-LN transformer layer: x = LN(x + Attn(x)); x = LN(x + FFN(x))."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False):
    c = self.config
    dropout = nn.Dropout(c.hidden_dropout_prob)
    y = SelfAttention(c, name="attention")(x, attention_ids, deterministic, block_diagonal)
    y = dropout(y, deterministic=deterministic)
    x = _layer_norm(c, "attention_layer_norm")(x + y).astype(c.dtype)     # [B, T, H]

    y = _dense(c, c.intermediate_size, ("embed", "mlp"), "intermediate")(x)
    y = _constrain(_activation(c.hidden_act)(y),
                   "activation_batch", "activation_length", "activation_mlp")  # [B, T, I]
    y = _dense(c, c.hidden_size, ("mlp", "embed"), "output")(y)          # [B, T, H]
    y = dropout(y, deterministic=deterministic)
    x = _layer_norm(c, "output_layer_norm")(x + y).astype(c.dtype)
    return _constrain(x, *BTH)


class BertEncoder(nn.Module):
  config: BertConfig

  @nn.compact
  def __call__(self, x, attention_ids, deterministic, block_diagonal=False):
    c = self.config
    # static_argnums counts `self` as 0: (x=1, attention_ids=2, deterministic=3,
    # block_diagonal=4). Static flags keep the Python `if`s legal inside jax.checkpoint.
    layer_cls = nn.remat(BertLayer, static_argnums=(3, 4)) if c.remat else BertLayer
    hidden_states = [x]
    for i in range(c.num_layers):
      x = layer_cls(c, name=f"layer_{i}")(x, attention_ids, deterministic, block_diagonal)
      hidden_states.append(x)
    return x, tuple(hidden_states)


class BertModel(nn.Module):
  """The encoder body: embeddings, L layers, pooler (tanh dense on [CLS]).

  Unpacked rows: (input_ids, input_mask, segment_ids) [B, T]; pooled_output [B, H] from
  position 0. Packed rows (data_pipelines/packing.py) add instance_ids [B, T] (0 = padding,
  attention within an instance only), position_ids [B, T] (restarting per instance) and
  cls_positions [B, K] (each instance's [CLS]); pooled_output is then [B, K, H].
  """
  config: BertConfig

  def setup(self):
    c = self.config
    self.embeddings = BertEmbeddings(c)
    self.encoder = BertEncoder(c)
    self.pooler = _dense(c, c.hidden_size, ("embed", "embed2"), None)

  def __call__(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
               position_ids=None, cls_positions=None, deterministic=True,
               output_hidden_states=False) -> dict:
    packed = instance_ids is not None
    x = self.embeddings(input_ids, segment_ids, deterministic, position_ids)  # [B, T, H]
    # Attention ids in the contract of an attention backend: segment-ids style, 0 = padding.
    x, hidden_states = self.encoder(x, instance_ids if packed else input_mask, deterministic,
                                    packed)
    cls = x[:, 0] if cls_positions is None else gather_positions(x, cls_positions)
    pooled = jnp.tanh(self.pooler(cls))                      # [B, H] or [B, K, H] from [CLS]
    out = {"sequence_output": x, "pooled_output": pooled}
    if output_hidden_states:
      out["hidden_states"] = hidden_states                                # L+1 x [B, T, H]
    return out


# ----------------------------------------------------------------------------------------------
# Pre-training heads.
# ----------------------------------------------------------------------------------------------
def gather_positions(x, positions):
  """[B, T, H], [B, P] int -> [B, P, H]: the hidden states at the masked positions."""
  return jnp.take_along_axis(x, positions[..., None].astype(jnp.int32), axis=1)


class MaskedLMHead(nn.Module):
  """dense(H) + act + LayerNorm, then logits against the (tied) word embeddings + bias [V]."""
  config: BertConfig

  @nn.compact
  def __call__(self, x, word_embeddings):
    c = self.config
    x = _dense(c, c.hidden_size, ("embed", "embed2"), "transform")(x)    # [B, P, H]
    x = _activation(c.hidden_act)(x)
    x = _layer_norm(c, "transform_layer_norm")(x).astype(c.dtype)
    # The vocabulary projection is the largest matmul of the heads (H x 30522): bf16 inputs,
    # float32 accumulation and float32 logits for the loss.
    logits = jnp.einsum("BPH,VH->BPV", x, word_embeddings.astype(c.dtype),
                        preferred_element_type=jnp.float32)
    bias = self.param("output_bias", _zeros(("vocab",)), (c.vocab_size,), c.param_dtype)
    logits = logits + bias.astype(jnp.float32)
    return _constrain(logits, "activation_batch", "activation_length", "activation_vocab")


class BertForPreTraining(nn.Module):
  """BertModel + MLM head (only at masked_lm_positions) + NSP head (on the pooled output).

  Packed rows (instance_ids, position_ids, nsp_positions [B, K] given) get one NSP prediction
  per instance, read at its own [CLS]: nsp_logits [B, K, 2] instead of [B, 2].
  """
  config: BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
               instance_ids=None, position_ids=None, nsp_positions=None, deterministic=True):
    c = self.config
    bert = BertModel(c, name="bert")
    out = bert(input_ids, input_mask, segment_ids, instance_ids=instance_ids,
               position_ids=position_ids, cls_positions=nsp_positions,
               deterministic=deterministic)
    # Gather first: [B, P, H] with P = max_predictions_per_seq (20 for T=128), so the
    # H x V projection runs on ~15% of the positions instead of all T.
    masked = gather_positions(out["sequence_output"], masked_lm_positions)
    table = bert.embeddings.word_embeddings.embedding                     # [V, H], tied
    mlm_logits = MaskedLMHead(c, name="mlm_head")(masked, table)         # [B, P, V] float32
    nsp_logits = _dense(c, 2, ("embed", "classes"), "nsp_head", dtype=jnp.float32)(
        out["pooled_output"])                                    # [B, 2] or [B, K, 2] float32
    return mlm_logits, nsp_logits


def pretraining_loss(outputs, batch):
  """google-research/bert's loss, weighted MLM cross-entropy + NSP cross-entropy, packed or not.

  outputs: (mlm_logits [B, P, V], nsp_logits [B, 2] or packed [B, K, 2]) float32. The NSP loss and
  accuracy are means over instances: over rows unpacked, over the nsp_weights [B, K] of packed
  rows (a row of 5 instances counts 5 times), so packing changes neither.
  Returns (loss, metrics dict).
  """
  mlm_logits, nsp_logits = outputs
  weights = batch["masked_lm_weights"]                                   # [B, P]
  mlm_ce = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  # 1e-5 as in the original: a batch with no predictions gives 0, not NaN.
  mlm_loss = jnp.sum(mlm_ce * weights) / (jnp.sum(weights) + 1e-5)
  labels = batch["next_sentence_labels"]                                 # [B] or [B, K]
  nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits, labels)
  nsp_correct = (jnp.argmax(nsp_logits, -1) == labels).astype(jnp.float32)
  if "nsp_weights" in batch:
    nsp_w = batch["nsp_weights"]                                         # [B, K]
    nsp_loss = jnp.sum(nsp_ce * nsp_w) / jnp.maximum(jnp.sum(nsp_w), 1.0)
    nsp_accuracy = jnp.sum(nsp_correct * nsp_w) / jnp.maximum(jnp.sum(nsp_w), 1.0)
  else:
    nsp_loss, nsp_accuracy = jnp.mean(nsp_ce), jnp.mean(nsp_correct)
  mlm_correct = (jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights
  metrics = dict(
      loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
      mlm_accuracy=jnp.sum(mlm_correct) / (jnp.sum(weights) + 1e-5), nsp_accuracy=nsp_accuracy)
  return mlm_loss + nsp_loss, metrics


def pretraining_forward(module, batch, deterministic):
  """BertForPreTraining on a batch dict, packed or unpacked (use as `apply(..., method=)`)."""
  packed = {k: batch[k] for k in ("instance_ids", "position_ids", "nsp_positions") if k in batch}
  return module(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                batch["masked_lm_positions"], deterministic=deterministic, **packed)


def count_params(params) -> int:
  """Number of scalars in a (boxed or plain, concrete or abstract) param tree."""
  leaves = jax.tree.leaves(nn.meta.unbox(params))
  return int(sum(math.prod(x.shape) for x in leaves))


def init_params(config: BertConfig, rng, seq_len=8, num_predictions=2, model_cls=None) -> Any:
  """Boxed (LogicallyPartitioned) params of `model_cls` (default BertForPreTraining)."""
  model = (model_cls or BertForPreTraining)(config)
  ids = jnp.zeros((1, seq_len), jnp.int32)
  args = (ids, jnp.ones_like(ids), ids)
  if model_cls in (None, BertForPreTraining):
    args += (jnp.zeros((1, num_predictions), jnp.int32),)
  return model.init(rng, *args)["params"]
