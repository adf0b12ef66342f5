"""Sequence packing: several pre-training instances share one row, none attending to another.

Padding is most of the compute of unpacked BERT pre-training: the quick start's records are 45%
real tokens, google-research/bert's records of short documents 74%, Wikipedia at seq 512 ~50%
(Krell et al. 2021, "Efficient sequence packing without cross-contamination"). Packing puts
instances end to end in rows of seq_length T, so a step does (almost) only real work.

A packed row (the batch contract of `pretrain_input` with pack=True; K = max_instances_per_pack,
Q = max_predictions_per_pack):
  input_ids, input_mask, segment_ids  [B, T] int32  as unpacked: ids (masked), 1 = real token,
                                                    token type A/B of each instance
  instance_ids          [B, T] int32    0 = padding, k = the k-th instance of the row (1..K)
  position_ids          [B, T] int32    0, 1, ... restarting at each instance's [CLS]
  masked_lm_positions   [B, Q] int32    every instance's masked positions, in row coordinates
  masked_lm_ids         [B, Q] int32    their original ids; 0 for padding slots
  masked_lm_weights     [B, Q] float32  1.0 for a prediction, 0.0 for padding
  cls_positions         [B, K] int32    where instance k's [CLS] is (0 for an absent instance)
  next_sentence_labels  [B, K] int32    instance k's NSP label (0 = IsNext, 1 = NotNext)
  nsp_weights           [B, K] float32  1.0 for a present instance
The model attends only where instance_ids agree and are nonzero (block-diagonal), reads NSP at
each cls_positions, and the NSP loss is a mean over instances (nsp_weights), not rows.

The packer is best-fit decreasing inside a chunk of `chunk_size` consecutive instances (a bounded
look-ahead): longest first, each into the open row with the least room left that fits it (tokens
<= T, instances <= K, predictions <= Q), else a new row. With chunks of 1024 instances this
reaches >= 0.97 real tokens per slot on the quick start's records (benchmarks/packing.py prints the
figure for every record set). A chunk's rows are then put in a random order drawn from the chunk's
own seed, so long single-instance rows and rows of many short instances are spread over batches.

Everything is a pure function of the chunk (and its seed): a resumed stream re-packs the same
chunks the same way. The number of rows of a chunk is a function of its instance lengths alone
(`num_rows`), which is what resuming uses to find the chunk a given row falls in.
"""

import math

import numpy as np

# TensorFlow is imported by the tf.data glue below only: the numpy packer (pack_arrays, assign,
# pack_examples) runs without it (benchmarks.accelerator on a GPU image that has no TensorFlow).

PACKED_KEYS = ("input_ids", "input_mask", "segment_ids", "instance_ids", "position_ids",
               "masked_lm_positions", "masked_lm_ids", "masked_lm_weights",
               "cls_positions", "next_sentence_labels", "nsp_weights")
DEFAULT_CHUNK_SIZE = 1024  # instances looked at together; ~2.3 MB of int32 features at seq 128


