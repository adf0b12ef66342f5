"""GLUE and custom classification tasks: file layouts, features, errors, submissions, TFDS."""
import os

import numpy as np
import pytest

from data_pipelines.tasks import glue
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

TEXT = ("The cat sat on the mat. A dog ran in the park. PCCW's chief operating officer left. "
        "The company said it was \"pleased\" with results. Is it raining? It is sunny today.")


def _write(path, lines, bom=False):
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    f.write(("\ufeff" if bom else "") + "\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  return tasks_testlib.ReferenceTokenizer(
      tasks_testlib.write_vocab(str(tmp_path_factory.mktemp("vocab")), TEXT))


def test_cola_headerless_train_and_headed_test(tmp_path, tokenizer):
  d = str(tmp_path)
  _write(f"{d}/train.tsv", ["gj04\t1\t\tThe cat sat on the mat.",
                            "gj04\t0\t*\tCat the mat on sat."])
  _write(f"{d}/test.tsv", ["index\tsentence", "0\tA dog ran in the park.",
                           "1\tThe park \"ran."])
  task = glue.TASKS["cola"]
  train = glue.read_examples(task, d, "train")
  assert [(e.text_a, e.label) for e in train] == [
      ("The cat sat on the mat.", 1), ("Cat the mat on sat.", 0)]
  test = glue.read_examples(task, d, "test")
  assert [e.guid for e in test] == ["0", "1"] and test[1].text_a == 'The park "ran.'  # no quoting
  features, truncated = glue.convert_examples(task, train, tokenizer, 16)
  assert truncated == 0
  ids = features["input_ids"][0]
  words = tokenizer.encode(["The cat sat on the mat."])[0]
  v = tokenizer.vocab
  assert list(ids[:len(words) + 2]) == [v.cls_id] + words + [v.sep_id]
  assert features["input_mask"][0].sum() == len(words) + 2
  assert not features["segment_ids"].any()
  assert features["label_ids"].tolist() == [1, 0] and features["label_ids"].dtype == np.int32


def test_mrpc_bom_header_pair_truncation_and_submission(tmp_path, tokenizer):
  d = str(tmp_path)
  head = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
  _write(f"{d}/train.tsv", [head, "1\t1\t2\tThe cat sat on the mat.\tA dog ran in the park.",
                            "0\t3\t4\tIs it raining?\tIt is sunny today."], bom=True)
  _write(f"{d}/test.tsv", ["index\t#1 ID\t#2 ID\t#1 String\t#2 String",
                           "7\t1\t2\tThe cat sat.\tThe mat.", "9\t3\t4\tA dog.\tThe park."])
  task = glue.TASKS["mrpc"]
  train = glue.read_examples(task, d, "train")
  assert train[0].text_b == "A dog ran in the park." and train[0].label == 1
  # 7 + 7 word pieces into 12 - 3 = 9 slots: longest-first trimming, as google-research/bert.
  features, truncated = glue.convert_examples(task, train, tokenizer, 12)
  assert truncated == 1  # the second pair (4 + 5 pieces) fits exactly
  v = tokenizer.vocab
  row, seg = features["input_ids"][0], features["segment_ids"][0]
  a = tokenizer.encode([train[0].text_a])[0]
  b = tokenizer.encode([train[0].text_b])[0]
  # Ties pop from b: (7,7) -> (7,6) -> (6,6) -> (6,5) -> (5,5) -> (5,4).
  assert list(row) == [v.cls_id] + a[:5] + [v.sep_id] + b[:4] + [v.sep_id]
  assert list(seg) == [0] * 7 + [1] * 5
  test = glue.read_examples(task, d, "test")
  path = glue.write_predictions(task, "test", test, np.array([1, 0]), d)
  assert os.path.basename(path) == "MRPC.tsv"
  assert open(path).read() == "index\tprediction\n7\t1\n9\t0\n"


