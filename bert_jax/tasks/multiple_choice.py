"""Multiple choice: SWAG. Each choice is its own sequence, [B, C, T]; one shared dense(1) scores
each choice's [CLS] -> [B, C] logits (heads.BertForMultipleChoice), softmax over the choices
(classification's loss), accuracy, SWAG's csv submission file."""

import numpy as np

from bert_jax.models import heads
from bert_jax.tasks import classification
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import swag


def load_split(task, split, tokenizer, config, is_training):
  common.check_files_only(task, config)
  examples = common.limit(swag.read_examples(task, config.data_dir, split), config, is_training)
  features, truncated = swag.convert_examples(task, examples, tokenizer, config.max_seq_length)
  return common.Split(split, examples, features,
                      notes=common.note(truncated, "choices truncated"))


def create_head(model_config, num_labels=2, num_choices=4):
  del num_labels
  return heads.BertForMultipleChoice(model_config, num_choices)


def input_shape(seq_length, num_choices=4):
  return (1, num_choices, seq_length)


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  return [swag.write_predictions(task, split.name, split.examples,
                                 np.argmax(outputs["logits"], -1), output_dir)]


TYPE = registry.register(registry.TaskType(
    name="multiple_choice",
    summary="dense(1) on each choice's [CLS] -> [B, C] logits; SWAG",
    named_tasks=dict(swag.TASKS),
    label_keys=("label_ids",),
    load_split=load_split, create_head=create_head, input_shape=input_shape,
    loss=classification.loss, predict_outputs=classification.predict_outputs,
    evaluate=classification.evaluate, write_test=write_test, hf_head="MultipleChoice",
    hf_num_labels=1))
