"""modernbert-embed's two stages as presets (bert_jax/configs/finetune.py, issue 40 item 7):
their published values (nomic-ai/contrastors' configs), the cosine schedule with a fixed warmup,
and (slow) stage 1's runlocal variant fine-tuned end to end with GradCache in the loop."""

import json
import os

import numpy as np
import pytest

from bert_jax import finetune
from bert_jax.training import finetune_tasks as ft
from bert_jax.training import optimizer as optimizer_lib
from bert_jax.configs import finetune as finetune_config


def test_stage1_and_stage2_carry_the_published_values():
  one = finetune_config.get_config("modernbert_embed_stage1")
  assert (one.task, one.custom.type, one.batch_size, one.max_seq_length) == (
      "custom", "embedding", 16_384, 128)
  assert (one.learning_rate, one.warmup_steps, one.schedule, one.num_train_epochs) == (
      2e-4, 700, "hf_cosine", 1.0)
  e = one.embedding
  assert (e.scale, e.pooling, e.grad_cache_chunks, e.matryoshka_dims) == (50.0, "mean", 32, ())
  assert (e.query_prompt, e.document_prompt) == ("search_query: ", "search_document: ")
  assert one.model.hidden_dropout_prob == one.model.attention_dropout_prob == 0.0
  two = finetune_config.get_config("modernbert_embed_stage2")
  assert (two.batch_size, two.max_seq_length, two.learning_rate, two.warmup_steps) == (
      256, 512, 2e-5, 400)
  assert (two.schedule, two.embedding.matryoshka_dims, two.embedding.num_negatives,
          two.embedding.scale, two.embedding.grad_cache_chunks) == ("linear", (256, 768), 7,
                                                                    50.0, 0)
  task = ft.build_task(two)
  assert (task.matryoshka_dims, task.num_negatives, task.scale) == ((256, 768), 7, 50.0)
  # The other presets keep BERT's schedule and the 10% warmup.
  glue = finetune_config.get_config("glue_mrpc")
  assert (glue.schedule, glue.warmup_steps, glue.task) == ("linear", 0, "mrpc")


STEPS = np.array([0, 1, 350, 699, 700, 701, 1_525, 2_000, 2_349, 2_350])


def _stage1_schedule():
  c = finetune_config.get_config("modernbert_embed_stage1")
  rows = 2_350 * 16_384   # an epoch of 2,350 full batches
  train = ft.Split("train", [], {"input_ids": np.zeros((rows, 1), np.int8)})
  assert finetune.schedule(c, train) == (2_350, 2_350, 700)   # the fixed count, not 10%
  _, lr = optimizer_lib.from_config(c, num_train_steps=2_350, warmup_steps=700)
  return np.array([float(lr(int(t))) for t in STEPS])


def test_stage1_schedule_warms_up_700_steps_then_cosine_to_zero():
  """finetune.schedule takes the fixed 700 warmup steps, then hf_cosine: the formula of
  transformers' get_cosine_schedule_with_warmup (lr t / w, then lr (1 + cos(pi (t - w) /
  (T - w))) / 2)."""
  w, t_end = 700, 2_350
  want = np.where(STEPS < w, 2e-4 * STEPS / w,
                  2e-4 * 0.5 * (1 + np.cos(np.pi * (STEPS - w) / (t_end - w))))
  got = _stage1_schedule()
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-10)
  assert got[6] == pytest.approx(1e-4, rel=1e-6)    # half-way down at step 1,525


@pytest.mark.slow
def test_hf_cosine_is_transformers_get_cosine_schedule_with_warmup():
  """The same steps against transformers' own scheduler (contrastors' schedule_type cosine)."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2e-4)
  ref = transformers.get_cosine_schedule_with_warmup(opt, 700, 2_350)
  want = [2e-4 * ref.lr_lambdas[0](int(t)) for t in STEPS]
  np.testing.assert_allclose(_stage1_schedule(), want, rtol=1e-5, atol=1e-10)


@pytest.mark.slow
def test_stage1_runlocal_trains_with_grad_cache_in_the_loop(tmp_path, capsys):
  """The runlocal stage 1 (GradCache in 2 chunks, cosine) on the translated-words pairs from a
  tiny random BERT: the loop says GradCache is on, trains, and its learning rate decays."""
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_embedding_test  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.tasks import tasks_registry_test  # pylint: disable=g-import-not-at-top
  # pylint: disable-next=protected-access
  pretrained = tasks_registry_test._pretrained(tmp_path / "ckpt", finetune_test.WORDS)
  data = tmp_path / "data"
  data.mkdir()
  tasks_embedding_test._data(data, n_train=64, n_dev=16)  # pylint: disable=protected-access
  c = finetune_config.get_config("modernbert_embed_stage1,runlocal")
  c.init_checkpoint, c.vocab_file = pretrained
  c.data_dir, c.max_seq_length, c.batch_size, c.eval_batch_size = str(data), 16, 16, 16
  c.num_train_epochs, c.learning_rate, c.log_every, c.do_predict = 4.0, 1e-3, 4, False
  c.embedding.query_prompt = c.embedding.document_prompt = ""   # not in the toy vocab
  summary = finetune.finetune(c, str(tmp_path / "run"))
  out = capsys.readouterr().out
  assert "GradCache: each device's 2 rows embedded in 2 chunks of 1" in out   # 8 CPU devices
  assert summary["steps"] == 16 and summary["best_metric"] == "ndcg@10"
  lrs = [v for _, v in metrics_writer.read_scalars(
      os.path.join(tmp_path, "run", "tensorboard"))["train/learning_rate"]]
  assert max(lrs) > 5e-4 and lrs[-1] < 0.2 * max(lrs), lrs   # warmup, then the cosine's tail
  with open(os.path.join(summary["best_checkpoint"], "bert_config.json"), encoding="utf-8") as f:
    assert json.load(f)["task_type"] == "embedding"
