"""The pre-training tf.data pipeline: determinism, resumption, host sharding, formats, errors."""
import itertools

import numpy as np
import pytest

from data_pipelines.input import pretrain_input as pi
from bert_jax_core.tf_setup import tf
from tests.data_pipelines.input.masking_test import write_vocab

SEQ = 32
PREDS = 5
BATCH = 8


def int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def make_instances(vocab, num, rng, seq=SEQ):
  """Unique random instances: dicts of numpy arrays as create_pretraining_data writes them."""
  words = np.flatnonzero(~vocab.is_special)
  out = []
  for _ in range(num):
    n = int(rng.integers(6, seq - 2))
    a = int(rng.integers(1, n))
    body = rng.choice(words, n)
    row = [vocab.cls_id, *body[:a], vocab.sep_id, *body[a:], vocab.sep_id]
    pad = [0] * (seq - len(row))
    out.append(dict(input_ids=np.array(row + pad), input_mask=np.array([1] * len(row) + pad),
                    segment_ids=np.array([0] * (a + 2) + [1] * (n - a + 1) + pad),
                    next_sentence_labels=np.array([int(rng.integers(2))])))
  return out


def write_records(path, instances):
  with tf.io.TFRecordWriter(str(path)) as w:
    for inst in instances:
      feats = {k: int_feature(v) for k, v in inst.items()}
      w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


@pytest.fixture(scope="module")
def data(tmp_path_factory, vocab):
  """4 files of 30, 30, 30, 26 records (116 in all, so epochs do not align with batches of 8)."""
  root = tmp_path_factory.mktemp("data")
  rng = np.random.default_rng(0)
  instances = make_instances(vocab, 116, rng)
  sizes = [30, 30, 30, 26]
  starts = np.cumsum([0] + sizes)
  for i, (s, e) in enumerate(zip(starts[:-1], starts[1:])):
    write_records(root / f"part-{i:02d}.tfrecord", instances[s:e])
  (root / "dataset_info.json").write_text("{}")  # must be ignored by "part-*" and "*" patterns
  return str(root), instances


def dataset(pattern, vocab, **kw):
  args = dict(batch_size=BATCH, seq_length=SEQ, max_predictions_per_seq=PREDS, vocab=vocab)
  args.update(kw)
  return pi.make_pretrain_dataset(pattern, **args)


def take(ds, n):
  return list(itertools.islice(pi.as_numpy_batches(ds), n))


def assert_batches_equal(a, b):
  assert len(a) == len(b)
  for x, y in zip(a, b):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k], err_msg=k)


def unmask(batch):
  """The original input_ids of each row, from the masked ids and masked_lm_ids."""
  ids = batch["input_ids"].copy()
  for r in range(ids.shape[0]):
    valid = batch["masked_lm_weights"][r] > 0
    ids[r, batch["masked_lm_positions"][r][valid]] = batch["masked_lm_ids"][r][valid]
  return ids


def rows(batches):
  return [tuple(row) for b in batches for row in unmask(b)]


@pytest.mark.parametrize("whole_word_masking", [False, True])
def test_shapes_and_dtypes(data, vocab, whole_word_masking):
  ds = dataset(data[0] + "/*", vocab, whole_word_masking=whole_word_masking)
  spec = ds.element_spec
  assert spec["input_ids"].shape == (BATCH, SEQ) and spec["next_sentence_labels"].shape == (BATCH,)
  assert spec["masked_lm_positions"].shape == (BATCH, PREDS)
  (batch,) = take(ds, 1)
  assert sorted(batch) == sorted(pi.BATCH_KEYS)
  for k, v in batch.items():
    assert v.dtype == (np.float32 if k == "masked_lm_weights" else np.int32), k


def test_record_round_trip(data, vocab):
  root, instances = data
  ds = dataset(root + "/part-00.tfrecord", vocab, shuffle=False, repeat=False)
  batches = take(ds, 100)
  assert len(batches) == 30 // BATCH  # drop_remainder: 3 full batches of the 30 records
  got = {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}
  want = {k: np.stack([inst[k] for inst in instances[:24]]) for k in instances[0]}
  np.testing.assert_array_equal(np.concatenate([unmask(b) for b in batches]), want["input_ids"])
  for k in ("input_mask", "segment_ids"):
    np.testing.assert_array_equal(got[k], want[k])
  np.testing.assert_array_equal(got["next_sentence_labels"], want["next_sentence_labels"][:, 0])
  assert np.all(got["masked_lm_weights"].sum(1) >= 1)


