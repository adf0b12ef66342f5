"""Does this checkpoint fit this run? The one place every path that continues from state asks.

  resume            train.check_same_run: the model (every field, family and sizes), the
                    vocabulary; train.stream_at: the data stream (record files, seed, layout;
                    --config.restart_data_stream). DistilBERT's teacher: its family's
                    check_teacher (distil.check_teacher: the teacher's identity, not a fit)
  finetune resume   finetune.open_resume: the task and steps, the distillation teacher;
                    check_task_data: the training rows (by content) and the seed (the same
                    --config.restart_data_stream goes on over this run's rows)
  init_checkpoint   train.model_from_init_checkpoint: the vocabulary, sizes, ELECTRA's
                    generator (its sizes, or none to start one from)
  finetune, predict, extract_features (inference.load_for_inference): the vocabulary, its size
  the teachers      DistilBERT's and TinyBERT's (distil.load_teacher, layerwise): sizes, the
                    vocabulary; a task-distillation teacher (finetune.load_distill_teacher)
                    loads through inference

A vocabulary is identified by content: the sha256 a checkpoint records (`vocab_hash`: a training
run's file, a conversion's bundled one, a fine-tuning export's), else that of the file bundled
with it or named by its config. A data stream is identified by its record files (names and byte
sizes, in order) and the data seed; fine-tuning's by the content of the rows it read (a
label flipped in place changes it) and the seed. Every refusal is one line naming both sides and the fix,
before any compute; `error` is the caller's UserError class (ConfigError for the trainers'
configs, InferenceLoadError for a loaded checkpoint), so their `except` clauses keep working.
"""

import hashlib
import os

import numpy as np

from bert_jax_core import errors
from bert_jax_core import files as files_lib


class CheckpointFitError(errors.UserError):
  """A checkpoint does not fit the run that continues from it (the default `error`)."""


# ----------------------------------------------------------------------------------------------
# Vocabulary (or tokenizer): by content.
# ----------------------------------------------------------------------------------------------
def same_vocab(recorded, actual):
  """Whether two sha256s name one file (either may be an older record's 16-character prefix)."""
  return files_lib.same_sha256(recorded, actual) or files_lib.same_sha256(actual, recorded)


def check_vocab(checkpoint, recorded, how, run, path, *, fix, actual=None,
                error=CheckpointFitError):
  """`checkpoint` (what it is, for the message) was trained with the vocabulary of sha256
  `recorded` (`how`: where that comes from); the run's is the file `path` (`run`: how to name
  it, e.g. "this run's --config.vocab_file=PATH"; sha256 `actual`, computed if None). Another one
  is `error`, naming both sides, with `fix`."""
  actual = actual or files_lib.sha256_file(path)
  if same_vocab(recorded, actual):
    return
  raise error(f"{checkpoint} was trained with another vocabulary (sha256 {str(recorded)[:16]}, "
              f"{how}) than {run} (sha256 {actual[:16]}); {fix}")


def check_loaded_vocab(meta, path, directory, own=None, error=CheckpointFitError):
  """A checkpoint loaded for fine-tuning, predict, extract_features or as a task-distillation
  teacher (inference.load_for_inference), with the tokenizer file `path`: the sha256 the
  checkpoint records (`vocab_hash`: the full digest, or a 16-character prefix before
  2026-11-25) must be the file's. Without a record (exports from before records), the
  checkpoint's own vocab file (`own`: inference's candidates, bundled or named by its config)
  identifies it by content; with neither, a note says the vocab was taken on its size alone
  (issue 32)."""
  recorded, how = meta.get("vocab_hash"), "recorded in the checkpoint"
  if not recorded:
    if own is None:   # the checkpoint's own file was taken: nothing to compare it with
      return
    mine = [f for f in own if f.path]
    if not mine:
      print(f"note: {directory} records no vocabulary and bundles none; {path} is taken on "
            "its size alone.", flush=True)
      return
    if any(os.path.realpath(str(f.path)) == os.path.realpath(str(path)) for f in mine):
      return
    recorded, how = files_lib.sha256_file(mine[0].path), f"{mine[0].path}, {mine[0][2]}"
  check_vocab(directory, recorded, how, f"the vocabulary {path}", path, error=error,
              fix="pass the run's own vocab file.")


