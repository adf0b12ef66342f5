"""A training stream mixed from named sources (languages, domains) in shares set on purpose.

  --config.train_sources='ko=data/ko/train-*;en=data/en/train-*'   NAME=GLOB[,GLOB] ; ...
  --config.source_weights='ko=0.7,en=0.3'   explicit shares (normalised), or
  --config.source_tau=0.3                   shares proportional to records^tau (XLM-R 0.3, mBERT
                                            0.7; 1.0 = proportional to size, the default)

Each source is a set of record files from its own create_pretraining_data run; all were made with
the run's vocabulary and sequence length (each source's dataset_info.json is checked, as a single
pattern's is). The stream keeps pretrain_input's guarantees, row by row:
  * logical shard j (of L, fixed for the run, L <= the files of the smallest source) reads
    files[j::L] of EVERY source: source i's rows in shard j are pretrain_input's row stream of
    those files (its own keys, from (seed, the source's name, j): adding a source changes no
    other source's rows), repeated epoch after epoch: a source that runs out starts a new epoch
    in a new order (the summary's epoch count says how often that happened);
  * row r of shard j comes from the source drawn for it: block r // 1024 of shard j's draws is
    tf.random.stateless_categorical over log(shares), keyed by (seed, j, block): a function of
    the seed, the shard and the row only, so the global batch is the same for every host count;
  * resuming at row n (step x rows a shard) counts each source's draws among rows [0, n) (a pass
    over n / 1024 blocks of draws, no data read) and starts each source's row stream there.
Every row carries `source_ids` (its source's index), which input_source strips and tallies (the
real tokens and instances each source gave) before the batch reaches the step.
"""

import dataclasses
import math
import zlib

from bert_jax_core import errors

BLOCK = 1024   # rows of a shard drawn at once (the resume count's unit)


class MixtureError(errors.UserError):
  """A mixture the run cannot use: a source without files, bad weights or tau, a resume with
  another mixture."""


@dataclasses.dataclass(frozen=True)
class Source:
  name: str
  pattern: str
  files: tuple = ()
  records: int = 0
  share: float = 0.0


def parse_sources(spec):
  """'NAME=GLOB[,GLOB];NAME=GLOB' -> [(name, pattern)] in the order given (one-line errors)."""
  out = []
  for part in (p.strip() for p in spec.split(";")):
    if not part:
      continue
    name, eq, pattern = part.partition("=")
    name, pattern = name.strip(), pattern.strip()
    if not eq or not name or not pattern:
      raise MixtureError(f"config.train_sources: {part!r} is not NAME=GLOB; expected e.g. "
                         "'ko=data/ko/train-*;en=data/en/train-*' (sources separated by ';').")
    if any(name == n for n, _ in out):
      raise MixtureError(f"config.train_sources: source {name!r} is named twice; give each "
                         "source its own name.")
    out.append((name, pattern))
  if not out:
    raise MixtureError(f"config.train_sources={spec!r} names no source; expected "
                       "'NAME=GLOB;NAME=GLOB'.")
  return out


def parse_weights(spec, names):
  """'NAME=W,NAME=W' -> {name: weight}: every source named once, weights >= 0, not all 0."""
  weights = {}
  for part in (p.strip() for p in spec.split(",")):
    if not part:
      continue
    name, eq, value = part.partition("=")
    name = name.strip()
    try:
      w = float(value)
    except ValueError:
      w = None
    if not eq or w is None or not math.isfinite(w):
      raise MixtureError(f"config.source_weights: {part!r} is not NAME=NUMBER; expected e.g. "
                         "'ko=0.7,en=0.3'.")
    if name not in names:
      raise MixtureError(f"config.source_weights names {name!r}, which is not a source of "
                         f"config.train_sources ({', '.join(names)}).")
    if w < 0:
      raise MixtureError(f"config.source_weights: {name}={w:g}; a weight is >= 0 (0 leaves the "
                         "source out).")
    if name in weights:   # the last one won silently (issue 49 item 7)
      raise MixtureError(f"config.source_weights names {name} twice ({name}={weights[name]:g}, "
                         f"{name}={w:g}); give each source one weight.")
    weights[name] = w
  missing = [n for n in names if n not in weights]
  if missing:
    raise MixtureError(f"config.source_weights gives no weight for {', '.join(missing)}; name "
                       "every source of config.train_sources (0 leaves one out).")
  if not any(weights.values()):
    raise MixtureError("config.source_weights: every weight is 0; at least one source must be "
                       "sampled.")
  return weights


