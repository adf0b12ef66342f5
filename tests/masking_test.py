"""Statistics and invariants of the in-graph dynamic masking (data_pipelines/masking.py)."""
import numpy as np
import pytest

from data_pipelines import masking
from data_pipelines import vocab as vocab_lib
from data_pipelines.tf_setup import tf

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
