"""Token classification (NER) from CoNLL column files: CoNLL-2003 and custom tag sets.

File format (CoNLL-2003 `train.txt`, `valid.txt`, `test.txt`, i.e. eng.train/testa/testb): one
token per line, space-separated columns with the word first and the tag last
("EU NNP B-NP B-ORG"), a blank line between sentences, "-DOCSTART-" lines between documents.
Tags are BIO (IOB1 as in the original files or IOB2: both are scored the same way, see
metrics.get_entities). A file of single-column lines is unlabelled (words only).

Features (BERT paper 4.3): each word is WordPiece-tokenized and its tag sits on its first piece;
the other pieces, [CLS], [SEP] and padding get weight 0 in the loss and are never predicted. A
sentence longer than max_seq_length - 2 pieces is split into consecutive windows at word
borders, so every word is predicted exactly once (instead of truncating, which would lose
gold entities from the score).

A tokenizer.json (ModernBERT's byte-level BPE, RoBERTa's kind) encodes the sentence whole, its
words joined by single spaces, and gives each piece to its word by character offsets
(`_sentence_pieces`): alone, a word gets other ids than mid-sentence ("rejects" is 're' 'j' 'ect'
's' alone, 'Ġre' 'j' 'ect' 's' after a space), and the model was pre-trained on sentences.
"""

import dataclasses
import os

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.tasks import common
from data_pipelines.tasks.common import TaskDataError

CONLL03_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")


@dataclasses.dataclass(frozen=True)
class TaggingTask:
  name: str
  labels: tuple
  files: dict  # split -> file name under data_dir
  eval_splits: tuple = ("dev",)
  tag_column: int = -1  # CoNLL-2003: word POS chunk NER
  type: str = "tagging"  # the task type (bert_jax/tasks/tagging.py)
  metrics: tuple = ("precision", "recall", "f1")

  @property
  def num_labels(self):
    return len(self.labels)


TASKS = {
    "conll03": TaggingTask("conll03", CONLL03_LABELS,
                           {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}),
}


def custom_task(name, labels, train_file="train.txt", dev_file="dev.txt", test_file="",
                tag_column=-1):
  """A tagging task with your own BIO tag set, in CoNLL column files."""
  labels = tuple(labels)
  if "O" not in labels:
    raise TaskDataError(f"tagging task {name}: labels {list(labels)} lack 'O'.")
  files = {"train": train_file, "dev": dev_file}
  if test_file:
    files["test"] = test_file
  return TaggingTask(name, labels, files, tag_column=tag_column)


@dataclasses.dataclass
class Sentence:
  words: list
  tags: object  # list of tag strings, or None (unlabelled)
  line: int  # first line in the file, for messages
  path: str = ""  # the file, for messages


def read_conll(path, labels, tag_column=-1):
  """Sentences of a CoNLL column file; unknown tags are a one-line error with file and line."""
  text = common.read_text(path)
  sentences, words, tags, first = [], [], [], 0
  labelled = None
  for n, line in enumerate(text.splitlines(), start=1):
    fields = line.split()
    if not fields or fields[0] == "-DOCSTART-":
      if words:
        sentences.append(Sentence(words, tags if labelled else None, first, path))
      words, tags = [], []
      continue
    has_tag = len(fields) > 1
    if labelled is None:
      labelled = has_tag
    elif has_tag != labelled:
      raise TaskDataError(f"{path}:{n}: {len(fields)} column(s) where earlier lines have "
                          f"{'a tag' if labelled else 'only the word'}; every token line needs "
                          "the same layout (word ... tag).")
    if not words:
      first = n
    words.append(fields[0])
    if has_tag:
      try:
        tag = fields[tag_column]
      except IndexError:
        raise TaskDataError(f"{path}:{n}: no column {tag_column} for the tag; found "
                            f"{len(fields)} columns.") from None
      if tag not in labels:
        raise TaskDataError(f"{path}:{n}: tag {tag!r} is not in the label set {list(labels)}; "
                            "fix the line or the task's labels.")
      tags.append(tag)
  if words:
    sentences.append(Sentence(words, tags if labelled else None, first, path))
  if not sentences:
    raise TaskDataError(f"{path}: no sentences (only blank or -DOCSTART- lines).")
  return sentences


