"""MobileBERT (Sun et al. 2020, arXiv 2004.02984): 24 thin layers with input/output bottlenecks
(intra-bottleneck 128 inside a 512-wide stream), a shared key/query bottleneck, 4 stacked FFNs a
layer, NoNorm, ReLU and a trigram input embedding; MLM + NSP.

One place: the config record with MobileBERT's own fields and the network are
families/mobilebert/layers.py (MobileBertConfig subclasses BertConfig, so the shared record
carries none of them); this module is the family record (presets, recipe, the step's network,
FLOPs, fine-tuning body); families/mobilebert/convert.py is its transformers name table
(MobileBertForPreTraining / MobileBertForMaskedLM / MobileBertModel folders, both ways).

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:mobilebert-tiny \
      --config.train_input_files=... --workdir=...
  # knowledge transfer from an IB-BERT-shaped teacher (layerwise.py's objective), progressive:
  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:mobilebert \
      --config.teacher_checkpoint=IB_BERT --config.progressive_stages=24 \
      --config.steps_per_stage=10000 --config.train_input_files=... --workdir=...
"""

import dataclasses
import importlib

from bert_jax.families import bert
from bert_jax.families.mobilebert import layers as layers
from bert_jax.families import registry as families

# transformers' MobileBertConfig defaults, with google/mobilebert-uncased's config.json where it
# differs (classifier_activation false: no pooler dense, [CLS] as it is under the NSP head; the
# released config as PaddleNLP's copy of it records, transformers_version 4.6.0).
_MOBILEBERT = dict(
    family="mobilebert", objectives="mlm,nsp", vocab_size=30_522, hidden_size=512,
    num_layers=24, num_heads=4, intermediate_size=512, hidden_act="relu",
    hidden_dropout_prob=0.0, attention_dropout_prob=0.1, max_position_embeddings=512,
    type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12, embedding_size=128,
    trigram_input=True, use_bottleneck=True, intra_bottleneck_size=128,
    use_bottleneck_attention=False, key_query_shared_bottleneck=True,
    num_feedforward_networks=4, normalization_type="no_norm", classifier_activation=False)

PRESETS = {
    # 24 x 512 with bottlenecks of 128, 4 heads of 32, 4 FFNs of 512: 24,581,888 parameters in
    # transformers' MobileBertModel (the paper's 25.3M), 36,597,564 in MobileBertForPreTraining:
    # its MLM decoder widens the 128-wide word table by 384 rows of its own, 384 x 30,522 =
    # 11.7M (tests/bert_jax/families/mobilebert/mobilebert_test.py counts both from shapes).
    "mobilebert": dict(_MOBILEBERT),
    # A CPU size for tests and laptops: 2 x 64 with bottlenecks of 32, 2 heads of 16, 2 FFNs,
    # E 16; the pooler's tanh dense on, so the test covers it.
    "mobilebert-tiny": dict(_MOBILEBERT, num_layers=2, hidden_size=64, num_heads=2,
                            intermediate_size=64, embedding_size=16, intra_bottleneck_size=32,
                            num_feedforward_networks=2, classifier_activation=True,
                            max_position_embeddings=128),
    # The knowledge-transfer teacher's shape, IB-BERT_LARGE as we read the paper's Table 1: the
    # same 512-wide stream and 24 layers, an *inverted* bottleneck of 1,024 inside a layer (q, k,
    # v from it), 4 heads, one FFN of 4,096. LayerNorm and GELU are our choice (the paper's
    # NoNorm / ReLU are the student's latency optimisations). A MobileBERT-architecture model,
    # so it is a preset of this family (its network gives layerwise.py's outputs).
    "ib-bert": dict(_MOBILEBERT, intra_bottleneck_size=1_024, intermediate_size=4_096,
                    num_feedforward_networks=1, use_bottleneck_attention=True,
                    key_query_shared_bottleneck=False, normalization_type="layer_norm",
                    hidden_act="gelu"),
    # ib-bert's shape over mobilebert-tiny's stream (64 wide, 2 heads): a teacher for tests.
    "ib-bert-tiny": dict(_MOBILEBERT, num_layers=4, hidden_size=64, num_heads=2,
                         embedding_size=16, intra_bottleneck_size=128, intermediate_size=256,
                         num_feedforward_networks=1, use_bottleneck_attention=True,
                         key_query_shared_bottleneck=False, normalization_type="layer_norm",
                         hidden_act="gelu", max_position_embeddings=128),
}


# MobileBERT's own sizes a run may override (--config.model.intra_bottleneck_size=64, ...): None
# = the preset's. BERT's shared fields (num_heads, ...) are the presets' own, as every family's.
OVERRIDABLE = {"intra_bottleneck_size": int, "num_feedforward_networks": int,
               "normalization_type": str, "embedding_size": int}


