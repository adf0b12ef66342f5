"""Packed pre-training rows: the packer's invariants, and the packed tf.data stream (resumable,
host-count independent, every instance exactly once per epoch, google's pre-masked records)."""
import itertools

import numpy as np
import pytest

from data_pipelines.records import packing
from data_pipelines.input import pretrain_input as pi
from bert_jax_core.tf_setup import tf
from tests.bert_jax.finetune_test import pretrained  # noqa: F401 - fixture
from tests.data_pipelines.input.pretrain_input_test import (  # noqa: F401 - fixtures
    PREDS, SEQ, assert_batches_equal, data, int_feature, make_instances, take, vocab,
    write_records)

BATCH = 8


def packed(pattern, vocab, **kw):
  args = dict(batch_size=BATCH, seq_length=SEQ, max_predictions_per_seq=PREDS, vocab=vocab,
              pack=True, max_instances_per_pack=4, pack_chunk_size=16)
  args.update(kw)
  return pi.make_pretrain_dataset(pattern, **args)


def instances_of(batch):
  """The instances of packed rows: (original token ids, segment ids, NSP label) tuples."""
  out = []
  for r in range(batch["input_ids"].shape[0]):
    ids = batch["input_ids"][r].copy()
    valid = batch["masked_lm_weights"][r] > 0
    ids[batch["masked_lm_positions"][r][valid]] = batch["masked_lm_ids"][r][valid]
    for k in np.flatnonzero(batch["nsp_weights"][r]):
      where = batch["instance_ids"][r] == k + 1
      start = batch["cls_positions"][r, k]
      assert np.flatnonzero(where)[0] == start
      np.testing.assert_array_equal(batch["position_ids"][r][where], np.arange(where.sum()))
      out.append((tuple(ids[where]), tuple(batch["segment_ids"][r][where]),
                  int(batch["next_sentence_labels"][r, k])))
  return out


def as_tuple(inst):
  n = int(inst["input_mask"].sum())
  return (tuple(inst["input_ids"][:n]), tuple(inst["segment_ids"][:n]),
          int(inst["next_sentence_labels"][0]))