def check_tau(tau):
  if not 0 < tau <= 1:
    raise MixtureError(f"config.source_tau={tau!r}: expected 0 < tau <= 1 (shares ~ records^tau: "
                       "1 proportional to size, XLM-R 0.3, mBERT 0.7).")


def shares(records, weights=None, tau=1.0):
  """{name: share} summing to 1: the weights normalised, else records^tau normalised."""
  raw = dict(weights) if weights else {n: float(c) ** tau for n, c in records.items()}
  total = sum(raw.values())
  return {n: w / total for n, w in raw.items()}


def resolve(config, expand, count):
  """The run's sources with their files, record counts and shares (all checks before compute).

  expand(pattern, what) -> sorted non-empty files (pretrain_input's globbing, which errors on no
  match); count(files) -> records."""
  tau = float(config.get("source_tau", 1.0))
  check_tau(tau)
  named = parse_sources(config.train_sources)
  weight_spec = config.get("source_weights", "")
  weights = parse_weights(weight_spec, [n for n, _ in named]) if weight_spec else None
  if weights and tau != 1.0:
    raise MixtureError(f"config.source_weights and config.source_tau={tau:g} both set the shares; "
                       "give one (weights, or tau for shares ~ records^tau).")
  sources = []
  for name, pattern in named:
    files = tuple(expand(pattern, f"train_sources {name}"))
    sources.append(Source(name, pattern, files, int(count(list(files)))))
  empty = [s.name for s in sources if s.records == 0 and (not weights or weights[s.name] > 0)]
  if empty:
    raise MixtureError(f"config.train_sources: source {empty[0]} holds no records; remake it or "
                       "drop it from the mixture.")
  share = shares({s.name: s.records for s in sources}, weights, tau)
  return [dataclasses.replace(s, share=share[s.name]) for s in sources]


def layout_entry(sources, tau, weighted):
  """What the checkpoint stores of the mixture (resuming with another one is refused)."""
  return dict(names=[s.name for s in sources], num_files=[len(s.files) for s in sources],
              shares=[round(s.share, 9) for s in sources],
              sampling="weights" if weighted else f"records^{tau:g}")


def planned_line(sources, sampling):
  """Start-up: each source's planned share of the rows, its size, and what happens at its end."""
  parts = [f"{s.name} {100 * s.share:.1f}% ({s.records:,} records, {len(s.files)} file(s))"
           for s in sources]
  return (f"mixture ({sampling}): {', '.join(parts)}; a source that runs out repeats (a new "
          "epoch in a new order)")


def source_seed(seed, name):
  """The seed of one source's row streams: from the run's seed and the source's name only."""
  return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62)


def _draw_key(tf, seed, shard, phase=None):
  # (seed, shard) folded with "mix": apart from pretrain_input's keys of the same (seed, shard).
  key = tf.random.experimental.stateless_fold_in(tf.constant([int(seed), int(shard)], tf.int64),
                                                 0x6D6978)
  # Phase k of a schedule (phases.py): its own draws, counted from the phase's first row.
  return key if phase is None else tf.random.experimental.stateless_fold_in(key, int(phase) + 1)


def _block_draws(tf, logits, key, block):
  """[BLOCK] source indices of block `block` of a shard's rows."""
  # int64 always: fold_in of a Python int (the resume count's) and of the counter's int64 differ.
  seed = tf.random.experimental.stateless_fold_in(key, tf.cast(block, tf.int64))
  return tf.cast(tf.random.stateless_categorical(logits[None], BLOCK, seed)[0], tf.int64)


