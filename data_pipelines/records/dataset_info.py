"""The records' contract: `dataset_info.json` beside the shards, written once and checked by every reader.

create_pretraining_data writes it (through `write`); `bert_jax.train` checks it for every input
pattern before any compute (`check_records`). The fields the contract rests on:

  vocab_sha256, vocab_size, vocab_file   the vocab the ids were made with (a shuffled vocab of the
                                         same size has another hash: ids would mean other words)
  do_lower_case                          how the text was normalised before WordPiece
  max_seq_length                         the length of every record (config.seq_length)
  max_predictions_per_seq, masking       null / "dynamic" for unmasked records (the input pipeline
                                         masks them); a number for pre-masked ones
  nsp                                    NSP pairs (True) or not (False)
  sentence_objective                     what next_sentence_labels mean: nsp | sop (ALBERT's
                                         sentence order) | none (full sentences); checked against
                                         the model's objectives
  word_boundaries                        "jieba": records carry `word_continues` for Chinese
                                         whole-word masking (the input pipeline checks it)
  shards: [{file, num_instances}]        per-shard record counts: readers take them from here
                                         instead of reading every file
  command                                the command line that made the records

Records without it (google-research/bert's own) are still read: their first record is checked
for the lengths by the input pipeline, they are counted by reading them, with a note saying so,
and their first records' next_sentence_labels tell NSP pairs from full sentences for the model's
sentence objective (sniff_sentence_pairs).
"""

import json
import os
import shlex
import sys
import time

from bert_jax_core import errors
from bert_jax_core import files as files_lib

INFO_FILE = "dataset_info.json"
CONTRACT_VERSION = 1


class DataContractError(errors.UserError):
  """The records were made with another vocab, casing, length or masking than training asks for."""


def _gfile():
  from bert_jax_core.tf_setup import tf
  return tf.io.gfile


sha256_file = files_lib.sha256_file  # the one file hash (bert_jax_core.files)