def check_vocab_size(vocab, size, checkpoint, vocab_size, error=CheckpointFitError):
  """A WordPiece / SentencePiece vocabulary (`vocab`: named for the message) of `size` tokens
  indexes the checkpoint's vocab_size embedding rows one to one. (A tokenizer.json may have
  fewer ids than rows: inference._json_tokenizer checks it against the conversion's record.)"""
  if size != vocab_size:
    raise error(f"{vocab} has {size} tokens but {checkpoint} has vocab_size={vocab_size}; use "
                "the checkpoint's own vocabulary.")


def run_vocab_flag(config):
  """(flag, file) of the vocabulary a run's config names, or (None, None)."""
  for key in ("vocab_file", "spm_model_file", "tokenizer_json"):
    if config.get(key):
      return f"--config.{key}", config.get(key)
  return None, None


def check_init_vocab(config, path, checkpoint_vocab, vocab_hash, error=CheckpointFitError):
  """Pre-training from --config.init_checkpoint: the run's vocabulary must be the checkpoint's
  (issue 39: another one trained on silently, step-1 MLM loss 11.0, worse than a uniform
  guess). `checkpoint_vocab()`: (sha256, where from) of the checkpoint's vocabulary, asked only
  when the run has one (inference.checkpoint_vocab: inference finds a checkpoint's tokenizer
  files and imports this module, so the caller hands it in). A run without a vocabulary
  (synthetic input) or a checkpoint that identifies none is said in a note."""
  flag, file = run_vocab_flag(config)
  if not file:
    return
  recorded, how = checkpoint_vocab()
  where = f"init_checkpoint={path}"
  if recorded is None:
    print(f"note: {where} records no vocabulary and bundles none: this run's {file} is taken "
          "on its size alone.", flush=True)
    return
  own = ("" if how == "recorded in the checkpoint" else
         f" ({flag}={how.split(', ')[0]})")   # its bundled or recorded file
  check_vocab(where, recorded, how, f"this run's {flag}={file}", file, actual=vocab_hash,
              error=error,
              fix=f"pre-train with the checkpoint's own vocabulary{own} on records made with "
                  "it, or start without --config.init_checkpoint.")


# ----------------------------------------------------------------------------------------------
# Sizes, family, ELECTRA's generator.
# ----------------------------------------------------------------------------------------------
INIT_SIZES = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
              "max_position_embeddings", "type_vocab_size")
GENERATOR_FIELDS = ("generator_hidden_size", "generator_num_layers", "generator_num_heads",
                    "generator_intermediate_size")


def differences(stored, now, fields):
  """{field: (checkpoint's, this run's)} of the fields that differ (BertConfigs)."""
  return {k: (getattr(stored, k), getattr(now, k)) for k in fields
          if getattr(stored, k) != getattr(now, k)}


def check_sizes(where, stored, now, *, fix, fields=INIT_SIZES, error=CheckpointFitError):
  diff = differences(stored, now, fields)
  if diff:
    raise error(f"{where} is another model size (checkpoint vs config: {diff}); {fix}")


def check_generator(where, stored, now, config, error=CheckpointFitError):
  """ELECTRA: a checkpoint's generator is a trained network of its own size; the run's is the
  preset's unless --config.model.generator_* set it (configs/pretrain.py, ELECTRA's recipe).
  Another size is one line naming the generator and those flags (issue 39: it was a key-bias
  shape mismatch, and no flag for the generator's size was found)."""
  if not now.generator_hidden_size:   # the run trains no generator (an ELECTRA checkpoint's
    return                             # discriminator body may start a BERT: not refused here)
  if not stored.generator_hidden_size:
    raise error(f"{where} is a {stored.family} model without a generator, but "
                f"config.model_name={config.model_name} trains an ELECTRA pair (generator + "
                f"discriminator); start from an ELECTRA checkpoint, or pick a {stored.family} "
                "preset of its size.")
  diff = differences(stored, now, GENERATOR_FIELDS)
  if not diff:
    return
  size = lambda c: (f"{c.generator_num_layers} layers of width {c.generator_hidden_size}, "  # noqa: E731
                    f"{c.generator_num_heads} heads, FFN {c.generator_intermediate_size}")
  flags = " ".join(f"--config.model.{k}={getattr(stored, k)}" for k in GENERATOR_FIELDS)
  raise error(f"{where} has a generator of {size(stored)} but this run's generator "
              f"(config.model_name={config.model_name}'s, unless --config.model.generator_* "
              f"set it) has {size(now)}; the generator's size is set by {flags}.")


