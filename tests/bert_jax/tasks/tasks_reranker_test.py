"""The reranker task type (bert_jax/tasks/reranker.py): config -> task, sentence-transformers'
CrossEncoder data forms -> [N, S, T] pairs, mnrl's in-batch negatives, the evaluation's lists,
and each bad input as one line before compute (a checkpoint of the other retrieval type both
ways, missing columns, BCE labels outside [0, 1], a dev query without a relevant document)."""

import json
import os

import numpy as np
import pytest

from bert_jax import tasks
from bert_jax.configs import finetune as finetune_config
from bert_jax.convert import writing
from bert_jax.models import model as model_lib
from bert_jax.tasks import reranker
from bert_jax.training import finetune_tasks as ft
from data_pipelines.tasks.common import TaskDataError
from data_pipelines.tokenizers import tokenization
from tests.testlib import tasks_testlib

TEXT = "what is a cat the cat sat on the mat a dog ran in the park how do birds fly with wings"


def _write(path, rows):
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _config(directory, **reranker_fields):
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.data_dir, c.max_seq_length = "reranker", str(directory), 16
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  for k, v in reranker_fields.items():
    setattr(c.reranker, k, v)
  return c


@pytest.fixture
def tokenizer(tmp_path):
  vocab = tasks_testlib.write_vocab(str(tmp_path), TEXT)
  return tokenization.get_tokenizer(vocab_file=vocab, do_lower_case=True)


TRIPLETS = [{"query": "what is a cat", "positive": "the cat sat on the mat",
             "negative_1": "a dog ran in the park"},
            {"query": "how do birds fly", "positive": "with wings",
             "negative_1": "the cat sat on the mat"},
            {"query": "a dog", "positive": "a dog ran in the park", "negative_1": "with wings"}]
SCORED = [{"query": "what is a cat", "document": "the cat sat on the mat", "label": 1},
          {"query": "what is a cat", "document": "a dog ran in the park", "label": 0},
          {"query": "how do birds fly", "document": "with wings", "label": 1}]


def test_rows_are_pairs_of_the_query_and_each_candidate(tmp_path, tokenizer):
  _write(tmp_path / "train.jsonl", TRIPLETS)
  _write(tmp_path / "dev.jsonl", TRIPLETS)
  c = _config(tmp_path, loss="bce")
  task = ft.build_task(c)
  assert task.type == "reranker" and tasks.of(task).metric(task) == "ndcg@10"
  train = ft.load_split(task, "train", tokenizer, c, True)
  f = train.features
  assert f["input_ids"].shape == (3, 2, 16) and f["labels"].tolist() == [[1, 0]] * 3
  ids = f["input_ids"][0, 0][f["input_mask"][0, 0] > 0]
  tokens = tokenizer.id_to_token(ids.tolist())
  assert tokens == ["[CLS]", "what", "is", "a", "cat", "[SEP]", "the", "cat", "sat", "on", "the",
                    "mat", "[SEP]"]
  assert f["segment_ids"][0, 0][:13].tolist() == [0] * 6 + [1] * 7


def test_scored_pairs_are_one_pair_a_row_for_bce_and_lists_for_listnet(tmp_path, tokenizer):
  _write(tmp_path / "train.jsonl", SCORED)
  _write(tmp_path / "dev.jsonl", SCORED)
  bce = ft.load_split(ft.build_task(_config(tmp_path)), "train", tokenizer, _config(tmp_path), True)
  assert bce.features["input_ids"].shape[:2] == (3, 1)
  assert bce.features["labels"][:, 0].tolist() == [1, 0, 1]
  c = _config(tmp_path, loss="listnet")
  lists = ft.load_split(ft.build_task(c), "train", tokenizer, c, True)
  assert lists.features["labels"].tolist() == [[1, 0], [1, 0]]
  assert lists.features["candidate_mask"].tolist() == [[1, 1], [1, 0]]
  dev = ft.load_split(ft.build_task(c), "dev", tokenizer, c, False)
  assert [len(ds) for _, ds, _ in dev.examples] == [2, 1]


