"""Fine-tuning heads: BertModel (submodule `bert`) plus one output layer (BERT paper, Fig. 4).

  task type         head                                     output
  classification    dropout + dense on the pooled [CLS]       [B, num_labels] logits
  regression        the same with num_labels=1                [B, 1] score
  span              dense(2) on every position (no dropout)   [B, T] start, [B, T] end logits
  tagging           dropout + dense on every position         [B, T, num_labels] logits
  multiple_choice   [B, C, T] flattened to [B*C, T], dropout  [B, C] logits (one score per
                    + dense(1) on each pooled [CLS]          choice, softmax over choices)

Which task type trains which head is the type's (bert_jax/tasks/<type>.py: TaskType.create_head
and input_shape); create_model and dummy_inputs look it up and name none.

The body and the head on [CLS] are the model family's (bert_jax/families/<name>.py: Family.encode
and Family.cls_logits): BERT's pooled [CLS] under dropout + dense; ELECTRA's discriminator body
(no pooler) under transformers' ElectraClassificationHead; DistilBERT's body (no token types, no
pooler) under transformers' pre_classifier + ReLU + classifier. Span and tagging heads read the
sequence output through the family's Family.token_logits: BERT's (every family but one) as in
the table; ModernBERT's as transformers' ModernBertFor{QuestionAnswering,TokenClassification},
head (dense + GELU + norm) + dropout + "classifier" on every position.

Parameter trees are {"bert": <BertModel>, "<head>": {kernel, bias}}, so `params["bert"]` is
exactly what pre-training (params["bert"] of BertForPreTraining) or conversion provides; the
head names follow google-research/bert and HF ("classifier", "qa_outputs"). Head kernels are
truncated-normal(0.02) like the rest of BERT, biases zero, and logits are float32 whatever the
compute dtype, for a stable loss.
"""

import jax.numpy as jnp
from flax import linen as nn

from bert_jax import families
from bert_jax.models import model as model_lib
from bert_jax import tasks


def _encode(config, input_ids, input_mask, segment_ids, **kwargs) -> dict:
  """The family's pre-trained body, named "bert", on the inputs (sequence_output, cls_output and,
  with a pooler, pooled_output). Called inside a head's compact __call__, so the body is that
  head's submodule."""
  return families.get(config.family).encode(config, input_ids, input_mask, segment_ids, **kwargs)


def _cls_logits(config, out, num_labels, deterministic):
  """Logits from [CLS] by the family's head (its submodules named as transformers names them)."""
  return families.get(config.family).cls_logits(config, out, num_labels, deterministic)


def _token_logits(config, out, num_labels, deterministic, *, name, dropout):
  """Logits at every position by the family's token head: BERT's dense `name` ("qa_outputs",
  "classifier"), after dropout if `dropout` (the family may have its own head for both)."""
  return families.get(config.family).token_logits(config, out, num_labels, deterministic,
                                                  name=name, dropout=dropout)


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
    logits = _token_logits(self.config, out, 2, deterministic, name="qa_outputs",
                           dropout=False)                                        # [B, T, 2]
    return logits[..., 0], logits[..., 1]                                        # [B, T] x 2


class BertForTokenClassification(nn.Module):
  """NER: a tag distribution per position (only first word pieces are trained/predicted)."""
  config: model_lib.BertConfig
  num_labels: int

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    out = _encode(self.config, input_ids, input_mask, segment_ids, deterministic=deterministic)
    return _token_logits(self.config, out, self.num_labels, deterministic, name="classifier",
                         dropout=True)                                           # [B, T, L]


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


def create_model(task_type, config, *, num_labels=2, num_choices=4):
  """The head model of a task type (bert_jax/tasks/<type>.py): its name, or tasks.of(task)."""
  return tasks.resolve(task_type).create_head(config, num_labels=num_labels,
                                              num_choices=num_choices)


def dummy_inputs(task_type, seq_length, num_choices=4):
  """Zero inputs of the right shapes for model.init."""
  shape = tasks.resolve(task_type).input_shape(seq_length, num_choices)
  ids = jnp.zeros(shape, jnp.int32)
  return ids, jnp.ones_like(ids), ids
