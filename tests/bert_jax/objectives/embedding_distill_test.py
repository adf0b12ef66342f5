"""Distillation into a bi-encoder (issue 48 item 4; bert_jax/objectives/embedding_distill.py)
against sentence-transformers 6.2 (torch CPU) on the same embeddings: MarginMSELoss (labels as
margins and as 1 + k scores, 1 and several negatives, dot and cosine) and EmbedDistillLoss /
MSELoss through the same projection weights; value and gradient w.r.t. the embeddings (and the
projection) within 1e-5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.objectives import embedding_distill as ed

torch = pytest.importorskip("torch")
st_losses = pytest.importorskip("sentence_transformers.sentence_transformer.losses")
st_util = pytest.importorskip("sentence_transformers.util")

B, D, G = 6, 16, 10


def _batch(k, seed=0):
  rng = np.random.default_rng(seed)
  a = rng.normal(size=(B, D)).astype(np.float32)
  c = rng.normal(size=(B, 1 + k, D)).astype(np.float32)
  scores = rng.normal(size=(B, 1 + k)).astype(np.float32)
  return a, c, scores


def _bare(cls, **fields):
  """A sentence-transformers loss without a model: only compute_loss_from_embeddings is used."""
  loss = cls.__new__(cls)
  torch.nn.Module.__init__(loss)
  for k, v in fields.items():
    setattr(loss, k, v)
  return loss


def _st_margin_mse(a, c, labels, similarity):
  loss = _bare(st_losses.MarginMSELoss, loss_fct=torch.nn.MSELoss(), similarity_fct=(
      st_util.pairwise_dot_score if similarity == "dot" else st_util.pairwise_cos_sim))
  ta, tc = torch.tensor(a, requires_grad=True), torch.tensor(c, requires_grad=True)
  value = loss.compute_loss_from_embeddings([ta] + [tc[:, j] for j in range(c.shape[1])],
                                            torch.tensor(labels))
  value.backward()
  return float(value.detach()), ta.grad.numpy(), tc.grad.numpy()


@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("similarity", ["dot", "cos"])
@pytest.mark.parametrize("label_form", ["scores", "margins"])
def test_margin_mse_equals_sentence_transformers(k, similarity, label_form):
  a, c, scores = _batch(k)
  margins = np.asarray(ed.margins_of_scores(scores))
  # ST reads either form: 1 + k scores (mine_hard_negatives' output_scores) or k margins.
  want, ga_want, gc_want = _st_margin_mse(a, c, scores if label_form == "scores" else margins,
                                          similarity)
  value, (ga, gc) = jax.value_and_grad(
      lambda x, y: ed.margin_mse(x, y, jnp.asarray(margins), similarity), argnums=(0, 1))(a, c)
  np.testing.assert_allclose(float(value), want, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ga, ga_want, atol=1e-5)
  np.testing.assert_allclose(gc, gc_want, atol=1e-5)


def test_margin_mse_padding_rows_weigh_nothing():
  a, c, scores = _batch(2)
  m = ed.margins_of_scores(scores)
  w = np.array([1, 1, 1, 1, 0, 0], np.float32)
  np.testing.assert_allclose(float(ed.margin_mse(a, c, m, weights=w)),
                             float(ed.margin_mse(a[:4], c[:4], m[:4])), rtol=1e-6)


def test_teacher_scores_are_cosines_of_the_anchor():
  v = np.random.default_rng(1).normal(size=(B, 4, G)).astype(np.float32)
  u = v / np.linalg.norm(v, axis=-1, keepdims=True)
  np.testing.assert_allclose(np.asarray(ed.teacher_scores(v)),
                             np.einsum("bd,bnd->bn", u[:, 0], u[:, 1:]), atol=1e-6)


@pytest.mark.parametrize("distance", ["mse", "l2", "cosine"])
@pytest.mark.parametrize("projected", [True, False])
def test_embed_distill_equals_sentence_transformers(distance, projected):
  """EmbedDistillLoss(distance_metric, projection_dim=G) (MSELoss is distance "mse") with its
  nn.Linear's weights copied: ours is x @ kernel + bias with kernel = weight.T."""
  rng = np.random.default_rng(2)
  s = 3
  student = rng.normal(size=(B, s, D)).astype(np.float32)
  width = G if projected else D
  teacher = rng.normal(size=(B, s, width)).astype(np.float32)
  loss = _bare(st_losses.EmbedDistillLoss, distance_metric=distance,
               projection_dim=G if projected else None, projection=None)
  if projected:
    loss.projection = torch.nn.Linear(D, G)
  ts = torch.tensor(student, requires_grad=True)
  want = loss.compute_loss_from_embeddings([ts[:, j] for j in range(s)],
                                           [torch.tensor(teacher[:, j]) for j in range(s)])
  want.backward()
  if projected:
    kernel = loss.projection.weight.detach().numpy().T.copy()             # [D, G]
    bias = loss.projection.bias.detach().numpy().copy()

    def ours(x, kernel, bias):
      return ed.embed_distill(x @ kernel + bias, teacher, distance)
    value, (g, gk, gb) = jax.value_and_grad(ours, argnums=(0, 1, 2))(student, kernel, bias)
    np.testing.assert_allclose(gk, loss.projection.weight.grad.numpy().T, atol=1e-5)
    np.testing.assert_allclose(gb, loss.projection.bias.grad.numpy(), atol=1e-5)
  else:
    value, g = jax.value_and_grad(lambda x: ed.embed_distill(x, teacher, distance))(student)
  np.testing.assert_allclose(float(value), float(want.detach()), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g, ts.grad.numpy(), atol=1e-5)


def test_mse_loss_is_embed_distill_mse():
  """ST's MSELoss is EmbedDistillLoss(distance_metric="mse"): one check that the subclass is so."""
  loss = _bare(st_losses.MSELoss, distance_metric="mse", projection_dim=None, projection=None)
  rng = np.random.default_rng(3)
  x, y = rng.normal(size=(B, 2, D)).astype(np.float32), rng.normal(size=(B, 2, D)).astype(
      np.float32)
  want = loss.compute_loss_from_embeddings([torch.tensor(x[:, j]) for j in range(2)],
                                           [torch.tensor(y[:, j]) for j in range(2)])
  np.testing.assert_allclose(float(ed.embed_distill(x, y, "mse")), float(want), rtol=1e-6)
