"""Whole-corpus NSP sampling: the rules shared by the local path and the Beam pipeline.

The random-next document of an NSP pair is drawn from every document of the corpus, as in the
paper and google-research/bert. Everything random is a pure function of (random_seed, where it
comes from), never of the order in which a runner meets the documents:

  document index g   documents numbered in input order: source index, then position in the
                     source, after the filters (dedup keeps the first copy in that order);
  pairs of (g, d)    `instances.plan_nsp_pairs` on document g for dupe d, rng seeded by (g, d):
                     needs only document g and the corpus size N;
  NotNext B          cut from document `pair.random_document` (`instances.random_next_tokens`):
                     here from a list in memory, in Beam through a CoGroupByKey on that index;
  truncation         coin flips from the pair's own stream, seeded by (g, d, pair index);
  no-NSP packing     dupe d puts document g into group hash(g, d) mod ceil(N / pool); a group's
                     documents, ordered by hash, are packed (`instances.pack_full_sentences`);
  shard and order    instance key = 64-bit hash of its origin; shard = key mod S; a shard is
                     its instances sorted by (key, record bytes).

So `run_local` (this module) and `beam_pipeline.py` write byte-identical shards for the same
inputs, flags and shard count, and neither depends on its number of workers.
"""

import array
import os
import random

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.corpus import filters as filters_lib
from data_pipelines.records import instances as instances_lib
from data_pipelines.records import records
from data_pipelines.corpus import text_sources
from bert_jax_core.tf_setup import tf

_TOKENIZE_BATCH = 1000  # documents per tokenizer call while reading a source


# ----------------------------------------------------------------------------------------------
# The rules (pure functions, used by both runners).
# ----------------------------------------------------------------------------------------------
def read_source(source, cfg, encode, stats, progress=lambda n: None):
  """[(digest or None, document of array('i') sentences)] of one source, in order, filtered
  (script, empty, length; dedup needs all sources and is done by the caller)."""
  out = []
  digests = [] if cfg.dedup_documents else None
  pending = []

  def flush():
    docs = records.tokenize_documents(pending, encode, stats, cfg.filters, digests,
                                  cfg.word_boundaries)
    out.extend(zip(digests if digests is not None else [None] * len(docs), docs))
    if digests is not None:
      digests.clear()
    pending.clear()

  for document in text_sources.read_documents(source, cfg, stats, progress):
    pending.append(document)
    if len(pending) >= _TOKENIZE_BATCH:
      flush()
  flush()
  return out