def test_mnrl_adds_other_rows_documents_as_negatives(tmp_path, tokenizer):
  _write(tmp_path / "train.jsonl", TRIPLETS)
  _write(tmp_path / "dev.jsonl", TRIPLETS)
  c = _config(tmp_path, loss="mnrl", in_batch_negatives=2)
  train = ft.load_split(ft.build_task(c), "train", tokenizer, c, True)
  assert train.features["input_ids"].shape[:2] == (3, 4)
  for query, docs, labels in train.examples:
    own = next(r for r in TRIPLETS if r["query"] == query)
    assert docs[:2] == [own["positive"], own["negative_1"]] and labels == [1, 0, 0, 0]
    assert not set(docs[2:]) & {own["positive"], own["negative_1"]}
    others = {t for r in TRIPLETS if r is not own for t in (r["positive"], r["negative_1"])}
    assert set(docs[2:]) <= others


def test_evaluation_is_the_retrieval_metrics_of_each_query_s_list(tmp_path, tokenizer):
  _write(tmp_path / "train.jsonl", TRIPLETS)
  _write(tmp_path / "dev.jsonl", SCORED)
  c = _config(tmp_path)
  task = ft.build_task(c)
  dev = ft.load_split(task, "dev", tokenizer, c, False)
  perfect = ft.evaluate(task, dev, {"scores": np.array([[2.0, 1.0], [0.5, -9.0]])}, tokenizer, c)
  assert perfect["ndcg@10"] == pytest.approx(1.0) and perfect["mrr@10"] == pytest.approx(1.0)
  wrong = ft.evaluate(task, dev, {"scores": np.array([[1.0, 2.0], [0.5, 9.0]])}, tokenizer, c)
  assert wrong["mrr@10"] == pytest.approx((0.5 + 1.0) / 2)   # the padding slot never ranks


@pytest.mark.parametrize("rows,fields,split,match", [
    ([{"query": "q", "label": 1}] * 3, {}, "train", r"train.jsonl: no column 'positive'; found \['query', 'label'\]: name the columns anchor "
     r"\(or query\), positive \(or document\), negative_1"),
    ([{"query": "q", "document": "d"}] * 3, {}, "train",
     r"train.jsonl: \(query, document\) pairs without a label column: every label would be 1"),
    ([dict(r, label=l) for r, l in zip(SCORED, (2, 0, 3))], {}, "train",
     r"train.jsonl: 2 labels outside \[0, 1\] \(e.g. 2\); config.reranker.loss=bce reads a "
     r"probability"),
    (SCORED, dict(loss="mnrl"), "train",
     r"scored pairs \(a label column\), but config.reranker.loss=mnrl reads rows"),
    ([dict(r, label=0) if r["query"].startswith("how") else r for r in SCORED], {}, "dev",
     r"dev.jsonl: 1 of 2 queries have no relevant document \(label > 0\) among their "
     r"candidates \(e.g. 'how do birds fly'\)"),
], ids=["missing_document_column", "no_label_column", "bce_labels_outside_0_1",
        "mnrl_on_scored_pairs", "dev_query_without_relevant"])
def test_bad_data_is_one_line_before_compute(tmp_path, tokenizer, rows, fields, split, match):
  _write(tmp_path / "train.jsonl", rows if split == "train" else SCORED)
  _write(tmp_path / "dev.jsonl", rows if split == "dev" else SCORED)
  c = _config(tmp_path, **fields)
  with pytest.raises(TaskDataError, match=match) as e:
    ft.load_split(ft.build_task(c), split, tokenizer, c, split == "train")
  assert "\n" not in str(e.value)


def test_bad_settings_and_constant_labels_are_one_line(tmp_path, tokenizer):
  with pytest.raises(TaskDataError, match=r"config.reranker.loss='lambda'; use one of bce, mnrl"):
    ft.build_task(_config(tmp_path, loss="lambda"))
  _write(tmp_path / "train.jsonl", [dict(r, label=1) for r in SCORED])
  c = _config(tmp_path)
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  with pytest.raises(TaskDataError, match=r"all 3 training labels are 1: .*learns a constant"):
    ft.check_can_learn(task, train, tokenizer, dict_config(c, batch_size=2))


