"""bert_jax/layers/rope.py and bert_jax/layers/modern_layers.py against transformers' ModernBERT (PyTorch, CPU)
and NeoBERT's formulas; and the sliding window's definition (bert_jax/layers/attention.py) against
transformers' mask."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.layers import attention
from bert_jax.layers import modern_layers
from bert_jax.layers import rope

torch = pytest.importorskip("torch")
modeling = pytest.importorskip("transformers.models.modernbert.modeling_modernbert")
from transformers import ModernBertConfig  # noqa: E402


def _packed_positions():
  """[2, 12]: row 0 two instances (5 + 4 tokens) and 3 padding; row 1 one instance at large
  positions (where float32 angles are least exact): 8,180 .. 8,191."""
  row0 = list(range(5)) + list(range(4)) + [0, 0, 0]
  row1 = list(range(8180, 8192))
  return np.asarray([row0, row1], np.int64)


@pytest.mark.parametrize("layer_type,theta", [("full_attention", 160_000.0),
                                              ("sliding_attention", 10_000.0)])
def test_rope_equals_transformers_modernbert(layer_type, theta):
  cfg = ModernBertConfig(hidden_size=64, num_attention_heads=2, num_hidden_layers=3)
  assert cfg.rope_parameters[layer_type]["rope_theta"] == theta           # the paper's values
  b, t, n, d = 2, 12, 2, 32
  rng = np.random.default_rng(0)
  q, k = (rng.normal(size=(b, t, n, d)).astype(np.float32) * 3 for _ in range(2))
  pos = _packed_positions()
  rotary = modeling.ModernBertRotaryEmbedding(cfg)
  cos, sin = rotary(torch.from_numpy(q), torch.from_numpy(pos), layer_type)   # [B, T, D]
  # transformers rotates [B, N, T, D]; unsqueeze_dim=1 broadcasts cos/sin over heads.
  to_bntd = lambda x: torch.from_numpy(x).transpose(1, 2)
  hf_q, hf_k = modeling.apply_rotary_pos_emb(to_bntd(q), to_bntd(k), cos, sin, unsqueeze_dim=1)
  hf_q, hf_k = (x.transpose(1, 2).numpy() for x in (hf_q, hf_k))

  our_q, our_k = rope.apply_rope(jnp.asarray(q), jnp.asarray(k), jnp.asarray(pos, jnp.int32),
                                 theta=theta)
  np.testing.assert_allclose(our_q, hf_q, atol=1e-5, rtol=1e-5)
  np.testing.assert_allclose(our_k, hf_k, atol=1e-5, rtol=1e-5)
  assert not np.allclose(our_q, q, atol=1e-3)                            # it did turn them
  # Instance 2 of row 0 starts again at position 0: its first token is not turned at all.
  np.testing.assert_allclose(our_q[0, 5], q[0, 5], atol=1e-6)


def test_rope_scores_depend_on_relative_position_only():
  # q_i . k_j after RoPE is a function of i - j: shifting both positions by 100 keeps it.
  rng = np.random.default_rng(1)
  q, k = (jnp.asarray(rng.normal(size=(1, 6, 1, 16)), jnp.float32) for _ in range(2))
  pos = jnp.arange(6)[None]
  scores = lambda p: jnp.einsum("BTND,BSND->TS", *rope.apply_rope(q, k, p, theta=10_000.0))
  np.testing.assert_allclose(scores(pos), scores(pos + 100), atol=1e-4)
  np.testing.assert_array_equal(rope.apply_rope(q, k, None, theta=10_000.0)[0],
                                rope.apply_rope(q, k, pos, theta=10_000.0)[0])


@pytest.mark.parametrize("theta", [0, 0.5, -10_000.0, None, True])
def test_a_bad_theta_is_a_one_line_error(theta):
  q = jnp.zeros((1, 4, 1, 8))
  with pytest.raises(rope.RopeError, match=f"rope_theta={theta!r}: must be a number > 1"):
    rope.apply_rope(q, q, theta=theta)


def test_an_odd_head_dim_is_refused():
  q = jnp.zeros((1, 4, 1, 7))
  with pytest.raises(rope.RopeError, match="head_dim=7"):
    rope.apply_rope(q, q, theta=10_000.0)


def _torch_linear_to_kernel(linear):
  return jnp.asarray(linear.weight.detach().numpy().T)                   # [in, out]


def test_geglu_equals_transformers_modernbert_mlp():
  h, i = 32, 48
  cfg = ModernBertConfig(hidden_size=h, intermediate_size=i, num_attention_heads=2,
                         num_hidden_layers=1)
  assert cfg.hidden_activation == "gelu" and not cfg.mlp_bias
  torch.manual_seed(0)
  hf = modeling.ModernBertMLP(cfg).eval()
  ours = modern_layers.GatedFeedForward(hidden_size=h, intermediate_size=i, activation="gelu")
  x = np.random.default_rng(2).normal(size=(2, 5, h)).astype(np.float32)
  params = ours.init(jax.random.key(0), jnp.asarray(x))["params"]
  shapes = jax.tree.map(lambda p: p.value.shape if hasattr(p, "value") else p.shape, params,
                        is_leaf=lambda p: hasattr(p, "value"))
  assert shapes == {"Wi": {"kernel": (h, 2 * i)}, "Wo": {"kernel": (i, h)}}
  params = {"Wi": {"kernel": _torch_linear_to_kernel(hf.Wi)},
            "Wo": {"kernel": _torch_linear_to_kernel(hf.Wo)}}
  got = ours.apply({"params": params}, jnp.asarray(x))
  with torch.no_grad():
    expected = hf(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-5)
  # The activation sits on Wi's first half: swapping the halves changes the output.
  swapped = {"Wi": {"kernel": jnp.roll(params["Wi"]["kernel"], i, axis=1)}, "Wo": params["Wo"]}
  assert not np.allclose(ours.apply({"params": swapped}, jnp.asarray(x)), expected, atol=1e-3)


def test_swiglu_equals_neobert_formula():
  # NeoBERT (xformers SwiGLU, bias=False): w3(silu(x w12[:, :I]) * x w12[:, I:]), I from its
  # config's intermediate_size by the Llama 2/3 rule.
  h = 24
  i = modern_layers.swiglu_width(60)                                       # 40 -> 40
  assert modern_layers.swiglu_width(3072) == 2048                          # NeoBERT's 768-wide
  assert modern_layers.swiglu_width(100) == 72                             # 66 rounded up to x8
  ffn = modern_layers.GatedFeedForward(hidden_size=h, intermediate_size=i, activation="silu",
                                       names=("w12", "w3"))
  rng = np.random.default_rng(3)
  x = rng.normal(size=(2, 3, h))
  w12, w3 = rng.normal(size=(h, 2 * i)) * 0.2, rng.normal(size=(i, h)) * 0.2
  got = ffn.apply({"params": {"w12": {"kernel": jnp.asarray(w12, jnp.float32)},
                              "w3": {"kernel": jnp.asarray(w3, jnp.float32)}}},
                  jnp.asarray(x, jnp.float32))
  a, g = np.split(x @ w12, 2, axis=-1)
  silu = a / (1 + np.exp(-a))
  np.testing.assert_allclose(got, (silu * g) @ w3, atol=1e-5, rtol=1e-5)


def test_feed_forward_with_biases_and_dropout():
  ffn = modern_layers.GatedFeedForward(hidden_size=8, intermediate_size=12, use_bias=True,
                                       dropout_rate=0.5)
  x = jnp.ones((1, 4, 8))
  params = ffn.init(jax.random.key(0), x)["params"]
  assert {k: sorted(v) for k, v in params.items()} == {"Wi": ["bias", "kernel"],
                                                       "Wo": ["bias", "kernel"]}
  a = ffn.apply({"params": params}, x, deterministic=False, rngs={"dropout": jax.random.key(1)})
  b = ffn.apply({"params": params}, x)
  assert not np.allclose(a, b)
  with pytest.raises(modern_layers.ModernLayerError, match="activation='relu'"):
    modern_layers.GatedFeedForward(hidden_size=8, intermediate_size=12,
                                   activation="relu").init(jax.random.key(0), x)


@pytest.mark.parametrize("kind,torch_norm", [
    ("layer_norm_no_bias", lambda h: torch.nn.LayerNorm(h, eps=1e-5, bias=False)),
    ("layer_norm", lambda h: torch.nn.LayerNorm(h, eps=1e-5)),
    ("rms_norm", lambda h: torch.nn.RMSNorm(h, eps=1e-5)),
])
def test_norms_equal_torch(kind, torch_norm):
  h = 16
  rng = np.random.default_rng(4)
  x = (rng.normal(size=(2, 3, h)) * 3 + 1).astype(np.float32)
  ref = torch_norm(h)
  with torch.no_grad():
    ref.weight.copy_(torch.from_numpy(rng.normal(size=h).astype(np.float32)))
    if getattr(ref, "bias", None) is not None:
      ref.bias.copy_(torch.from_numpy(rng.normal(size=h).astype(np.float32)))
  ours = modern_layers.norm(kind, eps=1e-5, name="norm")
  params = ours.init(jax.random.key(0), jnp.asarray(x))["params"]
  assert sorted(params) == (["bias", "scale"] if kind == "layer_norm" else ["scale"])
  params = {"scale": jnp.asarray(ref.weight.detach().numpy())}
  if kind == "layer_norm":
    params["bias"] = jnp.asarray(ref.bias.detach().numpy())
  with torch.no_grad():
    expected = ref(torch.from_numpy(x)).numpy()
  np.testing.assert_allclose(ours.apply({"params": params}, jnp.asarray(x)), expected,
                             atol=1e-5, rtol=1e-5)
  with pytest.raises(modern_layers.ModernLayerError, match="norm='batch_norm'"):
    modern_layers.norm("batch_norm", eps=1e-5, name="n")


def test_layer_attention_follows_transformers_layer_types():
  cfg = ModernBertConfig(num_hidden_layers=22)                            # modernbert-base
  ours = [modern_layers.layer_attention(i, global_every=3, window=cfg.local_attention,
                                        global_theta=160_000.0, local_theta=10_000.0)
          for i in range(22)]
  for (window, theta), hf_type in zip(ours, cfg.layer_types):
    assert (window is None) == (hf_type == "full_attention")
    assert theta == cfg.rope_parameters[hf_type]["rope_theta"]
    assert window in (None, 128)
  assert sum(w is None for w, _ in ours) == 8
  with pytest.raises(modern_layers.ModernLayerError, match="global_attn_every_n_layers=0"):
    modern_layers.layer_attention(0, global_every=0, window=128, global_theta=1e4,
                                  local_theta=1e4)


def test_window_is_transformers_modernbert_definition():
  # ModernBERT's local_attention=128 -> config.sliding_window = 64 -> masking_utils'
  # sliding_window_bidirectional_overlay(64): abs(q_idx - kv_idx) <= 64.
  from transformers import masking_utils
  assert ModernBertConfig(local_attention=128).sliding_window == 64
  overlay = masking_utils.sliding_window_bidirectional_overlay(64)
  t = 200
  hf = np.array([[bool(overlay(0, 0, i, j)) for j in range(t)] for i in range(t)])
  ours = np.asarray(attention.attention_mask(jnp.ones((1, t), jnp.int32), packed=False,
                                             window=128))[0, 0]
  np.testing.assert_array_equal(ours, hf)
  assert ours[100].sum() == 129                                          # 64 + itself + 64