def starts(tf, shares_list, seed, shard, start_row, phase=None):
  """[per source] rows of each source among rows [0, start_row) of shard `shard` (of phase
  `phase`'s rows, counted from its first: phases.py)."""
  logits = tf.math.log(tf.constant(shares_list, tf.float32))
  key = _draw_key(tf, seed, shard, phase)
  k = len(shares_list)
  full, rest = divmod(int(start_row), BLOCK)

  @tf.autograph.experimental.do_not_convert
  def count(b):
    return tf.math.bincount(_block_draws(tf, logits, key, b), minlength=k, maxlength=k,
                            dtype=tf.int64)

  @tf.autograph.experimental.do_not_convert
  def add(a, x):
    return a + x

  # A tf.data pass, not a Python loop over blocks: 30,000 blocks (30.7M rows of a shard, a
  # phase's draws counted at start-up) took 153 s eagerly and 4.8-12.7 s so, the same counts (2-core
  # box at load 14, 2026-11-27).
  counts = tf.data.Dataset.range(full).map(count, num_parallel_calls=tf.data.AUTOTUNE,
                                           deterministic=True).reduce(tf.zeros([k], tf.int64), add)
  if rest:
    counts += tf.math.bincount(_block_draws(tf, logits, key, full)[:rest], minlength=k,
                               maxlength=k, dtype=tf.int64)
  return [int(c) for c in counts.numpy()]


def choices(tf, shares_list, seed, shard, start_row, phase=None):
  """The dataset of source indices of rows start_row, start_row + 1, ... of shard `shard`."""
  logits = tf.math.log(tf.constant(shares_list, tf.float32))
  key = _draw_key(tf, seed, shard, phase)
  first, skip = divmod(int(start_row), BLOCK)
  ds = tf.data.Dataset.counter(first).map(lambda b: _block_draws(tf, logits, key, b)).unbatch()
  return ds.skip(skip) if skip else ds


