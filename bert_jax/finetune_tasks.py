"""What the fine-tuning loop needs per task family: data, loss, metrics and prediction files.

  load_split        examples + numpy features of one split (files or TFDS), with skip counts
  loss_fn           (model outputs, batch) -> (loss, metrics); `example_weights` masks padding
  predict_outputs   model outputs -> the arrays the host needs after evaluation
  evaluate          host outputs of an eval split -> official metrics (+ prediction files)
  write_test        host outputs of a test split -> the benchmark's submission file(s)

The data modules live in data_pipelines/tasks; this file only connects them to the model.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bert_jax_core import files as files_lib
from bert_jax import metrics as metrics_lib
from data_pipelines import tasks as tasks_lib
from data_pipelines.tasks import glue, ner, squad, squad_predictions, swag
from data_pipelines.tasks.common import TaskDataError

# Model inputs and, per family, the label arrays the loss reads.
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")
LABEL_KEYS = {
    "classification": ("label_ids",),
    "regression": ("label_ids",),
    "span": ("start_positions", "end_positions"),
    "tagging": ("label_ids", "label_weights"),
    "multiple_choice": ("label_ids",),
}


@dataclasses.dataclass
class Split:
  name: str
  examples: list
  features: dict  # numpy arrays with a leading [num_features] axis
  data: object = None  # SQuAD: the JSON "data" list, for the official evaluation
  notes: str = ""  # skip / truncation counts to report


def build_task(config):
  """The task spec named by config.task, or a custom one from config.custom."""
  if config.task != "custom":
    return tasks_lib.get_task(config.task)
  c = config.custom
  # --config.custom.labels='neg,pos' arrives as ('neg,pos',): split on commas.
  labels = tuple(x.strip() for l in c.labels for x in str(l).split(",") if x.strip())
  if c.family == "tagging":
    return ner.custom_task("custom", labels, train_file=c.train_file,
                           dev_file=c.dev_file, test_file=c.test_file)
  if c.family not in ("classification", "regression"):
    raise TaskDataError(f"config.custom.family={c.family!r}; use classification, regression or "
                        "tagging (SQuAD-style and multiple-choice data use squad_v1/v2, swag).")
  labels = () if c.family == "regression" else labels
  if c.family == "classification" and not labels:
    raise TaskDataError("config.custom.labels is empty; list the classes, e.g. "
                        "--config.custom.labels='neg,pos'.")
  return glue.custom_task("custom", text_a=c.text_a, text_b=c.text_b or None, label=c.label,
                          labels=labels, file_format=c.format, train_file=c.train_file,
                          dev_file=c.dev_file, test_file=c.test_file, index=c.index or None)


def available_splits(task, config):
  """(eval splits, test splits) present for this task and data source."""
  if config.data_source == "tfds":
    names = set(getattr(task, "tfds_splits", {}) or {"train": 0, "dev": 0})
  else:
    names = {s for s, f in task.files.items()
             if f and _exists(os.path.join(config.data_dir, f))}
  evals = [s for s in task.eval_splits if s in names]
  tests = sorted(s for s in names if s.startswith("test"))
  return evals, tests


def _exists(path):
  if "://" in path:
    from bert_jax_core.tf_setup import tf
    return tf.io.gfile.exists(path)
  return os.path.isfile(path)


def load_split(task, split, tokenizer, config, is_training):
  """Examples and features of one split."""
  tfds = config.data_source == "tfds"
  if config.data_source not in ("files", "tfds"):
    raise TaskDataError(f"config.data_source={config.data_source!r}; use 'files' or 'tfds'.")
  if task.family in ("classification", "regression"):
    read = glue.read_tfds_examples if tfds else glue.read_examples
    examples = read(task, config.data_dir, split)
    examples = _limit(examples, config, is_training)
    features, truncated = glue.convert_examples(task, examples, tokenizer, config.max_seq_length)
    return Split(split, examples, features, notes=_note(truncated, "examples truncated"))
  if task.family == "span":
    read = squad.read_tfds if tfds else squad.read_file
    examples, data, skips = read(task, config.data_dir, split, is_training)
    examples = _limit(examples, config, is_training)
    features, stats = squad.convert_examples(
        examples, tokenizer, config.max_seq_length, config.doc_stride, config.max_query_length,
        is_training=is_training)
    notes = "; ".join(x for x in (skips.summary(),
                                  _note(stats["questions_truncated"],
                                        f"questions cut to {config.max_query_length} pieces"))
                      if x)
    return Split(split, examples, features, data=data, notes=notes)
  if tfds:
    raise TaskDataError(f"{task.name}: config.data_source='tfds' covers GLUE and SQuAD; read "
                        f"{task.family} data from local files (data_source='files').")
  if task.family == "tagging":
    sentences = _limit(ner.read_examples(task, config.data_dir, split), config, is_training)
    features, stats = ner.convert_examples(task, sentences, tokenizer, config.max_seq_length)
    return Split(split, sentences, features,
                 notes=_note(stats["sentences_split"], "long sentences split into windows"))
  examples = _limit(swag.read_examples(task, config.data_dir, split), config, is_training)
  features, truncated = swag.convert_examples(task, examples, tokenizer, config.max_seq_length)
  return Split(split, examples, features, notes=_note(truncated, "choices truncated"))


def _limit(examples, config, is_training):
  n = config.max_train_examples if is_training else config.max_eval_examples
  return examples[:n] if n else examples


def _note(count, what):
  return f"{count} {what}" if count else ""


# ---------------------------------------------------------------------------------------------
# Loss (pure jnp; runs inside the jitted train/eval steps).
# ---------------------------------------------------------------------------------------------


def _weighted_mean(values, weights):
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


def loss_fn(family, outputs, batch):
  """(loss, metrics). outputs: the head model's output; batch: features + example_weights [B]."""
  # example_weights [B]: 1.0 real, 0.0 padding of the last eval batch; [B, K] for packed training
  # rows of classification/regression (one weight per instance, docs/packing.md).
  w = batch["example_weights"]
  if family == "regression":
    err = (outputs[..., 0] - batch["label_ids"]) ** 2  # [B] or [B, K] squared error
    loss = _weighted_mean(err, w)
    return loss, {"loss": loss}
  if family == "span":
    start_logits, end_logits = outputs  # [B, T] each; google: mean of the two cross-entropies
    ce = (optax.softmax_cross_entropy_with_integer_labels(start_logits, batch["start_positions"])
          + optax.softmax_cross_entropy_with_integer_labels(end_logits,
                                                            batch["end_positions"])) / 2
    loss = _weighted_mean(ce, w)
    return loss, {"loss": loss}
  if family == "tagging":
    ce = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label_ids"])  # [B, T]
    tw = batch["label_weights"] * w[:, None]  # first pieces of real examples only
    loss = _weighted_mean(ce, tw)
    correct = (jnp.argmax(outputs, -1) == batch["label_ids"]).astype(jnp.float32)
    return loss, {"loss": loss, "accuracy": _weighted_mean(correct, tw)}
  # classification [B, L] and multiple choice [B, C]: softmax over the last axis.
  ce = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label_ids"])
  loss = _weighted_mean(ce, w)
  correct = (jnp.argmax(outputs, -1) == batch["label_ids"]).astype(jnp.float32)
  return loss, {"loss": loss, "accuracy": _weighted_mean(correct, w)}


