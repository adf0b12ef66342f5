"""DistilBERT (Sanh et al. 2019): a student BERT (half the depth, no token types, no pooler)
distilled from a frozen teacher in the same step: bert_jax/objectives/layerwise.py's objective at HF's
weights (the prediction layer's KL x T^2, MLM, the last hidden states' cosine); bert_jax/
distil.py (beside this file) loads and checks its teacher; objectives/teacher.py (shared with
the layer-wise students) records it and initialises the student from it.

What the family declares: its presets and recipe (HF's distillation command), the student's step
with its frozen teacher and their FLOPs, transformers' DistilBertForSequenceClassification head on
[CLS], and transformers' DistilBERT names (families/distilbert/convert.py).
"""

import dataclasses
import importlib

from flax import linen as nn

from bert_jax.families import registry as families
from bert_jax.models import model as model_lib
from bert_jax.families import bert

_DISTILBERT = dict(family="distilbert", objectives="mlm", type_vocab_size=0)

# DistilBERT (Sanh et al. 2019; bert_jax/families/distilbert/distil.py): BERT-base halved in depth, no token types, no
# pooler; 66,362,880 parameters (DistilBertModel), 66,985,530 with the MLM head
# (DistilBertForMaskedLM, decoder tied), as transformers counts them (tests/bert_jax/families/distilbert/distil_test.py).
# tiny / mini: the tiny / mini BERT presets halved in depth (students of those teachers).
PRESETS = {f"distilbert-{name}": dict(_DISTILBERT, num_layers=l, hidden_size=h, num_heads=h // 64,
                                      intermediate_size=4 * h)
           for name, l, h in (("tiny", 1, 128), ("mini", 2, 256), ("base", 6, 768))}


def recipe(c, preset):
  """DistilBERT (Sanh et al. 2019; transformers examples/research_projects/distillation, train.py
  and its README's command): the loss 5 x KL at T=2 + 2 x MLM + 1 x cosine, lr 5e-4, no NSP
  (records from create_pretraining_data --no_nsp), token masking. The shared objective's fields
  (bert_jax/objectives/layerwise.py), its layer parts off: --config.alpha_hidden=1 etc. add them."""
  del preset
  from bert_jax.objectives import layerwise  # pylint: disable=g-import-not-at-top
  layerwise.recipe_fields(c, fit_size=0)   # a student as wide as its teacher: no projection
  c.alpha_emb = c.alpha_hidden = c.alpha_att = 0.0
  c.alpha_ce = 5.0                 # KL(teacher/T || student/T) x T^2 on the masked positions
  c.alpha_mlm = 2.0                # the student's own MLM cross-entropy
  c.alpha_cos = 1.0                # 1 - cos(student, teacher) last hidden states, real tokens
  c.temperature = 2.0              # T of the soft targets
  # Teacher layer of each student layer, comma-separated; "" = every other one (0, 2, 4, ...;
  # the paper). HF's extract_distilbert.py took 0,2,4,7,9,11 of BERT-base. The student starts
  # from them, and (+ 1) they are the layer parts' map unless --config.layer_map gives one.
  c.teacher_layers = ""
  c.learning_rate = 5e-4


def _distil():
  """distil.py (DistilBERT's teacher), imported at the first hook call, not when the registry
  loads the families (it reads checkpoints: orbax)."""
  return importlib.import_module("bert_jax.families.distilbert.distil")


def load_teacher(config, model_config):
  return _distil().load_teacher(config, model_config)


def planning_teacher(config, model_config):
  return _distil().planning_teacher(config, model_config)


def step_parts(config, model_config, teacher, dummy_batch, mesh, rules):
  """layerwise.py's step (the student's forward, the alpha_* weights, the teacher loaded once
  onto the mesh: trainer_lib.build_steps(frozen=)) with DistilBERT's teacher (distil.py's
  checks) and its MLM head, which the student starts from."""
  from bert_jax.objectives import layerwise  # pylint: disable=g-import-not-at-top
  teacher = teacher or _distil().load_teacher(config, model_config)
  return layerwise.step_parts(config, model_config, teacher, dummy_batch, mesh, rules,
                              teacher_head=True)


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """The student's training FLOPs plus, with a teacher, the teacher's forward."""
  if teacher_config is None:
    return bert.flops_per_sequence(cfg, seq_length, num_predictions, num_nsp)
  from bert_jax.objectives import teacher  # pylint: disable=g-import-not-at-top
  return teacher.flops_per_sequence(cfg, teacher_config, seq_length, num_predictions,
                                    bert.flops_per_sequence)