def write(output_dir, info, command=None):
  """Writes `info` + the contract fields to output_dir/dataset_info.json atomically.

  `info` must hold the fields of the module docstring that the writer knows (vocab, casing,
  max_seq_length, nsp, shards); masking defaults to dynamic (unmasked records) and `command` to
  this process's command line.
  """
  missing = [k for k in ("vocab_sha256", "vocab_size", "do_lower_case", "max_seq_length", "nsp",
                         "shards") if k not in info]
  if missing:
    raise ValueError(f"dataset_info for {output_dir} lacks {missing} (a bug in the writer).")
  info = dict(info)
  gfile = _gfile()
  # Byte sizes let readers find a truncated shard with one stat per file, before any compute.
  info["shards"] = [dict(s, bytes=gfile.stat(os.path.join(output_dir, s["file"])).length)
                    if gfile.exists(os.path.join(output_dir, s["file"])) else dict(s)
                    for s in info["shards"]]
  info.setdefault("max_predictions_per_seq", None)
  info.setdefault("masking", "dynamic" if info["max_predictions_per_seq"] is None else "in_records")
  info["command"] = command or shlex.join([os.path.basename(sys.executable), "-m",
                                           _module_name()] + sys.argv[1:])
  info["contract_version"] = CONTRACT_VERSION
  info["created"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
  path = os.path.join(output_dir, INFO_FILE)
  return files_lib.write_atomic(path, json.dumps(info, indent=1) + "\n")


def _module_name():
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  return spec.name if spec is not None else (sys.argv[0] if sys.argv else "?")


# ----------------------------------------------------------------------------------------------
# Reading and checking.
# ----------------------------------------------------------------------------------------------
def read(directory):
  """The dataset_info.json dict of `directory`, or None if it has none."""
  path = os.path.join(directory, INFO_FILE)
  gfile = _gfile()
  if not gfile.exists(path):
    return None
  try:
    with gfile.GFile(path, "r") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise DataContractError(f"{path}: not valid JSON ({e}); regenerate the records or restore "
                            "the file.") from None


def _by_directory(files):
  groups = {}
  for f in files:
    groups.setdefault(os.path.dirname(f), []).append(f)
  return groups


def _check_one(path, info, field, expected):
  """Raises DataContractError naming both sides for the first contract field that differs."""
  def fail(what, records_side, config_side, fix):
    raise DataContractError(f"{field}: the records in {os.path.dirname(path)} were made with "
                            f"{what} {records_side} ({path}) but training has {config_side}; "
                            f"{fix}.")

  vocab_path = expected["vocab_path"]
  if info.get("vocab_sha256") and expected.get("vocab_sha256") and \
      info["vocab_sha256"] != expected["vocab_sha256"]:
    fail("vocab", f"{info.get('vocab_file')} ({info.get('vocab_size')} tokens, sha256 "
         f"{info['vocab_sha256'][:12]}...)",
         f"{vocab_path} ({expected['vocab_size']} tokens, sha256 "
         f"{expected['vocab_sha256'][:12]}...)",
         "train with the vocab the records were made with (ids index that vocab)")
  if info.get("vocab_size") is not None and info["vocab_size"] != expected["vocab_size"]:
    fail("a vocab of", f"{info['vocab_size']} tokens",
         f"{vocab_path} of {expected['vocab_size']} tokens",
         "train with the vocab the records were made with")
  if info.get("do_lower_case") is not None and expected.get("do_lower_case") is not None and \
      bool(info["do_lower_case"]) != bool(expected["do_lower_case"]):
    fail("do_lower_case =", info["do_lower_case"],
         f"config.do_lower_case={expected['do_lower_case']}",
         f"set --config.do_lower_case={info['do_lower_case']}")
  if info.get("max_seq_length") is not None and info["max_seq_length"] != expected["seq_length"]:
    fail("max_seq_length =", info["max_seq_length"], f"config.seq_length={expected['seq_length']}",
         f"set --config.seq_length={info['max_seq_length']} or regenerate the records")
  _check_sentence_objective(path, info, field, expected)
  in_records = info.get("max_predictions_per_seq")
  if in_records is not None and in_records != expected["max_predictions_per_seq"]:
    fail("masks of max_predictions_per_seq =", in_records,
         f"config.max_predictions_per_seq={expected['max_predictions_per_seq']}",
         f"set --config.max_predictions_per_seq={in_records}")


def records_sentence_objective(info):
  """"nsp", "sop" or "none" (full sentences): what the records' next_sentence_labels mean.
  Records written before the field existed say it with `nsp` (true: NSP pairs)."""
  if info.get("sentence_objective"):
    return info["sentence_objective"]
  return "nsp" if info.get("nsp", True) else "none"


def _check_sentence_objective(path, info, field, expected):
  """The model's sentence task (nsp | sop | none) against the records'. One combination is let
  through with a note: NSP on full-sentence records (what training a BERT on RoBERTa-style
  records always did: the NSP head learns label 0); every other mismatch trains a head on labels
  that mean something else, or a no-NSP model on random-next pairs: a one-line error."""
  model_side = expected.get("sentence_objective")
  if model_side is None:
    return
  records = records_sentence_objective(info)
  if records == model_side:
    return
  if records == "none" and model_side == "nsp":
    expected["log"](f"note: {field}: the records in {os.path.dirname(path)} are full sentences "
                    "(no NSP pairs): the NSP head sees label 0 only; "
                    "--config.model.objectives=mlm drops it (RoBERTa's recipe).")
    return
  raise DataContractError(
      f"{field}: the records in {os.path.dirname(path)} were made for sentence objective "
      f"{records!r} ({path}) but the model trains {model_side!r} (config.model.objectives); "
      f"remake the records with {_MAKE[model_side]} or pick a model with the records' objective.")


_MAKE = {"nsp": "create_pretraining_data (NSP pairs, the default)",
         "sop": "create_pretraining_data --sop", "none": "create_pretraining_data --no_nsp"}
# Records read from each file without a dataset_info.json to tell sentence pairs: half of NSP
# pairs have a random next sentence (label 1), half of SOP pairs a swapped one, so 64 records all
# labelled 0 happen by chance with probability 2^-64; full-sentence (--no_nsp) records are all 0.
SNIFF_RECORDS = 64


def sniff_sentence_pairs(files, n=SNIFF_RECORDS):
  """The first of `files` whose first n records hold a next_sentence_labels of 1 (a random or
  swapped next sentence: NSP pairs as google-research/bert's create_pretraining_data always
  makes, or ALBERT's SOP pairs; the labels alone cannot tell which), or None. For records
  without a dataset_info.json: what they are, read from themselves."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  for f in files:
    try:
      raws = list(tf.data.TFRecordDataset(f).take(n).as_numpy_iterator())
    except tf.errors.OpError:   # unreadable: the input pipeline's first-record check names it
      continue
    for raw in raws:
      feature = tf.train.Example.FromString(raw).features.feature.get("next_sentence_labels")
      if feature is not None and 1 in feature.int64_list.value:
        return f
  return None


def _check_records_without_info(files, field, sentence_objective):
  """Records without a dataset_info.json (google-research/bert's) against a model without a
  sentence objective, as ours are checked (issue 32: ELECTRA trained on google's NSP pairs and
  refused our own): sentence pairs for a model that trains 'none' are the same one-line error.
  (An NSP or SOP model takes them: which of the two the labels mean is not in the records.)"""
  if sentence_objective != "none" or not files:
    return
  pairs = sniff_sentence_pairs(files)
  if pairs:
    raise DataContractError(
        f"{field}: the records in {os.path.dirname(pairs)} (no {INFO_FILE}) are sentence pairs "
        f"({pairs} has next_sentence_labels of 1, a random or swapped next sentence, in its "
        f"first {SNIFF_RECORDS} records: google-research/bert's NSP format) but the model trains "
        "'none' (config.model.objectives); remake the records with "
        f"{_MAKE['none']} or pick a model with a sentence objective.")


def check_records(files, *, field, vocab_path, vocab_size, vocab_sha256, do_lower_case,
                  seq_length, max_predictions_per_seq, sentence_objective=None, log=print):
  """Checks every directory of `files` against its dataset_info.json, before any compute.

  Returns ({file: record count} for the files whose directory has a dataset_info.json, [the
  directories without one]). Raises DataContractError naming both sides of the first mismatch,
  or a file the info does not list (records of another run mixed in).
  """
  expected = dict(vocab_path=vocab_path, vocab_size=vocab_size, vocab_sha256=vocab_sha256,
                  do_lower_case=do_lower_case, seq_length=seq_length,
                  max_predictions_per_seq=max_predictions_per_seq,
                  sentence_objective=sentence_objective, log=log)
  counts, without = {}, []
  for directory, dir_files in sorted(_by_directory(files).items()):
    info = read(directory)
    if info is None:
      without.append(directory)
      continue
    path = os.path.join(directory, INFO_FILE)
    _check_one(path, info, field, expected)
    listed = {s["file"]: s for s in info.get("shards", [])}
    for f in dir_files:
      name = os.path.basename(f)
      if name not in listed:
        raise DataContractError(f"{field}: {f} is not listed in {path} (records of another run "
                                "in the same directory?); move it out or regenerate the records.")
      _check_size(f, listed[name].get("bytes"), path)
      counts[f] = int(listed[name]["num_instances"])
  _check_records_without_info([f for d in without for f in _by_directory(files)[d]], field,
                              sentence_objective)
  return counts, without


def _check_size(path, expected_bytes, info_path):
  if expected_bytes is None:
    return
  size = _gfile().stat(path).length
  if size != expected_bytes:
    raise DataContractError(f"{path}: {size} bytes, but {info_path} says {expected_bytes} "
                            "(truncated or rewritten since it was made); regenerate or restore it.")


def known_count(files):
  """Records in `files` per their dataset_info.json, or None if any file is not listed there
  with its current byte size (then the caller counts by reading)."""
  total, infos = 0, {}
  for f in files:
    directory = os.path.dirname(f)
    if directory not in infos:
      infos[directory] = read(directory)
    info = infos[directory]
    shard = next((s for s in (info or {}).get("shards", []) if s["file"] == os.path.basename(f)),
                 None)
    if shard is None or shard.get("bytes") != _gfile().stat(f).length:
      return None
    total += int(shard["num_instances"])
  return total


def record_counts(files, count_fn, contract_counts=None, log=print):
  """Per-file record counts: from the contract where known, else by reading (with a note)."""
  counts = dict(contract_counts or {})
  rest = [f for f in files if f not in counts]
  if rest:
    t0 = time.time()
    for f in rest:
      counts[f] = int(count_fn([f]))
    dirs = sorted({os.path.dirname(f) for f in rest})
    log(f"note: no {INFO_FILE} beside {', '.join(dirs)} (e.g. google-research/bert records): "
        f"counted {sum(counts[f] for f in rest):,} records in {len(rest)} file(s) by reading "
        f"them ({time.time() - t0:.1f} s); vocab and casing cannot be checked for them.")
  return [counts[f] for f in files]
