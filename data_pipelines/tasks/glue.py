"""Sentence and sentence-pair classification/regression: the nine GLUE tasks and custom ones.

GLUE files are read in the layout of the GLUE download (`download_glue_data.py`): one folder
per task with train.tsv, dev.tsv, test.tsv (MNLI: dev_matched.tsv, dev_mismatched.tsv,
test_matched.tsv, test_mismatched.tsv, and the diagnostic set at ../diagnostic/diagnostic.tsv).
Columns are found by header name; CoLA's train/dev files have no header and are read by position
(sentence in column 3, label in column 1) as google-research/bert does.

Features are [CLS] a [SEP] (b [SEP]) as in BERT's paper (Fig. 4 a/b); the [CLS] vector feeds a
classifier (or a single regression output for STS-B).

Test predictions are written as the GLUE server expects: one `<Task>.tsv` per test set with
header `index\tprediction` and the label string (or the STS-B score) per row.
"""

import dataclasses
import os

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.tasks import common
from data_pipelines.tasks.common import TaskDataError


@dataclasses.dataclass(frozen=True)
class Columns:
  """Where the fields of a row are: header names (str), or positions (int) in headerless files."""
  text_a: object
  text_b: object = None
  label: object = None
  index: object = None  # the id written into submission files (row number if None)


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
  """A single-sentence or sentence-pair classification (or regression) task."""
  name: str
  labels: tuple  # label strings; () for regression
  columns: Columns  # of the labelled splits
  test_columns: Columns  # of the unlabelled test splits
  # split name -> file name relative to data_dir.
  files: dict
  eval_splits: tuple = ("dev",)
  # test split -> submission file name (GLUE server names).
  submission_files: dict = dataclasses.field(default_factory=lambda: {"test": ""})
  metrics: tuple = ("accuracy",)
  file_format: str = "tsv"  # tsv, csv or jsonl
  header: bool = True  # False: the labelled splits have no header row (CoLA)
  # TFDS: the builder name, its names for our splits, and per TFDS class id our label string.
  tfds_name: str = ""
  tfds_splits: dict = dataclasses.field(default_factory=dict)
  tfds_features: tuple = ()  # (text_a feature, text_b feature or None)
  tfds_labels: tuple = ()

  @property
  def type(self):
    """The task type (bert_jax/tasks/<type>.py) that fine-tunes this task."""
    return "regression" if self.is_regression else "classification"

  @property
  def is_regression(self):
    return not self.labels

  @property
  def is_pair(self):
    return self.columns.text_b is not None

  @property
  def num_labels(self):
    return 1 if self.is_regression else len(self.labels)


@dataclasses.dataclass(frozen=True)
class Example:
  guid: str  # "<split>-<n>" for labelled data; the file's index column for test data
  text_a: str
  text_b: object  # str or None
  label: object  # int class id, float score, or None (test)


_GLUE_FILES = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}
_TFDS_SPLITS = {"train": "train", "dev": "validation", "test": "test"}


def _glue(name, labels, text_a, text_b, label, metrics, submission, tfds_features,
          tfds_labels, index="index", **kw):
  return ClassificationTask(
      name=name, labels=labels, columns=Columns(text_a, text_b, label),
      test_columns=Columns(text_a, text_b, None, index), files=kw.pop("files", _GLUE_FILES),
      submission_files=kw.pop("submission_files", {"test": submission}), metrics=metrics,
      tfds_name=f"glue/{name}", tfds_splits=kw.pop("tfds_splits", _TFDS_SPLITS),
      tfds_features=tfds_features, tfds_labels=tfds_labels, **kw)


_BINARY = ("0", "1")
_NLI2 = ("entailment", "not_entailment")
# google-research/bert's MnliProcessor order; TFDS orders them entailment, neutral, contradiction.
_MNLI = ("contradiction", "entailment", "neutral")

