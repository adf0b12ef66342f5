"""Checks a pre-training run makes before any compute: config values, the records' contract, and
the first batch, so a bad input is one line within seconds instead of a traceback after the model
is built (49-64 s for BERT-tiny on 2 CPU cores; minutes for BERT-large on a pod).

Order in train.py: config values -> files -> vocab -> the records' dataset_info.json (vocab hash,
casing, seq length, masking, per-shard counts) -> the resume step -> the input pipeline and its
first batch -> only then the model, the optimizer and the compiled steps.
"""

import itertools

import numpy as np

from bert_jax_core import errors
from bert_jax.training import optimizer as optimizer_lib

# Config fields that must be positive integers (a negative batch size divides evenly by the
# device count, so the mesh check alone lets batch_size=-32 through).
POSITIVE = ("batch_size", "seq_length", "max_predictions_per_seq", "num_train_steps",
            "grad_accum_steps", "log_every", "checkpoint_every", "eval_every", "keep_checkpoints")


class PreflightError(errors.UserError):
  """A config value, the records or the first batch cannot make a valid training run."""


def check_config_values(config):
  for name in POSITIVE:
    if name in config and (not isinstance(config[name], int) or config[name] < 1):
      raise PreflightError(f"config.{name}={config[name]!r}: expected a positive integer.")
  prob = config.get("masked_lm_prob", 0.15)
  if not 0 < prob < 1:
    raise PreflightError(f"config.masked_lm_prob={prob!r}: expected a fraction of the tokens "
                         "between 0 and 1 (the paper's 0.15).")
  problem = _replacement_problem(config.get("mask_replace_prob", 0.8),
                                 config.get("random_replace_prob", 0.1))
  if problem:
    raise PreflightError(problem)
  if config.max_predictions_per_seq > config.seq_length:
    raise PreflightError(f"config.max_predictions_per_seq={config.max_predictions_per_seq} > "
                         f"config.seq_length={config.seq_length}: at most one prediction per "
                         "token (20 for seq 128, 80 for 512).")
  # The optimizer's and schedule's own checks (names, warmup <= steps, wsd/cosine's decay_steps
  # and final_lr_fraction, weight_decay_all_tensors), here so they fail before any input is read.
  optimizer_lib.from_config(config, num_train_steps=config.num_train_steps,
                            warmup_steps=config.warmup_steps)
  if "max_consecutive_skips" in config and config.max_consecutive_skips < 0:
    raise PreflightError(f"config.max_consecutive_skips={config.max_consecutive_skips}: expected "
                         ">= 0 (0 = never stop on NaN/Inf steps, only skip them).")


def _replacement_problem(mask_replace_prob, random_replace_prob):
  # masking.py's rule, imported here only when a value is not BERT's (masking imports TF, which a
  # synthetic-data run never loads).
  if (mask_replace_prob, random_replace_prob) == (0.8, 0.1):
    return None
  from data_pipelines.input import masking  # pylint: disable=g-import-not-at-top
  return masking.check_replacement(mask_replace_prob, random_replace_prob, prefix="config.")


def check_data_contract(files, field, config, vocab, log=print, model_config=None):
  """Every directory of `files` against its dataset_info.json; {file: records} from it.

  Directories without one (google-research/bert's records) are noted; their records are
  counted by the input pipeline if it needs the counts.
  """
  if files == "synthetic":
    return {}
  from data_pipelines.records import dataset_info  # pylint: disable=g-import-not-at-top
  vocab_sha256 = (dataset_info.sha256_file(vocab.path)
                  if vocab.path and vocab.path != "synthetic" else None)
  counts, without = dataset_info.check_records(
      files, field=f"config.{field}", vocab_path=vocab.path, vocab_size=vocab.size,
      vocab_sha256=vocab_sha256, do_lower_case=config.get("do_lower_case"),
      seq_length=config.seq_length, max_predictions_per_seq=config.max_predictions_per_seq,
      sentence_objective=(model_config.sentence_objective or "none") if model_config else None,
      log=log)
  if without:
    log(f"note: config.{field}: no {dataset_info.INFO_FILE} beside {', '.join(without)} (e.g. "
        "google-research/bert records): vocab and casing unchecked; lengths are checked on the "
        "first record of every file and records are counted by reading them where needed.")
  if counts:
    log(f"config.{field}: {sum(counts.values()):,} records in {len(counts)} file(s) per "
        f"{dataset_info.INFO_FILE} (vocab, casing, seq_length {config.seq_length} match)")
  return counts


def first_batch(batches, field, config, vocab, local_batch):
  """Pulls and checks the first batch; returns an iterator that yields it again, then the rest."""
  batch = next(batches)
  t = config.seq_length
  if tuple(batch["input_ids"].shape) != (local_batch, t):
    raise PreflightError(f"config.{field}: the first batch has input_ids of shape "
                         f"{tuple(batch['input_ids'].shape)}, expected {(local_batch, t)} (rows "
                         "per host, config.seq_length).")
  for key in ("input_ids", "masked_lm_ids"):
    ids = batch[key]
    if ids.size and (ids.max() >= vocab.size or ids.min() < 0):
      bad = int(ids.max() if ids.max() >= vocab.size else ids.min())
      raise PreflightError(f"config.{field}: the first batch holds token id {bad} in {key}, but "
                           f"the vocab {vocab.path} has {vocab.size} tokens; the records were made "
                           "with another vocab: train with that one.")
  pos = batch["masked_lm_positions"]
  if pos.size and (pos.max() >= t or pos.min() < 0):
    raise PreflightError(f"config.{field}: the first batch has a masked_lm_position "
                         f"{int(pos.max())} outside [0, {t}); the records' masks do not fit "
                         f"config.seq_length={t}.")
  if not np.all(np.isfinite(batch["masked_lm_weights"])):
    raise PreflightError(f"config.{field}: the first batch has non-finite masked_lm_weights.")
  return itertools.chain([batch], batches)
