"""tf.data pre-training input: logical shards, shuffled, resumable, masked in-graph, packed.

Reads TFRecords of tf.train.Example with int64 features `input_ids`, `input_mask`, `segment_ids`
([seq_length], padded with 0) and `next_sentence_labels` ([1]), as written by
`data_pipelines.create_pretraining_data`, and masks them on the fly (dynamic masking: a new mask
every epoch). Records written by google-research/bert's `create_pretraining_data.py`, which carry
their masks (`masked_lm_positions`, `masked_lm_ids`, `masked_lm_weights`), are used as they are.
Records made with `--word_boundaries=jieba` add `word_continues` ([seq_length]: jieba word
boundaries for whole-word masking of Chinese, masking.py); they need whole_word_masking=True.

The stream is a function of the record files, the seed and the step only, whatever the host
count (1 x 8, 2 x 4 and 4 x 2 devices train on the same global batches):
  * the files are split into L logical shards, L fixed for a run (default gcd(files, global
    batch), stored in the checkpoint by the trainer): shard j reads files[j::L];
  * shard j's stream, keyed by (seed, j): epoch e takes its files in an order drawn from
    (seed, j, e) -> interleaved 16 at a time -> shuffled in a buffer seeded from the same key;
    epochs are concatenated (`repeat=True`) -> batches of B/L rows (drop_remainder, so every batch
    has the same static shape and the train step compiles once) -> batch b is parsed and masked
    with a key folded from (seed, j, b);
  * the global batch at step s is the concatenation of batch s of shards 0..L-1, and host h of P
    reads the contiguous block of shards [h*L/P, (h+1)*L/P), so each host reads 1/P of the files
    and the global row order does not depend on P. The remaining constraints: P divides L, L
    divides the global batch, L <= the number of files (one-line errors otherwise).
Since the mask of batch b depends only on b and its records, `start_batch=n` reproduces the stream
after n batches by skipping raw, unparsed records: whole epochs are skipped for free (their order is
a function of the epoch number), and at most one epoch of raw records is read and dropped. With
`repeat=True` and `start_batch > 0` the records of each shard are counted once (one pass reading
the files, no parsing) to find the epoch to start in.

With `pack=True` (data_pipelines/records/packing.py) shard j's records are cut into chunks of
`pack_chunk_size` consecutive records; chunk c is parsed, masked per instance with a key folded
from (seed, j, c) (the same 15% / 80-10-10 recipe and per-instance budget as unpacked), packed
into rows and its rows shuffled with a key from (seed, j, c); the rows of consecutive chunks form
the shard's row stream, batched B/L rows at a time. Resuming finds the chunk holding row
n * B/L from the chunks' row counts, which depend only on the instance lengths: one pass over the
shard's records consumed so far, parsing input_mask only.
"""

import concurrent.futures
import dataclasses
import math
import weakref
from typing import Iterator

from google.protobuf.message import DecodeError

from bert_jax_core import errors
from data_pipelines.records import dataset_info
from data_pipelines.input import masking
from data_pipelines.records import packing
from bert_jax_core.tf_setup import tf

SEQ_FEATURES = ("input_ids", "input_mask", "segment_ids")
MASKED_LM_FEATURES = ("masked_lm_positions", "masked_lm_ids", "masked_lm_weights")
BATCH_KEYS = SEQ_FEATURES + MASKED_LM_FEATURES + ("next_sentence_labels",)
CYCLE_LENGTH = 16  # files read at once; enough to mix documents, small enough for GCS buffers

# Datasets made here -> what `as_numpy_batches` needs to explain a parse error by file name.
_DATASET_INFO = weakref.WeakKeyDictionary()


class InputPipelineError(errors.UserError):
  """Bad pre-training input: no files, wrong record format or lengths, bad host sharding."""