TASKS = {
    "cola": dataclasses.replace(
        _glue("cola", _BINARY, "sentence", None, None, ("mcc",), "CoLA.tsv",
              ("sentence", None), _BINARY),
        columns=Columns(text_a=3, label=1), header=False),
    "sst2": _glue("sst2", _BINARY, "sentence", None, "label", ("accuracy",), "SST-2.tsv",
                  ("sentence", None), _BINARY),
    "mrpc": _glue("mrpc", _BINARY, "#1 String", "#2 String", "Quality", ("accuracy", "f1"),
                  "MRPC.tsv", ("sentence1", "sentence2"), _BINARY),
    "stsb": _glue("stsb", (), "sentence1", "sentence2", "score", ("pearson", "spearman"),
                  "STS-B.tsv", ("sentence1", "sentence2"), ()),
    "qqp": _glue("qqp", _BINARY, "question1", "question2", "is_duplicate", ("accuracy", "f1"),
                 "QQP.tsv", ("question1", "question2"), _BINARY, index="id"),
    "mnli": _glue(
        "mnli", _MNLI, "sentence1", "sentence2", "gold_label", ("accuracy",), None,
        ("premise", "hypothesis"), ("entailment", "neutral", "contradiction"),
        files={"train": "train.tsv", "dev_matched": "dev_matched.tsv",
               "dev_mismatched": "dev_mismatched.tsv", "test_matched": "test_matched.tsv",
               "test_mismatched": "test_mismatched.tsv",
               "test_ax": os.path.join("..", "diagnostic", "diagnostic.tsv")},
        eval_splits=("dev_matched", "dev_mismatched"),
        submission_files={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv",
                          "test_ax": "AX.tsv"},
        tfds_splits={"train": "train", "dev_matched": "validation_matched",
                     "dev_mismatched": "validation_mismatched", "test_matched": "test_matched",
                     "test_mismatched": "test_mismatched"}),
    "qnli": _glue("qnli", _NLI2, "question", "sentence", "label", ("accuracy",), "QNLI.tsv",
                  ("question", "sentence"), _NLI2),
    "rte": _glue("rte", _NLI2, "sentence1", "sentence2", "label", ("accuracy",), "RTE.tsv",
                 ("sentence1", "sentence2"), _NLI2),
    "wnli": _glue("wnli", _BINARY, "sentence1", "sentence2", "label", ("accuracy",), "WNLI.tsv",
                  ("sentence1", "sentence2"), _BINARY),
}


def custom_task(name, *, text_a, text_b=None, label="label", labels=None, file_format="tsv",
                train_file="train.tsv", dev_file="dev.tsv", test_file="", index=None,
                metrics=None):
  """A classification (labels given) or regression (labels=()) task from columns of your files.

  Columns are named by the header row (TSV/CSV) or by the keys of each JSON object (JSONL).
  Example: custom_task("reviews", text_a="review", label="stars", labels=("1","2","3","4","5"),
  file_format="csv", train_file="train.csv", dev_file="dev.csv").
  """
  if labels is None:
    raise TaskDataError(f"custom task {name}: pass labels=('neg', 'pos', ...) for "
                        "classification or labels=() for regression.")
  if file_format not in ("tsv", "csv", "jsonl"):
    raise TaskDataError(f"custom task {name}: file_format={file_format!r}; use tsv, csv or jsonl.")
  labels = tuple(str(l) for l in labels)
  if metrics is None:
    metrics = ("pearson", "spearman") if not labels else (
        ("accuracy", "f1") if len(labels) == 2 else ("accuracy",))
  files = {"train": train_file, "dev": dev_file}
  if test_file:
    files["test"] = test_file
  return ClassificationTask(
      name=name, labels=labels, columns=Columns(text_a, text_b, label),
      test_columns=Columns(text_a, text_b, None, index), files=files,
      submission_files={"test": f"{name}_test_predictions.tsv"} if test_file else {},
      metrics=tuple(metrics), file_format=file_format)


# ---------------------------------------------------------------------------------------------
# Reading.
# ---------------------------------------------------------------------------------------------


def read_examples(task, data_dir, split):
  """Examples of one split from the task's local files; labels are ids (or floats)."""
  if split not in task.files:
    raise TaskDataError(f"{task.name}: no split {split!r}; splits are {sorted(task.files)}.")
  path = os.path.join(data_dir, task.files[split])
  is_test = split.startswith("test")
  cols = task.test_columns if is_test else task.columns
  if task.header or is_test:
    header, rows = common.read_rows(path, task.file_format, header=True)
    if task.file_format == "jsonl":
      resolve = lambda c: c  # noqa: E731 - JSON keys are used as they are
    else:
      resolve = lambda c: None if c is None else common.column_index(path, header, c)  # noqa
  else:
    rows = common.read_rows(path, task.file_format, header=False)
    resolve = lambda c: c  # noqa: E731 - positions
  if not rows:
    raise TaskDataError(f"{path}: no examples after the header row.")
  a_col, b_col = resolve(cols.text_a), resolve(cols.text_b)
  label_col = None if is_test else resolve(cols.label)
  index_col = resolve(cols.index) if is_test else None
  examples = []
  for n, (line, row) in enumerate(rows):
    text_a = common.get_field(path, line, row, a_col)
    text_b = None if b_col is None else common.get_field(path, line, row, b_col)
    label = None
    if label_col is not None:
      label = common.parse_label(path, line, common.get_field(path, line, row, label_col),
                                 task.labels)
    if index_col is not None:
      guid = str(common.get_field(path, line, row, index_col))
    else:
      guid = f"{split}-{n}" if not is_test else str(n)
    examples.append(Example(guid, str(text_a), None if text_b is None else str(text_b), label))
  return examples


