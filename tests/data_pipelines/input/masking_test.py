"""Statistics and invariants of the in-graph dynamic masking (data_pipelines/input/masking.py)."""
import numpy as np
import pytest

from data_pipelines.input import masking
from data_pipelines.tokenizers import vocab as vocab_lib
from bert_jax_core.tf_setup import tf

SEQ = 128
PREDS = 20
NUM_SEQS = 10240  # >= 10,000 sequences for the statistics


def write_vocab(path, num_words=600, num_pieces=380):
  """A WordPiece vocab: specials and [unusedN] first, then words, then "##" pieces."""
  tokens = (["[PAD]"] + [f"[unused{i}]" for i in range(5)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            + [f"w{i}" for i in range(num_words)] + [f"##c{i}" for i in range(num_pieces)])
  path.write_text("\n".join(tokens) + "\n")
  return vocab_lib.wordpiece_info(str(path))


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def make_sequences(vocab, num, seq, rng, cont_prob=0.0, min_len=4):
  """[CLS] a [SEP] b [SEP] [PAD]...; body ids are non-special, ##pieces with prob cont_prob."""
  words = np.flatnonzero(~vocab.is_special & ~vocab.is_continuation)
  pieces = np.flatnonzero(vocab.is_continuation)
  ids = np.zeros([num, seq], np.int32)
  mask = np.zeros([num, seq], np.int32)
  for r in range(num):
    n = int(rng.integers(min_len, seq - 2))
    body = rng.choice(words, n)
    is_piece = rng.random(n) < cont_prob
    body[is_piece] = rng.choice(pieces, int(is_piece.sum()))
    a = int(rng.integers(1, n))
    row = [vocab.cls_id, *body[:a], vocab.sep_id, *body[a:], vocab.sep_id]
    ids[r, :len(row)] = row
    mask[r, :len(row)] = 1
  return ids, mask


def run_mask(ids, mask, cfg, key=(1, 2)):
  out = masking.mask_batch(tf.constant(ids), tf.constant(mask), tf.constant(key, tf.int64), cfg)
  return [t.numpy() for t in out]


def expected_num_to_predict(num_candidates, prob, preds):
  # google-research/bert: min(max_predictions_per_seq, max(1, int(round(n * masked_lm_prob)))).
  return np.array([min(preds, max(1, int(round(n * prob))), n) for n in num_candidates])


def check_invariants(ids, mask, out, vocab, preds):
  masked, pos, lm_ids, weights = out
  valid = weights > 0
  assert pos.shape == lm_ids.shape == weights.shape == (ids.shape[0], preds)
  assert set(np.unique(weights)) <= {0.0, 1.0}
  # Real slots first, then padding with position 0, id 0.
  assert np.all(np.diff(valid.astype(int), axis=1) <= 0)
  assert np.all(pos[~valid] == 0) and np.all(lm_ids[~valid] == 0)
  big = np.where(valid, pos, ids.shape[1] + np.arange(preds))
  assert np.all(np.diff(big, axis=1) > 0), "positions must be strictly ascending (so unique)"
  assert np.all((pos[valid] >= 0) & (pos[valid] < ids.shape[1]))
  rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], pos.shape)
  np.testing.assert_array_equal(lm_ids[valid], ids[rows[valid], pos[valid]])
  assert not vocab.is_special[ids[rows[valid], pos[valid]]].any(), "a special token was selected"
  assert np.all(mask[rows[valid], pos[valid]] == 1)
  selected = np.zeros(ids.shape, bool)
  selected[rows[valid], pos[valid]] = True
  np.testing.assert_array_equal(masked[~selected], ids[~selected])  # the rest untouched
  return selected