def recipe(c, preset):
  """BERT's loop and optimizer (the paper's schedule is not modelled: docs/models.md), with
  MobileBERT's own sizes as --config.model fields; a size that does not divide (the true hidden
  size by the heads) is train's one-line error before compute (MobileBertConfig). The layer-wise
  objective's fields (bert_jax/objectives/layerwise.py: weights, layer map, fit_size), read only when a
  --config.teacher_checkpoint is given: knowledge transfer from an IB-BERT-shaped teacher."""
  del preset
  from ml_collections import config_dict  # pylint: disable=g-import-not-at-top
  for field, kind in OVERRIDABLE.items():
    c.model[field] = config_dict.placeholder(kind)
  _layerwise().recipe_fields(c, fit_size=0)   # the paper's teacher is as wide (512) as MobileBERT
  # The paper's attention transfer: the KL of the attention distributions (L_AT, section 3.5),
  # not TinyBERT's MSE of the scores.
  c.alpha_att, c.alpha_att_kl = 0.0, 1.0
  importlib.import_module("bert_jax.objectives.progressive").fields(c)   # progressive_stages, steps_per_stage


# ----------------------------------------------------------------------------------------------
# Knowledge transfer (Sun et al. 2020, sections 3.5-3.6) with the shared layer-wise objective:
# with a --config.teacher_checkpoint the step is layerwise.py's (feature maps: hidden-state MSE,
# layer by layer; attention: the KL of the attention distributions, the paper's L_AT), all layers
# at once, or with --config.progressive_stages=L the paper's progressive stages (bert_jax/
# progressive.py: layer l alone in stage l, the rest frozen). Without one, BERT's MLM + NSP step.
# ----------------------------------------------------------------------------------------------
def _layerwise():
  """bert_jax/objectives/layerwise.py, imported when first asked (as families/tinybert/ does)."""
  return importlib.import_module("bert_jax.objectives.layerwise")


def _teacher_given(config):
  return bool(config.get("teacher_checkpoint", ""))


def load_teacher(config, model_config):
  if not _teacher_given(config):   # a progressive schedule without one: refused here
    importlib.import_module("bert_jax.objectives.progressive").check(config, model_config,
                                                          teacher_given=False)
    return None
  return _layerwise().load_teacher(config, model_config)


def check_teacher(meta, teacher, workdir):
  """A resume keeps its teacher (distil's check) and its progressive stages."""
  bert.check_teacher(meta, teacher, workdir)
  importlib.import_module("bert_jax.objectives.progressive").check_resume(meta, teacher, workdir)


def init_from_teacher(state, steps, config, teacher, num_layers):
  return _layerwise().init_from_teacher(state, steps, config, teacher, num_layers)


def planning_teacher(config, model_config):
  if not _teacher_given(config):
    return load_teacher(config, model_config)   # None, or a progressive schedule's one line
  return _layerwise().planning_teacher(config, model_config)


def step_parts(config, model_config, teacher, dummy_batch, mesh, rules):
  if teacher is None and not _teacher_given(config):
    return bert.step_parts(config, model_config, teacher, dummy_batch, mesh, rules)
  return _layerwise().step_parts(config, model_config, teacher, dummy_batch, mesh, rules)


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """The network's training FLOPs (network_flops); with a teacher, plus the teacher's forward
  (distil's count: a third of its training FLOPs)."""
  if teacher_config is None:
    return network_flops(cfg, seq_length, num_predictions, num_nsp)
  from bert_jax.objectives import teacher  # pylint: disable=g-import-not-at-top
  return teacher.flops_per_sequence(cfg, teacher_config, seq_length, num_predictions,
                                    network_flops)