def expand_file_pattern(file_pattern, what="file_pattern"):
  """Sorted, de-duplicated files matching a glob, a comma-separated list of globs, or a list.

  The one file-globbing function (local and gs://); `what` names the flag in the error.
  """
  patterns = [file_pattern] if isinstance(file_pattern, str) else list(file_pattern)
  patterns = [p.strip() for pat in patterns for p in pat.split(",") if p.strip()]
  files, unmatched = set(), []
  for p in patterns:
    if tf.io.gfile.isdir(p):  # one request a pattern (a glob is no directory)
      raise _directory_error(what, file_pattern, p)
    # An output dir also holds dataset_info.json; a pattern such as "out/*" must not read it.
    matched = [f for f in tf.io.gfile.glob(p) if not f.endswith(".json")]
    if not matched:
      unmatched.append(p)
    files.update(matched)
  files = sorted(files)
  if not files:
    raise InputPipelineError(
        f"{what}={file_pattern!r}: no file matches{_pattern_hint(patterns)}; write the records "
        "with `python -m data_pipelines.create_pretraining_data` or fix the pattern (a glob such "
        "as 'data/train-*.tfrecord', a comma-separated list, or a list of globs).")
  if unmatched:
    # One glob of a list matching nothing was dropped silently (a typo, or 'ko=A,en=B' read as
    # one source whose second glob is 'en=B': issue 49 item 7): the run trained on less data.
    raise InputPipelineError(
        f"{what}={file_pattern!r}: {unmatched[0]!r} matches no file (the other pattern(s) match "
        f"{len(files)}){_pattern_hint(unmatched)}; fix that glob or drop it.")
  return files


def _pattern_hint(patterns):
  """Why a glob may match nothing, where the pattern shows it (else '')."""
  if any("=" in p for p in patterns):
    return (" (a glob holds '=': config.train_sources separates sources with ';' and one "
            "source's globs with ',', e.g. 'ko=data/ko/*;en=data/en/*')")
  if any(p.startswith("~") for p in patterns):
    return " (~ is not expanded here: write the home directory's full path)"
  return ""


def _directory_error(what, file_pattern, directory):
  # tf.data reads a directory as a corrupt record file: a ReduceDataset error that advised
  # regenerating the records (issue 49).
  example = directory.rstrip("/") + "/part-*"
  return InputPipelineError(
      f"{what}={file_pattern!r}: {directory} is a directory; pass the record files in it, e.g. "
      f"{what}='{example}' (create_pretraining_data's shards are part-*.tfrecord).")


def drop_empty_files(files, what="file_pattern"):
  """(files that hold records, empty files). An empty TFRecord file is 0 bytes: create_pretraining
  _data writes one for a shard that got no document (a 4-line corpus: 4 of 16 shards). A logical
  shard of only empty files made the repeated stream spin forever without a batch (issue 23,
  fault 1: a hang after the "device order" line); without them every shard has records. A
  directory a glob matched (the stat says so, at no extra request) is a one-line error."""
  with concurrent.futures.ThreadPoolExecutor(16) as pool:   # gs://: one request per file
    stats = list(pool.map(tf.io.gfile.stat, files))
  for f, st in zip(files, stats):
    if st.is_directory:
      raise InputPipelineError(
          f"{what}: the pattern matches the directory {f}; pass a glob of the record files "
          "only, e.g. 'DIR/part-*' (create_pretraining_data's shards are part-*.tfrecord).")
  sizes = [st.length for st in stats]
  kept = [f for f, n in zip(files, sizes) if n > 0]
  if not kept:
    raise InputPipelineError(f"{files[0]} and the other {len(files) - 1} file(s) hold no records "
                             "(0 bytes); regenerate the data or fix the pattern.")
  return kept, [f for f, n in zip(files, sizes) if n == 0]


def empty_files_note(empty, total, what):
  return (f"note: {what}: skipping {len(empty)} empty file(s) of {total} (0 bytes, no records: "
          f"create_pretraining_data had nothing for those shards), e.g. {empty[0]}")