def test_masking_statistics(vocab):
  rng = np.random.default_rng(0)
  ids, mask = make_sequences(vocab, NUM_SEQS, SEQ, rng)
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=PREDS,
                                       whole_word_masking=False)
  out = run_mask(ids, mask, cfg)
  masked, pos, lm_ids, weights = out
  selected = check_invariants(ids, mask, out, vocab, PREDS)

  candidates = ~vocab.is_special[ids] & (mask == 1)
  ntp = expected_num_to_predict(candidates.sum(1), 0.15, PREDS)
  np.testing.assert_array_equal(weights.sum(1), ntp)  # the exact count, row by row
  # Uncapped rows select 15% of their candidates up to rounding (|error| <= 0.5 token per row).
  uncapped = ntp < PREDS
  frac = selected[uncapped].sum() / candidates[uncapped].sum()
  assert abs(frac - 0.15) < 0.005, frac
  # Uniform over positions: the first and second half of the candidates are hit equally often.
  cum = np.cumsum(candidates, 1)
  first = candidates & (cum <= candidates.sum(1, keepdims=True) // 2)
  rate_first = selected[first].sum() / first.sum()
  rate_second = selected[candidates & ~first].sum() / (candidates & ~first).sum()
  assert abs(rate_first - rate_second) < 0.006, (rate_first, rate_second)

  # 80% [MASK], 10% random, 10% unchanged; ~99k selected tokens -> std 0.0013 for the 80%,
  # 0.00095 for the 10%s, so the bounds below are ~5 sigma.
  sel_new, sel_old = masked[selected], ids[selected]
  n = sel_new.size
  assert n > 90_000
  to_mask = np.mean(sel_new == vocab.mask_id)
  unchanged = np.mean(sel_new == sel_old)
  replaced = 1 - to_mask - unchanged
  assert abs(to_mask - 0.8) < 0.006, to_mask
  # A random draw equals the original with prob 1/990 (0.01% of the 10%), within the bounds.
  assert abs(unchanged - 0.1) < 0.005, unchanged
  assert abs(replaced - 0.1) < 0.005, replaced
  random_ids = sel_new[(sel_new != vocab.mask_id) & (sel_new != sel_old)]
  assert not vocab.is_special[random_ids].any(), "a special token was inserted"
  # Drawn from all non-special ids: ~9.9k draws over 980 ids hit nearly all of them.
  assert len(np.unique(random_ids)) > 0.95 * (~vocab.is_special).sum()


def test_capped_and_degenerate_rows(vocab):
  rng = np.random.default_rng(1)
  ids, mask = make_sequences(vocab, 64, SEQ, rng, min_len=100)  # 100+ candidates -> capped at 8
  ids[0, 3:] = 0
  mask[0, 3:] = 0
  ids[0, :3] = [vocab.cls_id, vocab.sep_id, vocab.sep_id]  # no candidate at all
  ids[1, :4] = [vocab.cls_id, ids[1, 1], vocab.sep_id, vocab.sep_id]  # exactly one
  ids[1, 4:], mask[1, 4:] = 0, 0
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=8,
                                       whole_word_masking=False)
  out = run_mask(ids, mask, cfg)
  check_invariants(ids, mask, out, vocab, 8)
  weights = out[3].sum(1)
  assert weights[0] == 0 and weights[1] == 1 and np.all(weights[2:] == 8)
  np.testing.assert_array_equal(out[0][0], ids[0])


def test_same_key_same_masks_new_key_new_masks(vocab):
  ids, mask = make_sequences(vocab, 32, SEQ, np.random.default_rng(2))
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=PREDS,
                                       whole_word_masking=False)
  a, b, c = run_mask(ids, mask, cfg, (5, 6)), run_mask(ids, mask, cfg, (5, 6)), run_mask(
      ids, mask, cfg, (5, 7))
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert np.mean(np.all(a[1] == c[1], axis=1)) < 0.05


def word_spans(row_ids, row_mask, vocab):
  """google-research/bert's words: a "##" piece joins the previous candidate token's word."""
  words, prev_cand = [], False
  for i, (t, m) in enumerate(zip(row_ids, row_mask)):
    cand = m == 1 and not vocab.is_special[t]
    if cand and vocab.is_continuation[t] and prev_cand:
      words[-1].append(i)
    elif cand:
      words.append([i])
    prev_cand = cand
  return words


