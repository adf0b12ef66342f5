"""Pairs and triplets for contrastive embedding training (issue 40 item 1), in the column
conventions sentence-transformers users already have.

A JSONL, CSV or TSV file whose rows are (anchor, positive, negative, ...): columns found by name
when the header (or the JSON keys) says which (`anchor` or `query`; `positive`; `negative`, or
`negative_1`, `negative_2`, ... in number order), else by position as sentence-transformers reads
a dataset (first column the anchor, second the positive, every further one a hard negative).
Any number of hard negatives, the same in every row. Optional prompts ("search_query: ",
"search_document: ") are prepended to the anchor and to the documents. A column named `score` or
`label` (sentence-transformers' label columns) is a pair's gold similarity, not a text: scored
pairs (STS: sentence1, sentence2, score) are an evaluation set (Spearman of the cosine); for a
reranker (bert_jax/tasks/reranker.py) they are sentence-transformers' CrossEncoder form (query,
document, label), and `candidate_lists` groups any rows by query into reranking lists.

A teacher's scores for distillation (MarginMSE, issue 48 item 4) are read in the two forms
sentence-transformers writes them, into each row's `teacher_margins` (k numbers, s_p - s_n_i):
a `scores` column of 1 + k numbers (the positive's, then each hard negative's: `python -m
bert_jax.mine --output_scores`, ST's mine_hard_negatives(output_scores=True) for the triplet and
n-tuple formats), or, in a row with hard negatives, a `label`/`score` column of k margins (one
number for a triplet: ST's MarginMSELoss label). A list in a CSV/TSV cell is written as JSON.

In-batch negatives make a text that appears twice in one batch a false negative, so
`no_duplicate_batches` orders the rows as sentence-transformers' NoDuplicatesBatchSampler does:
a row joins the current batch only if none of its texts is already there, else it waits for a
later batch.
"""

import dataclasses
import json
import os
import re

import numpy as np

from data_pipelines.tasks import common
from data_pipelines.tasks.common import TaskDataError

ANCHOR_NAMES = ("anchor", "query")
POSITIVE_NAMES = ("positive", "document")   # document: a reranker's (query, document, label)
SCORE_NAMES = ("score", "label")
TEACHER_SCORES = "scores"   # mine_hard_negatives(output_scores=True)'s column: 1 + k numbers


@dataclasses.dataclass(frozen=True)
class Pair:
  anchor: str
  positive: str
  negatives: tuple = ()
  score: float = None   # gold similarity of a scored pair (STS); None for a training pair
  teacher_margins: tuple = None   # k teacher margins s(a, p) - s(a, n_i) (MarginMSE), or None

  @property
  def texts(self):
    return (self.anchor, self.positive) + self.negatives


def _format(path, file_format):
  if file_format:
    return file_format
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  if ext not in ("jsonl", "csv", "tsv"):
    raise TaskDataError(f"{path}: cannot tell the format from the extension {ext!r}; name the "
                        "file .jsonl, .csv or .tsv or pass the format.")
  return ext


def _score_column(names):
  """The index of the score column among names, or None."""
  lower = [str(n).strip().lower() for n in names]
  return next((lower.index(n) for n in SCORE_NAMES if n in lower), None)


def _teacher_column(names):
  """The index of the teacher's `scores` column among names, or None."""
  lower = [str(n).strip().lower() for n in names]
  return lower.index(TEACHER_SCORES) if TEACHER_SCORES in lower else None


def _columns(path, names):
  """(anchor, positive, [negatives]) columns of a header (names): by name, else by position;
  the score column (_score_column) and the teacher's scores are never a text."""
  score = _score_column(names)
  teacher = _teacher_column(names)
  lower = [str(n).strip().lower() for n in names]
  anchor = next((lower.index(n) for n in ANCHOR_NAMES if n in lower), None)
  positive = next((lower.index(n) for n in POSITIVE_NAMES if n in lower), None)
  if anchor is None and positive is None:   # sentence-transformers' order: a, p, n1, n2, ...
    texts = [i for i in range(len(names)) if i not in (score, teacher)]
    if len(texts) < 2:
      raise TaskDataError(f"{path}: {len(names)} column(s) {list(names)}; a pair needs an anchor "
                          "and a positive (columns anchor/query, positive, negative...).")
    return texts[0], texts[1], texts[2:]
  if anchor is None or positive is None:
    missing = "anchor (or query)" if anchor is None else "positive"
    raise TaskDataError(f"{path}: no column {missing!r}; found {list(names)}: name the "
                        "columns anchor (or query), positive (or document), negative_1, ... "
                        "(or give them in that order with none of these names).")
  numbered = sorted((int(m.group(1)), i) for i, n in enumerate(lower)
                    if (m := re.fullmatch(r"negative_?(\d+)", n)))
  negatives = ([lower.index("negative")] if "negative" in lower else []) + [i for _, i in numbered]
  unread = [names[i] for i, n in enumerate(lower)
            if "neg" in n and i not in negatives and i != score]
  if unread:   # 'negatives' (a list), 'neg', 'hard_negative': dropped silently (issue 49 item 7)
    raise TaskDataError(f"{path}: column {unread[0]!r} is not read: hard negatives are the "
                        "columns negative, negative_1, negative_2, ... (one text each); rename "
                        "it, or split a list of negatives into them.")
  return anchor, positive, negatives


