"""A run that cannot learn says so before compute (issue 49): each task type's cannot_learn
(bert_jax/tasks/registry.py) on tiny train splits read as the loop reads them, the loop's own
check of a train split smaller than one batch (finetune_tasks.check_can_learn), and one run of
finetune.finetune stopped by it before the model is built."""
# pylint: disable=protected-access  (tasks_embedding_test's and finetune_test's data helpers)

import json
import os

import numpy as np
import pytest

from bert_jax import tasks
from bert_jax.configs import finetune as finetune_config
from bert_jax.training import finetune_tasks as ft
from data_pipelines.tasks.common import TaskDataError
from tests.bert_jax.tasks import tasks_embedding_test as tet
from tests.testlib import tasks_testlib

WORDS = tet.WORDS


def _tokenizer(directory, words=WORDS):
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(directory),
                                                                    " ".join(words)))


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _check(config, directory):
  """(the train split as the loop loads it, check_can_learn's warnings)."""
  task = ft.build_task(config)
  train = ft.load_split(task, "train", _tokenizer(directory), config, True)
  return train, ft.check_can_learn(task, train, _tokenizer(directory), config)


def _pairs(n, seed=0):
  """n rows of distinct 3-word anchors and positives (tasks_embedding_test's data, no negative)."""
  rng = np.random.default_rng(seed)
  return [{"anchor": " ".join(rng.choice(WORDS, 3, replace=False)),
           "positive": " ".join(rng.choice(WORDS, 3, replace=False)) + f" {WORDS[i % 14]}"}
          for i in range(n)]


# ---------------------------------------------------------------------------------------------
# Embedding: InfoNCE's constant losses.
# ---------------------------------------------------------------------------------------------
def test_good_pairs_and_triplets_pass_without_a_warning(tmp_path):
  tet._data(tmp_path)
  _, warnings = _check(tet._config(tmp_path), tmp_path)
  assert warnings == []


def test_one_pair_a_batch_and_no_hard_negative_is_refused(tmp_path):
  """Seen on main: a one-row train file, and batch_size=1: the positive is the only candidate,
  loss 0 and gradient 0 at every step."""
  _jsonl(tmp_path / "train.jsonl", _pairs(1))
  c = tet._config(tmp_path)
  with pytest.raises(TaskDataError, match=r"train.jsonl: 1 row with no hard negatives: each "
                                          r"batch is one pair, whose positive is InfoNCE's only "
                                          r"candidate \(loss 0, gradient 0 at every step\)"):
    _check(c, tmp_path)
  _jsonl(tmp_path / "train.jsonl", _pairs(24))
  c.batch_size = 1
  with pytest.raises(TaskDataError, match=r"^config.batch_size=1 on .*train.jsonl's rows with "
                                          r"no hard negatives: each batch is one pair"):
    _check(c, tmp_path)
  # A hard negative is a second candidate: one row a batch learns.
  _jsonl(tmp_path / "train.jsonl", [dict(r, negative=f"{r['anchor']} bad") for r in _pairs(24)])
  assert _check(c, tmp_path)[1] == []


def test_rows_whose_texts_are_all_the_same_are_refused(tmp_path):
  c = tet._config(tmp_path)
  _jsonl(tmp_path / "train.jsonl", [{"anchor": "the cat", "positive": "a cat sat"}] * 16)
  with pytest.raises(TaskDataError, match=r"train.jsonl: every positive text is 'a cat sat': "
                                          r"every in-batch negative is the positive, every logit "
                                          r"equal, so the loss is log\(candidates\) and its "
                                          r"gradient 0; check the file's positive column.$"):
    _check(c, tmp_path)
  # With hard negatives: every candidate the same text too.
  _jsonl(tmp_path / "train.jsonl", [{"anchor": f"q {w}", "positive": "a", "negative": "a"}
                                    for w in WORDS])
  with pytest.raises(TaskDataError, match=r"every positive and negative text is 'a'.*check the "
                                          r"file's positive and negative columns"):
    _check(c, tmp_path)
  # One anchor for every row: no query tells one positive from another.
  _jsonl(tmp_path / "train.jsonl", [dict(r, anchor="the cat") for r in _pairs(16)])
  with pytest.raises(TaskDataError, match=r"every anchor text is 'the cat': no query can be told "
                                          r"from another"):
    _check(c, tmp_path)


