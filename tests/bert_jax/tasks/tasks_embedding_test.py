"""The embedding task type (bert_jax/tasks/embedding.py): config -> task with one-line errors,
pairs/triplets -> [N, S, T] features, the loss is contrastive.info_nce on the pooled vectors,
the evaluation's qrels and STS branch, and (slow) a contrastive fine-tune end to end."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.objectives import contrastive
from bert_jax.training import finetune_tasks as ft
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax import tasks
from bert_jax.configs import finetune as finetune_config
from bert_jax.tasks import embedding
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

WORDS = "the a cat dog man woman sat ran saw park mat house good bad".split()


def _config(data_dir, **embedding_fields):
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.data_dir, c.max_seq_length = "embedding", str(data_dir), 16
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  for k, v in embedding_fields.items():
    setattr(c.embedding, k, v)
  return c


def _data(directory, n_train=24, n_dev=8, seed=0):
  """Anchors are 3 words; the positive is each word's fixed 'translation' (a permutation of the
  words, so a random encoder does not match them), the negative another row's translation."""
  rng = np.random.default_rng(seed)
  translate = dict(zip(WORDS, rng.permutation(WORDS)))
  for split, n in (("train", n_train), ("dev", n_dev)):
    rows = []
    for _ in range(n):
      w, other = rng.choice(WORDS, 3, replace=False), rng.choice(WORDS, 3, replace=False)
      rows.append({"anchor": " ".join(w), "positive": " ".join(translate[x] for x in w),
                   "negative": " ".join(translate[x] for x in other)})
    (directory / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                              encoding="utf-8")


def test_config_to_task_and_bad_settings(tmp_path):
  task = ft.build_task(_config(tmp_path, pooling="cls", scale=50.0, matryoshka_dims=(16, 8)))
  assert (task.type, task.pooling, task.scale, task.matryoshka_dims) == (
      "embedding", "cls", 50.0, (16, 8))
  assert ft.primary_metric(task) == "ndcg@10" and ft.input_keys(task) == ft.INPUT_KEYS
  for kw, msg in ((dict(pooling="max"), r"config.embedding.pooling='max'; use one of mean"),
                  (dict(scale=0.0), r"config.embedding.scale=0.0: the similarity scale must"),
                  (dict(matryoshka_dims=(0,)), r"config.embedding.matryoshka_dims=\(0,\)")):
    with pytest.raises(TaskDataError, match=msg):
      ft.build_task(_config(tmp_path, **kw))
  cfg = model_lib.get_bert_config("tiny", vocab_size=30, hidden_size=32, num_heads=2,
                                  intermediate_size=64, max_position_embeddings=16)
  with pytest.raises(TaskDataError, match=r"matryoshka_dims=\(64, 8\): \[64\] above the "
                                          r"encoder's hidden size 32"):
    heads.create_model(tasks.of(ft.build_task(_config(tmp_path, matryoshka_dims=(64, 8)))),
                       cfg)


def test_features_head_and_loss(tmp_path):
  _data(tmp_path)
  c = _config(tmp_path, query_prompt="the ", matryoshka_dims=(32, 8), symmetric=True)
  task = ft.build_task(c)
  tokenizer = tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(tmp_path),
                                                                         " ".join(WORDS)))
  dev = ft.load_split(task, "dev", tokenizer, c, False)
  assert dev.features["input_ids"].shape == (8, 3, 16)   # anchor, positive, one negative
  assert dev.examples[0].anchor.startswith("the ")
  cfg = model_lib.get_bert_config("tiny", vocab_size=tokenizer.vocab.size, hidden_size=32,
                                  num_heads=2, intermediate_size=64, max_position_embeddings=16)
  bound = tasks.of(task)
  model = heads.create_model(bound, cfg)
  params = model.init(jax.random.PRNGKey(0), *heads.dummy_inputs(bound, 16))["params"]
  assert set(params) == {"bert"}   # no new parameters: the pooled body is the embedding
  f = {k: jnp.asarray(v) for k, v in dev.features.items()}
  out = model.apply({"params": params}, f["input_ids"], f["input_mask"], f["segment_ids"])
  assert out.shape == (8, 3, 32)
  w = jnp.ones(8)
  loss, _ = ft.loss_fn(bound, out, dict(f, example_weights=w))
  want = sum(contrastive.info_nce(out[:, 0, :d], out[:, 1:, :d], 20.0, True, w) for d in (32, 8))
  assert float(loss) == pytest.approx(float(want), rel=1e-6)
  scores = ft.evaluate(task, dev, ft.predict_outputs(bound, out), tokenizer, c)
  assert set(scores) == {"ndcg@10", "mrr@10", "recall@1", "recall@10"}


def test_the_loops_batches_hold_no_text_twice(tmp_path):
  """finetune's epoch batches for an embedding task come from its epoch_order: rows whose
  positives repeat are spread so that no batch holds one text twice."""
  import functools  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  rows = [{"anchor": f"q{i}", "positive": WORDS[i % 6]} for i in range(24)]
  (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows),
                                        encoding="utf-8")
  c = _config(tmp_path)
  task = ft.build_task(c)
  tokenizer = tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(tmp_path),
                                                                         " ".join(WORDS)))
  train = ft.load_split(task, "train", tokenizer, c, True)
  shuffle = functools.partial(tasks.of(task).epoch_order, train, 6)
  batches = finetune._splits_batches(24, 6, np.random.default_rng([0, 1]), shuffle)  # pylint: disable=protected-access
  assert len(batches) == 4 and sorted(np.concatenate(batches).tolist()) == list(range(24))
  for b in batches:
    texts = [t for i in b for t in train.examples[i].texts]
    assert len(texts) == len(set(texts))
  plain = finetune._splits_batches(24, 6, np.random.default_rng([0, 1]))  # pylint: disable=protected-access
  assert any(len({train.examples[i].positive for i in b}) < 6 for b in plain)


