"""BERT (Devlin et al. 2018): the family every other one starts from.

Its record holds the default of every hook (families/__init__.py: a family that leaves a hook None
gets BERT's): BertForPreTraining trained on MLM + NSP, BertModel's pooled [CLS] under a dropout +
dense head, fill-mask through the tied MLM head, google TF and transformers `bert` checkpoints by
the name table of convert/names.py. The RoBERTa recipe is BERT with --config.model.objectives=mlm
on --no_nsp records (docs/models.md), not a family of its own.
"""

import importlib
import os

import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bert_jax.families import registry as families
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads


def _miniatures():
  # The 24 BERT miniatures (Turc et al., 2019): L layers, H hidden, H/64 heads, 4H FFN.
  return {f"L-{l}_H-{h}": dict(num_layers=l, hidden_size=h, num_heads=h // 64,
                               intermediate_size=4 * h)
          for l in (2, 4, 6, 8, 10, 12) for h in (128, 256, 512, 768)}


PRESETS = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512),
    # BERT-tiny's first layer alone (not one of google's miniatures, which start at 2 layers):
    # distilbert-tiny's and tinybert-1l-128's shape, trained from scratch beside them in
    # benchmarks/compact_students.py.
    "tiny-1l": dict(num_layers=1, hidden_size=128, num_heads=2, intermediate_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, intermediate_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, intermediate_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
    **_miniatures(),
}


# ----------------------------------------------------------------------------------------------
# FLOPs (train.py's TFLOP/s and MFU, plan's estimates, the benchmarks' equal-compute budgets).
# ----------------------------------------------------------------------------------------------
def attention_flops_per_sequence(cfg, seq_length, kinds=("global", "local")):
  """Training FLOPs of one sequence's attention scores and context: 12 x T x S x H a layer (3 x
  forward, 2 a multiply-add, QK^T and PV), S = T keys on a global layer and min(T, W + 1) on a
  windowed one (ModernBERT's local layers, |i - j| <= W/2: what the blocked kernel's output
  depends on, not the 3W/2 keys it computes). Every BERT-family layer is global: 12 x L x T^2 x H.
  kinds: the layers counted, "global" and/or "local" (windowed)."""
  t = seq_length
  keys = [t if window is None else min(t, window + 1)
          for window, _ in map(cfg.layer_attention, range(cfg.num_layers))
          if ("global" if window is None else "local") in kinds]
  return 12 * t * cfg.hidden_size * sum(keys)


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """Analytic training FLOPs per sequence: the matmuls, forward + backward = 3 x forward
  (2 FLOPs a multiply-add); element-wise work (LayerNorm, softmax, GeLU) is not counted.

  Per token: 6 x the L layers' matmul parameters (a shared ALBERT layer is applied L times and
  costs L times), + attention scores/context 12 x L x T x H, + ALBERT's E -> H embedding
  projection 6 x E x H. On the masked positions only: the MLM head (transform H -> E, tied
  decoder E -> V; E = H for BERT) and SpanBERT's SBO head (3H -> H, H -> E, tied decoder). The
  pooler and the NSP/SOP dense on each of `num_nsp` [CLS] slots (a packed row has K), only when
  the model has a sentence objective (without one the pooler feeds no loss: XLA drops it).
  tests/bert_jax/families/families_train_test.py checks it against the dot products of the traced training step.
  """
  del teacher_config
  h, l, t, i = cfg.hidden_size, cfg.num_layers, seq_length, cfg.intermediate_size
  e, v = cfg.embed_dim, cfg.vocab_size
  per_layer = 4 * h * h + 2 * h * i                         # q,k,v,o + two FFN matrices
  dense = 6 * l * per_layer * t
  attention = attention_flops_per_sequence(cfg, t)        # 12 x L x T^2 x H
  projection = 6 * t * e * h if cfg.factorised else 0   # ALBERT: [E, H]
  mlm_head = 6 * num_predictions * (h * e + e * v)
  objectives = cfg.objective_list
  sbo_head = 6 * num_predictions * (3 * h * h + h * e + e * v) if "sbo" in objectives else 0
  pooler_nsp = 6 * num_nsp * (h * h + 2 * h) if cfg.sentence_objective else 0
  return dense + attention + projection + mlm_head + sbo_head + pooler_nsp


# ----------------------------------------------------------------------------------------------
# The pre-training step: no frozen network unless the family distils (bert_jax/objectives/distil.py checks
# that a --config.teacher_checkpoint is not given to a family that does not).
# ----------------------------------------------------------------------------------------------
def load_teacher(config, model_config):
  from bert_jax.objectives import distil  # pylint: disable=g-import-not-at-top
  return distil.load_teacher(config, model_config)


def check_teacher(meta, teacher, workdir):
  from bert_jax.objectives import distil  # pylint: disable=g-import-not-at-top
  distil.check_teacher(meta, teacher, workdir)


