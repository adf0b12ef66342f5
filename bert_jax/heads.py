"""Fine-tuning heads: BertModel (submodule `bert`) plus one output layer (BERT paper, Fig. 4).

  family            head                                     output
  classification    dropout + dense on the pooled [CLS]       [B, num_labels] logits
  regression        the same with num_labels=1                [B, 1] score
  span              dense(2) on every position (no dropout)   [B, T] start, [B, T] end logits
  tagging           dropout + dense on every position         [B, T, num_labels] logits
  multiple_choice   [B, C, T] flattened to [B*C, T], dropout  [B, C] logits (one score per
                    + dense(1) on each pooled [CLS]          choice, softmax over choices)

ELECTRA (config.family == "electra") fine-tunes its discriminator: `bert` is the discriminator's
body (electra.ElectraBody: embeddings + encoder, no pooler, exactly params["bert"] of an ELECTRA
pre-training checkpoint), and the heads that read [CLS] use ElectraClassificationHead instead of
BERT's pooler + dense (see its docstring); span and tagging heads are BERT's, as transformers'
ElectraForQuestionAnswering / ElectraForTokenClassification.

DistilBERT (config.family == "distilbert") fine-tunes its BertModel body (no token-type table,
no pooler: exactly params["bert"] of a distillation checkpoint); the heads that read [CLS] are
transformers' DistilBertForSequenceClassification / ForMultipleChoice head ("pre_classifier"
dense + ReLU, dropout, "classifier": `_distilbert_cls_logits`); span and tagging heads are BERT's.
Segment ids are passed but unused (type_vocab_size=0): a pair is [CLS] a [SEP] b [SEP] with no
segment embedding, as transformers' DistilBERT.

Parameter trees are {"bert": <BertModel>, "<head>": {kernel, bias}}, so `params["bert"]` is
exactly what pre-training (params["bert"] of BertForPreTraining) or conversion provides; the
head names follow google-research/bert and HF ("classifier", "qa_outputs"). Head kernels are
truncated-normal(0.02) like the rest of BERT, biases zero, and logits are float32 whatever the
compute dtype, for a stable loss.
"""

import jax.numpy as jnp
from flax import linen as nn

from bert_jax import electra as electra_lib
from bert_jax import model as model_lib

# The house Dense (truncated-normal init, logical axes, compute dtype) and activation of model.py.
_dense = model_lib._dense            # pylint: disable=protected-access
_activation = model_lib._activation  # pylint: disable=protected-access


def _head_dense(config, features, name):
  return nn.Dense(
      features, dtype=jnp.float32, param_dtype=config.param_dtype,
      kernel_init=nn.with_logical_partitioning(
          nn.initializers.truncated_normal(config.initializer_range), ("embed", "classes")),
      bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("classes",)),
      name=name)


def _encode(config, input_ids, input_mask, segment_ids, **kwargs) -> dict:
  """The pre-trained body, named "bert", on the inputs: BertModel's outputs (sequence_output,
  pooled_output, cls_output; DistilBERT's pooled_output is None), or for ELECTRA the
  discriminator's (sequence_output, cls_output: no pooler).
  Called inside a head's compact __call__, so the body is that head's submodule."""
  if config.family == "electra":
    return electra_lib.ElectraBody(config, name="bert").model_outputs(
        input_ids, input_mask, segment_ids, **kwargs)
  return model_lib.BertModel(config, name="bert")(input_ids, input_mask, segment_ids, **kwargs)


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
    x = _dense(c, c.hidden_size, ("embed", "embed2"), "dense")(x)              # [B, (K,) H]
    x = _activation("gelu")(x)
    x = nn.Dropout(c.hidden_dropout_prob)(x, deterministic=deterministic)       # [B, (K,) H]
    return _head_dense(c, self.num_labels, "out_proj")(x)                       # [B, (K,) L]


# transformers' DistilBertConfig.seq_classif_dropout default: the dropout between
# pre_classifier and classifier in DistilBertForSequenceClassification / ForMultipleChoice (the
# released DistilBERT classifiers, e.g. distilbert-base-uncased-finetuned-sst-2, are trained with
# it). Not hidden_dropout_prob (0.1): HF keeps the two apart, and so do we.
DISTILBERT_SEQ_CLASSIF_DROPOUT = 0.2


