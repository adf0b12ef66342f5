"""What the task-type modules share: a loaded split, the example limits, a weighted mean."""

import dataclasses

import jax.numpy as jnp

from data_pipelines.tasks.common import TaskDataError


@dataclasses.dataclass
class Split:
  name: str
  examples: list
  features: dict  # numpy arrays with a leading [num_features] axis
  data: object = None  # SQuAD: the JSON "data" list, for the official evaluation
  notes: str = ""  # skip / truncation counts to report


def limit(examples, config, is_training):
  """The first config.max_train_examples / max_eval_examples (0 = all)."""
  n = config.max_train_examples if is_training else config.max_eval_examples
  return examples[:n] if n else examples


def note(count, what):
  return f"{count} {what}" if count else ""


def weighted_mean(values, weights):
  return jnp.sum(values * weights) / jnp.maximum(jnp.sum(weights), 1e-5)


def check_files_only(task, config):
  """One line for config.data_source='tfds' on a type that reads local files only."""
  if config.data_source == "tfds":
    raise TaskDataError(f"{task.name}: config.data_source='tfds' covers GLUE and SQuAD; read "
                        f"{task.type} data from local files (data_source='files').")
