"""data_pipelines/tasks/pairs.py: sentence-transformers' column conventions, prompts, one-line
errors, and batches with no duplicate text."""

import json

import numpy as np
import pytest

from data_pipelines.tasks import pairs
from data_pipelines.tasks.common import TaskDataError


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def test_columns_by_name_and_by_position(tmp_path):
  # By name, in any order; numbered negatives in number order (negative_10 after negative_2).
  rows = [{"negative_10": "n10", "positive": "p", "query": "q", "negative_2": "n2",
           "negative": "n"}]
  got = pairs.read_pairs(_jsonl(tmp_path / "a.jsonl", rows))
  assert got == [pairs.Pair("q", "p", ("n", "n2", "n10"))]
  # By position (sentence-transformers' order) when no column is named anchor/query/positive.
  (tmp_path / "b.csv").write_text('sentence1,sentence2,hard\n"a, b",c,d\n', encoding="utf-8")
  assert pairs.read_pairs(str(tmp_path / "b.csv")) == [pairs.Pair("a, b", "c", ("d",))]
  (tmp_path / "c.tsv").write_text("anchor\tpositive\nx\ty\n", encoding="utf-8")
  got = pairs.read_pairs(str(tmp_path / "c.tsv"), query_prompt="search_query: ",
                         document_prompt="search_document: ")
  assert got == [pairs.Pair("search_query: x", "search_document: y")]


@pytest.mark.parametrize("name,text,msg", [
    ("e.jsonl", '{"anchor": "a", "positive": " "}\n',
     r"e.jsonl:1: the positive \('positive'\) is empty"),
    ("f.tsv", "anchor\tnegative\na\tb\n", r"f.tsv: no column 'positive'; found \['anchor', "),
    ("g.csv", "anchor,positive\na,b\n,c\n", r"g.csv:3: the anchor \('anchor'\) is empty"),
    ("h.jsonl", '{"anchor": "a", "positive": "b"}\n{"anchor": "c"}\n',
     r"h.jsonl:2: missing field 'positive'"),
    ("i.txt", "a\tb\n", r"i.txt: cannot tell the format from the extension 'txt'"),
    ("j.tsv", "only\nx\n", r"j.tsv: 1 column\(s\) \['only'\]; a pair needs an anchor"),
    # Issue 49 item 7: a list of negatives (a 'negatives' field) was dropped silently, and a
    # list in a text field was read as its repr ("['p1', 'p2']").
    ("k.jsonl", '{"anchor": "a", "positive": "b", "negatives": ["c", "d"]}\n',
     r"^[^ ]*k.jsonl: column 'negatives' is not read: hard negatives are the columns negative, "
     r"negative_1, negative_2, ... \(one text each\); rename it, or split a list of negatives "
     r"into them.$"),
    ("l.tsv", "query\tpositive\thard_neg\na\tb\tc\n", r"l.tsv: column 'hard_neg' is not read"),
    ("m.jsonl", '{"anchor": "a", "positive": ["p1", "p2"]}\n',
     r"^[^ ]*m.jsonl:1: the positive \('positive'\) is a JSON list, not a text; give one text "
     r"per field \(hard negatives: fields negative_1, negative_2, ...\).$"),
])
def test_bad_input_is_one_line(tmp_path, name, text, msg):
  (tmp_path / name).write_text(text, encoding="utf-8")
  with pytest.raises(TaskDataError, match=msg) as e:
    pairs.read_pairs(str(tmp_path / name))
  assert "\n" not in str(e.value)


def test_no_batch_holds_a_text_twice():
  rng = np.random.default_rng(0)
  # 40 rows over 12 distinct positives: in-batch negatives would meet the same text often.
  rows = [pairs.Pair(f"q{i}", f"doc{i % 12}", (f"doc{(i + 5) % 12}",)) for i in range(40)]
  batches = pairs.no_duplicate_batches(rows, 4, rng)
  assert sorted(np.concatenate(batches).tolist()) == list(range(40))   # every row, once
  for b in batches:
    assert len(b) <= 4
    texts = [t for i in b for t in rows[i].texts]
    assert len(texts) == len(set(texts))
  # A plain shuffle does put one text twice in a batch on these rows (what the sampler avoids).
  order = rng.permutation(40)
  assert any(len({t for i in order[j:j + 4] for t in rows[i].texts})
             < 4 * 3 for j in range(0, 40, 4))
  with pytest.raises(TaskDataError, match="row 1: the same text twice in one row"):
    pairs.no_duplicate_batches([pairs.Pair("a", "a")], 4)


def test_no_duplicate_order_keeps_the_batch_count():
  rng = np.random.default_rng(1)
  rows = [pairs.Pair(f"q{i}", f"doc{i % 12}", (f"doc{(i + 5) % 12}",)) for i in range(40)]
  order = pairs.no_duplicate_order(rows, 4, rng)
  assert sorted(order.tolist()) == list(range(40))   # a permutation: 10 batches of 4, as a shuffle
  def with_duplicates(o):
    return [j // 4 for j in range(0, 40, 4) if len({t for i in o[j:j + 4] for t in rows[i].texts})
            < 12]
  # 12 documents, 8 per batch: only the last batch, made of the rows left, repeats one (measured
  # over seeds 0-4: batch 9 alone); a plain shuffle repeats one in 5 to 10 of the 10 batches.
  assert with_duplicates(order) in ([], [9])
  assert len(with_duplicates(rng.permutation(40))) >= 5
  # Rows that cannot avoid a duplicate still all come, in full batches.
  same = [pairs.Pair(f"q{i}", "doc") for i in range(6)]
  assert sorted(pairs.no_duplicate_order(same, 4, rng).tolist()) == list(range(6))


def test_a_score_column_is_the_gold_similarity_not_a_text(tmp_path):
  # STS's columns (sentence1, sentence2, score): by position the two sentences, the score apart.
  (tmp_path / "sts.csv").write_text("sentence1,score,sentence2\na,4.5,b\nc,0,d\n",
                                    encoding="utf-8")
  got = pairs.read_pairs(str(tmp_path / "sts.csv"))
  assert got == [pairs.Pair("a", "b", (), 4.5), pairs.Pair("c", "d", (), 0.0)]
  assert pairs.is_scored(str(tmp_path / "sts.csv"))
  rows = [{"anchor": "q", "positive": "p", "label": 1}]
  assert pairs.read_pairs(_jsonl(tmp_path / "l.jsonl", rows))[0].score == 1.0
  assert not pairs.is_scored(_jsonl(tmp_path / "m.jsonl", [{"anchor": "q", "positive": "p"}]))
  (tmp_path / "bad.tsv").write_text("sentence1\tsentence2\tscore\na\tb\thigh\n", encoding="utf-8")
  with pytest.raises(TaskDataError, match=r"bad.tsv:2: the score \('score'\) is 'high', not a "
                                          r"number"):
    pairs.read_pairs(str(tmp_path / "bad.tsv"))
