"""Mixtures of named sources (data_pipelines/input/mixture.py; issue 42 item 1): shares, bad input,
and the mixed stream's determinism, host independence and resume at any step."""
import itertools

import ml_collections
import numpy as np
import pytest

from data_pipelines.input import mixture
from data_pipelines.input import pretrain_input as pi
from tests.data_pipelines.input.masking_test import write_vocab
from tests.data_pipelines.input.pretrain_input_test import make_instances, unmask, write_records

SEQ, PREDS, BATCH = 32, 5, 8


def _config(**kw):
  c = ml_collections.ConfigDict(dict(train_sources="", source_weights="", source_tau=1.0))
  c.update(kw)
  return c


def _resolve(config, records):
  """resolve() on made-up sources: pattern 'NAME' has files NAME-0, NAME-1, records[NAME]."""
  def expand(pattern, what):
    if not records.get(pattern):
      raise pi.InputPipelineError(f"{what}={pattern!r}: no file matches")
    return [f"{pattern}-0", f"{pattern}-1"]
  return mixture.resolve(config, expand, lambda files: records[files[0][:-2]])


def test_shares_by_weights_and_by_size_to_the_tau():
  records = {"ko": 100, "en": 10_000}
  got = _resolve(_config(train_sources="ko=ko;en=en", source_weights="ko=7,en=3"), records)
  assert [(s.name, s.share) for s in got] == [("ko", 0.7), ("en", 0.3)]
  got = _resolve(_config(train_sources="ko=ko;en=en", source_tau=0.3), records)
  want = 100 ** 0.3 / (100 ** 0.3 + 10_000 ** 0.3)          # 0.20: XLM-R's lift for small ones
  assert got[0].share == pytest.approx(want) and got[1].share == pytest.approx(1 - want)
  got = _resolve(_config(train_sources="ko=ko;en=en"), records)    # tau 1: proportional
  assert got[0].share == pytest.approx(100 / 10_100)
  line = mixture.planned_line(got, "records^1")
  assert line.startswith("mixture (records^1): ko 1.0% (100 records, 2 file(s)), en 99.0%")
  assert "runs out repeats" in line


@pytest.mark.parametrize("kw,match", [
    (dict(train_sources="ko=ko;en=none"), "train_sources en='none': no file matches"),
    (dict(train_sources="ko=ko;en=en", source_weights="ko=1,en=-1"), "en=-1; a weight is >= 0"),
    (dict(train_sources="ko=ko;en=en", source_weights="ko=0,en=0"), "every weight is 0"),
    (dict(train_sources="ko=ko;en=en", source_weights="ko=1"), "no weight for en"),
    (dict(train_sources="ko=ko;en=en", source_weights="ko=1,fr=1"), "names 'fr', which is not"),
    (dict(train_sources="ko=ko;en=en", source_tau=0.0), "source_tau=0.0: expected 0 < tau <= 1"),
    (dict(train_sources="ko=ko;en=en", source_tau=1.5), "source_tau=1.5: expected 0 < tau <= 1"),
    (dict(train_sources="ko=ko;en=en", source_weights="ko=1,en=1", source_tau=0.3),
     "both set the shares"),
    (dict(train_sources="ko=ko;ko=en"), "source 'ko' is named twice"),
    (dict(train_sources="data/ko/*"), "is not NAME=GLOB"),
    # Issue 49 item 7: a source weighted twice: the last weight won silently.
    (dict(train_sources="ko=ko;en=en", source_weights="ko=0.7,en=0.3,ko=0.3"),
     r"names ko twice \(ko=0.7, ko=0.3\); give each source one weight"),
])
def test_bad_mixtures_are_one_line_user_errors(kw, match):
  from bert_jax_core import errors
  with pytest.raises(errors.UserError, match=match) as e:
    _resolve(_config(**kw), {"ko": 10, "en": 10})
  assert "\n" not in str(e.value)


def test_draws_resume_at_any_row_and_follow_the_shares():
  from bert_jax_core.tf_setup import tf
  shares = [0.2, 0.5, 0.3]
  draws = np.array(list(mixture.choices(tf, shares, 7, 1, 0).take(3 * mixture.BLOCK)
                        .as_numpy_iterator()))
  np.testing.assert_allclose(np.bincount(draws) / len(draws), shares, atol=0.03)
  for start in (0, 5, mixture.BLOCK, 2 * mixture.BLOCK + 17):
    assert mixture.starts(tf, shares, 7, 1, start) == list(np.bincount(draws[:start],
                                                                       minlength=3))
    again = list(mixture.choices(tf, shares, 7, 1, start).take(40).as_numpy_iterator())
    assert again == list(draws[start:start + 40])
  other = np.array(list(mixture.choices(tf, shares, 7, 2, 0).take(200).as_numpy_iterator()))
  assert (other != draws[:200]).any()   # each shard its own draws


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
  """Source a: 4 files of 10 records; source b: 2 files of 6 (it runs out first)."""
  vocab = write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  rng = np.random.default_rng(0)
  out = []
  for name, files, per in (("a", 4, 10), ("b", 2, 6)):
    root = tmp_path_factory.mktemp(name)
    paths = []
    for i in range(files):
      paths.append(str(root / f"{name}-{i}.tfrecord"))
      write_records(paths[-1], make_instances(vocab, per, rng, seq=SEQ))
    out.append(mixture.Source(name, str(root), tuple(paths), files * per))
  sources = [mixture.dataclasses.replace(s, share=w) for s, w in zip(out, (0.6, 0.4))]
  return vocab, sources


def _batches(vocab, sources, n, *, process_index=0, process_count=1, start_batch=0, pack=False):
  ds = mixture.make_dataset(
      sources, batch_size=BATCH // process_count, seq_length=SEQ, max_predictions_per_seq=PREDS,
      vocab=vocab, seed=3, process_index=process_index, process_count=process_count,
      num_logical_shards=2, start_batch=start_batch, pack=pack, max_instances_per_pack=4,
      pack_chunk_size=8)
  return list(itertools.islice(pi.as_numpy_batches(ds), n))


def _same(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert sorted(x) == sorted(y)
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.slow   # builds several tf.data mixtures (~1 min on 2 cores)
@pytest.mark.parametrize("pack", [False, True])
def test_mixed_stream_is_deterministic_host_independent_and_resumes(two_sources, pack):
  vocab, sources = two_sources
  one = _batches(vocab, sources, 8, pack=pack)
  assert all(b["source_ids"].shape == (BATCH,) for b in one)
  ids = np.concatenate([b["source_ids"] for b in one])
  assert set(ids) == {0, 1}
  _same(one, _batches(vocab, sources, 8, pack=pack))                      # reproducible
  two = [_batches(vocab, sources, 8, process_index=h, process_count=2, pack=pack)
         for h in range(2)]
  _same(one, [{k: np.concatenate([x[k], y[k]]) for k in x} for x, y in zip(*two)])
  for start in (1, 5):                                                    # resume at any step
    _same(one[start:], _batches(vocab, sources, 8 - start, start_batch=start, pack=pack))
  if not pack:   # every row is a record of the source it says; b (24 records) repeats
    b_rows = [tuple(r) for x in one for r, s in zip(unmask(x), x["source_ids"]) if s == 1]
    assert len(b_rows) > 12 and len(set(b_rows)) < len(b_rows)
