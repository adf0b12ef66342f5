r"""Export a fine-tuned classifier for CPU and on-device serving: a TFLite flatbuffer (jax2tf).

  python -m bert_jax.export_serving --init_checkpoint=runs/sst2/best_epoch3 \
      --output=sst2.tflite [--max_seq_length=128] [--batch_size=1]

--init_checkpoint is a fine-tuning export (`python -m bert_jax.finetune`'s best_epoch{N}/) or a
finished fine-tuning workdir, of a classification or regression task (the head that gives
logits from [CLS]; bert_jax/tasks/classification.py), of any family. The written model takes
three int32 tensors of the fixed shape [batch_size, max_seq_length] by name, input_ids,
input_mask and segment_ids (the tokenizer's ids of "[CLS] a [SEP] (b [SEP])", zero-padded, as
`bert_jax.predict.encode` makes them), and returns float32 logits [batch_size, num_labels]
(regression: [batch_size, 1], the score).

Before anything is written the export is checked: 8 rows of random ids (lengths from 2 to
max_seq_length, pairs where the model has token types) through the TFLite interpreter against
our own jitted float32 forward, each logit within TOLERANCE (|tflite - ours| <= 1e-4 + 1e-4 x
|ours|); the largest difference is printed. A miss writes nothing and exits 1.

Beside the model, <output>.json says what it expects and was checked with: the inputs, labels in
order, max_seq_length, the vocabulary (path and sha256) and casing the checkpoint was trained
with, the source checkpoint and the check's figures. Why TFLite and not ONNX, how to serve it
and its latency against BERT-base: docs/serving.md.
"""

import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import warnings

from absl import flags
from absl import logging
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import cli
from bert_jax.models import heads
from bert_jax.inference import loading as inference
from bert_jax_core import errors
from bert_jax_core import files as files_lib

FORMATS = ("tflite",)          # docs/serving.md: why TFLite through jax2tf rather than ONNX
TASK_TYPES = ("classification", "regression")   # one logits tensor from [CLS]
INPUTS = ("input_ids", "input_mask", "segment_ids")
CHECK_ROWS = 8
# float32 both sides; XNNPACK sums the dot products in another order than XLA. Measured max
# |diff| on logits, 2026-11-27: 8.2e-8 (tinybert-4l-312, random) and 7.7e-7 (BERT-base shape,
# random) at seq 128 (benchmarks/serving_latency.py), 3.2e-5 on logits up to 12.3 (a 3-layer
# ModernBERT MNLI export, seq 64), where this bound is 1.3e-3.
ATOL, RTOL = 1e-4, 1e-4
TOLERANCE = f"|tflite - ours| <= {ATOL:g} + {RTOL:g} x |ours|"


class ExportError(errors.UserError):
  """A checkpoint or flag that this export cannot take."""


@dataclasses.dataclass
class Classifier:
  model: object                  # heads.BertForSequenceClassification
  params: dict                   # numpy tree {"bert": ..., "<head>": ...}
  config: object                 # BertConfig, dtype float32
  task_type: str                 # classification | regression
  labels: list                   # class names in logit order ([] for regression)
  meta: dict
  description: str               # what was loaded (inference.describe)
  tokenizer_file: str            # the vocab.txt / *.model / tokenizer.json it was trained with
  do_lower_case: bool            # its casing (checked against the vocab by load_for_inference)


def check_flags(output, fmt, max_seq_length, batch_size, overwrite=False):
  """The flags that need no checkpoint, before anything is read. The model and its record
  (<output>.json) are new files, or replaced with --overwrite (`overwrite`)."""
  if fmt not in FORMATS:
    raise ExportError(f"--format={fmt}: this program writes {', '.join(FORMATS)} (TFLite "
                      "through jax2tf; docs/serving.md says why not ONNX); pass --format=tflite.")
  if not output:
    raise ExportError("--output is required: the .tflite file to write, e.g. "
                      "--output=model.tflite.")
  if max_seq_length < 2:
    raise ExportError(f"--max_seq_length={max_seq_length}: must be at least 2 ([CLS] and "
                      "[SEP]); fine-tuning's usual is 128.")
  if batch_size < 1:
    raise ExportError(f"--batch_size={batch_size}: must be at least 1 (on-device serving: 1).")
  files_lib.check_output_file(output, "--output", overwrite=overwrite)
  files_lib.check_output_file(output + ".json", "--output's record", overwrite=overwrite)
  if not output.lower().endswith(".tflite"):
    # TFLite bytes went under any name (model.onnx, a name with no extension; issue 49 item 7).
    stem = os.path.splitext(output)[0]
    raise ExportError(f"--output={output}: the export is a TFLite flatbuffer; name a .tflite "
                      f"file (e.g. --output={stem}.tflite).")


