"""Fine-tuning heads: output shapes, parameter trees, and that `bert` is the plain BertModel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.models import heads
from bert_jax.models import model as model_lib

CFG = model_lib.get_bert_config("tiny", vocab_size=50, hidden_size=32, num_heads=2,
                                intermediate_size=64, max_position_embeddings=16)


def _inputs(shape):
  ids = jax.random.randint(jax.random.PRNGKey(1), shape, 5, 50)
  mask = jnp.ones(shape, jnp.int32).at[..., -3:].set(0)
  return ids, mask, jnp.zeros(shape, jnp.int32)


@pytest.mark.parametrize("family,shape,want", [
    ("classification", (3, 8), [(3, 4)]),
    ("regression", (3, 8), [(3, 1)]),
    ("span", (3, 8), [(3, 8), (3, 8)]),
    ("tagging", (3, 8), [(3, 8, 4)]),
    ("multiple_choice", (3, 4, 8), [(3, 4)]),
])
def test_shapes_and_parameter_tree(family, shape, want):
  model = heads.create_model(family, CFG, num_labels=4, num_choices=4)
  inputs = _inputs(shape)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), *inputs)["params"])
  out = model.apply({"params": params}, *inputs)
  out = out if isinstance(out, tuple) else (out,)
  assert [o.shape for o in out] == want
  assert all(o.dtype == jnp.float32 for o in out)
  head = {"span": "qa_outputs"}.get(family, "classifier")
  assert set(params) == {"bert", head}
  # `bert` is exactly BertModel's tree, so pre-trained parameters drop in.
  bare = nn.unbox(model_lib.BertModel(CFG).init(jax.random.PRNGKey(0), *_inputs((1, 8)))["params"])
  assert jax.tree.structure(params["bert"]) == jax.tree.structure(bare)
  # Dropout is active only when asked for.
  a = model.apply({"params": params}, *inputs, deterministic=False,
                  rngs={"dropout": jax.random.PRNGKey(2)})
  a = a if isinstance(a, tuple) else (a,)
  assert not np.allclose(a[0], out[0])


def test_multiple_choice_scores_each_choice_independently():
  model = heads.create_model("multiple_choice", CFG, num_choices=4)
  ids, mask, seg = _inputs((2, 4, 8))
  params = nn.unbox(model.init(jax.random.PRNGKey(0), ids, mask, seg)["params"])
  scores = model.apply({"params": params}, ids, mask, seg)
  # Swapping two choices swaps their scores: one shared scorer, no cross-choice mixing.
  swapped = model.apply({"params": params}, ids[:, ::-1], mask[:, ::-1], seg[:, ::-1])
  np.testing.assert_allclose(swapped, scores[:, ::-1], rtol=1e-5, atol=1e-6)


def test_unknown_task_type():
  with pytest.raises(ValueError, match="unknown task type 'ranking'"):
    heads.create_model("ranking", CFG)
