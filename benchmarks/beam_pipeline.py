"""Pre-training record throughput: the Beam pipeline (DirectRunner, 1 and 2 workers) vs the local path.

  python -m benchmarks.beam_pipeline --corpus_mb=300          # the issue's size
  python -m benchmarks.beam_pipeline --corpus_mb=20 --dupe_factor=2   # a shared 2-core box

The corpus is generated: sentences of the stdlib docstring corpus (`data_pipelines/stdlib_corpus`)
dealt into documents of 1-30 sentences by a seeded rng until --corpus_mb MB of text, in
--num_files files; one WordPiece vocab (--vocab_size) is learned on the stdlib corpus. Each side
reads the same files with the same flags and writes --num_shards shards; the figure is input MB
per wall-clock second of the whole run (reading, tokenizing, pairing, writing), and per worker:
  * local block:  create_pretraining_data --nsp_sampling=block --num_workers=W
  * local corpus: create_pretraining_data --nsp_sampling=corpus --num_workers=W (reading and
                  tokenizing in W processes; pairing and writing in the main process)
  * beam:         beam_pipeline on DirectRunner --direct_running_mode=multi_processing
                  --direct_num_workers=W (the same records as local corpus, byte for byte)
Ratios are against the local block path with 1 worker measured in the same run.
"""

import os
import random
import shutil
import tempfile
import time

from absl import app, flags

from data_pipelines import beam_pipeline, build_vocab, stdlib_corpus
from data_pipelines import create_pretraining_data as cpd

FLAGS = flags.FLAGS
flags.DEFINE_float("corpus_mb", 300, "Generated corpus size in MB (UTF-8 text).")
flags.DEFINE_integer("num_files", 8, "Input files (sources): the unit of parallel reading.")
flags.DEFINE_integer("vocab_size", 8000, "WordPiece vocab learned on the stdlib corpus.")
flags.DEFINE_integer("max_seq_length", 128, "As BERT's first phase.")
flags.DEFINE_integer("dupe_factor", 2, "BERT uses 10; output work grows with it, input MB not.")
flags.DEFINE_integer("num_shards", 16, "Output shards.")
flags.DEFINE_list("workers", ["1", "2"], "Worker counts to time.")
flags.DEFINE_list("sides", ["local_block", "local_corpus", "beam"], "What to time.")
flags.DEFINE_string("work_dir", None, "Where to write corpus and records (default: a temp dir).")


def generate_corpus(out_dir, mb, num_files, seed=0):
  """Synthetic documents from stdlib docstring sentences; returns (glob, total bytes)."""
  sentences = [s for doc in stdlib_corpus.iter_documents() for s in doc]
  rng = random.Random(seed)
  os.makedirs(out_dir, exist_ok=True)
  files = [open(os.path.join(out_dir, f"part-{i:03d}.txt"), "w", encoding="utf-8")
           for i in range(num_files)]
  written, target, d = 0, int(mb * 1e6), 0
  while written < target:
    doc = "\n".join(rng.choice(sentences) for _ in range(rng.randint(1, 30))) + "\n\n"
    files[d % num_files].write(doc)
    written += len(doc.encode("utf-8"))
    d += 1
  for f in files:
    f.close()
  return os.path.join(out_dir, "*.txt"), written


def time_side(side, workers, cfg):
  shutil.rmtree(cfg.output_dir, ignore_errors=True)
  t0 = time.perf_counter()
  if side == "beam":
    summary = beam_pipeline.run(cfg, ["--runner=DirectRunner",
                                      "--direct_running_mode=multi_processing",
                                      f"--direct_num_workers={workers}"])
  else:
    mode = side.split("_")[1]
    summary = cpd.run(cpd.dataclasses.replace(cfg, nsp_sampling=mode, num_workers=workers),
                      show_progress=False)
  return time.perf_counter() - t0, summary["instances"]


def main(argv):
  del argv
  work = FLAGS.work_dir or tempfile.mkdtemp(prefix="bench_beam_")
  corpus_glob, size = generate_corpus(os.path.join(work, "corpus"), FLAGS.corpus_mb,
                                      FLAGS.num_files)
  stdlib_dir = os.path.join(work, "stdlib")
  stdlib_corpus.write_corpus(stdlib_dir, num_files=2)
  vocab = os.path.join(work, "vocab.txt")
  build_vocab.build(os.path.join(stdlib_dir, "*.txt"), FLAGS.vocab_size, vocab, lower_case=True)
  cfg = cpd.Config(input_file=corpus_glob, output_dir=os.path.join(work, "records"),
                   vocab_file=vocab, max_seq_length=FLAGS.max_seq_length,
                   dupe_factor=FLAGS.dupe_factor, num_shards=FLAGS.num_shards)
  mb = size / 1e6
  print(f"corpus: {mb:.1f} MB in {FLAGS.num_files} files; seq {FLAGS.max_seq_length}, "
        f"dupe_factor {FLAGS.dupe_factor}, {FLAGS.num_shards} shards; {os.cpu_count()} CPUs")
  rows, base = [], None
  for side in FLAGS.sides:
    for w in map(int, FLAGS.workers):
      seconds, instances = time_side(side, w, cfg)
      rate = mb / seconds
      base = base or (rate if side == "local_block" and w == 1 else None)
      rows.append((side, w, seconds, instances, rate))
      print(f"{side:13s} workers={w}: {seconds:7.1f} s, {instances:,} instances, "
            f"{rate:6.2f} MB/s, {rate / w:6.2f} MB/s per worker"
            + (f", x{rate / base:.2f} vs local_block/1" if base else ""), flush=True)
  if not FLAGS.work_dir:
    shutil.rmtree(work)


if __name__ == "__main__":
  app.run(main)
