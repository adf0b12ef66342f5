"""SWAG multiple choice (Zellers et al. 2018) from the CSV files of rowanz/swagaf.

Columns used (by header name): sent1 (the context), sent2 (the start of the next sentence),
ending0..ending3, label (train/val only). As in the BERT paper (4.4) each of the four choices
becomes one sequence [CLS] sent1 [SEP] sent2 ending_i [SEP]; the model scores each sequence's
[CLS] vector with one shared vector and a softmax over the four scores picks the ending.
Test predictions are written as a CSV with a `pred` header and one ending index per test row, in
file order (the AI2 leaderboard's one-label-per-line layout).
"""

import dataclasses
import os

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.tasks import common
from data_pipelines.tasks.common import TaskDataError


@dataclasses.dataclass(frozen=True)
class MultipleChoiceTask:
  name: str
  files: dict  # split -> CSV file under data_dir
  num_choices: int = 4
  eval_splits: tuple = ("dev",)
  context_column: str = "sent1"
  start_column: str = "sent2"
  ending_columns: tuple = ("ending0", "ending1", "ending2", "ending3")
  label_column: str = "label"
  type: str = "multiple_choice"  # the task type (bert_jax/tasks/)
  metrics: tuple = ("accuracy",)


TASKS = {
    "swag": MultipleChoiceTask("swag", {"train": "train.csv", "dev": "val.csv",
                                        "test": "test.csv"}),
}


@dataclasses.dataclass(frozen=True)
class Example:
  guid: str
  context: str
  start: str
  endings: tuple
  label: object  # int or None (test)


def read_examples(task, data_dir, split):
  if split not in task.files:
    raise TaskDataError(f"{task.name}: no split {split!r}; splits are {sorted(task.files)}.")
  path = os.path.join(data_dir, task.files[split])
  header, rows = common.read_rows(path, "csv", header=True)
  if not rows:
    raise TaskDataError(f"{path}: no examples after the header row.")
  ctx = common.column_index(path, header, task.context_column)
  start = common.column_index(path, header, task.start_column)
  ends = [common.column_index(path, header, c) for c in task.ending_columns]
  labelled = task.label_column in header
  if not labelled and not split.startswith("test"):
    raise TaskDataError(f"{path}:1: no column {task.label_column!r} in the header; the {split} "
                        f"split needs labels. Found {header}.")
  label_col = header.index(task.label_column) if labelled else None
  choices = [str(i) for i in range(task.num_choices)]
  examples = []
  for n, (line, row) in enumerate(rows):
    label = None
    if label_col is not None:
      label = common.parse_label(path, line, common.get_field(path, line, row, label_col),
                                 choices)
    examples.append(Example(
        f"{split}-{n}", common.get_field(path, line, row, ctx),
        common.get_field(path, line, row, start),
        tuple(common.get_field(path, line, row, e) for e in ends), label))
  return examples


def convert_examples(task, examples, tokenizer, max_seq_length):
  """(features, num_truncated): input_ids/input_mask/segment_ids [n, choices, seq] int32 and
  label_ids [n] int32 (0 for test rows)."""
  vocab = tokenizer.vocab
  k = task.num_choices
  ctx_ids = tokenizer.encode([e.context for e in examples])
  ending_ids = tokenizer.encode([f"{e.start} {end}" for e in examples for end in e.endings])
  n = len(examples)
  input_ids = np.zeros((n, k, max_seq_length), np.int32)
  input_mask = np.zeros((n, k, max_seq_length), np.int32)
  segment_ids = np.zeros((n, k, max_seq_length), np.int32)
  label_ids = np.zeros(n, np.int32)
  truncated = 0
  for i, ex in enumerate(examples):
    for c in range(k):
      a, b = list(ctx_ids[i]), list(ending_ids[i * k + c])
      truncated += common.truncate_seq_pair(a, b, max_seq_length - 3) > 0
      input_ids[i, c], input_mask[i, c], segment_ids[i, c] = common.pack(a, b, vocab,
                                                                         max_seq_length)
    label_ids[i] = ex.label or 0
  return dict(input_ids=input_ids, input_mask=input_mask, segment_ids=segment_ids,
              label_ids=label_ids), int(truncated)


def write_predictions(task, split, examples, predictions, output_dir):
  predictions = np.asarray(predictions)
  if len(predictions) != len(examples):
    raise ValueError(f"{task.name}: {len(predictions)} predictions for {len(examples)} examples.")
  path = os.path.join(output_dir, f"{task.name}_{split}_predictions.csv")
  files_lib.write_atomic(path, "pred\n" + "".join(f"{int(p)}\n" for p in predictions))
  return path