def distill_loss_fn(family, alpha, temperature, outputs, batch):
  """Task-specific distillation (Hinton et al. 2015; DistilBERT's GLUE students, Sanh et al. 2019
  sec. 4.2): alpha x T^2 x KL(softmax(teacher/T) || softmax(student/T)) + (1 - alpha) x the hard
  label loss. batch["teacher_logits"] [B, (K,) L] is a fine-tuned teacher's output, added inside
  the step (trainer_lib's frozen network; finetune.load_distill_teacher). T^2 keeps the soft
  term's gradient on the scale of the hard one's as T grows (Hinton et al. sec. 2).
  Classification only (soft labels are a distribution over classes)."""
  if family != "classification":
    raise ValueError(f"distillation soft labels are for classification, not {family}.")
  hard, metrics = loss_fn(family, outputs, batch)
  t = temperature
  teacher = batch["teacher_logits"].astype(jnp.float32) / t                 # [B, (K,) L]
  student = outputs.astype(jnp.float32) / t
  p_teacher = jax.nn.softmax(teacher, -1)
  kl = jnp.sum(p_teacher * (jax.nn.log_softmax(teacher, -1) - jax.nn.log_softmax(student, -1)),
               -1)                                                          # [B, (K,)]
  soft = _weighted_mean(kl, batch["example_weights"]) * t * t
  agree = (jnp.argmax(outputs, -1) == jnp.argmax(teacher, -1)).astype(jnp.float32)
  loss = alpha * soft + (1.0 - alpha) * hard
  return loss, {**metrics, "loss": loss, "hard_loss": hard, "distill_loss": soft,
                "teacher_agreement": _weighted_mean(agree, batch["example_weights"])}


