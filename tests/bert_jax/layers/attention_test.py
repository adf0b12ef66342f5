"""Every attention backend equals the xla reference on padded and packed batches.

The Pallas kernels run in interpret mode on CPU (slow per element, so the shapes are tiny; splash
tiles the sequence by 128 lanes, so its rows are 128 long). cuDNN runs only on a GPU.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from jax.sharding import Mesh

from bert_jax.layers import attention

N, D = 2, 16


def _ids(t, packed):
  """[2, t] ids: row 0 holds two instances then padding, row 1 one instance filling the row."""
  a, b = int(t * 0.3), int(t * 0.4)
  if packed:
    row0 = [1] * a + [2] * b + [0] * (t - a - b)
    row1 = [1] * (t // 2) + [2] * (t // 4) + [3] * (t - t // 2 - t // 4)
  else:
    row0 = [1] * (a + b) + [0] * (t - a - b)
    row1 = [1] * t
  return jnp.asarray([row0, row1], jnp.int32)


def _qkv(t, dtype, seed=0):
  rng = np.random.default_rng(seed)
  return tuple(jnp.asarray(rng.normal(size=(2, t, N, D)), dtype) for _ in range(4))


def _loss_and_grads(backend, q, k, v, ids, packed, cot):
  """Forward output and d(sum(out * cot) over real tokens)/d(q, k, v), in float32."""
  real = (ids > 0)[:, :, None, None]

  def loss(q, k, v):
    out = attention.dot_product_attention(q, k, v, ids, packed=packed, backend=backend)
    return jnp.sum(jnp.where(real, out.astype(jnp.float32) * cot, 0.0)), out

  (_, out), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
  f32 = lambda x: np.asarray(x, np.float32)
  return f32(jnp.where(real, out, 0)), [f32(g) for g in grads]


def _check_equal_to_xla(backend, t, packed, dtype, tol):
  q, k, v, cot = _qkv(t, dtype)
  ids = _ids(t, packed)
  out, grads = _loss_and_grads(backend, q, k, v, ids, packed, cot.astype(jnp.float32))
  # The reference runs in float32 whatever the kernel's dtype (bf16 is judged against truth).
  f32 = lambda x: x.astype(jnp.float32)
  ref_out, ref_grads = _loss_and_grads("xla", f32(q), f32(k), f32(v), ids, packed,
                                       cot.astype(jnp.float32))
  np.testing.assert_allclose(out, ref_out, atol=tol, rtol=tol)
  for name, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=tol, rtol=tol, err_msg=f"d{name}")


# bfloat16 keeps 8 bits of mantissa (relative step 2^-8 = 0.4%); sums of T terms of size ~1 in
# bf16 inputs land within a few percent of float32.
BF16_TOL = 5e-2


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_pallas_gpu_equals_xla_float32(packed):
  # On a GPU, Triton multiplies float32 tiles in TF32 (10-bit mantissa): 1e-5 failed on an H200
  # (2026-11-26). TF32 is finer than bfloat16, so bfloat16's tolerance bounds it there; the CPU's
  # interpret mode computes in true float32.
  _check_equal_to_xla("pallas_gpu", 32, packed, jnp.float32,
                      BF16_TOL if attention.platform() == "gpu" else 1e-5)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_pallas_gpu_equals_xla_bfloat16(packed):
  _check_equal_to_xla("pallas_gpu", 32, packed, jnp.bfloat16, BF16_TOL)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_splash_equals_xla_float32(packed):
  _check_equal_to_xla("splash", 128, packed, jnp.float32, 1e-5)


def test_splash_bfloat16_on_cpu_is_refused_with_the_reason():
  q, k, v, _ = _qkv(128, jnp.bfloat16)
  with pytest.raises(attention.AttentionError, match="float32 only"):
    attention.dot_product_attention(q, k, v, _ids(128, True), packed=True, backend="splash")


@pytest.mark.skipif(attention.platform() != "gpu", reason="cuDNN flash attention needs an "
                    "NVIDIA GPU (this machine has none); runs on a GPU")
@pytest.mark.parametrize("t", [128, 512])
@pytest.mark.parametrize("packed,max_segments", [(False, None), (True, None), (True, 4)],
                         ids=["padded", "packed", "packed-M4"])
def test_cudnn_equals_xla_bfloat16(t, packed, max_segments, monkeypatch):
  """Packed rows go through cuDNN's ragged offsets (Hopper); M4: told of 4 instances per row,
  the rows hold 2 and 3."""
  monkeypatch.setattr(attention, "CUDNN_MAX_SEGMENTS", max_segments)
  _check_equal_to_xla("cudnn", t, packed, jnp.bfloat16, BF16_TOL)


def test_attention_dropout_runs_in_cudnn_or_xla_and_the_startup_line_says_where(monkeypatch):
  """Issue 38: with the recipe's attention dropout 0.1, cuDNN trains with dropout in its kernel
  (auto too, since the mask test passed on an H200, 2026-11-27) where XLA keeps cuDNN out of CUDA
  graphs (XLA 0.11.2 aborts otherwise); without that flag auto falls back to xla and names why,
  and attention=cudnn is a one-line error naming the flag; pallas_gpu and splash asked for dropout
  are one-line errors; the start-up line says which kernel drops and where."""
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("tiny", attention="auto", dtype="bfloat16")   # dropout 0.1
  gpu = dict(seq_len=128, platform_name="gpu")
  cudnn = dataclasses.replace(cfg, attention="cudnn")
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_autotune_level=0")     # no command-buffer flag
  with pytest.raises(attention.AttentionError,
                     match="aborts XLA 0.11.2 inside CUDA graphs: start the program with "
                           "XLA_FLAGS=--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,"):
    attention.startup_line(cudnn, packed=False, **gpu)
  line = attention.startup_line(cfg, packed=False, **gpu)
  assert line.startswith("attention: xla in training (auto fell back: cuDNN's in-kernel dropout "
                         "aborts XLA 0.11.2"), line
  assert "with attention dropout 0.1 on the probabilities, cudnn in evaluation" in line
  # A user's own command-buffer list that keeps CUDNN in is their choice: still refused.
  monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_enable_command_buffer=FUSION,CUDNN")
  assert attention.startup_line(cfg, packed=False, **gpu).startswith(
      "attention: xla in training (auto fell back: cuDNN's in-kernel dropout")
  monkeypatch.setenv("XLA_FLAGS", attention.CUDNN_DROPOUT_XLA_FLAG)
  assert attention.startup_line(cudnn, packed=False, **gpu) == (
      "attention: cudnn in training (requested) with attention dropout 0.1 in the kernel")
  assert attention.startup_line(cfg, packed=False, **gpu) == (
      "attention: cudnn in training (auto: fastest kernel for padded rows on gpu) with attention "
      "dropout 0.1 in the kernel")
  # Packed rows (Hopper): the fastest kernel without dropout (pallas_gpu) has none.
  monkeypatch.setattr(attention, "_hopper_or_newer", lambda: True)
  line = attention.startup_line(cfg, packed=True, **gpu)
  assert line.startswith("attention: cudnn in training (auto: fastest kernel for packed rows on "
                         "gpu) with attention dropout 0.1 in the kernel"), line
  assert ", pallas_gpu in evaluation" in line          # no dropout at evaluation: the fastest
  # The switch back (a chip that fails the mask test): auto leaves cuDNN's dropout alone.
  monkeypatch.setattr(attention, "CUDNN_DROPOUT_IN_AUTO", False)
  assert attention.startup_line(cfg, packed=False, **gpu).startswith(
      "attention: xla in training (auto fell back: cudnn's in-kernel dropout is not yet checked")
  monkeypatch.setattr(attention, "CUDNN_DROPOUT_IN_AUTO", True)
  monkeypatch.setattr(attention, "_hopper_or_newer", lambda: False)
  line = attention.startup_line(cfg, packed=True, **gpu)
  assert line.startswith("attention: xla in training (auto fell back: attention_dropout_prob=0.1"
                         ), line
  assert "with attention dropout 0.1 on the probabilities" in line
  for backend in ("pallas_gpu", "splash"):
    with pytest.raises(attention.AttentionError, match="attention=cudnn, whose kernel drops"):
      attention.startup_line(dataclasses.replace(cfg, attention=backend), packed=False,
                             seq_len=128, platform_name="gpu" if backend != "splash" else "tpu")
  # Without dropout the line is as before.
  fast = dataclasses.replace(cfg, attention_dropout_prob=0.0)
  assert "dropout" not in attention.startup_line(fast, packed=False, **gpu)


def test_cudnn_dropout_reaches_the_kernel_with_a_seed_per_call_site(monkeypatch):
  """The rate goes to jax's cuDNN wrapper (padded and packed rows), each call site with its own
  seed (so layers draw different masks); no dropout at evaluation. The wrapper is stubbed: the
  kernel itself runs on a GPU only (the GPU test below)."""
  from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa
  calls = []

  def fake(q, k, v, *args, **kw):
    calls.append((len(args), kw.get("dropout_rate"), kw.get("seed")))
    return q

  monkeypatch.setattr(cudnn_fa, "dot_product_attention", fake)
  monkeypatch.setenv("XLA_FLAGS", attention.CUDNN_DROPOUT_XLA_FLAG)
  monkeypatch.setattr(attention, "platform", lambda: "gpu")
  monkeypatch.setattr(attention, "_hopper_or_newer", lambda: True)
  q, k, v, _ = _qkv(32, jnp.bfloat16)
  for packed in (False, True, False):
    attention.dot_product_attention(q, k, v, _ids(32, packed), packed=packed, backend="cudnn",
                                    dropout_rate=0.1, deterministic=False)
  assert [c[1] for c in calls] == [0.1, 0.1, 0.1]
  assert len({c[2] for c in calls}) == 3                  # a seed per call site
  calls.clear()
  attention.dot_product_attention(q, k, v, _ids(32, True), packed=True, backend="cudnn",
                                  dropout_rate=0.1, deterministic=True)
  assert calls[0][1] == 0.0


@pytest.mark.skipif(attention.platform() != "gpu", reason="cuDNN's dropout needs an NVIDIA GPU")
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_cudnn_dropout_masks_change_per_run_and_the_backward_uses_the_forwards(packed):
  """With V = identity the output rows are the dropped probabilities P' (forward's mask), and
  dV = P'^T dO with dO = identity gives them back from the backward's mask: they must agree
  (the backward on the forward's mask), and two runs of the same compiled step must draw
  different masks (a new mask per step), each keeping ~90% of the probabilities."""
  t = d = 64
  rng = np.random.default_rng(0)
  q, k = (jnp.asarray(rng.normal(size=(2, t, 1, d)), jnp.bfloat16) for _ in range(2))
  v = jnp.broadcast_to(jnp.eye(t, d, dtype=jnp.bfloat16)[None, :, None], (2, t, 1, d))
  ids = jnp.ones((2, t), jnp.int32) if not packed else jnp.asarray(
      [[1] * 32 + [2] * 32, [1] * 64], jnp.int32)

  @jax.jit
  def run(q, k, v):
    f = lambda v: attention.dot_product_attention(q, k, v, ids, packed=packed, backend="cudnn",
                                                  dropout_rate=0.1, deterministic=False)
    out, vjp = jax.vjp(f, v)
    (dv,) = vjp(jnp.broadcast_to(jnp.eye(t, d, dtype=out.dtype)[None, :, None], out.shape))
    return out, dv

  out1, dv1 = (np.asarray(x, np.float32)[:, :, 0] for x in run(q, k, v))
  out2, _ = (np.asarray(x, np.float32)[:, :, 0] for x in run(q, k, v))
  np.testing.assert_allclose(out1, np.swapaxes(dv1, 1, 2), atol=2e-2)   # P' = (dV)^T
  assert not np.allclose(out1, out2)                                     # a new mask each run
  kept = np.mean(out1[np.asarray(ids > 0)] > 0) if not packed else None
  if kept is not None:
    assert 0.85 < kept < 0.95, kept


@pytest.mark.skipif(attention.platform() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_pallas_gpu_native_equals_xla_bfloat16(packed):
  _check_equal_to_xla("pallas_gpu", 128, packed, jnp.bfloat16, BF16_TOL)


def test_packed_mask_is_block_diagonal():
  ids = jnp.asarray([[1, 1, 2, 2, 2, 0]], jnp.int32)
  mask = np.asarray(attention.attention_mask(ids, packed=True))[0, 0]    # [T, S]
  expected_real_rows = np.array([[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                                 [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0], [0, 0, 1, 1, 1, 0]])
  np.testing.assert_array_equal(mask[:5], expected_real_rows.astype(bool))
  assert not mask[:, 5].any()                                            # padding is never a key


def test_packed_instances_do_not_see_each_other():
  # Perturbing instance 2 leaves instance 1's outputs bit-identical, for every CPU backend.
  t = 128
  q, k, v, _ = _qkv(t, jnp.float32)
  ids = _ids(t, True)
  in2 = (ids == 2)[:, :, None, None]
  k2, v2 = jnp.where(in2, k + 3.0, k), jnp.where(in2, -v, v)
  in1 = np.asarray(ids == 1)
  for backend in ("xla", "splash"):
    a = attention.dot_product_attention(q, k, v, ids, packed=True, backend=backend)
    b = attention.dot_product_attention(q, k2, v2, ids, packed=True, backend=backend)
    np.testing.assert_array_equal(np.asarray(a)[in1], np.asarray(b)[in1], err_msg=backend)
    assert not np.allclose(np.asarray(a)[~in1 & np.asarray(ids > 0)],
                           np.asarray(b)[~in1 & np.asarray(ids > 0)])


def test_xla_dropout_drops_probabilities_and_fused_refuses_it():
  q, k, v, _ = _qkv(32, jnp.float32)
  ids = _ids(32, False)
  kw = dict(packed=False, dropout_rate=0.5, deterministic=False)
  plain = attention.dot_product_attention(q, k, v, ids, packed=False, backend="xla")
  a = attention.dot_product_attention(q, k, v, ids, backend="xla",
                                      dropout_rng=jax.random.PRNGKey(0), **kw)
  b = attention.dot_product_attention(q, k, v, ids, backend="xla",
                                      dropout_rng=jax.random.PRNGKey(0), **kw)
  np.testing.assert_array_equal(a, b)                                    # same key, same mask
  assert not np.allclose(a, plain)
  with pytest.raises(attention.AttentionError, match="attention_dropout_prob=0.5"):
    attention.dot_product_attention(q, k, v, ids, backend="pallas_gpu",
                                    dropout_rng=jax.random.PRNGKey(0), **kw)
  # Deterministic (evaluation): no dropout, so the fused kernel runs.
  attention.dot_product_attention(q, k, v, ids, backend="pallas_gpu", packed=False,
                                  dropout_rate=0.5, deterministic=True)


def test_fused_kernel_under_a_mesh_equals_unsharded():
  # shard_map hands each device its rows (data x fsdp) and heads (tensor).
  q, k, v, _ = _qkv(32, jnp.float32)
  q, k, v = (jnp.concatenate([x, x[::-1]]) for x in (q, k, v))          # batch 4
  ids = jnp.concatenate([_ids(32, True), _ids(32, True)[::-1]])
  devices = np.asarray(jax.devices()[:8]).reshape(2, 2, 2)
  expected = attention.dot_product_attention(q, k, v, ids, packed=True, backend="pallas_gpu")
  with jax.set_mesh(Mesh(devices, ("data", "fsdp", "tensor"))):
    got = jax.jit(lambda *a: attention.dot_product_attention(
        *a, packed=True, backend="pallas_gpu"))(q, k, v, ids)
  np.testing.assert_allclose(got, expected, atol=1e-6)


@pytest.mark.parametrize("platform,packed,dtype,dropout,expected", [
    ("cpu", False, "bfloat16", 0.0, "xla"),
    ("tpu", False, "bfloat16", 0.0, "splash"),
    ("tpu", True, "bfloat16", 0.0, "splash"),
    ("gpu", False, "bfloat16", 0.0, "cudnn"),
    ("gpu", True, "bfloat16", 0.0, "pallas_gpu"),
    ("gpu", False, "float32", 0.0, "pallas_gpu"),
    ("gpu", True, "bfloat16", 0.1, "xla"),      # this host's device is not Hopper: no cudnn
    ("gpu", False, "bfloat16", 0.1, "xla"),     # no command-buffer flag: cuDNN's dropout aborts
    ("gpu", False, "float32", 0.1, "xla"),
    ("tpu", False, "bfloat16", 0.1, "xla"),
])
def test_auto_picks_a_kernel_that_supports_the_batch(platform, packed, dtype, dropout,
                                                     expected, monkeypatch):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  choice = attention.select_backend("auto", packed=packed, dtype=dtype, seq_len=128,
                                    dropout=dropout, platform_name=platform)
  assert choice.backend == expected
  if dropout and expected == "xla":    # the fallback names why (no fused kernel with dropout)
    assert "attention_dropout_prob=0.1" in choice.reason


@pytest.mark.parametrize("requested,platform,packed,dtype,match", [
    ("splash", "gpu", False, "bfloat16", "runs on tpu"),
    ("cudnn", "gpu", True, "bfloat16", "Hopper"),         # this host's device has no CC 9.0
    ("cudnn", "gpu", False, "float32", "bfloat16/float16"),
    ("pallas_gpu", "tpu", False, "bfloat16", "runs on gpu"),
    ("splash", "cpu", False, "float32", "runs on tpu"),
    ("flash", "gpu", False, "bfloat16", "use one of"),
])
def test_an_explicit_backend_that_cannot_run_is_a_one_line_error(requested, platform, packed,
                                                                 dtype, match):
  with pytest.raises(attention.AttentionError, match=match) as e:
    attention.select_backend(requested, packed=packed, dtype=dtype, seq_len=128, dropout=0.0,
                             platform_name=platform)
  assert "\n" not in str(e.value)


def test_splash_refuses_a_length_that_is_not_a_multiple_of_128():
  with pytest.raises(attention.AttentionError, match="multiple"):
    attention.select_backend("splash", packed=True, dtype="bfloat16", seq_len=200, dropout=0.0,
                             platform_name="tpu")


def test_startup_line_names_the_kernel_and_why():
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("tiny", attention="auto", dtype="bfloat16")
  line = attention.startup_line(cfg, packed=True, seq_len=128)
  assert line.startswith("attention: xla in training (")
  if attention.platform() == "cpu":
    assert "no fused kernel on cpu" in line
  fast = model_lib.get_bert_config("tiny", attention="xla", attention_dropout_prob=0.0)
  assert attention.startup_line(fast, packed=False, seq_len=128) == (
      "attention: xla in training (requested)")
  with pytest.raises(attention.AttentionError, match="attention_dropout_prob=0.1"):
    attention.startup_line(model_lib.get_bert_config("tiny", attention="splash"), packed=True,
                           seq_len=128)


def _positions(ids):
  """Per-instance positions 0, 1, ... restarting where the id changes (0 at padding)."""
  ids = np.asarray(ids)
  pos = np.zeros_like(ids)
  for i in range(1, ids.shape[1]):
    pos[:, i] = np.where(ids[:, i] == ids[:, i - 1], pos[:, i - 1] + 1, 0)
  return jnp.asarray(np.where(ids > 0, pos, 0), jnp.int32)


def test_model_with_a_fused_kernel_equals_the_xla_model():
  # The whole packed pre-training forward and its parameter gradients, through model.py's
  # SelfAttention: pallas_gpu (interpret mode on CPU) against xla, float32, dropout off.
  from bert_jax.models import model as model_lib
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  t = 32
  ids = _ids(t, packed=True)
  rng = np.random.default_rng(1)
  batch = dict(input_ids=jnp.asarray(rng.integers(5, 99, (2, t)), jnp.int32) * (ids > 0),
               input_mask=(ids > 0).astype(jnp.int32), segment_ids=jnp.zeros((2, t), jnp.int32),
               masked_lm_positions=jnp.asarray([[1, 5, 9], [2, 20, 30]], jnp.int32),
               instance_ids=ids, position_ids=_positions(ids),
               cls_positions=jnp.asarray([[0, int(t * 0.3)], [0, t // 2]], jnp.int32))
  assert int(batch["position_ids"][0, int(t * 0.3)]) == 0                # instance 2 restarts

  def loss_and_grads(backend):
    cfg = model_lib.get_bert_config("tiny", vocab_size=99, hidden_dropout_prob=0.0,
                                    attention_dropout_prob=0.0, attention=backend)
    module = pretraining_heads.BertForPreTraining(cfg)
    params = nn.meta.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0), seq_len=t,
                                                 num_predictions=3))

    def loss(p):
      mlm, nsp = module.apply({"params": p}, batch, False,
                              method=pretraining_heads.pretraining_forward)
      return jnp.sum(jax.nn.log_softmax(mlm)[..., 7]) + jnp.sum(nsp[..., 0])

    return jax.value_and_grad(loss)(params)

  ref_loss, ref_grads = loss_and_grads("xla")
  got_loss, got_grads = loss_and_grads("pallas_gpu")
  np.testing.assert_allclose(got_loss, ref_loss, rtol=1e-5)
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(got_grads),
                          jax.tree.leaves(ref_grads)):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("seq_len,ok", [(16, True), (32, True), (128, True), (512, True),
                                        (48, False), (200, False)])
def test_pallas_gpu_lengths_must_fit_its_tiles(seq_len, ok):
  reason = attention.unsupported_reason("pallas_gpu", platform_name="gpu", packed=True,
                                        dtype="bfloat16", seq_len=seq_len, dropout=0.0)
  assert (reason is None) == ok, reason


# ----------------------------------------------------------------------------------------------
# Sliding-window (local) attention: ModernBERT's local layers (window 128: |i - j| <= 64).
# ----------------------------------------------------------------------------------------------
def _brute_force(q, k, v, ids, packed, window):
  """softmax over the keys each real query may see, one query at a time (float64 numpy)."""
  q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
  ids = np.asarray(ids)
  out = np.zeros_like(q)
  for b, i in zip(*np.nonzero(ids > 0)):
    j = np.arange(ids.shape[1])
    sees = (ids[b] > 0) & (np.abs(i - j) <= window // 2)
    if packed:
      sees &= ids[b] == ids[b, i]
    logits = np.einsum("ND,SND->NS", q[b, i], k[b, sees]) / np.sqrt(q.shape[-1])
    p = np.exp(logits - logits.max(-1, keepdims=True))
    out[b, i] = np.einsum("NS,SND->ND", p / p.sum(-1, keepdims=True), v[b, sees])
  return out


@pytest.mark.parametrize("blocked", [True, False], ids=["blocked", "masked"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_xla_window_equals_brute_force(packed, blocked):
  # T = 46 is not a multiple of the 4-token blocks (window 8): the last block is padded.
  t, window = 46, 8
  q, k, v, _ = _qkv(t, jnp.float32)
  ids = _ids(t, packed)
  out = attention.dot_product_attention(q, k, v, ids, packed=packed, window=window) if (
      blocked) else attention.xla_attention(q, k, v, ids, packed=packed, window=window,
                                            blocked=False)
  real = np.asarray(ids > 0)
  expected = _brute_force(q, k, v, ids, packed, window)
  np.testing.assert_allclose(np.asarray(out)[real], expected[real], atol=1e-5, rtol=1e-5)
  # The window matters here: full attention differs.
  full = attention.dot_product_attention(q, k, v, ids, packed=packed)
  assert not np.allclose(np.asarray(full)[real], expected[real], atol=1e-3)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_blocked_window_gradients_equal_the_masked_full_attention(packed):
  t, window = 46, 8
  q, k, v, cot = _qkv(t, jnp.float32)
  ids = _ids(t, packed)
  real = (ids > 0)[:, :, None, None]

  def grads(blocked):
    loss = lambda q, k, v: jnp.sum(jnp.where(real, attention.xla_attention(
        q, k, v, ids, packed=packed, window=window, blocked=blocked) * cot, 0.0))
    return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

  for name, g, r in zip("qkv", grads(True), grads(False)):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def test_blocked_window_dropout_drops_probabilities():
  q, k, v, _ = _qkv(46, jnp.float32)
  ids = _ids(46, True)
  kw = dict(packed=True, window=8, dropout_rate=0.5, deterministic=False)
  a = attention.dot_product_attention(q, k, v, ids, dropout_rng=jax.random.PRNGKey(0), **kw)
  b = attention.dot_product_attention(q, k, v, ids, dropout_rng=jax.random.PRNGKey(0), **kw)
  plain = attention.dot_product_attention(q, k, v, ids, packed=True, window=8)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, plain)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_splash_window_equals_xla_float32(packed):
  # 384 tokens in 128-token tiles with a 32-token window: tiles fully inside, partly inside and
  # outside the window (skipped), padding and instance boundaries inside windows.
  t, window = 384, 32
  q, k, v, cot = _qkv(t, jnp.float32)
  ids = _ids(t, packed)
  real = (ids > 0)[:, :, None, None]

  def run(backend):
    def loss(q, k, v):
      out = attention.dot_product_attention(q, k, v, ids, packed=packed, backend=backend,
                                            window=window)
      return jnp.sum(jnp.where(real, out * cot, 0.0)), out
    (_, out), g = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(q, k, v)
    return np.asarray(jnp.where(real, out, 0.0)), g

  out, grads = run("splash")
  ref, ref_grads = run("xla")
  np.testing.assert_allclose(out, ref, atol=1e-5, rtol=1e-5)
  for name, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(g, r, atol=1e-5, rtol=1e-5, err_msg=f"d{name}")


def _flops(fn, *args):
  cost = jax.jit(fn).lower(*args).compile().cost_analysis()
  return (cost[0] if isinstance(cost, (list, tuple)) else cost)["flops"]


def test_windowed_xla_flops_grow_linearly_in_length():
  # XLA's cost analysis of the compiled attention: the blocked local path scores 3 x 64 keys per
  # query whatever T (x2 per doubling of T); the full one T keys (x4 per doubling). The masked
  # full attention with the window in its mask would count the same as full: masking saves no
  # FLOPs, which is why xla switches to the blocked path.
  n, d = 2, 16
  flops = {}
  for t in (1024, 2048, 4096):
    x = jnp.zeros((1, t, n, d), jnp.float32)
    ids = jnp.ones((1, t), jnp.int32)
    for window in (128, None):
      flops[t, window] = _flops(lambda q, k, v, i, w=window: attention.dot_product_attention(
          q, k, v, i, packed=True, window=w), x, x, x, ids)
  for t in (1024, 2048):
    assert 1.9 < flops[2 * t, 128] / flops[t, 128] < 2.1, flops
    assert 3.8 < flops[2 * t, None] / flops[t, None] < 4.2, flops
  # At 4,096 tokens: the two score einsums, 2 x 2 x T x 192 x N x D, plus the softmax.
  analytic = 2 * 2 * 4096 * 192 * n * d
  assert analytic < flops[4096, 128] < 1.3 * analytic, (flops[4096, 128], analytic)
  assert flops[4096, None] / flops[4096, 128] > 15


def test_splash_window_skips_the_tiles_outside_it():
  # The kernel's static block mask: with window 128 each 128-row query tile reaches 3 key tiles
  # (2 at the ends), so the computed tiles grow as 3 T / 128, not (T / 128)^2.
  for t in (1024, 2048, 4096):
    info = attention.splash_kernel(t, 1, window=128).fwd_mask_info
    computed = int(np.count_nonzero(np.asarray(info.block_mask)))
    assert computed == 3 * (t // 128) - 2, (t, computed)
    full = attention.splash_kernel(t, 1).fwd_mask_info
    blk = t // np.asarray(full.block_mask).shape[1]
    assert int(np.count_nonzero(np.asarray(full.block_mask))) * blk ** 2 == t * t


@pytest.mark.parametrize("backend,match", [
    ("cudnn", "left side only"),
    ("pallas_gpu", "segment ids and causal only"),
])
def test_a_gpu_kernel_without_a_two_sided_window_is_refused(backend, match):
  with pytest.raises(attention.AttentionError, match=match) as e:
    attention.select_backend(backend, packed=False, dtype="bfloat16", seq_len=512, dropout=0.0,
                             platform_name="gpu", window=128)
  assert "\n" not in str(e.value) and "local layers (window 128)" in str(e.value)
  # And at the call, never a silent full attention (pallas_gpu runs here in interpret mode).
  q, k, v, _ = _qkv(32, jnp.float32)
  if backend == "pallas_gpu":
    with pytest.raises(attention.AttentionError, match=match):
      attention.dot_product_attention(q, k, v, _ids(32, False), packed=False,
                                      backend=backend, window=8)


@pytest.mark.parametrize("platform,packed,expected", [
    ("gpu", False, "xla"), ("gpu", True, "xla"), ("tpu", True, "splash"), ("cpu", True, "xla")])
def test_auto_with_a_window(platform, packed, expected):
  choice = attention.select_backend("auto", packed=packed, dtype="bfloat16", seq_len=1024,
                                    dropout=0.0, platform_name=platform, window=128)
  assert choice.backend == expected, choice


@pytest.mark.parametrize("window", [0, 1, 127, -2, 64.0, True])
def test_a_bad_window_is_a_one_line_error(window):
  q, k, v, _ = _qkv(32, jnp.float32)
  with pytest.raises(attention.AttentionError, match=f"window={window!r}: must be an even"):
    attention.dot_product_attention(q, k, v, _ids(32, True), packed=True, window=window)


def test_local_window_and_the_training_kernels_of_each_layer_kind():
  """The window the start-up line of train and plan finds for the local layers (it printed the
  global layers' kernel alone, so an explicit kernel the local layers refuse passed the start-up
  check), and the planner's kernels as data."""
  from bert_jax.models import model as model_lib
  bert = model_lib.get_bert_config("tiny", attention="auto", dtype="bfloat16",
                                   attention_dropout_prob=0.0)
  assert attention.local_window(bert) is None
  assert attention.training_backends(bert, packed=True, seq_len=1024,
                                     platform_name="gpu") == {"global": "pallas_gpu"}
  modern = model_lib.get_bert_config("modernbert-tiny", attention="auto", dtype="bfloat16")
  assert attention.local_window(modern) == modern.local_window == 16   # the tiny preset's
  assert attention.training_backends(modern, packed=True, seq_len=1024, platform_name="gpu") == {
      "global": "pallas_gpu", "local": "xla"}
  assert attention.training_backends(modern, packed=True, seq_len=1024,
                                     platform_name="cpu") == {"global": "xla", "local": "xla"}
  # The start-up line finds the local layers by itself, as training_backends does.
  assert "; local layers (window 16): xla in training" in attention.startup_line(
      modern, packed=True, seq_len=1024, platform_name="cpu")
  assert "local layers" not in attention.startup_line(bert, packed=True, seq_len=1024,
                                                      platform_name="cpu")
  with pytest.raises(attention.AttentionError, match="cudnn on the local layers"):
    attention.training_backends(dataclasses.replace(modern, attention="cudnn"), packed=False,
                                seq_len=1024, platform_name="gpu")


def test_startup_line_names_the_local_layers_kernel():
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("tiny", attention="auto", dtype="bfloat16",
                                  attention_dropout_prob=0.0)
  line = attention.startup_line(cfg, packed=True, seq_len=1024, platform_name="gpu", window=128)
  assert line.startswith("attention: pallas_gpu in training (auto: fastest kernel for packed "
                         "rows on gpu); local layers (window 128): xla in training (auto fell "
                         "back: "), line
  cfg = model_lib.get_bert_config("tiny", attention="cudnn", dtype="bfloat16",
                                  attention_dropout_prob=0.0)
  with pytest.raises(attention.AttentionError, match="cudnn on the local layers"):
    attention.startup_line(cfg, packed=False, seq_len=1024, platform_name="gpu", window=128)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_blocked_window_bfloat16_is_close_to_float32(packed):
  # bf16 q/k/v (float32 logits and softmax inside, as jax.nn.dot_product_attention) against the
  # float32 brute force, at real tokens.
  t, window = 46, 8
  q, k, v, _ = _qkv(t, jnp.bfloat16)
  ids = _ids(t, packed)
  out = attention.dot_product_attention(q, k, v, ids, packed=packed, window=window)
  assert out.dtype == jnp.bfloat16
  real = np.asarray(ids > 0)
  expected = _brute_force(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32),
                          ids, packed, window)
  np.testing.assert_allclose(np.asarray(out, np.float32)[real], expected[real], atol=BF16_TOL,
                             rtol=BF16_TOL)


