"""Load any checkpoint for inference: params, model config and the tokenizer it was trained with.

  from bert_jax.inference import loading as inference
  m = inference.load_for_inference("gs://bucket/runs/base")   # or an export, a step directory
  m.params, m.config, m.tokenizer, m.do_lower_case

`path` is any of (local, or gs:// read through tf.io.gfile / etils.epath):
  - an Orbax params export: `python -m bert_jax.convert` output or a fine-tuning `best_epoch{N}/`
    (bert_config.json + params/, usually with vocab.txt beside them);
  - a pre-training or fine-tuning workdir: its latest committed step (checkpoints/<step>/), or for
    a finished fine-tuning run (resume state removed) its `best_epoch{N}/` export;
  - one step directory (checkpoints/<step>/ with state/ and meta/);
  - a Hugging Face folder (config.json + model.safetensors or pytorch_model.bin, as
    `save_pretrained` writes it): converted once with bert_jax.convert into a cache
    ($BERT_JAX_CACHE, default ~/.cache/bert_jax/hf/<hash of the folder's files>) and loaded from
    there; the run prints where. ELECTRA (bert_jax/families/electra/convert.py): a discriminator folder
    (ElectraForPreTraining / ElectraModel, converted alone: no generator), or a folder holding
    discriminator/ and generator/ as `python -m bert_jax.convert` exports the pair.
    DistilBERT (bert_jax/families/distilbert/convert.py): a DistilBertForMaskedLM or DistilBertModel
    folder (the latter's MLM head starts random: fine for fine-tuning and features, not
    fill-mask), with its vocab.txt in the folder.
An ELECTRA checkpoint (pre-training workdir, step, export) loads whole (params: bert = the
discriminator's body, rtd_head, generator, mlm_head); each CLI says which network it uses:
fine-tuning and extract_features the discriminator, predict's fill-mask the generator. A
DistilBERT (a distillation workdir: bert + mlm_head, the teacher only referenced) loads like BERT
without token types or pooler; the CLIs say so.
Every load says what it loaded: `InferenceModel.description` names the directory and the step (or
the export's provenance), and the CLIs print it.

The tokenizer is found, in this order: the --vocab_file / --spm_model_file / --tokenizer_json the
caller passes (a --vocab_file ending in .json is a tokenizer.json); a vocab.txt, *.model or
tokenizer.json bundled in the export, the step directory or the workdir; the file the training
config recorded (config.vocab_file / spm_model_file / tokenizer_json), if it still exists. A vocab
whose sha256 differs from the one the checkpoint recorded, or whose size differs from the model's
vocab_size, is a one-line error naming both sides (never a silent wrong result).

A Hugging Face tokenizer.json (byte-level BPE: a converted ModernBERT bundles its own, recorded as
meta["tokenizer_json"]; a run pre-trained with --config.tokenizer_json records its path) is read
by data_pipelines/tokenizers/tokenizer_json.py, TensorFlow-free. Its ids may be fewer than the model's rows
(ModernBERT pads its 50,280 ids to vocab_size=50,368): it must hold exactly the ids the converter
recorded (meta["vocab_size"]), else at most vocab_size, and the special ids the converter read
(meta["special_ids"]); a file without a mask/cls/sep token is one line naming it and the model.

Casing: the vocab's own settings (`<vocab>.meta.json` from build_vocab, a SentencePiece model's
normalizer, else inferred as google's validate_case_matches_checkpoint does: released model names,
pieces that lower-casing would change), checked against the checkpoint's recorded do_lower_case
(export metadata, or the training config). A contradiction on either side is an error.
"""

import dataclasses
import glob
import hashlib
import json
import os

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.checkpoint import checkpoint_fit
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax import families
from bert_jax.models import model as model_lib

VOCAB_NAME = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"   # a Hugging Face tokenizer (families/modernbert/convert.py bundles it)


class PredictError(errors.UserError):
  """A model that cannot do what `predict` asked of it (e.g. fill-mask without an MLM head): the
  families' check_fill_mask hooks raise it, bert_jax.predict reports it."""


class InferenceLoadError(errors.UserError):
  """The checkpoint, its tokenizer files or the requested settings do not fit together."""


