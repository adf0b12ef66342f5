"""input_source.batch_spec: the global batch contract the step is compiled for, checked against the
batches the pipelines really make (synthetic, unpacked records, packed records)."""

import itertools

import numpy as np
import pytest

from bert_jax.training import input_source
from bert_jax.configs import pretrain
from data_pipelines.input import pretrain_input as pi
from tests.data_pipelines.input.pretrain_input_test import PREDS, SEQ, make_instances, write_records, write_vocab


def _config(batch, pack):
  c = pretrain.get_config("tiny")
  c.batch_size, c.seq_length, c.max_predictions_per_seq, c.pack = batch, SEQ, PREDS, pack
  return c


def _as_spec(batch):
  return {k: (v.shape, v.dtype.name) for k, v in batch.items()}


def test_synthetic_batches_match_the_spec():
  c = _config(8, False)
  batch = next(input_source.synthetic_batches(batch_size=8, seq_length=SEQ,
                                              max_predictions_per_seq=PREDS, vocab_size=100,
                                              seed=0))
  assert _as_spec(batch) == input_source.batch_spec(c, None)


def test_synthetic_rows_shorter_than_the_predictions_pad_them():
  """60 predictions at seq 64 (rows of 32-64 tokens; modernbert-tiny's 39 failed so at seq 64):
  a short row predicts each of its tokens but [CLS] once and pads the rest (weight 0, position
  0); it was numpy's "Cannot take a larger sample than population" traceback."""
  for batch in itertools.islice(input_source.synthetic_batches(
      batch_size=16, seq_length=64, max_predictions_per_seq=60, vocab_size=100, seed=0), 3):
    lengths = batch["input_mask"].sum(-1)
    weights, positions = batch["masked_lm_weights"], batch["masked_lm_positions"]
    assert positions.shape == weights.shape == (16, 60)
    real = weights > 0                        # the last quarter always pads: 45 at most
    assert (real.sum(-1) == np.minimum(lengths - 1, 60 - 60 // 4)).all()
    assert (lengths - 1 < 45).any()                                  # some rows were short
    assert ((positions >= 1) & (positions < lengths[:, None]))[real].all()
    assert (positions[~real] == 0).all() and (batch["masked_lm_ids"][~real] == 0).all()
    for row, mask in zip(positions, real):          # distinct positions, in order
      assert (np.diff(row[mask]) > 0).all()


@pytest.mark.parametrize("pack", [False, True])
def test_record_batches_match_the_spec(tmp_path, pack):
  vocab = write_vocab(tmp_path / "vocab.txt")
  write_records(tmp_path / "part-0.tfrecord", make_instances(vocab, 64, np.random.default_rng(0)))
  c = _config(8, pack)
  layout = dict(pack=pack, max_instances_per_pack=0)
  ds = pi.make_pretrain_dataset(str(tmp_path / "part-*"), batch_size=8, seq_length=SEQ,
                                max_predictions_per_seq=PREDS, vocab=vocab, pack=pack,
                                masked_lm_prob=c.masked_lm_prob)
  (batch,) = itertools.islice(pi.as_numpy_batches(ds), 1)
  assert _as_spec(batch) == input_source.batch_spec(c, layout)


def test_a_second_run_in_one_process_tallies_only_its_own_sources(monkeypatch):
  """The per-source tally (summary.json's "sources") counts the batches of this run's training
  stream: a second run in the same process (a test session, a notebook) started from zero; it
  once carried the first run's rows on (the full suite: 112 rows for a 4-step x 8-row run)."""
  def batches(*args, **kwargs):
    for _ in range(3):
      yield {"source_ids": np.array([0, 1, 1, 0]), "input_mask": np.ones((4, 8), np.int32)}
  monkeypatch.setattr(input_source, "make_batches", batches)
  config = {"input_stall_minutes": 10}
  for _ in range(2):
    it = input_source.stream(config, None, {"mixture": True}, 4, ["a.tfrecord"], 0, 0)
    assert len(list(it)) == 3
    rows = input_source._TALLY.counts[..., 0]   # pylint: disable=protected-access
    np.testing.assert_array_equal(rows, [[6, 6]])   # 3 batches x 2 rows of each source
