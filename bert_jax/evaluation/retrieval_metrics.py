"""Retrieval and STS metrics of embeddings (issue 40 item 5), numpy only.

  retrieval_metrics  scores [Q, N] + graded relevance [Q, N] (qrels) -> nDCG@k, MRR@k, Recall@k
  spearman           Spearman's rank correlation (ties get their average rank) of two [P] vectors

The ranking metrics are trec_eval's (the numbers BEIR and MTEB report through pytrec_eval;
tests/bert_jax/evaluation/retrieval_metrics_test.py checks them against pytrec_eval on random score matrices):

  ranking   each query's documents by score, highest first; among EQUAL scores the document with
            the higher index first. That is trec_eval's own tie rule (score descending, then
            document id descending) with document i named by its zero-padded index, so a tie is
            settled the same way here and in pytrec_eval. (The earlier rule here, ties in the
            relevant document's favour, gave an encoder whose vectors all collapse to one point
            a perfect score.)
  relevant  relevance > 0; the grade is the gain (trec_eval's ndcg_cut: linear gain, not 2^g - 1)
  nDCG@k    sum_{r <= k} gain_r / log2(r + 1), divided by the same sum over the ideal order
  MRR@k     1 / the rank of the first relevant document, 0 when it is below k (trec_eval's
            recip_rank, cut at k)
  Recall@k  relevant documents in the top k / the query's relevant documents

Every query needs a relevant document (BEIR's qrels hold only such queries); the means are over
queries.
"""

import numpy as np


def rank_order(scores):
  """[Q, N] scores -> [Q, N] document indices, best first; ties: the higher index first."""
  n = scores.shape[-1]
  # A stable sort of the columns reversed keeps equal scores in reversed index order.
  return n - 1 - np.argsort(-scores[:, ::-1], axis=-1, kind="stable")


def retrieval_metrics(scores, relevance, k=10, recall_at=(1, 10)):
  """scores [Q, N] (e.g. cosine of each query with each document), relevance [Q, N] >= 0 (0: not
  relevant; a grade is the gain) -> {"ndcg@k", "mrr@k", "recall@j" for j in recall_at}: floats,
  means over the Q queries."""
  scores = np.asarray(scores, np.float64)
  relevance = np.asarray(relevance, np.float64)
  if scores.shape != relevance.shape or scores.ndim != 2:
    raise ValueError(f"scores {scores.shape} and relevance {relevance.shape}: both [Q, N].")
  none = np.flatnonzero(~(relevance > 0).any(axis=1))
  if len(none):
    raise ValueError(f"queries {none[:5].tolist()} have no relevant document.")
  depth = min(max(k, *recall_at), scores.shape[1])
  top = rank_order(scores)[:, :depth]                                     # [Q, depth]
  gains = np.take_along_axis(relevance, top, axis=1)                      # [Q, depth]
  hit = gains > 0
  discount = 1 / np.log2(np.arange(2, depth + 2))                         # rank r: 1/log2(r + 1)
  dcg = (gains[:, :k] * discount[:k]).sum(1)
  ideal = -np.sort(-relevance, axis=1)[:, :k]                             # [Q, <= k]
  idcg = (ideal * discount[:ideal.shape[1]]).sum(1)
  first = np.where(hit[:, :k].any(1), np.argmax(hit[:, :k], axis=1) + 1, np.inf)
  out = {f"ndcg@{k}": float(np.mean(dcg / idcg)), f"mrr@{k}": float(np.mean(1 / first))}
  relevant = (relevance > 0).sum(1)
  for j in recall_at:
    out[f"recall@{j}"] = float(np.mean(hit[:, :j].sum(1) / relevant))
  return out


def average_ranks(x):
  """[P] values -> [P] ranks 1..P, tied values sharing their average rank (scipy's rankdata
  'average')."""
  _, inverse, counts = np.unique(np.asarray(x), return_inverse=True, return_counts=True)
  below = np.cumsum(counts) - counts                       # values smaller than each distinct one
  return (below + (counts + 1) / 2)[inverse]


def spearman(x, y):
  """Spearman's rho of two [P] vectors: Pearson's r of their average ranks (scipy.stats.spearmanr);
  nan when either is constant."""
  rx, ry = average_ranks(x) - (len(x) + 1) / 2, average_ranks(y) - (len(y) + 1) / 2
  denominator = np.sqrt((rx * rx).sum() * (ry * ry).sum())
  return float((rx * ry).sum() / denominator) if denominator > 0 else float("nan")
