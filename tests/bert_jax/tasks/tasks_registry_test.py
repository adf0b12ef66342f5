"""Task types are one module each in one table (bert_jax/tasks): the built-in ones, what the loop
names (none), and a toy task type defined here, in the test, that fine-tunes end to end with no
edit anywhere else: its own reader, head, loss, metric and prediction files."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import dataclasses
import json
import os
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import families
from bert_jax.training import finetune_tasks as ft
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax import tasks
from bert_jax.configs import finetune as finetune_config
from bert_jax.tasks import common
from data_pipelines import tasks as data_tasks
from data_pipelines.tasks.common import TaskDataError, pack, read_text

ROOT = tests.ROOT
BUILTIN = ("classification", "multiple_choice", "regression", "span", "tagging")


def test_every_builtin_type_is_found_and_every_named_task_has_one():
  assert set(BUILTIN) <= set(tasks.names())
  for name in BUILTIN:   # one module each, named as the type
    assert tasks.get(name).create_head.__module__ == f"bert_jax.tasks.{name}"
  assert set(tasks.named_tasks()) == set(data_tasks.TASKS)
  for name, task in tasks.named_tasks().items():
    assert tasks.of(task).named_tasks[name] is task
  with pytest.raises(ValueError, match=r"unknown task type 'ranking'; one of .*classification"):
    tasks.get("ranking")
  with pytest.raises(ValueError, match="task 'cola' of task type 'copy' is already declared by "
                                       "task type 'classification'"):
    tasks.register(dataclasses.replace(tasks.get("classification"), name="copy"))
  assert "copy" not in tasks.names()


def test_the_loop_and_the_clis_name_no_task_type():
  """The fine-tuning loop, its task glue, the heads and the CLIs look task types up: no quoted
  type name in their source (a `"span"` there would be a branch the table should hold)."""
  names = "|".join(tasks.names())
  for module in ("finetune", "training/finetune_tasks", "models/heads", "predict",
                 "extract_features", "cli", "inference/loading", "training/trainer_lib"):
    with open(os.path.join(ROOT, "bert_jax", f"{module}.py"), encoding="utf-8") as f:
      found = re.findall(rf"[\"']({names})[\"']", f.read())
    assert not found, f"bert_jax/{module}.py names task types {found}"


def test_old_exports_record_the_type_as_task_family():
  assert tasks.recorded_type({"task_type": "span"}) == "span"
  assert tasks.recorded_type({"task_family": "tagging"}) == "tagging"   # before bert_jax/tasks
  assert tasks.recorded_type({"task": "sst2"}) is None


# ---------------------------------------------------------------------------------------------
# A toy task type, declared here and nowhere else: the length of a sentence in word pieces / 10,
# regressed from the mean of the encoder's sequence output (a pooling head no built-in type has).
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ToyTask:
  name: str = "toy_length"
  type: str = "toy_length"
  files: dict = dataclasses.field(default_factory=lambda: {
      "train": "train.txt", "dev": "dev.txt", "test": "test.txt"})
  eval_splits: tuple = ("dev",)
  metrics: tuple = ("neg_mse",)


class MeanPoolScore(nn.Module):
  config: Any

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    out = families.get(self.config.family).encode(self.config, input_ids, input_mask,
                                                  segment_ids, deterministic=deterministic)
    m = input_mask[..., None].astype(jnp.float32)                         # [B, T, 1]
    pooled = jnp.sum(out["sequence_output"] * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)  # [B, H]
    return nn.Dense(1, name="score")(pooled)[:, 0].astype(jnp.float32)   # [B]


def _load_split(task, split, tokenizer, config, is_training):
  path = os.path.join(config.data_dir, task.files[split])
  lines = common.limit([l for l in read_text(path).splitlines() if l.strip()], config,
                       is_training)
  ids = [x[:config.max_seq_length - 2] for x in tokenizer.encode(lines)]
  rows = [pack(x, None, tokenizer.vocab, config.max_seq_length) for x in ids]
  features = {k: np.stack([r[i] for r in rows]) for i, k in enumerate(ft.INPUT_KEYS)}
  features["target"] = np.array([len(x) / 10 for x in ids], np.float32)
  return common.Split(split, lines, features)


def _loss(outputs, batch):
  value = common.weighted_mean((outputs - batch["target"]) ** 2, batch["example_weights"])
  return value, {"loss": value}


def _write(task, split, outputs, output_dir):
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, f"{task.name}_{split.name}.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(f"{s:.4f}\t{line}\n" for s, line in zip(outputs["score"], split.examples))
  return path


def _evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  if output_dir:
    _write(task, split, outputs, output_dir)
  return {"neg_mse": -float(np.mean((outputs["score"] - split.features["target"]) ** 2))}


TOY = tasks.TaskType(
    name="toy_length", summary="sentence length from the mean-pooled sequence output",
    named_tasks={"toy_length": ToyTask()}, label_keys=("target",),
    load_split=_load_split, create_head=lambda cfg, num_labels, num_choices: MeanPoolScore(cfg),
    input_shape=lambda seq_length, num_choices: (1, seq_length), loss=_loss,
    predict_outputs=lambda outputs: {"score": outputs}, evaluate=_evaluate,
    write_test=lambda task, split, outputs, tokenizer, config, d: [_write(task, split, outputs,
                                                                          d)],
    dev_prediction_files=True)


@pytest.fixture
def toy():
  tasks.register(TOY)
  yield TOY
  tasks.unregister(TOY.name)


def _data(directory):
  rng = np.random.default_rng(0)
  words = "the a cat dog man woman sat ran saw park mat house good bad".split()
  for split, n in (("train", 24), ("dev", 8), ("test", 5)):
    lines = [" ".join(rng.choice(words, int(rng.integers(1, 12)))) for _ in range(n)]
    (directory / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_a_toy_task_type_plugs_into_the_task_glue(toy, tmp_path):
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  _data(tmp_path)
  c = finetune_config.get_config("custom,runlocal")
  c.task, c.data_dir, c.max_seq_length = "toy_length", str(tmp_path), 16
  task = ft.build_task(c)
  assert task.type == "toy_length" and ft.primary_metric(task) == "neg_mse"
  assert ft.input_keys(task) == ft.INPUT_KEYS + ("target",)
  assert ft.available_splits(task, c) == (["dev"], ["test"])
  tokenizer = tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(
      str(tmp_path), "the a cat dog man woman sat ran saw park mat house good bad"))
  dev = ft.load_split(task, "dev", tokenizer, c, False)
  assert dev.features["input_ids"].shape == (8, 16) and dev.features["target"].shape == (8,)
  cfg = model_lib.get_bert_config("tiny", vocab_size=tokenizer.vocab.size, hidden_size=32,
                                  num_heads=2, intermediate_size=64, max_position_embeddings=16)
  model = heads.create_model("toy_length", cfg)
  inputs = heads.dummy_inputs("toy_length", 16)
  params = nn.unbox(model.init(jax.random.PRNGKey(0), *inputs)["params"])
  assert set(params) == {"bert", "score"}
  loss, m = ft.loss_fn("toy_length", jnp.array([1.0, 2.0, 5.0]),
                       {"target": jnp.array([1.5, 2.0, 0.0]),
                        "example_weights": jnp.array([1.0, 1.0, 0.0])})
  assert float(loss) == pytest.approx(0.125) and float(m["loss"]) == float(loss)
  out = ft.predict_outputs("toy_length", jnp.zeros(8))
  assert ft.evaluate(task, dev, out, tokenizer, c)["neg_mse"] < 0
  assert ft.single_class_warning(task, dev, out) is None   # the toy declares no warning
  c.task, c.custom.type = "custom", "toy_length"   # no custom form: its named task only
  with pytest.raises(TaskDataError, match="config.custom.type='toy_length'; use classification"):
    ft.build_task(c)


def _pretrained(d, words):
  """finetune_test's tiny 'pre-trained' checkpoint (random BertForPreTraining) and its vocab."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  d.mkdir()
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(words) + " .")
  vocab = tasks_testlib.ReferenceTokenizer(vocab_file).vocab
  cfg = model_lib.get_bert_config("tiny", vocab_size=vocab.size, max_position_embeddings=128,
                                  hidden_size=64, num_heads=2, intermediate_size=128)
  params = nn.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  return ckpt_lib.save_params(str(d / "export"), params, cfg,
                              meta={"do_lower_case": True}), vocab_file


