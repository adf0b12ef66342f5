"""GradCache in the fine-tuning step (issue 40 item 4): --config.embedding.grad_cache_chunks=N.

The step finetune.build_training compiles for an embedding task with N chunks gives the same
loss, gradient norm and updated parameters (AdamW, clipping, everything) as the unchunked step on
a batch both fit, on a 1-device and an 8-device mesh (conftest's 8 CPU devices), float32:
  dropout off: against the plain step itself (one jax.value_and_grad over the batch);
  dropout on:  against the step whose gradient is one graph over the same chunks under the same
               keys (what the plain step computes when its masks are drawn per chunk): GradCache
               must re-use each chunk's masks in its second pass (sentence-transformers #3862).
A chunk count that does not divide each device's rows is one line before compute.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.objectives import contrastive
from bert_jax import finetune
from bert_jax.models import model as model_lib
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import tasks
from bert_jax.training import trainer_lib
from bert_jax.configs import finetune as finetune_config
from bert_jax.tasks import embedding
from data_pipelines.tasks.common import TaskDataError

B, S, T, VOCAB = 16, 3, 12, 40   # rows (anchor, positive, hard negative), tokens


def _task(chunks):
  return embedding.EmbeddingTask("t", {}, matryoshka_dims=(32, 8), symmetric=True,
                                 grad_cache_chunks=chunks)


def _config():
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.max_seq_length, c.batch_size = "embedding", T, B
  c.learning_rate, c.num_train_epochs = 1e-2, 1.0
  # Adam's first update is lr x g / (|g| + eps): at eps 1e-6 it is lr x sign(g) wherever |g| >>
  # eps and jumps where |g| ~ eps, so float32 noise in a tiny gradient moves it by up to lr
  # (seen: 2e-7 at lr 1e-3). At eps 1 it is lr x g / (|g| + 1), smooth: the updated parameters
  # compare the gradients themselves.
  c.eps = 1.0
  return c


def _batch():
  rng = np.random.default_rng(0)
  ids = rng.integers(5, VOCAB, (B, S, T)).astype(np.int32)
  mask = (np.arange(T)[None, None, :] < rng.integers(4, T + 1, (B, S, 1))).astype(np.int32)
  weights = np.ones(B, np.float32)
  weights[-2:] = 0.0   # an epoch's last batch: weight-0 padding rows, no anchors or candidates
  return dict(input_ids=ids * mask, input_mask=mask, segment_ids=np.zeros_like(ids),
              example_weights=weights)


def _one_graph(n):
  """The reference grads_fn: the whole batch in one graph (every chunk's activations kept), chunk
  i = rows i, i + n, ... under key i of the same split as grad_cache's."""
  def grads_fn(apply, loss_fn, params, batch, rng):
    keys = jax.random.split(rng, n)

    def loss(p):
      parts = [apply(p, jax.tree.map(lambda x, i=i: x[i::n], batch), keys[i]) for i in range(n)]
      return loss_fn(contrastive.unchunk_rows(jnp.stack(parts)), batch)
    return jax.value_and_grad(loss, has_aux=True)(params)
  return grads_fn


def _step(task_type, dropout, devices):
  """(params before, params after, metrics) of one training step of `task_type`."""
  mc = model_lib.get_bert_config("tiny", vocab_size=VOCAB, hidden_size=32, num_heads=2,
                                 intermediate_size=64, max_position_embeddings=16,
                                 hidden_dropout_prob=dropout, attention_dropout_prob=dropout)
  mesh = trainer_lib.create_mesh((-1, 1, 1), B, devices=devices)
  t = finetune.build_training(task_type, mc, _config(), mesh, num_train_steps=10,
                              warmup_steps=0)
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    before = jax.device_get(state["params"])
    state, metrics = t.train_step(state, sharding_lib.make_global_batch(_batch(), mesh))
    return before, jax.device_get(state["params"]), jax.device_get(metrics)


def _same_step(got, want):
  """Loss and gradient norm to float32 summation order; every parameter's update (AdamW's first
  step after clipping and weight decay) within 1e-4 of the step's largest update. (Leaves the
  loss does not reach, e.g. BERT's pooler, have gradients ~1e-13: float noise, which a per-leaf
  tolerance would compare.)"""
  (b0, p1, m1), (b0_want, p1_want, m1_want) = got, want
  assert float(m1["loss"]) == pytest.approx(float(m1_want["loss"]), rel=1e-5)
  assert float(m1["grad_norm"]) == pytest.approx(float(m1_want["grad_norm"]), rel=1e-4)
  leaves = list(zip(*map(jax.tree.leaves, (b0, p1, b0_want, p1_want))))
  largest = max(float(np.abs(w1 - w0).max()) for _, _, w0, w1 in leaves)
  assert largest > 1e-4   # the step moved the parameters
  for x0, x1, w0, w1 in leaves:
    np.testing.assert_array_equal(x0, w0)   # the same initial parameters
    np.testing.assert_allclose(x1 - x0, w1 - w0, atol=1e-4 * largest)


def test_chunks_that_do_not_divide_a_devices_rows_are_one_line_before_compute():
  mesh = trainer_lib.create_mesh((-1, 1, 1), B)
  n = sharding_lib.data_parallel_size(mesh)
  assert embedding.grad_cache_step(_task(0), mesh, B) is None    # off
  assert embedding.grad_cache_step(_task(1), mesh, B) is None
  per = B // n
  with pytest.raises(TaskDataError, match=(
      rf"^config.embedding.grad_cache_chunks=3 does not divide the {per} rows each device holds "
      rf"\(config.batch_size={B} over {n} data-parallel devices\); use one of \[2")):
    embedding.grad_cache_step(_task(3), mesh, B)
  assert callable(embedding.grad_cache_step(_task(2), mesh, B))
  c = _config()
  c.embedding.grad_cache_chunks = -1
  with pytest.raises(TaskDataError, match=r"grad_cache_chunks=-1: must be >= 0"):
    tasks.of(embedding.custom_task(c, ()))
  c.embedding.grad_cache_chunks = 4
  assert tasks.of(embedding.custom_task(c, ())).train_grads is not None


def test_grad_cache_with_fp8_matmuls_is_refused_before_compute():
  """fp8's scales take the max of each micro-batch's amax; chunks would sum them (row 90)."""
  mc = model_lib.get_bert_config("tiny", vocab_size=VOCAB, hidden_size=32, num_heads=2,
                                 intermediate_size=64, max_position_embeddings=16, fp8=True)
  mesh = trainer_lib.create_mesh((-1, 1, 1), B)
  with pytest.raises(trainer_lib.ConfigError, match=r"GradCache: config.embedding.grad_cache_"
                                                    r"chunks\) with FP8 matmuls"):
    finetune.build_training(tasks.of(_task(2)), mc, _config(), mesh, num_train_steps=10,
                            warmup_steps=0)


def test_rows_with_another_number_of_hard_negatives_are_one_line(tmp_path):
  """config.embedding.num_negatives=7 (modernbert-embed's stage 2) on triplets of 1 negative."""
  import json  # pylint: disable=g-import-not-at-top
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  (tmp_path / "train.jsonl").write_text(json.dumps(
      {"anchor": "a cat", "positive": "a dog", "negative": "the mat"}) + "\n", encoding="utf-8")
  c = _config()
  c.data_dir, c.custom.train_file, c.embedding.num_negatives = str(tmp_path), "train.jsonl", 7
  tokenizer = tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(str(tmp_path),
                                                                         "a cat dog the mat"))
  with pytest.raises(TaskDataError, match=r"train.jsonl: rows with 1 hard negatives, but config."
                                          r"embedding.num_negatives=7; give each row 7"):
    ft.load_split(ft.build_task(c), "train", tokenizer, c, True)
  c.embedding.num_negatives = 1
  assert ft.load_split(ft.build_task(c), "train", tokenizer, c, True).features[
      "input_ids"].shape[:2] == (1, 3)


