"""Dynamic masked-LM masking as a pure TensorFlow function of (token ids, random key).

Used by `pretrain_input.py` after batching: one call masks a whole [batch, seq] block with
vectorised ops (no per-sequence Python), so the pipeline keeps up with an accelerator on one core.

The recipe follows google-research/bert's `create_masked_lm_predictions`:
  * candidates are the non-special tokens (`VocabInfo.is_special` false; [CLS], [SEP], [PAD],
    [MASK], [UNK] and "[...]" control tokens never are);
  * num_to_predict = min(max_predictions_per_seq, max(1, round(n * masked_lm_prob))), where n
    counts the candidates (google-research/bert counts [CLS] and the [SEP]s too, i.e. 3 more tokens,
    which moves the expected count at seq 128 by ~0.45 of a prediction), and never more than n;
  * each selected token becomes [MASK] 80% of the time, a random non-special token 10% and stays
    unchanged 10% (drawn per token, as google-research/bert does, whole-word masking included).
    The split is `mask_replace_prob` / `random_replace_prob` (transformers'
    DataCollatorForLanguageModeling names; the rest, 1 - both, stays unchanged): 0.8 / 0.1 by
    default, 1.0 / 0.0 for NeoBERT (every selected token becomes [MASK]);
  * whole-word masking selects words (a piece plus its "##" continuations) in random order,
    skipping a word that would overflow num_to_predict: the greedy rule of google-research/bert.
    Records made with `--word_boundaries=jieba` also carry `word_continues` (1 where a token
    continues a jieba word), which joins Chinese characters into words as Chinese BERT-wwm
    (Cui et al. 2019) does: "清华大学" is masked as one word of 4 tokens, not 4 words.
Positions come out sorted ascending and padded with 0; padding has id 0 and weight 0.0.

Two more selection schemes (`scheme`), with the same budget (num_to_predict) and outputs:
  * "ngram" (ALBERT, Lan et al. 2019; google-research/albert create_pretraining_data.py
    `create_masked_lm_predictions`): units are words (whole_word_masking) or tokens, visited in a
    random order; at each start unit an n is drawn with p(n) proportional to 1/n over
    n = 1..min(max_ngram, units left in the row), shortened while the n-gram would overflow the
    budget, skipped if even one unit overflows or if any of its units is already masked; its
    tokens are then masked. 80/10/10 is drawn per token, as the reference.
  * "span" (SpanBERT, Joshi et al. 2019): span lengths in complete words from a geometric
    distribution p=0.2 clipped at 10 (p(l) proportional to 0.2 * 0.8^(l-1), l = 1..10); anchor
    words in a random order weighted by their length in tokens (SpanBERT draws an anchor token
    uniformly and extends it to its word); a span runs over the next l words (through words
    already masked, which then merge, as SpanBERT's merge_intervals), shortened to the whole
    words that fit the budget, skipped if none fits. 80/10/10 is decided once per span.
`span_boundaries` gives SpanBERT's span-boundary targets (the tokens just outside each
contiguous run of masked positions) from the masked positions alone.

Randomness comes only from `tf.random.stateless_*` ops seeded by `key`, so the same (ids, key)
always gives the same masks: the pipeline derives the key from the batch's index in the stream,
which makes a resumed pipeline reproduce the masks of an uninterrupted one.
"""

import dataclasses
import numbers

import numpy as np

from bert_jax_core.tf_setup import tf


@dataclasses.dataclass(frozen=True)
class MaskConfig:
  """What the masking needs from the vocabulary, as numpy tables (turned into graph constants)."""
  mask_id: int
  is_special: np.ndarray       # [vocab] bool: never selected, never inserted
  is_continuation: np.ndarray  # [vocab] bool: "##" pieces, for whole-word masking
  masked_lm_prob: float = 0.15
  max_predictions_per_seq: int = 20
  whole_word_masking: bool = False
  scheme: str = "token"        # token | ngram (ALBERT) | span (SpanBERT): module docstring
  max_ngram: int = 3           # ngram: n <= 3, p(n) proportional to 1/n
  span_p: float = 0.2          # span: geometric(p) lengths in words ...
  max_span: int = 10           # ... clipped at 10 words
  # What a selected token becomes: [MASK] with this probability, a random non-special token with
  # random_replace_prob, itself otherwise (BERT's 80/10/10; NeoBERT 1.0 / 0.0).
  mask_replace_prob: float = 0.8
  random_replace_prob: float = 0.1

  @property
  def random_token_ids(self):
    """[num_non_special] int32: the ids a "random token" replacement may draw from."""
    return np.flatnonzero(~self.is_special).astype(np.int32)