def test_a_prompt_that_leaves_no_room_for_the_text_is_refused(tmp_path):
  """Seen on main: every anchor became the prompt alone at max_seq_length (dev nDCG@10 0.34 ->
  0.08). max_seq_length 16 leaves 14 tokens for a text; the prompt is 14 words."""
  _jsonl(tmp_path / "train.jsonl", _pairs(16))
  prompt = " ".join(WORDS) + " "
  c = tet._config(tmp_path, query_prompt=prompt)
  with pytest.raises(TaskDataError, match=r"config.embedding.query_prompt='the a .* bad ' is 14 "
                                          r"tokens and max_seq_length=16 leaves 14 for a text, so "
                                          r"every anchor is cut to the prompt alone: no query can "
                                          r"be told from another.*raise --config.max_seq_length "
                                          r"above 16 or shorten the prompt.$"):
    _check(c, tmp_path)
  c = tet._config(tmp_path, document_prompt=prompt)
  with pytest.raises(TaskDataError, match=r"document_prompt=.* every positive is cut to the "
                                          r"prompt alone: every in-batch negative is the "
                                          r"positive"):
    _check(c, tmp_path)
  c.max_seq_length = 20   # 4 tokens of text: they differ, the run learns
  assert _check(c, tmp_path)[1] == []
  # No prompt, but texts alike for all 14 tokens max_seq_length keeps.
  _jsonl(tmp_path / "train.jsonl", [dict(r, anchor=prompt + r["anchor"]) for r in _pairs(16)])
  c = tet._config(tmp_path)
  with pytest.raises(TaskDataError, match=r"every anchor text begins with the same 14 tokens, "
                                          r"all that max_seq_length=16 keeps of it"):
    _check(c, tmp_path)


def test_a_scale_that_is_a_temperature_is_refused_a_low_one_warned(tmp_path):
  """Seen on main: scale=0.05, a loss of ~log(candidates) that never moves."""
  tet._data(tmp_path)
  with pytest.raises(TaskDataError, match=r"^config.embedding.scale=0.05 is a temperature: "
                                          r"InfoNCE's logits are scale x cosine, within \+-0.05.*"
                                          r"scale = 1 / temperature: pass "
                                          r"--config.embedding.scale=20 "):
    _check(tet._config(tmp_path, scale=0.05), tmp_path)
  _, warnings = _check(tet._config(tmp_path, scale=2.0), tmp_path)
  assert warnings == ["config.embedding.scale=2: the logits (scale x cosine) span only +-2, so "
                      "the loss moves little (scale = 1 / temperature; sentence-transformers' "
                      "20)"]


def test_batches_that_learn_less_than_asked_are_warned(tmp_path):
  c = tet._config(tmp_path)
  _jsonl(tmp_path / "train.jsonl", _pairs(17))
  (warning,) = _check(c, tmp_path)[1]
  assert warning.endswith("train.jsonl: 17 rows in batches of 8 leave each epoch a last batch of "
                          "one pair and no hard negative, whose loss and gradient are 0; drop a "
                          "row or change --config.batch_size")
  _jsonl(tmp_path / "train.jsonl", [dict(r, positive=WORDS[i % 3])
                                    for i, r in enumerate(_pairs(16))])
  (warning,) = _check(c, tmp_path)[1]
  assert "train.jsonl: 3 distinct positives for batches of 8 rows: every batch holds a positive " \
         "twice" in warning and warning.endswith("--config.batch_size=3 or fewer avoids it")
  rows = [dict(r, negative=r["positive"] if i < 2 else "bad") for i, r in enumerate(_pairs(16))]
  _jsonl(tmp_path / "train.jsonl", rows)
  (warning,) = _check(c, tmp_path)[1]
  assert "train.jsonl: 2 rows hold a hard negative equal to their positive" in warning


# ---------------------------------------------------------------------------------------------
# Classification, regression, tagging, span QA: one label value, no answer.
# ---------------------------------------------------------------------------------------------
def _glue(task, directory, **overrides):
  c = finetune_config.get_config(f"{task},runlocal")
  c.data_dir, c.max_seq_length = str(directory), 32
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _tsv(path, header, rows):
  path.write_text("\n".join([header] + rows) + "\n", encoding="utf-8")


