"""What every fine-tuning task shares: reading files with clear errors, and packing token ids.

Tokenizers are duck-typed (see `data_pipelines.tokenizers.tokenization.get_tokenizer`): `encode(texts)`
returns one list of WordPiece/SentencePiece ids per text, `id_to_token(ids)` maps ids back to
piece strings, and `.vocab` is a `data_pipelines.tokenizers.vocab.VocabInfo` giving [CLS]/[SEP]/[PAD]/[UNK].
"""

import csv
import dataclasses
import io
import json
import os

import numpy as np
from bert_jax_core import errors
from bert_jax_core import text_files


class TaskDataError(errors.UserError):
  """A fine-tuning data file is missing, empty, not UTF-8, or has a malformed record."""


@dataclasses.dataclass
class SkipCounter:
  """Records skipped in the official tooling's manner: counted, a few kept as samples."""
  counts: dict = dataclasses.field(default_factory=dict)
  samples: dict = dataclasses.field(default_factory=dict)

  def add(self, reason, sample):
    self.counts[reason] = self.counts.get(reason, 0) + 1
    self.samples.setdefault(reason, [])
    if len(self.samples[reason]) < 3:
      self.samples[reason].append(sample)

  def summary(self):
    """One line per reason: 'Could not find answer: 2 (e.g. file:q17, file:q90)'."""
    return "; ".join(f"{r}: {n} (e.g. {', '.join(self.samples[r])})"
                     for r, n in sorted(self.counts.items()))


# ---------------------------------------------------------------------------------------------
# Files.
# ---------------------------------------------------------------------------------------------


def _is_a_directory(path):
  return TaskDataError(f"{path}: is a directory, not a task file; name a file in it (check the "
                       "task's data_dir and file names).")


def _open_bytes(path):
  if "://" in path:  # gs://... on Cloud TPU VMs
    from bert_jax_core.tf_setup import tf
    if not tf.io.gfile.exists(path):
      raise TaskDataError(f"{path}: no such file.")
    if tf.io.gfile.isdir(path):
      raise _is_a_directory(path)
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  if os.path.isdir(path):
    raise _is_a_directory(path)
  if not os.path.isfile(path):
    raise TaskDataError(f"{path}: no such file; check the task's data_dir and file names.")
  with open(path, "rb") as f:
    return f.read()


def read_text(path):
  """The whole file as str; raises TaskDataError if missing, empty or not UTF-8 (a binary,
  compressed or UTF-16 file: text_files.not_text, the rule every corpus reader applies; then any
  invalid byte, since a label or an answer span needs every character)."""
  raw = _open_bytes(path)
  why = text_files.not_text(raw[:text_files.SNIFF_BYTES], path)
  if why:
    raise TaskDataError(why)
  try:
    text = raw.decode("utf-8-sig")  # GLUE's MRPC files start with a UTF-8 BOM
  except UnicodeDecodeError as e:
    line = raw[:e.start].count(b"\n") + 1
    raise TaskDataError(f"{path}:{line}: not UTF-8 (byte {e.start}); re-encode the file as "
                        "UTF-8.") from e
  if not text.strip():
    raise TaskDataError(f"{path}: the file is empty.")
  return text


