"""Self-attention with one kernel per accelerator, behind one function.

  ctx = dot_product_attention(q, k, v, ids, packed=..., backend="auto", ...)   # [B, T, N, D]

`ids` [B, T] int32 says who may attend to whom: 0 = padding, and tokens with the same non-zero
value may attend to each other. A padded batch passes its `input_mask` (0/1); a packed batch
(several instances per row) passes its per-token instance ids (1, 1, 2, 2, 2, 0, ...).

Backends (`--config.model.attention=...`):
  xla         the einsum path spelt out (the reference, and the CPU default): dropout on the
              attention probabilities (BERT's attention_dropout_prob=0.1) as google's BERT.
  cudnn       cuDNN flash attention. Padded rows: jax.nn.dot_product_attention(implementation=
              "cudnn") with per-row lengths. Packed rows: the public API has no segment ids
              (JAX 0.10.2-0.11.2), so `_cudnn_packed` calls jax's cuDNN wrapper
              (jax._src.cudnn.fused_attention_stablehlo.dot_product_attention, the one the
              public API calls) with per-instance offsets and lengths (cuDNN's ragged "THD"
              layout; Hopper or newer). bfloat16/float16 only, GPU only. The one fused kernel
              with attention dropout (issue 38): cuDNN drops the probabilities inside the
              kernel (padded and packed rows: the wrapper's dropout_rate; see "Dropout" below).
  pallas_gpu  the Pallas (Triton) flash kernel jax.experimental.pallas.ops.gpu.attention.mha,
              which takes segment ids: padded and packed rows. GPU (or CPU interpret mode).
  splash      Pallas splash attention for TPU (jax.experimental.pallas.ops.tpu.splash_attention)
              with SegmentIds: padded and packed rows; T a multiple of 128. TPU (or CPU interpret
              mode, float32 only).
  auto        the fastest of the above that supports the batch's mask on this platform, else xla
              (`select_backend` returns the choice and the reason for the start-up line).

Sliding-window (local) attention, `window=W` (ModernBERT's local layers, W = 128): each query sees
the keys with |i - j| <= W // 2 (64), on top of the padding/packing mask, exactly as transformers'
ModernBERT (config.sliding_window = local_attention // 2; masking_utils'
sliding_window_bidirectional_overlay: abs(q_idx - kv_idx) <= sliding_window). Instances are
contiguous in a row, so row distance is distance within the instance. Where it runs:
  xla         T > 3 x W/2: `local_attention`, blocked (query blocks of W/2 see 3 key blocks), so
              FLOPs and memory grow as T x 1.5 W rather than T^2 (8,192 tokens, W = 128: 2.3% of
              the full T x T); shorter rows: the full attention with the window in its mask (the
              blocked one would compute more). Dropout works on both.
  splash      LocalMask((T, T), (W/2, W/2)) with the SegmentIds: the kernel skips the
              128 x 128 tiles the window leaves empty (3 of T/128 per query tile).
  cudnn       refused: jax.nn.dot_product_attention's cuDNN window in JAX 0.10.2 is left-only
              (causal models); a two-sided one raises.
  pallas_gpu  refused: the Pallas GPU mha of JAX 0.10.2 has no window argument.
A refused window is a one-line AttentionError, never a silent full attention.

Dropout on the probabilities (training only; evaluation runs every kernel without): xla draws its
mask from the step's dropout key (flax's rule); cudnn draws it inside the kernel from cuDNN's
Philox generator. jax's wrapper takes that generator's seed as a compile-time constant: each cuDNN
call site gets its own (`_next_cudnn_seed`, in trace order, so layers do not share a mask), and
how the generator's offset moves between runs of the compiled step (a new mask per step, the
backward on the forward's mask) is XLA's runtime: tests/bert_jax/layers/attention_test.py's GPU test
test_cudnn_dropout_masks_change_per_run_and_the_backward_uses_the_forwards checks both on the
chip; it passed on one H200 (2026-11-27), so `auto` picks cuDNN with dropout
(CUDNN_DROPOUT_IN_AUTO) where XLA keeps cuDNN out of CUDA graphs (CUDNN_DROPOUT_XLA_FLAG). pallas_gpu and splash have no dropout: asked for it, they are refused (an explicit backend:
AttentionError; auto: the next kernel, named with the reason in the start-up line), never run
with a silent 0.

What a padding query sees differs between kernels (xla: every real key of a padded row, nothing in
a packed row; the segment-id kernels: the other padding tokens; cuDNN: nothing) but never reaches a
real token (keys are masked) or the loss (heads read real positions only), so the outputs at real
tokens, the losses and the gradients agree (tests/bert_jax/layers/attention_test.py checks them against xla at
float32 <= 1e-5).
"""

