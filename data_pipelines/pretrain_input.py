"""tf.data pre-training input: sharded per host, shuffled, resumable, masked in-graph.

Reads TFRecords of tf.train.Example with int64 features `input_ids`, `input_mask`, `segment_ids`
([seq_length], padded with 0) and `next_sentence_labels` ([1]), as written by
`data_pipelines.create_pretraining_data`, and masks them on the fly (dynamic masking: a new mask
every epoch). Records written by google-research/bert's `create_pretraining_data.py`, which carry
their masks (`masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`), are used as they are.

The stream of one host, for a seed:
  epoch e: this host's files (files[process_index::process_count]) in an order drawn from
           (seed, process_index, e) -> interleaved 16 at a time -> shuffled in a buffer seeded
           from the same key; epochs are concatenated (`repeat=True`) -> batches of `batch_size`
           (drop_remainder, so every batch has the same static shape and the train step compiles
           once) -> batch b is parsed and masked with a key folded from (seed, process_index, b).
Since the mask of batch b depends only on b and its records, `start_batch=n` reproduces the stream
after n batches by skipping raw, unparsed records: whole epochs are skipped for free (their order is
a function of the epoch number), and at most one epoch of raw records is read and dropped. With
`repeat=True` and `start_batch > 0` the records of this host are counted once (one pass reading the
files, no parsing) to find the epoch to start in.
"""

import weakref
from typing import Iterator

from bert_jax import errors
from data_pipelines import masking
from data_pipelines.tf_setup import tf

SEQ_FEATURES = ("input_ids", "input_mask", "segment_ids")
MASKED_LM_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
BATCH_KEYS = SEQ_FEATURES + MASKED_LM_FEATURES + ("next_sentence_labels",)
CYCLE_LENGTH = 16  # files read at once; enough to mix documents, small enough for GCS buffers

# Datasets made here -> what `as_numpy_batches` needs to explain a parse error by file name.
_DATASET_INFO = weakref.WeakKeyDictionary()


class InputPipelineError(errors.UserError):
  """Bad pre-training input: no files, wrong record format or lengths, bad host sharding."""


def expand_file_pattern(file_pattern):
  """Sorted, de-duplicated files matching a glob, a comma-separated list of globs, or a list."""
  patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
  patterns = [p.strip() for pat in patterns for p in pat.split(",") if p.strip()]
  files = set()
  for p in patterns:
    files.update(tf.io.gfile.glob(p))
  # An output dir also holds dataset_info.json; a pattern such as "out/*" must not read it.
  files = sorted(f for f in files if not f.endswith(".json"))
  if not files:
    raise InputPipelineError(
        f"file_pattern={file_pattern!r}: no file matches; write the records with "
        "`python -m data_pipelines.create_pretraining_data` or fix the pattern (a glob such as "
        "'data/train-*.tfrecord', a comma-separated list, or a list of globs).")
  return files


def host_files(files, process_index, process_count, file_pattern=""):
  """The disjoint subset of `files` that host `process_index` reads (round robin)."""
  if not 0 <= process_index < process_count:
    raise InputPipelineError(f"process_index={process_index}, process_count={process_count}: "
                             "expected 0 <= process_index < process_count (jax.process_index()).")
  if len(files) < process_count:
    raise InputPipelineError(
        f"file_pattern={file_pattern!r}: {len(files)} file(s) for {process_count} hosts; each host "
        "reads its own files, so write at least one shard per host (create_pretraining_data "
        f"--num_output_shards >= {process_count}, ideally a multiple of {process_count}).")
  return files[process_index::process_count]


def _fix_length(name):
  if name in MASKED_LM_FEATURES:
    return "--max_predictions_per_seq / config.max_predictions_per_seq"
  return "--max_seq_length / config.seq_length"


def _check_record(path, index, raw, seq_length, max_predictions_per_seq):
  """Checks one serialized record; returns True if it carries masks (google-research/bert)."""
  try:
    feats = tf.train.Example.FromString(raw).features.feature
  except Exception as e:  # protobuf's DecodeError
    raise InputPipelineError(f"{path}: record {index} is not a tf.train.Example ({e}); expected "
                             "TFRecords from create_pretraining_data.") from None
  premasked = "masked_lm_positions" in feats
  names = SEQ_FEATURES + (MASKED_LM_FEATURES if premasked else ()) + ("next_sentence_labels",)
  for name in names:
    if name not in feats:
      raise InputPipelineError(
          f"{path}: record {index} has no feature '{name}' (found {sorted(feats)}); expected "
          f"{', '.join(names)} as written by create_pretraining_data.")
    want = (1 if name == "next_sentence_labels" else
            max_predictions_per_seq if name in MASKED_LM_FEATURES else seq_length)
    kind = "float_list" if name == "masked_lm_weights" else "int64_list"
    found = len(getattr(feats[name], kind).value)
    if found != want:
      raise InputPipelineError(
          f"{path}: record {index} has {name} of length {found}, expected {want}; set "
          f"{_fix_length(name)} to {found} to match the data, or regenerate the data for {want}.")
  return premasked