def read_tfds_examples(task, data_dir, split):
  """Examples of one split from a prepared TFDS `glue/<task>` in data_dir (no download)."""
  import tensorflow_datasets as tfds
  from bert_jax_core.tf_setup import tf  # noqa: F401 - keeps TF off the accelerators
  if not task.tfds_name:
    raise TaskDataError(f"{task.name}: no TFDS dataset for this task; read local files.")
  if split not in task.tfds_splits:
    raise TaskDataError(f"{task.name}: no TFDS split for {split!r}; splits are "
                        f"{sorted(task.tfds_splits)}.")
  try:
    ds = tfds.load(task.tfds_name, split=task.tfds_splits[split], data_dir=data_dir,
                   download=False)
  # tfds 4.9 raises DatasetNotFoundError (a ValueError) for an unknown name, ValueError for an
  # unknown config or split, AssertionError for a dataset that is not prepared (no download).
  except (AssertionError, ValueError) as e:
    raise TaskDataError(f"tfds {task.tfds_name}[{task.tfds_splits[split]}] in "
                        f"data_dir={data_dir}: cannot be loaded ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else ''}); prepare it with "
                        "`tfds build` or point data_dir at it.") from e
  feat_a, feat_b = task.tfds_features
  is_test = split.startswith("test")
  examples = []
  for n, ex in enumerate(tfds.as_numpy(ds)):
    text_a = ex[feat_a].decode("utf-8")
    text_b = ex[feat_b].decode("utf-8") if feat_b else None
    label = None
    if not is_test:
      if task.is_regression:
        label = float(ex["label"])
      else:
        tfds_id = int(ex["label"])
        if not 0 <= tfds_id < len(task.tfds_labels):
          raise TaskDataError(f"tfds {task.tfds_name}[{split}] example {n}: label {tfds_id} "
                              f"outside 0..{len(task.tfds_labels) - 1}.")
        label = task.labels.index(task.tfds_labels[tfds_id])
    guid = str(int(ex["idx"])) if is_test else f"{split}-{n}"
    examples.append(Example(guid, text_a, text_b, label))
  if not examples:
    raise TaskDataError(f"tfds {task.tfds_name}[{split}] in {data_dir}: no examples.")
  return examples


# ---------------------------------------------------------------------------------------------
# Features.
# ---------------------------------------------------------------------------------------------


def convert_examples(task, examples, tokenizer, max_seq_length):
  """Token ids for a batch of examples.

  Returns (features, num_truncated): features hold input_ids, input_mask, segment_ids
  [n, max_seq_length] int32 and label_ids [n] (int32 class ids; float32 for regression; 0 for
  unlabelled test rows). Pairs are trimmed longest-first to fit, as google-research/bert does;
  the count is returned so the caller can report it.
  """
  vocab = tokenizer.vocab
  ids_a = tokenizer.encode([e.text_a for e in examples])
  ids_b = tokenizer.encode([e.text_b or "" for e in examples]) if task.is_pair else None
  n = len(examples)
  input_ids = np.zeros((n, max_seq_length), np.int32)
  input_mask = np.zeros((n, max_seq_length), np.int32)
  segment_ids = np.zeros((n, max_seq_length), np.int32)
  label_ids = np.zeros(n, np.float32 if task.is_regression else np.int32)
  truncated = 0
  for i, ex in enumerate(examples):
    a = list(ids_a[i])
    if task.is_pair:
      b = list(ids_b[i])
      truncated += common.truncate_seq_pair(a, b, max_seq_length - 3) > 0  # [CLS] [SEP] [SEP]
    else:
      b = None
      if len(a) > max_seq_length - 2:  # [CLS] [SEP]
        a = a[:max_seq_length - 2]
        truncated += 1
    input_ids[i], input_mask[i], segment_ids[i] = common.pack(a, b, vocab, max_seq_length)
    if ex.label is not None:
      label_ids[i] = ex.label
  features = dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
                  label_ids=label_ids)
  return features, int(truncated)


# ---------------------------------------------------------------------------------------------
# Submission files.
# ---------------------------------------------------------------------------------------------


def format_predictions(task, examples, predictions):
  """GLUE submission TSV text: `index\\tprediction` per example.

  predictions: [n] class ids, or [n] floats for regression.
  """
  predictions = np.asarray(predictions)
  if len(predictions) != len(examples):
    raise ValueError(f"{task.name}: {len(predictions)} predictions for {len(examples)} examples.")
  lines = ["index\tprediction"]
  for ex, p in zip(examples, predictions):
    value = f"{float(p):.3f}" if task.is_regression else task.labels[int(p)]
    lines.append(f"{ex.guid}\t{value}")
  return "\n".join(lines) + "\n"


def write_predictions(task, split, examples, predictions, output_dir):
  """Writes the submission file of one test split; returns its path."""
  name = task.submission_files.get(split) or f"{task.name}_{split}_predictions.tsv"
  path = os.path.join(output_dir, name)
  files_lib.write_atomic(path, format_predictions(task, examples, predictions))
  return path