import functools
import importlib.util
import itertools
import math
import os
import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from bert_jax_core import errors

BACKENDS = ("auto", "xla", "cudnn", "pallas_gpu", "splash")
FUSED = ("cudnn", "pallas_gpu", "splash")
# Fused kernels that apply attention dropout themselves (the module docstring's "Dropout").
DROPOUT_IN_KERNEL = ("cudnn",)
# Whether `auto` may pick cuDNN for a step with attention dropout. Off until a chip has passed
# tests/bert_jax/layers/attention_test.py's test_cudnn_dropout_masks_change_per_run_and_the_backward_uses_the_
# forwards (benchmarks/gpu_ab.sh runs it): a mask repeated every step would be a silent change of
# the recipe. attention=cudnn asks for it explicitly, and the start-up line says so.
CUDNN_DROPOUT_IN_AUTO = True   # passed on one H200, jax/jaxlib 0.11.2, cuDNN 9.19 (2026-11-27)
# XLA of jaxlib 0.11.2 (CUDA 13, one H200, 2026-11-27) aborts the whole process when it records
# cuDNN's attention graph WITH dropout into a CUDA graph (its command buffers): "F cuda_dnn.cc:6951
# Check failed: local_device_ordinal.has_value()" in CudnnGraph::PackOperands, at the first step.
# With CUDNN left out of the command-buffer types the same step runs and the mask test passes
# (8 of 8). Only cuDNN's 2 calls a layer leave the graphs; fusions, GEMMs and the Pallas custom
# calls stay in them. prepare_xla_flags sets it before JAX starts; unsupported_reason refuses
# cuDNN's dropout in a process that lacks it (one line, not an abort after minutes of compile).
CUDNN_DROPOUT_XLA_FLAG = "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL"
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
def check_window(window):
  """None, or ModernBERT's local_attention span: an even number of tokens >= 2 (half each side)."""
  if window is None:
    return
  if isinstance(window, bool) or not isinstance(window, int) or window < 2 or window % 2:
    raise AttentionError(f"attention window={window!r}: must be an even number of tokens >= 2 "
                         "(each query sees window/2 keys either side; ModernBERT: 128), or None "
                         "for global attention.")


def unsupported_reason(backend, *, platform_name, packed, dtype, seq_len, dropout,
                       allow_interpret=False, window=None):
  """None if `backend` can run this configuration, else why not (one phrase).

  window: the local layers' span (see the module docstring), None for global attention.
  """
  dtype = jnp.dtype(dtype)
  if backend == "xla":
    return None
  if dropout > 0 and backend not in DROPOUT_IN_KERNEL:
    return (f"attention_dropout_prob={dropout} in training needs dropout on the attention "
            f"probabilities, which the fused {backend} kernel never materialises (use "
            "attention=cudnn, whose kernel drops them, or xla, or the fast preset with "
            "attention_dropout_prob=0)")
  native = platform_name in _PLATFORMS[backend]
  interpretable = backend != "cudnn" and platform_name == "cpu" and allow_interpret
  if not (native or interpretable):
    return f"{backend} runs on {'/'.join(_PLATFORMS[backend])}, this is {platform_name}"
  if window is not None and backend == "cudnn":
    return (f"a two-sided window ({window} tokens) is not in cuDNN's sliding window through "
            "jax.nn.dot_product_attention of JAX 0.10.2 (left side only, for causal models)")
  if window is not None and backend == "pallas_gpu":
    return (f"a local window ({window} tokens) is not in the Pallas GPU kernel of JAX 0.10.2 "
            "(jax.experimental.pallas.ops.gpu.attention.mha takes segment ids and causal only)")
  if backend == "cudnn":
    if dropout > 0 and platform_name == "gpu" and not _cudnn_out_of_command_buffers():
      return ("cuDNN's in-kernel dropout aborts XLA 0.11.2 inside CUDA graphs: start the "
              f"program with XLA_FLAGS={CUDNN_DROPOUT_XLA_FLAG} (bert_jax's programs set it "
              "themselves unless XLA_FLAGS already names xla_gpu_enable_command_buffer)")
    if packed and platform_name == "gpu" and not _hopper_or_newer():
      return ("cudnn keeps packed instances apart with its ragged offsets, on Hopper (compute "
              "capability 9.0) or newer only; this GPU is older (use pallas_gpu)")
    if dtype not in (jnp.bfloat16, jnp.float16):
      return f"cuDNN flash attention needs bfloat16/float16, the model computes in {dtype}"
  if backend == "splash":
    if seq_len % 128:
      return (f"splash tiles the sequence in blocks of 128 lanes; seq_length={seq_len} is not a "
              "multiple of 128")
    if platform_name == "cpu" and dtype != jnp.float32:
      return "splash in CPU interpret mode computes in float32 only"
  if backend == "pallas_gpu" and (seq_len % _block(seq_len, 128) or
                                  seq_len % _block(seq_len, PALLAS_BWD_BLOCK)):
    return (f"pallas_gpu tiles the sequence in blocks of 128 (forward) and {PALLAS_BWD_BLOCK} "
            "(backward); "
            f"seq_length={seq_len} is not a multiple of both")
  return None


