"""False negatives out of the embedding task's loss (issue 48 item 2; bert_jax/tasks/embedding.py):
config.embedding.mask_duplicates (a candidate with the anchor's positive's input ids) and
config.embedding.guide_embeddings (GISTEmbed's guided mask; margin_strategy, margin,
contrast_anchors, contrast_positives):
  * config -> task, the training split's text numbers and guide vectors, bad files and settings
    one line before compute;
  * the step's loss is contrastive.info_nce with those masks, unpacked and packed (equal, loss
    and gradients) and with GradCache on the 8-device mesh (equal to the plain step, slow);
  * a checkpoint's predicted vectors of the train file guide a masked fine-tune (slow).
The loss itself against sentence-transformers' GISTEmbedLoss:
tests/bert_jax/objectives/contrastive_false_negatives_test.py.
"""

import json

import jax
import numpy as np
import pytest

from bert_jax import finetune
from bert_jax import tasks
from bert_jax.configs import finetune as finetune_config
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax.objectives import contrastive
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.tasks import common
from bert_jax.tasks import embedding
from bert_jax.training import finetune_tasks as ft
from bert_jax.training import trainer_lib
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

B, S, T, VOCAB, G = 16, 3, 12, 40, 8


def _config(tmp_path, **fields):
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.data_dir, c.max_seq_length = "embedding", str(tmp_path), T
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  for k, v in fields.items():
    setattr(c.embedding, k, v)
  return c


ROWS = [("a cat", "the dog", "a mat"), ("a man", "the dog", "a cat"),   # row 1: row 0's positive
        ("the park", "a house", "the dog"), ("good dog", "bad cat", "bad cat")]


def _write(tmp_path, rows=ROWS):
  text = "".join(json.dumps(dict(zip(("anchor", "positive", "negative"), r))) + "\n"
                 for r in rows)
  for split in ("train", "dev"):
    (tmp_path / f"{split}.jsonl").write_text(text, encoding="utf-8")
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(
      str(tmp_path), "a the cat dog mat man park house good bad"))


def test_config_to_task_text_numbers_and_guide_vectors(tmp_path):
  tokenizer = _write(tmp_path)
  guide = np.random.default_rng(0).normal(size=(4, 3, G)).astype(np.float32)
  np.save(tmp_path / "guide.npy", guide)
  c = _config(tmp_path, mask_duplicates=True, guide_embeddings="guide.npy",
              margin_strategy="relative", margin=0.1, contrast_anchors=False)
  task = ft.build_task(c)
  assert (task.mask_duplicates, task.guide_embeddings, task.margin_strategy, task.margin,
          task.contrast_anchors, task.contrast_positives) == (
              True, "guide.npy", "relative", 0.1, False, True)
  assert ft.input_keys(task) == ft.INPUT_KEYS + ("text_ids", "guide_embeddings")
  train = ft.load_split(task, "train", tokenizer, c, True)
  ids = train.features["text_ids"]                                       # [4, 3]
  texts = [t for r in ROWS for t in r]
  for x in range(12):   # the same number exactly for the same text
    for y in range(12):
      assert (ids.flat[x] == ids.flat[y]) == (texts[x] == texts[y]), (texts[x], texts[y])
  np.testing.assert_array_equal(train.features["guide_embeddings"], guide)
  dev = ft.load_split(task, "dev", tokenizer, c, False)   # evaluation: no masks
  assert "text_ids" not in dev.features and "guide_embeddings" not in dev.features
  # A prompt makes a query and the same document text different inputs ("a cat": row 0's
  # anchor, row 1's negative).
  assert ids[0, 0] == ids[1, 2]
  c.embedding.query_prompt = "the "
  prompted = ft.load_split(ft.build_task(c), "train", tokenizer, c, True).features["text_ids"]
  assert prompted[0, 0] != prompted[1, 2] and prompted[0, 1] == prompted[1, 1]
  # Off (the default): neither array, the loss MNRL's.
  plain = ft.build_task(_config(tmp_path))
  assert not plain.mask_duplicates and not plain.guide_embeddings
  assert ft.input_keys(plain) == ft.INPUT_KEYS
  assert "text_ids" not in ft.load_split(plain, "train", tokenizer, _config(tmp_path),
                                         True).features