def random_chunk(rng, lengths, seq=64, preds=6):
  n = len(lengths)
  f = {k: np.zeros((n, seq), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  f.update({k: np.zeros((n, preds), np.int32) for k in ("masked_lm_positions", "masked_lm_ids")})
  f["masked_lm_weights"] = np.zeros((n, preds), np.float32)
  for i, length in enumerate(lengths):
    f["input_ids"][i, :length] = rng.integers(5, 100, length)
    f["input_mask"][i, :length] = 1
    f["segment_ids"][i, length // 2:length] = 1
    k = int(rng.integers(1, min(preds, length - 1) + 1))
    pos = np.sort(rng.choice(np.arange(1, length), k, replace=False))
    f["masked_lm_positions"][i, :k] = pos
    f["masked_lm_ids"][i, :k] = rng.integers(5, 100, k)
    f["masked_lm_weights"][i, :k] = 1.0
  f["next_sentence_labels"] = rng.integers(0, 2, n).astype(np.int32)
  return f


def test_pack_arrays_places_every_token_and_prediction_once():
  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 65, 200)
  f = random_chunk(rng, lengths)
  p = packing.pack_arrays(f, 7, max_instances=5, max_preds=12, count_preds=True)
  r = p["input_ids"].shape[0]
  with pytest.raises(ValueError, match="more than max_predictions_per_pack=6"):
    packing.pack_arrays(f, 7, max_instances=5, max_preds=6, count_preds=False)
  assert {k: v.shape for k, v in p.items()} == {
      **{k: (r, 64) for k in ("input_ids", "input_mask", "segment_ids", "instance_ids",
                              "position_ids")},
      **{k: (r, 12) for k in ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")},
      **{k: (r, 5) for k in ("cls_positions", "next_sentence_labels", "nsp_weights")}}
  assert p["input_mask"].sum() == lengths.sum() and p["nsp_weights"].sum() == 200
  assert p["masked_lm_weights"].sum() == f["masked_lm_weights"].sum()
  np.testing.assert_array_equal(p["input_mask"], p["instance_ids"] > 0)
  assert np.all(p["nsp_weights"].sum(1) <= 5) and np.all(p["masked_lm_weights"].sum(1) <= 12)
  # Each instance comes back whole: its tokens, segments, label and predictions.
  want = sorted((tuple(f["input_ids"][i, :n]), tuple(f["segment_ids"][i, :n]),
                 int(f["next_sentence_labels"][i]),
                 tuple(f["masked_lm_positions"][i, :int(f["masked_lm_weights"][i].sum())]))
                for i, n in enumerate(lengths))
  got = []
  for row in range(r):
    for k in np.flatnonzero(p["nsp_weights"][row]):
      where = np.flatnonzero(p["instance_ids"][row] == k + 1)
      start = p["cls_positions"][row, k]
      assert where[0] == start and np.all(np.diff(where) == 1)  # contiguous, from its [CLS]
      np.testing.assert_array_equal(p["position_ids"][row, where], np.arange(len(where)))
      mine = ((p["masked_lm_weights"][row] > 0) & (p["masked_lm_positions"][row] >= start)
              & (p["masked_lm_positions"][row] <= where[-1]))
      got.append((tuple(p["input_ids"][row, where]), tuple(p["segment_ids"][row, where]),
                  int(p["next_sentence_labels"][row, k]),
                  tuple(p["masked_lm_positions"][row, mine] - start)))
  assert sorted(got) == want
  # The same chunk and seed give the same rows; another seed only reorders them.
  again = packing.pack_arrays(f, 7, max_instances=5, max_preds=12, count_preds=True)
  other = packing.pack_arrays(f, 8, max_instances=5, max_preds=12, count_preds=True)
  for k in p:
    np.testing.assert_array_equal(p[k], again[k])
  assert sorted(map(tuple, p["input_ids"])) == sorted(map(tuple, other["input_ids"]))
  assert not np.array_equal(p["input_ids"], other["input_ids"])


def test_best_fit_fills_rows_of_a_skewed_length_mix():
  # Like the quick start's records at seq 128: many short instances, a tenth full length.
  rng = np.random.default_rng(1)
  lengths = np.where(rng.random(4096) < 0.12, 128, np.clip(rng.gamma(2.5, 16, 4096), 8, 128))
  lengths = lengths.astype(int)
  rows = sum(packing.num_rows(c, np.zeros_like(c), 128, 8, 27) for c in np.split(lengths, 4))
  assert lengths.sum() / (rows * 128) >= 0.97
  assert lengths.sum() / (len(lengths) * 128) < 0.5  # unpacked: most of every row is padding


def test_prediction_budget_is_respected_when_counted():
  lengths = np.full(8, 10)
  preds = np.full(8, 5)
  row, _, _, pred_offset, rows = packing.assign(lengths, preds, 64, 8, 12)
  assert rows == 4  # tokens allow 6 a row, predictions only 2
  assert np.all(np.bincount(row) == 2) and set(pred_offset) == {0, 5}
  # Uncounted (dynamic masking, where Q is a bound): rows by tokens only, offsets still add up.
  row, _, _, pred_offset, rows = packing.assign(lengths, preds, 64, 8, 60, count_preds=False)
  assert rows == 2 and sorted(pred_offset[row == 0]) == [0, 5, 10, 15, 20, 25]
  assert packing.max_predictions_per_pack(128, 8) == 19 + 8
  with pytest.raises(ValueError, match="does not fit a row of 64"):
    packing.assign(np.array([65]), np.array([0]), 64, 8, 12)


def test_packed_epoch_holds_every_instance_once(data, vocab):
  root, instances = data
  ds = packed(root + "/part-*", vocab, shuffle=False, repeat=False, num_logical_shards=1,
              batch_size=1)
  got = [i for b in take(ds, 1000) for i in instances_of(b)]
  assert sorted(got) == sorted(as_tuple(i) for i in instances)
  # Instances of 9-32 tokens (mean ~20.5) in rows of 32 need >= 74 rows; chunks of only 16
  # instances give 89.
  assert len(take(ds, 1000)) < 0.8 * len(instances)


def test_packed_stream_shapes_and_efficiency(data, vocab):
  ds = packed(data[0] + "/*", vocab)
  spec = ds.element_spec
  assert spec["instance_ids"].shape == (BATCH, SEQ) and spec["nsp_weights"].shape == (BATCH, 4)
  q = packing.max_predictions_per_pack(SEQ, 4)
  assert spec["masked_lm_positions"].shape == (BATCH, q)
  batches = take(ds, 12)
  assert sorted(batches[0]) == sorted(packing.PACKED_KEYS)
  unpacked = take(pi.make_pretrain_dataset(data[0] + "/*", batch_size=BATCH, seq_length=SEQ,
                                           max_predictions_per_seq=PREDS, vocab=vocab), 12)
  # Instances of 9-32 tokens (mean ~20.5) fill 0.64 of a row of 32; packed ~0.86 with chunks of
  # just 16 instances (benchmarks/packing.py measures real records with the default chunks).
  assert packing.efficiency(batches) > 0.8 > 0.7 > packing.efficiency(unpacked)


@pytest.mark.parametrize("start", [1, 5, 11, 40])  # inside chunk 0, later chunks, 3rd epoch
def test_packed_start_batch_resumes_the_stream(data, vocab, start):
  fresh = take(packed(data[0] + "/*", vocab, seed=4, shuffle_buffer=20), start + 4)
  resumed = take(packed(data[0] + "/*", vocab, seed=4, shuffle_buffer=20, start_batch=start), 4)
  assert_batches_equal(fresh[start:], resumed)


def test_packed_stream_is_the_same_for_two_hosts(data, vocab):
  one = take(packed(data[0] + "/*", vocab, seed=9), 6)
  hosts = [take(packed(data[0] + "/*", vocab, seed=9, batch_size=BATCH // 2, process_index=h,
                       process_count=2, start_batch=2), 4) for h in range(2)]
  assert_batches_equal(one[2:], [{k: np.concatenate([a[k], b[k]]) for k in a}
                                 for a, b in zip(*hosts)])


def test_google_premasked_records_pack(tmp_path, vocab):
  rng = np.random.default_rng(5)
  instances = make_instances(vocab, 24, rng)
  path = tmp_path / "google.tfrecord"
  with tf.io.TFRecordWriter(str(path)) as w:
    for inst in instances:
      pos = np.sort(rng.choice(np.arange(1, 6), 3, replace=False))
      feats = {k: int_feature(v) for k, v in inst.items()}
      ids = inst["input_ids"].copy()
      ids[pos] = vocab.mask_id
      feats["input_ids"] = int_feature(ids)
      feats["masked_lm_positions"] = int_feature(np.concatenate([pos, [0] * (PREDS - 3)]))
      feats["masked_lm_ids"] = int_feature(np.concatenate([inst["input_ids"][pos],
                                                           [0] * (PREDS - 3)]))
      feats["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(
          value=[1.0] * 3 + [0.0] * (PREDS - 3)))
      w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
  ds = packed(str(path), vocab, shuffle=False, repeat=False, batch_size=1)
  assert ds.element_spec["masked_lm_ids"].shape == (1, PREDS * 4)
  got = [i for b in take(ds, 100) for i in instances_of(b)]
  assert sorted(got) == sorted(as_tuple(i) for i in instances)


def test_layout_errors(data, vocab):
  with pytest.raises(pi.InputPipelineError, match=r"global batch 8 is not divisible by "
                                                  r"num_logical_shards=3"):
    packed(data[0] + "/*", vocab, num_logical_shards=3)
  with pytest.raises(pi.InputPipelineError, match=r"num_logical_shards=8 but the pattern "
                                                  r"matches 4 file"):
    packed(data[0] + "/*", vocab, num_logical_shards=8)
  with pytest.raises(pi.InputPipelineError, match=r"num_logical_shards=2 \(config\) is not "
                                                  r"divisible by the 4 hosts"):
    packed(data[0] + "/*", vocab, num_logical_shards=2, batch_size=2, process_count=4)
  assert pi.num_logical_shards_for(4, 32) == 4 and pi.num_logical_shards_for(1024, 256) == 256
  assert pi.num_logical_shards_for(6, 32) == 2 and pi.num_logical_shards_for(6, 32, 3) == 3


# ----------------------------------------------------------------------------------------------
# Fine-tuning: packed training rows of classification / regression.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["classification", "regression"])
def test_finetune_packed_loss_and_gradients_equal_unpacked(family):
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune
  from bert_jax.training import finetune_tasks
  from bert_jax.models import heads
  from bert_jax.models import model as model_lib
  config = model_lib.get_bert_config("tiny", vocab_size=99, max_position_embeddings=32,
                                     hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  rng = np.random.default_rng(3)
  lengths = [9, 14, 5, 20, 7, 11]
  f = {k: np.zeros((6, 32), np.int32) for k in ("input_ids", "input_mask", "segment_ids")}
  for i, n in enumerate(lengths):
    f["input_ids"][i, :n] = rng.integers(5, 99, n)
    f["input_mask"][i, :n] = 1
    f["segment_ids"][i, n // 2:n] = 1
  f["label_ids"] = (rng.integers(0, 3, 6).astype(np.int32) if family == "classification"
                    else rng.uniform(0, 5, 6).astype(np.float32))
  f["example_weights"] = np.ones(6, np.float32)
  p = packing.pack_examples({k: v for k, v in f.items() if k != "example_weights"},
                            max_instances=4)
  assert p["input_ids"].shape[0] < 6 and p["example_weights"].sum() == 6
  model = heads.create_model(family, config, num_labels=3)
  params = model.init(jax.random.PRNGKey(0), *heads.dummy_inputs(family, 32))["params"]

  def loss(params, batch):
    out = model.apply({"params": params}, batch, True, method=finetune.forward)
    return finetune_tasks.loss_fn(family, out, batch)[0]

  grad = jax.jit(jax.value_and_grad(loss))
  lu, gu = grad(params, f)
  lp, gp = grad(params, p)
  np.testing.assert_allclose(lp, lu, rtol=1e-5)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(gu))
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)


def test_finetune_with_pack_trains_fewer_steps_and_evaluates_unpacked(tmp_path, pretrained):
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test as ftt  # pylint: disable=g-import-not-at-top
  ftt._sst2(tmp_path, np.random.default_rng(0), 48, 8)  # sequences of ~8 tokens at seq 32
  config = ftt._config("glue_sst2", pretrained, tmp_path, num_train_epochs=1.0,
                       do_predict=False, log_every=1, pack=True)
  summary = finetune.finetune(config, str(tmp_path / "run"))
  # 48 sequences of <= 16 tokens, 2 per row of 32 (K = 32 // 16): 24 rows = 3 batches of 8.
  assert summary["steps"] == 3 and not summary["stopped_early"]
  assert 0.0 <= summary["history"][0]["eval/dev/accuracy"] <= 1.0  # on the 8 unpacked dev rows
  with pytest.raises(finetune.ConfigError, match="packing is for sentence"):
    finetune.pack_train(type("S", (), {"features": {}})(), type("T", (), dict(
        type="span", name="squad"))(), config)