def _first_records(files):
  """[(file, first serialized record or None if the file is empty)], read in parallel."""
  def first(f):
    return tf.data.TFRecordDataset(f).take(1).reduce(tf.constant(b"?"), lambda _, r: "!" + r)
  ds = tf.data.Dataset.from_tensor_slices(files).map(
      first, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
  try:
    raws = list(ds.as_numpy_iterator())
  except tf.errors.OpError:
    raws = []
    for f in files:  # slow path, only to name the unreadable file
      try:
        raws.append(first(f).numpy())
      except tf.errors.OpError as e:
        raise InputPipelineError(f"{f}: cannot be read as TFRecords ({e.message.splitlines()[0]}); "
                                 "regenerate it or remove it from the pattern.") from None
  # "!" + record marks a present record; a bare "?" an empty file.
  return [(f, r[1:] if r[:1] == b"!" else None) for f, r in zip(files, raws)]


def inspect_files(files, seq_length, max_predictions_per_seq):
  """Checks the first record of every file; returns whether the records are pre-masked."""
  kinds = {}
  for f, raw in _first_records(files):
    if raw is not None:
      kinds[f] = _check_record(f, 0, raw, seq_length, max_predictions_per_seq)
  if not kinds:
    raise InputPipelineError(f"{files[0]} and the other {len(files) - 1} file(s) of this host hold "
                             "no records; regenerate the data or fix the pattern.")
  if len(set(kinds.values())) > 1:
    masked = [f for f, m in kinds.items() if m][0]
    plain = [f for f, m in kinds.items() if not m][0]
    raise InputPipelineError(f"{masked} holds pre-masked records but {plain} does not; read the "
                             "two formats with separate patterns.")
  return next(iter(kinds.values()))


def count_records(files):
  """Number of records in `files` (reads them once, without parsing)."""
  def count(f):
    return tf.data.TFRecordDataset(f).batch(4096).reduce(
        tf.constant(0, tf.int64), lambda n, b: n + tf.size(b, out_type=tf.int64))
  ds = tf.data.Dataset.from_tensor_slices(files).map(count, num_parallel_calls=tf.data.AUTOTUNE)
  return int(ds.reduce(tf.constant(0, tf.int64), lambda a, b: a + b))


def _epoch_records(files, epoch, data_key, shuffle, shuffle_buffer, num_parallel_calls):
  """The serialized records of one epoch, in an order that depends only on (data_key, epoch)."""
  files = tf.constant(files)
  if shuffle:
    file_key, buffer_key = tf.unstack(tf.random.experimental.stateless_split(
        tf.random.experimental.stateless_fold_in(data_key, epoch), num=2))
    files = tf.gather(files, tf.argsort(tf.random.stateless_uniform(files.shape, seed=file_key)))
  ds = tf.data.Dataset.from_tensor_slices(files).interleave(
      tf.data.TFRecordDataset, cycle_length=min(CYCLE_LENGTH, int(files.shape[0])), block_length=1,
      num_parallel_calls=num_parallel_calls, deterministic=True)
  if shuffle:
    seed = tf.random.stateless_uniform([], seed=buffer_key, minval=None, maxval=None,
                                       dtype=tf.int64)
    # A fixed seed per epoch: the order of epoch e is the same on every run and every resume.
    ds = ds.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=False)
  return ds


def _parse_spec(seq_length, max_predictions_per_seq, premasked):
  spec = {k: tf.io.FixedLenFeature([seq_length], tf.int64) for k in SEQ_FEATURES}
  spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
  if premasked:
    for k in ("masked_lm_positions", "masked_lm_ids"):
      spec[k] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32)
  return spec


