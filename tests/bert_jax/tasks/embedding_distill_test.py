"""Distillation into a bi-encoder in the embedding task (issue 48 item 4; bert_jax/tasks/
embedding.py, embedding_distillation.py, data_pipelines/tasks/pairs.py):
  * the teacher's scores read in sentence-transformers' two forms (mine's `scores`: 1 + k
    numbers; MarginMSELoss's `label`: k margins) and the bad ones refused in one line;
  * config -> task, bad settings, missing scores, teacher vectors of the wrong shape: one line
    before compute;
  * the task's loss is info_nce_weight x InfoNCE + margin_mse_weight x MarginMSE +
    embed_distill_weight x EmbedDistill (through the learned projection), packed = unpacked;
  * a bi-encoder teacher frozen in the step gives the same step as its precomputed vectors and
    scores (within 1e-5); a teacher of another vocabulary, a cross-encoder folder, a
    classification export, a pre-trained encoder: one line each.
The losses themselves against sentence-transformers: tests/bert_jax/objectives/
embedding_distill_test.py.
"""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import finetune
from bert_jax import tasks
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.configs import finetune as finetune_config
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax.objectives import contrastive
from bert_jax.objectives import embedding_distill as ed
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.tasks import common
from bert_jax.tasks import embedding
from bert_jax.tasks import embedding_distillation
from bert_jax.training import finetune_tasks as ft
from bert_jax.training import trainer_lib
from data_pipelines.tasks import pairs
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

T, G = 12, 24
WORDS = "a the cat dog mat man park house good bad sat ran"
ROWS = [("a cat", "the dog", "a mat", "the man"), ("a man", "the park", "a cat", "good dog"),
        ("the park", "a house", "the dog", "bad cat"), ("good dog", "bad cat", "a mat", "a man")]
SCORES = [[0.9, 0.2, 0.1], [0.8, 0.5, 0.3], [0.7, 0.6, -0.1], [0.95, 0.0, 0.4]]


def _replace(task, **fields):
  return dataclasses.replace(task, **fields)


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
  return str(path)


def _mined(tmp_path, scores=SCORES, rows=ROWS, name="train.jsonl"):
  """A file in mine --output_scores' (and ST's n-tuple output_scores) form."""
  keys = ("anchor", "positive", "negative_1", "negative_2")
  return _jsonl(tmp_path / name, [dict(zip(keys, r), scores=s) for r, s in zip(rows, scores)])


# ----------------------------------------------------------------------------------------------
# The teacher's scores in the training file.
# ----------------------------------------------------------------------------------------------
def test_scores_and_label_margins_are_read_as_margins(tmp_path):
  got = pairs.read_pairs(_mined(tmp_path))
  assert got[0].texts == ROWS[0] and got[0].score is None
  np.testing.assert_allclose(got[0].teacher_margins, (0.7, 0.8), rtol=1e-6)
  # ST's MarginMSELoss label: k margins (a list), or one number for a triplet.
  margins = _jsonl(tmp_path / "m.jsonl", [dict(query="q", positive="p", negative_1="n1",
                                               negative_2="n2", label=[0.5, 0.25])])
  assert pairs.read_pairs(margins)[0].teacher_margins == (0.5, 0.25)
  assert not pairs.is_scored(margins)   # a label beside negatives is no STS gold score
  triplet = tmp_path / "t.csv"
  triplet.write_text("anchor,positive,negative,label\nq,p,n,0.75\n", encoding="utf-8")
  assert pairs.read_pairs(str(triplet))[0].teacher_margins == (0.75,)
  # A CSV/TSV cell of scores is JSON; by position the scores column is no text.
  tsv = tmp_path / "s.tsv"
  tsv.write_text("q\tp\tn\tscores\na\tb\tc\t[1.0, 0.25]\n", encoding="utf-8")
  assert pairs.read_pairs(str(tsv)) == [pairs.Pair("a", "b", ("c",), None, (0.75,))]