def default_max_instances(seq_length):
  """K for a row of T tokens: 1 per 16 tokens, at least 2 (128 -> 8, 512 -> 32).

  An instance holds at least [CLS] x [SEP] y [SEP], and the quick start's shortest tenth are
  < 23 tokens, so rows of 128 need ~6-8 instances to fill up; K only sizes the NSP arrays.
  """
  return max(2, seq_length // 16)


def max_predictions_per_pack(seq_length, max_instances, masked_lm_prob=0.15):
  """Q: a width no packed row of dynamically masked instances can overflow.

  An instance of n candidates gets min(P, max(1, round(n * prob))) <= n * prob + 1 predictions
  (the masking recipe), so a row of k instances with sum(n) <= T gets <= prob * T + k. For T=128,
  K=8: 19 + 8 = 27 slots (unpacked: 20 per row of ~57 real tokens).
  """
  return int(math.floor(masked_lm_prob * seq_length + 1e-9)) + int(max_instances)


# ----------------------------------------------------------------------------------------------
# The packer (numpy; runs inside tf.data through tf.numpy_function).
# ----------------------------------------------------------------------------------------------
def assign(lengths, num_preds, seq_length, max_instances, max_preds, count_preds=True):
  """Best-fit decreasing. Returns (row, slot, offset, pred_offset) per instance, and #rows.

  lengths, num_preds: [N] ints. Instance i goes to row[i], is the slot[i]-th instance of that row
  (in placement order), starts at token offset[i] and its predictions at slot pred_offset[i] of
  the row's masked_lm_* arrays. count_preds=False: rows are limited by tokens and instances only
  (Q is a bound no row can exceed), so the rows depend on the lengths alone.
  """
  lengths = np.asarray(lengths, np.int64)
  num_preds = np.asarray(num_preds, np.int64)
  n = lengths.shape[0]
  if n and (lengths.max() > seq_length or lengths.min() < 1
            or (count_preds and num_preds.max() > max_preds)):
    raise ValueError(f"packing: an instance of {lengths.max()} tokens / {num_preds.max()} "
                     f"predictions does not fit a row of {seq_length} / {max_preds}, or is empty.")
  row, slot, offset, pred_offset = (np.zeros(n, np.int64) for _ in range(4))
  space = np.zeros(n, np.int64)       # tokens left in each open row
  preds_left = np.zeros(n, np.int64)
  count = np.zeros(n, np.int64)       # instances in each row
  num_rows = 0
  for i in np.argsort(-lengths, kind="stable"):
    length, p = lengths[i], num_preds[i]
    fits = (space[:num_rows] >= length) & (count[:num_rows] < max_instances)
    if count_preds:
      fits &= preds_left[:num_rows] >= p
    if fits.any():
      r = int(np.argmin(np.where(fits, space[:num_rows], seq_length + 1)))
    else:
      r = num_rows
      num_rows += 1
      space[r], preds_left[r] = seq_length, max_preds
    row[i], slot[i] = r, count[r]
    offset[i], pred_offset[i] = seq_length - space[r], max_preds - preds_left[r]
    space[r] -= length
    preds_left[r] -= p
    count[r] += 1
  return row, slot, offset, pred_offset, num_rows


def num_rows(lengths, num_preds, seq_length, max_instances, max_preds, count_preds=True):
  return assign(lengths, num_preds, seq_length, max_instances, max_preds, count_preds)[-1]


def scatter_tokens(ids, input_mask, segment_ids, row, slot, offset, num_rows_out):
  """The token features of packed rows: instance n's real tokens go to row[n] from offset[n].

  ids/input_mask/segment_ids: [N, T] one instance per row; row/slot/offset: [N] from `assign`.
  Returns input_ids, input_mask, segment_ids, instance_ids (slot + 1; 0 = padding) and
  position_ids (restarting at 0 per instance), each [num_rows_out, T] int32.
  """
  out = {k: np.zeros((num_rows_out, ids.shape[1]), np.int32) for k in
         ("input_ids", "input_mask", "segment_ids", "instance_ids", "position_ids")}
  inst, pos = np.nonzero(input_mask)                                    # real tokens
  dest = (row[inst], offset[inst] + pos)
  out["input_ids"][dest] = ids[inst, pos]
  out["input_mask"][dest] = 1
  out["segment_ids"][dest] = segment_ids[inst, pos]
  out["instance_ids"][dest] = slot[inst] + 1
  out["position_ids"][dest] = pos
  return out


def pack_arrays(f, seed, *, max_instances, max_preds, count_preds):
  """Packs a chunk of unpacked instances (numpy dict, PACKED_KEYS' unpacked subset) into rows.

  f: input_ids/input_mask/segment_ids [N, T], masked_lm_positions/ids/weights [N, P],
  next_sentence_labels [N]; real tokens and real predictions first in each instance. seed: an
  int that orders the output rows. count_preds: constrain rows by their predictions (pre-masked
  records, whose counts are given) rather than rely on Q being a bound (dynamic masking).
  Returns a dict of PACKED_KEYS with R rows (R from `assign`).
  """
  ids = f["input_ids"]
  n, t = ids.shape
  lengths = f["input_mask"].sum(1)
  weights = f["masked_lm_weights"] > 0                                  # [N, P]
  preds = weights.sum(1)
  row, slot, offset, pred_offset, r = assign(lengths, preds, t, max_instances, max_preds,
                                             count_preds)
  out = scatter_tokens(ids, f["input_mask"], f["segment_ids"], row, slot, offset, r)

  for k in ("masked_lm_positions", "masked_lm_ids"):
    out[k] = np.zeros((r, max_preds), np.int32)
  out["masked_lm_weights"] = np.zeros((r, max_preds), np.float32)
  inst, j = np.nonzero(weights)
  if np.any(pred_offset[inst] + j >= max_preds):
    raise ValueError(f"packing: a row needs more than max_predictions_per_pack={max_preds} "
                     "predictions; raise it (or lower masked_lm_prob).")
  dest = (row[inst], pred_offset[inst] + j)
  out["masked_lm_positions"][dest] = offset[inst] + f["masked_lm_positions"][inst, j]
  out["masked_lm_ids"][dest] = f["masked_lm_ids"][inst, j]
  out["masked_lm_weights"][dest] = 1.0

  out["cls_positions"] = np.zeros((r, max_instances), np.int32)
  out["next_sentence_labels"] = np.zeros((r, max_instances), np.int32)
  out["nsp_weights"] = np.zeros((r, max_instances), np.float32)
  out["cls_positions"][row, slot] = offset
  out["next_sentence_labels"][row, slot] = f["next_sentence_labels"]
  out["nsp_weights"][row, slot] = 1.0
  order = np.random.default_rng(int(seed) & (2**63 - 1)).permutation(r)
  return {k: v[order] for k, v in out.items()}


# ----------------------------------------------------------------------------------------------
# tf.data glue.
# ----------------------------------------------------------------------------------------------
_IN_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
            "masked_lm_weights", "next_sentence_labels")