def _command_buffer_types(xla_flags):
  """The last --xla_gpu_enable_command_buffer= value in `xla_flags` as a set, None if absent."""
  values = re.findall(r"--xla_gpu_enable_command_buffer=(\S*)", xla_flags or "")
  return None if not values else {t for t in values[-1].split(",") if t}


def _cudnn_out_of_command_buffers():
  """True where this process's XLA_FLAGS keep cuDNN's calls out of CUDA graphs."""
  types = _command_buffer_types(os.environ.get("XLA_FLAGS", ""))
  return types is not None and "CUDNN" not in types


def _cuda_plugin_installed():
  """True where a jax CUDA plugin is installed (the hosts where XLA could build CUDA graphs)."""
  return any(importlib.util.find_spec(f"jax_cuda{v}_plugin") is not None for v in (12, 13))


def prepare_xla_flags(model_config, environ=None):
  """Before JAX starts (the programs' main): on a host with jax's CUDA plugin, a model that may
  run cuDNN's attention dropout (attention auto or cudnn, attention_dropout_prob > 0) gets
  CUDNN_DROPOUT_XLA_FLAG appended to XLA_FLAGS, unless XLA_FLAGS already sets the command-buffer
  types (the user's choice stands; unsupported_reason then decides) or JAX has already started
  (flags are read once, when the backend starts). Returns True when it set the flag."""
  environ = os.environ if environ is None else environ
  flags = environ.get("XLA_FLAGS", "")
  if (getattr(model_config, "attention", "auto") not in ("auto", "cudnn")
      or not getattr(model_config, "attention_dropout_prob", 0) > 0
      or _command_buffer_types(flags) is not None or not _cuda_plugin_installed()):
    return False
  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top
  if xla_bridge.backends_are_initialized():
    return False
  environ["XLA_FLAGS"] = f"{flags} {CUDNN_DROPOUT_XLA_FLAG}".strip()
  return True


def _hopper_or_newer():
  """True where the first GPU's compute capability is >= 9.0 (H100/H200)."""
  cc = getattr(jax.devices()[0], "compute_capability", "0.0")
  return tuple(int(x) for x in str(cc).split(".")[:2]) >= (9, 0)