def test_scores_that_do_not_fit_the_row_are_one_line(tmp_path):
  with pytest.raises(TaskDataError, match=r"bad.jsonl:2: 'scores' holds 2 numbers but the row "
                                          r"has 2 hard negative\(s\); expected 3 \(the positive"):
    pairs.read_pairs(_mined(tmp_path, SCORES[:1] + [[0.8, 0.5]] + SCORES[2:], name="bad.jsonl"))
  no_negatives = _jsonl(tmp_path / "p.jsonl", [dict(anchor="q", positive="p", scores=[0.9])])
  with pytest.raises(TaskDataError, match=r"p.jsonl:1: a teacher's 'scores' \(1 numbers\) but "
                                          r"no hard-negative column: .*--output_scores"):
    pairs.read_pairs(no_negatives)
  label = _jsonl(tmp_path / "l.jsonl", [dict(anchor="q", positive="p", negative_1="n",
                                             negative_2="m", label=[0.5])])
  with pytest.raises(TaskDataError, match=r"'label' holds 1 numbers but the row has 2 hard "
                                          r"negative\(s\); expected 2 \(one margin"):
    pairs.read_pairs(label)
  words = _jsonl(tmp_path / "w.jsonl", [dict(anchor="q", positive="p", negative="n",
                                             scores="high")])
  with pytest.raises(TaskDataError, match=r"w.jsonl:1: the teacher's 'scores' is 'high', not "
                                          r"numbers"):
    pairs.read_pairs(words)


# ----------------------------------------------------------------------------------------------
# Config -> task, and what is refused before compute.
# ----------------------------------------------------------------------------------------------
def _config(tmp_path, **fields):
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.data_dir, c.max_seq_length = "embedding", str(tmp_path), T
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  for k, v in fields.items():
    setattr(c.embedding, k, v)
  return c


def _data(tmp_path, scores=True):
  if scores:
    _mined(tmp_path)
  else:
    keys = ("anchor", "positive", "negative_1", "negative_2")
    _jsonl(tmp_path / "train.jsonl", [dict(zip(keys, r)) for r in ROWS])
  shutil.copyfile(tmp_path / "train.jsonl", tmp_path / "dev.jsonl")
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(tmp_path), WORDS))


def test_config_to_task_and_the_training_split_s_teacher_arrays(tmp_path):
  tokenizer = _data(tmp_path)
  vectors = np.random.default_rng(0).normal(size=(4, 4, G)).astype(np.float32)
  np.save(tmp_path / "teacher.npy", vectors)
  c = _config(tmp_path, margin_mse_weight=2.0, embed_distill_weight=0.5,
              teacher_embeddings="teacher.npy", info_nce_weight=0.1, embed_distill_distance="mse")
  task = ft.build_task(c)
  assert (task.margin_mse_weight, task.embed_distill_weight, task.info_nce_weight,
          task.teacher_dim, task.embed_distill_distance) == (2.0, 0.5, 0.1, G, "mse")
  assert ft.input_keys(task)[-2:] == ("teacher_margins", "teacher_embeddings")
  train = ft.load_split(task, "train", tokenizer, c, True)
  np.testing.assert_allclose(train.features["teacher_margins"],
                             np.asarray(ed.margins_of_scores(np.array(SCORES))), rtol=1e-6)
  np.testing.assert_array_equal(train.features["teacher_embeddings"], vectors)
  dev = ft.load_split(task, "dev", tokenizer, c, False)
  assert "teacher_margins" not in dev.features
  shapes = embedding.train_batch(_replace(task, num_negatives=2), c)   # bert_jax.plan's
  assert shapes["teacher_margins"] == ((c.batch_size, 2), "float32")
  assert shapes["teacher_embeddings"] == ((c.batch_size, 4, G), "float32")
  # Off (the defaults): no arrays, the loss is InfoNCE alone.
  plain = ft.build_task(_config(tmp_path))
  assert "teacher_margins" not in ft.load_split(plain, "train", tokenizer, c, True).features