def init_from_teacher(state, steps, config, teacher, num_layers):
  from bert_jax.objectives import distil  # pylint: disable=g-import-not-at-top
  return distil.init_student(state, steps, config, teacher, num_layers)


def planning_teacher(config, model_config):
  """The teacher bert_jax.plan compiles the step with (shapes only), or None."""
  from bert_jax.objectives import distil  # pylint: disable=g-import-not-at-top
  return distil.planning_teacher(config, model_config)


def step_parts(config, model_config, teacher, dummy_batch, mesh, rules):
  """(forward, loss weights, frozen network): BERT's forward, the objectives' own weights."""
  del config, teacher, dummy_batch, mesh, rules
  return families.get(model_config.family).forward, None, None


# ----------------------------------------------------------------------------------------------
# Fine-tuning, features and fill-mask.
# ----------------------------------------------------------------------------------------------
def head_dense(config, features, name):
  """A task head's output layer: float32 logits, truncated-normal(0.02) kernel, zero bias."""
  return nn.Dense(
      features, dtype=jnp.float32, param_dtype=config.param_dtype,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.truncated_normal(config.initializer_range), ("embed", "classes")),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",)),
      name=name)


def encode(config, input_ids, input_mask, segment_ids, **kwargs):
  """BertModel, named "bert", in the calling head's compact __call__: sequence_output,
  pooled_output, cls_output."""
  return model_lib.BertModel(config, name="bert")(input_ids, input_mask, segment_ids, **kwargs)


def cls_logits(config, out, num_labels, deterministic):
  """BERT's head on [CLS]: dropout + dense "classifier" on the pooled output (BERT paper 4.1)."""
  x = nn.Dropout(config.hidden_dropout_prob)(out["pooled_output"], deterministic=deterministic)
  return head_dense(config, num_labels, "classifier")(x)


def token_logits(config, out, num_labels, deterministic, *, name="classifier", dropout=True):
  """BERT's heads on every position (google-research/bert, HF's BertFor{QuestionAnswering,
  TokenClassification}): SQuAD's dense(2) "qa_outputs" with no dropout; tagging's dropout +
  dense "classifier" (heads.py passes which). [B, T, H] -> [B, T, L]."""
  x = out["sequence_output"]
  if dropout:
    x = nn.Dropout(config.hidden_dropout_prob)(x, deterministic=deterministic)
  return head_dense(config, num_labels, name)(x)


def features_model(config):
  return model_lib.BertModel(config), None


def check_fill_mask(predictor, checkpoint):
  """fill-mask needs the trained MLM head (and the sentence head a pair asks for)."""
  from bert_jax.inference.loading import PredictError  # pylint: disable=g-import-not-at-top
  config = predictor.config
  sentence = config.sentence_objective   # nsp (BERT), sop (ALBERT), None (SpanBERT, DistilBERT)
  heads = ["mlm_head"] + ([f"{sentence}_head"] if sentence else [])
  if any(h not in predictor.params for h in heads):
    raise PredictError(f"--init_checkpoint={checkpoint}: has no pre-training heads "
                       f"({', '.join(heads)}); fill-mask needs a BertForPreTraining checkpoint.")
  # A converted model whose MLM head was not in its files (a transformers DistilBertModel or
  # BertModel: convert starts it from random weights and lists it) would fill masks with noise.
  fresh = [p for p in predictor.meta.get("initialized_randomly") or ()
           if p.startswith("mlm_head/")]
  if fresh:
    raise PredictError(f"--init_checkpoint={checkpoint}: its MLM head was initialised randomly "
                       f"at conversion ({fresh[0]}, ...: the source had none, e.g. a "
                       "DistilBertModel); fill-mask needs the ...ForMaskedLM folder or a "
                       "pre-training workdir.")


def mlm_logits(params, config, ids, mask, segments, positions):
  """(MLM logits [1, P, V], sentence logits [1, 2] or None) of BertForPreTraining."""
  pretraining = families.get(config.family).pretraining_model(config)
  return pretraining.apply({"params": params}, ids, mask, segments, positions)


def describe(config, purpose, params_keys=(), do_train=True):
  """An extra line a loader prints about what it uses (None: the load line says it all)."""
  del config, purpose, params_keys, do_train
  return None