def test_bad_guide_files_and_settings_are_one_line_before_compute(tmp_path):
  tokenizer = _write(tmp_path)
  c = _config(tmp_path, guide_embeddings="guide.npy")
  with pytest.raises(TaskDataError, match=r"^config.embedding.guide_embeddings='guide.npy': no "
                                          r"local file .*guide.npy; write the guide's vectors"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)
  np.save(tmp_path / "guide.npy", np.zeros((3, 3, G), np.float32))   # a row short
  with pytest.raises(TaskDataError, match=r"guide.npy: guide embeddings of shape \(3, 3, 8\), "
                                          r"but .*train.jsonl has 4 rows of 3 texts; expected "
                                          r"\[4, 3, G\]"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)
  c.max_train_examples = 2   # the file's first rows: the guide's first rows
  np.save(tmp_path / "guide.npy", np.arange(4 * 3 * G, dtype=np.float64).reshape(4, 3, G))
  got = ft.load_split(ft.build_task(c), "train", tokenizer, c, True).features["guide_embeddings"]
  assert got.dtype == np.float32 and got.shape == (2, 3, G) and got[1, 0, 0] == 3 * G
  with pytest.raises(TaskDataError, match=r"config.embedding.margin_strategy='percent'; use one "
                                          r"of absolute, relative"):
    ft.build_task(_config(tmp_path, margin_strategy="percent"))
  # bert_jax.plan's batch shapes: the guide's width from the file's header.
  shapes = embedding.train_batch(ft.build_task(_config(tmp_path, guide_embeddings="guide.npy",
                                                       mask_duplicates=True)), c)
  assert shapes["guide_embeddings"] == ((c.batch_size, 2, G), "float32")
  assert shapes["text_ids"] == ((c.batch_size, 2), "int32")