def load_classifier(path, max_seq_length, **tokenizer_files) -> Classifier:
  """The fine-tuned classifier at `path`: checked from its metadata before any array is read,
  then its parameters checked against the head's shapes. tokenizer_files: vocab_file,
  spm_model_file or tokenizer_json (default: the checkpoint's own, checked by its sha256)."""
  m = inference.load_for_inference(path, with_params=False, python_tokenizer=True,
                                   **tokenizer_files)
  meta = m.meta
  task_type = meta.get("task_type") or meta.get("task_family")   # older exports: task_family
  if task_type is None:
    raise ExportError(f"--init_checkpoint={path}: {m.description} is not a fine-tuning export "
                      "(no task head); pass a `python -m bert_jax.finetune` run's "
                      "best_epoch{N}/ directory.")
  if task_type not in TASK_TYPES:
    raise ExportError(f"--init_checkpoint={path}: fine-tuned for {task_type} "
                      f"({meta.get('task')}); this export takes the logits heads "
                      f"({', '.join(TASK_TYPES)}).")
  labels = list(meta.get("labels") or ())
  if task_type == "classification" and len(labels) < 2:
    raise ExportError(f"--init_checkpoint={path}: a classification export records "
                      f"{len(labels)} labels; it needs its class names (a fine-tuning run's "
                      "best_epoch{N}/ records them).")
  if max_seq_length > m.config.max_position_embeddings:
    raise ExportError(f"--max_seq_length={max_seq_length}: the model takes at most "
                      f"{m.config.max_position_embeddings} positions; pass at most that.")
  # float32 compute whatever the run trained in: the flatbuffer is float32 (TFLite's CPU kernels).
  config = ckpt_lib.config_from_checkpoint(m.config, {"dtype": "float32"}, "--init_checkpoint")
  model = heads.create_model(task_type, config, num_labels=max(len(labels), 1))
  params = ckpt_lib.read_params(m.checkpoint)
  ids = jnp.zeros((1, max_seq_length), jnp.int32)
  want = nn.unbox(jax.eval_shape(lambda r: model.init(r, ids, ids, ids),
                                 jax.random.PRNGKey(0))["params"])
  got, expected = _shapes(params), _shapes(want)
  if got != expected:
    raise ExportError(f"--init_checkpoint={path}: its parameters are not a {config.family} "
                      f"{task_type} head with {max(len(labels), 1)} outputs (e.g. "
                      f"{_first_difference(got, expected)}); pass the best_epoch{{N}}/ export "
                      "of a classification or regression run.")
  return Classifier(model, params, config, task_type, labels, meta, m.description,
                    str(m.vocab_file or m.spm_model_file or m.tokenizer_json), m.do_lower_case)


def _shapes(tree):
  """{"bert/encoder/.../kernel": shape} of a parameter tree (arrays or ShapeDtypeStructs)."""
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {"/".join(str(getattr(k, "key", k)) for k in p): tuple(a.shape) for p, a in leaves}


def _first_difference(got, expected):
  for k in sorted(set(got) | set(expected)):
    if got.get(k) != expected.get(k):
      return (f"{k}: found {got.get(k, 'nothing')}, the head needs "
              f"{expected.get(k, 'nothing')}")
  return "the tree's structure"


def forward_fn(model, params):
  """(input_ids, input_mask, segment_ids) [B, T] int32 -> logits [B, L] float32, inference."""
  def forward(input_ids, input_mask, segment_ids):
    return model.apply({"params": params}, input_ids, input_mask, segment_ids,
                       deterministic=True).astype(jnp.float32)
  return forward


# ----------------------------------------------------------------------------------------------
# TFLite through jax2tf: the JAX function lowered to StableHLO, wrapped as a TF function, and
# converted to TFLite's built-in ops (no TF ops at run time: the phone needs only TFLite).
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _native_stderr_to(sink):
  """The process's fd 2 (TF's and TFLite's C++ logging, which Python cannot filter) into `sink`
  (a binary file) while the block runs."""
  sys.stderr.flush()
  saved = os.dup(2)
  os.dup2(sink.fileno(), 2)
  try:
    yield
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)