@pytest.mark.parametrize("fields,match", [
    (dict(margin_mse_weight=-1.0), r"config.embedding.margin_mse_weight=-1.0: a loss weight "
                                   r"must be >= 0"),
    (dict(info_nce_weight=0.0), r"are all 0: no loss to train"),
    (dict(margin_mse_weight=1.0, margin_mse_similarity="l2"),
     r"margin_mse_similarity='l2'; use one of dot, cos"),
    (dict(embed_distill_weight=1.0, teacher_embeddings="t.npy", embed_distill_distance="kl"),
     r"embed_distill_distance='kl'; use one of mse, l2, cosine"),
    (dict(embed_distill_weight=1.0), r"embed_distill_weight > 0 needs the teacher's vectors: "
                                     r"set --config.embedding.teacher_embeddings"),
    (dict(teacher_embeddings="t.npy"), r"teacher_embeddings is given but margin_mse_weight and "
                                       r"embed_distill_weight are 0 \(and no guide_from_teacher"
                                       r"\): the teacher would teach nothing"),
    (dict(guide_from_teacher=True), r"guide_from_teacher=True needs --config.embedding."
                                    r"teacher_checkpoint=DIR"),
])
def test_bad_settings_are_one_line(tmp_path, fields, match):
  _data(tmp_path)
  np.save(tmp_path / "t.npy", np.zeros((4, 4, G), np.float32))
  with pytest.raises(TaskDataError, match=match):
    ft.build_task(_config(tmp_path, **fields))


def test_what_margin_mse_cannot_learn_from_is_one_line_before_compute(tmp_path):
  tokenizer = _data(tmp_path, scores=False)
  task = ft.build_task(_config(tmp_path, margin_mse_weight=1.0))
  with pytest.raises(TaskDataError, match=r"train.jsonl: no teacher scores \(a 'scores' column "
                                          r".*margin_mse_weight=1; mine the file with python -m "
                                          r"bert_jax.mine --output_scores"):
    ft.load_split(task, "train", tokenizer, _config(tmp_path), True)
  _jsonl(tmp_path / "pairs.jsonl", [dict(anchor=r[0], positive=r[1]) for r in ROWS])
  c = _config(tmp_path, margin_mse_weight=1.0)
  c.custom.train_file = "pairs.jsonl"
  with pytest.raises(TaskDataError, match=r"pairs.jsonl: rows with no hard negatives, but "
                                          r"config.embedding.margin_mse_weight=1"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)


@pytest.mark.parametrize("shape", [(3, 4, G), (4, 3, G), (4, G)])
def test_teacher_vectors_whose_rows_or_texts_do_not_fit_are_one_line(tmp_path, shape):
  tokenizer = _data(tmp_path)
  np.save(tmp_path / "t.npy", np.zeros(shape, np.float32))
  c = _config(tmp_path, embed_distill_weight=1.0, teacher_embeddings="t.npy")
  if len(shape) == 2:   # not [rows, texts, G]: refused as the config is read
    with pytest.raises(TaskDataError, match=r"t.npy: teacher embeddings of shape \(4, 24\), but "
                                            r"expected \[rows of the train file, texts a row, G\]"):
      ft.build_task(c)
    return
  with pytest.raises(TaskDataError, match=r"t.npy: teacher embeddings of shape .* but "
                                          r".*train.jsonl has 4 rows of 4 texts; expected "
                                          r"\[4, 4, G\]"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)