def check_same_model(workdir, meta, now, error=CheckpointFitError):
  """Resume: the workdir's checkpoint must be of this run's model, every field (family and
  sizes included)."""
  stored = meta["model_config"]
  if stored != now.to_dict():
    diff = {k: (stored.get(k), v) for k, v in now.to_dict().items() if stored.get(k) != v}
    preset = (meta.get("config") or {}).get("model_name")
    raise error(f"--workdir={workdir} holds a checkpoint of another model "
                + (f"(trained with --config.model_name={preset}) " if preset else "")
                + f"(checkpoint vs config: {diff}); use a new workdir or the same config.")


def check_resume_vocab(workdir, meta, config, vocab_hash, error=CheckpointFitError):
  """Resume: the vocabulary the workdir's checkpoint recorded must be the run's."""
  recorded = meta.get("vocab_hash")
  if not recorded or not vocab_hash:
    return
  stored = meta.get("config") or {}
  was = (stored.get("vocab_file") or stored.get("spm_model_file")
         or stored.get("tokenizer_json"))
  flag, now = run_vocab_flag(config)
  check_vocab(f"--workdir={workdir}", recorded, f"its {was}", f"this run's {flag}={now}", now,
              actual=vocab_hash, error=error,
              fix="resume with the run's own vocab, or use a new --workdir.")


# ----------------------------------------------------------------------------------------------
# The data stream (resume).
# ----------------------------------------------------------------------------------------------
RESTART_FLAG = "--config.restart_data_stream=True"


def _size(path):
  if files_lib.is_remote(path):
    from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
    return tf.io.gfile.stat(path).length
  return os.path.getsize(path)


def files_sha256(files):
  """sha256 over the record files' names and byte sizes, in stream order (a moved copy of the
  same records keeps it; other, added or removed shards change it); "synthetic" as is."""
  if files == "synthetic":
    return "synthetic"
  h = hashlib.sha256()
  for f in files:
    h.update(f"{os.path.basename(str(f))}:{_size(f)};".encode())
  return h.hexdigest()


def data_stream(config, files):
  """This run's training data stream as its checkpoints record it (meta["data_stream"]): the
  record files and the data seed, and where the stream began (start_step; start_position: the
  stream batches consumed before it, so the stream's own position at step s is
  ramp.position(s) - start_position)."""
  return dict(train_input_files=str(config.train_input_files),
              num_files=0 if files == "synthetic" else len(files),
              files_sha256=files_sha256(files), seed=int(config.seed),
              start_step=0, start_position=0)


def stream_position(ramp, stream, step):
  """The data stream's input position after `step`: stream batches consumed since it began
  (step 0, or the step a --config.restart_data_stream started it afresh at); `stream`: the
  data_stream record, None for none."""
  return ramp.position(step) - (stream or {}).get("start_position", 0)


def _describe_stream(s):
  what = ("synthetic batches" if s["files_sha256"] == "synthetic" else
          f"{s['num_files']} file(s) of {s['train_input_files']} (sha256 "
          f"{s['files_sha256'][:16]})")
  return f"{what}, seed {s['seed']}"


def stream_differs(stored, now):
  """Whether a recorded stream (None: a checkpoint from before the record) is not this run's."""
  return bool(stored) and (stored["files_sha256"] != now["files_sha256"]
                           or int(stored["seed"]) != int(now["seed"]))