def read_examples(task, data_dir, split):
  if split not in task.files:
    raise TaskDataError(f"{task.name}: no split {split!r}; splits are {sorted(task.files)}.")
  return read_conll(os.path.join(data_dir, task.files[split]), task.labels, task.tag_column)


def convert_examples(task, sentences, tokenizer, max_seq_length):
  """Windows of word pieces with a tag on each word's first piece; returns (features, stats).

  features: input_ids, input_mask, segment_ids, label_ids [n, seq] int32, label_weights
  [n, seq] float32 (1.0 on first pieces, also for unlabelled data, where they mark the
  positions to predict), sentence_index and word_start [n] int32 (window n holds the words
  word_start, word_start+1, ... of its sentence, one per weighted position, in order).
  """
  vocab = tokenizer.vocab
  room = max_seq_length - 2  # [CLS] ... [SEP]
  if hasattr(tokenizer, "encode_word_spans"):  # a tokenizer.json: sentences encoded whole
    word_pieces = _sentence_pieces(sentences, tokenizer)
  else:  # WordPiece / SentencePiece: a word's pieces do not depend on its neighbours
    distinct = {}
    for s in sentences:
      for w in s.words:
        distinct.setdefault(w, len(distinct))
    pieces = tokenizer.encode(list(distinct)) if distinct else []
    word_pieces = [[pieces[distinct[w]] for w in s.words] for s in sentences]
  label_index = {l: i for i, l in enumerate(task.labels)}
  rows = {k: [] for k in ("input_ids", "label_ids", "label_weights", "sentence_index",
                          "word_start", "length")}
  stats = {"sentences": len(sentences), "sentences_split": 0, "words_truncated": 0,
           "words_without_pieces": 0}

  def emit(sentence_index, word_start, ids, labels, weights):
    rows["input_ids"].append([vocab.cls_id] + ids + [vocab.sep_id])
    rows["label_ids"].append([0] + labels + [0])
    rows["label_weights"].append([0.0] + weights + [0.0])
    rows["sentence_index"].append(sentence_index)
    rows["word_start"].append(word_start)

  for si, s in enumerate(sentences):
    ids, labels, weights, word_start, windows = [], [], [], 0, 0
    for wi in range(len(s.words)):
      p = list(word_pieces[si][wi])
      if not p:  # e.g. a lone control character: keep the word predictable
        p = [vocab.unk_id]
        stats["words_without_pieces"] += 1
      if len(p) > room:
        p = p[:room]
        stats["words_truncated"] += 1
      if len(ids) + len(p) > room:
        emit(si, word_start, ids, labels, weights)
        windows += 1
        ids, labels, weights, word_start = [], [], [], wi
      tag = label_index[s.tags[wi]] if s.tags is not None else 0
      ids += p
      labels += [tag] + [0] * (len(p) - 1)
      weights += [1.0] + [0.0] * (len(p) - 1)
    emit(si, word_start, ids, labels, weights)
    stats["sentences_split"] += windows > 0

  n = len(rows["input_ids"])
  input_ids = np.full((n, max_seq_length), vocab.pad_id, np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  label_ids = np.zeros((n, max_seq_length), np.int32)
  label_weights = np.zeros((n, max_seq_length), np.float32)
  for i, (ids, labs, wts) in enumerate(zip(rows["input_ids"], rows["label_ids"],
                                           rows["label_weights"])):
    input_ids[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = 1
    label_ids[i, :len(ids)] = labs
    label_weights[i, :len(ids)] = wts
  features = dict(input_ids=input_ids, input_mask=input_mask,
                  segment_ids=np.zeros_like(input_ids), label_ids=label_ids,
                  label_weights=label_weights,
                  sentence_index=np.asarray(rows["sentence_index"], np.int32),
                  word_start=np.asarray(rows["word_start"], np.int32))
  stats["features"] = n
  return features, stats


def _sentence_pieces(sentences, tokenizer):
  """Per sentence, per word, its piece ids: the sentence encoded whole (a tokenizer.json).

  The words are joined by single spaces, so the ids are transformers' for that text
  (PreTrainedTokenizerFast(...)(" ".join(words)), tests/bert_jax/tasks/ner_bpe_test.py). Not its
  is_split_into_words: that pre-tokenizes each word alone, and a byte-level BPE without a prefix
  space (ModernBERT's) then loses every word's 'Ġ' ('re' for 'Ġre' in the test's 405-id BPE).
  Each piece goes to the word its characters fall in; a piece of spaces only (a lone 'Ġ' before
  a byte the BPE never merged with a space: " German" is 'Ġ' 'G' 'er' 'm' 'an' there) goes to
  the word after it, as transformers' word_ids() puts it, and is that word's first piece.
  A piece across a space, or pieces out of word order, cannot carry one word's tag: a one-line
  error naming the sentence, the tokenizer file and the fix, before any compute.
  """
  out = []
  encoded = tokenizer.encode_word_spans([s.words for s in sentences])
  for s, (ids, first, last) in zip(sentences, encoded):
    owner = list(first)
    following = len(s.words) - 1  # a piece of spaces at the end (none from one-space joins)
    for k in reversed(range(len(ids))):
      if first[k] != last[k]:
        _unaligned(s, tokenizer, ids[k], f"of the words {s.words[first[k]]!r} and "
                                         f"{s.words[last[k]]!r}")
      if owner[k] < 0:
        owner[k] = following
      elif k + 1 < len(ids) and owner[k] > owner[k + 1]:
        _unaligned(s, tokenizer, ids[k], f"of {s.words[owner[k]]!r} before the pieces of "
                                         f"{s.words[owner[k + 1]]!r}")
      following = owner[k]
    words = [[] for _ in s.words]
    for i, w in zip(ids, owner):
      words[w].append(i)
    out.append(words)
  return out


def _unaligned(sentence, tokenizer, piece_id, what):
  raise TaskDataError(
      f"{sentence.path}:{sentence.line}: the tokenizer {tokenizer.vocab.path} makes a piece "
      f"{tokenizer.id_to_token([piece_id])[0]!r} {what}; NER tags each word's first piece, so "
      "no piece may cross a space: use a tokenizer.json whose pre_tokenizer splits at spaces "
      "(ByteLevel with use_regex, Metaspace, WhitespaceSplit), e.g. one learned by "
      "`python -m data_pipelines.build_vocab --output=tokenizer.json`.")


def predictions_to_tags(task, sentences, features, predicted_ids):
  """Per-sentence tag lists from [n, seq] predicted label ids at the weighted positions."""
  predicted_ids = np.asarray(predicted_ids)
  out = [[None] * len(s.words) for s in sentences]
  for f in range(len(features["input_ids"])):
    positions = np.flatnonzero(features["label_weights"][f] > 0)
    si, start = int(features["sentence_index"][f]), int(features["word_start"][f])
    for k, pos in enumerate(positions):
      out[si][start + k] = task.labels[int(predicted_ids[f, pos])]
  missing = sum(t is None for tags in out for t in tags)
  if missing:
    raise ValueError(f"{task.name}: {missing} words got no prediction; features and sentences "
                     "do not match.")
  return out


def write_predictions(path, sentences, predicted_tags):
  """CoNLL output: 'word gold predicted' per line (conlleval's input) or 'word predicted'."""
  lines = []
  for s, tags in zip(sentences, predicted_tags):
    for i, (w, t) in enumerate(zip(s.words, tags)):
      lines.append(f"{w} {s.tags[i]} {t}" if s.tags is not None else f"{w} {t}")
    lines.append("")
  files_lib.write_atomic(path, "\n".join(lines) + "\n")
  return path