def _fix_length(name):
  if name in MASKED_LM_FEATURES:
    return "--max_predictions_per_seq / config.max_predictions_per_seq"
  return "--max_seq_length / config.seq_length"


def _check_record(path, index, raw, seq_length, max_predictions_per_seq):
  """Checks one serialized record; returns its feature map (pre-masked records, from
  google-research/bert, hold masked_lm_positions; jieba records word_continues)."""
  try:
    feats = tf.train.Example.FromString(raw).features.feature
  except DecodeError as e:  # not a serialized tf.train.Example
    raise InputPipelineError(f"{path}: record {index} is not a tf.train.Example ({e}); expected "
                             "TFRecords from create_pretraining_data.") from None
  premasked = "masked_lm_positions" in feats
  names = SEQ_FEATURES + (MASKED_LM_FEATURES if premasked else ()) + ("next_sentence_labels",)
  names += ("word_continues",) if "word_continues" in feats else ()
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
  return feats


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
        raise _unreadable(f, e) from None
  # "!" + record marks a present record; a bare "?" an empty file.
  return [(f, r[1:] if r[:1] == b"!" else None) for f, r in zip(files, raws)]


def _unreadable(path, error):
  """The one-line error for a file TFRecordDataset cannot read; names gzip, the usual cause."""
  try:
    with tf.io.gfile.GFile(path, "rb") as f:
      gzipped = f.read(2) == b"\x1f\x8b"
  except tf.errors.OpError:
    gzipped = False
  if gzipped:
    return InputPipelineError(f"{path}: is gzip-compressed (it starts with gzip's 1f 8b); the "
                              "pipeline reads uncompressed TFRecords: gunzip it (or regenerate it "
                              "without compression).")
  return InputPipelineError(f"{path}: cannot be read as TFRecords "
                            f"({error.message.splitlines()[0]}); regenerate it or remove it from "
                            "the pattern.")


def inspect_files(files, seq_length, max_predictions_per_seq):
  """Checks the first record of every file; returns (pre-masked, carries word_continues)."""
  kinds, boundaries = {}, {}
  for f, raw in _first_records(files):
    if raw is not None:
      feats = _check_record(f, 0, raw, seq_length, max_predictions_per_seq)
      kinds[f] = "masked_lm_positions" in feats
      boundaries[f] = "word_continues" in feats
  if not kinds:
    raise InputPipelineError(f"{files[0]} and the other {len(files) - 1} file(s) of this host hold "
                             "no records; regenerate the data or fix the pattern.")
  if len(set(kinds.values())) > 1:
    masked = [f for f, m in kinds.items() if m][0]
    plain = [f for f, m in kinds.items() if not m][0]
    raise InputPipelineError(f"{masked} holds pre-masked records but {plain} does not; read the "
                             "two formats with separate patterns.")
  if len(set(boundaries.values())) > 1:
    with_wb = [f for f, b in boundaries.items() if b][0]
    without = [f for f, b in boundaries.items() if not b][0]
    raise InputPipelineError(
        f"{with_wb} carries jieba word boundaries (word_continues) but {without} does not; "
        "make all records with the same create_pretraining_data --word_boundaries.")
  return next(iter(kinds.values())), next(iter(boundaries.values()))


def count_records(files):
  """Number of records in `files`: from their dataset_info.json when it lists every file at its
  current size, else by reading them once, without parsing (google-research/bert's records)."""
  known = dataset_info.known_count(files)
  if known is not None:
    return known
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


def _parse_spec(seq_length, max_predictions_per_seq, premasked, word_boundaries=False):
  spec = {k: tf.io.FixedLenFeature([seq_length], tf.int64) for k in SEQ_FEATURES}
  if word_boundaries:
    spec["word_continues"] = tf.io.FixedLenFeature([seq_length], tf.int64)
  spec["next_sentence_labels"] = tf.io.FixedLenFeature([1], tf.int64)
  if premasked:
    for k in ("masked_lm_positions", "masked_lm_ids"):
      spec[k] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.int64)
    spec["masked_lm_weights"] = tf.io.FixedLenFeature([max_predictions_per_seq], tf.float32)
  return spec


