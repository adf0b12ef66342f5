"""Tagging (NER): CoNLL-2003, or your own BIO tags in CoNLL columns (task=custom). Dropout +
dense on every position -> [B, T, L] logits (heads.BertForTokenClassification), cross-entropy on
each word's first piece, entity-level precision/recall/F1 (seqeval's rules), CoNLL column files
for dev and test splits."""

import os

import jax.numpy as jnp
import optax

from bert_jax.models import heads
from bert_jax.evaluation import metrics as metrics_lib
from bert_jax.tasks import classification
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import ner
from data_pipelines.tasks.common import TaskDataError


def load_split(task, split, tokenizer, config, is_training):
  common.check_files_only(task, config)
  sentences = common.limit(ner.read_examples(task, config.data_dir, split), config, is_training)
  features, stats = ner.convert_examples(task, sentences, tokenizer, config.max_seq_length)
  return common.Split(split, sentences, features,
                      notes=common.note(stats["sentences_split"],
                                        "long sentences split into windows"))


def custom_task(config, labels):
  c = config.custom
  return ner.custom_task("custom", labels, train_file=c.train_file, dev_file=c.dev_file,
                         test_file=c.test_file)


def create_head(model_config, num_labels=2, num_choices=4):
  del num_choices
  return heads.BertForTokenClassification(model_config, num_labels)


def loss(outputs, batch):
  ce = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label_ids"])  # [B, T]
  tw = batch["label_weights"] * batch["example_weights"][:, None]  # first pieces of real rows
  value = common.weighted_mean(ce, tw)
  correct = (jnp.argmax(outputs, -1) == batch["label_ids"]).astype(jnp.float32)
  return value, {"loss": value, "accuracy": common.weighted_mean(correct, tw)}


def cannot_learn(task, train, tokenizer, config):
  """One line when every labelled word (first piece) of the train split has the same tag
  (every word 'O': no entity): cross-entropy then learns only that tag."""
  del tokenizer
  f = train.features
  tags = f["label_ids"][f["label_weights"] > 0]                        # [words]
  tag = common.one_value(tags)
  if tag is None:
    return []
  name = task.labels[int(tag)] if int(tag) < len(task.labels) else str(tag)
  where = common.train_source(task, config, train)
  raise TaskDataError(f"{where}: all {len(tags)} training words are tagged {name!r}: a tagger "
                      f"learns only to predict {name!r}, nothing of the text; check the tag "
                      "column (the last of each line).")


def predict_outputs(outputs):
  """The argmax on device: [B, T] int32 comes back, not [B, T, L] logits."""
  return {"predicted_ids": jnp.argmax(outputs, -1).astype(jnp.int32)}


def _path(task, split, output_dir):
  return os.path.join(output_dir, f"{task.name}_{split.name}_predictions.txt")


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  del tokenizer, config
  tags = ner.predictions_to_tags(task, split.examples, split.features, outputs["predicted_ids"])
  scores = metrics_lib.entity_scores([s.tags for s in split.examples], tags)
  if output_dir:
    ner.write_predictions(_path(task, split, output_dir), split.examples, tags)
  return {k: scores[k] for k in ("precision", "recall", "f1")}


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  tags = ner.predictions_to_tags(task, split.examples, split.features, outputs["predicted_ids"])
  return [ner.write_predictions(_path(task, split, output_dir), split.examples, tags)]


TYPE = registry.register(registry.TaskType(
    name="tagging",
    summary="dropout + dense on every position -> [B, T, L]; CoNLL-2003 and your own BIO tags",
    named_tasks=dict(ner.TASKS),
    label_keys=("label_ids", "label_weights"),
    load_split=load_split, custom_task=custom_task,
    create_head=create_head, input_shape=classification.input_shape, loss=loss,
    predict_outputs=predict_outputs, evaluate=evaluate, write_test=write_test,
    cannot_learn=cannot_learn, primary_metric=lambda task: "f1", dev_prediction_files=True,
    hf_head="TokenClassification", hf_named_labels=True))