SCHEMES = ("token", "ngram", "span")


def check_replacement(mask_replace_prob, random_replace_prob, prefix=""):
  """None, or the one-line reason the [MASK] / random / unchanged split is impossible: each a
  probability in [0, 1], the two summing to at most 1 (the rest stays unchanged). prefix: how
  the caller names the fields ("config." for the trainer's)."""
  for name, value in (("mask_replace_prob", mask_replace_prob),
                      ("random_replace_prob", random_replace_prob)):
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value <= 1:
      return (f"{prefix}{name}={value!r}: expected a probability in [0, 1] of a selected token "
              "(BERT: mask_replace_prob 0.8, random_replace_prob 0.1; NeoBERT: 1.0 and 0.0).")
  if mask_replace_prob + random_replace_prob > 1:
    return (f"{prefix}mask_replace_prob={mask_replace_prob} + {prefix}random_replace_prob="
            f"{random_replace_prob} = {mask_replace_prob + random_replace_prob:g} > 1: the two "
            "split the selected tokens (the rest, 1 - both, stays unchanged); lower one of them.")
  return None


def mask_config_from_vocab(vocab, *, masked_lm_prob, max_predictions_per_seq, whole_word_masking,
                           scheme="token", mask_replace_prob=0.8, random_replace_prob=0.1):
  if scheme not in SCHEMES:
    raise ValueError(f"masking scheme {scheme!r}: expected one of {SCHEMES} (token = BERT, "
                     "ngram = ALBERT, span = SpanBERT).")
  if not 0.0 < masked_lm_prob <= 1.0:
    raise ValueError(f"masked_lm_prob={masked_lm_prob}: expected a fraction in (0, 1], "
                     "e.g. 0.15 as in the BERT paper.")
  if max_predictions_per_seq < 1:
    raise ValueError(f"max_predictions_per_seq={max_predictions_per_seq}: expected >= 1 "
                     "(20 for seq 128, 80 for seq 512 in the BERT recipe).")
  problem = check_replacement(mask_replace_prob, random_replace_prob)
  if problem:
    raise ValueError(problem)
  is_special = np.asarray(vocab.is_special, dtype=bool)
  if is_special.all():
    raise ValueError(f"vocab {vocab.path or '<in memory>'}: every id is special, nothing to mask.")
  return MaskConfig(mask_id=int(vocab.mask_id), is_special=is_special,
                    is_continuation=np.asarray(vocab.is_continuation, dtype=bool),
                    masked_lm_prob=float(masked_lm_prob),
                    max_predictions_per_seq=int(max_predictions_per_seq),
                    whole_word_masking=bool(whole_word_masking), scheme=scheme,
                    mask_replace_prob=float(mask_replace_prob),
                    random_replace_prob=float(random_replace_prob))


def _num_to_predict(num_candidates, cfg):
  # float64 so that round() agrees with Python's round (half to even) on exact halves like
  # 30 * 0.15 = 4.5 -> 4; in float32 0.15 is 0.150000006 and would give 5.
  n = tf.cast(num_candidates, tf.float64)
  k = tf.cast(tf.round(n * cfg.masked_lm_prob), tf.int32)
  k = tf.minimum(cfg.max_predictions_per_seq, tf.maximum(1, k))
  return tf.minimum(k, num_candidates)  # [batch]; 0 only for rows without any candidate


