"""Layer-wise distillation (bert_jax/layerwise.py): the encoder's attention scores on request,
the layer map, the loss parts, the start-up checks, and one student step against a teacher."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import attention as attention_lib
from bert_jax import model as model_lib


def _qkv(seed=0, b=2, t=8, n=2, d=4):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(k, (b, t, n, d), jnp.float32) for k in ks]


@pytest.mark.parametrize("packed", [False, True])
def test_scored_attention_is_the_xla_path_plus_its_scores(packed):
  q, k, v = _qkv()
  ids = (jnp.array([[1, 1, 2, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 2, 2]]) if packed else
         jnp.array([[1] * 8, [1] * 5 + [0] * 3]))
  ctx, scores = attention_lib.scored_attention(q, k, v, ids, packed=packed)
  want = attention_lib.xla_attention(q, k, v, ids, packed=packed)
  real = (ids > 0)[:, :, None, None]
  np.testing.assert_allclose(np.where(real, ctx, 0), np.where(real, want, 0), atol=1e-5)
  np.testing.assert_allclose(scores, jnp.einsum("BTND,BSND->BNTS", q, k) / 2.0, atol=1e-5)
  # With dropout: the same probabilities dropped as xla_attention's own dropout path.
  rng = jax.random.PRNGKey(3)
  ctx_d, _ = attention_lib.scored_attention(q, k, v, ids, packed=packed, dropout_rate=0.5,
                                            dropout_rng=rng)
  want_d = attention_lib.xla_attention(q, k, v, ids, packed=packed, dropout_rate=0.5,
                                       dropout_rng=rng)
  np.testing.assert_allclose(ctx_d, want_d, atol=1e-5)


def test_encoder_gives_scores_only_when_asked():
  """Default apply: no scores collection, the same outputs; init never sows them."""
  c = model_lib.get_bert_config("tiny", vocab_size=50)
  m = model_lib.BertModel(c)
  ids = jnp.ones((2, 8), jnp.int32)
  mask = jnp.array([[1] * 8, [1] * 5 + [0] * 3])
  variables = m.init(jax.random.PRNGKey(0), ids, mask, ids * 0)
  assert set(variables) == {"params"}
  plain = m.apply(variables, ids, mask, ids * 0)
  scored, state = m.apply(variables, ids, mask, ids * 0, mutable=["attention_scores"])
  np.testing.assert_array_equal(plain["sequence_output"], scored["sequence_output"])
  layers = state["attention_scores"]["encoder"]
  assert sorted(layers) == [f"layer_{i}" for i in range(c.num_layers)]
  (s0,) = layers["layer_0"]["attention"]["scores"]
  assert s0.shape == (2, c.num_heads, 8, 8) and s0.dtype == jnp.float32
