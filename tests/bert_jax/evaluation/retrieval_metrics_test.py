"""bert_jax/evaluation/retrieval_metrics.py: by hand, against pytrec_eval (trec_eval, as BEIR and MTEB score)
on random score matrices with ties and graded qrels, and Spearman against scipy."""

import numpy as np
import pytest
import pytrec_eval
from scipy import stats

from bert_jax.evaluation import retrieval_metrics as rm


def test_by_hand_one_and_several_relevant_documents():
  scores = np.array([[0.9, 0.5, 0.1, 0.0],
                     [0.9, 0.8, 0.7, 0.6]])
  relevance = np.array([[1, 0, 0, 0],      # rank 1
                        [0, 1, 0, 2]])     # ranks 2 (gain 1) and 4 (gain 2)
  got = rm.retrieval_metrics(scores, relevance, k=10, recall_at=(1, 3))
  ideal = 2 + 1 / np.log2(3)
  assert got["ndcg@10"] == pytest.approx((1 + (1 / np.log2(3) + 2 / np.log2(5)) / ideal) / 2)
  assert got["mrr@10"] == pytest.approx((1 + 1 / 2) / 2)
  assert got["recall@1"] == pytest.approx(0.5) and got["recall@3"] == pytest.approx((1 + .5) / 2)
  # Below the cut: MRR@1 and nDCG@1 count nothing for the second query.
  cut = rm.retrieval_metrics(scores, relevance, k=1, recall_at=(1,))
  assert cut["mrr@1"] == pytest.approx(0.5) and cut["ndcg@1"] == pytest.approx(0.5)


def test_ties_go_to_the_higher_index_and_a_collapsed_encoder_scores_no_better():
  # Every score equal (vectors collapsed to one point): the order is 3, 2, 1, 0.
  assert rm.rank_order(np.zeros((1, 4))).tolist() == [[3, 2, 1, 0]]
  got = rm.retrieval_metrics(np.zeros((4, 4)), np.eye(4), k=10, recall_at=(1,))
  assert got["mrr@10"] == pytest.approx(np.mean([1 / 4, 1 / 3, 1 / 2, 1]))
  assert got["recall@1"] == pytest.approx(0.25)


def test_no_relevant_document_and_bad_shapes_are_errors():
  with pytest.raises(ValueError, match=r"queries \[1\] have no relevant document"):
    rm.retrieval_metrics(np.zeros((2, 3)), np.array([[1, 0, 0], [0, 0, 0]]))
  with pytest.raises(ValueError, match=r"both \[Q, N\]"):
    rm.retrieval_metrics(np.zeros((2, 3)), np.zeros((2, 4)))


def _trec_eval(scores, relevance, k, recall_at):
  """pytrec_eval's means; document i is named d{i:06d} (trec_eval breaks ties by name,
  descending: the higher index first, as rank_order does)."""
  qrels = {f"q{q}": {f"d{i:06d}": int(g) for i, g in enumerate(row) if g > 0}
           for q, row in enumerate(relevance)}
  run = {f"q{q}": {f"d{i:06d}": float(s) for i, s in enumerate(row)}
         for q, row in enumerate(scores)}
  per_query = pytrec_eval.RelevanceEvaluator(
      qrels, {f"ndcg_cut.{k}", "recip_rank", "recall." + ",".join(map(str, recall_at))}
  ).evaluate(run)
  mean = lambda key: float(np.mean([m[key] for m in per_query.values()]))  # noqa: E731
  # trec_eval's recip_rank has no cut: 1/r below rank k is MRR@k's 0.
  mrr = float(np.mean([m["recip_rank"] if m["recip_rank"] >= 1 / k - 1e-12 else 0.0
                       for m in per_query.values()]))
  return {f"ndcg@{k}": mean(f"ndcg_cut_{k}"), f"mrr@{k}": mrr,
          **{f"recall@{j}": mean(f"recall_{j}") for j in recall_at}}


@pytest.mark.parametrize("seed", range(6))
def test_equals_pytrec_eval_on_random_scores_with_ties(seed):
  rng = np.random.default_rng(seed)
  q, n = rng.integers(5, 40), rng.integers(12, 80)
  # Scores on a coarse grid (many ties; seed 0 also a column of equal scores), graded qrels with
  # 1 to 4 relevant documents a query.
  scores = rng.integers(0, 6 if seed % 2 else 30, size=(q, n)) / 8.0
  if seed == 0:
    scores[:, :5] = 0.5
  relevance = np.zeros((q, n), np.int64)
  for row in relevance:
    row[rng.choice(n, rng.integers(1, 5), replace=False)] = rng.integers(1, 4)
  k = (10, 5, 20)[seed % 3]
  got = rm.retrieval_metrics(scores, relevance, k=k, recall_at=(1, 10))
  want = _trec_eval(scores, relevance, k, (1, 10))
  assert got.keys() == want.keys()
  for key in got:
    assert got[key] == pytest.approx(want[key], abs=1e-9), (key, got, want)


def test_spearman_equals_scipy_with_ties():
  rng = np.random.default_rng(0)
  for n in (5, 37, 200):
    x, y = rng.normal(size=n), rng.integers(0, 6, size=n).astype(float)   # y: gold 0..5, tied
    np.testing.assert_allclose(rm.average_ranks(y), stats.rankdata(y))
    assert rm.spearman(x, y) == pytest.approx(stats.spearmanr(x, y).statistic, abs=1e-12)
  assert np.isnan(rm.spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]))