@dataclasses.dataclass
class InferenceModel:
  params: dict                   # numpy tree as saved (BertForPreTraining: bert, mlm_head, ...)
  config: model_lib.BertConfig
  tokenizer: object              # WordPiece / SentencePiece / tokenizer_json.JsonTokenizer
  vocab_file: str | None         # exactly one of vocab_file / spm_model_file / tokenizer_json
  spm_model_file: str | None
  do_lower_case: bool            # SentencePiece: whether the model's normalizer case-folds
  casing_source: str             # where the casing came from, for messages
  meta: dict                     # the checkpoint's metadata (export info or training meta)
  path: str                      # the directory actually loaded (export or step directory)
  description: str = ""          # "step 1500 of runs/base (runs/base/checkpoints/1500)", ...
  checkpoint: ckpt_lib.Described | None = None  # what checkpoint.describe found (read once)
  tokenizer_json: str | None = None   # a Hugging Face tokenizer.json (ModernBERT's BPE)


def _gfile():
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


# Local paths are read with the standard library, remote ones (gs://) through tf.io.gfile: a
# local `predict` then never imports TensorFlow (seconds of start-up, benchmarks/startup.py).
def _local(path):
  return "://" not in str(path)


def _exists(path):
  return os.path.exists(path) if _local(path) else _gfile().exists(path)


def _glob(pattern):
  return sorted(glob.glob(pattern)) if _local(pattern) else _gfile().glob(pattern)


def _join(*parts):
  return "/".join([str(parts[0]).rstrip("/")] + [str(p).strip("/") for p in parts[1:]])


def _parent(path):
  return str(path).rstrip("/").rsplit("/", 1)[0]


# ----------------------------------------------------------------------------------------------
# Hugging Face folders: converted once (bert_jax.convert), then loaded like any export.
# ----------------------------------------------------------------------------------------------
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def is_hf_folder(path):
  """A local transformers folder some family reads: a save_pretrained folder (config.json beside
  the weights, no bert_jax files) or a family's set of them (ELECTRA's discriminator/ +
  generator/); bert_jax/families/."""
  return families.is_hf_folder(path)