def select_backend(requested, *, packed, dtype, seq_len, dropout, platform_name=None,
                   allow_interpret=False, window=None) -> Choice:
  """The backend to run and why. `dropout` is the attention dropout in force (0 at eval);
  `window` the local layers' span (None: global attention).

  An explicit backend that cannot run is an AttentionError; `auto` falls back and says why.
  """
  if requested not in BACKENDS:
    raise AttentionError(f"config.model.attention={requested!r}: use one of {', '.join(BACKENDS)}.")
  check_window(window)
  platform_name = platform_name or platform()
  why = functools.partial(unsupported_reason, platform_name=platform_name, packed=packed,
                          dtype=dtype, seq_len=seq_len, dropout=dropout,
                          allow_interpret=allow_interpret, window=window)
  if requested != "auto":
    reason = why(requested)
    if reason:
      where = f" on the local layers (window {window})" if window is not None else ""
      raise AttentionError(f"config.model.attention={requested}{where}: {reason}.")
    return Choice(requested, "requested")
  # Preference per platform. GPU: cuDNN's flash kernel first for padded rows (NVIDIA's fused
  # kernel; the Pallas/Triton one is the portable fallback), the Pallas kernel for packed rows
  # (segment ids). Not yet ranked by a measurement of ours (no accelerator was available).
  order = {"tpu": ("splash",),
           "gpu": ("pallas_gpu", "cudnn") if packed else ("cudnn", "pallas_gpu")
           }.get(platform_name, ())
  refusals = []
  for backend in order:
    reason = why(backend)
    if reason is None and dropout > 0 and backend == "cudnn" and not CUDNN_DROPOUT_IN_AUTO:
      reason = (f"cudnn's in-kernel dropout is not yet checked on a chip for auto "
                "(attention.CUDNN_DROPOUT_IN_AUTO; attention=cudnn asks for it)")
    if reason is None:
      mask = "packed" if packed else "padded"
      return Choice(backend, f"auto: fastest kernel for {mask} rows on {platform_name}")
    refusals.append(reason)
  if not order:
    return Choice("xla", f"auto: no fused kernel on {platform_name}")
  return Choice("xla", "auto fell back: " + "; ".join(refusals))


def local_window(model_config):
  """The span of the model's windowed layers (ModernBERT's local layers: 128), None when every
  layer is global (every BERT-family model): what the start-up line and the planner pass as
  `window`. Only RoPE models window their layers (model.py's attention)."""
  if getattr(model_config, "position_embedding", None) != "rope":
    return None
  windows = {w for w, _ in map(model_config.layer_attention, range(model_config.num_layers))}
  windows.discard(None)
  assert len(windows) <= 1, windows        # one local span a model (bert_config's local_window)
  return windows.pop() if windows else None


def step_choices(model_config, *, packed, seq_len, platform_name=None, window=None):
  """{"global": (training Choice, evaluation Choice)[, "local": (...)]}: the kernels a step runs,
  chosen once for the start-up line (words) and the planner (data); "local" when `window` is set.
  model.py makes the same select_backend call per layer at trace time.

  Raises AttentionError (before any compute) if an explicitly requested kernel cannot run.
  """
  kw = dict(packed=packed, dtype=model_config.dtype, seq_len=seq_len,
            platform_name=platform_name)

  def pair(w):
    return (select_backend(model_config.attention, dropout=model_config.attention_dropout_prob,
                           window=w, **kw),
            select_backend(model_config.attention, dropout=0.0, window=w, **kw))

  out = {"global": pair(None)}
  if window is not None:
    out["local"] = pair(window)
  return out


def training_backends(model_config, *, packed, seq_len, platform_name=None):
  """{"global": kernel, "local": kernel} of the training step's attention ("local" only when the
  model has windowed layers): step_choices' training kernels, as data (the planner adds the
  splash kernels' FLOPs by them). Raises AttentionError as startup_line does."""
  choices = step_choices(model_config, packed=packed, seq_len=seq_len,
                         platform_name=platform_name, window=local_window(model_config))
  return {kind: train.backend for kind, (train, _) in choices.items()}


def startup_line(model_config, *, packed, seq_len, platform_name=None, window=None):
  """"attention: <kernel> in training (<why>)[, <kernel> in evaluation (<why>)]" for the log,
  then "; local layers (window W): ..." the same for the windowed layers if `window` is set.

  Raises AttentionError (before any compute) if an explicitly requested kernel cannot run.
  platform_name: the chips the step runs on (default: this host's, see `platform`).
  window: the local layers' span; None: the model's own (`local_window`: ModernBERT's local
  attention, none for the BERT family), so no caller can leave the local layers out.
  """
  rate = model_config.attention_dropout_prob

  def words(train, evaluation):
    text = f"{train.backend} in training ({train.reason})"
    if rate > 0:   # which kernel drops the probabilities, and where
      where = "in the kernel" if train.backend in DROPOUT_IN_KERNEL else "on the probabilities"
      text += f" with attention dropout {rate:g} {where}"
    if evaluation.backend != train.backend:
      text += f", {evaluation.backend} in evaluation ({evaluation.reason})"
    return text

  if window is None:
    window = local_window(model_config)
  choices = step_choices(model_config, packed=packed, seq_len=seq_len,
                         platform_name=platform_name, window=window)
  line = "attention: " + words(*choices["global"])
  if "local" in choices:
    line += f"; local layers (window {window}): " + words(*choices["local"])
  return line


