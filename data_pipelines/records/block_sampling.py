"""Block NSP sampling (`--nsp_sampling=block`): the fallback for corpora larger than memory.

Each source (input file or TFDS part) is read by one worker in blocks of `--document_pool_size`
documents; a block's NSP pairs draw their random next from the block, and the block's instances
(all dupes) are shuffled together (see create_pretraining_data's module docstring for the memory
arithmetic). Sources seed their own random streams, so the output is byte-identical whatever
--num_workers is. Within a block, `instances.create_instances_from_document` draws its random
numbers in google-research/bert's order.
"""

import array
import os
import random

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.records import instances as instances_lib
from data_pipelines.records import records
from data_pipelines.corpus import text_sources
from bert_jax_core.tf_setup import tf

_COPY_CHUNK = 16 << 20  # bytes per read when merging part files into shards


# ----------------------------------------------------------------------------------------------
# One source -> one part file of serialized tf.train.Examples (+ its record sizes).
# ----------------------------------------------------------------------------------------------
def block_instances(documents, params, no_nsp, dupe_factor, block_rng, dupe_rngs, sop=False):
  """All dupes' instances of one block, shuffled together (pure: no I/O, explicit rngs)."""
  result = []
  if not no_nsp:
    block_rng.shuffle(documents)  # as the original shuffles documents before the dupe loop
  for dupe in range(dupe_factor):
    rng = dupe_rngs[dupe]
    if no_nsp:
      order = list(documents)
      rng.shuffle(order)  # another packing per dupe
      result.extend(instances_lib.pack_full_sentences(order, params))
    else:
      for index in range(len(documents)):
        result.extend(instances_lib.create_sop_instances(documents[index], rng, params) if sop
                      else instances_lib.create_instances_from_document(documents, index, rng,
                                                                        params))
  block_rng.shuffle(result)
  return result


def process_source(source, cfg, encode, params, part_dir, progress=lambda n: None):
  """Writes part-<index>.tfrecord and .sizes (int64 bytes per record); returns Stats."""
  stats = records.Stats()
  block_rng = random.Random(records.seed(cfg.random_seed, source.index, "block"))
  dupe_rngs = [random.Random(records.seed(cfg.random_seed, source.index, d))
               for d in range(cfg.dupe_factor)]
  base = os.path.join(part_dir, f"part-{source.index:05d}")
  sizes = array.array("q")
  pool = cfg.document_pool_size

  with tf.io.TFRecordWriter(base + ".tfrecord") as writer:
    def flush(raw_documents):
      documents = records.tokenize_documents(raw_documents, encode, stats, cfg.filters,
                                         word_boundaries=cfg.word_boundaries)
      if not documents:
        return
      for inst in block_instances(documents, params, cfg.no_nsp, cfg.dupe_factor, block_rng,
                                  dupe_rngs, sop=cfg.sop):
        record = records.serialize_instance(inst, cfg.max_seq_length,
                                            cfg.word_boundaries == "jieba")
        writer.write(record)
        sizes.append(len(record) + 16)  # TFRecord framing: u64 length, 2 x u32 masked crc32c
        stats.instances += 1
        stats.random_next += inst.is_random_next
        stats.tokens += len(inst.tokens)

    pending = []
    for document in text_sources.read_documents(source, cfg, stats, progress):
      pending.append(document)
      # Process `pool` documents once 1.5 x pool are read: the last block then holds between
      # pool/2 and 1.5 x pool documents, never a handful with too few random-next candidates.
      if len(pending) >= pool + pool // 2:
        flush(pending[:pool])
        del pending[:pool]
    flush(pending)
  with records.open_file(base + ".sizes", "wb") as f:
    f.write(sizes.tobytes())
  return stats


def _worker_process_source(source):
  w = records.worker()
  pending = [0]

  def progress(n):  # batch updates: one queue message per ~1 MB or 1000 examples
    pending[0] += n
    if pending[0] >= (1 << 20 if source.tfds_part == () else 1000):
      w["queue"].put(pending[0])
      pending[0] = 0

  stats = process_source(source, w["cfg"], w["encode"], w["params"], w["part_dir"], progress)
  w["queue"].put(pending[0])
  return stats


def _worker_merge(task):
  merge_shard(*task)


# ----------------------------------------------------------------------------------------------
# Shards: contiguous ranges of the concatenated part files, copied as bytes.
# ----------------------------------------------------------------------------------------------
def plan_shards(counts, num_shards):
  """counts[i] records in source i -> per shard a list of (source, first, end) record ranges."""
  total = sum(counts)
  starts = np.concatenate([[0], np.cumsum(counts)])
  plan = []
  for s in range(num_shards):
    lo, hi = s * total // num_shards, (s + 1) * total // num_shards
    ranges = []
    for i, n in enumerate(counts):
      a, b = max(lo, starts[i]), min(hi, starts[i] + n)
      if a < b:
        ranges.append((i, int(a - starts[i]), int(b - starts[i])))
    plan.append(ranges)
  return plan


def merge_shard(path, byte_ranges):
  """Concatenates [(part file, start byte, end byte)] into path (atomically: files_lib.atomic_path)."""
  with files_lib.atomic_path(path) as tmp, records.open_file(tmp, "wb") as out:
    for part, start, end in byte_ranges:
      with records.open_file(part, "rb") as f:
        f.seek(start)
        while start < end:
          chunk = f.read(min(_COPY_CHUNK, end - start))
          if not chunk:
            raise records.PretrainingDataError(f"{part}: ended at byte {start}, expected {end}; "
                                               "was it removed while running?")
          out.write(chunk)
          start += len(chunk)


def _byte_ranges(plan, part_dir):
  """Record ranges -> byte ranges, loading one source's sizes at a time (bounded memory)."""
  wanted = {}
  for s, ranges in enumerate(plan):
    for i, a, b in ranges:
      wanted.setdefault(i, []).append((s, a, b))
  out = [[] for _ in plan]
  for i in sorted(wanted):
    base = os.path.join(part_dir, f"part-{i:05d}")
    with records.open_file(base + ".sizes", "rb") as f:
      offsets = np.concatenate([[0], np.cumsum(np.frombuffer(f.read(), np.int64))])
    for s, a, b in wanted[i]:
      out[s].append((base + ".tfrecord", int(offsets[a]), int(offsets[b])))
  return out


def run_blocks(cfg, tok, params, sources, part_dir, names, progress):
  """Block sampling: one part file per source, then contiguous shards. Returns (stats, shards)."""
  if progress.pool is None:
    results = [process_source(s, cfg, tok.encode, params, part_dir, progress.bar.update)
               for s in sources]
  else:
    results = records.run_pool(progress.pool, _worker_process_source, sources, progress.queue,
                               progress.bar)
  progress.bar.close()
  stats = records.Stats()
  for r in results:
    stats.add(r)
  if stats.instances == 0:
    raise records.no_instance_error(cfg, stats)
  # Fewer instances than shards: one shard per instance rather than empty shards.
  num_shards = min(cfg.num_shards, stats.instances)
  plan = plan_shards([r.instances for r in results], num_shards)
  names.extend(records.shard_name(s, num_shards) for s in range(num_shards))
  tasks = [(os.path.join(cfg.output_dir, n), r)
           for n, r in zip(names, _byte_ranges(plan, part_dir))]
  if progress.pool is None:
    for task in tasks:
      merge_shard(*task)
  else:
    records.run_pool(progress.pool, _worker_merge, tasks)
  per_shard = [sum(b - a for _, a, b in ranges) for ranges in plan]
  return stats, list(zip(names, per_shard))