# transformers' DistilBertConfig.seq_classif_dropout default: the dropout between
# pre_classifier and classifier in DistilBertForSequenceClassification / ForMultipleChoice (the
# released DistilBERT classifiers, e.g. distilbert-base-uncased-finetuned-sst-2, are trained with
# it). Not hidden_dropout_prob (0.1): HF keeps the two apart, and so do we.
SEQ_CLASSIF_DROPOUT = 0.2


def cls_logits(config, out, num_labels, deterministic):
  """DistilBERT's head on [CLS], as transformers' DistilBertForSequenceClassification:
  pre_classifier dense H -> H, ReLU, dropout, classifier dense H -> L; the names are HF's, so a
  fine-tuned tree reads {"bert", "pre_classifier", "classifier"} like HF's {distilbert, ...}.

  Why not BERT's head: DistilBERT has no pooler (Sanh et al. drop it with the token types), so
  BERT's dropout + dense on the tanh-pooled [CLS] has nothing pre-trained to read; transformers
  puts this fresh H x H + ReLU layer in the pooler's place (ReLU, not tanh, as HF), and every
  released DistilBERT classifier carries it. No dropout before pre_classifier, as HF.
  Called inside the head's compact __call__, so both layers are that head's submodules.
  """
  x = model_lib._dense(config, config.hidden_size, ("embed", "embed2"),   # [B, (K,) H]
                       "pre_classifier")(out["cls_output"])
  x = nn.relu(x)
  x = nn.Dropout(SEQ_CLASSIF_DROPOUT)(x, deterministic=deterministic)     # [B, (K,) H]
  return bert.head_dense(config, num_labels, "classifier")(x)             # [B, (K,) L]


def describe(config, purpose, params_keys=(), do_train=True):
  if purpose == "predict":
    return (f"DistilBERT: fill-mask with its MLM head ({config.num_layers} layers of width "
            f"{config.hidden_size}; no token types, no sentence-pair head)")
  if purpose == "features":   # BertModel without token types: segment ids unused
    return (f"DistilBERT: features of params['bert'] ({config.num_layers} layers of width "
            f"{config.hidden_size}; no token types: a pair's segment_ids are recorded, not "
            "embedded)")
  rest = sorted(set(params_keys) - {"bert"})
  if not do_train:   # evaluating a fine-tuned export: body and head as they are
    return f"DistilBERT: evaluating params['bert'] with its fine-tuned head ({', '.join(rest)})"
  return (f"DistilBERT: fine-tuning params['bert'] (embeddings + {config.num_layers} "
          f"layers of width {config.hidden_size}; no token types: a pair is [CLS] a [SEP] "
          "b [SEP] without segment embeddings; no pooler)"
          + (f"; not loaded: {', '.join(rest)}" if rest else "") + "; a [CLS] task gets "
          f"DistilBERT's head, new (pre_classifier dense + ReLU on [CLS], dropout "
          f"{SEQ_CLASSIF_DROPOUT:g}, "
          "classifier: as transformers' DistilBertForSequenceClassification)")


# transformers' DistilBertForMaskedLM, one folder (families/distilbert/convert.py).
import_hf, export_hf = bert.own_hf_converter("distilbert")


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="distilbert", presets=PRESETS, title="DistilBERT",
    summary="DistilBERT (Sanh et al. 2019): a half-depth student distilled from a frozen teacher",
    token_types=False, pooler=False, exact_objectives=("mlm",), recipe=recipe,
    load_teacher=load_teacher, planning_teacher=planning_teacher,
    step_parts=step_parts, flops_per_sequence=flops_per_sequence, cls_logits=cls_logits,
    describe=describe, hf_model_types=("distilbert",), tf_config_names=(),
    config_marker_keys=(), import_hf=import_hf, export_hf=export_hf,
    hf_class="DistilBertForMaskedLM",
    train_further_note=" and the same --config.teacher_checkpoint"))