# ----------------------------------------------------------------------------------------------
# The function.
# ----------------------------------------------------------------------------------------------
def dot_product_attention(q, k, v, ids, *, packed, backend="xla", window=None, dropout_rate=0.0,
                          dropout_rng=None, deterministic=True, interpret=None):
  """softmax(q k^T / sqrt(D), masked by `ids`) v.  q/k/v [B, T, N, D], ids [B, T] -> [B, T, N, D].

  `packed`: False (padded rows), True (packed rows), or the most instances a packed row holds
  (an int K: cuDNN's packed form sizes its bookkeeping by it; True: T).
  `window` (an even number of tokens, ModernBERT's 128): also mask keys with |i - j| > window/2.
  `backend` must be concrete (resolve "auto" with `select_backend`). Dropout on the attention
  probabilities (rate `dropout_rate`, key `dropout_rng`) runs when not `deterministic`: on `xla`
  with that key, on `cudnn` inside the kernel (its own generator: the module docstring); any
  other fused backend asked for it is an AttentionError, never a silent skip.
  `interpret` (default: on CPU) runs the Pallas kernels in interpret mode (for tests).
  """
  dropout = 0.0 if deterministic else float(dropout_rate)
  check_window(window)
  if backend == "auto":
    raise AttentionError("dot_product_attention: resolve backend='auto' with select_backend() "
                         "first, so the start-up line can say which kernel runs.")
  if backend == "xla":
    return xla_attention(q, k, v, ids, packed=packed, window=window, dropout_rate=dropout,
                         dropout_rng=dropout_rng)
  reason = unsupported_reason(backend, platform_name=platform(), packed=packed, dtype=q.dtype,
                              seq_len=q.shape[1], dropout=dropout, allow_interpret=True,
                              window=window)
  if reason:
    raise AttentionError(f"attention backend {backend}: {reason}.")
  interpret = platform() == "cpu" if interpret is None else interpret
  max_segments = packed if type(packed) is int else None   # pylint: disable=unidiomatic-typecheck
  cudnn = functools.partial(_cudnn_packed, max_segments=max_segments) if packed else _cudnn
  if backend == "cudnn" and dropout > 0:
    cudnn = functools.partial(cudnn, dropout_rate=dropout, seed=_next_cudnn_seed())
  kernel = {"cudnn": cudnn, "pallas_gpu": functools.partial(_pallas_gpu, interpret=interpret),
            "splash": functools.partial(_splash, interpret=interpret, window=window)}[backend]
  return _per_shard(kernel, q, k, v, ids)


