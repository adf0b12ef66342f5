"""TinyBERT (bert_jax/families/tinybert/__init__.py): the presets and their counts against transformers'
BertModel, general distillation through `python -m bert_jax.train`, and a TinyBERT transformers
folder (model_type bert with TinyBERT's extra keys and fit_dense) through BERT's converter."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax import families
from bert_jax.objectives import layerwise
from bert_jax.models import model as model_lib
from tests.testlib import xla_test_flags

ROOT = tests.ROOT


def test_presets_are_the_family_s_and_the_recipe_is_general_distillation():
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  for preset, (layers, width, ffn) in {"tinybert-4l-312": (4, 312, 1200),
                                       "tinybert-6l-768": (6, 768, 3072),
                                       "tinybert-tiny": (1, 64, 256),
                                       "tinybert-1l-128": (1, 128, 512)}.items():
    assert families.of_preset(preset).name == "tinybert"
    c = model_lib.get_bert_config(preset)
    assert (c.num_layers, c.hidden_size, c.intermediate_size, c.objectives) == (
        layers, width, ffn, "mlm")
    assert c.type_vocab_size == 2 and c.has_pooler          # a BertModel
  c = pretrain.get_config("tinybert-4l-312")
  assert (c.alpha_emb, c.alpha_hidden, c.alpha_att, c.alpha_pred, c.fit_size) == (
      1.0, 1.0, 1.0, 0.0, 768)
  assert c.model.attention == "xla" and c.layer_map == ""
  assert pretrain.get_config("tinybert-tiny").fit_size == 128   # BERT-tiny's width
  # distilbert-tiny's shape, as wide as BERT-tiny: no projection; BERT's tiny-1l body.
  assert pretrain.get_config("tinybert-1l-128").fit_size == 0
  assert (dataclasses.replace(model_lib.get_bert_config("tinybert-1l-128"), family="bert",
                              objectives="mlm,nsp")
          == model_lib.get_bert_config("tiny-1l"))
  tiny = model_lib.get_bert_config("tinybert-tiny")
  assert isinstance(families.get("tinybert").pretraining_model(tiny), layerwise.LayerwiseModel)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tinybert-4l-312", "tinybert-6l-768"])
def test_parameter_counts_equal_transformers_bertmodel(preset):
  """BertModel of the same config (on torch's meta device: shapes, no memory): 14,350,248 and
  66,955,008 (the docs' figures)."""
  torch = pytest.importorskip("torch")
  import transformers  # pylint: disable=g-import-not-at-top
  c = model_lib.get_bert_config(preset)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: layerwise.LayerwiseModel(c).init(
      jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2]))["params"]
  hf = transformers.BertConfig(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
                               num_hidden_layers=c.num_layers, num_attention_heads=c.num_heads,
                               intermediate_size=c.intermediate_size)
  with torch.device("meta"):
    want = sum(p.numel() for p in transformers.BertModel(hf).parameters())
  assert model_lib.count_params(shapes["bert"]) == want
  assert want == {"tinybert-4l-312": 14_350_248, "tinybert-6l-768": 66_955_008}[preset]