def make_pretrain_dataset(file_pattern, *, batch_size, seq_length, max_predictions_per_seq, vocab,
                          masked_lm_prob=0.15, whole_word_masking=False, seed=0, process_index=0,
                          process_count=1, shuffle=True, repeat=True, start_batch=0,
                          shuffle_buffer=10000, num_parallel_calls=tf.data.AUTOTUNE,
                          premasked=None):
  """Masked pre-training batches for this host; see the module docstring for the stream.

  Args:
    file_pattern: glob, comma-separated globs, or a list of globs of TFRecord files.
    batch_size: sequences per batch on THIS host (global batch // process_count).
    seq_length: length of every record (the data's --max_seq_length).
    max_predictions_per_seq: P, the width of the masked_lm_* tensors.
    vocab: VocabInfo (mask id, special and continuation tables).
    masked_lm_prob, whole_word_masking: the masking recipe (ignored for pre-masked records).
    seed: the same seed and arguments give the same batches, masks included.
    process_index, process_count: this host and the number of hosts (jax.process_index/count).
    shuffle, repeat: False/False for a single ordered pass (evaluation).
    start_batch: resume after this many batches of the same stream.
    shuffle_buffer: records in the shuffle buffer (~1 KB each at seq 128).
    num_parallel_calls: parallelism of file reads and of parse+mask.
    premasked: None detects google-research/bert records (masked_lm_positions present); True or
      False insists on one format.
  Returns:
    tf.data.Dataset of dicts (BATCH_KEYS): [batch, seq] int32 input_ids/input_mask/segment_ids,
    [batch, P] int32 masked_lm_positions/masked_lm_ids, [batch, P] float32 masked_lm_weights,
    [batch] int32 next_sentence_labels; every shape static.
  """
  for name, value in (("batch_size", batch_size), ("seq_length", seq_length),
                      ("max_predictions_per_seq", max_predictions_per_seq)):
    if int(value) < 1:
      raise InputPipelineError(f"{name}={value}: expected a positive integer.")
  if max_predictions_per_seq > seq_length:
    raise InputPipelineError(f"max_predictions_per_seq={max_predictions_per_seq} > seq_length="
                             f"{seq_length}: lower --max_predictions_per_seq (20 for seq 128, "
                             "80 for 512).")
  if start_batch < 0:
    raise InputPipelineError(f"start_batch={start_batch}: expected >= 0 (the step to resume at).")
  files = host_files(expand_file_pattern(file_pattern), process_index, process_count,
                     file_pattern)
  found_premasked = inspect_files(files, seq_length, max_predictions_per_seq)
  if premasked is not None and bool(premasked) != found_premasked:
    raise InputPipelineError(
        f"{files[0]}: records are {'pre-masked' if found_premasked else 'unmasked'} but "
        f"premasked={premasked}; pass premasked=None to detect the format.")
  cfg = None
  if not found_premasked:
    cfg = masking.mask_config_from_vocab(
        vocab, masked_lm_prob=masked_lm_prob, max_predictions_per_seq=max_predictions_per_seq,
        whole_word_masking=whole_word_masking)

  # Two independent keys from (seed, host): one orders the records, one draws the masks.
  data_key, mask_key = tf.unstack(tf.random.experimental.stateless_split(
      tf.constant([seed, process_index], tf.int64), num=2))

  start_record = start_batch * batch_size
  first_epoch, skip = 0, start_record
  if repeat and start_record:
    first_epoch, skip = divmod(start_record, count_records(files))
  epochs = (tf.data.Dataset.counter(first_epoch) if repeat else
            tf.data.Dataset.range(first_epoch, first_epoch + 1))
  ds = epochs.flat_map(lambda e: _epoch_records(files, e, data_key, shuffle, shuffle_buffer,
                                                num_parallel_calls))
  if skip:
    ds = ds.skip(skip)  # raw records: no parsing, no masking
  ds = ds.batch(batch_size, drop_remainder=True).enumerate(start=start_batch)
  spec = _parse_spec(seq_length, max_predictions_per_seq, found_premasked)

  def parse_and_mask(index, serialized):  # serialized: [batch] string
    ex = tf.io.parse_example(serialized, spec)
    out = {k: tf.cast(v, tf.int32) for k, v in ex.items()}
    out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    if found_premasked:
      out["masked_lm_weights"] = ex["masked_lm_weights"]
      return out
    key = tf.random.experimental.stateless_fold_in(mask_key, index)
    (out["input_ids"], out["masked_lm_positions"], out["masked_lm_ids"],
     out["masked_lm_weights"]) = masking.mask_batch(out["input_ids"], out["input_mask"], key, cfg)
    return out

  ds = ds.map(parse_and_mask, num_parallel_calls=num_parallel_calls, deterministic=True)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.deterministic = True
  ds = ds.with_options(options)
  _DATASET_INFO[ds] = dict(files=files, seq_length=seq_length, premasked=found_premasked,
                           max_predictions_per_seq=max_predictions_per_seq)
  return ds


def find_bad_record(files, seq_length, max_predictions_per_seq, premasked):
  """Scans `files` for the first record that does not parse; raises InputPipelineError naming it."""
  for f in files:
    try:
      for i, raw in enumerate(tf.data.TFRecordDataset(f).as_numpy_iterator()):
        if _check_record(f, i, raw, seq_length, max_predictions_per_seq) != premasked:
          raise InputPipelineError(f"{f}: record {i} is {'' if premasked else 'pre-'}masked unlike "
                                   "the first record; do not mix the two formats in one pattern.")
    except tf.errors.OpError as e:
      raise InputPipelineError(f"{f}: cannot be read as TFRecords ({e.message.splitlines()[0]}); "
                               "regenerate it or remove it from the pattern.") from None


def as_numpy_batches(ds) -> Iterator[dict]:
  """Yields the batches of `ds` as dicts of numpy arrays (dtypes of the batch contract).

  A record that fails to parse mid-stream (e.g. one file of another --max_seq_length) is reported
  as one InputPipelineError naming the file, found by re-scanning this host's files.
  """
  it = ds.as_numpy_iterator()
  while True:
    try:
      batch = next(it)
    except StopIteration:
      return
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as e:
      # A record that does not parse or a corrupt file: find and name it (slow, error path only).
      info = _DATASET_INFO.get(ds)
      if info is not None:
        find_bad_record(**info)
      raise InputPipelineError("pre-training input failed: "
                               f"{e.message.strip().splitlines()[0]}") from None
    yield batch