def test_same_seed_same_batches_across_epochs(data, vocab):
  # 40 batches of 8 = 320 records: ~2.8 epochs of 116, so epoch reshuffles are covered.
  a = take(dataset(data[0] + "/*", vocab, seed=7, shuffle_buffer=50), 40)
  b = take(dataset(data[0] + "/*", vocab, seed=7, shuffle_buffer=50), 40)
  assert_batches_equal(a, b)
  c = take(dataset(data[0] + "/*", vocab, seed=8, shuffle_buffer=50), 40)
  assert not np.array_equal(a[0]["input_ids"], c[0]["input_ids"])


def test_each_epoch_is_a_new_permutation(data, vocab):
  root, instances = data
  # One logical shard reads all 4 files: 116 records = 14.5 batches of 8; 29 batches = two
  # epochs exactly.
  got = rows(take(dataset(root + "/part-*", vocab, seed=3, shuffle_buffer=40,
                          num_logical_shards=1), 29))
  everything = sorted(tuple(i["input_ids"]) for i in instances)
  assert sorted(got[:116]) == everything and sorted(got[116:]) == everything
  assert got[:116] != got[116:]


def test_new_epoch_new_masks(data, vocab):
  # Without shuffling, epoch 1 repeats epoch 0's 30 records in order (5 batches of 6 each);
  # only the masks change, since they are keyed by the batch's index in the stream.
  batches = take(dataset(data[0] + "/part-00.tfrecord", vocab, shuffle=False, batch_size=6), 10)
  first, second = batches[:5], batches[5:]
  assert rows(first) == rows(second)
  for x, y in zip(first, second):
    assert not np.array_equal(x["masked_lm_positions"], y["masked_lm_positions"])


@pytest.mark.parametrize("start", [3, 14, 16, 31])  # inside epoch 0, across 1, inside 2
def test_start_batch_resumes_the_stream(data, vocab, start):
  fresh = take(dataset(data[0] + "/*", vocab, seed=5, shuffle_buffer=20), 36)
  resumed = take(dataset(data[0] + "/*", vocab, seed=5, shuffle_buffer=20, start_batch=start),
                 36 - start)
  assert_batches_equal(fresh[start:], resumed)


def test_start_batch_without_repeat(data, vocab):
  fresh = take(dataset(data[0] + "/*", vocab, repeat=False), 100)
  # 4 logical shards of one file each feed 2 rows a batch; the one of 26 records ends first.
  assert len(fresh) == 26 // 2
  resumed = take(dataset(data[0] + "/*", vocab, repeat=False, start_batch=4), 100)
  assert_batches_equal(fresh[4:], resumed)


def test_two_hosts_read_disjoint_files_and_make_the_one_host_stream(data, vocab):
  root, instances = data
  one = take(dataset(root + "/part-*", vocab, batch_size=4, seed=2, shuffle_buffer=20), 20)
  per_host = []
  for host in range(2):
    ds = dataset(root + "/part-*", vocab, batch_size=2, seed=2, shuffle_buffer=20,
                 process_index=host, process_count=2)
    per_host.append(take(ds, 20))
  # Global batch = host 0's rows then host 1's: the one-host stream, masks included.
  assert_batches_equal(one, [{k: np.concatenate([a[k], b[k]]) for k in a}
                             for a, b in zip(*per_host)])
  # 4 logical shards (gcd(4 files, batch 4)): host 0 reads files 0-1 only, host 1 files 2-3.
  by_file = [{tuple(i["input_ids"]) for i in instances[s:s + 30]} for s in (0, 30, 60, 90)]
  assert set(rows(per_host[0])) <= by_file[0] | by_file[1]
  assert set(rows(per_host[1])) <= by_file[2] | by_file[3]