def test_cudnn_takes_packed_rows_on_hopper_only(monkeypatch):
  monkeypatch.setattr(attention, "_hopper_or_newer", lambda: True)
  assert attention.select_backend("cudnn", packed=True, dtype="bfloat16", seq_len=512,
                                  dropout=0.0, platform_name="gpu").backend == "cudnn"
  # auto keeps the Pallas kernel first for packed rows until cuDNN's packed form wins on a chip.
  assert attention.select_backend("auto", packed=True, dtype="bfloat16", seq_len=512,
                                  dropout=0.0, platform_name="gpu").backend == "pallas_gpu"
  monkeypatch.setattr(attention, "_hopper_or_newer", lambda: False)
  with pytest.raises(attention.AttentionError, match="Hopper"):
    attention.select_backend("cudnn", packed=True, dtype="bfloat16", seq_len=512, dropout=0.0,
                             platform_name="gpu")


def _packed_ids(rng, b, t, max_instances):
  """Rows of contiguous instances 1..n (each >= 2 tokens) then padding 0, as packing writes."""
  ids = np.zeros((b, t), np.int32)
  for r in range(b):
    pos, n = 0, 0
    while n < max_instances:
      length = int(rng.integers(2, t // 3 + 2))
      if pos + length > t or (n and rng.random() < 0.2):
        break
      n += 1
      ids[r, pos:pos + length] = n
      pos += length
  return ids


@pytest.mark.parametrize("max_segments", [None, 8])
def test_packed_offsets_describe_exactly_the_block_diagonal_mask(max_segments):
  """cuDNN's ragged layout (offsets, lengths) must say the same as the instance ids: a key is
  visible to a query iff both lie in one instance's [offset, offset + length) (the mask the
  xla path applies); absent instances are -1, as jax's wrapper requires."""
  rng = np.random.default_rng(0)
  ids = _packed_ids(rng, 16, 64, 8)
  ids[3] = 0                                            # an all-padding row
  ids[4, :] = np.repeat(np.arange(1, 9), 8)             # eight instances filling the row
  m = max_segments or ids.shape[1]
  offsets, lengths = attention.packed_offsets(jnp.asarray(ids), m)
  offsets, lengths = np.asarray(offsets), np.asarray(lengths)
  assert offsets.shape == (16, m + 1) and lengths.shape == (16, m)
  assert (offsets[:, -1] == -1).all()
  t = ids.shape[1]
  for r in range(ids.shape[0]):
    seg = np.zeros(t, np.int32)                         # instance of each token per (offsets, lengths)
    for s in range(m):
      if lengths[r, s] == -1:
        assert offsets[r, s] == -1
        continue
      seg[offsets[r, s]:offsets[r, s] + lengths[r, s]] = s + 1
    np.testing.assert_array_equal(seg, ids[r])
    expected = np.asarray(attention.attention_mask(jnp.asarray(ids[r:r + 1]), packed=True))
    mine = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
    np.testing.assert_array_equal(np.broadcast_to(expected, (1, 1, t, t))[0, 0][seg > 0],
                                  mine[seg > 0])


def test_prepare_xla_flags_keeps_cudnn_out_of_cuda_graphs_only_where_it_may_drop(monkeypatch):
  """Issue 38: the programs' main sets CUDNN_DROPOUT_XLA_FLAG before JAX starts on a host with
  jax's CUDA plugin when the model may run cuDNN's dropout; never over a user's own setting, never
  for a model without attention dropout or on another backend, never on a host without the
  plugin, never once JAX has started (flags are read once)."""
  from bert_jax.models import model as model_lib
  from jax._src import xla_bridge
  cfg = model_lib.get_bert_config("tiny", attention="auto")                # dropout 0.1
  monkeypatch.setattr(attention, "_cuda_plugin_installed", lambda: True)
  monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: False)
  env = {"XLA_FLAGS": "--xla_gpu_autotune_level=2"}
  assert attention.prepare_xla_flags(cfg, env)
  assert env["XLA_FLAGS"] == "--xla_gpu_autotune_level=2 " + attention.CUDNN_DROPOUT_XLA_FLAG
  assert attention._cudnn_out_of_command_buffers() is False      # os.environ was not touched
  env = {}
  assert attention.prepare_xla_flags(dataclasses.replace(cfg, attention="cudnn"), env)
  assert env == {"XLA_FLAGS": attention.CUDNN_DROPOUT_XLA_FLAG}
  for c, e in ((dataclasses.replace(cfg, attention_dropout_prob=0.0), {}),
               (dataclasses.replace(cfg, attention="pallas_gpu"), {}),
               (cfg, {"XLA_FLAGS": "--xla_gpu_enable_command_buffer="})):   # the user's choice
    before = dict(e)
    assert not attention.prepare_xla_flags(c, e) and e == before
  monkeypatch.setattr(attention, "_cuda_plugin_installed", lambda: False)
  assert not attention.prepare_xla_flags(cfg, {})
  monkeypatch.setattr(attention, "_cuda_plugin_installed", lambda: True)
  monkeypatch.setattr(xla_bridge, "backends_are_initialized", lambda: True)
  assert not attention.prepare_xla_flags(cfg, {})
  # What the flags say: the last value wins, as XLA reads them.
  assert attention._command_buffer_types("--xla_gpu_enable_command_buffer=FUSION,CUDNN "
                                         "--xla_gpu_enable_command_buffer=FUSION") == {"FUSION"}
  assert attention._command_buffer_types("--xla_gpu_enable_command_buffer=") == set()
  assert attention._command_buffer_types("") is None
