r"""Masked-LM input throughput on ONE CPU core: our tf.data pipeline vs HF's collator.

  .venv/bin/python -m benchmarks.input_pipeline [--seq_lengths=128,512 --batch_size=256]

Both sides mask the same token ids, BERT's recipe (15%, 80/10/10), batch 256, one after the other
in this process, which is pinned to a single core before numpy or TensorFlow start
(`os.sched_setaffinity`; OMP/MKL/OpenBLAS threads = 1). TensorFlow also gets 1 intra-op and 1
inter-op thread and tf.data a private pool of 1 thread; HF's collator is single-threaded numpy.

Rows:
  ours, TFRecord -> batch   make_pretrain_dataset on TFRecord files: read, shuffle (buffer 10000),
                            batch, parse, mask, to numpy: everything the trainer consumes.
  ours, masking only        the same masking (masking.mask_batch) on in-memory [batch, seq] arrays.
  ours, whole-word masking  the TFRecord pipeline with whole_word_masking=True (no HF peer timed:
                            HF's whole-word masking needs offset mappings from raw text).
  HF, dict features         transformers.DataCollatorForLanguageModeling(return_tensors="np") with
                            a BertTokenizerFast built from the same vocab.txt, fed the same ids
                            as [{"input_ids": [...]}, ...], the rows a tokenized `datasets.Dataset`
                            hands a DataLoader/Trainer (the issue's baseline: ~10.8k / 2.9k seq/s).
  HF, numpy rows            the same collator fed a list of [seq] int64 arrays: its fastest input
                            (np.stack, no tokenizer.pad), for a stricter comparison.
Each figure is the median of --repeats timed runs of --num_batches batches after warm-up; the
machine may be shared, so compare the ratios, which are measured side by side.
"""
import os

# One core for everything below, set before numpy/TF create their thread pools.
_CPU = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {_CPU})
for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTEROP_THREADS",
             "TF_NUM_INTRAOP_THREADS"):
  os.environ[_var] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import itertools  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402
import numpy as np  # noqa: E402

from bert_jax_core.tf_setup import tf  # noqa: E402

tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.threading.set_inter_op_parallelism_threads(1)

from data_pipelines.input import masking  # noqa: E402
from data_pipelines.input import pretrain_input  # noqa: E402
from data_pipelines.tokenizers import vocab as vocab_lib  # noqa: E402

FLAGS = flags.FLAGS
flags.DEFINE_list("seq_lengths", ["128", "512"], "Sequence lengths to measure.")
flags.DEFINE_integer("batch_size", 256, "Sequences per batch (both sides).")
flags.DEFINE_integer("num_batches", 40, "Batches per timed run.")
flags.DEFINE_integer("repeats", 3, "Timed runs per row; the median is printed.")
flags.DEFINE_float("short_seq_prob", 0.1, "Share of shorter (padded) sequences, as in BERT.")

PREDS = {128: 20, 512: 80}  # max_predictions_per_seq of the BERT recipe