@pytest.mark.slow
@pytest.mark.parametrize("num_devices,chunks", [(1, 4), (8, 2)])
def test_grad_cache_step_equals_the_unchunked_step(num_devices, chunks):
  devices = jax.devices()[:num_devices]
  # Dropout off: the loop's plain step is the reference.
  plain = _step(tasks.of(_task(0)), 0.0, devices)
  _same_step(_step(tasks.of(_task(chunks)), 0.0, devices), plain)
  # Dropout on: the one-graph step under the chunks' keys; another draw is another step.
  gc = _step(tasks.of(_task(chunks)), 0.1, devices)
  ref = dataclasses.replace(tasks.of(_task(chunks)), train_grads=lambda m, b: _one_graph(chunks))
  _same_step(gc, _step(ref, 0.1, devices))
  unmatched = _step(tasks.of(_task(0)), 0.1, devices)   # the plain step's own masks
  assert abs(float(unmatched[2]["grad_norm"]) - float(gc[2]["grad_norm"])) > 1e-4


@pytest.mark.slow
def test_memory_benchmark_compiles_both_steps_and_grad_cache_holds_less():
  """benchmarks/grad_cache_memory.py on a tiny model (compiled for one CPU device, not run): the
  same arguments (parameters, Adam, batch), fewer temporaries with 8 chunks than without."""
  from benchmarks import grad_cache_memory  # pylint: disable=g-import-not-at-top
  mc = model_lib.get_bert_config("tiny", vocab_size=VOCAB, hidden_size=32, num_heads=2,
                                 intermediate_size=64, max_position_embeddings=32,
                                 hidden_dropout_prob=0.1, attention_dropout_prob=0.1)
  kw = dict(batch=64, seq=32, negatives=1, devices=jax.devices()[:1])
  plain = grad_cache_memory.step_memory(mc, chunks=1, **kw)
  chunked = grad_cache_memory.step_memory(mc, chunks=8, **kw)
  assert chunked["arguments"] == plain["arguments"]
  assert chunked["temporaries"] < 0.5 * plain["temporaries"], (plain, chunked)