def hf_cache_dir(path, *settings):
  """Where the Orbax copy of HF folder `path` lives: keyed by the folder's absolute path, its
  files' names, sizes and modification times, those of its sub-folders' files too (an ELECTRA
  pair; a changed folder converts again) and `settings`."""
  h = hashlib.sha256(repr((os.path.abspath(path),) + settings).encode())
  for name in sorted(os.listdir(path)):
    full = os.path.join(path, name)
    inner = ([os.path.join(name, n) for n in sorted(os.listdir(full))] if os.path.isdir(full)
             else [name])
    for rel in inner:
      st = os.stat(os.path.join(path, rel))
      h.update(f"{rel}:{st.st_size}:{st.st_mtime_ns};".encode())
  root = os.environ.get("BERT_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "bert_jax")
  return os.path.join(root, "hf", f"{os.path.basename(os.path.abspath(path))}-"
                                  f"{h.hexdigest()[:16]}")


def from_hf_folder(path, *, vocab_file=None, do_lower_case=None):
  """The Orbax export of HF folder `path`, converting it into the cache on first use."""
  from bert_jax import convert  # pylint: disable=g-import-not-at-top  (convert imports us)
  target = hf_cache_dir(path, vocab_file, do_lower_case)
  if os.path.exists(os.path.join(target, ckpt_lib.CONFIG_NAME)):
    print(f"{path}: a Hugging Face folder; using its converted copy {target}", flush=True)
    return target
  os.makedirs(os.path.dirname(target), exist_ok=True)
  try:
    family = families.for_hf_folder(path)
  except ValueError as e:
    raise InferenceLoadError(str(e)) from None
  meta = convert.convert_to_orbax(path, target, "hf", vocab_file=vocab_file,
                                  do_lower_case=do_lower_case)
  notes = [family.name]
  if any(p.startswith("mlm_head/") for p in meta.get("initialized_randomly") or ()):
    notes.append("no MLM head: initialised randomly, fill-mask is meaningless; fine-tuning and "
                 "extract_features use its body")
  if meta.get("generator"):   # ELECTRA's discriminator alone
    notes.append("no generator: fill-mask needs the discriminator + generator pair")
  what = f" ({'; '.join(notes)})" if family.name != "bert" or notes[1:] else ""
  print(f"{path}: a Hugging Face folder{what}; converted to Orbax in {target} "
        "(reused next time; `python -m bert_jax.convert` does the same by hand)", flush=True)
  return target


def enable_compilation_cache():
  """JAX's persistent compilation cache for the inference CLIs: a second `predict` (or
  `extract_features`) of the same model reads its compiled programs from disk instead of
  compiling again (measured: benchmarks/startup.py). In $BERT_JAX_CACHE/jax (default
  ~/.cache/bert_jax/jax) unless JAX_COMPILATION_CACHE_DIR names one. CLIs only: library calls
  leave JAX's settings alone."""
  import jax  # pylint: disable=g-import-not-at-top
  if os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    return
  root = os.environ.get("BERT_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache",
                                                          "bert_jax")
  jax.config.update("jax_compilation_cache_dir", os.path.join(root, "jax"))
  # Cache every program: an inference CLI's few programs each compile in well under JAX's
  # default 1 s threshold on a small model, yet together they are a large part of its start-up.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)


def describe(kind, directory, meta):
  """What was loaded, for the line every loader prints."""
  directory = str(directory).rstrip("/")
  if kind == "train":
    step, workdir = directory.rsplit("/", 1)[-1], _parent(_parent(directory))
    return f"step {step} of {workdir} ({directory})"
  if meta.get("epoch") is not None:
    return (f"{directory} (fine-tuning export: {meta.get('task', '?')} epoch "
            f"{meta['epoch']})")
  source = meta.get("converted_from") or {}
  if source:
    return f"{directory} (converted from {source.get('format')} {source.get('path')})"
  return f"{directory} (params export)"


def _recorded(meta, key):
  """A tokenizer setting from export metadata or from the training config in a step's meta."""
  if meta.get(key) is not None:
    return meta[key]
  return (meta.get("config") or {}).get(key)


class TokenizerFiles(tuple):
  """(vocab_file, spm_model_file, how) as before, + .tokenizer_json (a Hugging Face
  tokenizer.json; then vocab_file and spm_model_file are None) and .path (whichever is set)."""

  def __new__(cls, vocab_file, spm_model_file, how, tokenizer_json=None):
    self = super().__new__(cls, (vocab_file, spm_model_file, how))
    self.tokenizer_json = tokenizer_json
    return self

  @property
  def path(self):
    return self[0] or self[1] or self.tokenizer_json


def _candidates(kind, directory, meta):
  """Tokenizer files to try, most specific first: [TokenizerFiles]."""
  dirs = [directory]
  if kind == "train":  # workdir/checkpoints/<step>: also the workdir itself
    dirs.append(_parent(_parent(directory)))
  out = []
  for d in dirs:
    if _exists(_join(d, VOCAB_NAME)):
      out.append(TokenizerFiles(_join(d, VOCAB_NAME), None, f"bundled in {d}"))
    for spm in sorted(_glob(_join(d, "*.model"))):
      out.append(TokenizerFiles(None, spm, f"bundled in {d}"))
    # A tokenizer.json only where the checkpoint says it has one: an export directory may hold
    # other JSON, and a WordPiece model's is not its tokenizer.
    if _recorded(meta, "tokenizer_json") and _exists(_join(d, TOKENIZER_JSON)):
      out.append(TokenizerFiles(None, None, f"bundled in {d}", _join(d, TOKENIZER_JSON)))
  vocab, spm = _recorded(meta, "vocab_file"), _recorded(meta, "spm_model_file")
  tok_json = _recorded(meta, "tokenizer_json")
  if vocab and vocab != VOCAB_NAME and _exists(vocab):
    out.append(TokenizerFiles(vocab, None, "recorded in the checkpoint's config"))
  if spm and _exists(spm):
    out.append(TokenizerFiles(None, spm, "recorded in the checkpoint's config"))
  if tok_json and tok_json != TOKENIZER_JSON and _exists(tok_json):
    out.append(TokenizerFiles(None, None, "recorded in the checkpoint's config", tok_json))
  return out


def find_tokenizer_files(kind, directory, meta, vocab_file=None, spm_model_file=None,
                         tokenizer_json=None):
  """TokenizerFiles: the caller's choice (a vocab_file ending in .json is a tokenizer.json, as
  `convert --vocab_file` takes ModernBERT's), else the checkpoint's own files."""
  if vocab_file and str(vocab_file).endswith(".json") and not tokenizer_json:
    vocab_file, tokenizer_json = None, vocab_file
  given = [f for f in (vocab_file, spm_model_file, tokenizer_json) if f]
  if given:
    if len(given) > 1:
      raise InferenceLoadError("pass only one of --vocab_file, --spm_model_file and "
                               "--tokenizer_json.")
    return TokenizerFiles(vocab_file, spm_model_file, "given", tokenizer_json)
  found = _candidates(kind, directory, meta)
  if not found:
    recorded = (_recorded(meta, "vocab_file") or _recorded(meta, "spm_model_file")
                or _recorded(meta, "tokenizer_json"))
    raise InferenceLoadError(
        f"{directory}: no {VOCAB_NAME} or SentencePiece *.model (or {TOKENIZER_JSON}) bundled "
        "with the checkpoint, and "
        + (f"the file its config records ({recorded}) is gone" if recorded
           else "it records no vocab file")
        + "; pass --vocab_file (or --spm_model_file, --tokenizer_json).")
  return found[0]


def checkpoint_vocab(kind, directory, meta):
  """(sha256, where it comes from) of a checkpoint's vocabulary, for checkpoint_fit's checks:
  the vocab_hash it records, else the sha256 of the vocab.txt / *.model / tokenizer.json bundled
  with it or named by its config; (None, None) when it identifies none (an old export)."""
  recorded = meta.get("vocab_hash")
  if recorded:
    return str(recorded), "recorded in the checkpoint"
  try:
    files = find_tokenizer_files(kind, str(directory), meta)
  except InferenceLoadError:
    return None, None
  return files_lib.sha256_file(files.path), f"{files.path}, {files[2]}"


def check_vocab_hash(meta, path, directory, own=None):
  """The tokenizer file `path` is the vocabulary the checkpoint was trained with, by content
  (checkpoint_fit.check_loaded_vocab, the one owner of that check; `own`: _candidates, for a
  checkpoint that records no hash)."""
  checkpoint_fit.check_loaded_vocab(meta, path, directory, own, error=InferenceLoadError)


def resolve_settings(vocab_file, directory, meta, do_lower_case, spm_model_file=None,
                     tokenizer_json=None):
  """The tokenizer settings (vocab.resolve_settings: do_lower_case, casing_source,
  pretokenizer): the vocab's own (its .meta.json, the SentencePiece model's normalizer, or
  inferred for google/HF vocabs) checked against the checkpoint's recorded casing and the
  argument; any contradiction is a one-line error naming both sides."""
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  recorded = {"do_lower_case": _recorded(meta, "do_lower_case"),
              "pretokenizer": _recorded(meta, "pretokenizer")}
  try:
    return vocab_lib.resolve_settings(vocab_file, spm_model_file, do_lower_case,
                                      recorded=(recorded, f"the checkpoint {directory}"),
                                      tokenizer_json=tokenizer_json)
  except vocab_lib.CasingMismatchError as e:
    raise InferenceLoadError(str(e)) from None


def resolve_casing(vocab_file, directory, meta, do_lower_case, spm_model_file=None):
  """(do_lower_case, how): see resolve_settings."""
  settings = resolve_settings(vocab_file, directory, meta, do_lower_case, spm_model_file)
  return settings["do_lower_case"], settings["casing_source"]


def _json_tokenizer(files, directory, meta, config, do_lower_case):
  """(tokenizer_json.JsonTokenizer, settings) for files.tokenizer_json, checked against the
  checkpoint before its hash: the special tokens (all five, at the ids the converter recorded)
  and the size (the ids the converter recorded; else at most the model's rows, which ModernBERT
  pads: 50,280 ids in 50,368 rows). Every mismatch names the file and the checkpoint."""
  from data_pipelines.tokenizers import tokenizer_json as tj  # pylint: disable=g-import-not-at-top
  from data_pipelines.tokenizers import pretokenize  # pylint: disable=g-import-not-at-top
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  path, how = files.tokenizer_json, files[2]
  try:
    settings = resolve_settings(None, directory, meta, do_lower_case,
                                tokenizer_json=path)
    tokenizer = tj.JsonTokenizer(path, flag="--tokenizer_json" if how == "given" else "tokenizer")
  except vocab_lib.VocabError as e:
    raise InferenceLoadError(f"{e} (the tokenizer for {directory}, vocab_size="
                             f"{config.vocab_size})") from None
  tokenizer.settings = settings
  tokenizer.pretokenizer = pretokenize.get_pretokenizer(settings["pretokenizer"])
  size, recorded = tokenizer.vocab.size, meta.get("vocab_size")
  if size > config.vocab_size or (recorded is not None and size != recorded):
    expected = (f"{directory} was converted with a tokenizer of {recorded} ids (vocab_size="
                f"{config.vocab_size} rows)" if recorded is not None
                else f"{directory} has vocab_size={config.vocab_size}")
    raise InferenceLoadError(f"{path} ({how}) has {size} ids but {expected}; use the "
                             "checkpoint's own tokenizer.json.")
  ids = {role: int(i) for role, i in (meta.get("special_ids") or {}).items()}
  theirs = {role: ids[role] for role in ids if tokenizer.vocab.special_ids.get(role) != ids[role]}
  if theirs:
    mine = {role: tokenizer.vocab.special_ids.get(role) for role in theirs}
    raise InferenceLoadError(f"{path} ({how}) has the special ids {mine} but {directory} was "
                             f"converted with {theirs}; use the checkpoint's own "
                             "tokenizer.json.")
  return tokenizer, settings


def load_for_inference(path, *, vocab_file=None, spm_model_file=None, do_lower_case=None,
                       with_params=True, python_tokenizer=False, tokenizer_json=None):
  """An InferenceModel for `path` (see the module docstring); with_params=False skips arrays.

  python_tokenizer: a WordPiece vocab without a pre-tokenizer gets the plain-Python WordPiece
  (data_pipelines/tokenizers/wordpiece_py.py: the same ids, no TensorFlow import) instead of the in-graph
  one; for a few sentences in a command-line program. A tokenizer.json never imports TensorFlow
  (the `tokenizers` library encodes).
  """
  if not path:
    raise InferenceLoadError("--init_checkpoint is empty: pass an export, a workdir or a step "
                             "directory.")
  if is_hf_folder(path):
    path = from_hf_folder(path, vocab_file=vocab_file or tokenizer_json,
                          do_lower_case=do_lower_case)
  if not _exists(path):
    raise InferenceLoadError(f"--init_checkpoint={path}: no such file or directory.")
  # What is there, read once (checkpoint.describe); files verified when the arrays will be read.
  found = ckpt_lib.describe(path, verify=with_params)
  kind, directory, config, meta = found.kind, str(found.directory), found.config, found.meta
  params = ckpt_lib.read_params(found) if with_params else None
  files = find_tokenizer_files(kind, directory, meta, vocab_file, spm_model_file, tokenizer_json)
  vocab_file, spm_model_file, how = files
  if files.tokenizer_json:   # its ids and size first: they say what differs, a hash does not
    tokenizer, settings = _json_tokenizer(files, directory, meta, config, do_lower_case)
    check_vocab_hash(meta, files.path, directory)
  else:
    check_vocab_hash(meta, files.path, directory)
    settings = resolve_settings(vocab_file, directory, meta, do_lower_case, spm_model_file)
    tokenizer = _tokenizer(vocab_file, spm_model_file, settings, python_tokenizer)
    checkpoint_fit.check_vocab_size(f"{vocab_file or spm_model_file} ({how})",
                                    tokenizer.vocab.size, directory, config.vocab_size,
                                    error=InferenceLoadError)
  lower, casing = settings["do_lower_case"], settings["casing_source"]
  if how == "given" and not meta.get("vocab_hash"):   # no record: the checkpoint's own file
    check_vocab_hash(meta, files.path, directory, _candidates(kind, directory, meta))
  return InferenceModel(params, config, tokenizer, vocab_file, spm_model_file, lower, casing,
                        meta, directory, describe(kind, directory, meta), found,
                        files.tokenizer_json)


def _tokenizer(vocab_file, spm_model_file, settings, python_tokenizer):
  """WordPiece (plain Python with python_tokenizer and no pre-tokenizer) or SentencePiece."""
  lower = settings["do_lower_case"]
  if python_tokenizer and vocab_file and settings.get("pretokenizer") in (None, "", "none"):
    from data_pipelines.tokenizers import wordpiece_py  # pylint: disable=g-import-not-at-top
    tokenizer = wordpiece_py.PythonWordPieceTokenizer(vocab_file, lower)
    tokenizer.settings = settings
    return tokenizer
  from data_pipelines.tokenizers import tokenization  # pylint: disable=g-import-not-at-top  (TF)
  return tokenization.get_tokenizer(vocab_file=vocab_file, spm_model_file=spm_model_file,
                                    do_lower_case=lower)
