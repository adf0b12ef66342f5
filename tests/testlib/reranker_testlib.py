"""Test helpers for the reranker task type (bert_jax/tasks/reranker.py): real query/document rows
from the standard library's docstrings (benchmarks/docstring_retrieval.py), a WordPiece vocab of
their words, and sentence-transformers CrossEncoder folders (a tiny random
BertForSequenceClassification with one label, saved by CrossEncoder.save itself)."""

import json
import os

import numpy as np

from tests.testlib import tasks_testlib


def docstring_rows(directory, packages=("json", "statistics"), negatives=2, seed=0):
  """{split: [(query, positive, [negatives])]} of the docstring pairs of `packages`, each row's
  negatives other rows' positives of its split; writes {split}.jsonl (query, positive,
  negative_1, ...) and vocab.txt of every word in `directory`. Returns (rows, vocab path)."""
  from benchmarks import docstring_retrieval as dr  # pylint: disable=g-import-not-at-top
  pairs = dr.build(os.path.join(directory, "pairs"), packages=packages)
  rng = np.random.default_rng(seed)
  out, text = {}, []
  for split, items in pairs.items():
    rows = []
    for i, item in enumerate(items):
      others = [j for j in range(len(items)) if j != i]
      picked = rng.choice(others, size=min(negatives, len(others)), replace=False)
      rows.append((item["query"], item["positive"], [items[j]["positive"] for j in picked]))
    out[split] = rows
    with open(os.path.join(directory, f"{split}.jsonl"), "w", encoding="utf-8") as f:
      for q, p, ns in rows:
        f.write(json.dumps({"query": q, "positive": p,
                            **{f"negative_{k + 1}": n for k, n in enumerate(ns)}}) + "\n")
        text += [q, p]
  return out, tasks_testlib.write_vocab(directory, " ".join(text))


def write_cross_encoder(directory, vocab_file, *, hidden=32, layers=2, max_length=128, seed=0):
  """A CrossEncoder folder saved by sentence-transformers: a random BertForSequenceClassification
  (num_labels=1, every weight random so a swapped one shows) with a BertTokenizerFast of
  vocab_file. Returns the folder."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from sentence_transformers import CrossEncoder  # pylint: disable=g-import-not-at-top
  with open(vocab_file, encoding="utf-8") as f:
    size = sum(1 for _ in f)
  torch.manual_seed(seed)
  config = transformers.BertConfig(vocab_size=size, hidden_size=hidden, num_hidden_layers=layers,
                                   num_attention_heads=2, intermediate_size=2 * hidden,
                                   max_position_embeddings=max_length, num_labels=1)
  model = transformers.BertForSequenceClassification(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
  hf = os.path.join(directory, "hf")
  model.save_pretrained(hf)
  transformers.BertTokenizerFast(vocab_file, do_lower_case=True,
                                 model_max_length=max_length).save_pretrained(hf)
  out = os.path.join(directory, "cross_encoder")
  CrossEncoder(hf, max_length=max_length).save(out)
  return out