@pytest.mark.slow
def test_a_toy_task_type_fine_tunes_end_to_end(toy, tmp_path):
  """finetune.finetune on the toy type: trains, evaluates with its metric, keeps the best export
  (recording task_type), writes its dev and test prediction files."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  pretrained = _pretrained(tmp_path / "ckpt", finetune_test.WORDS)
  data = tmp_path / "data"
  data.mkdir()
  _data(data)
  c = finetune_test._config("custom", pretrained, data, num_train_epochs=2.0, log_every=1,
                            max_seq_length=16)
  c.task = "toy_length"
  summary = finetune.finetune(c, str(tmp_path / "run"))
  assert summary["steps"] == 6 and not summary["stopped_early"]   # 24 rows / 8, two epochs
  assert summary["best_metric"] == "neg_mse" and summary["best_score"] < 0
  assert [sorted(h) for h in summary["history"]] == [["epoch", "eval/dev/neg_mse", "step"]] * 2
  with open(os.path.join(summary["best_checkpoint"], "bert_config.json"), encoding="utf-8") as f:
    meta = json.load(f)
  assert meta["task"] == "toy_length" and meta["task_type"] == "toy_length"
  written = sorted(os.listdir(tmp_path / "run" / "predictions"))
  assert written == ["toy_length_dev.txt", "toy_length_test.txt"]
  with open(tmp_path / "run" / "predictions" / "toy_length_test.txt", encoding="utf-8") as f:
    assert len(f.read().splitlines()) == 5