def write_bert_like_vocab(path):
  """30522 tokens in bert-base-uncased's layout: [PAD], [unused0-98], [UNK] [CLS] [SEP] [MASK]
  (100-103), [unused99-993], then words and ~5.8k "##" pieces."""
  tokens = (["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
            + [f"[unused{i}]" for i in range(99, 994)])
  tokens += [f"w{i}" for i in range(30522 - len(tokens) - 5800)] + [f"##p{i}" for i in range(5800)]
  with open(path, "w") as f:
    f.write("\n".join(tokens) + "\n")
  return vocab_lib.wordpiece_info(path)


def make_ids(vocab, num, seq, rng):
  """[CLS] A [SEP] B [SEP] [PAD]..., full length except short_seq_prob of them."""
  words = np.flatnonzero(~vocab.is_special)
  ids = np.zeros([num, seq], np.int64)
  for r in range(num):
    n = seq - 3 if rng.random() >= FLAGS.short_seq_prob else int(rng.integers(2, seq - 3))
    a = int(rng.integers(1, n))
    body = rng.choice(words, n)
    ids[r, :n + 3] = [vocab.cls_id, *body[:a], vocab.sep_id, *body[a:], vocab.sep_id]
  return ids


def write_records(ids, out_dir, num_files=4):
  f = lambda v: tf.train.Feature(int64_list=tf.train.Int64List(value=v))  # noqa: E731
  writers = [tf.io.TFRecordWriter(os.path.join(out_dir, f"part-{i}.tfrecord"))
             for i in range(num_files)]
  for r, row in enumerate(ids):
    mask = (row != 0).astype(np.int64)
    feats = dict(input_ids=f(row), input_mask=f(mask), segment_ids=f(np.zeros_like(row)),
                 next_sentence_labels=f([r % 2]))
    writers[r % num_files].write(
        tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
  for w in writers:
    w.close()


def one_core(ds):
  options = tf.data.Options()
  options.threading.private_threadpool_size = 1
  options.threading.max_intra_op_parallelism = 1
  options.autotune.cpu_budget = 1
  return ds.with_options(options)


def time_rounds(iterators, num_batches, warmup=3):
  """Median seconds per `num_batches` batches of each iterator over FLAGS.repeats rounds.

  The rows take turns inside each round, so a burst of load on a shared machine hits all of them.
  """
  for it in iterators.values():
    for _ in itertools.islice(it, warmup):
      pass
  runs = {name: [] for name in iterators}
  for _ in range(FLAGS.repeats):
    for name, it in iterators.items():
      t0 = time.perf_counter()
      n = sum(1 for _ in itertools.islice(it, num_batches))
      runs[name].append(time.perf_counter() - t0)
      assert n == num_batches, f"{name}: the stream ended early"
  return {name: statistics.median(r) for name, r in runs.items()}


def hf_batches(collator, examples, batch):
  for i in itertools.count():
    start = (i * batch) % (len(examples) - batch + 1)
    yield collator(examples[start:start + batch])


def measure(seq, vocab, vocab_path, tmp):
  """Sequences / s of every row at one sequence length."""
  from transformers import BertTokenizerFast
  from transformers import DataCollatorForLanguageModeling
  batch, nb = FLAGS.batch_size, FLAGS.num_batches
  rng = np.random.default_rng(seq)
  ids = make_ids(vocab, batch * nb, seq, rng)  # one epoch = one timed run
  data_dir = os.path.join(tmp, f"seq{seq}")
  os.makedirs(data_dir)
  write_records(ids, data_dir)
  preds = PREDS.get(seq, round(seq * 0.15))
  args = dict(batch_size=batch, seq_length=seq, max_predictions_per_seq=preds, vocab=vocab)
  pattern = os.path.join(data_dir, "part-*")
  its = {}
  ds = one_core(pretrain_input.make_pretrain_dataset(pattern, **args))
  its["ours, TFRecord -> batch"] = pretrain_input.as_numpy_batches(ds)

  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=preds,
                                       whole_word_masking=False)
  ids32 = ids.astype(np.int32).reshape(nb, batch, seq)  # already batched: no per-row overhead
  mem = tf.data.Dataset.from_tensor_slices((ids32, (ids32 != 0).astype(np.int32))).repeat()
  mem = mem.enumerate().map(
      lambda i, b: masking.mask_batch(b[0], b[1], tf.stack([tf.constant(0, tf.int64), i]), cfg))
  its["ours, masking only"] = one_core(mem.prefetch(2)).as_numpy_iterator()

  ds = one_core(pretrain_input.make_pretrain_dataset(pattern, whole_word_masking=True, **args))
  its["ours, whole-word masking"] = pretrain_input.as_numpy_batches(ds)

  tok = BertTokenizerFast(vocab_file=vocab_path, do_lower_case=True)
  collator = DataCollatorForLanguageModeling(tokenizer=tok, mlm_probability=0.15,
                                             return_tensors="np")
  dicts = [{"input_ids": row.tolist()} for row in ids]
  rows = list(ids)  # [seq] int64 arrays
  for examples in (dicts, rows):
    assert collator(examples[:batch])["input_ids"].shape == (batch, seq)
  its["HF, dict features"] = hf_batches(collator, dicts, batch)
  its["HF, numpy rows"] = hf_batches(collator, rows, batch)
  return {k: batch * nb / s for k, s in time_rounds(its, nb).items()}


def main(argv):
  del argv
  print(f"pinned to CPU {_CPU} (1 core); batch {FLAGS.batch_size}, {FLAGS.num_batches} batches "
        f"x median of {FLAGS.repeats}; TF {tf.__version__}")
  with tempfile.TemporaryDirectory() as tmp:
    vocab_path = os.path.join(tmp, "vocab.txt")
    vocab = write_bert_like_vocab(vocab_path)
    results = {int(s): measure(int(s), vocab, vocab_path, tmp) for s in FLAGS.seq_lengths}
  print(f"\n{'seq':>4}  {'pipeline':<26} {'seq/s/core':>11} {'tokens/s/core':>14} "
        f"{'/ HF dict':>9} {'/ HF numpy':>10}")
  for seq, rows in results.items():
    hf_dict, hf_np = rows["HF, dict features"], rows["HF, numpy rows"]
    for name, sps in rows.items():
      print(f"{seq:>4}  {name:<26} {sps:>11,.0f} {sps * seq:>14,.0f} {sps / hf_dict:>8.1f}x "
            f"{sps / hf_np:>9.1f}x")
  print("\ntarget (issue): ours, TFRecord -> batch >= 3x the HF collator at 128 and 512")


if __name__ == "__main__":
  app.run(main)