def test_teacher_vectors_of_another_width_without_a_projection_are_one_line(tmp_path):
  _data(tmp_path)
  np.save(tmp_path / "t.npy", np.zeros((4, 4, G), np.float32))
  task = ft.build_task(_config(tmp_path, embed_distill_weight=1.0, teacher_embeddings="t.npy",
                               embed_distill_projection=False))
  with pytest.raises(TaskDataError, match=r"embed_distill_projection=False, but the teacher's "
                                          r"vectors \(t.npy\) are 24 wide and the student's 32: "
                                          r"set embed_distill_projection=True"):
    heads.create_model(tasks.of(task), _model_config())


# ----------------------------------------------------------------------------------------------
# The task's loss.
# ----------------------------------------------------------------------------------------------
B, S, VOCAB = 8, 4, 40


def _model_config(vocab=VOCAB):
  return model_lib.get_bert_config("tiny", vocab_size=vocab, hidden_size=32, num_heads=2,
                                   intermediate_size=64, max_position_embeddings=32,
                                   hidden_dropout_prob=0.0, attention_dropout_prob=0.0)


def _features(n=B, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(4, T + 1, (n, S))
  mask = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.int32)
  ids = rng.integers(5, VOCAB, (n, S, T)).astype(np.int32) * mask
  return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
              teacher_margins=rng.normal(size=(n, S - 2)).astype(np.float32),
              teacher_embeddings=rng.normal(size=(n, S, G)).astype(np.float32))


DISTILL = dict(margin_mse_weight=2.0, embed_distill_weight=0.5, teacher_embeddings="t.npy",
               teacher_dim=G, info_nce_weight=0.3)
KEYS = ("input_ids", "input_mask", "segment_ids", "teacher_margins", "teacher_embeddings")


def test_the_loss_is_the_weighted_sum_unpacked_and_packed():
  """value_and_grad of the task's loss on 6 rows + 2 padding rows: packed equals unpacked (the
  teacher's arrays ride with each example's slots); equals the weighted sum of info_nce,
  margin_mse and embed_distill (through the distill_projection Dense) on the model's vectors;
  the projection is trained (its gradient is not 0) and absent from evaluation's outputs."""
  f = _features()
  idx = np.arange(6)
  task = embedding.EmbeddingTask("t", {}, **DISTILL)
  config = finetune_config.get_config("custom,runlocal")
  config.custom.type, config.max_seq_length, config.batch_size = "embedding", T, B
  config.pack, config.max_instances_per_pack = True, 4
  mesh = trainer_lib.create_mesh((-1, 1, 1), 8, devices=jax.devices()[:1])
  host_batch, _ = embedding.pack_batches(task, common.Split("train", [None] * B, f), config,
                                         [idx], mesh)
  packed = host_batch(idx)
  unpacked = finetune._host_batch(f, KEYS, idx, B)   # pylint: disable=protected-access
  bound = tasks.of(task)
  model = heads.create_model(bound, _model_config())
  params = model.init(jax.random.PRNGKey(0), *heads.dummy_inputs(bound, T))["params"]
  assert set(params) == {"bert", "distill_projection"}
  assert params["distill_projection"]["kernel"].shape == (32, G)

  def run(p, batch, deterministic=False):
    return model.apply({"params": p}, batch, deterministic, method=finetune.forward)

  grad = jax.jit(jax.value_and_grad(lambda p, batch: ft.loss_fn(bound, run(p, batch), batch)[0]))
  lu, gu = grad(params, unpacked)
  lp, gp = grad(params, packed)
  np.testing.assert_allclose(lp, lu, rtol=1e-5)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(gu))
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)
  assert float(np.abs(gu["distill_projection"]["kernel"]).max()) > 0
  out = run(params, unpacked)                                            # [B, S, 32 + G]
  e, w = out[..., :32], unpacked["example_weights"]
  projected = e @ params["distill_projection"]["kernel"] + params["distill_projection"]["bias"]
  np.testing.assert_allclose(out[..., 32:], projected, atol=1e-5)
  want = (0.3 * contrastive.info_nce(e[:, 0], e[:, 1:], 20.0, False, w)
          + 2.0 * ed.margin_mse(e[:, 0], e[:, 1:], unpacked["teacher_margins"], "dot", w)
          + 0.5 * ed.embed_distill(projected, unpacked["teacher_embeddings"], "cosine", w))
  assert float(lu) == pytest.approx(float(want), rel=1e-5)
  _, metrics = ft.loss_fn(bound, out, unpacked)
  assert set(metrics) == {"loss", "info_nce", "margin_mse", "embed_distill"}
  assert run(params, unpacked, True).shape == (B, S, 32)   # evaluation: the embedding alone


