"""FP8 matmuls for the encoder's dense einsums (config.model.fp8; issue 38), with delayed scaling.

  --config.model.fp8=True     # QKV, attention output, FFN in and out (BERT, ELECTRA, ModernBERT)

What runs: flax's FP8 ops (flax.linen.fp8_ops, the recipe MaxText's fp8 quantization and
Transformer Engine use). Each of those matmuls quantises its input and kernel to e4m3 and its
output's cotangent to e5m2, each by a scale from the largest |value| ("amax") of the last
AMAX_HISTORY steps (delayed scaling: the scale a step uses comes from the steps before it, so
nothing waits on a reduction over the tensor being quantised). On Hopper XLA rewrites the
quantise-dot-dequantise pattern into one cuBLASLt FP8 GEMM; on CPU it runs the same maths on
upcast values (the tests' emulation: the numerics, not the speed). Everything else (embeddings,
attention's QK^T and PV, the heads, LayerNorm, the optimizer) stays as it was (bf16 compute,
float32 parameters).

Where the scales live: the collection `COLLECTION` ("_overwrite_with_gradient", flax's name),
beside "params", one entry per FP8 op:
  .../attention/query/fp8/{input,kernel,output_grad}_{scale [1], amax_history [AMAX_HISTORY]}
The parameter tree is the same with and without FP8, so a checkpoint written with FP8 loads,
fine-tunes and exports as any other (the converters read "params" only).

The train state carries them as state["fp8"] (trainer_lib.build_steps: only when the model
made the collection). Their "gradient" is their next value (the custom VJPs of fp8_ops return
the updated history and scale): they are overwritten with it, never given to the optimizer, as
flax's TrainState.apply_gradients does with this collection (and MaxText through it). Inside a
step they travel as fp8_ops.fp32_max_grad, whose gradient accumulation is a maximum, not a sum:
an op applied several times (ALBERT's shared layers) or over several micro-batches keeps the
largest amax rather than adding them up; `combine` does the same across micro-batches.

Evaluation and export: applied without the collection (model.apply({"params": p}), as every
eval step, the predictors and the converters do), the same modules compute in the model's dtype
(bf16): the numerics of the exported model, which carries no scales. Only the training step
passes the scales (trainer_lib.train_step).
"""

import jax
import jax.numpy as jnp
from flax.linen import fp8_ops

COLLECTION = fp8_ops.OVERWRITE_WITH_GRADIENT


def startup_note(model_config, platform_name):
  """The start-up line's words for FP8 matmuls ("" without them): what runs, and where the chip
  cannot make it pay. TPU v5p has no FP8 matrix units: its plan for BERT-large/512 on v5p-32
  estimates the step 5% slower than bf16 (0.1301 s vs 0.1240 s, docs/planning.md, 2026-11-27)."""
  if not getattr(model_config, "fp8", False):
    return ""
  note = "matmuls: FP8 (e4m3, e5m2 gradients, delayed scaling) in the encoder's dense layers"
  if platform_name == "tpu":
    note += (" (this TPU has no FP8 matrix units: XLA casts around each matmul, the v5p plan "
             "estimates 5% slower than bf16; --config.model.fp8=False)")
  elif platform_name == "cpu":
    note += " (emulated by XLA on the CPU: the numerics, not the speed)"
  return note
# Steps of amax history a scale is taken from (the max over them): flax's and MaxText's default.
AMAX_HISTORY = 1024


def _has_scales(module):
  """True where this op's scales are given (init makes them; training passes them)."""
  return module.is_initializing() or module.has_variable(COLLECTION, "input_scale")


class Einsum(fp8_ops.Fp8Einsum):
  """jnp.einsum(eqn, x, kernel) in FP8 (flax's Fp8Einsum) when the scales are given, else in the
  operands' dtype (evaluation, export: see the module docstring). kernel: the weight, already
  cast to the compute dtype."""
  amax_history_length: int = AMAX_HISTORY

  def setup(self):
    if _has_scales(self):
      super().setup()

  def __call__(self, eqn, lhs, rhs, precision=None, preferred_element_type=None):
    if not _has_scales(self):
      return jnp.einsum(eqn, lhs, rhs, precision=precision,
                        preferred_element_type=preferred_element_type)
    return super().__call__(eqn, lhs, rhs, precision, preferred_element_type)


class DotGeneral(fp8_ops.Fp8DirectDotGeneralOp):
  """nn.Dense's dot_general_cls: lax.dot_general in FP8 when the scales are given, else plain."""
  amax_history_length: int = AMAX_HISTORY

  def setup(self):
    if _has_scales(self):
      super().setup()

  def __call__(self, lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
    if not _has_scales(self):
      return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision=precision,
                                 preferred_element_type=preferred_element_type)
    return super().__call__(lhs, rhs, dimension_numbers)


def dot_general_cls(config):
  """nn.Dense(dot_general_cls=...) for a dense of the encoder: DotGeneral under config.fp8."""
  if not getattr(config, "fp8", False):
    return None
  return lambda: DotGeneral(name="fp8")


# ----------------------------------------------------------------------------------------------
# The scales in the train state (trainer_lib).
# ----------------------------------------------------------------------------------------------
def to_max_grad(scales):
  """float32 scales -> fp32_max_grad (gradients accumulate by max) for one step's apply."""
  return jax.tree.map(lambda x: jax.lax.convert_element_type(x, fp8_ops.fp32_max_grad), scales)


def from_max_grad(scales):
  """The scales' gradient (their next value) back to float32, as the state stores them."""
  return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.float32), scales)


def combine(a, b):
  """Two micro-batches' next scales -> one: the larger amax and scale (see the docstring)."""
  return jax.tree.map(jnp.maximum, a, b)


def variables(params, scales):
  """The variables a training apply takes: params, plus the scales when FP8 is on."""
  return {"params": params} if scales is None else {"params": params,
                                                    COLLECTION: to_max_grad(scales)}


def count_ops(scales):
  """How many FP8 matmuls a model has (entries holding an input_scale)."""
  flat = jax.tree_util.tree_flatten_with_path(scales)[0]
  return sum(1 for path, _ in flat if getattr(path[-1], "key", None) == "input_scale")