def test_whole_word_masking_keeps_words_whole(vocab):
  rng = np.random.default_rng(3)
  ids, mask = make_sequences(vocab, 2048, SEQ, rng, cont_prob=0.4)
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=PREDS,
                                       whole_word_masking=True)
  out = run_mask(ids, mask, cfg)
  selected = check_invariants(ids, mask, out, vocab, PREDS)
  candidates = ~vocab.is_special[ids] & (mask == 1)
  ntp = expected_num_to_predict(candidates.sum(1), 0.15, PREDS)
  counts = selected.sum(1)
  assert np.all(counts <= ntp)
  multi_piece_words_hit = 0
  for r in range(ids.shape[0]):
    for w in word_spans(ids[r], mask[r], vocab):
      hit = selected[r, w]
      assert hit.all() or not hit.any(), f"row {r}: word {w} partly masked"
      multi_piece_words_hit += hit.all() and len(w) > 1
      # Greedy maximality: a word left out must not have fit in what was left.
      if not hit.any():
        assert counts[r] + len(w) > ntp[r], f"row {r}: word {w} fits but was skipped"
  assert multi_piece_words_hit > 1000
  assert counts.sum() / ntp.sum() > 0.95  # the greedy fill leaves little room unused
  # A "##" piece right after [SEP] starts its own word and can be masked alone.
  ids2, mask2 = ids[:1].copy(), mask[:1].copy()
  ids2[0, :4] = [vocab.cls_id, vocab.sep_id, np.flatnonzero(vocab.is_continuation)[0], vocab.sep_id]
  ids2[0, 4:], mask2[0, 4:] = 0, 0
  out2 = run_mask(ids2, mask2, cfg)
  assert out2[3][0].sum() == 1 and out2[1][0, 0] == 2


def test_config_errors(vocab):
  with pytest.raises(ValueError, match="masked_lm_prob"):
    masking.mask_config_from_vocab(vocab, masked_lm_prob=0.0, max_predictions_per_seq=20,
                                   whole_word_masking=False)
  with pytest.raises(ValueError, match="max_predictions_per_seq"):
    masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=0,
                                   whole_word_masking=False)


# ----------------------------------------------------------------------------------------------
# ALBERT's n-gram and SpanBERT's span masking: >= 10k draws against their distributions.
# ----------------------------------------------------------------------------------------------
# Chi-square critical values at p = 0.001 (a correct sampler fails 1 run in 1,000 per test).
CHI2_001 = {2: 13.82, 9: 27.88}


def _chi2(counts, probs):
  counts = np.asarray(counts, float)
  expected = counts.sum() * np.asarray(probs, float)
  return float(np.sum((counts - expected) ** 2 / expected))


def _select(vocab, ids, mask, scheme, key=(3, 4), whole_word=True, prob=0.15):
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=prob, max_predictions_per_seq=PREDS,
                                       whole_word_masking=whole_word, scheme=scheme)
  ids_t = tf.constant(ids)
  cand = ~tf.gather(tf.constant(cfg.is_special), ids_t) & (tf.constant(mask) > 0)
  ntp = masking._num_to_predict(tf.reduce_sum(tf.cast(cand, tf.int32), axis=1), cfg)
  select_key = tf.unstack(tf.random.experimental.stateless_split(
      tf.constant(key, tf.int64), num=3))[0]   # as mask_batch splits its key
  selected, rank, record = masking._select_spans(ids_t, cand, ntp, select_key, cfg)
  return cfg, selected.numpy(), rank.numpy(), {k: v.numpy() for k, v in record.items()}


def test_ngram_lengths_follow_one_over_n(vocab):
  rng = np.random.default_rng(10)
  ids, mask = make_sequences(vocab, 2048, SEQ, rng, min_len=60)
  _, _, _, rec = _select(vocab, ids, mask, "ngram", whole_word=False)
  drawn = rec["drawn"][rec["limit"] == 3]     # visits with 3 n-grams available
  assert drawn.size >= 10_000
  counts = np.bincount(drawn, minlength=4)[1:]
  assert _chi2(counts, masking.ngram_probs(3)) < CHI2_001[2], counts
  # Where fewer units are left (the row's last two), n is drawn from the truncated 1/n.
  drawn2 = rec["drawn"][rec["limit"] == 2]
  assert set(np.unique(drawn2)) <= {1, 2} and set(np.unique(rec["drawn"][rec["limit"] == 1])) <= {
      1}