def test_a_classifier_whose_train_split_has_one_label_is_refused(tmp_path):
  rows = [f"{' '.join(WORDS[i:i + 3])}\t1" for i in range(8)]
  _tsv(tmp_path / "train.tsv", "sentence\tlabel", rows)
  with pytest.raises(TaskDataError, match=r"train.tsv: all 8 training examples have label '1': a "
                                          r"classifier learns only to predict '1', nothing of the "
                                          r"text; check the label column, or shuffle a file "
                                          r"sorted by label"):
    _check(_glue("glue_sst2", tmp_path), tmp_path)
  # config.max_train_examples cut a file sorted by label: the error names the cut.
  _tsv(tmp_path / "train.tsv", "sentence\tlabel", rows + [f"{WORDS[i]}\t0" for i in range(8)])
  with pytest.raises(TaskDataError, match=r"train.tsv \(its first 8 examples: "
                                          r"config.max_train_examples=8\): all 8 training"):
    _check(_glue("glue_sst2", tmp_path, max_train_examples=8), tmp_path)
  assert _check(_glue("glue_sst2", tmp_path), tmp_path)[1] == []
  # A class no training example has: a warning (of 3 classes, 'contradiction' is never seen).
  _tsv(tmp_path / "train.tsv", "sentence1\tsentence2\tgold_label",
       [f"{WORDS[i]}\t{WORDS[i + 1]}\t{('entailment', 'neutral')[i % 2]}" for i in range(8)])
  assert _check(_glue("glue_mnli", tmp_path), tmp_path)[1] == [
      f"{tmp_path}/train.tsv: no training example has label 'contradiction' (of 3): the "
      "classifier will hardly ever predict it"]
  _tsv(tmp_path / "train.tsv", "sentence\tlabel", rows + [f"{WORDS[i]}\t0" for i in range(8)])
  # A distillation teacher's soft labels still tell the classes apart: a warning.
  c = _glue("glue_sst2", tmp_path, max_train_examples=8, distill_teacher="teacher")
  assert _check(c, tmp_path)[1] == [
      "all 8 training examples have label '1': only the distillation teacher's soft labels "
      "(distill_alpha=0.5) tell the classes apart"]


def test_a_custom_classifier_of_one_class_is_refused(tmp_path):
  c = _glue("custom", tmp_path)
  c.custom.labels = ("pos",)
  with pytest.raises(TaskDataError, match=r"config.custom.labels=\('pos',\): one class; a softmax "
                                          r"over one class is certain of it \(loss 0 and gradient "
                                          r"0 on every example\)"):
    ft.build_task(c)


def test_a_regression_whose_scores_are_all_the_same_is_refused(tmp_path):
  rows = [f"{' '.join(WORDS[i:i + 3])}\t{' '.join(WORDS[i + 1:i + 4])}\t2.5" for i in range(8)]
  _tsv(tmp_path / "train.tsv", "sentence1\tsentence2\tscore", rows)
  with pytest.raises(TaskDataError, match=r"train.tsv: all 8 training scores are 2.5: squared "
                                          r"error learns only that constant"):
    _check(_glue("glue_stsb", tmp_path), tmp_path)


def test_a_tagger_whose_words_all_have_one_tag_is_refused(tmp_path):
  lines = ["-DOCSTART- -X- -X- O", ""]
  for who, city in [("John", "Paris"), ("Mary", "Rome")] * 4:
    lines += [f"{who} NNP B-NP O", "went VBD O O", f"{city} NNP B-NP O", ""]
  _tsv(tmp_path / "train.txt", lines[0], lines[1:])
  words = WORDS + ["john", "mary", "paris", "rome", "went"]
  c = _glue("conll03", tmp_path)
  task = ft.build_task(c)
  train = ft.load_split(task, "train", _tokenizer(tmp_path, words), c, True)
  with pytest.raises(TaskDataError, match=r"train.txt: all 24 training words are tagged 'O': a "
                                          r"tagger learns only to predict 'O'"):
    ft.check_can_learn(task, train, None, c)


def _squad(directory, name, impossible):
  articles = []
  for i, (who, city) in enumerate([("john", "paris"), ("mary", "rome")] * 4):
    context = f"the cat sat . {who} went to {city} and {city} and {city} . the end ."
    answer = f"{city} and {city} and {city}"
    qa = {"id": f"q{i}", "question": f"where did {who} go", "is_impossible": impossible,
          "answers": [] if impossible else [{"text": answer,
                                             "answer_start": context.index(answer)}]}
    articles.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": [qa]}]})
  (directory / name).write_text(json.dumps({"version": "x", "data": articles}), encoding="utf-8")