def _read(path, file_format):
  """(file_format, names, rows): the file's rows and its column names (a CSV/TSV header; a JSONL
  file's first row's keys). One line for an empty JSONL file."""
  file_format = _format(path, file_format)
  header, rows = common.read_rows(path, file_format)
  if file_format == "jsonl":
    if not rows:
      raise TaskDataError(f"{path}: the file is empty.")
    header = list(rows[0][1])
  return file_format, header, rows


def is_scored(path, file_format=None):
  """Whether the file's rows are scored pairs (a score column in its header or first JSON row,
  and no hard negatives: in a row with negatives the label is a teacher's margins)."""
  _, names, _ = _read(path, file_format)
  return _score_column(names) is not None and not _columns(path, names)[2]


def _numbers(path, line, value, name):
  """A cell of teacher scores -> a tuple of floats: a JSON list (a string of one in CSV/TSV) or
  one number; one line naming the row otherwise."""
  if isinstance(value, str) and value.strip().startswith("["):
    try:
      value = json.loads(value)
    except json.JSONDecodeError:
      pass
  values = value if isinstance(value, (list, tuple)) else [value]
  try:
    return tuple(float(v) for v in values)
  except (TypeError, ValueError):
    raise TaskDataError(f"{path}:{line}: the teacher's {name!r} is {value!r}, not numbers; give "
                        "a list of numbers (a JSON list in a CSV/TSV cell).") from None


def _teacher_margins(path, line, scores, label, k):
  """The row's k teacher margins from `scores` (1 + k scores) or `label` (k margins), or None;
  one line when the count does not fit the row's k hard negatives."""
  if scores is None and label is None:
    return None
  name, values = ("scores", scores) if scores is not None else ("label", label)
  if not k:
    raise TaskDataError(f"{path}:{line}: a teacher's {name!r} ({len(values)} numbers) but no "
                        "hard-negative column: MarginMSE learns the margin between the positive "
                        "and each hard negative; add the negatives (python -m bert_jax.mine "
                        "--output_scores writes both) or drop the column.")
  want = 1 + k if name == "scores" else k
  if len(values) != want:
    what = ("the positive's score, then each negative's: mine --output_scores, sentence-"
            "transformers' mine_hard_negatives(output_scores=True)" if name == "scores" else
            "one margin s(anchor, positive) - s(anchor, negative_i) per negative: "
            "sentence-transformers' MarginMSELoss label")
    raise TaskDataError(f"{path}:{line}: {name!r} holds {len(values)} numbers but the row has "
                        f"{k} hard negative(s); expected {want} ({what}); fix the row or the "
                        "negative columns.")
  if name == "scores":
    return tuple(values[0] - v for v in values[1:])
  return tuple(values)


def text_column_names(path, file_format=None):
  """(anchor name, positive name) of a pairs file's columns as read_pairs finds them (by name,
  else by position): what a program that writes rows back (bert_jax.mine) calls them. One
  TaskDataError line for a file without an anchor and a positive."""
  _, header, _ = _read(path, file_format)
  a, p, _ = _columns(path, header)
  return str(header[a]), str(header[p])


