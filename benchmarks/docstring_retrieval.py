r"""A retrieval task from real text nobody here wrote (issue 40 item 8): a standard-library
function's one-line docstring summary is the query, the rest of its docstring the document.

  .venv/bin/python -m benchmarks.docstring_retrieval --output_dir=runs/docstring_retrieval

Writes train.jsonl, dev.jsonl and test.jsonl (columns query, positive) for bert_jax.finetune's
embedding task, and prints a BM25 baseline's nDCG@10 / MRR@10 on dev and test, scored by
bert_jax/evaluation/retrieval_metrics.py (each split's documents are its corpus). The encoder's commands:
docs/finetuning.md, "Sentence embeddings: a retrieval benchmark".

Pairs: every public module, class, function and method of every public standard-library module
(stdlib_packages) whose docstring, cut as data_pipelines.stdlib_corpus cuts one (doctest, code and
table lines dropped), opens with a summary sentence of >= 4 words and goes on for >= 10 more words
(pair_of). A summary or body seen before (an inherited or copied docstring) is dropped, so no text
is in two pairs (a duplicate is a false negative, and a leak across splits). The split is by a
hash of the object's qualified name (70/15/15), the same in every run of one Python version. The
texts are also in the pre-training corpus (every standard-library docstring is): pre-training saw
them as masked-word text, never which summary goes with which body.
"""

import argparse
import collections
import hashlib
import importlib.util
import inspect
import json
import math
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = (("train", 70), ("dev", 15), ("test", 15))   # percent of the qualified names' hashes


def stdlib_packages():
  """Every public top-level standard-library module, sorted, less stdlib_corpus's skip list
  (GUI, tests, data-only packages)."""
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  skip = stdlib_corpus._SKIP  # pylint: disable=protected-access
  return sorted(n for n in sys.stdlib_module_names
                if not n.startswith("_") and n not in skip
                and importlib.util.find_spec(n) is not None)   # (msilib: Windows only)


def pair_of(doc):
  """(summary, body) of a docstring, or None: its first sentence (>= 4 words: PEP 257's summary
  line, or the first sentence of a first paragraph with no blank line after it) and the rest,
  cut as stdlib_corpus cuts a docstring, of >= 10 words."""
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  sentences = stdlib_corpus.docstring_to_document(doc)
  if not sentences or not inspect.cleandoc(doc).startswith(sentences[0].split()[0]):
    return None   # the first lines were code or a signature (dropped by the cut)
  summary, body = sentences[0], " ".join(sentences[1:])
  if len(summary.split()) < 4 or len(body.split()) < 10 or re.match(r"[\w.]+\(", summary):
    return None   # (a signature line, "_sum(data) -> (type, sum, count)", is no summary)
  return summary, body


def split_of(qualified_name):
  h = int(hashlib.sha256(qualified_name.encode()).hexdigest()[:8], 16) % 100
  for name, percent in SPLITS:
    if h < percent:
      return name
    h -= percent
  raise AssertionError(h)


def build(output_dir, packages=None):
  """Writes {train,dev,test}.jsonl; returns {split: pairs}."""
  sys.path.insert(0, ROOT)
  from benchmarks import docstring_task  # pylint: disable=g-import-not-at-top
  rows, seen = {name: [] for name, _ in SPLITS}, set()
  for package in packages or stdlib_packages():
    for qual, doc in docstring_task.docstrings(package):
      pair = pair_of(doc)
      if pair is None or pair[0] in seen or pair[1] in seen:
        continue
      seen.update(pair)
      rows[split_of(qual)].append({"query": pair[0], "positive": pair[1]})
  os.makedirs(output_dir, exist_ok=True)
  for split, items in rows.items():
    with open(os.path.join(output_dir, f"{split}.jsonl"), "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r) + "\n" for r in items)
  return rows


# ----------------------------------------------------------------------------------------------
# BM25 (Robertson et al.; Lucene's idf and defaults k1 = 1.2, b = 0.75), lower-cased \w+ tokens.
# ----------------------------------------------------------------------------------------------
def tokens(text):
  return re.findall(r"\w+", text.lower())


def bm25_scores(queries, documents, k1=1.2, b=0.75):
  """[Q, N] BM25 score of each query against each document."""
  docs = [collections.Counter(tokens(d)) for d in documents]
  lengths = np.array([sum(d.values()) for d in docs], np.float64)            # [N]
  df = collections.Counter(t for d in docs for t in d)
  n = len(docs)
  idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}
  norm = k1 * (1 - b + b * lengths / lengths.mean())                          # [N]
  scores = np.zeros((len(queries), n))
  for qi, q in enumerate(queries):
    for t in set(tokens(q)):
      if t in idf:
        tf = np.array([d.get(t, 0) for d in docs], np.float64)               # [N]
        scores[qi] += idf[t] * tf * (k1 + 1) / (tf + norm)
  return scores


def bm25_metrics(rows):
  """BM25's retrieval metrics on one split's rows (each query's own body relevant)."""
  from bert_jax.evaluation import retrieval_metrics  # pylint: disable=g-import-not-at-top
  scores = bm25_scores([r["query"] for r in rows], [r["positive"] for r in rows])
  return retrieval_metrics.retrieval_metrics(scores, np.eye(len(rows)), k=10, recall_at=(1, 10))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output_dir", default="runs/docstring_retrieval")
  args = p.parse_args()
  rows = build(args.output_dir)
  print(f"wrote {args.output_dir}/{{train,dev,test}}.jsonl: "
        + ", ".join(f"{s} {len(r)} pairs" for s, r in rows.items()))
  for split in ("dev", "test"):
    m = bm25_metrics(rows[split])
    print(f"BM25 {split} ({len(rows[split])} queries, {len(rows[split])} documents): "
          + ", ".join(f"{k} {v:.4f}" for k, v in m.items()))


if __name__ == "__main__":
  main()