def _tinybert_folder(path):
  """A transformers BertForPreTraining folder as TinyBERT's general checkpoints are: model_type
  bert, their extra config keys, and fit_dense.{weight,bias} beside the BERT weights."""
  torch = pytest.importorskip("torch")
  from safetensors.torch import load_file, save_file  # pylint: disable=g-import-not-at-top
  from tests.testlib import hf_testlib  # pylint: disable=g-import-not-at-top
  model = hf_testlib.random_hf_model(hf_testlib.hf_config())
  hf_testlib.save_hf(model, path)
  with open(os.path.join(path, "config.json")) as f:
    config = json.load(f)
  assert config["model_type"] == "bert"
  config.update(fit_size=128, pre_trained="", training="", cell={}, structure=[], emb_size=64)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  weights = load_file(os.path.join(path, "model.safetensors"))
  weights["fit_dense.weight"] = torch.randn(128, 64)
  weights["fit_dense.bias"] = torch.zeros(128)
  save_file(weights, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  return model


@pytest.mark.slow
def test_a_tinybert_transformers_folder_imports_and_exports_through_bert_s_converter(tmp_path):
  """Imported: BERT's family, fit_dense left out with its reason; exported back: transformers
  loads it and its hidden states are the original's, bit for bit."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax import convert  # pylint: disable=g-import-not-at-top
  src = str(tmp_path / "tinybert")
  model = _tinybert_folder(src)
  params, config, meta = convert.import_checkpoint(src)
  assert config.family == "bert" and set(params) == {"bert", "mlm_head", "nsp_head"}
  assert set(meta["ignored_variables"]) >= {"fit_dense.weight", "fit_dense.bias"}
  assert "TinyBERT" in meta["ignored_variables"]["fit_dense.weight"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  run = lambda *a: subprocess.run([sys.executable, "-m", "bert_jax.convert", *a], env=env,  # noqa: E731
                                  capture_output=True, text=True, cwd=ROOT, timeout=300)
  r = run(f"--input={src}", f"--output={tmp_path}/orbax")
  assert r.returncode == 0, r.stderr[-3000:]
  r = run(f"--input={tmp_path}/orbax", f"--output={tmp_path}/hf")
  assert r.returncode == 0, r.stderr[-3000:]
  back = transformers.BertModel.from_pretrained(str(tmp_path / "hf")).eval()
  ids = torch.tensor([[2, 5, 7, 9, 3, 0]])
  mask = (ids > 0).long()
  with torch.no_grad():
    want = model.bert(ids, attention_mask=mask).last_hidden_state
    got = back(ids, attention_mask=mask).last_hidden_state
  np.testing.assert_array_equal(got.numpy(), want.numpy())


@pytest.mark.slow
def test_python_m_bert_jax_train_distils_tinybert_from_a_bert_teacher(tmp_path):
  """General distillation of tinybert-tiny from a BERT-tiny export through the CLI: every
  layer-wise loss logged, the checkpoint holds the student and fit_dense, the teacher recorded;
  a wrong fit_size and a layer map past the teacher's depth are one line and exit 2."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  teacher_config = model_lib.get_bert_config("tiny", vocab_size=128)
  teacher = str(tmp_path / "teacher")
  params = jax.jit(lambda k: nn.meta.unbox(pretraining_heads.init_params(teacher_config, k)))(
      jax.random.PRNGKey(1))
  ckpt_lib.save_params(teacher, params, teacher_config)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS=xla_test_flags.with_devices(2))
  common = ["--config=bert_jax/configs/pretrain.py:tinybert-tiny,runlocal",
            f"--config.teacher_checkpoint={teacher}", "--config.train_input_files=synthetic",
            "--config.model.vocab_size=128", "--config.seq_length=32",
            "--config.max_predictions_per_seq=5", "--config.batch_size=4",
            "--config.warmup_steps=1", "--config.log_every=1", "--config.checkpoint_every=4",
            "--config.async_checkpointing=False", "--config.num_train_steps=4"]

  def train(workdir, *extra):
    return subprocess.run([sys.executable, "-m", "bert_jax.train", f"--workdir={workdir}",
                           *common, *extra], env=env, capture_output=True, text=True,
                          cwd=ROOT, timeout=500)

  for extra, words in ((["--config.fit_size=64"], "--config.fit_size=128"),
                       (["--config.layer_map=3"], "config.layer_map=3")):
    r = train(str(tmp_path / "bad"), *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and words in lines[0], r.stderr[-3000:]
  r = train(str(tmp_path / "run"))
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  scalars = metrics_writer.read_scalars(str(tmp_path / "run" / "tensorboard"))
  for part in ("distill_emb", "distill_hidden", "distill_att", "mlm"):
    assert len(scalars[f"train/{part}_loss"]) == 4, sorted(scalars)
  assert all(np.isfinite(v) for _, v in scalars["train/loss"])
  d = ckpt_lib.describe(str(tmp_path / "run"))
  assert d.config.family == "tinybert" and d.meta["teacher"]["path"] == teacher
  params = ckpt_lib.read_params(d)
  assert set(params) == {"bert", "mlm_head", "fit_dense"}
  assert params["fit_dense"]["kernel"].shape == (64, 128)


@pytest.mark.slow
def test_task_distillation_layers_from_a_fine_tuned_teacher_then_its_soft_labels(tmp_path,
                                                                                  capsys):
  """TinyBERT's task distillation in its two stages, with a BERT fine-tuned on the task as the
  teacher, from a general-distilled student (--config.init_checkpoint, fit_dense included):
  1. the intermediate layers (train, alpha_pred=0: the teacher's body alone, no MLM
  head, teaches), 2. the prediction layer (finetune --config.distill_teacher, alpha 1 at T=1:
  the gradient of TinyBERT's soft cross-entropy) on the tinybert student's workdir."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  vocab_file = tasks_testlib.write_vocab(str(tmp_path), " ".join(finetune_test.WORDS) + " .")
  vocab_size = tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size
  bert_cfg = model_lib.get_bert_config("tiny", vocab_size=vocab_size)      # 2 x 128, 2 heads
  bert = ckpt_lib.save_params(str(tmp_path / "bert"), jax.jit(lambda r: nn.unbox(
      pretraining_heads.init_params(bert_cfg, r)))(jax.random.PRNGKey(2)), bert_cfg,
      meta={"do_lower_case": True})
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)   # pylint: disable=protected-access
  teacher, _ = finetune_test._one_step(tmp_path, (bert, vocab_file), "glue_sst2")  # pylint: disable=protected-access
  teacher = teacher["best_checkpoint"]
  assert set(ckpt_lib.load_params(teacher)[0]) == {"bert", "classifier"}   # no MLM head
  # 1. The layers (synthetic rows of the task's vocab stand in for the task's records).
  c = pretrain.get_config("tinybert-tiny,runlocal")
  c.train_input_files, c.vocab_file, c.do_lower_case = "synthetic", vocab_file, True
  c.teacher_checkpoint = teacher
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 5, 8   # 8 test devices
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 2, 1, 1, 2
  c.async_checkpointing = False
  # 0. General distillation from the pre-trained BERT; stage 1 starts from it.
  c.teacher_checkpoint = bert
  general = str(tmp_path / "general")
  train.train_and_evaluate(c, general)
  c.teacher_checkpoint, c.init_checkpoint = teacher, general
  student = str(tmp_path / "student")
  train.train_and_evaluate(c, student)
  assert "initialised parameters from" in capsys.readouterr().out
  scalars = metrics_writer.read_scalars(os.path.join(student, "tensorboard"))
  assert len(scalars["train/distill_att_loss"]) == 2 and "train/distill_pred_loss" not in scalars
  # 2. The prediction layer through the fine-tuning CLI's distillation.
  capsys.readouterr()
  config = finetune_test._config("glue_sst2", (student, vocab_file), tmp_path,  # pylint: disable=protected-access
                                 num_train_epochs=1.0, do_predict=False, log_every=1,
                                 distill_teacher=teacher, distill_alpha=1.0,
                                 distill_temperature=1.0)
  summary = finetune.finetune(config, str(tmp_path / "student_ft"))
  assert summary["steps"] == 1
  assert f"distill_teacher: {teacher}" in capsys.readouterr().out
  scalars = metrics_writer.read_scalars(str(tmp_path / "student_ft" / "tensorboard"))
  ((_, loss),), ((_, soft),) = (scalars[f"train/{k}"] for k in ("loss", "distill_loss"))
  np.testing.assert_allclose(loss, soft, rtol=1e-5)
  params, config, _ = ckpt_lib.load_params(summary["best_checkpoint"])
  assert config.family == "tinybert" and set(params) == {"bert", "classifier"}
