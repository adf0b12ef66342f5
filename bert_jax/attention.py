"""Self-attention with one kernel per accelerator, behind one function.

  ctx = dot_product_attention(q, k, v, ids, packed=..., backend="auto", ...)   # [B, T, N, D]

`ids` [B, T] int32 says who may attend to whom: 0 = padding, and tokens with the same non-zero
value may attend to each other. A padded batch passes its `input_mask` (0/1); a packed batch
(several instances per row) passes its per-token instance ids (1, 1, 2, 2, 2, 0, ...).

Backends (`--config.model.attention=...`):
  xla         the einsum path spelt out (the reference, and the CPU default). The only backend
              with dropout on the attention probabilities (BERT's attention_dropout_prob=0.1).
  cudnn       cuDNN flash attention through jax.nn.dot_product_attention(implementation="cudnn").
              Padded rows only: the public API takes per-row lengths (query_seq_lengths /
              key_value_seq_lengths) but no segment ids in JAX 0.10.2. (The private
              jax._src.cudnn API takes q_offsets for packed rows; we keep to public APIs.)
              bfloat16/float16 only, GPU only.
  pallas_gpu  the Pallas (Triton) flash kernel jax.experimental.pallas.ops.gpu.attention.mha,
              which takes segment ids: padded and packed rows. GPU (or CPU interpret mode).
  splash      Pallas splash attention for TPU (jax.experimental.pallas.ops.tpu.splash_attention)
              with SegmentIds: padded and packed rows; T a multiple of 128. TPU (or CPU interpret
              mode, float32 only).
  auto        the fastest of the above that supports the batch's mask on this platform, else xla
              (`select_backend` returns the choice and the reason for the start-up line).

What a padding query sees differs between kernels (xla: every real key of a padded row, nothing in
a packed row; the segment-id kernels: the other padding tokens; cuDNN: nothing) but never reaches a
real token (keys are masked) or the loss (heads read real positions only), so the outputs at real
tokens, the losses and the gradients agree (tests/attention_test.py checks them against xla at
float32 <= 1e-5).
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from bert_jax_core import errors

BACKENDS = ("auto", "xla", "cudnn", "pallas_gpu", "splash")
FUSED = ("cudnn", "pallas_gpu", "splash")
# Where each fused kernel runs natively ("cpu" for the Pallas ones means interpret mode only).
_PLATFORMS = {"cudnn": ("gpu",), "pallas_gpu": ("gpu",), "splash": ("tpu",)}
# Logical axes of q/k/v/ctx in model.py; the sharding rules map them onto the mesh.
BTND = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
# Softmax masking constant of jax.nn.dot_product_attention (replaces masked logits).
_MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)


class AttentionError(errors.UserError):
  """A backend that cannot run this configuration (platform, mask, dtype, dropout, length)."""


class Choice(NamedTuple):
  backend: str   # a concrete backend: xla, cudnn, pallas_gpu or splash
  reason: str    # one phrase for the start-up line


def platform():
  """"cpu", "gpu" or "tpu": the chips of the mesh being traced under (`jax.set_mesh`), else the
  default backend's. From the mesh because a step may be compiled ahead of time for chips this
  host does not have (bert_jax/plan.py compiles for a TPU slice on a CPU host), and "auto" must
  then pick the kernel the slice will run. jax.default_backend() says "cuda"/"rocm" on some
  installs."""
  mesh = jax.sharding.get_abstract_mesh()
  device = None if mesh.empty else getattr(mesh, "abstract_device", None)
  p = device.platform if device is not None else jax.default_backend()
  return "gpu" if p in ("gpu", "cuda", "rocm") else p


# ----------------------------------------------------------------------------------------------
# Choosing a backend (at start-up: every refusal is a one-line error before any compute).
# ----------------------------------------------------------------------------------------------
def unsupported_reason(backend, *, platform_name, packed, dtype, seq_len, dropout,
                       allow_interpret=False):
  """None if `backend` can run this configuration, else why not (one phrase)."""
  dtype = jnp.dtype(dtype)
  if backend == "xla":
    return None
  if dropout > 0:
    return (f"attention_dropout_prob={dropout} in training needs the attention probabilities, "
            f"which the fused {backend} kernel never materialises (use attention=xla, or the "
            "fast preset with attention_dropout_prob=0)")
  native = platform_name in _PLATFORMS[backend]
  interpretable = backend != "cudnn" and platform_name == "cpu" and allow_interpret
  if not (native or interpretable):
    return f"{backend} runs on {'/'.join(_PLATFORMS[backend])}, this is {platform_name}"
  if backend == "cudnn":
    if packed:
      return ("cudnn takes per-row lengths only (no segment ids in jax.nn.dot_product_attention "
              "of JAX 0.10.2), so it cannot keep packed instances apart")
    if dtype not in (jnp.bfloat16, jnp.float16):
      return f"cuDNN flash attention needs bfloat16/float16, the model computes in {dtype}"
  if backend == "splash":
    if seq_len % 128:
      return (f"splash tiles the sequence in blocks of 128 lanes; seq_length={seq_len} is not a "
              "multiple of 128")
    if platform_name == "cpu" and dtype != jnp.float32:
      return "splash in CPU interpret mode computes in float32 only"
  if backend == "pallas_gpu" and (seq_len % _block(seq_len, 128) or seq_len % _block(seq_len, 32)):
    return (f"pallas_gpu tiles the sequence in blocks of 128 (forward) and 32 (backward); "
            f"seq_length={seq_len} is not a multiple of both")
  return None


def select_backend(requested, *, packed, dtype, seq_len, dropout, platform_name=None,
                   allow_interpret=False) -> Choice:
  """The backend to run and why. `dropout` is the attention dropout in force (0 at eval).

  An explicit backend that cannot run is an AttentionError; `auto` falls back and says why.
  """
  if requested not in BACKENDS:
    raise AttentionError(f"config.model.attention={requested!r}: use one of {', '.join(BACKENDS)}.")
  platform_name = platform_name or platform()
  why = functools.partial(unsupported_reason, platform_name=platform_name, packed=packed,
                          dtype=dtype, seq_len=seq_len, dropout=dropout,
                          allow_interpret=allow_interpret)
  if requested != "auto":
    reason = why(requested)
    if reason:
      raise AttentionError(f"config.model.attention={requested}: {reason}.")
    return Choice(requested, "requested")
  # Preference per platform. GPU: cuDNN's flash kernel first for padded rows (NVIDIA's fused
  # kernel; the Pallas/Triton one is the portable fallback), the Pallas kernel for packed rows
  # (segment ids). Not yet ranked by a measurement of ours (no accelerator was available).
  order = {"tpu": ("splash",), "gpu": ("cudnn", "pallas_gpu")}.get(platform_name, ())
  refusals = []
  for backend in order:
    reason = why(backend)
    if reason is None:
      mask = "packed" if packed else "padded"
      return Choice(backend, f"auto: fastest kernel for {mask} rows on {platform_name}")
    refusals.append(reason)
  if not order:
    return Choice("xla", f"auto: no fused kernel on {platform_name}")
  return Choice("xla", "auto fell back: " + "; ".join(refusals))


def startup_line(model_config, *, packed, seq_len, platform_name=None):
  """"attention: <kernel> in training (<why>)[, <kernel> in evaluation (<why>)]" for the log.

  Raises AttentionError (before any compute) if an explicitly requested kernel cannot run.
  platform_name: the chips the step runs on (default: this host's, see `platform`).
  """
  kw = dict(packed=packed, dtype=model_config.dtype, seq_len=seq_len,
            platform_name=platform_name)
  train = select_backend(model_config.attention, dropout=model_config.attention_dropout_prob, **kw)
  evaluation = select_backend(model_config.attention, dropout=0.0, **kw)
  line = f"attention: {train.backend} in training ({train.reason})"
  if evaluation.backend != train.backend:
    line += f", {evaluation.backend} in evaluation ({evaluation.reason})"
  return line


# ----------------------------------------------------------------------------------------------
# The function.
# ----------------------------------------------------------------------------------------------
def dot_product_attention(q, k, v, ids, *, packed, backend="xla", dropout_rate=0.0,
                          dropout_rng=None, deterministic=True, interpret=None):
  """softmax(q k^T / sqrt(D), masked by `ids`) v.  q/k/v [B, T, N, D], ids [B, T] -> [B, T, N, D].

  `backend` must be concrete (resolve "auto" with `select_backend`). Dropout on the attention
  probabilities (rate `dropout_rate`, key `dropout_rng`) runs when not `deterministic`; only
  `xla` has it, and a fused backend asked for it is an AttentionError, never a silent skip.
  `interpret` (default: on CPU) runs the Pallas kernels in interpret mode (for tests).
  """
  dropout = 0.0 if deterministic else float(dropout_rate)
  if backend == "auto":
    raise AttentionError("dot_product_attention: resolve backend='auto' with select_backend() "
                         "first, so the start-up line can say which kernel runs.")
  if backend == "xla":
    return xla_attention(q, k, v, ids, packed=packed, dropout_rate=dropout,
                         dropout_rng=dropout_rng)
  reason = unsupported_reason(backend, platform_name=platform(), packed=packed, dtype=q.dtype,
                              seq_len=q.shape[1], dropout=dropout, allow_interpret=True)
  if reason:
    raise AttentionError(f"attention backend {backend}: {reason}.")
  interpret = platform() == "cpu" if interpret is None else interpret
  kernel = {"cudnn": _cudnn, "pallas_gpu": functools.partial(_pallas_gpu, interpret=interpret),
            "splash": functools.partial(_splash, interpret=interpret)}[backend]
  return _per_shard(kernel, q, k, v, ids)


def attention_mask(ids, packed):
  """Boolean mask broadcastable to [B, N, T, S] (True = may attend).

  Padded: [B, 1, 1, S], the key padding mask (exactly the mask model.py always used).
  Packed: [B, 1, T, S], block diagonal: a real query sees the real keys of its own instance; a
  padding query sees nothing and gets uniform weights (finite, and never read: see the module
  docstring).
  """
  key_real = ids != 0                                                     # [B, S]
  if not packed:
    return key_real[:, None, None, :]
  same = ids[:, :, None] == ids[:, None, :]                               # [B, T, S]
  return (same & key_real[:, None, :])[:, None]


def xla_attention(q, k, v, ids, *, packed, dropout_rate=0.0, dropout_rng=None):
  """The reference path. Without dropout: jax.nn.dot_product_attention's XLA implementation
  (scale 1/sqrt(D), float32 softmax). With dropout: the same maths spelt out, so the
  probabilities can be dropped (as google-research/bert's attention_probs_dropout_prob)."""
  mask = attention_mask(ids, packed)
  if dropout_rate == 0:
    return jax.nn.dot_product_attention(q, k, v, mask=mask)               # [B, T, N, D]
  if dropout_rng is None:
    raise AttentionError("xla attention: dropout_rate > 0 needs a dropout_rng.")
  logits = jnp.einsum("BTND,BSND->BNTS", q, k,
                      preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
  logits = jnp.where(mask, logits, _MASK_VALUE)                           # [B, N, T, S]
  probs = jax.nn.softmax(logits, axis=-1).astype(v.dtype)
  keep_prob = 1.0 - dropout_rate                                          # as flax nn.Dropout
  keep = jax.random.bernoulli(dropout_rng, p=keep_prob, shape=probs.shape)
  probs = jax.lax.select(keep, probs / keep_prob, jnp.zeros_like(probs))
  return jnp.einsum("BNTS,BSND->BTND", probs, v)                         # [B, T, N, D]


# ----------------------------------------------------------------------------------------------
# The fused kernels. Each takes one shard: q/k/v [b, T, n, D], ids [b, T].
# ----------------------------------------------------------------------------------------------
def _block(seq_len, preferred):
  """The kernel's tile along T: `preferred`, or the whole (shorter) sequence."""
  return min(preferred, seq_len)


def _cudnn(q, k, v, ids):
  # BERT rows are right-padded (input_mask = 1...1 0...0), so a row's real tokens are its first
  # `length` tokens and the lengths describe the mask exactly.
  lengths = jnp.sum(ids > 0, axis=1, dtype=jnp.int32)                     # [b]
  return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=lengths,
                                      key_value_seq_lengths=lengths, implementation="cudnn")


def _pallas_gpu(q, k, v, ids, *, interpret):
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  t = q.shape[1]
  # Forward tiles of 128 (the kernel's default), backward tiles of 32 (its default: the dK/dV and
  # dQ kernels hold more live tiles per program).
  fwd, bwd = _block(t, 128), _block(t, 32)
  sizes = gpu_attention.BlockSizes(block_q=fwd, block_k=fwd, block_q_dkv=bwd, block_kv_dkv=bwd,
                                   block_q_dq=bwd, block_kv_dq=bwd)
  return gpu_attention.mha(q, k, v, ids, sm_scale=1.0 / math.sqrt(q.shape[-1]),
                           block_sizes=sizes, interpret=interpret)


def _splash(q, k, v, ids, *, interpret):
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  _, t, n, d = q.shape
  # 512-wide tiles at seq 512 (one tile per row: the whole T x T block per head), 128 otherwise.
  blk = 512 if t % 512 == 0 else 128
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                            block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                            block_kv_dq=blk)
  # The static mask is full (bidirectional); SegmentIds carry padding and packing.
  mask = splash.MultiHeadMask([splash.FullMask((t, t)) for _ in range(n)])
  kernel = splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                  interpret=interpret)
  # Splash does not scale the logits; it takes one example, heads first: [N, T, D].
  to_heads = lambda x: jnp.swapaxes(x, 1, 2)                              # [b, n, T, D]
  q = q * jnp.asarray(1.0 / math.sqrt(d), q.dtype)
  ctx = jax.vmap(lambda q1, k1, v1, i1: kernel(q1, k1, v1, splash.SegmentIds(q=i1, kv=i1)))(
      to_heads(q), to_heads(k), to_heads(v), ids)
  return jnp.swapaxes(ctx, 1, 2)                                          # [b, T, n, D]


