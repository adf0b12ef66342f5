"""Pure instance logic: NSP pairs as google-research/bert, truncation, FULL-SENTENCES packing."""

import array
import random

import numpy as np
import pytest

from data_pipelines.corpus import text_sources
from data_pipelines.records import instances as il

CLS, SEP = 2, 3
PARAMS = il.InstanceParams(max_seq_length=64, short_seq_prob=0.0, cls_id=CLS, sep_id=SEP)


def _documents(num_docs, seed=0, min_sentences=1, max_sentences=30, max_len=20):
  """Token id = 100_000 * (doc + 1) + position in the doc: the id tells doc and order."""
  rng = random.Random(seed)
  docs = []
  for d in range(num_docs):
    pos, doc = 0, []
    for _ in range(rng.randint(min_sentences, max_sentences)):
      n = rng.randint(1, max_len)
      doc.append(array.array("i", range(100_000 * (d + 1) + pos, 100_000 * (d + 1) + pos + n)))
      pos += n
    docs.append(doc)
  return docs


def _split(inst):
  """Checks the [CLS] A [SEP] B [SEP] layout and returns (A, B)."""
  t, seg = inst.tokens, inst.segment_ids
  assert t[0] == CLS and t[-1] == SEP and t.count(SEP) == 2 and t.count(CLS) == 1
  first_sep = t.index(SEP)
  a, b = t[1:first_sep], t[first_sep + 1:-1]
  assert a and b
  assert seg == [0] * (len(a) + 2) + [1] * (len(b) + 1)
  return a, b


def _all_instances(docs, params, seed=1):
  rng = random.Random(seed)
  return [(i, inst) for i in range(len(docs))
          for inst in il.create_instances_from_document(docs, i, rng, params)]


def _naive_truncate(a, b, max_num_tokens, rng):
  # The reference's loop, one deletion at a time.
  while len(a) + len(b) > max_num_tokens:
    trunc = a if len(a) > len(b) else b
    if rng.random() < 0.5:
      del trunc[0]
    else:
      trunc.pop()


def test_truncate_seq_pair_matches_one_at_a_time_deletion():
  rng = random.Random(0)
  for case in range(300):
    a = list(range(rng.randint(1, 80)))
    b = list(range(1000, 1000 + rng.randint(1, 80)))
    limit = rng.randint(2, 120)
    a1, b1, a2, b2 = list(a), list(b), list(a), list(b)
    il.truncate_seq_pair(a1, b1, limit, random.Random(case))
    _naive_truncate(a2, b2, limit, random.Random(case))
    assert (a1, b1) == (a2, b2)
    assert len(a1) + len(b1) == min(limit, len(a) + len(b))
    # What is left is a contiguous run of each input (cut at the front and/or the back).
    if a1:
      assert a1 == a[a.index(a1[0]):a.index(a1[0]) + len(a1)]


def test_truncate_seq_pair_cuts_the_longer_side_from_both_ends():
  fronts = backs = 0
  for seed in range(200):
    a, b = list(range(100)), list(range(1000, 1010))
    il.truncate_seq_pair(a, b, 60, random.Random(seed))
    assert len(a) == 50 and len(b) == 10  # only the longer one lost tokens
    fronts += a[0]
    backs += 99 - a[-1]
  assert 0.4 < fronts / (fronts + backs) < 0.6  # 50 cuts per case, half at each end