def test_mnli_splits_labels_and_submissions(tmp_path, tokenizer):
  d = str(tmp_path / "MNLI")
  cols = ["index", "promptID", "pairID", "genre", "sentence1_binary_parse",
          "sentence2_binary_parse", "sentence1_parse", "sentence2_parse", "sentence1", "sentence2"]

  def row(i, s1, s2, *labels):
    return "\t".join([str(i), "1", "1a", "fiction", "(", "(", "(", "("] + [s1, s2] + list(labels))

  _write(f"{d}/train.tsv", ["\t".join(cols + ["label1", "gold_label"]),
                            row(0, "The cat sat.", "A cat sat.", "entailment", "entailment"),
                            row(1, "The cat sat.", "A dog ran.", "neutral", "neutral")])
  dev_head = "\t".join(cols + [f"label{i}" for i in range(1, 6)] + ["gold_label"])
  _write(f"{d}/dev_matched.tsv", [dev_head, row(0, "It is sunny.", "It is raining.",
                                                *["contradiction"] * 6)])
  _write(f"{d}/dev_mismatched.tsv", [dev_head, row(0, "It is sunny.", "It is sunny.",
                                                   *["entailment"] * 6)])
  _write(f"{d}/test_matched.tsv", ["\t".join(cols), row(11, "The cat.", "The mat.")])
  task = glue.TASKS["mnli"]
  assert [e.label for e in glue.read_examples(task, d, "train")] == [1, 2]  # google's order
  assert glue.read_examples(task, d, "dev_matched")[0].label == 0
  assert glue.read_examples(task, d, "dev_mismatched")[0].label == 1
  test = glue.read_examples(task, d, "test_matched")
  path = glue.write_predictions(task, "test_matched", test, [2], str(tmp_path))
  assert path.endswith("MNLI-m.tsv") and open(path).read().splitlines()[1] == "11\tneutral"
  assert task.eval_splits == ("dev_matched", "dev_mismatched")


def test_stsb_regression(tmp_path, tokenizer):
  d = str(tmp_path)
  head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
  _write(f"{d}/dev.tsv", [head + "\tscore",
                          "0\tmain\tf\t2012\t1\tnone\tnone\tThe cat sat.\tA cat sat.\t4.250"])
  _write(f"{d}/test.tsv", [head, "0\tmain\tf\t2012\t1\tnone\tnone\tThe cat.\tA dog."])
  task = glue.TASKS["stsb"]
  assert task.is_regression and task.num_labels == 1
  dev = glue.read_examples(task, d, "dev")
  features, _ = glue.convert_examples(task, dev, tokenizer, 32)
  assert features["label_ids"].dtype == np.float32 and features["label_ids"][0] == 4.25
  test = glue.read_examples(task, d, "test")
  path = glue.write_predictions(task, "test", test, [3.14159], d)
  assert open(path).read() == "index\tprediction\n0\t3.142\n"


def test_custom_csv_and_jsonl(tmp_path, tokenizer):
  d = str(tmp_path)
  with open(f"{d}/train.csv", "w") as f:
    f.write('id,review,stars\n1,"The cat sat, then ran.",pos\n2,It is raining,neg\n')
  task = glue.custom_task("reviews", text_a="review", label="stars", labels=("neg", "pos"),
                          file_format="csv", train_file="train.csv", dev_file="train.csv")
  assert task.metrics == ("accuracy", "f1")
  ex = glue.read_examples(task, d, "train")
  assert [(e.text_a, e.label) for e in ex] == [("The cat sat, then ran.", 1),
                                               ("It is raining", 0)]
  with open(f"{d}/train.jsonl", "w") as f:
    f.write('{"q": "Is it raining?", "p": "It is sunny.", "y": 0.5}\n\n'
            '{"q": "The cat?", "p": "The mat.", "y": 2}\n')
  task = glue.custom_task("sim", text_a="q", text_b="p", label="y", labels=(),
                          file_format="jsonl", train_file="train.jsonl")
  ex = glue.read_examples(task, d, "train")
  assert [(e.text_b, e.label) for e in ex] == [("It is sunny.", 0.5), ("The mat.", 2.0)]
  features, _ = glue.convert_examples(task, ex, tokenizer, 16)
  assert features["segment_ids"][0].sum() == len(tokenizer.encode(["It is sunny."])[0]) + 1


