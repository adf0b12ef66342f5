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


def checkpoint_product(path):
  """What retrieval product a checkpoint is, from its metadata alone (no array is read):
  "reranker" (a sentence-transformers CrossEncoder folder; our export of task_type reranker),
  "embedding" (a SentenceTransformer folder; our export of task_type embedding or with a
  "sentence_embedding" record, e.g. a converted SentenceTransformer), else its recorded task
  type, or None (a pre-training export, a plain transformers folder, no path)."""
  # pylint: disable=g-import-not-at-top  (the converters and the store: only when asked)
  from bert_jax import families
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.convert import cross_encoder
  from bert_jax.convert import sentence_transformers
  from bert_jax.tasks import registry
  if not path:
    return None
  if cross_encoder.is_cross_encoder_folder(path):
    return "reranker"
  if sentence_transformers.is_st_folder(path):
    return "embedding"
  if families.is_hf_folder(path):
    return None
  meta = ckpt_lib.describe(path, verify=False).meta
  return registry.recorded_type(meta) or ("embedding" if meta.get("sentence_embedding")
                                          else None)


# A reranker's checkpoint and an embedder's are both an encoder plus (or minus) a head: a run of
# one type from the other's export would train on the wrong product without a word.
RETRIEVAL_PRODUCTS = {"embedding": "a bi-encoder (sentence embeddings)",
                      "reranker": "a cross-encoder (reranker)"}


def check_init_checkpoint(path, run_type):
  """One line when `path` is the other retrieval product than a `run_type` run trains: a
  reranker (our export's task_type, a CrossEncoder folder) for an embedding run, an embedder (our
  export's task_type or "sentence_embedding" record, a SentenceTransformer folder) for a reranker
  run. Reads the checkpoint's metadata only."""
  found = checkpoint_product(path)
  if found is None or found == run_type or found not in RETRIEVAL_PRODUCTS:
    return
  fix = ("a pre-trained encoder (a pre-training export, a transformers folder) or the export "
         f"of a custom.type={run_type} run")
  raise TaskDataError(f"config.init_checkpoint={path} is {RETRIEVAL_PRODUCTS[found]} (task_type "
                      f"{found!r}), but this run trains {RETRIEVAL_PRODUCTS[run_type]} "
                      f"(custom.type={run_type}); start from {fix}, or set "
                      f"--config.custom.type={found}.")