def _albert_reference(word_lens, ntp, rng, max_n=3):
  """google-research/albert create_masked_lm_predictions' selection loop on a row of words
  (each a count of tokens), ported line by line with the reference's names: returns the n-gram
  sizes (in words) it masks."""
  pvals = 1.0 / np.arange(1, max_n + 1)
  pvals /= pvals.sum()
  cand_indexes, t = [], 0
  for length in word_lens:
    cand_indexes.append(list(range(t, t + length)))
    t += length
  ngram_indexes = [[cand_indexes[idx:idx + n] for n in range(1, max_n + 1)]
                   for idx in range(len(cand_indexes))]
  rng.shuffle(ngram_indexes)
  masked, covered, sizes = 0, set(), []
  for cand_index_set in ngram_indexes:
    if masked >= ntp:
      break
    cand_index_set = [c for c in cand_index_set if len(c) == len(cand_index_set[0]) + 0 or c]
    avail = len({len(c) for c in cand_index_set})        # n-grams that exist from this word
    n = rng.choice(np.arange(1, avail + 1), p=pvals[:avail] / pvals[:avail].sum())
    index_set = sum(cand_index_set[n - 1], [])
    n -= 1
    while masked + len(index_set) > ntp:
      if n == 0:
        break
      index_set = sum(cand_index_set[n - 1], [])
      n -= 1
    if masked + len(index_set) > ntp:
      continue
    if any(i in covered for i in index_set):
      continue
    covered.update(index_set)
    masked += len(index_set)
    sizes.append(n + 1)
  return sizes, masked


def test_ngram_selection_matches_google_research_albert(vocab):
  rng = np.random.default_rng(11)
  ids, mask = make_sequences(vocab, 4096, SEQ, rng, cont_prob=0.3, min_len=40)
  cfg, selected, _, rec = _select(vocab, ids, mask, "ngram")
  ours = rec["taken"][rec["taken"] > 0]
  # The reference on the same rows (words from the same "##" rule), its own random stream.
  ref_rng = np.random.default_rng(12)
  ref_sizes, ref_masked, ntps = [], [], []
  for r in range(ids.shape[0]):
    body = [int(i) for i in ids[r][mask[r] > 0] if not vocab.is_special[i]]
    lens = []
    for i in body:
      if vocab.is_continuation[i] and lens:
        lens[-1] += 1
      else:
        lens.append(1)
    ntp = min(PREDS, max(1, round(len(body) * 0.15)), len(body))
    sizes, masked = _albert_reference(lens, ntp, ref_rng)
    ref_sizes += sizes
    ref_masked.append(masked)
    ntps.append(ntp)
  assert len(ours) >= 10_000 and len(ref_sizes) >= 10_000
  # Two-sample chi-square (homogeneity, 2 dof) over n-gram sizes 1..3.
  a, b = np.bincount(ours, minlength=4)[1:], np.bincount(ref_sizes, minlength=4)[1:]
  table = np.stack([a, b]).astype(float)
  expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
  assert np.sum((table - expected) ** 2 / expected) < CHI2_001[2], (a, b)
  # The budget: the same masked-token count per row on average (the greedy fill leaves a few
  # rows one word short in both).
  np.testing.assert_allclose(selected.sum(1).mean(), np.mean(ref_masked), rtol=0.01)
  assert np.all(selected.sum(1) <= np.array(ntps))