def test_google_bert_premasked_records(tmp_path, vocab):
  rng = np.random.default_rng(1)
  instances = make_instances(vocab, 16, rng)
  for inst in instances:
    pos = np.sort(rng.choice(np.arange(1, 6), 3, replace=False))
    inst["masked_lm_positions"] = np.concatenate([pos, [0] * (PREDS - 3)])
    inst["masked_lm_ids"] = np.concatenate([inst["input_ids"][pos], [0] * (PREDS - 3)])
    inst["input_ids"] = inst["input_ids"].copy()
    inst["input_ids"][pos] = vocab.mask_id
  path = tmp_path / "google.tfrecord"
  with tf.io.TFRecordWriter(str(path)) as w:
    for inst in instances:
      feats = {k: int_feature(v) for k, v in inst.items()}
      feats["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(
          value=[1.0] * 3 + [0.0] * (PREDS - 3)))
      w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
  batches = take(dataset(str(path), vocab, shuffle=False, repeat=False), 10)
  assert len(batches) == 2
  for k in ("input_ids", "masked_lm_positions", "masked_lm_ids"):
    got = np.concatenate([b[k] for b in batches])
    np.testing.assert_array_equal(got, np.stack([inst[k] for inst in instances]), err_msg=k)
  weights = np.concatenate([b["masked_lm_weights"] for b in batches])
  assert weights.dtype == np.float32 and np.all(weights.sum(1) == 3)
  with pytest.raises(pi.InputPipelineError, match="pre-masked but premasked=False"):
    dataset(str(path), vocab, premasked=False)
  with pytest.raises(pi.InputPipelineError, match=r"masked_lm_positions of length 5, expected 20"):
    dataset(str(path), vocab, max_predictions_per_seq=20)
  # Masking flags cannot change pre-masked records: refused, not silently ignored (issue 23, 4).
  with pytest.raises(pi.InputPipelineError, match=r"records are pre-masked .* so "
                     r"--config.masked_lm_prob, --config.whole_word_masking would be ignored"):
    dataset(str(path), vocab, masked_lm_prob=0.2, whole_word_masking=True)


def test_no_files(tmp_path, vocab):
  with pytest.raises(pi.InputPipelineError, match=r"no file matches.*create_pretraining_data"):
    dataset(str(tmp_path / "nothing-*.tfrecord"), vocab)


def test_a_directory_where_record_files_go_is_one_line(data, vocab, tmp_path):
  # Issue 49: --config.train_input_files=DIR read the directory as a record file: a TensorFlow
  # ReduceDataset error that advised regenerating the records.
  folder = data[0]
  for pattern in (folder, folder + "/", f"{folder}/part-00.tfrecord,{folder}"):
    with pytest.raises(pi.InputPipelineError) as e:
      pi.expand_file_pattern(pattern, what="config.train_input_files")
    directory = pattern.split(",")[-1]
    assert str(e.value) == (
        f"config.train_input_files={pattern!r}: {directory} is a directory; pass the record "
        f"files in it, e.g. config.train_input_files='{folder}/part-*' (create_pretraining_data's"
        " shards are part-*.tfrecord).")
  with pytest.raises(pi.InputPipelineError, match=r"file_pattern=.* is a directory"):
    dataset(folder, vocab)
  # A glob that matches a directory among the record files (a folder left in the output dir).
  write_records(tmp_path / "part-00.tfrecord", make_instances(vocab, 2, np.random.default_rng(4)))
  (tmp_path / "part-old").mkdir()
  files = pi.expand_file_pattern(str(tmp_path / "part-*"))
  with pytest.raises(pi.InputPipelineError) as e:
    pi.drop_empty_files(files, "config.eval_input_files")
  assert str(e.value).startswith(f"config.eval_input_files: the pattern matches the directory "
                                 f"{tmp_path}/part-old; pass a glob of the record files only")


def test_fewer_files_than_hosts(data, vocab):
  with pytest.raises(pi.InputPipelineError,
                     match=r"num_logical_shards=4 \(config\) is not divisible by the 8 hosts"):
    dataset(data[0] + "/part-*", vocab, process_index=0, process_count=8)


def test_wrong_seq_length_in_the_first_record(data, vocab):
  with pytest.raises(pi.InputPipelineError,
                     match=r"part-00.tfrecord: record 0 has input_ids of length 32, expected 64; "
                           r"set --max_seq_length / config.seq_length to 32"):
    dataset(data[0] + "/part-*", vocab, seq_length=64)