def to_tflite(forward, batch_size, seq_length) -> bytes:
  """The flatbuffer of `forward` at inputs [batch_size, seq_length] int32, named INPUTS."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top  (hides GPUs)
  from jax.experimental import jax2tf  # pylint: disable=g-import-not-at-top
  spec = [tf.TensorSpec([batch_size, seq_length], tf.int32, name=n) for n in INPUTS]
  fn = tf.function(jax2tf.convert(forward, with_gradient=False), autograph=False,
                   input_signature=spec)
  converter = tf.lite.TFLiteConverter.from_concrete_functions([fn.get_concrete_function()], fn)
  converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
  # The converter logs pages of MLIR pass notes on fd 2; kept and shown only if it fails.
  with tempfile.TemporaryFile() as log:
    try:
      with _native_stderr_to(log):
        return converter.convert()
    except Exception:
      log.seek(0)
      sys.stderr.write(log.read().decode("utf-8", "replace"))
      raise


class TFLiteRunner:
  """A TFLite interpreter on this CPU (XNNPACK's kernels, `num_threads` threads) called by input
  name: runner(input_ids=..., input_mask=..., segment_ids=...) -> logits [B, L] float32."""

  def __init__(self, flatbuffer, num_threads=1):
    from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
    with warnings.catch_warnings(), tempfile.TemporaryFile() as log:
      # TF 2.21 still ships tf.lite.Interpreter (the phone's runtime is LiteRT's, the same
      # kernels); its deprecation notice and XNNPACK's "Created delegate" line are not for users.
      warnings.filterwarnings("ignore", message=r"\s*Warning: tf.lite.Interpreter is deprecated")
      with _native_stderr_to(log):
        self.interpreter = tf.lite.Interpreter(model_content=flatbuffer, num_threads=num_threads)
        self.interpreter.allocate_tensors()
    # {input name: tensor index}: the converter keeps the TensorSpec names (no SignatureDef
    # from concrete functions), and the one output is the logits.
    self.inputs = {d["name"]: d["index"] for d in self.interpreter.get_input_details()}
    if sorted(self.inputs) != sorted(INPUTS):
      raise ValueError(f"the flatbuffer's inputs are {sorted(self.inputs)}, not {INPUTS}")
    self.output = self.interpreter.get_output_details()[0]["index"]

  def __call__(self, **inputs):
    for name, value in inputs.items():
      self.interpreter.set_tensor(self.inputs[name], np.asarray(value, np.int32))
    self.interpreter.invoke()
    return self.interpreter.get_tensor(self.output)


# ----------------------------------------------------------------------------------------------
# The check: the flatbuffer's logits against ours, row by row, before anything is written.
# ----------------------------------------------------------------------------------------------
def check_rows(config, n, seq_length, seed=0):
  """n rows {name: [n, T] int32}: random ids, real lengths from 2 to T, padding 0 past them, the
  second half of each row segment 1 where the model has token types."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, config.vocab_size, (n, seq_length)).astype(np.int32)
  lengths = np.linspace(2, seq_length, n).astype(np.int32)                  # [n]
  mask = (np.arange(seq_length)[None] < lengths[:, None]).astype(np.int32)  # [n, T]
  segments = np.zeros_like(ids)
  if config.type_vocab_size >= 2:
    segments = ((np.arange(seq_length)[None] >= lengths[:, None] // 2) & (mask > 0))
  return dict(input_ids=ids * mask, input_mask=mask, segment_ids=segments.astype(np.int32))


def compare(runner, forward, rows, batch_size):
  """(theirs [n, L], ours [n, L], max |diff|) over `rows`, batch_size rows per call (a last
  partial batch is padded with copies of its first row and cut)."""
  n = len(rows["input_ids"])
  jitted = jax.jit(forward)
  theirs, ours = [], []
  for start in range(0, n, batch_size):
    idx = np.arange(start, start + batch_size)
    idx = np.where(idx < n, idx, start)
    batch = {k: v[idx] for k, v in rows.items()}
    keep = min(batch_size, n - start)
    theirs.append(np.asarray(runner(**batch))[:keep])
    ours.append(np.asarray(jitted(**batch))[:keep])
  theirs, ours = np.concatenate(theirs), np.concatenate(ours)
  return theirs, ours, float(np.max(np.abs(theirs - ours)))


def within_tolerance(theirs, ours):
  return bool(np.all(np.abs(theirs - ours) <= ATOL + RTOL * np.abs(ours)))


def export(path, output, *, max_seq_length=128, batch_size=1, quiet=False, **tokenizer_files):
  """Loads, converts, checks and writes; returns the sidecar record. SystemExit(1) when the
  check fails (nothing written)."""
  say = (lambda *a: None) if quiet else (lambda *a: print(*a, flush=True))  # noqa: E731
  c = load_classifier(path, max_seq_length, **tokenizer_files)
  layers = c.config.num_layers
  say(f"loaded {c.description}: {c.config.family}, {layers} layer{'s' * (layers != 1)} of width "
      f"{c.config.hidden_size}, {c.task_type} head "
      + (f"over {len(c.labels)} labels {c.labels}" if c.labels else "(one score)"))
  forward = forward_fn(c.model, jax.tree.map(jnp.asarray, c.params))
  flatbuffer = to_tflite(forward, batch_size, max_seq_length)
  rows = check_rows(c.config, CHECK_ROWS, max_seq_length)
  theirs, ours, diff = compare(TFLiteRunner(flatbuffer), forward, rows, batch_size)
  ok = within_tolerance(theirs, ours)
  say(f"check: {CHECK_ROWS} rows through the TFLite interpreter against our jitted float32 "
      f"forward: max |diff| {diff:.2e}, largest logit {np.max(np.abs(ours)):.3g}; tolerance "
      f"{TOLERANCE}: {'within' if ok else 'NOT within'}")
  if not ok:
    raise SystemExit(f"export check failed: {output} not written (max abs diff {diff:.2e}, "
                     f"tolerance {TOLERANCE}); please report it with this command.")
  record = dict(
      format="tflite", source=c.description, task=c.meta.get("task"), task_type=c.task_type,
      labels=c.labels, family=c.config.family,
      inputs={n: dict(shape=[batch_size, max_seq_length], dtype="int32") for n in INPUTS},
      output=dict(name="logits", shape=[batch_size, max(len(c.labels), 1)], dtype="float32"),
      do_lower_case=bool(c.do_lower_case),
      tokenizer_file=c.tokenizer_file, tokenizer_sha256=files_lib.sha256_file(c.tokenizer_file),
      check=dict(rows=CHECK_ROWS, max_abs_diff=diff, tolerance=TOLERANCE),
      versions=dict(jax=jax.__version__, tensorflow=_tf_version()))
  files_lib.write_atomic(output, flatbuffer)
  files_lib.write_atomic(output + ".json", json.dumps(record, indent=2).encode())
  say(f"wrote {output} ({len(flatbuffer) / 1e6:.1f} MB: inputs {', '.join(INPUTS)} int32 "
      f"[{batch_size}, {max_seq_length}], logits float32 [{batch_size}, "
      f"{max(len(c.labels), 1)}]) and {output}.json (labels, vocabulary, the check)")
  return record


def _tf_version():
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  return tf.__version__


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  flags.DEFINE_string("init_checkpoint", None, "A fine-tuning export (best_epoch{N}/) or "
                      "finished fine-tuning workdir of a classification or regression task.")
  flags.DEFINE_string("output", None, "The .tflite file to write (and <output>.json beside it).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output and its <output>.json "
                    "(without it: refused, before any work).")
  flags.DEFINE_string("format", "tflite", "tflite (docs/serving.md: why not ONNX).")
  flags.DEFINE_integer("max_seq_length", 128, "The fixed sequence length of the inputs.")
  flags.DEFINE_integer("batch_size", 1, "The fixed batch of the inputs (on-device: 1).")
  flags.DEFINE_string("vocab_file", None, "vocab.txt (default: the checkpoint's own).")
  flags.DEFINE_string("spm_model_file", None, "SentencePiece model (default: the checkpoint's).")
  flags.DEFINE_string("tokenizer_json", None, "Hugging Face tokenizer.json (default: the "
                      "checkpoint's own).")


def main(argv):
  if len(argv) > 1:
    raise ExportError(f"unexpected arguments {argv[1:]}: every option is a --flag (--help).")
  if not FLAGS.init_checkpoint:
    raise ExportError("--init_checkpoint is required: a fine-tuning run's best_epoch{N}/.")
  check_flags(FLAGS.output, FLAGS.format, FLAGS.max_seq_length, FLAGS.batch_size,
              FLAGS.overwrite)
  logging.set_verbosity(logging.WARNING)   # Orbax logs every restore at INFO
  export(FLAGS.init_checkpoint, FLAGS.output, max_seq_length=FLAGS.max_seq_length,
         batch_size=FLAGS.batch_size, vocab_file=FLAGS.vocab_file,
         spm_model_file=FLAGS.spm_model_file, tokenizer_json=FLAGS.tokenizer_json)
  print(f"next: serve it with LiteRT (ai_edge_litert.interpreter.Interpreter, or "
        f"tf.lite.Interpreter) feeding {', '.join(INPUTS)} by name (docs/serving.md); its "
        "latency against BERT-base on this CPU: python -m benchmarks.serving_latency")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