def num_groups(num_documents, cfg):
  """No-NSP packing groups per dupe: ~document_pool_size documents each."""
  return max(1, -(-num_documents // cfg.document_pool_size))


def packing_group(g, dupe, cfg, num_documents):
  return records.seed(cfg.random_seed, "group", g, dupe) % num_groups(num_documents, cfg)


def nsp_pairs(document, g, num_documents, cfg, params):
  """The pairs of document g for all dupes (IsNext complete, NotNext waiting for B; SOP pairs
  (--sop) are all complete: both segments come from document g)."""
  for dupe in range(cfg.dupe_factor):
    rng = random.Random(records.seed(cfg.random_seed, "document", g, dupe))
    if cfg.sop:
      yield from instances_lib.plan_sop_pairs(document, rng, params, key=(g, dupe))
    else:
      yield from instances_lib.plan_nsp_pairs(document, g, num_documents, rng, params,
                                              key=(g, dupe))


def finish_pair(pair, tokens_b, cfg, params):
  """-> (key, serialized tf.train.Example, non-padding tokens, is NotNext)."""
  rng = random.Random(records.seed(cfg.random_seed, "truncate", *pair.key))
  instance = instances_lib.finish_pair(pair, tokens_b, rng, params)
  return _record(records.seed(cfg.random_seed, "instance", *pair.key), instance, cfg)


def pack_group(members, dupe, group, cfg, params):
  """members: [(g, document)] of one packing group -> [(key, record, tokens, False)]."""
  order = sorted(members, key=lambda m: (records.seed(cfg.random_seed, "order", m[0], dupe), m[0]))
  packed = instances_lib.pack_full_sentences([doc for _, doc in order], params)
  return [_record(records.seed(cfg.random_seed, "packed", dupe, group, j), inst, cfg)
          for j, inst in enumerate(packed)]


def _record(key, instance, cfg):
  record = records.serialize_instance(instance, cfg.max_seq_length, cfg.word_boundaries == "jieba")
  return (key, record, len(instance.tokens), bool(instance.is_random_next))


def shard_of(key, num_shards):
  return key % num_shards


def sorted_records(records):
  """[(key, record bytes)] of one shard -> record bytes in their final order."""
  return [r for _, r in sorted(records)]


# ----------------------------------------------------------------------------------------------
# The local runner: every document's token ids in memory.
# ----------------------------------------------------------------------------------------------
def _worker_read_source(source):
  w = records.worker()
  stats = records.Stats()
  docs = read_source(source, w["cfg"], w["encode"], stats)
  w["queue"].put(source.size)
  return docs, stats


def _read_corpus(cfg, tok, sources, progress):
  """-> (documents in input order after all filters, Stats)."""
  if progress.pool is None:
    results = []
    for source in sources:
      stats = records.Stats()
      results.append((read_source(source, cfg, tok.encode, stats, progress.bar.update), stats))
  else:
    results = records.run_pool(progress.pool, _worker_read_source, sources, progress.queue,
                               progress.bar)
  progress.bar.close()
  stats = records.Stats()
  for _, s in results:
    stats.add(s)
  if cfg.dedup_documents:
    keep = filters_lib.first_occurrences(
        ((i, r), digest) for i, (docs, _) in enumerate(results) for r, (digest, _) in
        enumerate(docs))
    documents = [doc for i, (docs, _) in enumerate(results) for r, (_, doc) in enumerate(docs)
                 if (i, r) in keep]
    duplicates = sum(len(docs) for docs, _ in results) - len(documents)
    stats.filtered_duplicate += duplicates
    stats.documents -= duplicates
    kept = [sum(map(len, d)) for d in documents]
    stats.sentences, stats.input_tokens = sum(len(d) for d in documents), sum(kept)
  else:
    documents = [doc for docs, _ in results for _, doc in docs]
  return documents, stats


def _instances(documents, cfg, params):
  """Yields (key, record, tokens, is NotNext) for the whole corpus, in no particular order."""
  n = len(documents)
  if cfg.no_nsp:
    for dupe in range(cfg.dupe_factor):
      groups = {}
      for g in range(n):
        groups.setdefault(packing_group(g, dupe, cfg, n), []).append((g, documents[g]))
      for group in sorted(groups):
        yield from pack_group(groups[group], dupe, group, cfg, params)
    return
  for g, document in enumerate(documents):
    for pair in nsp_pairs(document, g, n, cfg, params):
      tokens_b = pair.tokens_b
      if pair.random_document >= 0:
        tokens_b = instances_lib.random_next_tokens(documents[pair.random_document], pair)
      yield finish_pair(pair, tokens_b, cfg, params)


def run_local(cfg, tok, params, sources, part_dir, names, progress):
  """Whole-corpus sampling on this machine. Returns (Stats, [(shard file, instances)]).

  Instances go to per-shard part files as they are made (with their keys and framed sizes);
  then each shard is read back, reordered by key and written: memory is the corpus's token ids
  plus one shard.
  """
  documents, stats = _read_corpus(cfg, tok, sources, progress)
  if not documents:
    raise records.no_instance_error(cfg, stats)
  num_shards = cfg.num_shards
  parts = [os.path.join(part_dir, f"shard-{s:05d}.tfrecord") for s in range(num_shards)]
  keys = [array.array("Q") for _ in range(num_shards)]
  sizes = [array.array("q") for _ in range(num_shards)]
  writers = [tf.io.TFRecordWriter(p) for p in parts]
  try:
    for key, record, tokens, random_next in _instances(documents, cfg, params):
      s = shard_of(key, num_shards)
      writers[s].write(record)
      keys[s].append(key)
      sizes[s].append(len(record) + 16)  # TFRecord framing: u64 length, 2 x u32 masked crc32c
      stats.instances += 1
      stats.random_next += random_next
      stats.tokens += tokens
  finally:
    for w in writers:
      w.close()
  if stats.instances == 0:
    raise records.no_instance_error(cfg, stats)
  names.extend(records.shard_name(s, num_shards) for s in range(num_shards))
  for s, name in enumerate(names):
    _write_sorted_shard(parts[s], keys[s], sizes[s], os.path.join(cfg.output_dir, name))
  return stats, [(n, len(k)) for n, k in zip(names, keys)]


def _write_sorted_shard(part, keys, sizes, path):
  with records.open_file(part, "rb") as f:
    data = f.read()
  offsets = np.concatenate([[0], np.cumsum(np.frombuffer(sizes, np.int64))]).tolist()
  framed = [data[offsets[i]:offsets[i + 1]] for i in range(len(keys))]
  with files_lib.atomic_path(path) as tmp, records.open_file(tmp, "wb") as out:
    # framed = u64 length, u32 crc, record, u32 crc: ties (never seen) sort by the record.
    for _, chunk in sorted(zip(keys, framed), key=lambda kf: (kf[0], kf[1][12:-4])):
      out.write(chunk)
  tf.io.gfile.remove(part)
