"""Phases of a mixture (data_pipelines/input/phases.py; issue 42 item 2): the plan's steps, shares and
masking rates, one-line errors, and the phased stream's determinism, host independence and
resume inside any phase (input_source.stream_phases and mixture.make_dataset)."""
import itertools

import ml_collections
import numpy as np
import pytest

from bert_jax.training import input_source
from bert_jax_core import errors
from data_pipelines.input import mixture
from data_pipelines.input import phases
from data_pipelines.input import pretrain_input as pi
from tests.data_pipelines.input.masking_test import write_vocab
from tests.data_pipelines.input.mixture_test import _same   # batch lists equal key by key
from tests.data_pipelines.input.pretrain_input_test import make_instances, write_records

SEQ, PREDS, BATCH = 32, 12, 8


def _config(spec, steps=10, **kw):
  c = ml_collections.ConfigDict(dict(train_sources="a=a;b=b", source_weights="", source_tau=1.0,
                                     phases=spec, num_train_steps=steps, masked_lm_prob=0.15))
  c.update(kw)
  return c


SOURCES = [mixture.Source("a", "a", ("a-0",), 900, 0.5), mixture.Source("b", "b", ("b-0",), 100,
                                                                         0.5)]


def test_plan_steps_shares_and_masks():
  got = phases.plan(_config("steps=6,sources=a,mask=0.3 | steps=4,tau=0.5"), SOURCES)
  assert [(p.first_step, p.end_step, p.mask) for p in got] == [(0, 6, 0.3), (6, 10, 0.15)]
  assert got[0].shares == (1.0, 0.0)                     # b sits out
  assert got[1].shares == pytest.approx((0.75, 0.25))    # 900^.5 : 100^.5 = 30 : 10
  got = phases.plan(_config("steps=60% | steps=30%,weights=a:1;b:3 | steps=10%", steps=1001),
                    SOURCES)
  assert [p.end_step - p.first_step for p in got] == [600, 300, 101]   # the last takes the rest
  assert got[1].shares == (0.25, 0.75) and got[1].sampling == "weights"
  assert got[0].shares == pytest.approx((0.9, 0.1))      # the run's records^1
  lines = phases.startup_lines(got, SOURCES)
  assert lines[1] == "  phase 1: steps 1-600 (600): a 90.0%, b 10.0% (records^1); mask 15%"
  assert lines[2].startswith("  phase 2: steps 601-900 (300): a 25.0%, b 75.0% (weights)")
  assert phases.max_mask(_config("steps=5,mask=0.3|steps=5,mask=0.05")) == 0.3


@pytest.mark.parametrize("spec,match", [
    ("steps=6 | steps=3", r"add up to 9 \(6 \+ 3\) but config.num_train_steps=10"),
    ("steps=60% | steps=30%", "add up to 90%, not 100%"),
    ("steps=5 | steps=50%", "every phase's steps as a count or every one as a percentage"),
    ("steps=5,sources=a;fr | steps=5", "phase 1 names 'fr', which is not a source"),
    ("steps=5,mask=1.0 | steps=5", "phase 1: mask=1: expected a fraction of the tokens between"),
    ("steps=5 | steps=5,mask=0", "phase 2: mask=0: expected"),
    ("steps=5,tau=0.5,weights=a:1 | steps=5", "gives both tau= and weights="),
    ("steps=5,tau=1.5 | steps=5", "tau=1.5: expected 0 < tau <= 1"),
    ("steps=5,rate=0.3 | steps=5", "'rate=0.3' is not one of steps="),
    ("steps=5 | | steps=5", "phase 2 is empty"),
    ("sources=a | steps=10", "phase 1 .* has no steps=N"),
    # Issue 49 item 7: a source weighted twice in a phase: the last weight won silently.
    ("steps=5,weights=a:1;a:3 | steps=5", "phase 1: weights= names a twice; give each source one"),
])
def test_bad_phases_are_one_line_errors(spec, match):
  with pytest.raises(errors.UserError, match=match) as e:
    phases.plan(_config(spec), SOURCES)
  assert "\n" not in str(e.value) and str(e.value).startswith("config.phases: ")


def test_too_few_prediction_slots_for_a_phase():
  planned = phases.plan(_config("steps=5,mask=0.3 | steps=5"), SOURCES)
  with pytest.raises(errors.UserError, match="phase 1 masks 30% of 128 tokens = 38 predictions a "
                     "row, but config.max_predictions_per_seq=20 would cap it; pass "
                     "--config.max_predictions_per_seq=39"):
    phases.check_predictions(planned, 128, 20)


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
  """Source a: 2 files of 12 records; source b: 2 files of 6."""
  vocab = write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  rng = np.random.default_rng(1)
  out = []
  for name, per in (("a", 12), ("b", 6)):
    root = tmp_path_factory.mktemp(name)
    paths = [str(root / f"{name}-{i}.tfrecord") for i in range(2)]
    for p in paths:
      write_records(p, make_instances(vocab, per, rng, seq=SEQ))
    out.append(mixture.Source(name, str(root), tuple(paths), 2 * per, 0.5))
  return vocab, out


