"""The encoder's epilogues in formulations XLA fuses (issue 38), each behind a switch of its own.

  config.model.fused_bias_gelu=True       FFN: dense + bias + tanh GELU as XLA's GEMM rewriter
                                          matches it for a cuBLASLt BIAS+GELU epilogue
  config.model.fused_residual_norm=True   LN(x + dropout(y)) with a hand-written backward

Both are how the step runs, not what the model is (the same parameters, left out of to_dict()),
and each equals the path it replaces to bf16 tolerance, forward and gradients
(tests/bert_jax/layers/fused_ops_test.py). Whether the chip runs them as one kernel is for the profile's kernel
list to say (benchmarks/gpu_ab.sh), not this file.

bias + GELU. cuBLASLt's epilogues have the tanh approximation of GELU only
(CUBLASLT_EPILOGUE_GELU_BIAS: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))), and XLA's GPU GEMM
rewriter fuses a dot, a bias add and that expression, in the dot's output type, into one
cuBLASLt call (with --xla_gpu_enable_cublaslt=true: gpu_ab.sh's variant sets it). BERT's presets
use the exact erf GELU (hidden_act="gelu", HF's "gelu"), which no epilogue computes: the switch
requires hidden_act="gelu_tanh" (google-research/bert's own gelu(); it differs from erf by up to
4.7e-4 per activation), so changing the recipe is the user's explicit choice, never a side
effect. `gelu_tanh` writes the expression out in the compute dtype, in the rewriter's order, so a
change in jax.nn.gelu's implementation (an upcast, a reordering) cannot undo the match.

residual + LayerNorm. Post-LN BERT's LN(x + dropout(y)): the dropout's select and the residual
add are elementwise producers XLA fuses into the norm's reduction; the backward is written out
(`layer_norm` below: custom VJP) as the two row reductions the maths needs,
  dz = rstd * (g' - mean(g') - xhat * mean(g' xhat)),   g' = g * scale,
rather than autodiff's chain through mean, variance and rsqrt (more ops, more live tensors). It
saves z (the compute dtype) and the per-row mean and rstd (float32) for the backward.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

_SQRT_2_OVER_PI = 0.7978845608028654


def gelu_tanh(x):
  """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) in x's dtype: jax.nn.gelu(approximate=True)
  written in the order XLA's GEMM rewriter matches (x^3 as x * x * x)."""
  c = lambda v: jnp.asarray(v, x.dtype)
  inner = c(_SQRT_2_OVER_PI) * (x + c(0.044715) * (x * x * x))
  return x * (c(0.5) * (c(1.0) + jnp.tanh(inner)))


@jax.custom_vjp
def layer_norm(z, scale, bias, eps):
  """LayerNorm of z over its last axis, float32 statistics and output (as model.py's nn.LayerNorm
  with dtype=float32), with the written-out backward."""
  return _layer_norm_fwd(z, scale, bias, eps)[0]


def _stats(z, eps):
  z32 = z.astype(jnp.float32)
  mean = jnp.mean(z32, axis=-1, keepdims=True)                           # [B, T, 1]
  var = jnp.mean(jnp.square(z32 - mean), axis=-1, keepdims=True)
  return z32, mean, jax.lax.rsqrt(var + eps)


def _layer_norm_fwd(z, scale, bias, eps):
  z32, mean, rstd = _stats(z, eps)
  out = (z32 - mean) * rstd * scale.astype(jnp.float32) + bias.astype(jnp.float32)
  return out, (z, mean, rstd, scale, bias, eps)


def _layer_norm_bwd(res, g):
  z, mean, rstd, scale, bias, eps = res
  xhat = (z.astype(jnp.float32) - mean) * rstd                            # [B, T, H]
  g = g.astype(jnp.float32)
  reduce = tuple(range(g.ndim - 1))
  dscale = jnp.sum(g * xhat, axis=reduce).astype(scale.dtype)            # [H]
  dbias = jnp.sum(g, axis=reduce).astype(bias.dtype)
  gs = g * scale.astype(jnp.float32)
  dz = rstd * (gs - jnp.mean(gs, axis=-1, keepdims=True)
               - xhat * jnp.mean(gs * xhat, axis=-1, keepdims=True))
  return dz.astype(z.dtype), dscale, dbias, jnp.zeros_like(eps)


layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class ResidualLayerNorm(nn.Module):
  """LN(x + y) with model.py's LayerNorm parameters (scale, bias: logical axis "norm"), so the
  parameter tree is the same as nn.LayerNorm's; float32 output (callers cast back)."""
  epsilon: float = 1e-12
  param_dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x, y):
    h = x.shape[-1]
    scale = self.param("scale", nn.with_logical_partitioning(nn.initializers.ones_init(),
                                                             ("norm",)), (h,), self.param_dtype)
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(),
                                                           ("norm",)), (h,), self.param_dtype)
    return layer_norm(x + y, scale, bias, jnp.asarray(self.epsilon, jnp.float32))