def resume_stream(meta, now, *, workdir, step, position, layout_of, restart,
                  error=CheckpointFitError):
  """(the stream record to continue with, the stream layout) for resuming checkpoint `step`.

  The same record files and seed continue the checkpoint's stream at its input position, in its
  layout (`layout_of(stored layout)`: input_source.stream_layout). Other ones are refused naming
  both, unless `restart` (--config.restart_data_stream): then this run's stream starts afresh
  at `step` (its batch 0, in a layout of its own; `position`: ramp.position(step)), said in one
  line. A layout the checkpoint's stream cannot keep (changed shard count, batch, packing) is
  the same choice: layout_of's error, or with `restart` a fresh stream."""
  stored = meta.get("data_stream")
  if stream_differs(stored, now) and not restart:
    raise error(f"--workdir={workdir}: checkpoint {step} read its data stream from "
                f"{_describe_stream(stored)}, this run from {_describe_stream(now)}; resuming "
                f"would continue at input position {meta.get('input_position')} of other "
                f"data: resume with the checkpoint's --config.train_input_files and "
                f"--config.seed, pass {RESTART_FLAG} to start this run's stream afresh from "
                f"step {step}, or use a new --workdir.")
  why = None
  if not stream_differs(stored, now):
    try:
      layout = layout_of(meta.get("stream_layout"))
      if restart:
        print(f"restart_data_stream: the checkpoint's data stream is this run's "
            f"({_describe_stream(now)}): continuing it at input position "
            f"{meta.get('input_position')}, not restarting", flush=True)
      return stored or now, layout
    except errors.UserError as e:   # input_source.stream_layout's: the stored layout cannot go on
      if not restart:
        raise
      why = f"its layout cannot go on ({e})"
  why = why or (f"the checkpoint's stream ({_describe_stream(stored)}) is not this run's "
                f"({_describe_stream(now)})")
  print(f"restart_data_stream: {why}: this run's stream starts afresh at step {step} (its "
      "batch 0, a new shuffle of its files); the checkpoint's input position is not used",
      flush=True)
  return dict(now, start_step=int(step), start_position=int(position)), layout_of(None)


# ----------------------------------------------------------------------------------------------
# Fine-tuning's training rows (resume).
# ----------------------------------------------------------------------------------------------
def rows_sha256(features):
  """sha256 over a split's features as the run reads them ({name: array [num_rows, ...]}: ids,
  masks, labels, spans), every array by name, dtype, shape and bytes, in name order. A label
  flipped in place (the same file size) changes it; the same rows from a moved copy of the data
  do not. (SQuAD's 88k windows of 384: ~0.4 GB of arrays, about a second.)"""
  h = hashlib.sha256()
  for name in sorted(features):
    a = np.asarray(features[name])
    h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
    h.update(repr(a.tolist()).encode() if a.dtype.hasobject else
             memoryview(np.ascontiguousarray(a)).cast("B"))
  return h.hexdigest()


def task_data(task_name, source, features, seed):
  """This fine-tuning run's training data as its resume checkpoints record it
  (meta["task_data"]): where the rows come from (for the message), how many, their sha256
  (rows_sha256: before packing, which the seed decides) and the seed (the order of every
  epoch's batches)."""
  n = len(next(iter(features.values()))) if features else 0
  return dict(task=task_name, source=str(source), rows=int(n),
              rows_sha256=rows_sha256(features), seed=int(seed))


def _describe_rows(d):
  return (f"{d['rows']} {d['task']} training rows of {d['source']} (sha256 "
          f"{d['rows_sha256'][:16]}), seed {d['seed']}")


def check_task_data(meta, now, *, workdir, step, restart, error=CheckpointFitError):
  """Resuming a fine-tuning run at checkpoint `step`: the rows it trained on and its seed
  (meta["task_data"]) must be this run's (`now`: task_data), else one line naming both, unless
  `restart` (--config.restart_data_stream): then the run goes on from `step` over this run's
  rows, said in one line. A checkpoint from before the record (issue 49) resumes with a note."""
  stored = meta.get("task_data")
  if not stored:
    print(f"note: --workdir={workdir}: checkpoint {step} was saved before fine-tuning recorded "
          "its training rows and seed; resuming on this run's data unchecked.", flush=True)
    return
  same = (stored["rows_sha256"] == now["rows_sha256"]
          and int(stored["seed"]) == int(now["seed"]))
  if same:
    if restart:
      print(f"restart_data_stream: the checkpoint's training rows are this run's "
            f"({_describe_rows(now)}): continuing them at step {step}", flush=True)
    return
  if not restart:
    raise error(f"--workdir={workdir}: checkpoint {step} was trained on {_describe_rows(stored)}, "
                f"this run reads {_describe_rows(now)}; resuming would go on from step {step} on "
                "other rows: resume with the checkpoint's data and --config.seed, pass "
                f"{RESTART_FLAG} to go on from step {step} over this run's rows, or use a new "
                "--workdir.")
  print(f"restart_data_stream: the checkpoint's training rows ({_describe_rows(stored)}) are "
        f"not this run's ({_describe_rows(now)}): step {step} goes on over this run's rows, "
        "each epoch's order drawn from its seed", flush=True)