def pack_chunk(features, seed, *, seq_length, max_instances, max_preds, count_preds):
  """tf: a chunk dict of [N, ...] tensors (unpacked, masked) -> dict of [R, ...] packed rows."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  def run(seed, *arrays):
    out = pack_arrays(dict(zip(_IN_KEYS, arrays)), seed, max_instances=max_instances,
                      max_preds=max_preds, count_preds=count_preds)
    return [out[k] for k in PACKED_KEYS]

  dtypes = [tf.float32 if k in ("masked_lm_weights", "nsp_weights") else tf.int32
            for k in PACKED_KEYS]
  outs = tf.numpy_function(run, [seed] + [features[k] for k in _IN_KEYS], dtypes, stateful=False)
  widths = dict(masked_lm_positions=max_preds, masked_lm_ids=max_preds,
                masked_lm_weights=max_preds, cls_positions=max_instances,
                next_sentence_labels=max_instances, nsp_weights=max_instances)
  packed = {}
  for k, v in zip(PACKED_KEYS, outs):
    v.set_shape([None, widths.get(k, seq_length)])
    packed[k] = v
  return packed


def chunk_num_rows(lengths, num_preds, *, seq_length, max_instances, max_preds, count_preds):
  """tf: [N] lengths and prediction counts of a chunk -> its number of packed rows (int64)."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  def run(lengths, num_preds):
    return np.int64(num_rows(lengths, num_preds, seq_length, max_instances, max_preds,
                             count_preds))
  out = tf.numpy_function(run, [lengths, num_preds], tf.int64, stateful=False)
  out.set_shape([])
  return out


def efficiency(batches):
  """Real tokens per slot (mean input_mask) over an iterable of batches."""
  real = slots = 0
  for b in batches:
    real += int(np.sum(b["input_mask"]))
    slots += int(np.size(b["input_mask"]))
  return real / max(slots, 1)