def _select_tokens(cand, ntp, key, num_preds):
  """Picks ntp random candidates per row. Returns positions [B, P] ascending (pad = seq)."""
  seq = tf.shape(cand)[1]
  # Random 31-bit integer keys rather than floats: cheaper to draw, and ties (which top_k breaks by
  # index, a bias toward early positions) are 128x rarer than among float32's 24-bit uniforms.
  scores = tf.random.stateless_uniform(tf.shape(cand), seed=key, minval=None, maxval=None,
                                       dtype=tf.int32)  # [B, S]
  # The arithmetic shift leaves keys in [-2^30, 2^30), strictly above the non-candidates' int32.min.
  scores = tf.where(cand, tf.bitwise.right_shift(scores, 1), tf.int32.min)
  _, idx = tf.math.top_k(scores, k=num_preds)  # [B, P], best first
  valid = tf.range(num_preds)[None, :] < ntp[:, None]  # the first ntp are a uniform subset
  return tf.sort(tf.where(valid, idx, seq), axis=1)


def _words(ids, cand, cfg, word_continues=None, whole_words=True):
  """Candidate words: (word_idx [B, S] (valid where cand), num_words [B], word_len [B, S]: the
  token count of word w at column w, 0 past num_words). Without whole_words every candidate
  token is its own word."""
  batch, seq = tf.shape(ids)[0], tf.shape(ids)[1]
  if whole_words:
    is_cont = tf.gather(tf.constant(cfg.is_continuation), ids)
    if word_continues is not None:  # jieba boundaries from the records
      is_cont |= word_continues > 0
    is_cont &= cand
    prev_cand = tf.pad(cand[:, :-1], [[0, 0], [1, 0]])
    # A "##" piece joins the word before it only if that token is a candidate (never a [SEP]).
    word_start = cand & ~(is_cont & prev_cand)  # [B, S]
  else:
    word_start = cand
  word_idx = tf.cumsum(tf.cast(word_start, tf.int32), axis=1) - 1  # [B, S]; valid where cand
  num_words = tf.reduce_sum(tf.cast(word_start, tf.int32), axis=1)  # [B]
  rows = tf.range(batch)[:, None] * seq
  seg = tf.where(cand, word_idx + rows, batch * seq)  # non-candidates go to a dump segment
  word_len = tf.math.unsorted_segment_sum(tf.ones_like(ids), seg, batch * seq + 1)
  word_len = tf.reshape(word_len[:-1], [batch, seq])  # [B, words] (padded to S words)
  return word_idx, num_words, word_len


def _select_whole_words(ids, cand, ntp, key, cfg, word_continues=None):
  """Whole-word selection; returns the selected-token mask [B, S] with at most ntp per row."""
  batch, seq = tf.shape(ids)[0], tf.shape(ids)[1]
  word_idx, num_words, word_len = _words(ids, cand, cfg, word_continues)
  scores = tf.random.stateless_uniform([batch, seq], seed=key)
  scores = tf.where(tf.range(seq)[None, :] < num_words[:, None], scores, -1.0)
  _, order = tf.math.top_k(scores, k=seq)  # [B, S]: a random permutation of each row's words
  len_in_order = tf.gather(word_len, order, batch_dims=1)  # [B, S]; 0 past num_words

  # Greedy as in google-research/bert: stop once full, skip a word that would overflow. The loop
  # runs over word ranks while some row is not full (~ntp + a few steps, not S); always once, so
  # the TensorArray is never empty (an empty one cannot be stacked).
  def cond(j, count, taken):
    del taken
    return (j == 0) | ((j < tf.reduce_max(num_words)) & tf.reduce_any(count < ntp))

  def body(j, count, taken):
    length = len_in_order[:, j]
    take = (length > 0) & (count < ntp) & (count + length <= ntp)
    return j + 1, count + tf.where(take, length, 0), taken.write(j, take)

  _, _, taken = tf.while_loop(
      cond, body, (0, tf.zeros_like(ntp), tf.TensorArray(tf.bool, size=0, dynamic_size=True,
                                                     element_shape=[None])))
  taken = tf.transpose(taken.stack())  # [B, steps]
  taken = tf.pad(taken, [[0, 0], [0, seq - tf.shape(taken)[1]]])
  taken_by_word = tf.gather(taken, tf.argsort(order, axis=1), batch_dims=1)  # [B, words]
  return cand & tf.gather(taken_by_word, tf.maximum(word_idx, 0), batch_dims=1)


