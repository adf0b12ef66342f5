"""ELECTRA (Clark et al. 2020): a small MLM generator and a replaced-token-detection
discriminator trained together (bert_jax/families/electra/objective.py holds the networks).

What the family declares: its presets and recipe (Table 6), the generator + discriminator step and
its FLOPs, the discriminator as the fine-tuning and feature body (no pooler: transformers'
ElectraClassificationHead on [CLS]), fill-mask through the generator, and transformers' two
folders (discriminator/ + generator/, families/electra/convert.py).
"""

import dataclasses
import os

from flax import linen as nn
from ml_collections import config_dict

from bert_jax.families.electra import objective as electra_lib
from bert_jax.families import registry as families
from bert_jax.models import model as model_lib
from bert_jax.families import bert


def _electra(layers, hidden, embed, generator_hidden):
  """ELECTRA (Clark et al. 2020, Table 6; google-research/electra training_utils.get_bert_config
  and run_pretraining.get_generator_config): a BERT encoder without pooler, H/64 heads, 4H FFN,
  embeddings E (small: 128 -> H=256; base, large: E=H); the generator has the same depth and
  1/4 (small, large) or 1/3 (base: round(768/3) = 256) of the width, 4x FFN, max(1, H/64)
  heads, and shares the embeddings."""
  return dict(family="electra", objectives="mlm,rtd", num_layers=layers, hidden_size=hidden,
              num_heads=hidden // 64, intermediate_size=4 * hidden,
              embedding_size=0 if embed == hidden else embed,
              generator_hidden_size=generator_hidden, generator_num_layers=layers,
              generator_num_heads=max(1, generator_hidden // 64),
              generator_intermediate_size=4 * generator_hidden)


PRESETS = {f"electra-{name}": _electra(*sizes) for name, sizes in (
    ("tiny", (2, 128, 64, 32)), ("mini", (4, 256, 128, 64)), ("small", (12, 256, 128, 64)),
    ("base", (12, 768, 768, 256)), ("large", (24, 1024, 1024, 256)))}


def check_config(config):
  if config.generator_hidden_size % config.generator_num_heads:
    raise ValueError(f"BertConfig: generator_hidden_size={config.generator_hidden_size} is not "
                     f"divisible by generator_num_heads={config.generator_num_heads}.")


def recipe(c, preset):
  """ELECTRA's recipe (Clark et al. 2020, Table 6; google-research/electra
  configure_pretraining.py): small 128 x 128 tokens, lr 5e-4, 1M steps; base 256 x 512, lr 2e-4,
  766k steps; large 2048 x 512, lr 2e-4, 400k steps, 25% masking. Predictions per sequence as
  google's int((mask_prob + 0.005) * seq_length): 19 at 128, 79 at 512 (15%), 130 at 512 (25%).
  The loss weights (MLM 1, RTD 50) are objectives.WEIGHTS."""
  # The generator's size (None: the preset's, 1/4 or 1/3 of the width above). A checkpoint's
  # generator must match it (checkpoint_fit.check_generator): transformers' electra-small pair
  # has a generator as wide as its discriminator, 256 (--config.model.generator_hidden_size=256
  # --config.model.generator_num_heads=4 --config.model.generator_intermediate_size=1024).
  for field in ("generator_hidden_size", "generator_num_layers", "generator_num_heads",
                "generator_intermediate_size"):
    c.model[field] = config_dict.placeholder(int)
  size = preset.split("-", 1)[1]
  if size in ("base", "large"):
    c.seq_length, c.learning_rate = 512, 2e-4
    c.batch_size, c.num_train_steps = (256, 766_000) if size == "base" else (2048, 400_000)
    c.masked_lm_prob = 0.15 if size == "base" else 0.25
  else:   # small, and the test sizes tiny / mini
    c.seq_length, c.learning_rate, c.batch_size, c.num_train_steps = 128, 5e-4, 128, 1_000_000
  c.max_predictions_per_seq = int((c.masked_lm_prob + 0.005) * c.seq_length)


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  del num_nsp, teacher_config   # no sentence head, no teacher
  return electra_lib.flops_per_sequence(cfg, seq_length, num_predictions)


# ----------------------------------------------------------------------------------------------
# Fine-tuning and features: the discriminator.
# ----------------------------------------------------------------------------------------------
def encode(config, input_ids, input_mask, segment_ids, **kwargs):
  """The discriminator's body (params["bert"] of a pre-training checkpoint), BertModel's
  outputs without a pooler: sequence_output, cls_output."""
  return electra_lib.ElectraBody(config, name="bert").model_outputs(
      input_ids, input_mask, segment_ids, **kwargs)


class ElectraClassificationHead(nn.Module):
  """ELECTRA's head on [CLS] for sentence (pair) classification, regression and multiple choice:
  dropout, dense H -> H, GELU, dropout, dense H -> L, on the discriminator's last layer at [CLS].

  ELECTRA pre-trains no pooler (the discriminator's loss is per token), so BERT's tanh pooler
  would start from random weights; instead this is transformers' ElectraClassificationHead
  (names `dense`, `out_proj` kept), which ElectraForSequenceClassification fine-tunes, and its
  ElectraForMultipleChoice head is the same shape (SequenceSummary: [CLS], dense H -> H, GELU,
  dropout, then dense -> 1). google-research/electra's own fine-tuning puts dropout + one dense
  on [CLS] (modeling.py pooled_output = sequence_output[:, 0]); transformers' extra H x H layer
  is the one released ELECTRA classifiers carry, so we follow it. GELU always, as transformers.
  """
  config: model_lib.BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, cls, deterministic):
    c = self.config
    x = nn.Dropout(c.hidden_dropout_prob)(cls, deterministic=deterministic)     # [B, (K,) H]
    x = model_lib._dense(c, c.hidden_size, ("embed", "embed2"), "dense")(x)    # [B, (K,) H]
    x = model_lib._activation("gelu")(x)
    x = nn.Dropout(c.hidden_dropout_prob)(x, deterministic=deterministic)       # [B, (K,) H]
    return bert.head_dense(c, self.num_labels, "out_proj")(x)                   # [B, (K,) L]