def attention_mask(ids, packed, window=None):
  """Boolean mask broadcastable to [B, N, T, S] (True = may attend).

  Padded: [B, 1, 1, S], the key padding mask (exactly the mask model.py always used).
  Packed: [B, 1, T, S], block diagonal: a real query sees the real keys of its own instance; a
  padding query sees nothing and gets uniform weights (finite, and never read: see the module
  docstring).
  window: also |i - j| <= window // 2 (a [B, 1, T, S] mask either way).
  """
  key_real = ids != 0                                                     # [B, S]
  if not packed:
    mask = key_real[:, None, None, :]                                     # [B, 1, 1, S]
  else:
    same = ids[:, :, None] == ids[:, None, :]                             # [B, T, S]
    mask = (same & key_real[:, None, :])[:, None]                         # [B, 1, T, S]
  if window is not None:
    pos = jnp.arange(ids.shape[1])
    mask = mask & (jnp.abs(pos[:, None] - pos[None, :]) <= window // 2)   # [B, 1, T, S]
  return mask


def xla_attention(q, k, v, ids, *, packed, window=None, dropout_rate=0.0, dropout_rng=None,
                  blocked=None):
  """The reference path. Without dropout: jax.nn.dot_product_attention's XLA implementation
  (scale 1/sqrt(D), float32 softmax). With dropout: the same maths spelt out, so the
  probabilities can be dropped (as google-research/bert's attention_probs_dropout_prob).

  With a `window`: `local_attention` (blocked) where it computes less than the full T x S, i.e.
  T > 3 x window/2; `blocked` True/False forces one or the other (tests)."""
  if dropout_rate > 0 and dropout_rng is None:
    raise AttentionError("xla attention: dropout_rate > 0 needs a dropout_rng.")
  if window is not None and (blocked if blocked is not None else
                             q.shape[1] > 3 * (window // 2)):
    return local_attention(q, k, v, ids, packed=packed, window=window, dropout_rate=dropout_rate,
                           dropout_rng=dropout_rng)
  mask = attention_mask(ids, packed, window)
  if dropout_rate == 0:
    return jax.nn.dot_product_attention(q, k, v, mask=mask)               # [B, T, N, D]
  logits = jnp.einsum("BTND,BSND->BNTS", q, k,
                      preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
  logits = jnp.where(mask, logits, _MASK_VALUE)                           # [B, N, T, S]
  probs = _dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype), dropout_rate, dropout_rng)
  return jnp.einsum("BNTS,BSND->BTND", probs, v)                         # [B, T, N, D]


def scored_attention(q, k, v, ids, *, packed, window=None, dropout_rate=0.0, dropout_rng=None):
  """(ctx [B, T, N, D], scores [B, N, T, S] float32): the xla path with its pre-softmax scores
  q k^T / sqrt(D) before any mask (layer-wise distillation's, TinyBERT's attention_scores less
  its additive mask; the loss masks them: bert_jax/objectives/layerwise.py). Full T x S, also with a
  window (no blocked form: the scores are the point). Same maths as xla_attention's dropout
  path, so ctx equals xla_attention's to float tolerance."""
  if dropout_rate > 0 and dropout_rng is None:
    raise AttentionError("scored attention: dropout_rate > 0 needs a dropout_rng.")
  scores = jnp.einsum("BTND,BSND->BNTS", q, k,
                      preferred_element_type=jnp.float32) / math.sqrt(q.shape[-1])
  logits = jnp.where(attention_mask(ids, packed, window), scores, _MASK_VALUE)   # [B, N, T, S]
  probs = _dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype), dropout_rate, dropout_rng)
  return jnp.einsum("BNTS,BSND->BTND", probs, v), scores                 # [B, T, N, D]


def _dropout(probs, rate, rng):
  if rate == 0:
    return probs
  keep_prob = 1.0 - rate                                                  # as flax nn.Dropout
  keep = jax.random.bernoulli(rng, p=keep_prob, shape=probs.shape)
  return jax.lax.select(keep, probs / keep_prob, jnp.zeros_like(probs))