def test_nsp_layout_lengths_and_label_balance():
  docs = _documents(300)
  instances = _all_instances(docs, PARAMS)
  assert len(instances) > 1000
  labels = []
  for doc_index, inst in instances:
    a, b = _split(inst)
    assert len(inst.tokens) <= PARAMS.max_seq_length
    doc_of = lambda tokens: {t // 100_000 - 1 for t in tokens}
    assert doc_of(a) == {doc_index}  # A always comes from the document itself
    if inst.is_random_next:
      assert doc_of(b) != {doc_index} and len(doc_of(b)) == 1
    else:  # B is the actual continuation: same document, after A
      assert doc_of(b) == {doc_index} and min(b) > max(a)
    labels.append(inst.is_random_next)
  # 50% random next, plus every one-sentence chunk (forced NotNext): a few % here.
  assert 0.48 < np.mean(labels) < 0.56, np.mean(labels)


def test_unused_segments_are_put_back():
  # With random next, the chunk's sentences after A are not consumed: they start the next
  # chunk. So nearly every token of a document appears in its own instances' A or IsNext B;
  # without the put-back about a quarter would be lost (half of the NotNext chunks' text).
  docs = _documents(100, max_len=6)
  covered = {d: set() for d in range(len(docs))}
  for doc_index, inst in _all_instances(docs, PARAMS):
    a, b = _split(inst)
    covered[doc_index].update(a if inst.is_random_next else a + b)
  total = sum(sum(map(len, d)) for d in docs)
  kept = sum(len(c) for c in covered.values())
  assert kept / total > 0.97, kept / total


def test_short_seq_prob_shortens_instances():
  docs = _documents(200, min_sentences=20)
  lengths = {}
  for prob in (0.0, 1.0):
    params = il.InstanceParams(max_seq_length=64, short_seq_prob=prob, cls_id=CLS, sep_id=SEP)
    lengths[prob] = np.mean([len(inst.tokens) for _, inst in _all_instances(docs, params)])
  # Targets uniform in [2, 61] average ~32 instead of 61 tokens.
  assert lengths[0.0] > 55 and lengths[1.0] < 0.75 * lengths[0.0], lengths


def test_same_rng_same_instances_and_single_document_pool():
  docs = _documents(20)
  a = [(i, x.tokens, x.is_random_next) for i, x in _all_instances(docs, PARAMS, seed=5)]
  b = [(i, x.tokens, x.is_random_next) for i, x in _all_instances(docs, PARAMS, seed=5)]
  c = [(i, x.tokens, x.is_random_next) for i, x in _all_instances(docs, PARAMS, seed=6)]
  assert a == b and a != c
  # One document alone: "random next" falls back to the document itself, as the original.
  one = il.create_instances_from_document(docs[:1], 0, random.Random(0), PARAMS)
  assert one and all(_split(x) for x in one)


def test_pack_full_sentences():
  docs = _documents(30, max_len=25)
  docs[3][0] = array.array("i", range(10**9, 10**9 + 200))  # a sentence over 62 tokens
  params = il.InstanceParams(max_seq_length=64, cls_id=CLS, sep_id=SEP)
  out = il.pack_full_sentences(docs, params)
  body = []
  for inst in out:
    t = inst.tokens
    assert t[0] == CLS and t[-1] == SEP and CLS not in t[1:] and len(t) <= 64
    assert inst.segment_ids == [0] * len(t) and not inst.is_random_next
    body.append(t[1:-1])
  # Nothing lost, nothing reordered; inside an instance, [SEP] only where a document ends.
  flat = [x for t in body for x in t if x != SEP]
  assert flat == [x for d in docs for s in d for x in s]
  for t in body:
    for i, x in enumerate(t):
      if x == SEP:
        assert t[i - 1] // 100_000 != t[i + 1] // 100_000
  assert any(SEP in t for t in body)  # documents do get packed together
  # Greedy: an instance is closed only when the next sentence (or 62-token piece of one) would
  # not fit, even without a separator.
  piece_length = {s[i]: len(s[i:i + 62]) for d in docs for s in d for i in range(0, len(s), 62)}
  for t, nxt in zip(body, body[1:]):
    assert len(t) + piece_length[nxt[0]] >= 62
  assert [x for t in body for x in t if x >= 10**9] == list(range(10**9, 10**9 + 200))


@pytest.mark.parametrize("text,expected", [
    ("Hello world. This is it! \"Quoted.\" Next one? yes no.",
     ["Hello world.", "This is it!", "\"Quoted.\"", "Next one? yes no."]),
    ("Line one\n\n  Line (two).  3 items.\r\nEnd", ["Line one", "Line (two).", "3 items.", "End"]),
    ("e.g. this stays whole. And splits.", ["e.g. this stays whole.", "And splits."]),
    ("  \n\t \n", []),
])
def test_split_sentences(text, expected):
  assert text_sources.split_sentences_regex(text) == expected


def _planned_instances(docs, params, seed=1):
  """Whole-corpus planning: (doc index, pair, instance) with B cut from the drawn document."""
  out = []
  rng = random.Random(seed)
  for i, doc in enumerate(docs):
    for pair in il.plan_nsp_pairs(doc, i, len(docs), rng, params, key=(i,)):
      tokens_b = pair.tokens_b
      if pair.random_document >= 0:
        tokens_b = il.random_next_tokens(docs[pair.random_document], pair)
      out.append((i, pair, il.finish_pair(pair, tokens_b, random.Random(hash(pair.key)), params)))
  return out


def test_planned_pairs_have_the_nsp_layout_and_balance():
  docs = _documents(200, seed=3)
  planned = _planned_instances(docs, PARAMS)
  labels = []
  for i, pair, inst in planned:
    a, b = _split(inst)
    assert len(inst.tokens) <= PARAMS.max_seq_length
    assert all(t // 100_000 == i + 1 for t in a)  # A: the document's own text
    owners = {t // 100_000 - 1 for t in b}
    assert len(owners) == 1  # B: one document, contiguous
    if inst.is_random_next:
      assert owners == {pair.random_document} != {i}
    else:
      assert owners == {i} and a[-1] < b[0]  # IsNext: the actual continuation
    labels.append(inst.is_random_next)
  # Long documents (up to 30 sentences) make multi-sentence chunks: NotNext close to half.
  assert 0.4 < np.mean(labels) < 0.6
  keys = [pair.key for _, pair, _ in planned]
  assert len(set(keys)) == len(keys)


def test_planned_random_documents_are_uniform_over_the_corpus():
  docs = _documents(20, seed=4, max_sentences=5)
  rng = random.Random(0)
  counts = np.zeros(20)
  for _ in range(200):
    for i, doc in enumerate(docs):
      for pair in il.plan_nsp_pairs(doc, i, 20, rng, PARAMS):
        if pair.random_document >= 0:
          assert pair.random_document != i
          counts[pair.random_document] += 1
  expected = counts.sum() / 20
  assert (np.abs(counts - expected) < 5 * np.sqrt(expected)).all()


def test_plan_depends_only_on_the_document_and_the_corpus_size():
  # The property that lets Beam plan a document without the others: a corpus of other
  # content but the same size gives the same pairs for the same rng.
  docs, other = _documents(50, seed=5), _documents(50, seed=6)
  plan = lambda corpus: il.plan_nsp_pairs(corpus[7], 7, 50, random.Random(9), PARAMS, key=(7,))
  other[7] = docs[7]
  assert plan(docs) == plan(other)
  # A one-document corpus draws itself, as the original's fallback.
  for pair in il.plan_nsp_pairs(docs[0], 0, 1, random.Random(0), PARAMS):
    assert pair.random_document in (-1, 0)


def test_random_next_tokens_starts_uniformly_and_stops_at_the_target():
  doc = [array.array("i", range(10 * s, 10 * s + 10)) for s in range(8)]  # 8 sentences of 10
  starts = []
  for u in np.linspace(0, 0.999, 80):
    pair = il.Pair((0,), [1], [], 1, float(u), 25)
    b = il.random_next_tokens(doc, pair)
    assert b[0] % 10 == 0 and len(b) == min(30, 80 - b[0])  # whole sentences, >= 25 if it can
    starts.append(b[0] // 10)
  assert np.bincount(starts).tolist() == [10] * 8


# ----------------------------------------------------------------------------------------------
# SOP (ALBERT): consecutive segments of one document, in order (label 0) or swapped (label 1).
# ----------------------------------------------------------------------------------------------
def _sop_all(docs, params, seed=3):
  rng = random.Random(seed)
  return [inst for d in docs for inst in il.create_sop_instances(d, rng, params)]


def test_sop_pairs_are_consecutive_segments_in_or_out_of_order():
  docs = _documents(4000, seed=4)
  params = il.InstanceParams(max_seq_length=64, short_seq_prob=0.1, cls_id=CLS, sep_id=SEP)
  out = _sop_all(docs, params)
  assert len(out) >= 10_000
  swapped = exact = 0
  for inst in out:
    a, b = _split(inst)
    first, second = (b, a) if inst.is_random_next else (a, b)
    assert len({t // 100_000 for t in first + second}) == 1, "both from one document"
    for seg in (first, second):   # truncation trims the ends only: each stays contiguous
      assert seg == list(range(seg[0], seg[0] + len(seg)))
    assert first[-1] < second[0], "label 0 = A before B in the document, 1 = swapped"
    exact += first[-1] + 1 == second[0]   # no token trimmed between them
    swapped += inst.is_random_next
  assert exact > len(out) // 2
  # Label 1 (swapped) with probability 1/2: within 4 standard deviations over >= 10k instances.
  assert abs(swapped / len(out) - 0.5) < 4 * np.sqrt(0.25 / len(out))


def test_sop_single_sentence_chunks_are_split_and_tokens_are_not_lost():
  # One sentence per document: ALBERT would draw B from another document; here it is split.
  docs = [[array.array("i", range(100_000 * (d + 1), 100_000 * (d + 1) + 10))] for d in range(50)]
  docs.append([array.array("i", [7])])        # one token: no pair can be made, skipped
  out = _sop_all(docs, PARAMS)
  assert len(out) == 50
  for inst in out:
    a, b = _split(inst)
    assert sorted(a + b) == list(range(min(a + b), min(a + b) + 10))


def test_sop_truncates_to_max_seq_length_and_the_whole_corpus_plan_makes_sop_pairs():
  docs = _documents(300, seed=5, max_len=60)
  params = il.InstanceParams(max_seq_length=32, short_seq_prob=0.1, cls_id=CLS, sep_id=SEP)
  assert max(len(i.tokens) for i in _sop_all(docs, params)) <= 32
  # plan_sop_pairs + finish_pair (the whole-corpus / Beam path): complete pairs (no random
  # document), swapped ones laid out B A with label 1, truncated with the pair's own stream.
  rng = random.Random(3)
  labels = []
  for g, d in enumerate(docs):
    for pair in il.plan_sop_pairs(d, rng, params, key=(g, 0)):
      assert pair.random_document == -1 and pair.key[:2] == (g, 0)
      inst = il.finish_pair(pair, pair.tokens_b, random.Random(str(pair.key)), params)
      a, b = _split(inst)
      first, second = (b, a) if inst.is_random_next else (a, b)
      assert first[-1] < second[0] and len(inst.tokens) <= 32
      assert inst.is_random_next == pair.swapped
      labels.append(pair.swapped)
  assert 0.4 < np.mean(labels) < 0.6