def dict_config(c, **fields):
  c = c.copy_and_resolve_references()
  for k, v in fields.items():
    setattr(c, k, v)
  return c


def _export(directory, vocab, **meta):
  """A params export whose bert_config.json records `meta` (the arrays do not matter here)."""
  config = model_lib.get_bert_config("tiny", vocab_size=64)
  writing.write_export(str(directory), {"bert": {"w": np.zeros(2, np.float32)}}, config,
                       dict(meta, _vocab_path=vocab, do_lower_case=True))
  return str(directory)


@pytest.mark.parametrize("run_type,recorded,match", [
    ("embedding", dict(task_type="reranker"),
     r"is a cross-encoder \(reranker\) \(task_type 'reranker'\), but this run trains a "
     r"bi-encoder \(sentence embeddings\) \(custom.type=embedding\); start from a pre-trained "
     r"encoder .* or set --config.custom.type=reranker."),
    ("reranker", dict(task_type="embedding"),
     r"is a bi-encoder \(sentence embeddings\) \(task_type 'embedding'\), but this run trains a "
     r"cross-encoder"),
    ("reranker", dict(sentence_embedding={"pooling": "mean"}), r"is a bi-encoder"),
], ids=["reranker_export_to_embedding", "embedding_export_to_reranker",
        "st_import_to_reranker"])
def test_a_checkpoint_of_the_other_retrieval_type_is_one_line(tmp_path, run_type, recorded, match):
  vocab = tasks_testlib.write_vocab(str(tmp_path), TEXT)
  c = _config(tmp_path)
  c.custom.type, c.init_checkpoint = run_type, _export(tmp_path / "ckpt", vocab, **recorded)
  with pytest.raises(TaskDataError, match=match) as e:
    ft.build_task(c)
  assert "\n" not in str(e.value)


def test_a_cross_encoder_folder_to_an_embedding_run_is_one_line(tmp_path):
  """What CrossEncoder.save writes beside the weights names it (config_sentence_transformers.json
  model_type CrossEncoder; tests/bert_jax/convert/cross_encoder_test.py reads a real one)."""
  (tmp_path / "ce").mkdir()
  (tmp_path / "ce" / "modules.json").write_text("[]")
  (tmp_path / "ce" / "config_sentence_transformers.json").write_text(json.dumps(
      {"model_type": "CrossEncoder"}))
  c = _config(tmp_path)
  c.custom.type, c.init_checkpoint = "embedding", str(tmp_path / "ce")
  with pytest.raises(TaskDataError, match=r"is a cross-encoder \(reranker\)"):
    ft.build_task(c)
  c.custom.type = "reranker"   # the same folder starts a reranker
  assert ft.build_task(c).type == "reranker"


def test_packed_rows_are_refused_in_one_line(tmp_path, tokenizer):
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  _write(tmp_path / "train.jsonl", TRIPLETS)
  c = _config(tmp_path)
  c.pack = True
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  with pytest.raises(finetune.ConfigError, match=r"config.pack=True: .*task custom is reranker"):
    finetune.pack_train(train, task, c)
  assert os.path.isfile(tmp_path / "train.jsonl")


def test_help_lists_the_reranker_fields_with_their_comments():
  """`python -m bert_jax.finetune --help` is generated from configs/finetune.py's comments
  (cli.config_help): the reranker block's fields carry theirs."""
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  text = cli.config_help(finetune_config.__file__, "custom")
  lines = {l.split()[0]: l for l in text.splitlines() if l.strip().startswith("--config.reranker.")}
  assert set(lines) == {"--config.reranker.loss='bce'", "--config.reranker.scale=10.0",
                        "--config.reranker.in_batch_negatives=4",
                        "--config.reranker.hard_negatives=-1"}
  assert "bce: BinaryCrossEntropyLoss" in lines["--config.reranker.loss='bce'"]
  assert "theirs: num_negatives=4" in lines["--config.reranker.in_batch_negatives=4"]
  assert "reranker (a cross-encoder" in next(l for l in text.splitlines()
                                             if "--config.custom.type=" in l)