# ----------------------------------------------------------------------------------------------
# A bi-encoder teacher frozen in the step.
# ----------------------------------------------------------------------------------------------
def _teacher_export(tmp_path, vocab_file, *, name="teacher", hidden=48, meta=None):
  """An embedding run's export (random weights) of vocab_file, mean pooling."""
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  cfg = model_lib.get_bert_config("tiny", vocab_size=tokenizer.vocab.size, hidden_size=hidden,
                                  num_heads=2, intermediate_size=64, max_position_embeddings=32)
  model = embedding.EmbeddingModel(cfg, "mean")
  params = jax.tree.map(np.asarray, nn.unbox(model.init(
      jax.random.PRNGKey(7), *(np.full((1, 2, T), v) for v in (5, 1, 0)))["params"]))
  meta = meta if meta is not None else dict(
      task="custom", task_type="embedding", epoch=1, do_lower_case=True,
      sentence_embedding=dict(pooling="mean", normalize=True),
      **finetune.vocab_record(vocab_file))
  path = ckpt_lib.save_params(str(tmp_path / name), params, cfg, meta=meta)
  shutil.copyfile(vocab_file, os.path.join(path, "vocab.txt"))
  return path, model, params


def _step(task, model_config, batch, teacher=None):
  """(metrics, params after) of one training step of the loop's own step on one device."""
  config = finetune_config.get_config("custom,runlocal")
  config.custom.type, config.max_seq_length, config.batch_size = "embedding", T, len(
      batch["input_ids"])
  # eps 1: Adam's first update lr x g / (|g| + 1) compares the gradients themselves (as
  # embedding_grad_cache_test: at eps 1e-6 it is lr x sign(g), which float32 noise can flip).
  config.learning_rate, config.num_train_epochs, config.eps = 1e-2, 1.0, 1.0
  mesh = trainer_lib.create_mesh((-1, 1, 1), 1, devices=jax.devices()[:1])
  t = finetune.build_training(tasks.of(task), model_config, config, mesh, num_train_steps=10,
                              warmup_steps=0, teacher=teacher)
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    state, metrics = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
    return jax.device_get(metrics), jax.device_get(state["params"])