def test_span_qa_whose_windows_hold_no_answer_is_refused(tmp_path):
  words = WORDS + ["john", "mary", "paris", "rome", "went", "to", "and", "where", "did", "go",
                   "end", "."]
  tokenizer = _tokenizer(tmp_path, words)
  _squad(tmp_path, "train-v2.0.json", impossible=True)
  c = _glue("squad_v2", tmp_path, max_seq_length=48)
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  with pytest.raises(TaskDataError, match=r"train-v2.0.json: all 8 training questions are "
                                          r"unanswerable \(is_impossible\): every window's answer "
                                          r"is \[CLS\]"):
    ft.check_can_learn(task, train, tokenizer, c)
  # SQuAD 1.1: a 5-piece answer in windows of 4 context pieces (11 - 4 question pieces - 3).
  _squad(tmp_path, "train-v1.1.json", impossible=False)
  c = _glue("squad_v1", tmp_path, max_seq_length=11, max_query_length=4, doc_stride=2)
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  with pytest.raises(TaskDataError, match=r"train-v1.1.json: none of the \d+ training windows "
                                          r"holds its answer.*raise --config.max_seq_length=11, "
                                          r"or lower --config.doc_stride=2"):
    ft.check_can_learn(task, train, tokenizer, c)
  c.max_seq_length = 32
  train = ft.load_split(task, "train", tokenizer, c, True)
  assert ft.check_can_learn(task, train, tokenizer, c) == []


# ---------------------------------------------------------------------------------------------
# The loop: any task type, a train split smaller than one batch; the hook before compute.
# ---------------------------------------------------------------------------------------------
def test_a_train_split_smaller_than_one_batch_is_refused(tmp_path):
  """Seen on main: '0 batches of 512 + 1 of 160'; docs/finetuning.md promised an error."""
  rows = [f"{' '.join(WORDS[i:i + 3])}\t{i % 2}" for i in range(5)]
  _tsv(tmp_path / "train.tsv", "sentence\tlabel", rows)
  with pytest.raises(TaskDataError, match=r"train.tsv: 5 training sequences, fewer than one batch "
                                          r"\(config.batch_size=8\): every step would be the same "
                                          r"5 rows and 3 of padding; set --config.batch_size=5 or "
                                          r"less"):
    _check(_glue("glue_sst2", tmp_path), tmp_path)
  assert _check(_glue("glue_sst2", tmp_path, batch_size=5), tmp_path)[1] == []
  _jsonl(tmp_path / "train.jsonl", _pairs(5))
  with pytest.raises(TaskDataError, match=r"train.jsonl: 5 training sequences, fewer than one"):
    _check(tet._config(tmp_path), tmp_path)


def test_every_builtin_type_declares_its_check():
  for name in ("classification", "regression", "tagging", "span", "embedding"):
    assert tasks.get(name).cannot_learn is not None, name


@pytest.mark.slow
def test_finetune_stops_a_run_that_cannot_learn_before_the_model(tmp_path, capsys):
  """Through the loop: a one-row embedding train file is one line before the mesh and the model
  (no TensorBoard events, no export); on main it trained 'loss 0.0000' to the end."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_registry_test  # pylint: disable=g-import-not-at-top
  pretrained = tasks_registry_test._pretrained(tmp_path / "ckpt", finetune_test.WORDS)
  data = tmp_path / "data"
  data.mkdir()
  tet._data(data, n_train=1, n_dev=4)
  c = finetune_test._config("custom", pretrained, data, max_seq_length=16)
  c.custom.type, c.custom.train_file, c.custom.dev_file = "embedding", "train.jsonl", "dev.jsonl"
  _jsonl(data / "train.jsonl", _pairs(1))
  workdir = tmp_path / "run"
  with pytest.raises(TaskDataError, match=r"train.jsonl: 1 row with no hard negatives"):
    finetune.finetune(c, str(workdir))
  printed = capsys.readouterr().out
  assert "custom/train: 1 examples" in printed and "sequences per epoch" not in printed
  assert not os.path.exists(workdir / "tensorboard") and not list(workdir.glob("best_epoch*"))