# Steps 1-3: a alone, 30% masked; steps 4-5: a and b 50/50, 5% masked; 6-: b alone, 15%.
LAYOUT = dict(phases=[dict(end_position=3, shares=[1.0, 0.0], mask=0.3),
                      dict(end_position=5, shares=[0.5, 0.5], mask=0.05),
                      dict(end_position=9, shares=[0.0, 1.0], mask=0.15)])


def _batches(vocab, sources, n, *, start=0, stream_start=0, process_index=0, process_count=1):
  ds = mixture.make_dataset(
      sources, batch_size=BATCH // process_count, seq_length=SEQ, max_predictions_per_seq=PREDS,
      vocab=vocab, seed=5, process_index=process_index, process_count=process_count,
      num_logical_shards=2, start_batch=start,
      phases=input_source.stream_phases(LAYOUT, stream_start))
  return list(itertools.islice(pi.as_numpy_batches(ds), n))


@pytest.mark.slow   # builds five tf.data mixtures of three phases (~60 s on a busy 2-core box)
def test_phased_stream_is_deterministic_host_independent_and_resumes_in_any_phase(two_sources):
  vocab, sources = two_sources
  one = _batches(vocab, sources, 7)
  phase = [set(b["phase_ids"]) for b in one]
  assert phase == [{0}] * 3 + [{1}] * 2 + [{2}] * 2
  assert all(set(b["source_ids"]) == {0} for b in one[:3])                 # b sits out first
  assert set(np.concatenate([b["source_ids"] for b in one[3:5]])) == {0, 1}
  assert all(set(b["source_ids"]) == {1} for b in one[5:])
  # The masking rate follows the phase: predictions per real token (PREDS never caps these).
  rate = [b["masked_lm_weights"].sum() / b["input_mask"].sum() for b in one]
  assert min(rate[:3]) > 0.25 and max(rate[3:5]) < 0.1 and 0.1 < min(rate[5:]) < 0.2
  two = [_batches(vocab, sources, 7, process_index=h, process_count=2) for h in range(2)]
  _same(one, [{k: np.concatenate([x[k], y[k]]) for k in x} for x, y in zip(*two)])
  for start in (2, 6):   # inside phase 1; inside phase 3 (two phases' draws counted)
    _same(one[start:], _batches(vocab, sources, 7 - start, start=start))

def test_stream_phases_of_a_layout():
  got = input_source.stream_phases(LAYOUT)
  assert [(p.index, p.first_batch, p.end_batch, p.mask) for p in got] == [
      (0, 0, 3, 0.3), (1, 3, 5, 0.05), (2, 5, None, 0.15)]   # the last never ends
  got = input_source.stream_phases(LAYOUT, stream_start=4)
  assert [(p.index, p.first_batch, p.end_batch) for p in got] == [(1, 0, 1), (2, 1, None)]
  assert input_source.stream_phases({}) is None


def test_pre_masked_records_cannot_follow_a_masking_schedule(tmp_path, two_sources):
  from bert_jax_core.tf_setup import tf
  from tests.data_pipelines.input.pretrain_input_test import int_feature
  vocab, _ = two_sources
  rng = np.random.default_rng(2)
  paths = [str(tmp_path / f"google-{i}.tfrecord") for i in range(4)]
  for path in paths:   # google-research/bert's records: their masks are in them
    with tf.io.TFRecordWriter(path) as w:
      for inst in make_instances(vocab, 4, rng, seq=SEQ):
        feats = {k: int_feature(v) for k, v in inst.items()}
        feats.update(masked_lm_positions=int_feature(np.zeros(PREDS, np.int64)),
                     masked_lm_ids=int_feature(np.zeros(PREDS, np.int64)),
                     masked_lm_weights=tf.train.Feature(float_list=tf.train.FloatList(
                         value=[0.0] * PREDS)))
        w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
  google = [mixture.Source(n, str(tmp_path), tuple(paths[i::2]), 8, 0.5)
            for i, n in enumerate("gh")]
  with pytest.raises(errors.UserError, match="google-0.tfrecord: pre-masked records .* fix their "
                     "masks, so config.phases cannot change the masking rate"):
    _batches(vocab, google, 1)
