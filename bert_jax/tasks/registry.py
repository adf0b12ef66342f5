"""Fine-tuning task types: one module each, found by name in one table.

A task type (classification, regression, span QA, tagging, multiple choice, ...) is everything
the fine-tuning loop needs that varies between kinds of labelled data: its named tasks (GLUE's
sst2, SQuAD, CoNLL-2003, ...), how it reads a split into numpy features, the head it trains, its
loss, what evaluation brings back to the host, its metrics and its prediction files. Each lives
in `bert_jax/tasks/<name>.py` as one `TaskType` record; the loop (finetune.py), finetune_tasks.py,
heads.py and the converters look the record up here and never name a task type. This is
big_vision's evaluator registry and KerasHub's Task-over-any-backbone in one plain dict; it is
the model families' registry (bert_jax/families/registry.py) for the other open list.

Discovery: every module of this package is imported on the first lookup (pkgutil, in name
order), and a module that builds a `TaskType` calls `register`; there is no hand-kept list, so a
new task type is a new file here, or a `register` call anywhere (tests/bert_jax/tasks/tasks_registry_test.py
adds a toy one in the test itself and fine-tunes it). A data task (data_pipelines.tasks) names
its type by name (`task.type`); a fine-tuning export records it as `task_type` (runs before this
table recorded it as `task_family`: `recorded_type` reads both).

Layers: this module imports nothing of ours; the task-type modules import heads.py and the data
modules, and heads.py looks the head up here at call time (no import cycle: tests/layers_test.py).
"""

import dataclasses
import importlib
import pkgutil
from typing import Callable, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class TaskType:
  """What one task type declares. The callables' signatures are classification's."""
  name: str                       # what data tasks say (task.type) and exports record (task_type)
  summary: str                    # one line: the head and the data it reads
  named_tasks: Mapping[str, object]   # task name -> data task record (config.task picks one)
  label_keys: tuple               # the feature arrays the loss reads, besides the inputs

  # --- Data (host, numpy).
  load_split: Callable = None     # (task, split, tokenizer, config, is_training) -> common.Split
  custom_task: Optional[Callable] = None   # (run config, labels tuple) -> task from
                                           #   config.custom; None: no `task=custom` form
  bind: Optional[Callable] = None  # task -> this record with its hooks closed over the task's
                                   #   own settings (embedding: pooling, scale); None: as is

  # --- Model and loss (the head over any family's body; pure jnp inside the jitted steps).
  create_head: Callable = None    # (model_config, num_labels, num_choices) -> nn.Module
  input_shape: Callable = None    # (seq_length, num_choices) -> the inputs' shape for init
  loss: Callable = None           # (outputs, batch) -> (loss, {metric: value}); batch holds
                                  #   example_weights [B] (0.0 = padding row) or [B, K] (packed)
  predict_outputs: Callable = None    # outputs -> {name: array} evaluation brings to the host
  train_grads: Optional[Callable] = None   # (mesh, global batch size) -> the train step's
                                           #   grads_fn (trainer_lib.train_step) or None;
                                           #   called before compute, may refuse the sizes.
                                           #   None: jax.value_and_grad of `loss` (embedding:
                                           #   GradCache when grad_cache_chunks > 1)
  cannot_learn: Optional[Callable] = None  # (task, train Split, tokenizer, run config) ->
                                           #   [warning sentences] for the start-up; raises
                                           #   TaskDataError (one line) where the loss cannot
                                           #   move by construction (one class, one pair a
                                           #   batch, every text the same). Called by the loop
                                           #   before compute, on the unpacked train split
  train_batch: Optional[Callable] = None   # (task, run config) -> {key: (shape, dtype)} of one
                                           #   global training batch, what the train step
                                           #   reads; bert_jax.plan compiles the step from it
                                           #   without data. None: the plan cannot build it

  # --- Evaluation and prediction files (host, numpy).
  evaluate: Callable = None       # (task, split, host outputs, tokenizer, config, output_dir)
                                  #   -> {metric: value}; writes dev prediction files if asked
  write_test: Callable = None     # (task, split, host outputs, tokenizer, config, output_dir)
                                  #   -> [paths written]: the benchmark's submission file(s)
  primary_metric: Optional[Callable] = None   # task -> the metric that picks the best epoch;
                                              #   None: task.metrics[0]
  warn: Optional[Callable] = None     # (task, split, host outputs) -> a sentence or None
  dev_prediction_files: bool = False  # evaluate(output_dir=...) writes files worth keeping

  # --- What the loop allows (each refused in one line for the other types).
  packable: bool = False          # config.pack: several sequences per training row
  pack_batches: Optional[Callable] = None  # (train Split, run config, every batch of the run
                                           #   [index arrays], mesh) -> (host_batch(idx), a
                                           #   start-up line): config.pack packs each batch's
                                           #   sequences (embedding: its loss needs a batch's
                                           #   rows together); None: the split is packed once
  epoch_order: Optional[Callable] = None   # (train Split, batch_size, rng) -> a permutation
                                           #   of its rows; None: rng.permutation
  soft_labels: bool = False       # config.distill_teacher: a teacher's soft labels per class
  load_teacher: Optional[Callable] = None  # (task, run config, tokenizer) -> a teacher run
                                           #   frozen in the step (finetune.DistillTeacher's
                                           #   fields; output_key: the batch key of its
                                           #   outputs) or None (embedding: teacher_checkpoint)

  # --- Export (the family's converter builds e.g. "ModernBertFor" + hf_head).
  hf_head: str = ""               # transformers' head class suffix ("SequenceClassification")
  hf_problem_type: str = ""       # config.json problem_type ("" = not written)
  hf_num_labels: Optional[int] = None   # the head's outputs when fixed (span: 2)
  hf_named_labels: bool = False   # config.json id2label carries the task's label names
  export_record: Optional[Callable] = None   # (task, run config) -> {key: JSON value} that
                                             #   best_epoch{N}'s bert_config.json adds
                                             #   (embedding: its pooling and prompts)
  next_commands: Optional[Callable] = None   # (best export dir) -> [command lines] a finished
                                             #   run prints next (embedding: the
                                             #   sentence-transformers export, predict embed)

  def metric(self, task) -> str:
    return self.primary_metric(task) if self.primary_metric else task.metrics[0]