def num_logical_shards_for(num_files, global_batch, requested=0):
  """L: `requested` if > 0, else gcd(files, global batch) (every shard has a file and B/L rows)."""
  if requested and requested > 0:
    return int(requested)
  return math.gcd(int(num_files), int(global_batch))


def check_layout(num_logical_shards, *, num_files, global_batch, process_count, what="config"):
  """One-line errors for a logical-shard layout that the host count or batch cannot use."""
  l = num_logical_shards
  if l > num_files and what == "from the checkpoint":
    # Not "set num_logical_shards <= N": the resumed stream must keep the checkpoint's L, so that
    # advice was refused by the next run (issue 39).
    raise InputPipelineError(
        f"the checkpoint's data stream has num_logical_shards={l} but the pattern matches "
        f"{num_files} file(s) now; resume with the checkpoint's record files, pass "
        "--config.restart_data_stream=True to start a new stream of these files from the "
        "resumed step, or use a new --workdir.")
  if l > num_files:
    raise InputPipelineError(
        f"num_logical_shards={l} but the pattern matches {num_files} file(s); every logical shard "
        f"reads its own files: set --config.num_logical_shards <= {num_files} or write more "
        "shards (create_pretraining_data --num_shards).")
  if global_batch % l:
    raise InputPipelineError(
        f"global batch {global_batch} is not divisible by num_logical_shards={l} ({what}); each "
        f"logical shard feeds batch/L rows: use a batch that is a multiple of {l}.")
  if l % process_count:
    raise InputPipelineError(
        f"num_logical_shards={l} ({what}) is not divisible by the {process_count} hosts; each "
        f"host reads whole logical shards: run on a host count dividing {l} (or start a new "
        "run with --config.num_logical_shards set to a multiple of the host count).")


def stream_layout(*, num_files, global_batch, process_count, num_logical_shards=0, pack=False,
                  max_instances_per_pack=0, pack_chunk_size=packing.DEFAULT_CHUNK_SIZE,
                  seq_length=128, stored=None):
  """The settings that shape the data stream, to store in (and check against) a checkpoint.

  stored: the layout a checkpoint was written with, or None for a fresh run. An unset
  num_logical_shards (0) takes the stored one, so a run resumed on another host count continues
  the same stream; anything else that differs is a one-line error naming both sides.
  """
  if stored and not num_logical_shards:
    num_logical_shards = stored["num_logical_shards"]
  layout = dict(
      num_logical_shards=num_logical_shards_for(num_files, global_batch, num_logical_shards),
      global_batch=int(global_batch), pack=bool(pack),
      max_instances_per_pack=(int(max_instances_per_pack or
                                  packing.default_max_instances(seq_length)) if pack else 0),
      pack_chunk_size=int(pack_chunk_size) if pack else 0)
  if stored:
    diff = {k: (stored.get(k), v) for k, v in layout.items() if stored.get(k) != v}
    if diff:
      raise InputPipelineError(
          "the checkpoint's data stream differs from this run's (checkpoint vs now: "
          + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in diff.items())
          + "); resuming would silently read other data: use the checkpoint's settings "
          "(--config.<field>), pass --config.restart_data_stream=True to start a new stream "
          "from the resumed step, or use a new --workdir.")
  check_layout(layout["num_logical_shards"], num_files=num_files, global_batch=global_batch,
               process_count=process_count,
               what="from the checkpoint" if stored else "config")
  return layout


