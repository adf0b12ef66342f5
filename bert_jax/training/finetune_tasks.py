"""What the fine-tuning loop needs of a task, looked up by its type: data, loss, metrics, files.

  load_split        examples + numpy features of one split (files or TFDS), with skip counts
  loss_fn           (model outputs, batch) -> (loss, metrics); `example_weights` masks padding
  predict_outputs   model outputs -> the arrays the host needs after evaluation
  evaluate          host outputs of an eval split -> official metrics (+ prediction files)
  write_test        host outputs of a test split -> the benchmark's submission file(s)

Each is one line here: the task's type (`task.type`; bert_jax/tasks/<type>.py, found in one
table) does the work, and this module names no type. The data modules live in
data_pipelines/tasks.
"""

import json
import os

import jax
import jax.numpy as jnp

from bert_jax_core import files as files_lib
from bert_jax import tasks as task_types
from bert_jax.tasks import common
from bert_jax.tasks.common import Split  # noqa: F401  (re-exported: finetune_tasks.Split)
from data_pipelines.tasks.common import TaskDataError

# Model inputs; each task type declares the label arrays its loss reads (TaskType.label_keys).
INPUT_KEYS = ("input_ids", "input_mask", "segment_ids")


def input_keys(task):
  """The feature arrays a batch of `task` carries: the inputs and its type's labels."""
  return INPUT_KEYS + task_types.of(task).label_keys


def build_task(config):
  """The task named by config.task (any registered type's), or a custom one from config.custom."""
  if config.task != "custom":
    known = task_types.named_tasks()
    if config.task not in known:
      raise TaskDataError(f"unknown task {config.task!r}; registered tasks: "
                          f"{', '.join(sorted(known))} (or task=custom with config.custom).")
    return known[config.task]
  c = config.custom
  # --config.custom.labels='neg,pos' arrives as ('neg,pos',): split on commas.
  labels = tuple(x.strip() for l in c.labels for x in str(l).split(",") if x.strip())
  custom = {t.name: t.custom_task for t in map(task_types.get, task_types.names())
            if t.custom_task}
  if c.type not in custom:
    named = sorted(n for t, tt in task_types.REGISTRY.items() if t not in custom
                   for n in tt.named_tasks)
    raise TaskDataError(f"config.custom.type={c.type!r}; use {', '.join(custom)} (the other "
                        f"task types read their named tasks' data: {', '.join(named)}).")
  return custom[c.type](config, labels)


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
  if config.data_source not in ("files", "tfds"):
    raise TaskDataError(f"config.data_source={config.data_source!r}; use 'files' or 'tfds'.")
  return task_types.of(task).load_split(task, split, tokenizer, config, is_training)


def check_can_learn(task, train, tokenizer, config):
  """A training run whose loss cannot move says so before compute (issue 49): the task type's
  own checks (TaskType.cannot_learn: one line, e.g. a classifier's train split of one label),
  then a train split smaller than one batch. Returns the warnings for the start-up lines (a
  setting a user may mean). Called on the unpacked split, before packing."""
  if train is None:
    return []
  check = task_types.of(task).cannot_learn
  warnings = list(check(task, train, tokenizer, config) or ()) if check else []
  n, b = len(train.features["input_ids"]), int(config.batch_size)
  if n < b:   # one padded batch an epoch: the run's batch size is not the one asked for
    where = common.train_source(task, config, train)
    raise TaskDataError(f"{where}: {n} training sequences, fewer than one batch "
                        f"(config.batch_size={b}): every step would be the same {n} rows and "
                        f"{b - n} of padding; set --config.batch_size={n} or less (a multiple "
                        "of the data-parallel devices), or add data.")
  return warnings


# ---------------------------------------------------------------------------------------------
# Loss (pure jnp; runs inside the jitted train/eval steps).
# ---------------------------------------------------------------------------------------------


def loss_fn(task_type, outputs, batch):
  """(loss, metrics) of `task_type` (a name, or tasks.of(task)). outputs: the head model's output;
  batch: features + example_weights [B] (or [B, K] for packed rows)."""
  return task_types.resolve(task_type).loss(outputs, batch)


def distill_loss_fn(task_type, alpha, temperature, outputs, batch):
  """Task-specific distillation (Hinton et al. 2015; DistilBERT's GLUE students, Sanh et al. 2019
  sec. 4.2): alpha x T^2 x KL(softmax(teacher/T) || softmax(student/T)) + (1 - alpha) x the hard
  label loss. batch["teacher_logits"] [B, (K,) L] is a fine-tuned teacher's output, added inside
  the step (trainer_lib's frozen network; finetune.load_distill_teacher). T^2 keeps the soft
  term's gradient on the scale of the hard one's as T grows (Hinton et al. sec. 2).
  For task types with soft labels over classes (TaskType.soft_labels)."""
  if not task_types.resolve(task_type).soft_labels:
    raise ValueError(f"distillation soft labels are for a distribution over classes, not "
                     f"{task_type}.")
  hard, metrics = loss_fn(task_type, outputs, batch)
  t = temperature
  teacher = batch["teacher_logits"].astype(jnp.float32) / t                 # [B, (K,) L]
  student = outputs.astype(jnp.float32) / t
  p_teacher = jax.nn.softmax(teacher, -1)
  kl = jnp.sum(p_teacher * (jax.nn.log_softmax(teacher, -1) - jax.nn.log_softmax(student, -1)),
               -1)                                                          # [B, (K,)]
  w = batch["example_weights"]
  soft = common.weighted_mean(kl, w) * t * t
  agree = (jnp.argmax(outputs, -1) == jnp.argmax(teacher, -1)).astype(jnp.float32)
  loss = alpha * soft + (1.0 - alpha) * hard
  return loss, {**metrics, "loss": loss, "hard_loss": hard, "distill_loss": soft,
                "teacher_agreement": common.weighted_mean(agree, w)}


def predict_outputs(task_type, outputs):
  """What evaluation brings back to the host (tagging: argmax on device, [B, T] int32)."""
  return task_types.resolve(task_type).predict_outputs(outputs)


# ---------------------------------------------------------------------------------------------
# Metrics and prediction files (host, numpy).
# ---------------------------------------------------------------------------------------------


def primary_metric(task):
  """The dev metric that picks the best epoch (and the sweep's best learning rate)."""
  return task_types.of(task).metric(task)


def single_class_warning(task, split, outputs):
  """The task type's warning about a split's predictions (classification: a classifier that
  predicts one class), or None."""
  warn = task_types.of(task).warn
  return warn(task, split, outputs) if warn else None


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  """Official metrics of one labelled split; with output_dir, its prediction files too."""
  return task_types.of(task).evaluate(task, split, outputs, tokenizer, config, output_dir)


def write_test(task, split, outputs, tokenizer, config, output_dir):
  """Submission file(s) of an unlabelled split; returns the paths written."""
  return task_types.of(task).write_test(task, split, outputs, tokenizer, config, output_dir)


def dump_json(path, obj):
  files_lib.write_atomic(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")