def _features(n=B, seed=0):
  """[n, S, T] texts; row 5's positive is row 1's, row 9's negative is row 4's positive, row 12's
  negative its own positive; text numbers from the ids, random guide vectors (a text's copies
  the same vector, as a guide embeds them)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(4, T + 1, (n, S))
  mask = (np.arange(T)[None, None, :] < lengths[..., None]).astype(np.int32)
  ids = rng.integers(5, VOCAB, (n, S, T)).astype(np.int32) * mask
  for (r, s), (r0, s0) in (((5, 1), (1, 1)), ((9, 2), (4, 1)), ((12, 2), (12, 1))):
    ids[r, s], mask[r, s] = ids[r0, s0], mask[r0, s0]
  text_ids = embedding.text_numbers(ids)
  guide = rng.normal(size=(text_ids.max() + 1, G)).astype(np.float32)[text_ids]
  return dict(input_ids=ids, input_mask=mask, segment_ids=np.zeros_like(ids),
              text_ids=text_ids, guide_embeddings=guide)


def _model_config(dropout=0.0):
  return model_lib.get_bert_config("tiny", vocab_size=VOCAB, hidden_size=32, num_heads=2,
                                   intermediate_size=64, max_position_embeddings=32,
                                   hidden_dropout_prob=dropout, attention_dropout_prob=dropout)


TASK = dict(mask_duplicates=True, guide_embeddings="guide.npy", margin=0.05, symmetric=True)
KEYS = ("input_ids", "input_mask", "segment_ids", "text_ids", "guide_embeddings")


def test_the_loss_reads_the_masks_unpacked_and_packed():
  """value_and_grad of the task's loss on 6 rows + 2 weight-0 padding rows: unpacked equals
  packed rows (each example's text numbers and guide vectors ride with its slots); equals
  contrastive.info_nce with the masks on the pooled vectors; differs from the unmasked loss."""
  f = {k: v[:8] for k, v in _features().items()}
  idx = np.arange(6)
  task = embedding.EmbeddingTask("t", {}, matryoshka_dims=(16,), **TASK)
  config = finetune_config.get_config("custom,runlocal")
  config.custom.type, config.max_seq_length, config.batch_size = "embedding", T, 8
  config.pack, config.max_instances_per_pack = True, 4
  mesh = trainer_lib.create_mesh((-1, 1, 1), 8, devices=jax.devices()[:1])
  host_batch, _ = embedding.pack_batches(task, common.Split("train", [None] * 8, f), config,
                                         [idx], mesh)
  packed = host_batch(idx)
  np.testing.assert_array_equal(packed["text_ids"][:6], f["text_ids"][:6])
  np.testing.assert_array_equal(packed["guide_embeddings"][:6], f["guide_embeddings"][:6])
  unpacked = finetune._host_batch(f, KEYS, idx, 8)   # pylint: disable=protected-access
  bound = tasks.of(task)
  model = heads.create_model(bound, _model_config())
  params = model.init(jax.random.PRNGKey(0), *heads.dummy_inputs(bound, T))["params"]

  def run(p, batch):
    return model.apply({"params": p}, batch, True, method=finetune.forward)

  grad = jax.jit(jax.value_and_grad(lambda p, batch, t=bound: ft.loss_fn(t, run(p, batch),
                                                                         batch)[0]))
  lu, gu = grad(params, unpacked)
  lp, gp = grad(params, packed)
  np.testing.assert_allclose(lp, lu, rtol=1e-5)
  scale = max(float(np.max(np.abs(g))) for g in jax.tree.leaves(gu))
  for a, b in zip(jax.tree.leaves(gp), jax.tree.leaves(gu)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * scale)
  e = run(params, unpacked)                                              # [8, S, H]
  g = unpacked["guide_embeddings"]
  want = contrastive.matryoshka_info_nce(
      e[:, 0], e[:, 1:], (16,), 20.0, True, unpacked["example_weights"],
      text_ids=unpacked["text_ids"], guide=(g[:, 0], g[:, 1:]), margin=0.05,
      contrast_anchors=True, contrast_positives=True)
  assert float(lu) == pytest.approx(float(want), rel=1e-6)
  off = ft.loss_fn(tasks.of(embedding.EmbeddingTask("t", {}, matryoshka_dims=(16,),
                                                    symmetric=True)), e, unpacked)[0]
  assert abs(float(off) - float(lu)) > 1e-2


def _step(task, devices, dropout=0.0):
  """(params before, params after, metrics) of one step of the loop's own training step."""
  from tests.bert_jax.tasks import embedding_grad_cache_test as gct  # pylint: disable=g-import-not-at-top
  mesh = trainer_lib.create_mesh((-1, 1, 1), B, devices=devices)
  config = gct._config()   # pylint: disable=protected-access
  t = finetune.build_training(tasks.of(task), _model_config(dropout), config, mesh,
                              num_train_steps=10, warmup_steps=0)
  f = _features()
  batch = finetune._host_batch(f, KEYS, np.arange(B - 2), B)   # pylint: disable=protected-access
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    before = jax.device_get(state["params"])
    state, metrics = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
    return before, jax.device_get(state["params"]), jax.device_get(metrics)


@pytest.mark.slow
def test_grad_cache_step_with_the_masks_on_8_devices_equals_the_plain_step():
  """GradCache's 2 chunks a device on the 8-device mesh against the plain step on one device,
  both masks on (duplicates across devices: rows 1 and 5 sit on different devices); the masks
  changed the step."""
  from tests.bert_jax.tasks import embedding_grad_cache_test as gct  # pylint: disable=g-import-not-at-top
  plain = _step(embedding.EmbeddingTask("t", {}, **TASK), jax.devices()[:1])
  chunked = _step(embedding.EmbeddingTask("t", {}, grad_cache_chunks=2, **TASK), jax.devices())
  gct._same_step(chunked, plain)   # pylint: disable=protected-access
  off = _step(embedding.EmbeddingTask("t", {}, symmetric=True), jax.devices()[:1])
  assert abs(float(off[2]["loss"]) - float(plain[2]["loss"])) > 1e-2


@pytest.mark.slow
def test_a_guide_run_s_vectors_train_a_masked_run_end_to_end(tmp_path):
  """The documented route: a checkpoint's vectors of the train file (do_train=false,
  do_predict=true, test_file = the train file) are the guide of a fine-tune with both masks, on
  8 devices with GradCache. Its steps are the unmasked run's, its losses finite and lower (the
  masks took candidates out: the train file holds each row twice, so every batch holds
  duplicates)."""
  import shutil  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_embedding_test as tet  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_registry_test  # pylint: disable=g-import-not-at-top
  pretrained = tasks_registry_test._pretrained(tmp_path / "ckpt", finetune_test.WORDS)  # pylint: disable=protected-access
  data = tmp_path / "data"
  data.mkdir()
  tet._data(data, n_train=8, n_dev=8)   # pylint: disable=protected-access
  rows = (data / "train.jsonl").read_text(encoding="utf-8")
  (data / "train.jsonl").write_text(rows + rows, encoding="utf-8")   # 16 rows, each twice

  def config(**kw):
    c = finetune_test._config("custom", pretrained, data, max_seq_length=16, log_every=1,   # pylint: disable=protected-access
                              batch_size=16, num_train_epochs=2.0, **kw)
    c.custom.type, c.custom.train_file, c.custom.dev_file = "embedding", "train.jsonl", "dev.jsonl"
    c.embedding.grad_cache_chunks = 2
    return c

  guide = config(do_train=False, do_predict=True)
  guide.custom.test_file = "train.jsonl"
  finetune.finetune(guide, str(tmp_path / "guide"))
  vectors = tmp_path / "guide" / "predictions" / "custom_test_embeddings.npy"
  assert np.load(vectors).shape[:2] == (16, 3)
  shutil.copy(vectors, data / "guide.npy")
  masked = config()
  masked.embedding.mask_duplicates, masked.embedding.guide_embeddings = True, "guide.npy"
  got = finetune.finetune(masked, str(tmp_path / "masked"))
  want = finetune.finetune(config(), str(tmp_path / "plain"))
  assert got["steps"] == want["steps"] == 2
  got_losses = finetune_test._train_losses(str(tmp_path / "masked"))   # pylint: disable=protected-access
  want_losses = finetune_test._train_losses(str(tmp_path / "plain"))   # pylint: disable=protected-access
  assert np.isfinite(got_losses).all() and len(got_losses) == len(want_losses) == 2
  assert got_losses[0] < want_losses[0] - 0.1, (got_losses, want_losses)