def local_attention(q, k, v, ids, *, packed, window, dropout_rate=0.0, dropout_rng=None):
  """Sliding-window attention computed block by block: O(T x window), not O(T^2).

  The row is cut into K = ceil(T / W) query blocks of W = window // 2 tokens (ModernBERT: 64);
  the keys a block's queries can reach (|i - j| <= W) lie in the block and its two neighbours,
  so each block scores 3W keys: [B, N, K, W, 3W] logits instead of [B, N, T, T]. At T = 8,192
  and window 128 that is 192 keys per query instead of 8,192 (2.3%). Same mask as
  `attention_mask(ids, packed, window)` on those keys, float32 logits and softmax as
  jax.nn.dot_product_attention; a padding query that sees no key gets uniform weights over its
  3W slots (never read, as the module docstring says).
  """
  b, t, n, d = q.shape
  w = window // 2                                                         # block = half-window
  nk = -(-t // w)                                                         # K blocks
  tp = nk * w                                                             # T rounded up to K x W
  pad = lambda x, lo, hi: jnp.pad(x, [(0, 0), (lo, hi)] + [(0, 0)] * (x.ndim - 2))
  q = pad(q, 0, tp - t).reshape(b, nk, w, n, d)                          # [B, K, W, N, D]

  def neighbours(x):
    """x [B, T, ...] -> [B, K, 3W, ...]: for block i, positions (i - 1) W ... (i + 2) W - 1
    (out of range: zeros, id 0 = padding, so masked)."""
    x = pad(x, w, tp - t + w)                                             # [B, W + Tp + W, ...]
    blocks = [x[:, s * w:s * w + tp].reshape((b, nk, w) + x.shape[2:]) for s in range(3)]
    return jnp.concatenate(blocks, axis=2)

  k, v, key_ids = neighbours(k), neighbours(v), neighbours(ids)          # [B, K, 3W, (N, D)]
  q_ids = pad(ids, 0, tp - t).reshape(b, nk, w)                          # [B, K, W]
  q_pos = jnp.arange(tp).reshape(nk, w)                                  # [K, W]
  k_pos = q_pos[:, :1] - w + jnp.arange(3 * w)                           # [K, 3W]
  mask = (jnp.abs(q_pos[:, :, None] - k_pos[:, None, :]) <= w)[None]     # [1, K, W, 3W]
  mask = mask & (key_ids != 0)[:, :, None, :]                            # [B, K, W, 3W]
  if packed:
    mask = mask & (q_ids[:, :, :, None] == key_ids[:, :, None, :])
  logits = jnp.einsum("BKqND,BKsND->BNKqs", q, k,
                      preferred_element_type=jnp.float32) / math.sqrt(d)  # [B, N, K, W, 3W]
  logits = jnp.where(mask[:, None], logits, _MASK_VALUE)
  probs = _dropout(jax.nn.softmax(logits, axis=-1).astype(v.dtype), dropout_rate, dropout_rng)
  ctx = jnp.einsum("BNKqs,BKsND->BKqND", probs, v)                       # [B, K, W, N, D]
  return ctx.reshape(b, tp, n, d)[:, :t]                                  # [B, T, N, D]


# ----------------------------------------------------------------------------------------------
# The fused kernels. Each takes one shard: q/k/v [b, T, n, D], ids [b, T].
# ----------------------------------------------------------------------------------------------
def _block(seq_len, preferred):
  """The kernel's tile along T: `preferred`, or the whole (shorter) sequence."""
  return min(preferred, seq_len)


# Tuning knobs the benchmark sets for its A/B runs (benchmarks/accelerator.py
# --pallas_bwd_block, --cudnn_max_segments); the defaults are what training uses.
PALLAS_BWD_BLOCK = 32        # the Pallas GPU kernel's backward tiles (jax's default)
CUDNN_MAX_SEGMENTS = None    # instances per packed row cuDNN is told of; None: the batch's K, else T


def packed_offsets(ids, max_segments):
  """Per-instance (offsets [B, M+1], lengths [B, M]) of packed rows, cuDNN's ragged layout as
  jax's wrapper takes it: instance s (ids == s, s = 1..M) starts at offsets[:, s-1] and holds
  lengths[:, s-1] tokens; absent instances (and the last offset column) are -1. Instances must
  be contiguous in their row (data_pipelines/records/packing.py writes them so) and number at most M:
  the caller bounds M statically (T always does: one token per instance at most)."""
  b, t = ids.shape
  seg = jnp.arange(1, max_segments + 1, dtype=ids.dtype)                 # [M]
  member = ids[:, None, :] == seg[None, :, None]                          # [B, M, T]
  lengths = jnp.sum(member, axis=-1, dtype=jnp.int32)                    # [B, M]
  starts = jnp.argmax(member, axis=-1).astype(jnp.int32)                 # [B, M]
  present = lengths > 0
  offsets = jnp.where(present, starts, -1)
  offsets = jnp.concatenate([offsets, jnp.full((b, 1), -1, jnp.int32)], axis=1)   # [B, M+1]
  return offsets, jnp.where(present, lengths, -1)


_cudnn_seeds = itertools.count(1)


def _next_cudnn_seed():
  """A distinct seed for each cuDNN dropout call site traced (layer by layer, in trace order), so
  the layers of a step draw different masks; the same order gives the same seeds in every run."""
  return next(_cudnn_seeds) % (1 << 31)


def _cudnn_packed(q, k, v, ids, *, max_segments=None, dropout_rate=0.0, seed=0):
  """cuDNN flash attention on packed rows (see the module docstring). Padding tokens belong to
  no instance, so cuDNN leaves their output (and their dQ/dK/dV) unwritten: q/k/v go in and the
  context comes out through a select on the real tokens, whose gradient discards whatever cuDNN
  left there (a multiply would turn a stray NaN into NaN weight gradients)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
  real = (ids > 0)[:, :, None, None]                                      # [B, T, 1, 1]
  q, k, v = (jnp.where(real, x, jnp.zeros((), x.dtype)) for x in (q, k, v))
  # M, the instances per row cuDNN is told of: its ragged bookkeeping kernels run over B x M
  # instance slots of T tokens each (BERT-large/512 on an H200, 2026-11-26, M = 32: 11 of the
  # 29 ms/step cuDNN's attention took), so the tightest bound the batch gives (K), else T.
  offsets, lengths = packed_offsets(ids, CUDNN_MAX_SEGMENTS or max_segments or ids.shape[1])
  out = cudnn_fa.dot_product_attention(
      q, k, v, None, None, lengths, lengths, offsets, offsets,
      scale=1.0 / math.sqrt(q.shape[-1]), mask_type=cudnn_fa.MaskType.PADDING,
      dropout_rate=dropout_rate, seed=seed)
  return jnp.where(real, out, jnp.zeros((), out.dtype))                  # [B, T, N, D]


def _cudnn(q, k, v, ids, *, dropout_rate=0.0, seed=0):
  # BERT rows are right-padded (input_mask = 1...1 0...0), so a row's real tokens are its first
  # `length` tokens and the lengths describe the mask exactly.
  lengths = jnp.sum(ids > 0, axis=1, dtype=jnp.int32)                     # [b]
  if dropout_rate > 0:   # the public API has no dropout: jax's wrapper, which it calls, has
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
    return cudnn_fa.dot_product_attention(
        q, k, v, None, None, lengths, lengths, scale=1.0 / math.sqrt(q.shape[-1]),
        mask_type=cudnn_fa.MaskType.PADDING, dropout_rate=dropout_rate, seed=seed)
  return jax.nn.dot_product_attention(q, k, v, query_seq_lengths=lengths,
                                      key_value_seq_lengths=lengths, implementation="cudnn")


def _pallas_gpu(q, k, v, ids, *, interpret):
  from jax.experimental.pallas.ops.gpu import attention as gpu_attention
  t = q.shape[1]
  # Forward tiles of 128 (the kernel's default), backward tiles of 32 (its default: the dK/dV and
  # dQ kernels hold more live tiles per program).
  fwd, bwd = _block(t, 128), _block(t, PALLAS_BWD_BLOCK)
  sizes = gpu_attention.BlockSizes(block_q=fwd, block_k=fwd, block_q_dkv=bwd, block_kv_dkv=bwd,
                                   block_q_dq=bwd, block_kv_dq=bwd)
  return gpu_attention.mha(q, k, v, ids, sm_scale=1.0 / math.sqrt(q.shape[-1]),
                           block_sizes=sizes, interpret=interpret)


def splash_kernel(t, n, *, window=None, interpret=False):
  """The splash kernel for rows of `t` tokens and `n` heads (its fwd_mask_info.block_mask says
  which tiles it computes: 0 = skipped)."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  # 512-wide tiles at seq 512 (one tile per row: the whole T x T block per head), 128 otherwise,
  # and 128 with a window (the finer the tiles, the more of them the window leaves empty).
  blk = 512 if t % 512 == 0 and window is None else 128
  sizes = splash.BlockSizes(block_q=blk, block_kv=blk, block_kv_compute=blk, block_q_dkv=blk,
                            block_kv_dkv=blk, block_kv_dkv_compute=blk, block_q_dq=blk,
                            block_kv_dq=blk)
  # The static mask is full (bidirectional) or the local window, |i - j| <= window // 2 (the
  # kernel skips tiles it leaves empty); SegmentIds carry padding and packing on top.
  if window is None:
    head = splash.FullMask((t, t))
  else:
    head = splash.LocalMask((t, t), window_size=(window // 2, window // 2), offset=0)
  mask = splash.MultiHeadMask([head for _ in range(n)])
  return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                interpret=interpret)


def _splash(q, k, v, ids, *, interpret, window=None):
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  _, t, n, d = q.shape
  kernel = splash_kernel(t, n, window=window, interpret=interpret)
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
    from bert_jax.parallel.sharding import LOGICAL_AXIS_RULES as rules
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
