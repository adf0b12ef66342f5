"""Learns a WordPiece vocab.txt or a SentencePiece model from raw text files.

  python -m data_pipelines.build_vocab --input_file='data/corpus/*.txt' --vocab_size=8000 \\
      --output=data/vocab.txt [--nolower_case] [--model_type=wordpiece|unigram|bpe]

WordPiece: words come from the same in-graph BERT basic tokenizer that tokenization.py uses (so
the vocab is learned on exactly the words it will see), then tensorflow_text's WordPiece learner
(`wordpiece_tokenizer_learner_lib`, the library behind `bert_vocab_from_dataset`) picks the pieces.
The file starts like BERT's: [PAD], [unused0..N-1] (--num_unused), [UNK], [CLS], [SEP], [MASK].

SentencePiece (unigram or bpe): the sentencepiece trainer with [PAD]=0 and [UNK]=1 as its pad and
unk pieces and [CLS] [SEP] [MASK] as user-defined symbols (ids 2, 3, 4); --lower_case trains with
the `nmt_nfkc_cf` rule, so the model itself case-folds.
"""

import collections
import io
import os
import re
import sys
import time

from absl import app, flags

from bert_jax import errors
from data_pipelines import tokenization
from data_pipelines.tf_setup import tf

_LINES_PER_BATCH = 4096  # lines per in-graph basic-tokenization call


class BuildVocabError(errors.UserError):
  """A bad flag or input; the message is one line that says what to fix."""


