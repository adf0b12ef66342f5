"""Sentence (pair) classification: GLUE's cola sst2 mrpc qqp mnli qnli rte wnli, or your own
TSV/CSV/JSONL (task=custom). Dropout + dense on the family's [CLS] output -> [B, L] logits
(heads.BertForSequenceClassification), softmax cross-entropy, accuracy/F1/MCC
(metrics.classification_metrics), GLUE's <Task>.tsv submission files. Packed training rows and
a teacher's soft labels (distillation) are for this type (and packing for regression)."""

import numpy as np
import optax
import jax.numpy as jnp

from bert_jax.models import heads
from bert_jax.evaluation import metrics as metrics_lib
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import glue
from data_pipelines.tasks.common import TaskDataError


# --- Data: glue.py's reader (regression shares it). ---
def load_split(task, split, tokenizer, config, is_training):
  read = glue.read_tfds_examples if config.data_source == "tfds" else glue.read_examples
  examples = common.limit(read(task, config.data_dir, split), config, is_training)
  features, truncated = glue.convert_examples(task, examples, tokenizer, config.max_seq_length)
  return common.Split(split, examples, features, notes=common.note(truncated,
                                                                   "examples truncated"))


def custom_task(config, labels):
  """config.custom -> a glue.ClassificationTask of your own files."""
  if not labels:
    raise TaskDataError("config.custom.labels is empty; list the classes, e.g. "
                        "--config.custom.labels='neg,pos'.")
  if len(labels) == 1:   # softmax over one logit: probability 1, loss 0, gradient 0
    raise TaskDataError(f"config.custom.labels={labels}: one class; a softmax over one class is "
                        "certain of it (loss 0 and gradient 0 on every example), so nothing can "
                        "be learned: list every class of the label column, e.g. "
                        f"--config.custom.labels='{labels[0]},other' (for a score, "
                        "--config.custom.type=regression).")
  return glue_custom_task(config.custom, labels)


def glue_custom_task(c, labels):
  return glue.custom_task("custom", text_a=c.text_a, text_b=c.text_b or None, label=c.label,
                          labels=labels, file_format=c.format, train_file=c.train_file,
                          dev_file=c.dev_file, test_file=c.test_file, index=c.index or None)


# --- Model and loss. ---
def create_head(model_config, num_labels=2, num_choices=4):
  del num_choices
  return heads.BertForSequenceClassification(model_config, num_labels)


def input_shape(seq_length, num_choices=4):
  del num_choices
  return (1, seq_length)


def loss(outputs, batch):
  """Softmax cross-entropy over the last axis of [B, (K,) L] logits (multiple choice: [B, C])."""
  # example_weights [B]: 1.0 real, 0.0 padding of the last eval batch; [B, K] for packed training
  # rows (one weight per instance, docs/packing.md).
  w = batch["example_weights"]
  ce = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label_ids"])
  value = common.weighted_mean(ce, w)
  correct = (jnp.argmax(outputs, -1) == batch["label_ids"]).astype(jnp.float32)
  return value, {"loss": value, "accuracy": common.weighted_mean(correct, w)}


def predict_outputs(outputs):
  return {"logits": outputs}


# --- Evaluation and prediction files. ---
def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  del tokenizer, config, output_dir
  preds = np.argmax(outputs["logits"], -1)
  return metrics_lib.classification_metrics(task.metrics, preds, split.features["label_ids"])


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  preds = np.argmax(outputs["logits"], -1)
  return [glue.write_predictions(task, split.name, split.examples, preds, output_dir)]


# --- What cannot be learned, checked before compute (TaskType.cannot_learn). ---
def cannot_learn(task, train, tokenizer, config):
  """One line when every training example has the same label: cross-entropy then learns that
  class's prior (its bias) and nothing of the text. Seen with a file sorted by label cut by
  config.max_train_examples. A distillation teacher's soft labels still teach the classes: a
  warning then. A class of the label set no training example has: a warning (a user may mean
  it). (A classifier that predicts one class after training is `warn`'s, below.)"""
  del tokenizer
  label = common.one_value(np.asarray(train.features["label_ids"]))
  names = list(getattr(task, "labels", ()) or ())
  if label is None:
    unseen = [n for i, n in enumerate(names) if not (train.features["label_ids"] == i).any()]
    return [f"{common.train_source(task, config, train)}: no training example has label "
            f"{', '.join(map(repr, unseen))} (of {len(names)}): the classifier will hardly ever "
            "predict it"] if unseen else []
  name = names[int(label)] if int(label) < len(names) else str(label)
  n = len(train.features["label_ids"])
  what = f"all {n} training examples have label {name!r}"
  if config.get("distill_teacher") and float(config.get("distill_alpha", 0.0)) > 0:
    return [f"{what}: only the distillation teacher's soft labels (distill_alpha="
            f"{config.distill_alpha:g}) tell the classes apart"]
  where = common.train_source(task, config, train)
  raise TaskDataError(f"{where}: {what}: a classifier learns only to predict {name!r}, nothing "
                      "of the text; check the label column, or shuffle a file sorted by label "
                      "(config.max_train_examples takes the first rows).")


ONE_CLASS_SHARE = 0.95   # predictions this concentrated on one class ...
ONE_CLASS_LABELS = 0.8   # ... while it is at most this share of the true labels: warn


def single_class_warning(task, split, outputs):
  """A sentence when the classifier predicts (nearly) one class for a labelled split whose
  labels are not (a model that learned nothing but a prior), else None. Measured on the quick
  start model at lr 2e-5 for 18 steps: 'neg' for 79 of 80 dev examples, F1 0.05."""
  if "label_ids" not in split.features:
    return None
  preds, labels = np.argmax(outputs["logits"], -1), np.asarray(split.features["label_ids"])
  if len(preds) < 2:
    return None
  values, counts = np.unique(preds, return_counts=True)
  top = int(values[np.argmax(counts)])
  n_top = int(counts.max())
  if n_top < ONE_CLASS_SHARE * len(preds) or np.mean(labels == top) > ONE_CLASS_LABELS:
    return None
  names = list(getattr(task, "labels", ()) or ())
  label = names[top] if top < len(names) else str(top)
  count = "all" if n_top == len(preds) else f"{n_top} of"
  return (f"the classifier predicts one class ({label!r}) for {count} {len(preds)} "
          f"{split.name} examples")


TYPE = registry.register(registry.TaskType(
    name="classification",
    summary="dropout + dense on [CLS] -> [B, L] logits; GLUE and your own TSV/CSV/JSONL",
    named_tasks={n: t for n, t in glue.TASKS.items() if not t.is_regression},
    label_keys=("label_ids",),
    load_split=load_split, custom_task=custom_task,
    create_head=create_head, input_shape=input_shape, loss=loss,
    predict_outputs=predict_outputs, evaluate=evaluate, write_test=write_test,
    warn=single_class_warning, cannot_learn=cannot_learn, packable=True, soft_labels=True,
    hf_head="SequenceClassification", hf_problem_type="single_label_classification",
    hf_named_labels=True))