def _distilbert_cls_logits(config, cls, num_labels, deterministic):
  """DistilBERT's head on [CLS], as transformers' DistilBertForSequenceClassification:
  pre_classifier dense H -> H, ReLU, dropout, classifier dense H -> L; the names are HF's, so a
  fine-tuned tree reads {"bert", "pre_classifier", "classifier"} like HF's {distilbert, ...}.

  Why not BERT's head: DistilBERT has no pooler (Sanh et al. drop it with the token types), so
  BERT's dropout + dense on the tanh-pooled [CLS] has nothing pre-trained to read; transformers
  puts this fresh H x H + ReLU layer in the pooler's place (ReLU, not tanh, as HF), and every
  released DistilBERT classifier carries it. No dropout before pre_classifier, as HF.
  Called inside the head's compact __call__, so both layers are that head's submodules.
  """
  x = _dense(config, config.hidden_size, ("embed", "embed2"), "pre_classifier")(cls)  # [B,(K,)H]
  x = nn.relu(x)
  x = nn.Dropout(DISTILBERT_SEQ_CLASSIF_DROPOUT)(x, deterministic=deterministic)     # [B,(K,)H]
  return _head_dense(config, num_labels, "classifier")(x)                            # [B,(K,)L]


def _cls_logits(config, out, num_labels, deterministic):
  """Logits from [CLS]: BERT's dropout + dense "classifier" on the pooled output, ELECTRA's
  ElectraClassificationHead (also named "classifier") on the last layer's [CLS], or DistilBERT's
  pre_classifier + ReLU + classifier on the last layer's [CLS] (no pooler either)."""
  if config.family == "electra":
    return ElectraClassificationHead(config, num_labels, name="classifier")(
        out["cls_output"], deterministic)
  if config.family == "distilbert":
    return _distilbert_cls_logits(config, out["cls_output"], num_labels, deterministic)
  x = nn.Dropout(config.hidden_dropout_prob)(out["pooled_output"], deterministic=deterministic)
  return _head_dense(config, num_labels, "classifier")(x)


class BertForSequenceClassification(nn.Module):
  """Sentence (pair) classification, or regression with num_labels=1.

  Packed training rows (instance_ids, position_ids, cls_positions [B, K]; docs/packing.md) give
  one prediction per instance: [B, K, L].
  """
  config: model_lib.BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, instance_ids=None, position_ids=None,
               cls_positions=None, deterministic=True):
    out = _encode(self.config, input_ids, input_mask, segment_ids, instance_ids=instance_ids,
                  position_ids=position_ids, cls_positions=cls_positions,
                  deterministic=deterministic)
    return _cls_logits(self.config, out, self.num_labels, deterministic)   # [B, (K,) L]


class BertForQuestionAnswering(nn.Module):
  """SQuAD: a start and an end score per position (google-research/bert has no dropout here)."""
  config: model_lib.BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    out = _encode(self.config, input_ids, input_mask, segment_ids, deterministic=deterministic)
    logits = _head_dense(self.config, 2, "qa_outputs")(out["sequence_output"])  # [B, T, 2]
    return logits[..., 0], logits[..., 1]                                        # [B, T] x 2


class BertForTokenClassification(nn.Module):
  """NER: a tag distribution per position (only first word pieces are trained/predicted)."""
  config: model_lib.BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    out = _encode(self.config, input_ids, input_mask, segment_ids, deterministic=deterministic)
    x = nn.Dropout(self.config.hidden_dropout_prob)(out["sequence_output"],
                                                   deterministic=deterministic)  # [B, T, H]
    return _head_dense(self.config, self.num_labels, "classifier")(x)           # [B, T, L]


class BertForMultipleChoice(nn.Module):
  """SWAG: each choice is its own sequence; one shared vector scores each [CLS]."""
  config: model_lib.BertConfig
  num_choices: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    b, c, t = input_ids.shape
    flat = lambda x: x.reshape(b * c, t)  # noqa: E731 - [B, C, T] -> [B*C, T]
    out = _encode(self.config, flat(input_ids), flat(input_mask), flat(segment_ids),
                  deterministic=deterministic)
    return _cls_logits(self.config, out, 1, deterministic).reshape(b, c)         # [B, C]


def create_model(family, config, *, num_labels=2, num_choices=4):
  """The head model of a task family (see data_pipelines.tasks)."""
  if family == "classification":
    return BertForSequenceClassification(config, num_labels)
  if family == "regression":
    return BertForSequenceClassification(config, 1)
  if family == "span":
    return BertForQuestionAnswering(config)
  if family == "tagging":
    return BertForTokenClassification(config, num_labels)
  if family == "multiple_choice":
    return BertForMultipleChoice(config, num_choices)
  raise ValueError(f"unknown task family {family!r}; one of classification, regression, span, "
                   "tagging, multiple_choice.")


def dummy_inputs(family, seq_length, num_choices=4):
  """Zero inputs of the right shapes for model.init."""
  shape = (1, num_choices, seq_length) if family == "multiple_choice" else (1, seq_length)
  ids = jnp.zeros(shape, jnp.int32)
  return ids, jnp.ones_like(ids), ids