REGISTRY: dict = {}   # name -> TaskType, in registration order
_loaded = []


def _load_builtin():
  """Imports every module of this package once; each task-type module registers itself."""
  if not _loaded:
    _loaded.append(True)   # before the imports: each one registers through this module
    package = __name__.rpartition(".")[0]
    path = importlib.import_module(package).__path__
    for module in sorted(m.name for m in pkgutil.iter_modules(path)):
      importlib.import_module(f"{package}.{module}")


def register(task_type: TaskType, *, replace=False) -> TaskType:
  """Adds `task_type` and returns it. A second type of the same name, or a task name two types
  claim, is an error unless replace=True."""
  _load_builtin()
  if task_type.name in REGISTRY and not replace:
    raise ValueError(f"task type {task_type.name!r} is already registered.")
  for name in task_type.named_tasks:
    owner = next((t.name for t in REGISTRY.values() if name in t.named_tasks
                  and t.name != task_type.name), None)
    if owner:
      raise ValueError(f"task {name!r} of task type {task_type.name!r} is already declared "
                       f"by task type {owner!r}.")
  REGISTRY[task_type.name] = task_type
  return task_type


def unregister(name):
  """Removes a task type (tests that register a toy one clean up with this)."""
  REGISTRY.pop(name, None)


def names() -> tuple:
  _load_builtin()
  return tuple(REGISTRY)


def get(name) -> TaskType:
  _load_builtin()
  try:
    return REGISTRY[name]
  except KeyError:
    raise ValueError(f"unknown task type {name!r}; one of {', '.join(names())} "
                     "(bert_jax/tasks/).") from None


def of(task) -> TaskType:
  """The task type of a data task (its `type` attribute), bound to the task's settings."""
  task_type = get(task.type)
  return task_type.bind(task) if task_type.bind else task_type


def resolve(task_type) -> TaskType:
  """A TaskType given as itself (of(task): bound to a task) or by name."""
  return task_type if isinstance(task_type, TaskType) else get(task_type)


def named_tasks() -> dict:
  """Every type's named tasks in one dict: task name -> data task record."""
  _load_builtin()
  return {n: t for tt in REGISTRY.values() for n, t in tt.named_tasks.items()}


def recorded_type(meta) -> Optional[str]:
  """The task type an export's meta records: `task_type`, or `task_family` as runs before this
  table wrote it; None when neither is there."""
  return meta.get("task_type", meta.get("task_family"))