def reserved_tokens(num_unused=0):
  return (["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)]
          + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def read_corpus(input_file):
  """Comma-separated globs -> (paths, non-empty lines). Raises BuildVocabError on bad input."""
  patterns = [p for p in input_file.split(",") if p.strip()]
  if not patterns:
    raise BuildVocabError("--input_file is empty: pass a glob of text files, e.g. "
                          "--input_file='data/corpus/*.txt'.")
  paths = []
  for pattern in patterns:
    matched = sorted(tf.io.gfile.glob(pattern.strip()))
    if not matched:
      raise BuildVocabError(f"--input_file={pattern}: no file matches; check the path or "
                            "build a corpus with `python -m data_pipelines.stdlib_corpus`.")
    paths.extend(matched)
  lines = []
  for path in paths:
    with tf.io.gfile.GFile(path, "rb") as f:
      raw = f.read()
    try:
      text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      line = raw[:e.start].count(b"\n") + 1
      raise BuildVocabError(
          f"--input_file: {path} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at byte "
          f"{e.start}, line {line}); convert it, e.g. `iconv -f latin1 -t utf-8`.") from e
    lines.extend(l for l in text.split("\n") if l.strip())
  if not lines:
    raise BuildVocabError(f"--input_file={input_file}: the {len(paths)} matching file(s) hold "
                          "no text (only blank lines); a vocab needs a non-empty corpus.")
  return paths, lines


def count_words(lines, lower_case):
  """Word -> count, with the words that tokenization.basic_tokenize produces."""
  counts = collections.Counter()
  for start in range(0, len(lines), _LINES_PER_BATCH):
    batch = tf.constant([l.encode("utf-8") for l in lines[start:start + _LINES_PER_BATCH]])
    counts.update(tokenization.basic_tokenize(batch, lower_case).flat_values.numpy().tolist())
  return {w.decode("utf-8"): c for w, c in counts.items()}


def learn_wordpiece(word_counts, vocab_size, reserved, num_iterations=4):
  """tf_text's WordPiece learner with a galloping search for the count threshold.

  The library's own `learn` bisects thresholds between 10 and the top word count (~13 learner
  runs of ~1 s each on a 1 MB corpus) and never goes under a threshold of 10, which caps a 1 MB
  corpus at ~2,400 tokens. A vocab shrinks as the threshold grows, and small corpora need
  thresholds of 1-5, so trying 1, 2, 4, ... and bisecting the last gap takes 3-5 runs.
  """
  from tensorflow_text.tools.wordpiece_vocab import (  # pylint: disable=g-import-not-at-top
      wordpiece_tokenizer_learner_lib as learner)
  params = learner.Params(
      upper_thresh=None, lower_thresh=1, num_iterations=num_iterations, max_input_tokens=-1,
      max_token_length=50, max_unique_chars=1000, vocab_size=vocab_size, slack_ratio=0.05,
      include_joiner_token=True, joiner="##", reserved_tokens=reserved)
  words = learner.get_input_words(word_counts.items(), reserved, params.max_token_length)
  words = learner.filter_input_words(
      words, learner.get_allowed_chars(words, params.max_unique_chars), -1)
  if not words:
    raise BuildVocabError("the corpus has no word of at most 50 characters to learn from.")
  chars = learner.extract_char_tokens(words)
  smallest = learner.generate_final_vocabulary(
      reserved, chars, learner.ensure_all_tokens_exist(chars, {}, True, "##"))
  if len(smallest) > vocab_size:
    raise BuildVocabError(
        f"--vocab_size={vocab_size} is too small: the {len(reserved)} reserved tokens and "
        f"{len(chars)} characters (each also as ##char) need {len(smallest)}; raise --vocab_size.")
  tried = {}

  def size(thresh):
    if thresh not in tried:
      tried[thresh] = learner.learn_with_thresh(words, thresh, params)
    return len(tried[thresh])

  def good_enough(thresh):
    return vocab_size - size(thresh) <= params.slack_ratio * vocab_size

  lo, hi = 0, 1  # size(lo) > vocab_size (0 = not tried); find the smallest fitting threshold
  # Terminates: past the total count only `smallest` is left, and it fits (checked above).
  while size(hi) > vocab_size:
    lo, hi = hi, hi * 2
  while hi - lo > 1 and not good_enough(hi):
    mid = (lo + hi) // 2
    if size(mid) > vocab_size:
      lo = mid
    else:
      hi = mid
  return tried[hi]


def train_sentencepiece(lines, vocab_size, model_type, lower_case):
  """Returns the serialized model proto."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=model_type, pad_id=0, pad_piece="[PAD]", unk_id=1, unk_piece="[UNK]",
        bos_id=-1, eos_id=-1, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
        normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
        character_coverage=0.9995, num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    # "INTERNAL: src/trainer_interface.cc(744) [...] Vocabulary size too high (40000). Please
    # set it to a value <= 7356." -> keep the sentence after the source location.
    msg = re.sub(r"^.*?\) \[.*?\] ", "", str(e).strip().splitlines()[-1])
    raise BuildVocabError(f"--vocab_size={vocab_size} with --model_type={model_type}: "
                          f"sentencepiece refused ({msg}); change --vocab_size.") from e
  return model.getvalue()


def write_atomic(path, data):
  """Writes to PATH.tmp then renames, so a crash never leaves a file that looks complete."""
  parent = os.path.dirname(path)
  if parent:
    tf.io.gfile.makedirs(parent)
  tmp = path + ".tmp"
  with tf.io.gfile.GFile(tmp, "wb") as f:
    f.write(data)
  tf.io.gfile.rename(tmp, path, overwrite=True)


def build(input_file, vocab_size, output, lower_case=True, model_type="wordpiece",
          num_unused=0):
  """Learns and writes the vocabulary; returns (number of tokens, number of input files)."""
  if model_type not in ("wordpiece", "unigram", "bpe"):
    raise BuildVocabError(f"--model_type={model_type}: expected wordpiece, unigram or bpe.")
  if not output:
    raise BuildVocabError("--output is empty: pass the vocab.txt or .model path to write.")
  reserved = reserved_tokens(num_unused if model_type == "wordpiece" else 0)
  if vocab_size <= len(reserved):
    raise BuildVocabError(f"--vocab_size={vocab_size} is too small: the {len(reserved)} "
                          "special tokens alone fill it; use thousands (BERT uses 30522).")
  paths, lines = read_corpus(input_file)
  if model_type == "wordpiece":
    vocab = learn_wordpiece(count_words(lines, lower_case), vocab_size, reserved)
    write_atomic(output, ("\n".join(vocab) + "\n").encode("utf-8"))
    return len(vocab), len(paths)
  proto = train_sentencepiece(lines, vocab_size, model_type, lower_case)
  write_atomic(output, proto)
  return vocab_size, len(paths)


FLAGS = flags.FLAGS


def define_flags(flag_values=flags.FLAGS):
  """CLI flags; defined only when run as a program, so importing this module defines none."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string("input_file", None, "Glob(s) of UTF-8 text files, comma-separated.", **fv)
  flags.DEFINE_integer("vocab_size", 30522, "Largest vocabulary size (WordPiece may stop short "
                       "when the corpus has fewer useful pieces).", **fv)
  flags.DEFINE_string("output", None, "vocab.txt (wordpiece) or .model (unigram/bpe) to write.",
                      **fv)
  flags.DEFINE_bool("lower_case", True, "Lower-case and strip accents (BERT uncased); "
                    "--nolower_case for a cased vocab.", **fv)
  flags.DEFINE_enum("model_type", "wordpiece", ["wordpiece", "unigram", "bpe"],
                    "WordPiece vocab.txt, or a SentencePiece unigram/BPE model.", **fv)
  flags.DEFINE_integer("num_unused", 0, "WordPiece only: [unused0..N-1] tokens after [PAD], "
                       "free slots for tokens added at fine-tuning time (BERT has 994).", **fv)


def main(argv):
  del argv
  start = time.time()
  try:
    size, num_files = build(FLAGS.input_file or "", FLAGS.vocab_size, FLAGS.output or "",
                            FLAGS.lower_case, FLAGS.model_type, FLAGS.num_unused)
  except (BuildVocabError, tf.errors.OpError) as e:
    sys.exit(f"build_vocab: error: {str(e).splitlines()[0]}")
  print(f"wrote {FLAGS.output}: {FLAGS.model_type} vocabulary of {size} tokens from "
        f"{num_files} file(s) in {time.time() - start:.1f} s")


if __name__ == "__main__":
  define_flags()
  app.run(main)
