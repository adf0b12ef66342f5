"""TinyBERT (Jiao et al. 2019, arXiv 1909.10351): a BertModel of fewer, narrower layers distilled
from a frozen BERT teacher layer by layer (bert_jax/objectives/layerwise.py: embedding and hidden-state MSE
through a learned projection, attention-score MSE, over TinyBERT's uniform layer map).

What the family declares: its presets (the paper's two students) and recipe (general
distillation's loss), the student network (BertModel + MLM head + fit_dense) and its step with the
frozen teacher, their FLOPs. Everything else is BERT's: the body is a BertModel (token types,
pooler), so fine-tuning, features and fill-mask are BERT's, and a TinyBERT transformers folder is
model_type "bert" (TinyBERT's extra config keys, fit_size / pre_trained / ..., are not read), so
it converts both ways through BERT's converter; an export writes BertForPreTraining's names.

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:tinybert-4l-312 \
      --config.teacher_checkpoint=TEACHER --config.train_input_files=... --workdir=...
"""

import dataclasses
import importlib

from bert_jax.families import bert
from bert_jax.families import registry as families


def _layerwise():
  """bert_jax/objectives/layerwise.py, imported at the first hook call, not when the registry loads the
  families (it reads checkpoints and teachers: orbax, ~0.3 s of every CLI's start otherwise)."""
  return importlib.import_module("bert_jax.objectives.layerwise")


def _hook(name):
  """layerwise.<name>, looked up when called."""
  def call(*args, **kwargs):
    return getattr(_layerwise(), name)(*args, **kwargs)
  call.__name__ = call.__qualname__ = name
  return call

_TINYBERT = dict(family="tinybert", objectives="mlm")

# The paper's students (Table 1; huawei-noah/TinyBERT's General_4L_312D / General_6L_768D
# configs): 4 x 312, FFN 1,200, 12 heads of 26: 14,350,248 parameters as transformers'
# BertModel counts them (pooler included), 14.5M in the paper with fit_dense [312, 768]; 6 x 768
# is BERT-base's width at half its depth: 66,955,008 (tests/bert_jax/families/tinybert/tinybert_test.py counts both).
PRESETS = {
    "tinybert-4l-312": dict(_TINYBERT, num_layers=4, hidden_size=312, num_heads=12,
                            intermediate_size=1200),
    "tinybert-6l-768": dict(_TINYBERT, num_layers=6, hidden_size=768, num_heads=12,
                            intermediate_size=3072),
    # A student of the tiny BERT preset (2 x 128, 2 heads) for tests and laptops: 1 x 64.
    "tinybert-tiny": dict(_TINYBERT, num_layers=1, hidden_size=64, num_heads=2,
                          intermediate_size=256),
    # distilbert-tiny's shape (1 x 128, 2 heads, FFN 512: BERT's tiny-1l), as wide as `tiny`:
    # no fit_dense. benchmarks/compact_students.py sets it beside a DistilBERT and a from-scratch
    # model of the same shape.
    "tinybert-1l-128": dict(_TINYBERT, num_layers=1, hidden_size=128, num_heads=2,
                            intermediate_size=512),
}
# The width of each preset's teacher (fit_size): BERT-base's 768 (the paper's), tiny's 128;
# 0 = the student is as wide as its teacher (no projection).
TEACHER_WIDTH = {"tinybert-tiny": 128, "tinybert-1l-128": 0}


def recipe(c, preset):
  """TinyBERT's general distillation (their general_distill.py: rep + att MSE, lr 1e-4, the
  student from scratch), with fit_size = BERT-base's 768, their teacher's width: a teacher of
  another width takes --config.fit_size=ITS_WIDTH (a one-line error says so)."""
  _layerwise().recipe_fields(c, fit_size=TEACHER_WIDTH.get(preset, 768))
  c.learning_rate = 1e-4
  # The attention scores are read from every layer: only the xla kernel makes them
  # (layerwise.check_kernels refuses a fused one at start-up).
  c.model.attention = "xla"


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="tinybert", presets=PRESETS, plain_teacher=False, title="TinyBERT",
    summary="TinyBERT (Jiao et al. 2019): a small BertModel distilled layer by layer (hidden "
            "states, attention scores) from a frozen BERT teacher",
    exact_objectives=("mlm",), recipe=recipe,
    # The student (BertModel + MLM head + fit_dense) and its step: bert_jax/objectives/layerwise.py's.
    pretraining_model=_hook("LayerwiseModel"), forward=_hook("plain_forward"),
    flops_per_sequence=_hook("flops_per_sequence"), load_teacher=_hook("load_teacher"),
    init_from_teacher=_hook("init_from_teacher"), planning_teacher=_hook("planning_teacher"),
    step_parts=_hook("step_parts"),
    # A TinyBERT folder is model_type "bert": BERT's family reads it (tests/bert_jax/families/tinybert/tinybert_test.py).
    hf_model_types=(), tf_config_names=(), config_marker_keys=(),
    train_further_note=" and the same --config.teacher_checkpoint"))
