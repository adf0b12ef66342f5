"""The feed-forward and norm layers of a modern encoder (ModernBERT, NeoBERT), as flax modules.

  GatedFeedForward   GeGLU (ModernBERT) / SwiGLU (NeoBERT): Wo(act(x Wi[:, :I]) * x Wi[:, I:])
  norm(...)          LayerNorm without bias (ModernBERT) or RMSNorm (NeoBERT), float32 statistics
  layer_attention    which layers are global, which local, and their RoPE theta (ModernBERT)

Parameter trees, against the PyTorch checkpoints (kernels are the transposed torch weights):

  ours                        transformers ModernBertMLP      NeoBERT (xformers SwiGLU)
  mlp/Wi/kernel [H, 2I]       mlp.Wi.weight [2I, H]           ffn.w12.weight [2I, H]
  mlp/Wo/kernel [I, H]        mlp.Wo.weight [H, I]            ffn.w3.weight  [H, I]
  (no biases: mlp_bias=False in both; use_bias=True adds Wi/bias [2I], Wo/bias [H])
  <norm>/scale [H]            *_norm.weight [H]               *_norm.weight [H]

Both split Wi's output in two halves and put the activation on the FIRST: ModernBertMLP's
`input, gate = Wi(x).chunk(2)` -> act(input) * gate; NeoBERT's SwiGLU chunks w12's output the same
way, silu(first) * second. ModernBERT-base: H = 768, I = 1,152 (Wi [768, 2,304]); NeoBERT: its
config's intermediate_size 3,072 becomes I = 8 ceil((2 x 3,072 / 3) / 8) = 2,048 (the
Llama-style 2/3 so that a gated FFN costs what a plain 4H one does): `swiglu_width`.
"""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bert_jax_core import errors

# The activation on the first half of Wi's output. "gelu" is transformers' ACT2FN["gelu"]
# (exact, erf), ModernBERT's hidden_activation; "silu" (= swish) is SwiGLU's.
GLU_ACTIVATIONS = {
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "silu": jax.nn.silu,
}
NORMS = ("layer_norm", "layer_norm_no_bias", "rms_norm")


class ModernLayerError(errors.UserError):
  """A feed-forward or norm setting these layers do not have."""


def _truncated_normal(stddev=0.02):
  return nn.initializers.truncated_normal(stddev)


class GatedFeedForward(nn.Module):
  """x [B, T, H] -> [B, T, H]: Wo(dropout(act(a) * g)) with [a, g] = x Wi (each [B, T, I]).

  activation: "gelu" (GeGLU, ModernBERT) or "silu" (SwiGLU, NeoBERT); see GLU_ACTIVATIONS.
  names: the two Dense modules' names, ("Wi", "Wo") as transformers' ModernBertMLP (a NeoBERT
  converter maps ffn.w12 / ffn.w3 onto them). Kernels carry the logical axes ("embed", "mlp")
  and ("mlp", "embed"), as model.py's feed-forward, so the sharding rules split them alike.
  """
  hidden_size: int
  intermediate_size: int
  activation: str = "gelu"
  use_bias: bool = False
  dropout_rate: float = 0.0
  dtype: jnp.dtype = jnp.float32
  param_dtype: jnp.dtype = jnp.float32
  kernel_init: nn.initializers.Initializer = _truncated_normal()
  names: tuple = ("Wi", "Wo")
  dot_general_cls: object = None   # bert_jax/layers/fp8.py's FP8 matmul under config.fp8 (None: plain)

  @nn.compact
  def __call__(self, x, deterministic=True):
    if self.activation not in GLU_ACTIVATIONS:
      raise ModernLayerError(f"feed-forward activation={self.activation!r}: use one of "
                             f"{', '.join(GLU_ACTIVATIONS)} (gelu: GeGLU, ModernBERT; silu: "
                             "SwiGLU, NeoBERT).")

    def dense(features, axes, name):
      return nn.Dense(features, use_bias=self.use_bias, dtype=self.dtype,
                      param_dtype=self.param_dtype,
                      kernel_init=nn.with_logical_partitioning(self.kernel_init, axes),
                      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                             axes[1:]),
                      dot_general_cls=self.dot_general_cls, name=name)

    wi, wo = self.names
    y = dense(2 * self.intermediate_size, ("embed", "mlp"), wi)(x)       # [B, T, 2I]
    a, g = jnp.split(y, 2, axis=-1)                                       # [B, T, I] each
    y = GLU_ACTIVATIONS[self.activation](a) * g
    y = nn.with_logical_constraint(
        y, ("activation_batch", "activation_length", "activation_mlp"))
    y = nn.Dropout(self.dropout_rate)(y, deterministic=deterministic)
    return dense(self.hidden_size, ("mlp", "embed"), wo)(y)              # [B, T, H]


def swiglu_width(intermediate_size, multiple_of=8):
  """NeoBERT's SwiGLU width from its config's intermediate_size: 2/3 of it, rounded up to a
  multiple of 8 (3,072 -> 2,048)."""
  return multiple_of * math.ceil(int(2 * intermediate_size / 3) / multiple_of)


def norm(kind, *, eps, name, param_dtype=jnp.float32):
  """A norm over the last axis [.., H], statistics and output in float32 (callers cast back,
  as model.py's LayerNorm), parameters with the logical axis ("norm",).

  kind: "layer_norm" (scale and bias: BERT), "layer_norm_no_bias" (ModernBERT: norm_bias=False,
  eps 1e-5), "rms_norm" (NeoBERT: x / sqrt(mean(x^2) + eps) * scale, torch.nn.RMSNorm, eps 1e-5
  in its released config).
  """
  ones = nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",))
  if kind == "rms_norm":
    return nn.RMSNorm(epsilon=eps, dtype=jnp.float32, param_dtype=param_dtype, scale_init=ones,
                      name=name)
  if kind in ("layer_norm", "layer_norm_no_bias"):
    return nn.LayerNorm(epsilon=eps, dtype=jnp.float32, param_dtype=param_dtype,
                        use_bias=kind == "layer_norm", scale_init=ones,
                        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                               ("norm",)),
                        name=name)
  raise ModernLayerError(f"norm={kind!r}: use one of {', '.join(NORMS)}.")


def layer_attention(layer, *, global_every, window, global_theta, local_theta):
  """(window or None, rope theta) of encoder layer `layer` (0-based).

  ModernBERT (transformers' ModernBertConfig.layer_types): layer i is global when
  i % global_attn_every_n_layers == 0 (every 3rd: 0, 3, 6, ...; 8 of 22 in base), with
  global_rope_theta; the others are local, window = local_attention (128), local_rope_theta.
  global_every=1: every layer global (NeoBERT).
  """
  if global_every < 1:
    raise ModernLayerError(f"global_attn_every_n_layers={global_every}: must be >= 1 (1: every "
                           "layer global; ModernBERT: 3).")
  if layer % global_every == 0:
    return None, global_theta
  return window, local_theta