def read_pairs(path, file_format=None, query_prompt="", document_prompt=""):
  """[Pair] of a JSONL/CSV/TSV file; one TaskDataError line for a missing column, an empty text,
  a score that is not a number or a row whose number of negatives differs from the first row's."""
  file_format, names, rows = _read(path, file_format)
  a, p, negs = _columns(path, names)
  score, teacher = _score_column(names), _teacher_column(names)
  if file_format == "jsonl":   # a JSON row's fields by name, a CSV/TSV row's by index
    a, p, negs = names[a], names[p], [names[i] for i in negs]
    score = None if score is None else names[score]
    teacher = None if teacher is None else names[teacher]
  header = names
  out = []
  for line, row in rows:
    def text(column, side):
      value = common.get_field(path, line, row, column)
      if isinstance(value, (list, dict)):   # was read as its repr, "['p1', 'p2']" (issue 49)
        name = column if isinstance(column, str) else names[column]
        raise TaskDataError(f"{path}:{line}: the {side} ({name!r}) is a JSON "
                            f"{type(value).__name__}, not a text; give one text per field (hard "
                            "negatives: fields negative_1, negative_2, ...).")
      value = "" if value is None else str(value)
      if not value.strip():
        name = column if isinstance(column, str) else names[column]
        raise TaskDataError(f"{path}:{line}: the {side} ({name!r}) is empty; every side of a "
                            "pair needs text.")
      return value
    if not isinstance(row, dict) and len(row) != len(header):
      raise TaskDataError(f"{path}:{line}: {len(row)} columns, the header has {len(header)}.")
    gold, margins = None, None
    if teacher is not None or (score is not None and negs):   # a teacher's, for MarginMSE
      margins = _teacher_margins(
          path, line,
          None if teacher is None else _numbers(path, line, common.get_field(
              path, line, row, teacher), "scores"),
          None if teacher is not None or score is None else _numbers(
              path, line, common.get_field(path, line, row, score), "label"), len(negs))
    elif score is not None:
      value = common.get_field(path, line, row, score)
      try:
        gold = float(value)
      except (TypeError, ValueError):
        name = score if isinstance(score, str) else names[score]
        raise TaskDataError(f"{path}:{line}: the score ({name!r}) is {value!r}, not a number; a "
                            "scored pair's gold similarity is a number.") from None
    out.append(Pair(query_prompt + text(a, "anchor"), document_prompt + text(p, "positive"),
                    tuple(document_prompt + text(n, "negative") for n in negs), gold, margins))
  if not out:
    raise TaskDataError(f"{path}: no rows after the header.")
  return out


def candidate_lists(pairs):
  """[(query, [documents], [labels])]: the rows of each query merged, in first-seen order (a
  reranker's evaluation lists). A scored pair adds its document with its score; a row (query,
  positive, negative...) its positive with label 1 and its negatives with 0. A document listed
  twice for one query keeps its highest label (a positive that is also another row's negative
  stays relevant)."""
  lists = {}
  for p in pairs:
    docs = lists.setdefault(p.anchor, {})
    given = ([(p.positive, p.score)] if p.score is not None else
             [(p.positive, 1.0)] + [(n, 0.0) for n in p.negatives])
    for text, label in given:
      docs[text] = max(docs.get(text, label), label)
  return [(q, list(d), list(d.values())) for q, d in lists.items()]


def no_duplicate_batches(pairs, batch_size, rng=None):
  """Index arrays of batches in which no text appears twice (the last one may be partial).

  sentence-transformers' NoDuplicatesBatchSampler: walk the (shuffled) rows; a row whose texts
  are all new to the batch joins it, the others wait for the next batch."""
  order = list(rng.permutation(len(pairs)) if rng is not None else range(len(pairs)))
  batches = []
  while order:
    batch, seen, rest = [], set(), []
    for i in order:
      texts = set(pairs[i].texts)
      if len(batch) < batch_size and not texts & seen and len(texts) == len(pairs[i].texts):
        batch.append(i)
        seen |= texts
      else:
        rest.append(i)
    if not batch:   # a row that repeats its own text can never join: say which
      raise TaskDataError(f"row {order[0] + 1}: the same text twice in one row "
                          f"({pairs[order[0]].texts}); a duplicate is a false negative.")
    batches.append(np.array(batch))
    order = rest
  return batches


def no_duplicate_order(pairs, batch_size, rng):
  """A permutation of the rows whose consecutive batch_size windows (the loop's batches, as
  many as a plain shuffle gives) hold no text twice wherever the rows allow: each window is
  filled as no_duplicate_batches fills a batch; one that cannot be filled without a duplicate
  takes the next rows anyway (few distinct texts left)."""
  order, out = list(rng.permutation(len(pairs))), []
  while order:
    batch, seen, rest = [], set(), []
    for i in order:
      texts = set(pairs[i].texts)
      if len(batch) < batch_size and not texts & seen:
        batch.append(i)
        seen |= texts
      else:
        rest.append(i)
    fill = batch_size - len(batch)
    batch, rest = batch + rest[:fill], rest[fill:]
    out += batch
    order = rest
  return np.array(out, np.int64)
