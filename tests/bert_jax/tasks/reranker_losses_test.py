"""The reranker's losses (bert_jax/tasks/reranker.py) against sentence-transformers' CrossEncoder
losses of the same name (6.2.0), run as they are: each loss's own forward, with a CrossEncoder
whose score of each (query, document) pair is looked up in a table of torch leaves, so the
losses see exactly our scores. Loss values and gradients w.r.t. the scores within 1e-5."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.tasks import reranker
from tests.testlib import reranker_testlib

torch = pytest.importorskip("torch")
ce_losses = pytest.importorskip("sentence_transformers.cross_encoder.losses")


@pytest.fixture(scope="module")
def scored_model(tmp_path_factory):
  """(CrossEncoder, set_scores(dict pair -> float) -> torch leaves by pair)."""
  directory = tmp_path_factory.mktemp("ce")
  vocab = reranker_testlib.tasks_testlib.write_vocab(str(directory), "q d a b c")
  from sentence_transformers import CrossEncoder  # pylint: disable=g-import-not-at-top
  model = CrossEncoder(reranker_testlib.write_cross_encoder(str(directory), vocab, hidden=8,
                                                            layers=1, max_length=16))
  table = {}

  def preprocess(pairs, prompt=None, task=None):
    del prompt, task
    return {"pair": [tuple(p) for p in pairs]}   # no tensor: batch_to_device leaves it

  def forward(inputs):
    return {"scores": torch.stack([table[p] for p in inputs["pair"]])[:, None]}

  model.preprocess, model.forward = preprocess, forward

  def set_scores(scores):
    table.clear()
    table.update({p: torch.tensor(float(s), dtype=torch.float64, requires_grad=True)
                  for p, s in scores.items()})
    return table
  return model, set_scores


def _rows(rng, batch=4, width=3):
  """Queries q0.., each with width documents d{i}_{j} and random scores [B, S]."""
  queries = [f"q{i}" for i in range(batch)]
  docs = [[f"d{i}_{j}" for j in range(width)] for i in range(batch)]
  scores = rng.normal(size=(batch, width)) * 3
  return queries, docs, scores


def _grads(table, pairs):
  return np.array([[0.0 if table[p].grad is None else float(table[p].grad) for p in row]
                   for row in pairs])


def test_bce_matches_sentence_transformers(scored_model):
  model, set_scores = scored_model
  rng = np.random.default_rng(0)
  queries, docs, scores = _rows(rng, batch=6, width=1)
  labels = rng.uniform(size=(6, 1))
  table = set_scores({(q, d[0]): s[0] for q, d, s in zip(queries, docs, scores)})
  theirs = ce_losses.BinaryCrossEntropyLoss(model)(
      [queries, [d[0] for d in docs]], torch.tensor(labels[:, 0]))
  theirs.backward()
  value, grad = jax.value_and_grad(lambda s: reranker.bce_loss(
      s, jnp.asarray(labels), jnp.ones_like(s)))(jnp.asarray(scores))
  np.testing.assert_allclose(float(value), float(theirs.detach()), atol=1e-5)
  np.testing.assert_allclose(grad, _grads(table, [[(q, d[0])] for q, d in zip(queries, docs)]),
                             atol=1e-5)


def test_mnrl_matches_sentence_transformers_with_every_in_batch_negative(scored_model):
  """Theirs with num_negatives=None takes every other row's candidates of the batch as
  negatives (no draw): ours given the same candidates in each row gives their loss."""
  model, set_scores = scored_model
  rng = np.random.default_rng(1)
  b, hard = 4, 1
  queries = [f"q{i}" for i in range(b)]
  columns = [[f"p{i}" for i in range(b)]] + [[f"n{i}_{k}" for i in range(b)]
                                             for k in range(hard)]
  cands = [[col[i] for col in columns] for i in range(b)]   # row i's positive, hard negatives
  rows = [[(queries[i], d) for d in cands[i] + [c for j in range(b) if j != i for c in cands[j]]]
          for i in range(b)]                               # + every other row's candidates
  table = set_scores({p: rng.normal() * 3 for row in rows for p in row})
  loss = ce_losses.MultipleNegativesRankingLoss(model, num_negatives=None)
  theirs = loss([queries] + columns, None)
  theirs.backward()
  scores = np.array([[float(table[p].detach()) for p in row] for row in rows])
  value, grad = jax.value_and_grad(lambda s: reranker.mnrl_loss(
      s, jnp.ones_like(s), jnp.ones(b), scale=10.0))(jnp.asarray(scores))
  np.testing.assert_allclose(float(value), float(theirs.detach()), atol=1e-5)
  np.testing.assert_allclose(grad, _grads(table, rows), atol=1e-5)


def test_listnet_matches_sentence_transformers_on_lists_of_different_lengths(scored_model):
  model, set_scores = scored_model
  rng = np.random.default_rng(2)
  queries, docs, scores = _rows(rng, batch=3, width=4)
  lengths = [4, 2, 3]
  labels = rng.integers(0, 4, size=(3, 4)).astype(np.float64)
  table = set_scores({(q, d[j]): s[j] for q, d, s, n in zip(queries, docs, scores, lengths)
                      for j in range(n)})
  theirs = ce_losses.ListNetLoss(model)(
      [queries, [d[:n] for d, n in zip(docs, lengths)]],
      [torch.tensor(l[:n]) for l, n in zip(labels, lengths)])
  theirs.backward()
  present = (np.arange(4)[None] < np.array(lengths)[:, None]).astype(np.float64)
  value, grad = jax.value_and_grad(lambda s: reranker.listnet_loss(
      s, jnp.asarray(labels), jnp.asarray(present), jnp.ones(3)))(jnp.asarray(scores))
  np.testing.assert_allclose(float(value), float(theirs.detach()), atol=1e-5)
  pairs = [[(q, d[j]) for j in range(n)] + [None] * (4 - n)
           for q, d, n in zip(queries, docs, lengths)]
  want = np.array([[0.0 if p is None or table[p].grad is None else float(table[p].grad)
                    for p in row] for row in pairs])
  np.testing.assert_allclose(grad, want, atol=1e-5)


def test_padding_rows_and_slots_change_nothing():
  """A weight-0 row (the last batch's padding) and empty slots leave each loss as it was."""
  rng = np.random.default_rng(3)
  s, y = rng.normal(size=(3, 4)), rng.uniform(size=(3, 4))
  m = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
  for name in reranker.LOSSES:
    loss = reranker.loss_of(reranker.RerankerTask("t", {}, loss=name))
    batch = dict(labels=y, candidate_mask=m, example_weights=np.ones(3, np.float32))
    full, _ = loss(jnp.asarray(s), batch)
    padded = {k: np.concatenate([v, v[:1]]) for k, v in batch.items()}
    padded["example_weights"][-1] = 0.0
    again, _ = loss(jnp.asarray(np.concatenate([s, s[:1] + 5])), padded)
    changed = m.copy()
    s2 = np.where(m > 0, s, 100.0)   # what an empty slot scores must not matter
    third, _ = loss(jnp.asarray(s2), dict(batch, candidate_mask=changed))
    assert np.isfinite(float(full)), name
    np.testing.assert_allclose([float(again), float(third)], [float(full)] * 2, atol=1e-6,
                               err_msg=name)
