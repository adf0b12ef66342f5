"""CoNLL-2003 reading, first-piece labels, sentence windows and prediction round trips."""
import numpy as np
import pytest

from bert_jax.evaluation import metrics
from data_pipelines.tasks import ner
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O
"""


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("vocab"))
  # "blackburn" and "brussels" are not in the vocab: they split into letter pieces.
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(
      d, "eu rejects german call to boycott british lamb . peter 1996 - 08 22"))


def _write(tmp_path, name, text):
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return str(tmp_path)


def test_read_conll03(tmp_path):
  d = _write(tmp_path, "train.txt", CONLL)
  sentences = ner.read_examples(ner.TASKS["conll03"], d, "train")
  assert [s.words for s in sentences] == [
      ["EU", "rejects", "German", "call", "to", "boycott", "British", "lamb", "."],
      ["Peter", "Blackburn"], ["BRUSSELS", "1996-08-22"]]
  assert sentences[1].tags == ["B-PER", "I-PER"] and sentences[1].line == 13


def test_first_piece_labels_and_weights(tmp_path, tokenizer):
  task = ner.TASKS["conll03"]
  sentences = ner.read_examples(task, _write(tmp_path, "train.txt", CONLL), "train")
  features, stats = ner.convert_examples(task, sentences, tokenizer, 32)
  assert stats["sentences_split"] == 0 and stats["features"] == 3
  f = 1  # Peter Blackburn
  toks = tokenizer.id_to_token(features["input_ids"][f][:features["input_mask"][f].sum()])
  blackburn = tokenizer.encode(["Blackburn"])[0]
  assert len(blackburn) > 1
  assert toks == ["[CLS]", "peter"] + tokenizer.id_to_token(blackburn) + ["[SEP]"]
  weights = features["label_weights"][f]
  assert list(weights[:3]) == [0.0, 1.0, 1.0] and weights[3:].sum() == 0.0
  assert features["label_ids"][f][1] == task.labels.index("B-PER")
  assert features["label_ids"][f][2] == task.labels.index("I-PER")
  # Gold tags read back from the features are the file's tags.
  gold = ner.predictions_to_tags(task, sentences, features, features["label_ids"])
  assert gold == [s.tags for s in sentences]


def test_long_sentences_split_into_windows(tmp_path, tokenizer):
  task = ner.TASKS["conll03"]
  sentences = ner.read_examples(task, _write(tmp_path, "train.txt", CONLL), "train")
  features, stats = ner.convert_examples(task, sentences, tokenizer, 6)  # 4 pieces a window
  assert stats["sentences_split"] >= 2
  assert (features["label_weights"].sum() == sum(len(s.words) for s in sentences))
  # Every word is predicted once and in order: a round trip of the gold ids.
  gold = ner.predictions_to_tags(task, sentences, features, features["label_ids"])
  assert gold == [s.tags for s in sentences]
  assert stats["words_truncated"] >= 1  # "1996-08-22" alone is more than 4 pieces


def test_predictions_file_and_entity_f1(tmp_path, tokenizer):
  task = ner.TASKS["conll03"]
  sentences = ner.read_examples(task, _write(tmp_path, "test.txt", CONLL), "test")
  features, _ = ner.convert_examples(task, sentences, tokenizer, 32)
  predicted = features["label_ids"].copy()
  predicted[1, 1] = task.labels.index("B-ORG")  # Peter Blackburn: PER -> ORG/PER mess
  tags = ner.predictions_to_tags(task, sentences, features, predicted)
  scores = metrics.entity_scores([s.tags for s in sentences], tags)
  # Gold: ORG, MISC, MISC, PER, LOC = 5; predicted ORG, MISC, MISC, ORG(Peter), PER(Blackburn),
  # LOC = 6 with 4 right.
  assert scores["precision"] == pytest.approx(4 / 6) and scores["recall"] == pytest.approx(4 / 5)
  path = ner.write_predictions(str(tmp_path / "out.txt"), sentences, tags)
  lines = open(path).read().split("\n")
  assert lines[9] == "" and lines[10] == "Peter B-PER B-ORG" and lines[11] == "Blackburn I-PER I-PER"


def test_unlabelled_file(tmp_path, tokenizer):
  d = _write(tmp_path, "test.txt", "EU\nrejects\n\nPeter\n")
  task = ner.TASKS["conll03"]
  sentences = ner.read_examples(task, d, "test")
  assert sentences[0].tags is None
  features, _ = ner.convert_examples(task, sentences, tokenizer, 16)
  tags = ner.predictions_to_tags(task, sentences, features, np.zeros_like(features["label_ids"]))
  path = ner.write_predictions(str(tmp_path / "p.txt"), sentences, tags)
  assert open(path).read() == "EU O\nrejects O\n\nPeter O\n\n"


def test_bad_inputs(tmp_path):
  task = ner.TASKS["conll03"]
  d = _write(tmp_path, "train.txt", "EU NNP B-NP B-ORG\nrejects VBZ B-VP B-ORGANISATION\n")
  with pytest.raises(TaskDataError, match=r"train.txt:2: tag 'B-ORGANISATION' is not in the "
                                          r"label set"):
    ner.read_examples(task, d, "train")
  d = _write(tmp_path, "train.txt", "EU NNP B-NP B-ORG\nrejects\n")
  with pytest.raises(TaskDataError, match=r"train.txt:2: 1 column\(s\) where earlier lines"):
    ner.read_examples(task, d, "train")
  d = _write(tmp_path, "train.txt", "-DOCSTART- -X- -X- O\n\n")
  with pytest.raises(TaskDataError, match=r"train.txt: no sentences"):
    ner.read_examples(task, d, "train")
  d = _write(tmp_path, "train.txt", "")
  with pytest.raises(TaskDataError, match=r"train.txt: the file is empty"):
    ner.read_examples(task, d, "train")
  with pytest.raises(TaskDataError, match=r"valid.txt: no such file"):
    ner.read_examples(task, d, "dev")
  with pytest.raises(TaskDataError, match="lack 'O'"):
    ner.custom_task("x", ["B-A", "I-A"])