@pytest.mark.slow
def test_a_teacher_in_the_step_equals_its_precomputed_scores_and_vectors(tmp_path):
  """MarginMSE, embedding distillation and GIST's guide (guide_from_teacher) from a teacher
  export frozen in the step: the same step (loss, each term, updated parameters within 1e-5) as
  the teacher's vectors precomputed into teacher_embeddings and guide_embeddings and its cosines
  into the file's margins, and as that step under GradCache."""
  tokenizer = _data(tmp_path)
  path, teacher_model, teacher_params = _teacher_export(tmp_path, str(tmp_path / "vocab.txt"))
  c = _config(tmp_path, margin_mse_weight=1.0, embed_distill_weight=0.5,
              teacher_checkpoint=path, guide_from_teacher=True, margin=0.1)
  task = ft.build_task(c)
  assert (task.teacher_dim, task.guide_from_teacher) == (48, True)
  teacher = finetune.load_distill_teacher(c, task, tokenizer)
  assert teacher.output_key == "teacher_vectors" and "frozen in every step" in teacher.line
  train = ft.load_split(task, "train", tokenizer, c, True)
  idx = np.arange(4)
  keys = ("input_ids", "input_mask", "segment_ids")
  batch = finetune._host_batch(train.features, keys, idx, 4)   # pylint: disable=protected-access
  vectors = np.asarray(teacher_model.apply({"params": teacher_params}, *(
      batch[k] for k in keys)))                                          # [4, 4, 48]
  student = _model_config(tokenizer.vocab.size)
  in_step = _step(_replace(task, teacher_checkpoint=path), student,
                  {k: batch[k] for k in keys + ("example_weights",)}, teacher)
  # Precomputed: the same vectors as teacher_embeddings and as guide_embeddings (GIST's guide).
  pre = dict(batch, teacher_embeddings=vectors, guide_embeddings=vectors,
             teacher_margins=np.asarray(ed.margins_of_scores(ed.teacher_scores(vectors))))
  keys = KEYS + ("guide_embeddings", "example_weights")
  from_files = dict(teacher_checkpoint="", teacher_embeddings="t.npy", guide_from_teacher=False,
                    guide_embeddings="g.npy")
  precomputed = _step(_replace(task, **from_files), student, {k: pre[k] for k in keys})
  # GradCache (2 chunks): the teacher's arrays are chunked with their rows, the projection's
  # gradient comes through each chunk's vjp.
  chunked = _step(_replace(task, grad_cache_chunks=2, **from_files), student,
                  {k: pre[k] for k in keys})
  for other in (precomputed, chunked):
    for k in ("loss", "info_nce", "margin_mse", "embed_distill"):
      assert float(in_step[0][k]) == pytest.approx(float(other[0][k]), rel=1e-5, abs=1e-6)
    for a, b in zip(jax.tree.leaves(in_step[1]), jax.tree.leaves(other[1])):
      np.testing.assert_allclose(a, b, atol=1e-5)


def test_a_teacher_of_another_vocabulary_is_one_line(tmp_path):
  tokenizer = _data(tmp_path)
  other = tmp_path / "other"
  other.mkdir()
  path, _, _ = _teacher_export(tmp_path, tasks_testlib.write_vocab(str(other), WORDS + " zebra"))
  c = _config(tmp_path, margin_mse_weight=1.0, teacher_checkpoint=path)
  with pytest.raises(TaskDataError, match=r"teacher_checkpoint=.*teacher: its tokenizer "
                                          r".*vocab.txt \(\d+ tokens, lower-cased\) is not the "
                                          r"student's .*: in the step it would read the "
                                          r"student's token ids as its own; use a teacher of "
                                          r"the student's vocabulary, or precompute"):
    finetune.load_distill_teacher(c, ft.build_task(c), tokenizer)


def test_what_is_no_bi_encoder_teacher_is_one_line(tmp_path):
  _data(tmp_path)
  vocab = str(tmp_path / "vocab.txt")
  classifier, _, _ = _teacher_export(tmp_path, vocab, name="classifier", meta=dict(
      task="mrpc", task_type="classification", epoch=2, do_lower_case=True,
      **finetune.vocab_record(vocab)))
  with pytest.raises(TaskDataError, match=r"classifier.* is a classification export \(task "
                                          r"'mrpc': a cross-encoder or classifier"):
    ft.build_task(_config(tmp_path, margin_mse_weight=1.0, teacher_checkpoint=classifier))
  plain, _, _ = _teacher_export(tmp_path, vocab, name="plain", meta=dict(do_lower_case=True))
  with pytest.raises(TaskDataError, match=r"records no sentence embedding \(no pooling: a "
                                          r"pre-trained encoder"):
    ft.build_task(_config(tmp_path, margin_mse_weight=1.0, teacher_checkpoint=plain))
  cross = tmp_path / "cross"
  cross.mkdir()
  (cross / "config.json").write_text(json.dumps(dict(
      architectures=["BertForSequenceClassification"], model_type="bert")), encoding="utf-8")
  with pytest.raises(TaskDataError, match=r"a BertForSequenceClassification folder is a "
                                          r"cross-encoder .*Precompute a cross-encoder's scores"):
    embedding_distillation.teacher_width(str(cross))