# ----------------------------------------------------------------------------------------------
# transformers / google TF checkpoints (convert/__init__.py's one-folder import and export).
# ----------------------------------------------------------------------------------------------
def hf_config_file(path):
  """config.json of a transformers save_pretrained folder (weights beside it, no bert_jax
  export files), or None."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  path = str(path)
  if "://" in path or not os.path.isdir(path):
    return None
  files = set(os.listdir(path))
  weights = {"model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"}
  if "config.json" in files and files & weights and ckpt_lib.CONFIG_NAME not in files:
    return os.path.join(path, "config.json")
  return None


def config_from_json(d, path, kind, gelu="auto"):
  from bert_jax.convert import formats  # pylint: disable=g-import-not-at-top
  return formats.bert_config_from_json(d, path, kind, gelu)


def name_table(config):
  from bert_jax.convert import names  # pylint: disable=g-import-not-at-top
  return names.specs(config)


def normalise_hf_names(source):
  """BERT's transformers names are the table's. A TinyBERT folder (model_type bert: a general or
  task distillation checkpoint, bert_jax/families/tinybert/__init__.py) also holds fit_dense.{weight,bias},
  the projection W_h its distillation loss used: not part of BertModel, left out with that
  reason (meta's ignored_variables) instead of the one-line "no place" error."""
  extra = {n: "TinyBERT's distillation projection W_h (config fit_size): not part of BertModel"
           for n in source.shapes if n.startswith("fit_dense.")}
  if not extra:
    return source, {}
  out = type(source)({n: s for n, s in source.shapes.items() if n not in extra}, source.get,
                     source.files)
  out.tied = source.tied
  return out, extra


def hf_config_json(config, pad_token_id=0):
  from bert_jax.convert import formats  # pylint: disable=g-import-not-at-top
  return formats.hf_config_json(config, pad_token_id)


def hf_body(params, config):
  """("BertModel", {transformers name: array}) of a tree's body (params["bert"]): the name table's
  bert/ rows with the base model's prefix cut ("bert.encoder..." -> "encoder..."), as
  BertModel.save_pretrained names them; the pooler too when the tree has one (transformers'
  BertModel has it; a sentence-transformers folder does not use it). A family whose transformers
  converter is its own module (ELECTRA, DistilBERT) declares its own hook or has none."""
  from bert_jax.convert import formats  # pylint: disable=g-import-not-at-top
  from bert_jax.convert import names  # pylint: disable=g-import-not-at-top
  family = families.get(config.family)
  if family.export_hf is not None or family.name_table is None:
    raise formats.ConversionError(f"a {family.display} model: no sentence-transformers export "
                                  "yet (its transformers names are its own converter's).")
  flat = names.flatten(params)
  out = {}
  for s in family.name_table(config):
    absent_pooler = s.path.startswith("bert/pooler/") and s.path not in flat
    if not s.path.startswith("bert/") or absent_pooler:
      continue
    found = tuple(np.shape(flat[s.path])) if s.path in flat else None
    if found != s.shape:
      raise formats.ConversionError(
          f"parameter {s.path} is {'missing' if found is None else f'of shape {found}'}; a "
          f"{family.display} body of this config has it with shape {s.shape}.")
    out[s.hf.split(".", 1)[1]] = names.from_flax(s, np.asarray(flat[s.path], np.float32), "hf")
  return family.hf_class.split("For", 1)[0] + "Model", out


def own_hf_converter(module, *, importer="import_with_tokenizer", exporter=None):
  """(import_hf, export_hf) hooks of a family whose transformers converter is its own module,
  bert_jax/families/<module>/convert.py (ELECTRA, DistilBERT, ModernBERT), imported at the first
  call: the converters import the families, so a top-level import here would be a cycle.

  import_hf(path, vocab_file, do_lower_case) calls <module>.<importer> with those as keywords.
  export_hf(m, output) calls <module>.<exporter>(m, output), or by default
  <module>.export_to_hf(params, config, output, vocab_file, do_lower_case, pad_token_id) with
  the InferenceModel's tokenizer."""
  def converter():
    return importlib.import_module(f"bert_jax.families.{module}.convert")

  def import_hf(path, vocab_file=None, do_lower_case=None):
    return getattr(converter(), importer)(path, vocab_file=vocab_file,
                                          do_lower_case=do_lower_case)

  def export_hf(m, output):
    if exporter:
      return getattr(converter(), exporter)(m, output)
    return converter().export_to_hf(
        m.params, m.config, output, vocab_file=m.vocab_file, do_lower_case=m.do_lower_case,
        pad_token_id=m.tokenizer.vocab.pad_id)

  return import_hf, export_hf


FAMILY = families.register(families.Family(
    name="bert", presets=PRESETS, title="BERT",
    summary="BERT (Devlin et al. 2018): post-LN encoder, MLM + NSP; the RoBERTa recipe is "
            "objectives=mlm on --no_nsp records",
    pretraining_model=pretraining_heads.BertForPreTraining,
    forward=pretraining_heads.pretraining_outputs,
    flops_per_sequence=flops_per_sequence, load_teacher=load_teacher,
    check_teacher=check_teacher, init_from_teacher=init_from_teacher,
    planning_teacher=planning_teacher, step_parts=step_parts,
    encode=encode, cls_logits=cls_logits, token_logits=token_logits,
    features_model=features_model,
    check_fill_mask=check_fill_mask, mlm_logits=mlm_logits, describe=describe,
    hf_model_types=("bert",), hf_config_file=hf_config_file,
    tf_config_names=("bert_config.json",), config_from_json=config_from_json,
    name_table=name_table, normalise_hf_names=normalise_hf_names,
    hf_config_json=hf_config_json, hf_body=hf_body))