def make_dataset(sources, *, batch_size, seq_length, max_predictions_per_seq, vocab, seed,
                 process_index, process_count, num_logical_shards, start_batch=0,
                 masked_lm_prob=0.15, whole_word_masking=False, shuffle_buffer=10000,
                 pack=False, max_instances_per_pack=0, pack_chunk_size=1024,
                 masking_scheme="token", span_boundaries=False, mask_replace_prob=0.8,
                 random_replace_prob=0.1, num_parallel_calls=None, phases=None):
  """This host's batches of the mixed stream (pretrain_input.make_pretrain_dataset's contract,
  plus `source_ids` [batch] int32). sources: [Source] with files and shares (resolve's).

  phases: a schedule (phases.py) as [StreamPhase] in this stream's batches, in order, the last
  open-ended; rows then carry `phase_ids` [batch] int32 too. None: the sources' shares and
  masked_lm_prob throughout (the stream of a run without phases, unchanged)."""
  from bert_jax_core.tf_setup import tf   # pylint: disable=g-import-not-at-top
  # pylint: disable-next=g-import-not-at-top
  from data_pipelines.input import masking
  from data_pipelines.records import packing
  from data_pipelines.input import pretrain_input
  num_parallel_calls = num_parallel_calls or tf.data.AUTOTUNE
  global_batch = batch_size * process_count
  l = num_logical_shards
  pretrain_input.check_layout(l, num_files=min(len(s.files) for s in sources),
                              global_batch=global_batch, process_count=process_count)
  shards = pretrain_input.host_shards(l, process_index, process_count)
  host_files = [f for s in sources for j in shards for f in s.files[j::l]]
  premasked, word_boundaries = pretrain_input._records_format(   # pylint: disable=protected-access
      host_files, seq_length, max_predictions_per_seq, premasked=None,
      masked_lm_prob=masked_lm_prob, whole_word_masking=whole_word_masking,
      masking_scheme=masking_scheme, replacement=(mask_replace_prob, random_replace_prob))
  if premasked and phases:
    raise MixtureError(f"{host_files[0]}: pre-masked records (google-research/bert's) fix their "
                       "masks, so config.phases cannot change the masking rate (it needs dynamic "
                       "masking, as records are read); make each source with python -m "
                       "data_pipelines.create_pretraining_data (unmasked).")
  if premasked:
    raise MixtureError(f"{host_files[0]}: pre-masked records (google-research/bert's) cannot be "
                       "mixed; make each source with python -m data_pipelines."
                       "create_pretraining_data (unmasked, masked as they are read).")
  plan = phases or [StreamPhase(None, 0, None, tuple(s.share for s in sources), masked_lm_prob)]
  cfgs = {p.mask: masking.mask_config_from_vocab(
      vocab, masked_lm_prob=p.mask, max_predictions_per_seq=max_predictions_per_seq,
      whole_word_masking=whole_word_masking, scheme=masking_scheme,
      mask_replace_prob=mask_replace_prob, random_replace_prob=random_replace_prob) for p in plan}
  # rows=1: a source's stream is read a row at a time (a row = a record unpacked, masked with a
  # key folded from its index; packed, pretrain_input's rows), so it can resume at any row.
  base = pretrain_input._Stream(   # pylint: disable=protected-access
      seq_length=seq_length, max_predictions_per_seq=max_predictions_per_seq,
      premasked=premasked, mask_cfg=cfgs[plan[0].mask], seed=seed, shuffle=True, repeat=True,
      shuffle_buffer=shuffle_buffer, num_parallel_calls=num_parallel_calls, rows=1,
      word_boundaries=word_boundaries)
  if pack:
    # Q prediction slots for the largest rate of the run: one batch shape for every phase.
    k = max_instances_per_pack or packing.default_max_instances(seq_length)
    base = dataclasses.replace(base, pack=True, max_instances=k, max_preds=(
        packing.max_predictions_per_pack(seq_length, k, max(p.mask for p in plan))),
                               chunk=pack_chunk_size)
  rows = global_batch // l
  start_row = start_batch * rows
  per_shard = []
  for j in shards:
    done = [0] * len(sources)   # each source's rows drawn by the phases before this one
    parts = []
    for ph in plan:
      lo = ph.first_batch * rows
      hi = None if ph.end_batch is None else ph.end_batch * rows
      if hi is not None and hi <= start_row:   # over before the resume point: its draws only
        done = [a + b for a, b in zip(done, starts(tf, ph.shares, seed, j, hi - lo, ph.index))]
        continue
      skip = max(0, start_row - lo)
      counts = starts(tf, ph.shares, seed, j, skip, ph.index)
      streams = []
      for i, s in enumerate(sources):
        st = dataclasses.replace(base, seed=source_seed(seed, s.name), mask_cfg=cfgs[ph.mask])
        streams.append(st.shard_batches(list(s.files[j::l]), j, done[i] + counts[i]).unbatch()
                       .map(_tag(tf, i, ph.index)))
      mixed = tf.data.Dataset.choose_from_datasets(
          streams, choices(tf, ph.shares, seed, j, skip, ph.index), stop_on_empty_dataset=True)
      if hi is not None:
        mixed = mixed.take(hi - lo - skip)
        done = [a + b for a, b in zip(done, starts(tf, ph.shares, seed, j, hi - lo, ph.index))]
      parts.append(mixed)
    mixed = parts[0]
    for part in parts[1:]:
      mixed = mixed.concatenate(part)
    if phases:
      # tf.data's noop_elimination rewrites phases concatenated behind a host's single shard
      # into a pipeline of other shapes ("Incompatible shapes at component 0: expected [4,32]
      # but got [4]" at MakeIterator; TF 2.x, the 2-host case of tests/data_pipelines/input/phases_test.py).
      options = tf.data.Options()
      options.experimental_optimization.noop_elimination = False
      mixed = mixed.with_options(options)
    per_shard.append(mixed.batch(rows, drop_remainder=True))
  return pretrain_input._host_batches(  # pylint: disable=protected-access
      per_shard, span_boundaries)


@dataclasses.dataclass(frozen=True)
class StreamPhase:
  """A phase of the schedule in this stream's batches (phases.py; input_source builds them)."""
  index: object          # the phase's number in the run's schedule (its draws' key); None: none
  first_batch: int       # the stream's batches [first_batch, end_batch) are this phase's
  end_batch: object      # None: open-ended (the last phase: the stream never ends)
  shares: tuple          # [sources]
  mask: float            # masked_lm_prob of its rows


def _tag(tf, source, phase):
  """Row -> row with its source's index (and its phase's, under a schedule)."""
  tags = dict(source_ids=tf.constant(source, tf.int32))
  if phase is not None:
    tags["phase_ids"] = tf.constant(phase, tf.int32)
  return lambda r: dict(r, **tags)