# ----------------------------------------------------------------------------------------------
# End to end on real text: stdlib docstrings (benchmarks/docstring_retrieval.py).
# ----------------------------------------------------------------------------------------------
def _docstring_data(d):
  """train.jsonl: (query, positive, negative) rows of json's and statistics' docstrings, the
  negative the next row's positive; dev.jsonl: 8 dev and test pairs; the words' vocab.txt."""
  from benchmarks import docstring_retrieval as dr  # pylint: disable=g-import-not-at-top
  rows = dr.build(str(d / "pairs"), packages=("json", "statistics"))
  train = rows["train"][:24]
  _jsonl(d / "train.jsonl", [dict(query=r["query"], positive=r["positive"],
                                  negative=train[(i + 1) % len(train)]["positive"])
                             for i, r in enumerate(train)])
  _jsonl(d / "dev.jsonl", (rows["dev"] + rows["test"])[:8])
  texts = [t for r in rows["train"] + rows["dev"] for t in (r["query"], r["positive"])]
  return tasks_testlib.write_vocab(str(d), " ".join(texts)), texts


@pytest.mark.slow
def test_a_student_distilled_by_margin_mse_trains_exports_and_loads_in_sentence_transformers(
    tmp_path):
  """A 2-layer H 32 student learns from a 2-layer H 48 teacher (an embedding export of the same
  vocab, frozen in the step) by MarginMSE and embedding distillation through the projection,
  with InfoNCE; the best export records the distillation, keeps the projection beside the body,
  and its sentence-transformers folder (the existing export) gives predict embed's vectors."""
  from sentence_transformers import SentenceTransformer  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import sentence_transformers as st  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  vocab_file, texts = _docstring_data(tmp_path)
  teacher, _, _ = _teacher_export(tmp_path, vocab_file)
  size = tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size
  cfg = model_lib.get_bert_config("tiny", vocab_size=size, hidden_size=32, num_heads=2,
                                  intermediate_size=64, max_position_embeddings=32)
  student = ckpt_lib.save_params(str(tmp_path / "student"), nn.unbox(
      pretraining_heads.init_params(cfg, jax.random.PRNGKey(1))), cfg,
                                 meta={"do_lower_case": True})
  c = _config(tmp_path, margin_mse_weight=1.0, embed_distill_weight=0.5,
              teacher_checkpoint=teacher)
  c.init_checkpoint, c.vocab_file, c.max_seq_length = student, vocab_file, 32
  c.batch_size = c.eval_batch_size = 8
  c.learning_rate, c.num_train_epochs, c.log_every, c.do_predict = 1e-3, 2.0, 3, False
  summary = finetune.finetune(c, str(tmp_path / "run"))
  assert summary["steps"] == 6 and summary["best_metric"] == "ndcg@10"
  best = summary["best_checkpoint"]
  with open(os.path.join(best, "bert_config.json"), encoding="utf-8") as f:
    record = json.load(f)["distillation"]
  assert (record["teacher"], record["margin_mse_weight"]) == (teacher, 1.0)
  assert record["distill_projection"].startswith("a 48-wide Dense")
  assert set(ckpt_lib.load_params(best)[0]) == {"bert", "distill_projection"}
  from bert_jax import report  # pylint: disable=g-import-not-at-top
  scalars, _ = report.load(str(tmp_path / "run"))
  assert {"train/info_nce", "train/margin_mse", "train/embed_distill"} <= set(scalars)
  m = inference.load_for_inference(best, python_tokenizer=True)
  out, _ = st.export(m, str(tmp_path / "st"))
  theirs = SentenceTransformer(out, device="cpu").encode(texts[:6], prompt="")
  ours = predict.embed(predict.load_embedder(best), texts[:6], pooling="mean",
                       max_seq_length=32)
  assert theirs.shape == ours.shape == (6, 32)   # the body's width: the projection is not in it
  cosine = np.sum(theirs * ours, -1) / np.linalg.norm(theirs, axis=-1) / np.linalg.norm(
      ours, axis=-1)
  assert cosine.min() >= 0.99999, cosine
  # That sentence-transformers folder teaches in the step in turn (a bi-encoder of this vocab).
  c.embedding.teacher_checkpoint = out
  task = ft.build_task(c)
  assert task.teacher_dim == 32
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  assert "mean pooling" in finetune.load_distill_teacher(c, task, tokenizer).line


