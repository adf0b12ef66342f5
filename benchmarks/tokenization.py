"""Tokenization throughput: our in-graph WordPiece (tf.data) vs HF `tokenizers` (Rust), same text.

  python -m benchmarks.tokenization                       # stdlib corpus x5, learned 8k vocab
  python -m benchmarks.tokenization --input_file='data/corpus/*.txt' --vocab_file=data/vocab.txt

Both sides tokenize the same lines (one per corpus line) with the same vocab.txt and casing, and
the run asserts that every line gets identical ids before printing MB/s of UTF-8 input:
  * ours: tf.data.Dataset over the lines -> .batch(--batch_size) -> .map(tokenizer.tokenize,
    AUTOTUNE) -> .prefetch -> .repeat, one pass = one epoch of batches from a warm iterator,
  * HF: `tokenizers.BertWordPieceTokenizer.encode_batch` (Rust, multi-threaded) over the lines in
    chunks of --batch_size, without [CLS]/[SEP] (max_input_chars_per_word set to our 200).
Each side runs --repeats times after one warm-up pass; the best time counts.
"""

import os
import tempfile
import time

from absl import app, flags
import tokenizers

from data_pipelines import build_vocab, stdlib_corpus
from data_pipelines.tokenizers import tokenization
from bert_jax_core.tf_setup import tf

FLAGS = flags.FLAGS
flags.DEFINE_string("input_file", None, "Glob of text files; default: a fresh stdlib corpus.")
flags.DEFINE_string("vocab_file", None, "vocab.txt; default: learned from the corpus.")
flags.DEFINE_bool("do_lower_case", True, "Uncased (BERT-base-uncased style) or cased.")
flags.DEFINE_integer("vocab_size", 8000, "Size of the vocab learned when --vocab_file is unset.")
flags.DEFINE_integer("batch_size", 512, "Lines per tf.data batch / per encode_batch call.")
flags.DEFINE_integer("repeats", 3, "Timed passes per side (best counts).")
flags.DEFINE_integer("copies", 5, "Repeat the corpus lines this many times: ~5 MB keeps a timed "
                     "pass well above timer and prefetch-buffer noise.")


def run(tmp):
  """Prepares corpus and vocab under `tmp` unless given, times both sides, prints the figures."""
  pattern = FLAGS.input_file
  if not pattern:
    stdlib_corpus.write_corpus(os.path.join(tmp, "corpus"), num_files=2)
    pattern = os.path.join(tmp, "corpus", "*.txt")
  vocab_file = FLAGS.vocab_file
  if not vocab_file:
    vocab_file = os.path.join(tmp, "vocab.txt")
    build_vocab.build(pattern, FLAGS.vocab_size, vocab_file, lower_case=FLAGS.do_lower_case)
  _, lines = build_vocab.read_corpus(pattern)
  lines = lines * FLAGS.copies
  data = [l.encode("utf-8") for l in lines]
  mbytes = sum(len(b) for b in data) / 1e6
  print(f"{len(lines)} lines, {mbytes:.2f} MB, vocab {vocab_file}, "
        f"{'uncased' if FLAGS.do_lower_case else 'cased'}, {os.cpu_count()} CPUs")

  ours = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=FLAGS.do_lower_case)
  num_batches = -(-len(data) // FLAGS.batch_size)
  # One long-lived iterator, as in training: building a tf.data iterator instantiates the map
  # function's kernels (RE2 compiles, the WordPiece model), ~0.4 s once, which a timed pass
  # over a 1 MB corpus should not include.
  iterator = iter(tf.data.Dataset.from_tensor_slices(tf.constant(data))
                  .batch(FLAGS.batch_size)
                  .map(ours.tokenize, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
                  .prefetch(tf.data.AUTOTUNE).repeat())

  def run_ours():
    return [next(iterator) for _ in range(num_batches)]

  hf = tokenizers.BertWordPieceTokenizer(vocab_file, lowercase=FLAGS.do_lower_case)
  # HF's default is 100 characters; ours (google-research/bert's) is 200.
  hf_model = hf._tokenizer.model  # pylint: disable=protected-access
  hf_model.max_input_chars_per_word = tokenization.MAX_CHARS_PER_WORD

  def run_hf():
    out = []
    for start in range(0, len(lines), FLAGS.batch_size):
      out.extend(hf.encode_batch(lines[start:start + FLAGS.batch_size], add_special_tokens=False))
    return out

  def best_time(fn):
    result = fn()  # warm-up (tracing, thread pools)
    times = []
    for _ in range(FLAGS.repeats):
      start = time.perf_counter()
      fn()
      times.append(time.perf_counter() - start)
    return min(times), result

  t_ours, ours_out = best_time(run_ours)
  t_hf, hf_out = best_time(run_hf)
  ours_ids = [row for batch in ours_out for row in batch.to_list()]
  hf_ids = [e.ids for e in hf_out]
  mismatch = [i for i, (a, b) in enumerate(zip(ours_ids, hf_ids)) if a != b]
  assert len(ours_ids) == len(hf_ids) and not mismatch, (
      f"ids differ on {len(mismatch)} lines, first: {lines[mismatch[0]]!r}")
  num_tokens = sum(len(r) for r in ours_ids)
  print(f"identical ids on all {len(lines)} lines ({num_tokens} tokens)")
  print(f"ours (tf.data, in-graph):      {mbytes / t_ours:7.2f} MB/s  ({t_ours:.2f} s)")
  print(f"HF tokenizers (encode_batch):  {mbytes / t_hf:7.2f} MB/s  ({t_hf:.2f} s)")
  print(f"ratio ours/HF: {t_hf / t_ours:.2f}x")


def main(argv):
  del argv
  with tempfile.TemporaryDirectory(prefix="bench_tok_") as tmp:
    run(tmp)


if __name__ == "__main__":
  app.run(main)