def test_evaluation_queries_are_distinct_anchors_with_all_their_positives():
  """embedding.evaluate: an anchor in two rows is one query with two relevant documents (qrels),
  a text in two rows one document; the numbers are retrieval_metrics' on that matrix."""
  from bert_jax.evaluation import retrieval_metrics  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import common  # pylint: disable=g-import-not-at-top
  from data_pipelines.tasks import pairs  # pylint: disable=g-import-not-at-top
  rows = [pairs.Pair("q0", "d0", ("d2",)), pairs.Pair("q0", "d1", ("d2",)),
          pairs.Pair("q1", "d2", ("d0",))]
  vec = {t: v for t, v in zip(("q0", "q1", "d0", "d1", "d2"),
                              np.random.default_rng(0).normal(size=(5, 8)))}
  e = np.stack([[vec[t] for t in r.texts] for r in rows])                 # [3, 2, 8]
  e /= np.linalg.norm(e, axis=-1, keepdims=True)
  got = embedding.evaluate(None, common.Split("dev", rows, {}), {"embeddings": e}, None, None)
  q = np.stack([vec["q0"], vec["q1"]])
  d = np.stack([vec["d0"], vec["d2"], vec["d1"]])   # first-seen order: d0, d2, d1
  q, d = (x / np.linalg.norm(x, axis=-1, keepdims=True) for x in (q, d))
  want = retrieval_metrics.retrieval_metrics(q @ d.T, [[1, 0, 1], [0, 1, 0]], k=10,
                                             recall_at=(1, 10))
  assert got == pytest.approx(want)
  # Scored pairs (STS): Spearman of each row's cosine with its gold score.
  scored = [pairs.Pair("a", "b", (), 5.0), pairs.Pair("c", "d", (), 1.0),
            pairs.Pair("e", "f", (), 3.0)]
  s = np.array([[[1, 0], [1, 0]], [[1, 0], [0, 1]], [[1, 0], [0.6, 0.8]]], np.float32)
  got = embedding.evaluate(None, common.Split("dev", scored, {}), {"embeddings": s}, None, None)
  assert got == {"spearman": pytest.approx(1.0)}


def test_a_scored_dev_file_picks_spearman_and_a_scored_train_file_is_refused(tmp_path):
  (tmp_path / "dev.jsonl").write_text('{"sentence1": "a b", "sentence2": "a", "score": 4}\n'
                                      '{"sentence1": "cat", "sentence2": "dog", "score": 1}\n',
                                      encoding="utf-8")
  c = _config(tmp_path)
  task = ft.build_task(c)
  assert task.metrics == ("spearman",) and ft.primary_metric(task) == "spearman"
  c.custom.train_file = "dev.jsonl"
  tokenizer = tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(tmp_path),
                                                                         " ".join(WORDS)))
  with pytest.raises(TaskDataError, match=r"dev.jsonl: scored pairs \(a score/label column\) "
                                          r"are an evaluation set"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)


@pytest.mark.slow
def test_contrastive_finetune_end_to_end(tmp_path):
  """A tiny random encoder fine-tuned on the translated-words pairs: its dev nDCG@10 rises well
  over the untrained one's, the export records task_type embedding, the test split's vectors are
  written."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_registry_test  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  pretrained = tasks_registry_test._pretrained(tmp_path / "ckpt", finetune_test.WORDS)
  data = tmp_path / "data"
  data.mkdir()
  _data(data, n_train=64, n_dev=16)
  (data / "test.jsonl").write_text((data / "dev.jsonl").read_text(encoding="utf-8"),
                                   encoding="utf-8")
  def config(**kw):
    c = finetune_test._config("custom", pretrained, data, max_seq_length=16, log_every=4, **kw)
    c.custom.type, c.custom.train_file, c.custom.dev_file = "embedding", "train.jsonl", "dev.jsonl"
    c.custom.test_file = "test.jsonl"
    return c
  before = finetune.finetune(config(do_train=False, do_predict=False), str(tmp_path / "eval"))
  summary = finetune.finetune(config(num_train_epochs=6.0, learning_rate=1e-3),
                              str(tmp_path / "run"))
  assert summary["steps"] == 48 and summary["best_metric"] == "ndcg@10"
  # Measured: dev nDCG@10 0.10 untrained -> 0.73 after 6 epochs (recall@10 0.25 -> 1.0).
  assert summary["best_score"] > before["best_score"] + 0.3, (before, summary)
  with open(os.path.join(summary["best_checkpoint"], "bert_config.json"), encoding="utf-8") as f:
    assert json.load(f)["task_type"] == "embedding"
  # The retrieval metrics are the run's summary and `report`'s eval panel (metrics_writer's tags).
  from bert_jax import report  # pylint: disable=g-import-not-at-top
  scalars, run_summary = report.load(str(tmp_path / "run"))
  tags = {f"eval/dev/{m}" for m in ("ndcg@10", "mrr@10", "recall@1", "recall@10")}
  assert tags <= set(run_summary["final_eval"]) and tags <= set(scalars)
  drawn = report.draw(scalars, str(tmp_path / "report.png"), "embedding")
  assert tags <= set(drawn["accuracy and eval scores"])
  vectors = np.load(tmp_path / "run" / "predictions" / "custom_test_embeddings.npy")
  assert vectors.shape == (16, 3, 64)
  np.testing.assert_allclose(np.linalg.norm(vectors, axis=-1), 1.0, rtol=1e-5)