def test_wrong_seq_length_later_in_a_file(tmp_path, vocab):
  rng = np.random.default_rng(2)
  write_records(tmp_path / "a.tfrecord", make_instances(vocab, 12, rng))
  bad = make_instances(vocab, 12, rng)
  bad[7] = make_instances(vocab, 1, rng, seq=48)[0]
  write_records(tmp_path / "b.tfrecord", bad)
  ds = dataset(str(tmp_path / "*.tfrecord"), vocab, shuffle=False, repeat=False)
  with pytest.raises(pi.InputPipelineError,
                     match=r"b.tfrecord: record 7 has input_ids of length 48, expected 32"):
    take(ds, 100)


def test_missing_feature_and_corrupt_file(tmp_path, vocab):
  inst = make_instances(vocab, 2, np.random.default_rng(3))
  for i in inst:
    del i["next_sentence_labels"]
  write_records(tmp_path / "nonsp.tfrecord", inst)
  with pytest.raises(pi.InputPipelineError, match="no feature 'next_sentence_labels'"):
    dataset(str(tmp_path / "nonsp.tfrecord"), vocab)
  (tmp_path / "junk.tfrecord").write_bytes(b"this is not a tfrecord file at all")
  with pytest.raises(pi.InputPipelineError, match=r"junk.tfrecord: cannot be read as TFRecords"):
    dataset(str(tmp_path / "junk.tfrecord"), vocab)
  (tmp_path / "empty.tfrecord").write_bytes(b"")
  with pytest.raises(pi.InputPipelineError, match="hold no records"):
    dataset(str(tmp_path / "empty.tfrecord"), vocab)


def test_gzip_compressed_records_are_named(tmp_path, vocab):
  inst = make_instances(vocab, 2, np.random.default_rng(3))
  with tf.io.TFRecordWriter(str(tmp_path / "part.tfrecord.gz"), options="GZIP") as w:
    for i in inst:
      w.write(tf.train.Example(features=tf.train.Features(feature={
          k: int_feature(v) for k, v in i.items()})).SerializeToString())
  with pytest.raises(pi.InputPipelineError, match=r"part.tfrecord.gz: is gzip-compressed .* "
                     r"gunzip it"):
    dataset(str(tmp_path / "part.tfrecord.gz"), vocab)


def test_bad_arguments(data, vocab):
  with pytest.raises(pi.InputPipelineError, match="max_predictions_per_seq=40 > seq_length=32"):
    dataset(data[0] + "/*", vocab, max_predictions_per_seq=40)
  with pytest.raises(pi.InputPipelineError, match="process_index=2, process_count=2"):
    dataset(data[0] + "/*", vocab, process_index=2, process_count=2)
  with pytest.raises(pi.InputPipelineError, match="start_batch=-1"):
    dataset(data[0] + "/*", vocab, start_batch=-1)


def test_a_glob_of_a_list_that_matches_nothing_is_refused(data, vocab):
  # Issue 49 item 7: one glob of a comma-separated list that matched no file was dropped
  # silently (a typo in the second glob trained on the first alone), and so was 'en=B' when
  # config.train_sources was written 'ko=A,en=B' (one source ko whose second glob is 'en=B').
  folder = data[0]
  good = f"{folder}/part-*"
  for bad, hint in ((f"{folder}/prat-*", ""),
                    (f"en={folder}/part-*", " (a glob holds '=': config.train_sources separates "
                     "sources with ';' and one source's globs with ',', e.g. "
                     "'ko=data/ko/*;en=data/en/*')"),
                    ("~/records/part-*", " (~ is not expanded here: write the home directory's "
                     "full path)")):
    pattern = f"{good},{bad}"
    with pytest.raises(pi.InputPipelineError) as e:
      pi.expand_file_pattern(pattern, what="config.train_input_files")
    n = len(pi.expand_file_pattern(good))
    assert str(e.value) == (f"config.train_input_files={pattern!r}: {bad!r} matches no file "
                            f"(the other pattern(s) match {n}){hint}; fix that glob or drop it.")
  with pytest.raises(pi.InputPipelineError, match=r"no file matches \(~ is not expanded"):
    pi.expand_file_pattern("~/records/part-*")