def test_a_guide_file_of_the_wrong_rank_names_what_it_expects(tmp_path):
  """bert_jax.plan reads the guide's width from its header alone (embedding.train_batch): a 2-d
  .npy was 'train.jsonl has None rows of None texts; expected [None, None, G]' (fixed)."""
  _data(tmp_path)
  np.save(tmp_path / "guide.npy", np.zeros((4, G), np.float32))
  c = _config(tmp_path, guide_embeddings="guide.npy")
  with pytest.raises(TaskDataError, match=r"guide.npy: guide embeddings of shape \(4, 24\), but "
                                          r"expected \[rows of the train file, texts a row, G\]"):
    embedding.train_batch(ft.build_task(c), c)


def test_the_guide_from_the_teacher_in_the_step_is_the_guide_file_s_mask():
  """guide_from_teacher: the GIST mask reads the teacher's vectors of the batch (teacher_vectors,
  as the frozen teacher gives them) exactly as guide_embeddings' rows; and it masks something."""
  rng = np.random.default_rng(4)
  out = rng.normal(size=(B, S, 32)).astype(np.float32)
  vectors = (out[..., :G] + 0.3 * rng.normal(size=(B, S, G))).astype(np.float32)
  w = np.ones((B,), np.float32)
  in_step = embedding.EmbeddingTask("t", {}, teacher_checkpoint="T", guide_from_teacher=True,
                                    margin=0.05)
  from_file = embedding.EmbeddingTask("t", {}, guide_embeddings="g.npy", margin=0.05)
  a = embedding.distillation_loss(in_step, out, dict(example_weights=w, teacher_vectors=vectors))
  b = embedding.distillation_loss(from_file, out, dict(example_weights=w,
                                                       guide_embeddings=vectors))
  plain = embedding.distillation_loss(embedding.EmbeddingTask("t", {}), out,
                                      dict(example_weights=w))
  assert float(a[0]) == pytest.approx(float(b[0]), rel=1e-6)
  assert abs(float(a[0]) - float(plain[0])) > 1e-3


def test_infonce_s_cannot_learn_checks_are_off_when_it_is_off(tmp_path):
  """config.batch_size=1 on rows with no hard negative is InfoNCE's constant loss (refused);
  with info_nce_weight=0 and embedding distillation alone the teacher's vectors still teach."""
  tokenizer = _data(tmp_path)
  _jsonl(tmp_path / "pairs.jsonl", [dict(anchor=r[0], positive=r[1]) for r in ROWS])
  np.save(tmp_path / "t.npy", np.ones((4, 2, G), np.float32))
  c = _config(tmp_path, embed_distill_weight=1.0, teacher_embeddings="t.npy")
  c.custom.train_file, c.batch_size = "pairs.jsonl", 1
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  with pytest.raises(TaskDataError, match=r"config.batch_size=1 on .*pairs.jsonl's rows with no "
                                          r"hard negatives"):
    ft.check_can_learn(task, train, tokenizer, c)
  c.embedding.info_nce_weight = 0.0
  task = ft.build_task(c)
  assert ft.check_can_learn(task, ft.load_split(task, "train", tokenizer, c, True), tokenizer,
                            c) == []