def make_pretrain_dataset(file_pattern, *, batch_size, seq_length, max_predictions_per_seq, vocab,
                          masked_lm_prob=0.15, whole_word_masking=False, seed=0, process_index=0,
                          process_count=1, num_logical_shards=0, shuffle=True, repeat=True,
                          start_batch=0, shuffle_buffer=10000,
                          num_parallel_calls=tf.data.AUTOTUNE, premasked=None, pack=False,
                          max_instances_per_pack=0, pack_chunk_size=packing.DEFAULT_CHUNK_SIZE,
                          expanded=False, masking_scheme="token", span_boundaries=False,
                          mask_replace_prob=0.8, random_replace_prob=0.1):
  """Masked (and optionally packed) pre-training batches for this host; see the module docstring.

  Args:
    file_pattern: glob, comma-separated globs, or a list of globs of TFRecord files.
    batch_size: rows per batch on THIS host (global batch // process_count).
    seq_length: length of every record (the data's --max_seq_length).
    max_predictions_per_seq: P, the width of the masked_lm_* tensors of one instance.
    vocab: VocabInfo (mask id, special and continuation tables).
    masked_lm_prob, whole_word_masking: the masking recipe (ignored for pre-masked records).
    seed: the same seed and arguments give the same batches, masks included.
    process_index, process_count: this host and the number of hosts (jax.process_index/count).
    num_logical_shards: L, fixed for a run (0 = gcd(files, global batch)); the global batch is the
      same for every host count dividing L.
    shuffle, repeat: shuffle=False reads in a fixed order (evaluation); repeat=False stops after
      one pass. The trainers repeat both streams: evaluation reads the first eval_steps batches
      of an ordered, repeating stream (a small eval set is cycled).
    start_batch: resume after this many batches of the same stream.
    shuffle_buffer: records in the shuffle buffer of each logical shard (~1 KB each at seq 128).
    num_parallel_calls: parallelism of file reads and of parse+mask(+pack).
    premasked: None detects google-research/bert records (masked_lm_positions present); True or
      False insists on one format.
    pack: several instances per row (data_pipelines/records/packing.py documents the packed contract).
    max_instances_per_pack: K (0 = packing.default_max_instances(seq_length)).
    pack_chunk_size: instances the packer looks at together.
    masking_scheme: token (BERT), ngram (ALBERT) or span (SpanBERT); data_pipelines/input/masking.py.
    span_boundaries: add masked_lm_span_left/right [batch, P] (SpanBERT's SBO targets:
      masking.span_boundaries, computed after packing, where runs never cross instances since
      [CLS]/[SEP] are never masked).
    mask_replace_prob, random_replace_prob: what a selected token becomes ([MASK] / a random
      token; the rest unchanged): BERT's 0.8 / 0.1, NeoBERT's 1.0 / 0.0 (masking.py).
  Returns:
    tf.data.Dataset of dicts. Unpacked (BATCH_KEYS): [batch, seq] int32 input_ids/input_mask/
    segment_ids, [batch, P] int32 masked_lm_positions/masked_lm_ids, [batch, P] float32
    masked_lm_weights, [batch] int32 next_sentence_labels. Packed: packing.PACKED_KEYS. Every
    shape static.
  """
  _check_arguments(batch_size=batch_size, seq_length=seq_length,
                   max_predictions_per_seq=max_predictions_per_seq, start_batch=start_batch,
                   process_index=process_index, process_count=process_count)
  # expanded=True: file_pattern is expand_file_pattern's list already (the trainer globs once).
  all_files = list(file_pattern) if expanded else drop_empty_files(
      expand_file_pattern(file_pattern))[0]
  global_batch = batch_size * process_count
  num_shards = num_logical_shards_for(len(all_files), global_batch, num_logical_shards)
  check_layout(num_shards, num_files=len(all_files), global_batch=global_batch,
               process_count=process_count)
  shards = host_shards(num_shards, process_index, process_count)
  files = [f for j in shards for f in all_files[j::num_shards]]
  found_premasked, word_boundaries = _records_format(
      files, seq_length, max_predictions_per_seq, premasked=premasked,
      masked_lm_prob=masked_lm_prob, whole_word_masking=whole_word_masking,
      masking_scheme=masking_scheme,
      replacement=(mask_replace_prob, random_replace_prob))
  cfg = None
  if not found_premasked:
    cfg = masking.mask_config_from_vocab(
        vocab, masked_lm_prob=masked_lm_prob, max_predictions_per_seq=max_predictions_per_seq,
        whole_word_masking=whole_word_masking, scheme=masking_scheme,
        mask_replace_prob=mask_replace_prob, random_replace_prob=random_replace_prob)
  s = _Stream(seq_length=seq_length, max_predictions_per_seq=max_predictions_per_seq,
              premasked=found_premasked, mask_cfg=cfg, seed=seed, shuffle=shuffle, repeat=repeat,
              shuffle_buffer=shuffle_buffer, num_parallel_calls=num_parallel_calls,
              rows=global_batch // num_shards, word_boundaries=word_boundaries)
  if pack:
    k = max_instances_per_pack or packing.default_max_instances(seq_length)
    q = (max_predictions_per_seq * k if found_premasked else
         packing.max_predictions_per_pack(seq_length, k, masked_lm_prob))
    s = dataclasses.replace(s, pack=True, max_instances=k, max_preds=q, chunk=pack_chunk_size)
  per_shard = [s.shard_batches(all_files[j::num_shards], j, start_batch) for j in shards]
  ds = _host_batches(per_shard, span_boundaries)
  _DATASET_INFO[ds] = dict(files=files, seq_length=seq_length, premasked=found_premasked,
                           max_predictions_per_seq=max_predictions_per_seq)
  return ds


def _check_arguments(*, batch_size, seq_length, max_predictions_per_seq, start_batch,
                     process_index, process_count):
  """One-line errors for sizes and host indices no stream can have (before any file is read)."""
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
  if not 0 <= process_index < process_count:
    raise InputPipelineError(f"process_index={process_index}, process_count={process_count}: "
                             "expected 0 <= process_index < process_count (jax.process_index()).")


def _records_format(files, seq_length, max_predictions_per_seq, *, premasked, masked_lm_prob,
                    whole_word_masking, masking_scheme, replacement=(0.8, 0.1)):
  """(pre-masked, word boundaries) of this host's records, refusing flags they contradict."""
  found_premasked, word_boundaries = inspect_files(files, seq_length, max_predictions_per_seq)
  if word_boundaries and not whole_word_masking:
    # Records made for whole-word masking and trained without it would mask single Chinese
    # characters, silently not the recipe the records were made for.
    raise InputPipelineError(
        f"{files[0]}: records carry jieba word boundaries (create_pretraining_data "
        "--word_boundaries=jieba) but whole_word_masking is off; pass "
        "--config.whole_word_masking=true, or remake the records with --word_boundaries=none.")
  if premasked is not None and bool(premasked) != found_premasked:
    raise InputPipelineError(
        f"{files[0]}: records are {'pre-masked' if found_premasked else 'unmasked'} but "
        f"premasked={premasked}; pass premasked=None to detect the format.")
  ignored = [f for f, on in (("masked_lm_prob", masked_lm_prob != 0.15),
                               ("whole_word_masking", whole_word_masking),
                               ("masking", masking_scheme != "token"),
                               ("mask_replace_prob", replacement[0] != 0.8),
                               ("random_replace_prob", replacement[1] != 0.1)) if on]
  if found_premasked and ignored:
    # google-research/bert's records carry their masks: a masking flag would change nothing.
    raise InputPipelineError(
        f"{files[0]}: records are pre-masked (google-research/bert's create_pretraining_data "
        f"fixed their masks), so --config.{', --config.'.join(ignored)} would be ignored; drop "
        "it, or make unmasked records with python -m data_pipelines.create_pretraining_data.")
  return found_premasked, word_boundaries


def _host_batches(per_shard, span_boundaries):
  """This host's batches: its shards' batches side by side (+ SpanBERT's boundaries)."""
  # Host batch = its shards' rows in shard order; hosts hold consecutive shards, so the global
  # batch (hosts in process order) is the same for every host count.
  ds = tf.data.Dataset.zip(tuple(per_shard)).map(_concat_rows)
  if span_boundaries:
    ds = ds.map(_add_span_boundaries)
  ds = ds.prefetch(tf.data.AUTOTUNE)
  options = tf.data.Options()
  options.deterministic = True
  return ds.with_options(options)


@tf.autograph.experimental.do_not_convert
def _add_span_boundaries(batch):
  left, right = masking.span_boundaries(batch["masked_lm_positions"], batch["masked_lm_weights"])
  return dict(batch, masked_lm_span_left=left, masked_lm_span_right=right)


@tf.autograph.experimental.do_not_convert
def _concat_rows(*parts):
  return {k: tf.concat([p[k] for p in parts], 0) for k in parts[0]}


def host_shards(num_shards, process_index, process_count):
  """The logical shards host `process_index` reads: a contiguous block of L / process_count."""
  per_host = num_shards // process_count
  return list(range(process_index * per_host, (process_index + 1) * per_host))


@dataclasses.dataclass(frozen=True)
class _Stream:
  """How one logical shard's records become batches of `rows` rows (see the module docstring)."""
  seq_length: int
  max_predictions_per_seq: int
  premasked: bool
  mask_cfg: object
  seed: int
  shuffle: bool
  repeat: bool
  shuffle_buffer: int
  num_parallel_calls: int
  rows: int                 # rows this shard adds to every global batch (batch / L)
  word_boundaries: bool = False  # records carry word_continues (jieba), used by masking
  pack: bool = False
  max_instances: int = 0    # K
  max_preds: int = 0        # Q
  chunk: int = 0

  def keys(self, shard):
    # Three independent keys from (seed, shard): record order, masks, packed-row order.
    return tf.unstack(tf.random.experimental.stateless_split(
        tf.constant([self.seed, shard], tf.int64), num=3))

  def records(self, files, data_key, start_record):
    """Serialized records of the shard from `start_record` on (whole epochs skipped for free)."""
    first_epoch, skip = 0, start_record
    if self.repeat and start_record:
      first_epoch, skip = divmod(start_record, count_records(files))
    epochs = (tf.data.Dataset.counter(first_epoch) if self.repeat else
              tf.data.Dataset.range(first_epoch, first_epoch + 1))
    ds = epochs.flat_map(lambda e: _epoch_records(files, e, data_key, self.shuffle,
                                                  self.shuffle_buffer, self.num_parallel_calls))
    return ds.skip(skip) if skip else ds  # raw records: no parsing, no masking

  def parse_and_mask(self, serialized, key):
    """[n] serialized records -> dict of unpacked, masked [n, ...] features."""
    spec = _parse_spec(self.seq_length, self.max_predictions_per_seq, self.premasked,
                       self.word_boundaries)
    ex = tf.io.parse_example(serialized, spec)
    out = {k: tf.cast(v, tf.int32) for k, v in ex.items()}
    word_continues = out.pop("word_continues", None)  # [n, seq]; not part of the batch contract
    out["next_sentence_labels"] = out["next_sentence_labels"][:, 0]
    if self.premasked:
      out["masked_lm_weights"] = ex["masked_lm_weights"]
      return out
    (out["input_ids"], out["masked_lm_positions"], out["masked_lm_ids"],
     out["masked_lm_weights"]) = masking.mask_batch(out["input_ids"], out["input_mask"], key,
                                                    self.mask_cfg, word_continues)
    return out

  def shard_batches(self, files, shard, start_batch):
    data_key, mask_key, order_key = self.keys(shard)
    fold = tf.random.experimental.stateless_fold_in
    if not self.pack:
      # Batch b of the shard is masked with a key folded from b: resuming reproduces the masks.
      ds = self.records(files, data_key, start_batch * self.rows)
      ds = ds.batch(self.rows, drop_remainder=True).enumerate(start=start_batch)
      @tf.autograph.experimental.do_not_convert
      def parse_and_mask(i, serialized):
        return self.parse_and_mask(serialized, fold(mask_key, i))
      return ds.map(parse_and_mask, num_parallel_calls=self.num_parallel_calls,
                    deterministic=True)
    # Packed: chunk c (records [c*chunk, (c+1)*chunk) of the shard's stream) is masked and packed
    # from keys folded from c; resuming finds the chunk holding row start_batch * rows.
    chunk, skip_rows = self.find_chunk(files, data_key, start_batch * self.rows)
    ds = self.records(files, data_key, chunk * self.chunk).batch(self.chunk).enumerate(chunk)

    @tf.autograph.experimental.do_not_convert
    def pack(c, serialized):
      order_seed = tf.random.stateless_uniform([], seed=fold(order_key, c), minval=None,
                                               maxval=None, dtype=tf.int64)
      return packing.pack_chunk(
          self.parse_and_mask(serialized, fold(mask_key, c)), order_seed,
          seq_length=self.seq_length, max_instances=self.max_instances, max_preds=self.max_preds,
          count_preds=self.premasked)

    ds = ds.map(pack, num_parallel_calls=self.num_parallel_calls, deterministic=True)
    ds = ds.unbatch()
    if skip_rows:
      ds = ds.skip(skip_rows)
    return ds.batch(self.rows, drop_remainder=True)

  def find_chunk(self, files, data_key, start_row):
    """(chunk, rows to skip in it) for packed row `start_row` of the shard's stream.

    Row counts of chunks come from the instances' lengths alone (and the prediction counts of
    pre-masked records), so this reads the shard's records from the start of the stream and
    parses only input_mask: about one read of the data consumed so far by this shard.
    """
    if start_row == 0:
      return 0, 0
    spec = {"input_mask": tf.io.FixedLenFeature([self.seq_length], tf.int64)}
    if self.premasked:
      spec["masked_lm_weights"] = tf.io.FixedLenFeature([self.max_predictions_per_seq],
                                                        tf.float32)

    @tf.autograph.experimental.do_not_convert
    def rows_of(serialized):
      ex = tf.io.parse_example(serialized, spec)
      lengths = tf.reduce_sum(ex["input_mask"], 1)
      preds = (tf.reduce_sum(tf.cast(ex["masked_lm_weights"] > 0, tf.int64), 1)
               if self.premasked else tf.zeros_like(lengths))
      return packing.chunk_num_rows(lengths, preds, seq_length=self.seq_length,
                                    max_instances=self.max_instances, max_preds=self.max_preds,
                                    count_preds=self.premasked)

    counts = self.records(files, data_key, 0).batch(self.chunk).map(
        rows_of, num_parallel_calls=self.num_parallel_calls, deterministic=True)
    done = 0
    for c, n in enumerate(counts.as_numpy_iterator()):
      if done + n > start_row:
        return c, start_row - done
      done += int(n)
    return c + 1, 0  # past the end of a finite stream: nothing left


def find_bad_record(files, seq_length, max_predictions_per_seq, premasked):
  """Scans `files` for the first record that does not parse; raises InputPipelineError naming it."""
  for f in files:
    try:
      for i, raw in enumerate(tf.data.TFRecordDataset(f).as_numpy_iterator()):
        feats = _check_record(f, i, raw, seq_length, max_predictions_per_seq)
        if ("masked_lm_positions" in feats) != premasked:
          raise InputPipelineError(f"{f}: record {i} is {'' if premasked else 'pre-'}masked unlike "
                                   "the first record; do not mix the two formats in one pattern.")
    except tf.errors.OpError as e:
      raise _unreadable(f, e) from None


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