# ----------------------------------------------------------------------------------------------
# Fine-tuning: packed training examples of sentence(-pair) classification / regression.
# ----------------------------------------------------------------------------------------------
def pack_examples(features, *, max_instances, seed=0):
  """Packs fine-tuning sequences (numpy, all at once) into rows; one label per instance.

  features: input_ids/input_mask/segment_ids [N, T], label_ids [N] (int or float). Returns
  input_ids/input_mask/segment_ids/instance_ids/position_ids [R, T] int32, cls_positions [R, K]
  int32, label_ids [R, K] (0 for an empty slot) and example_weights [R, K] float32 (1.0 for a
  present instance), rows in an order drawn from `seed`. Best-fit decreasing over the whole split:
  a fine-tuning set fits in memory, and one packing for all epochs keeps steps per epoch fixed.
  """
  ids = features["input_ids"]
  lengths = features["input_mask"].sum(1)
  row, slot, offset, _, r = assign(lengths, np.zeros_like(lengths), ids.shape[1], max_instances,
                                   0, count_preds=False)
  out = scatter_tokens(ids, features["input_mask"], features["segment_ids"], row, slot, offset, r)
  out["cls_positions"] = np.zeros((r, max_instances), np.int32)
  out["cls_positions"][row, slot] = offset
  labels = np.asarray(features["label_ids"])
  out["label_ids"] = np.zeros((r, max_instances), labels.dtype)
  out["label_ids"][row, slot] = labels
  out["example_weights"] = np.zeros((r, max_instances), np.float32)
  out["example_weights"][row, slot] = 1.0
  order = np.random.default_rng(seed).permutation(r)
  return {k: v[order] for k, v in out.items()}


# ----------------------------------------------------------------------------------------------
# Embedding: one batch's texts (anchors, positives, hard negatives) packed into a fixed number of
# rows, each text keeping a slot the loss reads its vector back from.
# ----------------------------------------------------------------------------------------------
def text_rows(lengths, *, seq_length, max_instances):
  """The rows best-fit decreasing packs texts of these [N] token counts into (<= T tokens and
  <= K texts a row); what sizes a run's packed embedding batches (pack_texts' num_rows)."""
  lengths = np.asarray(lengths).reshape(-1)
  return num_rows(lengths, np.zeros_like(lengths), seq_length, max_instances, 0,
                  count_preds=False)


def pack_texts(features, *, max_instances, num_rows_out):
  """N texts, one per row ([N, T] input_ids/input_mask/segment_ids), packed best-fit decreasing
  into exactly `num_rows_out` rows R of T tokens and K = max_instances text slots (the rows past
  the packer's own count are padding: instance_ids 0). Returns input_ids, input_mask,
  segment_ids, instance_ids, position_ids [R, T] int32, cls_positions [R, K] int32 (where text
  k starts; 0 for an empty slot) and text_slots [N] int32: text n's vector is slot
  text_slots[n] = row * K + k of the rows' [R * K] pooled vectors. More rows than num_rows_out
  is a ValueError (the caller sizes num_rows_out from text_rows over every batch it packs)."""
  ids, mask = features["input_ids"], features["input_mask"]
  lengths = mask.sum(1)
  row, slot, offset, _, r = assign(lengths, np.zeros_like(lengths), ids.shape[1], max_instances,
                                   0, count_preds=False)
  if r > num_rows_out:
    raise ValueError(f"packing: {len(lengths)} texts need {r} rows of {ids.shape[1]} tokens "
                     f"(<= {max_instances} texts a row), more than the {num_rows_out} sized.")
  out = scatter_tokens(ids, mask, features["segment_ids"], row, slot, offset, num_rows_out)
  out["cls_positions"] = np.zeros((num_rows_out, max_instances), np.int32)
  out["cls_positions"][row, slot] = offset
  out["text_slots"] = (row * max_instances + slot).astype(np.int32)
  return out