def predict_outputs(family, outputs):
  """What evaluation brings back to the host (tagging: argmax on device, [B, T] int32)."""
  if family == "span":
    return {"start_logits": outputs[0], "end_logits": outputs[1]}
  if family == "tagging":
    return {"predicted_ids": jnp.argmax(outputs, -1).astype(jnp.int32)}
  return {"logits": outputs}


# ---------------------------------------------------------------------------------------------
# Metrics and prediction files (host, numpy).
# ---------------------------------------------------------------------------------------------


def primary_metric(task):
  """The dev metric that picks the best epoch (and the sweep's best learning rate)."""
  return {"span": "f1", "tagging": "f1"}.get(task.family, task.metrics[0])


ONE_CLASS_SHARE = 0.95   # predictions this concentrated on one class ...
ONE_CLASS_LABELS = 0.8   # ... while it is at most this share of the true labels: warn


def single_class_warning(task, split, outputs):
  """For a classifier: a sentence when it predicts (nearly) one class for a labelled split whose
  labels are not (a model that learned nothing but a prior), else None. Measured on the quick
  start model at lr 2e-5 for 18 steps: 'neg' for 79 of 80 dev examples, F1 0.05."""
  if task.family != "classification" or "label_ids" not in split.features:
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


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  """Official metrics of one labelled split; SQuAD also writes its prediction files."""
  f = split.features
  if task.family in ("classification", "regression", "multiple_choice"):
    logits = outputs["logits"]
    preds = logits[:, 0] if task.family == "regression" else np.argmax(logits, -1)
    names = task.metrics
    return metrics_lib.classification_metrics(names, preds, f["label_ids"])
  if task.family == "tagging":
    tags = ner.predictions_to_tags(task, split.examples, f, outputs["predicted_ids"])
    scores = metrics_lib.entity_scores([s.tags for s in split.examples], tags)
    if output_dir:
      ner.write_predictions(os.path.join(output_dir, f"{task.name}_{split.name}_predictions.txt"),
                            split.examples, tags)
    return {k: scores[k] for k in ("precision", "recall", "f1")}
  preds, nbest, null_odds = _squad_predictions(task, split, outputs, tokenizer, config)
  if output_dir:
    squad_predictions.write_predictions(output_dir, preds, nbest, null_odds)
  if task.version_2_with_negative:
    out = metrics_lib.squad_v2_evaluate(split.data, preds, na_probs=null_odds)
    return {k: v for k, v in out.items() if k in ("exact", "f1", "HasAns_f1", "NoAns_f1",
                                                   "best_f1", "best_f1_thresh")}
  out = metrics_lib.squad_v1_evaluate(split.data, preds)
  return {"exact_match": out["exact_match"], "f1": out["f1"]}


def _squad_predictions(task, split, outputs, tokenizer, config):
  return squad_predictions.compute_predictions(
      split.examples, split.features, outputs["start_logits"], outputs["end_logits"],
      id_to_token=tokenizer.id_to_token, do_lower_case=tokenizer.do_lower_case,
      vocab_kind=tokenizer.vocab.kind, n_best_size=config.n_best_size,
      max_answer_length=config.max_answer_length,
      version_2_with_negative=task.version_2_with_negative,
      null_score_diff_threshold=config.null_score_diff_threshold)


def write_test(task, split, outputs, tokenizer, config, output_dir):
  """Submission file(s) of an unlabelled split; returns the paths written."""
  if task.family in ("classification", "regression"):
    logits = outputs["logits"]
    preds = logits[:, 0] if task.family == "regression" else np.argmax(logits, -1)
    return [glue.write_predictions(task, split.name, split.examples, preds, output_dir)]
  if task.family == "multiple_choice":
    return [swag.write_predictions(task, split.name, split.examples,
                                   np.argmax(outputs["logits"], -1), output_dir)]
  if task.family == "tagging":
    tags = ner.predictions_to_tags(task, split.examples, split.features,
                                   outputs["predicted_ids"])
    path = os.path.join(output_dir, f"{task.name}_{split.name}_predictions.txt")
    return [ner.write_predictions(path, split.examples, tags)]
  preds, nbest, null_odds = _squad_predictions(task, split, outputs, tokenizer, config)
  return list(squad_predictions.write_predictions(output_dir, preds, nbest, null_odds,
                                                  prefix=f"{split.name}_").values())


def dump_json(path, obj):
  files_lib.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