def test_bad_inputs_name_file_and_line(tmp_path):
  d = str(tmp_path)
  task = glue.TASKS["rte"]
  head = "index\tsentence1\tsentence2\tlabel"
  _write(f"{d}/train.tsv", [head, "0\tA.\tB.\tentailment", "1\tA.\tB.\tcontradiction"])
  with pytest.raises(TaskDataError, match=r"train.tsv:3: label 'contradiction' is not in the "
                                          r"label set \['entailment', 'not_entailment'\]"):
    glue.read_examples(task, d, "train")
  _write(f"{d}/train.tsv", [head, "0\tA.\tB.\tentailment", "1\tA."])
  with pytest.raises(TaskDataError, match=r"train.tsv:3: expected at least 3 columns, found 2"):
    glue.read_examples(task, d, "train")
  _write(f"{d}/train.tsv", ["index\tsentence1\tlabel", "0\tA.\tentailment"])
  with pytest.raises(TaskDataError, match=r"train.tsv:1: no column 'sentence2' in the header"):
    glue.read_examples(task, d, "train")
  open(f"{d}/dev.tsv", "w").close()
  with pytest.raises(TaskDataError, match=r"dev.tsv: the file is empty"):
    glue.read_examples(task, d, "dev")
  _write(f"{d}/dev.tsv", [head])
  with pytest.raises(TaskDataError, match=r"dev.tsv: no examples after the header row"):
    glue.read_examples(task, d, "dev")
  with open(f"{d}/dev.tsv", "wb") as f:
    f.write(b"index\tsentence1\tsentence2\tlabel\n0\tcaf\xe9\tB\tentailment\n")
  with pytest.raises(TaskDataError, match=r"dev.tsv:2: not UTF-8"):
    glue.read_examples(task, d, "dev")
  with pytest.raises(TaskDataError, match=r"test.tsv: no such file"):
    glue.read_examples(task, d, "test")
  with open(f"{d}/x.jsonl", "w") as f:
    f.write('{"a": "x", "label": "1"}\n{"label": "1"}\n')
  custom = glue.custom_task("c", text_a="a", labels=("0", "1"), file_format="jsonl",
                            train_file="x.jsonl")
  with pytest.raises(TaskDataError, match=r"x.jsonl:2: missing field 'a'"):
    glue.read_examples(custom, d, "train")
  with pytest.raises(TaskDataError, match="pass labels="):
    glue.custom_task("c", text_a="a")


def test_tfds_path_through_mock_data(tokenizer):
  tfds = pytest.importorskip("tensorflow_datasets")
  with tfds.testing.mock_data(num_examples=5, policy=tfds.testing.MockPolicy.USE_CODE):
    task = glue.TASKS["mnli"]
    examples = glue.read_tfds_examples(task, "/nonexistent", "dev_mismatched")
    assert len(examples) == 5
    assert all(isinstance(e.text_a, str) and isinstance(e.text_b, str) for e in examples)
    assert all(e.label in (0, 1, 2) for e in examples)
    features, _ = glue.convert_examples(task, examples, tokenizer, 32)
    assert features["input_ids"].shape == (5, 32)
    stsb = glue.read_tfds_examples(glue.TASKS["stsb"], "/nonexistent", "train")
    assert all(isinstance(e.label, float) for e in stsb)
    test = glue.read_tfds_examples(glue.TASKS["cola"], "/nonexistent", "test")
    assert all(e.label is None and e.text_b is None for e in test)


def test_tfds_label_names_map_onto_tsv_labels():
  # TFDS orders MNLI entailment, neutral, contradiction; the TSV label set differs in order.
  mnli = glue.TASKS["mnli"]
  assert [mnli.labels.index(l) for l in mnli.tfds_labels] == [1, 2, 0]
  for name, task in glue.TASKS.items():
    if not task.is_regression:
      assert set(task.tfds_labels) == set(task.labels), name
