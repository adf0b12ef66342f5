"""Distillation into a bi-encoder (issue 48 item 4), pure jnp: a teacher's scores or vectors
teach the student's embeddings, as sentence-transformers 6.2's losses do.

  margins_of_scores  teacher scores [B, 1 + k] (positive first: mine --output_scores,
                     mine_hard_negatives(output_scores=True)'s `scores`) -> margins [B, k]
  teacher_scores     a teacher's vectors [B, S, G] -> its scores [B, 1 + k]: cos(anchor, text)
  margin_mse         MarginMSE (Hofstaetter et al. 2020): the student's margin sim(q, p) -
                     sim(q, n_i) regressed on the teacher's, for every hard negative i
  embed_distill      the student's vectors (through a learned projection) against the
                     teacher's: mse | l2 | cosine distance

margin_mse is sentence-transformers' MarginMSELoss(similarity_fct=pairwise_dot_score, its
default; "cos": pairwise_cos_sim) on the same embeddings: anchors [B, D], candidates [B, 1 + k,
D], labels [B, k] margins, the mean squared error over the B x k margins. embed_distill is its
EmbedDistillLoss(distance_metric, projection_dim) (MSELoss = distance "mse"): the mean over a
row's texts (ST: over the input columns) of the per-text distance, each text's student vector
projected by the same linear map first (the projection is the caller's: the task's head holds
it). Both take row weights [B] (0.0: a padding row, out of the mean); with every weight 1 they
are ST's numbers (tests/bert_jax/objectives/embedding_distill_test.py: value and gradient
within 1e-5, against torch). The vectors are the pooled, unnormalised ones (ST's losses see the
model's output, which has no Normalize module unless the model adds one).
"""

import jax.numpy as jnp

SIMILARITIES = ("dot", "cos")           # MarginMSE's student similarity (ST: dot by default)
DISTANCES = ("mse", "l2", "cosine")     # EmbedDistillLoss's distance_metric


def _unit(x, eps=1e-8):
  """x / max(|x|, eps): torch's cosine_similarity normalises each side so."""
  return x / jnp.maximum(jnp.linalg.norm(x, axis=-1, keepdims=True), eps)


def _weighted_mean(per_row, weights):
  """[B] per-row values, [B] weights (None: 1) -> their weighted mean (0 rows weigh nothing)."""
  if weights is None:
    return jnp.mean(per_row)
  w = weights.astype(jnp.float32)
  return jnp.sum(jnp.where(w > 0, per_row, 0.0) * w) / jnp.maximum(jnp.sum(w), 1e-5)


def margins_of_scores(scores):
  """[B, 1 + k] scores (the positive's first) -> [B, k] margins s_p - s_n_i (ST's MarginMSELoss
  turns a label of 1 + k scores into these)."""
  return scores[:, :1] - scores[:, 1:]


def teacher_scores(vectors):
  """A bi-encoder teacher's [B, S, G] vectors (anchor, positive, negatives) -> [B, S - 1]
  cosines of the anchor with each other text: the scores a sentence-transformers teacher's
  model.similarity gives (cosine, its default), which mine_hard_negatives writes."""
  v = _unit(vectors.astype(jnp.float32), 1e-12)
  return jnp.einsum("bd,bnd->bn", v[:, 0], v[:, 1:])


def margin_mse(anchors, candidates, teacher_margins, similarity="dot", weights=None):
  """anchors [B, D], candidates [B, 1 + k, D] (positive, then k >= 1 negatives), teacher margins
  [B, k] -> scalar: mean over rows and negatives of (sim(a, p) - sim(a, n_i) - margin_i)^2."""
  a, c = anchors.astype(jnp.float32), candidates.astype(jnp.float32)
  if similarity == "cos":
    a, c = _unit(a), _unit(c)
  sims = jnp.einsum("bd,bnd->bn", a, c)                                 # [B, 1 + k]
  err = margins_of_scores(sims) - teacher_margins.astype(jnp.float32)   # [B, k]
  return _weighted_mean(jnp.mean(err * err, axis=-1), weights)


def embed_distill(student, teacher, distance="cosine", weights=None):
  """student [B, S, G] (already projected to the teacher's width), teacher [B, S, G] -> scalar:
  the mean over the S texts of ST's per-column distance (mse: mean squared difference over G;
  l2: the Euclidean distance; cosine: 1 - cos), each a mean over the rows."""
  s, t = student.astype(jnp.float32), teacher.astype(jnp.float32)
  if distance == "mse":
    per_text = jnp.mean((s - t) ** 2, axis=-1)                          # [B, S]
  elif distance == "l2":
    per_text = jnp.linalg.norm(s - t, axis=-1)
  else:   # cosine
    per_text = 1.0 - jnp.sum(_unit(s) * _unit(t), axis=-1)
  return _weighted_mean(jnp.mean(per_text, axis=-1), weights)
