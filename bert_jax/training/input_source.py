"""Host-local batch iterators for the train loop: real TFRecords or a synthetic source.

The trainer asks for an iterator of this host's share of the global batch
([global_batch / process_count, ...] numpy dicts in the batch contract) starting at a position,
so a resumed run continues the same stream. "synthetic" stands in for records in unit tests and
benchmarks: random ids with the contract's shapes, a pure function of (seed, batch index, host).
"""

import itertools

import jax
import numpy as np


def synthetic_batches(*, batch_size, seq_length, max_predictions_per_seq, vocab_size, seed,
                      start_batch=0, process_index=0, process_count=1):
  """Yields this host's rows of random but valid global batches.

  Global batch i is a pure function of (seed, i), and host p gets rows
  [p * batch_size, (p + 1) * batch_size): the same global batches whatever the host count, so a
  2-process run can be compared with a 1-process run step by step.
  """
  for batch in _synthetic_global(batch_size * process_count, seq_length,
                                 max_predictions_per_seq, vocab_size, seed, start_batch):
    lo = process_index * batch_size
    yield {k: v[lo:lo + batch_size] for k, v in batch.items()}


def _synthetic_global(batch_size, seq_length, max_predictions_per_seq, vocab_size, seed, i):
  while True:
    rng = np.random.default_rng([seed, i])
    lengths = rng.integers(seq_length // 2, seq_length + 1, size=batch_size)
    pos = np.arange(seq_length)[None, :]
    input_mask = (pos < lengths[:, None]).astype(np.int32)            # [B, T]
    input_ids = rng.integers(5, vocab_size, size=(batch_size, seq_length)) * input_mask
    input_ids[:, 0] = 2                                                 # [CLS]-like
    segment_ids = ((pos >= (lengths[:, None] // 2)) * input_mask).astype(np.int32)
    n_pred = max_predictions_per_seq
    # A row of l tokens has l - 1 to predict ([CLS] is not): a shorter row than the predictions
    # (modernbert-tiny's 39 at --config.seq_length=64: rows of 32-64 tokens) pads the rest, as
    # real records do (it was numpy's "Cannot take a larger sample than population").
    picked = [np.sort(rng.choice(np.arange(1, l), size=min(n_pred, l - 1), replace=False))
              for l in lengths]
    positions = np.stack([np.pad(p, (0, n_pred - len(p))) for p in picked])   # [B, P]
    weights = np.ones((batch_size, n_pred), np.float32)
    weights[:, n_pred - n_pred // 4:] = 0.0                           # some padding predictions
    weights[np.arange(n_pred)[None, :] >= np.array([len(p) for p in picked])[:, None]] = 0.0
    positions = np.where(weights > 0, positions, 0)
    ids = np.take_along_axis(input_ids, positions, axis=1) * (weights > 0)
    yield dict(input_ids=input_ids.astype(np.int32), input_mask=input_mask,
               segment_ids=segment_ids,
               masked_lm_positions=positions.astype(np.int32),
               masked_lm_ids=ids.astype(np.int32), masked_lm_weights=weights,
               next_sentence_labels=rng.integers(0, 2, size=batch_size).astype(np.int32))
    i += 1


def make_batches(config, vocab, *, files, local_batch_size, seed, start_batch, process_index,
                 process_count, train=True, layout=None, stream_start=0):
  """Iterator of host-local numpy batches from TFRecords (or synthetic when files=='synthetic').

  files: the list from pretrain_input.expand_file_pattern (globbed once, by the caller).
  layout: `stream_layout`'s dict for the training stream (logical shards, packing); None for
  evaluation, which reads unpacked rows (metrics comparable between packed and unpacked runs).
  stream_start: the input position this stream began at (a --config.restart_data_stream's step;
  phases' boundaries are counted from it). Synthetic batches are never packed.
  """
  if files == "synthetic":
    return synthetic_batches(batch_size=local_batch_size, seq_length=config.seq_length,
                             max_predictions_per_seq=config.max_predictions_per_seq,
                             vocab_size=vocab.size, seed=seed, start_batch=start_batch,
                             process_index=process_index, process_count=process_count)
  from data_pipelines.input import pretrain_input  # TF only when real records are read
  layout = layout or {}
  if layout.get("mixture"):   # issue 42: named sources in planned shares (data_pipelines/mixture)
    from data_pipelines.input import mixture  # pylint: disable=g-import-not-at-top
    ds = mixture.make_dataset(
        sources_of(config), batch_size=local_batch_size, seq_length=config.seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq, vocab=vocab,
        masked_lm_prob=config.masked_lm_prob, whole_word_masking=config.whole_word_masking,
        seed=seed, process_index=process_index, process_count=process_count,
        start_batch=start_batch, shuffle_buffer=config.shuffle_buffer,
        num_logical_shards=layout["num_logical_shards"], pack=layout.get("pack", False),
        max_instances_per_pack=layout.get("max_instances_per_pack", 0),
        pack_chunk_size=layout.get("pack_chunk_size") or 1024,
        masking_scheme=config.get("masking", "token"),
        span_boundaries=config.get("masking", "token") == "span",
        mask_replace_prob=config.get("mask_replace_prob", 0.8),
        random_replace_prob=config.get("random_replace_prob", 0.1),
        phases=stream_phases(layout, stream_start))
    return pretrain_input.as_numpy_batches(ds)
  ds = pretrain_input.make_pretrain_dataset(
      files, batch_size=local_batch_size, seq_length=config.seq_length,
      max_predictions_per_seq=config.max_predictions_per_seq, vocab=vocab,
      masked_lm_prob=config.masked_lm_prob, whole_word_masking=config.whole_word_masking,
      seed=seed, process_index=process_index, process_count=process_count,
      shuffle=train, repeat=True, start_batch=start_batch,
      shuffle_buffer=config.shuffle_buffer, expanded=True,
      num_logical_shards=layout.get("num_logical_shards", 0), pack=layout.get("pack", False),
      max_instances_per_pack=layout.get("max_instances_per_pack", 0),
      pack_chunk_size=layout.get("pack_chunk_size") or 1024,
      masking_scheme=config.get("masking", "token"),
      span_boundaries=config.get("masking", "token") == "span",   # SpanBERT's SBO targets
      mask_replace_prob=config.get("mask_replace_prob", 0.8),    # BERT's 80/10/10 where a
      random_replace_prob=config.get("random_replace_prob", 0.1))  # config has no such field
  return pretrain_input.as_numpy_batches(ds)


def stream(config, vocab, layout, local_batch, files, seed, start, train=True, stream_start=0):
  """The trainer's stream: this host's batches of `files` from batch `start` (train: the
  resumable stream of `layout`; eval: one instance per row), behind a stall watchdog: no batch
  for input_stall_minutes is an error naming the files, never a silent hang."""
  it = make_batches(
      config, vocab, files=files, local_batch_size=local_batch, seed=seed, start_batch=start,
      process_index=jax.process_index(), process_count=jax.process_count(), train=train,
      layout=layout if train else None, stream_start=stream_start)
  if files == "synthetic":
    return it
  if train and layout and layout.get("mixture"):
    _TALLY.reset()          # this run's batches only: a process may train several runs
    it = _TALLY.strip(it)   # source_ids leave the batch here, counted per source
  from data_pipelines.input import input_watchdog  # pylint: disable=g-import-not-at-top
  return input_watchdog.stall_watchdog(
      it, files, config.get("input_stall_minutes", 10),
      what="train_input_files" if train else "eval_input_files")


def stream_layout(config, files, process_count, stored=None, global_batch=None, position=None):
  """The training stream's layout (logical shards, packing) for the checkpoint; None if synthetic.

  stored: the layout of the checkpoint being resumed (an error if this run's would differ).
  global_batch: rows of one stream batch: config.batch_size (None), or a batch-size warmup's
  unit (batch_warmup.py: each step takes several). position: step -> stream batches consumed
  by then (ramp.position; None: one a step), where each phase of config.phases ends.
  """
  if files == "synthetic":
    return None
  from data_pipelines.input import pretrain_input  # pylint: disable=g-import-not-at-top
  sources = sources_of(config)
  layout = pretrain_input.stream_layout(
      # A mixture's logical shard reads files[j::L] of every source: L <= the smallest's files.
      num_files=min(len(s.files) for s in sources) if sources else len(files),
      global_batch=global_batch or config.batch_size,
      process_count=process_count,
      num_logical_shards=config.num_logical_shards, pack=config.pack,
      max_instances_per_pack=config.max_instances_per_pack,
      pack_chunk_size=config.pack_chunk_size, seq_length=config.seq_length, stored=stored)
  if sources:
    from data_pipelines.input import mixture  # pylint: disable=g-import-not-at-top
    layout["mixture"] = mixture.layout_entry(sources, float(config.source_tau),
                                             bool(config.source_weights))
    planned = phases_of(config)
    if planned:   # each phase with the stream batch it ends at (a batch warmup: several a step)
      from data_pipelines.input import phases  # pylint: disable=g-import-not-at-top
      layout["phases"] = [dict(e, end_position=int((position or int)(p.end_step))) for e, p in
                          zip(phases.layout_entry(planned), planned)]
  if stored and stored.get("mixture") != layout.get("mixture"):
    from data_pipelines.input import mixture  # pylint: disable=g-import-not-at-top
    raise mixture.MixtureError(
        f"the checkpoint was trained on the mixture {_mixture_text(stored.get('mixture'))} but "
        f"this run asks for {_mixture_text(layout.get('mixture'))}; resuming would silently "
        "re-draw the stream: use the checkpoint's --config.train_sources/source_weights/"
        "source_tau, or a new --workdir.")
  if stored and stored.get("phases") != layout.get("phases"):
    from data_pipelines.input import mixture  # pylint: disable=g-import-not-at-top
    names = layout["mixture"]["names"]
    raise mixture.MixtureError(
        f"the checkpoint was trained on the phases {_phases_text(stored.get('phases'), names)} "
        f"but this run asks for {_phases_text(layout.get('phases'), names)}; resuming would "
        "silently re-draw the stream: use the checkpoint's --config.phases (and "
        "num_train_steps), or a new --workdir.")
  return layout


def _phases_text(entry, names):
  if not entry:
    return "none"
  from data_pipelines.input import phases  # pylint: disable=g-import-not-at-top
  return " | ".join(phases.describe(e, names) for e in entry)


def stream_phases(layout, stream_start=0):
  """The layout's phases as mixture.StreamPhase in this stream's batches (None without): a
  stream restarted at position `stream_start` begins inside the phase holding it."""
  entry = (layout or {}).get("phases")
  if not entry:
    return None
  from data_pipelines.input import mixture  # pylint: disable=g-import-not-at-top
  out, first = [], 0
  for k, e in enumerate(entry):
    end = e["end_position"] - stream_start
    if end > 0 or k == len(entry) - 1:
      out.append(mixture.StreamPhase(k, max(first, 0), None if k == len(entry) - 1 else end,
                                     tuple(e["shares"]), float(e["mask"])))
    first = end
  return out


def _mixture_text(entry):
  if not entry:
    return "none (one pool: config.train_input_files)"
  return f"{', '.join(f'{n} {s:.3f}' for n, s in zip(entry['names'], entry['shares']))} " \
         f"({entry['sampling']})"


# ----------------------------------------------------------------------------------------------
# Mixtures of named sources (issue 42; data_pipelines/input/mixture.py): resolved once per process.
# ----------------------------------------------------------------------------------------------
_SOURCES = {}


def sources_of(config):
  """The run's sources (mixture.Source: files, records, shares), or None without
  config.train_sources; globbed and counted once, checked (one-line errors) before compute."""
  spec = config.get("train_sources", "")
  if not spec:
    return None
  key = (spec, config.get("source_weights", ""), float(config.get("source_tau", 1.0)))
  if key not in _SOURCES:
    from data_pipelines.input import mixture
    from data_pipelines.input import pretrain_input  # pylint: disable=g-import-not-at-top
    if config.get("train_input_files"):
      raise mixture.MixtureError(
          f"config.train_sources and config.train_input_files={config.train_input_files!r} are "
          "both set; a mixture names all its files in train_sources: drop train_input_files.")

    def expand(pattern, what):
      files = pretrain_input.expand_file_pattern(pattern, what=f"config.{what}")
      return pretrain_input.drop_empty_files(files, f"config.{what}")[0]
    _SOURCES[key] = mixture.resolve(config, expand, pretrain_input.count_records)
  return _SOURCES[key]


def phases_of(config):
  """The run's phases (phases.Planned: steps, shares over sources_of's sources, mask), or None
  without config.phases; checked (one-line errors) before compute."""
  spec = config.get("phases", "")
  if not spec:
    return None
  from data_pipelines.input import mixture
  from data_pipelines.input import phases  # pylint: disable=g-import-not-at-top
  sources = sources_of(config)
  if not sources:
    raise mixture.MixtureError(
        "config.phases needs config.train_sources (a schedule mixes named sources; one pool: "
        "--config.train_sources='all=GLOB' instead of train_input_files).")
  planned = phases.plan(config, sources)
  phases.check_predictions(planned, int(config.seq_length),
                           int(config.max_predictions_per_seq))
  return planned


class SourceTally:
  """Rows, real tokens and instances each source gave in each phase (this process's batches,
  counted as the input hands them out: start-up's 4 read-ahead batches included, used or not)."""

  def __init__(self):
    self.reset()

  def reset(self):
    self.counts = np.zeros((0, 0, 3), np.int64)   # [phases, sources, 3]: rows, tokens, instances

  def strip(self, batches):
    for batch in batches:
      ids = batch.pop("source_ids")                                   # [rows]
      phase = batch.pop("phase_ids", np.zeros_like(ids))              # [rows]; 0 without phases
      per_row = np.stack([np.ones(len(ids)), batch["input_mask"].sum(-1),
                          (batch["nsp_weights"] > 0).sum(-1) if "nsp_weights" in batch
                          else np.ones(len(ids))], -1)                # [rows, 3]
      shape = np.maximum(self.counts.shape[:2], (int(phase.max()) + 1, int(ids.max()) + 1))
      add = np.zeros((*shape, 3), np.int64)
      np.add.at(add, (phase, ids), per_row.astype(np.int64))
      add[:self.counts.shape[0], :self.counts.shape[1]] += self.counts
      self.counts = add
      yield batch

  def _all_hosts(self, num_phases, num_sources):
    counts = np.zeros((num_phases, num_sources, 3), np.int64)
    p, k = min(num_phases, self.counts.shape[0]), min(num_sources, self.counts.shape[1])
    counts[:p, :k] = self.counts[:p, :k]
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      counts = np.asarray(multihost_utils.process_allgather(counts)).sum(0)
    return counts

  def record(self, sources, planned=None):
    """({name: rows, real_tokens, instances, epochs, planned_share}, [per phase: {steps, mask,
    sources: {name: rows, real_tokens, instances, planned_share}}] or None); every host's
    batches summed: call on every host."""
    counts = self._all_hosts(len(planned or [None]), len(sources))
    total = counts.sum(0)
    # epochs: the instances a source gave / its records (> 1: it ran out and repeated).
    per_source = {s.name: dict(rows=int(rows), real_tokens=int(tokens), instances=int(instances),
                               epochs=round(float(instances / max(s.records, 1)), 4),
                               planned_share=round(s.share, 6))
                  for s, (rows, tokens, instances) in zip(sources, total)}
    if not planned:
      return per_source, None
    # Under phases a source's planned share of the run's rows: its phases' shares by their steps.
    steps = sum(p.end_step - p.first_step for p in planned)
    for i, s in enumerate(sources):
      per_source[s.name]["planned_share"] = round(
          sum(p.shares[i] * (p.end_step - p.first_step) for p in planned) / steps, 6)
    per_phase = [dict(steps=[p.first_step, p.end_step], mask=p.mask, sampling=p.sampling,
                      sources={s.name: dict(rows=int(r), real_tokens=int(t), instances=int(i),
                                            planned_share=round(x, 6))
                               for s, (r, t, i), x in zip(sources, c, p.shares) if x > 0 or r})
                 for p, c in zip(planned, counts)]
    return per_source, per_phase


_TALLY = SourceTally()


def planned_line(config):
  """Start-up: each source's planned share, size, and what happens when it runs out; under
  config.phases, each phase's steps, shares and masking rate on lines of their own."""
  from data_pipelines.input import mixture
  from data_pipelines.input import phases  # pylint: disable=g-import-not-at-top
  sampling = "weights" if config.get("source_weights") else f"records^{config.source_tau:g}"
  planned = phases_of(config)
  if planned:
    return "\n".join(phases.startup_lines(planned, sources_of(config)))
  return mixture.planned_line(sources_of(config), sampling)


def mixture_summary(config, start_step, is_main):
  """The summary's fields of a mixture (the tally of this run's batches), {} without one. Call
  on every host (the counts are summed over hosts)."""
  sources = sources_of(config)
  if not sources:
    return {}
  record, per_phase = _TALLY.record(sources, phases_of(config))
  if not is_main:
    return {}
  return dict(sources=record, sources_since_step=int(start_step),
              **({"phases": per_phase} if per_phase else {}))


def peek(batches, n=4):
  """(the same iterator, real tokens per slot of its first n batches): batches read ahead are
  put back, so the stream is unchanged; a bad record fails here, before any compute."""
  first = list(itertools.islice(batches, n))
  real = sum(int(np.sum(b["input_mask"])) for b in first)
  slots = sum(int(np.size(b["input_mask"])) for b in first)
  return itertools.chain(first, batches), real / max(slots, 1)


def packed_widths(config, layout):
  """(K instances, Q prediction slots) of a packed row of dynamically masked records."""
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  k = int(layout.get("max_instances_per_pack") or packing.default_max_instances(config.seq_length))
  from data_pipelines.input import phases  # pylint: disable=g-import-not-at-top
  # Q for the run's largest masking rate (config.phases: every phase's batches one shape).
  return k, packing.max_predictions_per_pack(config.seq_length, k, phases.max_mask(config))


def batch_spec(config, layout):
  """{key: (shape, dtype name)} of one GLOBAL training batch as the train step receives it.

  The contract of pretrain_input.make_pretrain_dataset: unpacked rows (BATCH_KEYS, P =
  max_predictions_per_seq), or packed rows (packing.PACKED_KEYS: K instances and Q prediction
  slots per row) when layout["pack"]. For compiling the step without data (bert_jax/plan.py).
  Google's pre-masked records packed carry P * K slots instead of Q (not planned for here).
  """
  b, t = config.batch_size, config.seq_length
  spec = dict(input_ids=((b, t), "int32"), input_mask=((b, t), "int32"),
              segment_ids=((b, t), "int32"))
  if layout and layout.get("pack"):
    k, q = packed_widths(config, layout)
    spec.update(instance_ids=((b, t), "int32"), position_ids=((b, t), "int32"),
                masked_lm_positions=((b, q), "int32"), masked_lm_ids=((b, q), "int32"),
                masked_lm_weights=((b, q), "float32"), cls_positions=((b, k), "int32"),
                next_sentence_labels=((b, k), "int32"), nsp_weights=((b, k), "float32"))
  else:
    p = config.max_predictions_per_seq
    spec.update(masked_lm_positions=((b, p), "int32"), masked_lm_ids=((b, p), "int32"),
                masked_lm_weights=((b, p), "float32"), next_sentence_labels=((b,), "int32"))
  return spec
