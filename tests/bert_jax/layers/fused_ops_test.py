"""fused_ops: each fused formulation equals the path it replaces, forward and gradients (bf16
tolerance), and the bias+GELU switch refuses the exact erf GELU rather than change the recipe."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.layers import fused_ops
from bert_jax.models import model as model_lib


def _close(a, b, tol):
  a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
  scale = max(float(np.abs(b).max()), 1e-6)
  assert float(np.abs(a - b).max()) <= tol * scale, (float(np.abs(a - b).max()), scale)


def test_gelu_tanh_is_jaxs_tanh_gelu_forward_and_backward():
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 64), jnp.float32) * 3
  for dtype, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)):
    xd = x.astype(dtype)
    _close(fused_ops.gelu_tanh(xd), jax.nn.gelu(xd, approximate=True), tol)
    g = lambda f: jax.grad(lambda v: jnp.sum(f(v).astype(jnp.float32) ** 2))(xd)
    _close(g(fused_ops.gelu_tanh), g(lambda v: jax.nn.gelu(v, approximate=True)), 2 * tol)
    assert fused_ops.gelu_tanh(xd).dtype == dtype     # in the dot's output type, no upcast


@pytest.mark.slow   # gradients of two LayerNorms in two dtypes (~4 s on 2 cores)
def test_residual_layer_norm_equals_flax_layer_norm_of_the_sum_with_gradients():
  kx, ky, ks, kg = jax.random.split(jax.random.PRNGKey(1), 4)
  x = jax.random.normal(kx, (2, 8, 32)) * 2 + 0.5
  y = jax.random.normal(ky, (2, 8, 32))
  ref = nn.LayerNorm(epsilon=1e-12, dtype=jnp.float32)
  fused = fused_ops.ResidualLayerNorm(1e-12)
  params = ref.init(ks, x)["params"]
  params = {"scale": params["scale"] + jax.random.normal(kg, (32,)) * 0.1,
            "bias": params["bias"] + 0.3}
  assert jax.tree.structure(params) == jax.tree.structure(
      nn.unbox(fused.init(ks, x, y)["params"]))         # the same parameter names
  w = jax.random.normal(kg, (2, 8, 32))
  for dtype, tol in ((jnp.float32, 1e-5), (jnp.bfloat16, 2e-2)):
    xd, yd = x.astype(dtype), y.astype(dtype)
    out_ref = ref.apply({"params": params}, xd + yd)
    out = fused.apply({"params": params}, xd, yd)
    assert out.dtype == jnp.float32
    _close(out, out_ref, tol)
    loss = lambda f: lambda p, a, b: jnp.sum(f(p, a, b) * w)
    g_ref = jax.grad(loss(lambda p, a, b: ref.apply({"params": p}, a + b)), argnums=(0, 1, 2))(
        params, xd, yd)
    g = jax.grad(loss(lambda p, a, b: fused.apply({"params": p}, a, b)), argnums=(0, 1, 2))(
        params, xd, yd)
    for a, b in zip(jax.tree.leaves(g), jax.tree.leaves(g_ref)):
      assert a.dtype == b.dtype
      _close(a, b, 4 * tol)


def _bert(**kw):
  return model_lib.get_bert_config("tiny", vocab_size=128, num_layers=2, dtype="bfloat16",
                                   hidden_act="gelu_tanh", **kw)


@pytest.mark.slow   # applies a tiny BERT op by op (several seconds on 2 cores)
def test_the_switched_encoder_equals_the_unfused_one_forward_and_gradients():
  """Both switches on vs off, BERT tiny in bf16 with dropout (the same keys): the same params,
  outputs and gradients to bf16 tolerance."""
  ids = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 5, 128)
  mask = jnp.ones_like(ids).at[1, 12:].set(0)
  seg = jnp.zeros_like(ids)
  plain, fused = model_lib.BertModel(_bert()), model_lib.BertModel(
      _bert(fused_bias_gelu=True, fused_residual_norm=True))
  params = nn.unbox(plain.init(jax.random.PRNGKey(0), ids, mask, seg)["params"])
  assert jax.tree.structure(params) == jax.tree.structure(
      nn.unbox(fused.init(jax.random.PRNGKey(0), ids, mask, seg)["params"]))

  def loss(model):
    def f(p):
      out = model.apply({"params": p}, ids, mask, seg, deterministic=False,
                        rngs={"dropout": jax.random.PRNGKey(7)})
      # Random weights: a plain sum of a LayerNorm's output is constant (zero gradient).
      w = jax.random.normal(jax.random.PRNGKey(3), out["sequence_output"].shape)
      return jnp.sum(out["sequence_output"].astype(jnp.float32) * w * mask[..., None]), out
    return f

  (l0, o0), g0 = jax.value_and_grad(loss(plain), has_aux=True)(params)
  (l1, o1), g1 = jax.value_and_grad(loss(fused), has_aux=True)(params)
  _close(o1["sequence_output"], o0["sequence_output"], 3e-2)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g0)):
    if "'key']['bias']" in jax.tree_util.keystr(path):
      continue   # zero in exact maths (a key bias shifts a query's logits alike): bf16 noise
    _close(a, b, 6e-2)


def test_fused_bias_gelu_refuses_the_exact_erf_gelu_and_prenorm_refuses_the_residual_norm():
  with pytest.raises(ValueError, match="hidden_act='gelu_tanh'"):
    model_lib.get_bert_config("tiny", fused_bias_gelu=True)        # BERT's preset: erf "gelu"
  with pytest.raises(ValueError, match="pre-norm"):
    model_lib.get_bert_config("modernbert-tiny", fused_residual_norm=True)
  assert "fused_bias_gelu" not in _bert(fused_bias_gelu=True).to_dict()   # how it runs, not what
