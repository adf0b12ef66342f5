"""What the task-type modules share: a loaded split, the example limits, a weighted mean, where
a train split came from (for the one-line errors of the types' cannot_learn checks)."""

import dataclasses
import os

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


def train_source(task, config, train):
  """Where the train split came from, for a one-line error: its file (or TFDS split), and the
  row limit when config.max_train_examples may have cut it (a file sorted by label keeps one
  class)."""
  where = (f"{task.name}/train (TFDS)" if config.data_source == "tfds" else
           os.path.join(config.data_dir, (getattr(task, "files", None) or {}).get("train", "")))
  n = config.get("max_train_examples", 0)
  cut = n and len(train.examples) >= n
  return where + (f" (its first {n} examples: config.max_train_examples={n})" if cut else "")


def one_value(values):
  """The one value every element of `values` holds, or None when they differ (or are none)."""
  values = values.reshape(-1)
  return values[0] if len(values) and (values == values[0]).all() else None