def ngram_probs(max_ngram):
  """ALBERT's p(n) for n = 1..max_ngram: proportional to 1/n (favor_shorter_ngram)."""
  p = 1.0 / np.arange(1, max_ngram + 1)
  return p / p.sum()


def span_length_probs(p=0.2, max_span=10):
  """SpanBERT's p(l) for l = 1..max_span: geometric(p) clipped (renormalised) at max_span."""
  q = p * (1 - p) ** np.arange(max_span)
  return q / q.sum()


def _draw(u, probs, limit=None):
  """Inverse-CDF draws in 1..len(probs) from uniforms u [B]; with limit [B], from the
  distribution truncated (renormalised) to 1..limit."""
  cdf = tf.constant(np.cumsum(probs), tf.float32)  # [K]
  k = len(probs)
  if limit is None:
    total = tf.ones_like(u)
  else:
    total = tf.gather(cdf, tf.clip_by_value(limit, 1, k) - 1)  # [B]
  below = tf.cast(u[:, None] * total[:, None] >= cdf[None, :k - 1], tf.int32)  # [B, K-1]
  n = 1 + tf.reduce_sum(below, axis=1)
  return n if limit is None else tf.minimum(n, tf.maximum(limit, 1))


def _select_spans(ids, cand, ntp, key, cfg, word_continues=None):
  """ngram / span selection (module docstring). Returns (selected [B, S] bool, span_rank [B, S]
  int32: the visit rank of the n-gram / span that masked each token, and the per-rank record
  {"drawn": n or l drawn [B, R] (0 = no visit), "limit": min(words left, max) at that visit,
  "taken": words masked [B, R] (0 = skipped)} for the tests)."""
  batch, seq = tf.shape(ids)[0], tf.shape(ids)[1]
  span = cfg.scheme == "span"
  word_idx, num_words, word_len = _words(ids, cand, cfg, word_continues,
                                         whole_words=span or cfg.whole_word_masking)
  order_key, length_key = tf.unstack(tf.random.experimental.stateless_split(key, num=2))
  u = tf.random.stateless_uniform([batch, seq], seed=order_key, minval=1e-12, maxval=1.0)
  if span:   # weighted without replacement (Efraimidis-Spirakis): key u^(1/len), len in tokens
    scores = tf.math.log(u) / tf.cast(tf.maximum(word_len, 1), tf.float32)
  else:
    scores = u
  scores = tf.where(tf.range(seq)[None, :] < num_words[:, None], scores, -np.inf)
  _, order = tf.math.top_k(scores, k=seq)  # [B, S]: the start words in visit order
  draws = tf.random.stateless_uniform([batch, seq], seed=length_key)  # one per visit rank
  width = cfg.max_span if span else cfg.max_ngram
  probs = span_length_probs(cfg.span_p, cfg.max_span) if span else ngram_probs(cfg.max_ngram)
  word_cols = tf.range(seq)[None, :]

  def cond(j, count, covered, rank, drawn, taken):
    del covered, rank, drawn, taken
    return (j == 0) | ((j < tf.reduce_max(num_words)) & tf.reduce_any(count < ntp))

  def body(j, count, covered, rank, drawn, taken):
    w = order[:, j]                                                     # [B] start word
    live = (j < num_words) & (count < ntp)
    left = num_words - w                                                # words from w on
    # ALBERT truncates p(n) to the n-grams that exist from w; SpanBERT draws l unconditionally
    # and stops at the end of the sequence.
    limit = tf.minimum(left, width)
    n = _draw(draws[:, j], probs, None if span else limit)
    window = tf.minimum(w[:, None] + tf.range(width)[None, :], seq - 1)  # [B, width] words
    in_row = tf.range(width)[None, :] < left[:, None]
    was = tf.gather(covered, window, batch_dims=1) & in_row             # [B, width]
    lengths = tf.where(in_row, tf.gather(word_len, window, batch_dims=1), 0)
    if span:   # only newly masked tokens count against the budget
      lengths = tf.where(was, 0, lengths)
    cum = tf.cumsum(lengths, axis=1)                                    # [B, width]
    fits = tf.reduce_sum(tf.cast((cum <= (ntp - count)[:, None]) & in_row, tf.int32), axis=1)
    m = tf.minimum(tf.minimum(n, fits), left)                           # words actually used
    used = tf.range(width)[None, :] < m[:, None]                        # [B, width]
    new_tokens = tf.reduce_sum(tf.where(used, lengths, 0), axis=1)
    take = live & (m > 0) & (new_tokens > 0)
    if not span:   # ALBERT skips an n-gram with any word already masked
      take &= ~tf.reduce_any(was & used, axis=1)
    span_words = (word_cols >= w[:, None]) & (word_cols < (w + m)[:, None]) & take[:, None]
    rank = tf.where(span_words & ~covered, j, rank)
    covered |= span_words
    count += tf.where(take, new_tokens, 0)
    # drawn: n (l) drawn at a live visit, + 100 x the words left from its start (for tests).
    return (j + 1, count, covered, rank,
            drawn.write(j, tf.where(live, n + 100 * limit, 0)), taken.write(j, tf.where(take, m, 0)))

  ta = lambda: tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None])  # noqa
  _, _, covered, rank, drawn, taken = tf.while_loop(
      cond, body, (0, tf.zeros_like(ntp), tf.zeros([batch, seq], tf.bool),
                   tf.fill([batch, seq], -1), ta(), ta()))
  token_word = tf.maximum(word_idx, 0)
  selected = cand & tf.gather(covered, token_word, batch_dims=1)
  span_rank = tf.where(selected, tf.gather(rank, token_word, batch_dims=1), -1)
  drawn = tf.transpose(drawn.stack())
  record = {"drawn": drawn % 100, "limit": drawn // 100, "taken": tf.transpose(taken.stack())}
  return selected, span_rank, record


def span_boundaries(positions, weights):
  """SpanBERT's boundary targets: for every masked position, the positions just left and right of
  its contiguous run of masked positions (adjacent spans merge, as SpanBERT's merge_intervals).

  positions [B, P] int32 ascending with padding after the real ones; weights [B, P] (> 0 = real).
  Returns (left, right) [B, P] int32, 0 at padding. Works in numpy and TF (pure tensor ops).
  """
  valid = tf.convert_to_tensor(weights) > 0
  positions = tf.convert_to_tensor(positions, tf.int32)
  batch, p = tf.shape(positions)[0], tf.shape(positions)[1]
  prev = tf.pad(positions[:, :-1], [[0, 0], [1, 0]], constant_values=-2)
  nxt = tf.pad(positions[:, 1:], [[0, 0], [0, 1]], constant_values=-2)
  nxt_valid = tf.pad(valid[:, 1:], [[0, 0], [0, 1]])
  starts = valid & (positions != prev + 1)                              # [B, P] run starts
  ends = valid & ~((nxt == positions + 1) & nxt_valid)                  # [B, P] run ends
  run = tf.cumsum(tf.cast(starts, tf.int32), axis=1) - 1                # [B, P] run index
  cols = tf.range(p)[None, :]
  # Slot of the k-th run start / end, gathered back per position by its run index.
  start_slot = tf.sort(tf.where(starts, cols, p), axis=1)
  end_slot = tf.sort(tf.where(ends, cols, p), axis=1)
  padded = tf.pad(positions, [[0, 0], [0, 1]])
  left = tf.gather(padded, tf.gather(start_slot, tf.maximum(run, 0), batch_dims=1),
                   batch_dims=1) - 1
  right = tf.gather(padded, tf.gather(end_slot, tf.maximum(run, 0), batch_dims=1),
                    batch_dims=1) + 1
  del batch
  return tf.where(valid, left, 0), tf.where(valid, right, 0)


def mask_batch(input_ids, input_mask, key, cfg, word_continues=None):
  """Masks a batch of unmasked sequences.

  Args:
    input_ids: [batch, seq] int32, padded with [PAD] (a special id).
    input_mask: [batch, seq] int32, 1 for real tokens.
    key: [2] int64 stateless seed; the output is a pure function of (input_ids, key).
    cfg: MaskConfig.
    word_continues: None, or [batch, seq] int, 1 where a token continues the word before it
      (records' jieba boundaries); used by whole-word masking only.
  Returns:
    masked input_ids [B, S] int32, masked_lm_positions [B, P] int32, masked_lm_ids [B, P] int32,
    masked_lm_weights [B, P] float32, with P = cfg.max_predictions_per_seq.
  """
  num_preds = cfg.max_predictions_per_seq
  input_ids = tf.convert_to_tensor(input_ids, tf.int32)
  batch, seq = tf.shape(input_ids)[0], tf.shape(input_ids)[1]
  select_key, action_key, token_key = tf.unstack(
      tf.random.experimental.stateless_split(key, num=3))
  cand = ~tf.gather(tf.constant(cfg.is_special), input_ids) & (input_mask > 0)  # [B, S]
  ntp = _num_to_predict(tf.reduce_sum(tf.cast(cand, tf.int32), axis=1), cfg)  # [B]

  span_rank = None
  if cfg.scheme != "token":
    selected, span_rank, _ = _select_spans(input_ids, cand, ntp, select_key, cfg, word_continues)
  elif cfg.whole_word_masking:
    selected = _select_whole_words(input_ids, cand, ntp, select_key, cfg, word_continues)
  if cfg.scheme != "token" or cfg.whole_word_masking:
    # Ascending positions of the selected tokens: largest (seq - pos) first, 0 for the rest.
    top, _ = tf.math.top_k(tf.where(selected, seq - tf.range(seq)[None, :], 0), k=num_preds)
    positions = tf.where(top > 0, seq - top, seq)  # [B, P], pad = seq
  else:
    positions = _select_tokens(cand, ntp, select_key, num_preds)
  valid = positions < seq  # [B, P]; real slots come first since padding sorts last

  # [MASK] if action < mask_replace_prob (0.8), unchanged up to 1 - random_replace_prob (0.9),
  # a random non-special token above (BERT's 80/10/10), per selected token (per span with
  # scheme="span": every token of a span gets its span's draw, as SpanBERT). The thresholds are
  # 0.8 and 1 - 0.1 = 0.9 exactly as the literals they replace (the same float32 constants, the
  # same draws: default masks are bit for bit what they were); 1.0 / 0.0 puts every action,
  # uniform in [0, 1), below both: all [MASK], as NeoBERT's collator.
  action = tf.random.stateless_uniform([batch, num_preds], seed=action_key)
  if cfg.scheme == "span":
    per_rank = tf.random.stateless_uniform([batch, seq], seed=action_key)
    ranks = tf.gather(tf.pad(span_rank, [[0, 0], [0, 1]]), positions, batch_dims=1)  # [B, P]
    action = tf.gather(per_rank, tf.maximum(ranks, 0), batch_dims=1)
  vocab_ids = tf.constant(cfg.random_token_ids)
  random_ids = tf.gather(vocab_ids, tf.random.stateless_uniform(
      [batch, num_preds], seed=token_key, minval=0, maxval=vocab_ids.shape[0], dtype=tf.int32))
  # One extra column takes the writes of padding slots, so they never touch a real token.
  padded = tf.pad(input_ids, [[0, 0], [0, 1]])  # [B, S + 1]
  original = tf.gather(padded, positions, batch_dims=1)  # [B, P]
  keep_below = 1.0 - cfg.random_replace_prob
  new = tf.where(action < cfg.mask_replace_prob, cfg.mask_id,
                 tf.where(action < keep_below, original, random_ids))
  rows = tf.broadcast_to(tf.range(batch)[:, None], [batch, num_preds])
  masked = tf.tensor_scatter_nd_update(padded, tf.stack([rows, positions], axis=-1), new)

  zeros = tf.zeros_like(positions)
  return (masked[:, :-1], tf.where(valid, positions, zeros), tf.where(valid, original, zeros),
          tf.cast(valid, tf.float32))