def network_flops(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """Analytic training FLOPs per sequence (3 x forward, 2 a multiply-add: 6 per matmul
  parameter a token), element-wise work not counted, as BERT's (families/bert/). Per token:
  the embedding transformation (3E x H), and per layer every dense kernel of the network
  (mobilebert_layers: bottlenecks H x B, q/k B x B, v H x B, attention output B x B, F FFNs
  2 x B x I, output bottleneck B x H); attention scores + context 12 x T^2 x B a layer; on the
  masked positions the MLM transform H x H and decoder H x V; the pooler and NSP on [CLS]."""
  del teacher_config
  h, t, l, i = cfg.hidden_size, seq_length, cfg.num_layers, cfg.intermediate_size
  b, v, e = cfg.true_hidden_size, cfg.vocab_size, cfg.embed_dim
  kv_in = b if cfg.use_bottleneck_attention else h   # q, k read the shared bottleneck (B wide)
  qk_in = b if (cfg.use_bottleneck_attention or cfg.key_query_shared_bottleneck) else h
  bottlenecks = 0
  if cfg.use_bottleneck:
    bottlenecks = h * b * (1 + (cfg.key_query_shared_bottleneck and
                                not cfg.use_bottleneck_attention)) + b * h   # in (+ qk), out
  per_layer = (bottlenecks + 2 * qk_in * b + kv_in * b + b * b
               + cfg.num_feedforward_networks * 2 * b * i)
  embed = (3 if cfg.trigram_input else 1) * e * h if (cfg.trigram_input or e != h) else 0
  dense = 6 * t * (embed + l * per_layer)
  attention = 12 * l * t * t * b
  mlm_head = 6 * num_predictions * (h * h + h * v)
  pooler = h * h if cfg.classifier_activation else 0
  nsp = 6 * num_nsp * (pooler + 2 * h) if cfg.sentence_objective else 0
  return dense + attention + mlm_head + nsp


def num_params(cfg, with_heads=True):
  """Parameters of transformers' MobileBertForPreTraining (with_heads; its decoder weight and
  bias tied to the word table and cls.predictions.bias, counted once) or MobileBertModel, from
  the config alone."""
  h, l, i, v = cfg.hidden_size, cfg.num_layers, cfg.intermediate_size, cfg.vocab_size
  b, e, f = cfg.true_hidden_size, cfg.embed_dim, cfg.num_feedforward_networks
  dense = lambda n_in, n_out: n_in * n_out + n_out
  norm = lambda n: 2 * n                       # NoNorm and LayerNorm alike: scale + bias
  embeddings = (v * e + cfg.max_position_embeddings * h + cfg.type_vocab_size * h + norm(h)
                + (dense((3 if cfg.trigram_input else 1) * e, h)
                   if cfg.trigram_input or e != h else 0))
  layer = 0
  if cfg.use_bottleneck:
    layer += dense(h, b) + norm(b)                                  # bottleneck/input
    if cfg.key_query_shared_bottleneck:   # built even when use_bottleneck_attention
      layer += dense(h, b) + norm(b)                                # bottleneck/attention
    layer += dense(b, h) + norm(h)                                  # output/bottleneck
  v_in = b if cfg.use_bottleneck_attention else h
  layer += 2 * dense(b, b) + dense(v_in, b) + dense(b, b) + norm(b)  # q, k, v, output
  layer += f * (dense(b, i) + dense(i, b) + norm(b))                # F FFNs (the last: output)
  total = embeddings + l * layer + (dense(h, h) if cfg.classifier_activation else 0)
  if with_heads:
    total += dense(h, h) + norm(h) + (h - e) * v + v + dense(h, 2)  # transform, dense, bias, NSP
  return int(total)


def encode(config, input_ids, input_mask, segment_ids, **kwargs):
  """MobileBertModel, named "bert", in the calling head's compact __call__."""
  return layers.MobileBertModel(config, name="bert")(input_ids, input_mask, segment_ids,
                                                     **kwargs)


def features_model(config):
  return layers.MobileBertModel(config), None


def describe(config, purpose, params_keys=(), do_train=True):
  """The line predict, extract_features and finetune print about the network they use."""
  del params_keys
  shape = (f"{config.num_layers} layers of width {config.hidden_size}, bottleneck "
           f"{config.true_hidden_size}, {config.num_feedforward_networks} FFNs, "
           f"{config.normalization_type}")
  if purpose == "predict":
    return f"MobileBERT: fill-mask with its MLM head ({shape})"
  if purpose == "features":
    return f"MobileBERT: features of params['bert'] ({shape})"
  if not do_train:
    return "MobileBERT: evaluating params['bert'] with its fine-tuned head"
  return (f"MobileBERT: fine-tuning params['bert'] ({shape}) under BERT's head on the pooled "
          "[CLS] (dropout + classifier: MobileBertForSequenceClassification's)")


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="mobilebert", presets=PRESETS, plain_teacher=False, title="MobileBERT",
    summary="MobileBERT (Sun et al. 2020): bottlenecked thin layers (512 / 128), stacked FFNs, "
            "NoNorm, trigram embeddings; MLM + NSP",
    config_class=layers.MobileBertConfig, factorised_embeddings=True, recipe=recipe,
    pretraining_model=layers.MobileBertForPreTraining, flops_per_sequence=flops_per_sequence,
    load_teacher=load_teacher, check_teacher=check_teacher, init_from_teacher=init_from_teacher,
    planning_teacher=planning_teacher, step_parts=step_parts,
    encode=encode, features_model=features_model, describe=describe,
    hf_model_types=("mobilebert",), tf_config_names=(),
    config_marker_keys=("intra_bottleneck_size",),
    # Its configs name their activation (relu), which families/mobilebert/convert.py maps.
    **families.converter_hooks("mobilebert"),
    hf_class="MobileBertForPreTraining",
    train_further_note=" (and the same --config.teacher_checkpoint, if it had one)"))