def test_ngram_masking_with_mask_batch_keeps_words_whole_and_is_deterministic(vocab):
  rng = np.random.default_rng(13)
  ids, mask = make_sequences(vocab, 256, SEQ, rng, cont_prob=0.3)
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=PREDS,
                                       whole_word_masking=True, scheme="ngram")
  out = run_mask(ids, mask, cfg)
  selected = check_invariants(ids, mask, out, vocab, PREDS)
  cand = ~vocab.is_special[ids] & (mask > 0)
  cont = vocab.is_continuation[ids] & cand & np.pad(cand[:, :-1], [(0, 0), (1, 0)])
  # A "##" piece is selected exactly when the token before it is (whole words; a piece right
  # after [SEP] starts a word).
  np.testing.assert_array_equal(selected[:, 1:][cont[:, 1:]], selected[:, :-1][cont[:, 1:]])
  for a, b in zip(out, run_mask(ids, mask, cfg)):
    np.testing.assert_array_equal(a, b)


def test_span_lengths_are_geometric_clipped_at_10(vocab):
  rng = np.random.default_rng(14)
  ids, mask = make_sequences(vocab, 4096, SEQ, rng, cont_prob=0.3, min_len=60)
  _, _, _, rec = _select(vocab, ids, mask, "span")
  drawn = rec["drawn"][rec["drawn"] > 0]
  assert drawn.size >= 10_000 and drawn.max() <= 10
  counts = np.bincount(drawn, minlength=11)[1:]
  probs = masking.span_length_probs(0.2, 10)
  np.testing.assert_allclose(probs[1] / probs[0], 0.8)
  assert _chi2(counts, probs) < CHI2_001[9], counts
  # The mean span length in words, geometric(0.2) clipped at 10: 3.8 (SpanBERT's paper).
  np.testing.assert_allclose(np.sum(np.arange(1, 11) * probs), 3.79, atol=0.01)


def test_span_masking_complete_words_budget_and_80_10_10_per_span(vocab):
  rng = np.random.default_rng(15)
  ids, mask = make_sequences(vocab, NUM_SEQS, SEQ, rng, cont_prob=0.3)
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=PREDS,
                                       whole_word_masking=False, scheme="span")
  out = run_mask(ids, mask, cfg, key=(3, 4))
  selected = check_invariants(ids, mask, out, vocab, PREDS)
  masked, pos, _, weights = out
  cand = (~vocab.is_special[ids]) & (mask > 0)
  cont = vocab.is_continuation[ids] & cand & np.pad(cand[:, :-1], [(0, 0), (1, 0)])
  np.testing.assert_array_equal(selected[:, 1:][cont[:, 1:]], selected[:, :-1][cont[:, 1:]])
  ntp = expected_num_to_predict(cand.sum(1), 0.15, PREDS)
  assert np.all(selected.sum(1) <= ntp)
  assert np.mean(selected.sum(1) == ntp) > 0.9   # whole words fill the budget in most rows
  # One 80/10/10 draw per span: every span (the tokens one visit masked) is all [MASK] or none.
  _, sel2, rank, _ = _select(vocab, ids, mask, "span", key=(3, 4), whole_word=False)
  np.testing.assert_array_equal(sel2, selected)
  is_mask = masked == vocab.mask_id
  spans = all_mask = 0
  for r in range(ids.shape[0]):
    for k in np.unique(rank[r][rank[r] >= 0]):
      m = is_mask[r][rank[r] == k]
      assert m.all() or not m.any(), (r, k)
      spans += 1
      all_mask += m.all()
  assert spans >= 10_000
  assert abs(all_mask / spans - 0.8) < 4 * np.sqrt(0.16 / spans)


def test_span_boundaries_of_runs():
  pos = np.array([[2, 3, 4, 7, 9, 10, 0, 0], [1, 5, 0, 0, 0, 0, 0, 0]], np.int32)
  w = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]], np.float32)
  left, right = (t.numpy() for t in masking.span_boundaries(pos, w))
  np.testing.assert_array_equal(left, [[1, 1, 1, 6, 8, 8, 0, 0], [0, 4, 0, 0, 0, 0, 0, 0]])
  np.testing.assert_array_equal(right, [[5, 5, 5, 8, 11, 11, 0, 0], [2, 6, 0, 0, 0, 0, 0, 0]])


def test_unknown_scheme_is_an_error(vocab):
  with pytest.raises(ValueError, match="masking scheme 'whole'"):
    masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=20,
                                   whole_word_masking=False, scheme="whole")