def _per_shard(kernel, q, k, v, ids):
  """Runs `kernel` on each device's shard (batch and heads split as the sharding rules say).

  A Pallas or cuDNN call is opaque to XLA's SPMD partitioner, which would otherwise gather the
  whole batch onto every device; shard_map hands each device its own rows and heads.
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return kernel(q, k, v, ids)
  rules = nn.get_logical_axis_rules()
  if not rules:
    from bert_jax.sharding import LOGICAL_AXIS_RULES as rules
  spec = nn.logical_to_mesh_axes(BTND, rules)    # e.g. P(("data", "fsdp"), None, "tensor", None)
  # An axis that does not split evenly stays whole on every device: model.init's dummy batch of
  # one row (traced under the mesh when the state is built, on a TPU slice as in bert_jax/plan.py),
  # or fewer heads than the tensor axis. Training batches always split (sharding.check_batch_size).
  spec = P(*(None if axes is not None and dim % _mesh_size(mesh, axes) else axes
             for dim, axes in zip(q.shape, spec)))
  ids_spec = P(spec[0], spec[1])
  return jax.shard_map(kernel, mesh=mesh, in_specs=(spec, spec, spec, ids_spec), out_specs=spec,
                       check_vma=False)(q, k, v, ids)


def _mesh_size(mesh, axes):
  """Devices along mesh axis name(s) `axes` ("tensor" or ("data", "fsdp"))."""
  axes = (axes,) if isinstance(axes, str) else axes
  return math.prod(mesh.shape[a] for a in axes)
