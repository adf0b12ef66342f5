"""Shared by the mining tests (tests/bert_jax/inference/mining_test.py, tests/end_to_end/
mine_test.py): real stdlib docstring rows, a tiny random BERT saved as a sentence-transformers
folder, and sentence-transformers' own mine_hard_negatives to compare with.

sentence-transformers' mine_hard_negatives takes and returns a `datasets.Dataset`, and the venv
has neither `datasets` nor `pandas` (requirements-test.txt pins neither; installing them pulls
pyarrow). `st_mine` runs ST's function unchanged with a stand-in for the four things it does
with a Dataset: its column_names, a column by name, `to_pandas().groupby(anchor).count()` (the
rows of each anchor, for max_positives) and `Dataset.from_dict` of its output columns.
"""

import os
import shutil
import sys
import types

# Modules whose docstrings give ~50 train rows (benchmarks/docstring_retrieval.py: 50/7/9).
PACKAGES = ("json", "textwrap", "heapq", "bisect", "fractions", "statistics", "string", "shlex",
            "difflib")


def docstring_rows(directory):
  """{split: [{"query", "positive"}]} of real stdlib docstrings, and the files written."""
  from benchmarks import docstring_retrieval  # pylint: disable=g-import-not-at-top
  return docstring_retrieval.build(directory, packages=PACKAGES)


def st_folder(directory, rows, hidden=32, seed=0, layers=2):
  """A tiny random BertModel (2 layers by default) saved by SentenceTransformer.save with mean pooling and
  Normalize, a vocab.txt of the rows' words (+ letters) beside it; its path."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer
  from sentence_transformers.base.modules import Normalize, Transformer
  from sentence_transformers.sentence_transformer.modules import Pooling
  from tests.testlib import tasks_testlib
  # pylint: enable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  vocab = tasks_testlib.write_vocab(str(directory), " ".join(
      r["query"] + " " + r["positive"] for r in rows))
  torch.manual_seed(seed)
  config = transformers.BertConfig(vocab_size=len(open(vocab).read().split()),
                                   hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=2,
                                   intermediate_size=2 * hidden, max_position_embeddings=128)
  hf = os.path.join(str(directory), "hf")
  transformers.BertModel(config).eval().save_pretrained(hf)
  transformers.BertTokenizerFast(vocab).save_pretrained(hf)
  body = Transformer(hf, max_seq_length=64)
  model = SentenceTransformer(modules=[body, Pooling(hidden, "mean"), Normalize()], device="cpu")
  folder = os.path.join(str(directory), "st")
  model.save(folder)
  shutil.copy(vocab, os.path.join(folder, "vocab.txt"))
  return folder


class Dataset:
  """What mine_hard_negatives does with a datasets.Dataset (the module docstring)."""

  def __init__(self, columns):
    self._columns = {k: list(v) for k, v in columns.items()}

  @classmethod
  def from_dict(cls, columns):
    return cls(columns)

  @classmethod
  def from_list(cls, rows):
    return cls({k: [r[k] for r in rows] for k in rows[0]})

  @property
  def column_names(self):
    return list(self._columns)

  def __len__(self):
    return len(next(iter(self._columns.values())))

  def __getitem__(self, column):
    return self._columns[column]

  def to_list(self):
    return [dict(zip(self._columns, v)) for v in zip(*self._columns.values())]

  def to_pandas(self):
    columns = self._columns

    def groupby(by):
      counts = {}
      for a in columns[by]:
        counts[a] = counts.get(a, 0) + 1
      table = {k: counts for k in columns if k != by}   # .count(): every other column's counts
      return types.SimpleNamespace(count=lambda: types.SimpleNamespace(to_dict=lambda: table))
    return types.SimpleNamespace(groupby=groupby)


def st_mine(rows, folder, corpus=None, **settings):
  """sentence-transformers' mine_hard_negatives on `rows` with SentenceTransformer(folder):
  its output rows (dicts; lists as Python floats)."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from sentence_transformers.util import hard_negatives  # pylint: disable=g-import-not-at-top
  saved = sys.modules.get("datasets")
  sys.modules["datasets"] = types.SimpleNamespace(Dataset=Dataset)
  available, hard_negatives.is_datasets_available = (hard_negatives.is_datasets_available,
                                                     lambda: True)
  try:
    out = hard_negatives.mine_hard_negatives(
        Dataset.from_list(rows), SentenceTransformer(folder, device="cpu"), corpus=corpus,
        verbose=False, **settings)
  finally:
    hard_negatives.is_datasets_available = available
    if saved is None:
      del sys.modules["datasets"]
    else:
      sys.modules["datasets"] = saved
  return out.to_list()


def same_rows(theirs, ours, tie=1e-5):
  """Rows equal but for near-ties: a row whose negatives differ must have the same negative
  scores within `tie` (two candidates scoring the same, ordered apart by float noise). Returns
  the number of such rows."""
  assert len(theirs) == len(ours), (len(theirs), len(ours))
  ties = 0
  for a, b in zip(theirs, ours):
    assert list(a) == list(b), (list(a), list(b))            # columns, in ST's order
    if "scores" in a:
      assert max(abs(x - y) for x, y in zip(a["scores"], b["scores"])) < tie, (a, b)
    texts = lambda r: {k: v for k, v in r.items() if k != "scores"}  # noqa: E731
    if texts(a) != texts(b):
      assert (a[next(iter(a))], a[list(a)[1]]) == (b[next(iter(b))], b[list(b)[1]])
      ties += 1
  return ties