def cls_logits(config, out, num_labels, deterministic):
  return ElectraClassificationHead(config, num_labels, name="classifier")(
      out["cls_output"], deterministic)


def features_model(config):
  body = electra_lib.ElectraBody(config)
  return body, body.model_outputs


# ----------------------------------------------------------------------------------------------
# fill-mask: the generator (the discriminator only tells replaced tokens).
# ----------------------------------------------------------------------------------------------
def check_fill_mask(predictor, checkpoint):
  from bert_jax.inference.loading import PredictError  # pylint: disable=g-import-not-at-top
  missing = [k for k in ("bert", "generator", "mlm_head") if k not in predictor.params]
  if missing:
    why = predictor.meta.get("generator") or f"top-level parameters {sorted(predictor.params)}"
    raise PredictError(f"--init_checkpoint={checkpoint}: an ELECTRA without its generator "
                       f"({why}); fill-mask needs the generator: pass the pre-training "
                       "workdir, or the discriminator/ + generator/ folder that python -m "
                       "bert_jax.convert exports.")


def mlm_logits(params, config, ids, mask, segments, positions):
  model = electra_lib.ElectraForPreTraining(config)
  mlm = model.apply({"params": params}, ids, mask, segments, positions,
                    method=model.generator_logits)
  return mlm, None                                      # [1, P, V]; no sentence head


def describe(config, purpose, params_keys=(), do_train=True):
  if purpose == "predict":
    return (f"ELECTRA: fill-mask with the generator (the MLM network: "
            f"{config.generator_num_layers} layers of width {config.generator_hidden_size} on "
            "the shared embeddings); the discriminator is not used")
  if purpose == "features":
    return (f"ELECTRA: features of the discriminator (params['bert']: {config.num_layers} "
            f"layers of width {config.hidden_size}); the generator is not used")
  rest = sorted(set(params_keys) - {"bert"})
  if not do_train:   # evaluating a fine-tuned export: body and head as they are
    return f"ELECTRA: evaluating the discriminator with its fine-tuned head ({', '.join(rest)})"
  return (f"ELECTRA: fine-tuning the discriminator: params['bert'] (embeddings + "
          f"{config.num_layers} layers of width {config.hidden_size}; ELECTRA has no "
          "pooler)" + (f"; not loaded: {', '.join(rest)}" if rest else "") + "; a [CLS] task "
          "gets ELECTRA's head, new (dense + GELU on [CLS], then the output layer: "
          "families/electra.ElectraClassificationHead)")


# ----------------------------------------------------------------------------------------------
# transformers: two folders (families/electra/convert.py).
# ----------------------------------------------------------------------------------------------
def hf_config_file(path):
  """config.json of the discriminator: `path` itself, or path/discriminator of a pair folder
  (what export writes: discriminator/ + generator/)."""
  from bert_jax.families.electra import convert as convert_electra  # pylint: disable=g-import-not-at-top
  path = str(path)
  if "://" in path or not os.path.isdir(path):
    return None
  disc, gen = convert_electra.pair_folders(path)
  if gen is not None:
    return os.path.join(disc, "config.json")
  return bert.hf_config_file(path)


# import: a pair folder, "DISC,GEN" or a discriminator folder alone -> (params, config, meta),
# with the discriminator's tokenizer (vocab.txt and casing) recorded; export: the pair folder.
import_hf, export_hf = bert.own_hf_converter("electra")


FAMILY = families.register(dataclasses.replace(
    bert.FAMILY, name="electra", presets=PRESETS, plain_teacher=False, title="ELECTRA",
    summary="ELECTRA (Clark et al. 2020): generator MLM + discriminator replaced-token detection",
    factorised_embeddings=True, generator=True, pooler=False, exact_objectives=("mlm", "rtd"),
    own_objectives=("rtd",), check_config=check_config, recipe=recipe,
    pretraining_model=electra_lib.ElectraForPreTraining, forward=electra_lib.forward,
    flops_per_sequence=flops_per_sequence, encode=encode, cls_logits=cls_logits,
    features_model=features_model, check_fill_mask=check_fill_mask, mlm_logits=mlm_logits,
    describe=describe, hf_model_types=("electra",), hf_config_file=hf_config_file,
    tf_config_names=(), config_marker_keys=(), import_hf=import_hf, export_hf=export_hf,
    hf_class="ElectraForPreTraining (discriminator/) + ElectraForMaskedLM (generator/)"))
