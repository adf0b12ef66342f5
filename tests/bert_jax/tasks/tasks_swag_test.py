"""SWAG CSV reading, four-choice features, errors and the prediction file."""
import numpy as np
import pytest

from data_pipelines.tasks import swag
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

HEADER = ",video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0,ending1,ending2,ending3,label"
ROWS = [
    '0,lsmdc3001,19,"Students lower their eyes. She","Students lower their eyes.",She,gold,'
    'looks up.,"smiles, then waves.",runs away.,sits down.,1',
    '1,anetv_1,7,A man sits. He,A man sits.,He,gen,stands.,sleeps.,eats.,reads a book.,3',
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("vocab"))
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(
      d, "students lower their eyes . she looks up smiles , then waves runs away sits down "
         "a man he stands sleeps eats reads book"))


def _write(tmp_path, name, lines):
  (tmp_path / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
  return str(tmp_path)


def test_read_and_features(tmp_path, tokenizer):
  task = swag.TASKS["swag"]
  d = _write(tmp_path, "train.csv", [HEADER] + ROWS)
  examples = swag.read_examples(task, d, "train")
  assert examples[0].context == "Students lower their eyes." and examples[0].start == "She"
  assert examples[0].endings[1] == "smiles, then waves." and examples[0].label == 1
  features, truncated = swag.convert_examples(task, examples, tokenizer, 16)
  assert features["input_ids"].shape == (2, 4, 16) and truncated == 0
  v = tokenizer.vocab
  ctx = tokenizer.encode(["Students lower their eyes."])[0]
  end = tokenizer.encode(["She smiles, then waves."])[0]
  want = [v.cls_id] + ctx + [v.sep_id] + end + [v.sep_id]
  assert list(features["input_ids"][0, 1, :len(want)]) == want
  assert list(features["segment_ids"][0, 1, :len(want)]) == [0] * (len(ctx) + 2) + [1] * (
      len(end) + 1)
  assert features["label_ids"].tolist() == [1, 3]
  # Truncation takes from the longer side, per choice.
  features, truncated = swag.convert_examples(task, examples, tokenizer, 8)
  assert truncated > 0 and features["input_mask"].sum(-1).max() == 8


def test_test_split_and_predictions(tmp_path, tokenizer):
  task = swag.TASKS["swag"]
  header = HEADER.rsplit(",", 1)[0]  # no label column
  d = _write(tmp_path, "test.csv", [header] + [r.rsplit(",", 1)[0] for r in ROWS])
  examples = swag.read_examples(task, d, "test")
  assert [e.label for e in examples] == [None, None]
  path = swag.write_predictions(task, "test", examples, np.array([2, 0]), d)
  assert open(path).read() == "pred\n2\n0\n"


def test_bad_inputs(tmp_path):
  task = swag.TASKS["swag"]
  d = _write(tmp_path, "train.csv", [HEADER, ROWS[0].rsplit(",", 1)[0] + ",4"])
  with pytest.raises(TaskDataError, match=r"train.csv:2: label '4' is not in the label set "
                                          r"\['0', '1', '2', '3'\]"):
    swag.read_examples(task, d, "train")
  d = _write(tmp_path, "train.csv", [HEADER.replace("ending3", "endingX")] + ROWS)
  with pytest.raises(TaskDataError, match=r"train.csv:1: no column 'ending3'"):
    swag.read_examples(task, d, "train")
  d = _write(tmp_path, "val.csv", [HEADER.rsplit(",", 1)[0]] + ROWS)
  with pytest.raises(TaskDataError, match=r"val.csv:1: no column 'label'.*needs labels"):
    swag.read_examples(task, d, "dev")
  d = _write(tmp_path, "train.csv", [HEADER, "0,v,1,s,only,two"])
  with pytest.raises(TaskDataError, match=r"train.csv:2: expected at least \d+ columns, found 6"):
    swag.read_examples(task, d, "train")
  d = _write(tmp_path, "train.csv", [HEADER])
  with pytest.raises(TaskDataError, match=r"train.csv: no examples after the header row"):
    swag.read_examples(task, d, "train")


def test_registry_lists_every_task_type():
  from data_pipelines import tasks
  assert {t.type for t in tasks.TASKS.values()} == {
      "classification", "regression", "span", "tagging", "multiple_choice"}
  assert tasks.get_task("squad_v2").version_2_with_negative
  with pytest.raises(TaskDataError, match="unknown task 'mrcp'"):
    tasks.get_task("mrcp")