def read_rows(path, file_format, header=True):
  """[(line_number, row)] of a TSV/CSV (row: list of str) or JSONL (row: dict) file.

  TSV is read as GLUE is (google-research/bert, tfds): tab separated with quoting off, since
  GLUE sentences contain unbalanced quote characters. CSV uses standard quoting. With
  `header`, the first row is returned separately: (header, rows).
  """
  text = read_text(path)
  if file_format == "jsonl":
    rows = []
    for n, line in enumerate(text.splitlines(), start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise TaskDataError(f"{path}:{n}: not a JSON object ({e.msg}); JSONL is one JSON object "
                            "per line.") from e
      if not isinstance(row, dict):
        raise TaskDataError(f"{path}:{n}: expected a JSON object per line, found "
                            f"{type(row).__name__}.")
      rows.append((n, row))
    return (None, rows) if header else rows
  if file_format == "tsv":
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", quoting=csv.QUOTE_NONE)
  elif file_format == "csv":
    reader = csv.reader(io.StringIO(text, newline=""))
  else:
    raise TaskDataError(f"{path}: unknown file format {file_format!r}; use tsv, csv or jsonl.")
  rows = []
  try:
    for row in reader:
      if not row or (len(row) == 1 and not row[0].strip()):
        continue  # blank line
      rows.append((reader.line_num, row))
  except csv.Error as e:
    raise TaskDataError(f"{path}:{reader.line_num}: malformed {file_format.upper()} ({e}).") from e
  if not header:
    return rows
  if not rows:
    raise TaskDataError(f"{path}: the file is empty.")
  (_, head), rows = rows[0], rows[1:]
  return [h.strip() for h in head], rows


def column_index(path, header, name):
  """Index of column `name` in the header row, or a one-line error listing the columns."""
  if isinstance(name, int):
    return name
  try:
    return header.index(name)
  except ValueError:
    raise TaskDataError(f"{path}:1: no column {name!r} in the header; found "
                        f"{header}.") from None


def get_field(path, line, row, column):
  """row[column] for list rows (index) or dict rows (key), with a one-line error if absent."""
  if isinstance(row, dict):
    if column not in row:
      raise TaskDataError(f"{path}:{line}: missing field {column!r}; found {sorted(row)}.")
    return row[column]
  if column >= len(row):
    raise TaskDataError(f"{path}:{line}: expected at least {column + 1} columns, found "
                        f"{len(row)}; is the file {('tab', 'comma')[path.endswith('.csv')]}"
                        "-separated with one record per line?")
  return row[column]


def parse_label(path, line, value, labels):
  """A label string -> its index in `labels` (classification) or a float (regression: ())."""
  if not labels:
    try:
      return float(value)
    except (TypeError, ValueError):
      raise TaskDataError(f"{path}:{line}: regression label {value!r} is not a number.") from None
  value = str(value).strip()
  try:
    return labels.index(value)
  except ValueError:
    raise TaskDataError(f"{path}:{line}: label {value!r} is not in the label set "
                        f"{list(labels)}; fix the row or the task's labels.") from None


# ---------------------------------------------------------------------------------------------
# Packing ids into BERT inputs.
# ---------------------------------------------------------------------------------------------


def truncate_seq_pair(ids_a, ids_b, max_length):
  """Trims the longer sequence one token at a time (google-research/bert's _truncate_seq_pair).

  Trimming the longer one keeps more of the shorter, which usually carries as much signal.
  Returns the number of tokens removed. Modifies the lists in place.
  """
  removed = 0
  while len(ids_a) + len(ids_b) > max_length:
    if len(ids_a) > len(ids_b):
      ids_a.pop()
    else:
      ids_b.pop()
    removed += 1
  return removed


def pack(ids_a, ids_b, vocab, max_seq_length):
  """[CLS] a [SEP] (b [SEP]) padded with [PAD]: (input_ids, input_mask, segment_ids) int32.

  Inputs must already fit (see truncate_seq_pair): max_seq_length - 2 (single) or - 3 (pair).
  """
  tokens = [vocab.cls_id] + list(ids_a) + [vocab.sep_id]
  segment_ids = [0] * len(tokens)
  if ids_b is not None:
    tokens += list(ids_b) + [vocab.sep_id]
    segment_ids += [1] * (len(ids_b) + 1)
  if len(tokens) > max_seq_length:
    raise ValueError(f"pack: {len(tokens)} tokens exceed max_seq_length={max_seq_length}.")
  input_ids = np.full(max_seq_length, vocab.pad_id, np.int32)
  input_ids[:len(tokens)] = tokens
  input_mask = np.zeros(max_seq_length, np.int32)
  input_mask[:len(tokens)] = 1
  segments = np.zeros(max_seq_length, np.int32)
  segments[:len(segment_ids)] = segment_ids
  return input_ids, input_mask, segments
