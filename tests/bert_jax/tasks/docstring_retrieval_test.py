"""benchmarks/docstring_retrieval.py: which docstrings make pairs, a deterministic build with no
text twice, and BM25 by hand."""

import json
import math

import numpy as np
import pytest

from benchmarks import docstring_retrieval as dr


def test_pairs_are_a_summary_sentence_and_the_rest():
  doc = """Return the median of numeric data.

    When the number of data points is odd, return the middle data point; else the mean.

    >>> median([1, 3, 5])
    3
    """
  assert dr.pair_of(doc) == ("Return the median of numeric data.", "When the number of data "
                             "points is odd, return the middle data point; else the mean.")
  assert dr.pair_of("Too short.\n\nA body that is long enough to count as ten words here.") is None
  assert dr.pair_of("Return the median of data.\n\nToo short a body.") is None
  assert dr.pair_of("median(data) -> float of the numbers.\n\n" + "word " * 12) is None


def test_build_is_deterministic_and_holds_no_text_twice(tmp_path):
  rows = dr.build(str(tmp_path / "a"), packages=("json", "statistics"))
  again = dr.build(str(tmp_path / "b"), packages=("json", "statistics"))
  assert rows == again and sum(map(len, rows.values())) >= 20
  for split in ("train", "dev", "test"):
    assert (tmp_path / "a" / f"{split}.jsonl").read_bytes() == (
        tmp_path / "b" / f"{split}.jsonl").read_bytes()
  texts = [t for r in rows.values() for x in r for t in (x["query"], x["positive"])]
  assert len(texts) == len(set(texts))
  first = json.loads((tmp_path / "a" / "train.jsonl").read_text(encoding="utf-8").splitlines()[0])
  assert set(first) == {"query", "positive"}


def test_bm25_by_hand():
  docs = ["the cat sat", "the dog ran far away"]
  got = dr.bm25_scores(["cat", "the dog"], docs, k1=1.2, b=0.75)
  avg = 4.0
  idf = lambda n: math.log(1 + (2 - n + 0.5) / (n + 0.5))  # noqa: E731
  tf_part = lambda length: 2.2 / (1 + 1.2 * (0.25 + 0.75 * length / avg))  # noqa: E731  (tf 1)
  np.testing.assert_allclose(got, [
      [idf(1) * tf_part(3), 0.0],
      [idf(2) * tf_part(3), idf(2) * tf_part(5) + idf(1) * tf_part(5)]])
  m = dr.bm25_metrics([{"query": "cat", "positive": docs[0]},
                       {"query": "dog far", "positive": docs[1]}])
  assert m["mrr@10"] == pytest.approx(1.0)
