"""Checkpoint interop: google TF / Hugging Face BERT -> Orbax params, and Orbax -> Hugging Face.

  python -m bert_jax.convert --input=uncased_L-12_H-768_A-12 --output=ckpt/bert_base   # TF
  python -m bert_jax.convert --input=hf_dir --output=ckpt/from_hf                      # HF
  python -m bert_jax.convert --input=ckpt/bert_base --output=hf_export                 # -> HF
  (in Python: hf_export.export_to_hf(checkpoint, output); convert_to_orbax(path, output))

The Orbax output (`bert_jax.checkpoint.store.save_params` layout + vocab.txt) is a complete
BertForPreTraining parameter tree usable as `--config.init_checkpoint`; its bert_config.json
records the model config, casing, the numerical choices of the source implementation, every
ignored source variable and every parameter the source lacked (initialised like a fresh model).
Outputs are built in a temp directory and renamed into place only when complete.
"""

import collections
import json
import os
import re

import numpy as np

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import families
from bert_jax.convert import formats
from bert_jax.convert import names
from bert_jax.convert import sentencepiece_export
# The writing half lives in convert/writing.py (the family converters use it without importing
# this package: distilbert.py <-> __init__ was an import cycle); re-exported as the public API.
from bert_jax.convert import writing
from bert_jax.convert.writing import (VOCAB_NAME, check_new_output, finish_atomically,  # noqa: F401
                                      fresh_param, read_tokenizer_meta, write_export)
from bert_jax.convert.formats import ConversionError, check_casing  # noqa: F401 (public API)


def detect_source(path):
  """"tf", "hf" or "orbax" from the files at `path` (a directory or a TF checkpoint prefix).

  "orbax" is any bert_jax checkpoint `checkpoint.describe` accepts: a params export, a pre-training
  or fine-tuning workdir (its latest step or best export) or one step directory; local or gs://.
  """
  if os.path.isfile(path + ".index"):
    return "tf"
  if "," in path and not os.path.exists(path):   # two transformers folders (an ELECTRA pair)
    return "hf"
  if "://" not in path and not os.path.isdir(path):
    raise ConversionError(f"--input={path}: no such directory or TF checkpoint prefix.")
  files = set(os.listdir(path)) if "://" not in path else set()
  if families.is_hf_folder(path):   # one save_pretrained folder, or a family's pair of them
    return "hf"
  tf_index = any(f.endswith(".index") for f in files)  # google's bert_model.ckpt.index
  # google's TF releases also hold a bert_config.json: an export is bert_config.json + params/.
  finished_finetune = any(f.startswith("best_epoch") for f in files)   # its best_epoch{N}/
  if (files & {"checkpoints", "state"} or {ckpt_lib.CONFIG_NAME, "params"} <= files
      or (ckpt_lib.CONFIG_NAME in files and not tf_index) or finished_finetune
      or "://" in path):
    ckpt_lib.describe(path, verify=False)  # a one-line error naming what is missing
    return "orbax"
  if tf_index:
    return "tf"
  raise ConversionError(f"--input={path}: unknown layout; expected a google TF checkpoint "
                        "(bert_model.ckpt.index + bert_config.json), a Hugging Face directory "
                        "(config.json + model.safetensors/pytorch_model.bin), an Orbax export "
                        f"({ckpt_lib.CONFIG_NAME} + params/) or a bert_jax workdir "
                        "(checkpoints/<step>/).")


# ----------------------------------------------------------------------------------------------
# Source variables -> Flax parameters.
# ----------------------------------------------------------------------------------------------
def specs_for(config):
  """The name table of a model: its family's (BERT's names.py, ALBERT's albert.py, ...)."""
  return families.get(config.family).name_table(config)


def family_of_folder(path):
  """The family that reads transformers folder `path` (or "DISC,GEN" folders), by model_type."""
  first = path.split(",", 1)[0] if "," in path and not os.path.exists(path) else path
  try:
    return families.for_hf_folder(first)
  except ValueError as e:
    raise ConversionError(str(e)) from None


def family_of_config(config_json, config_file):
  """The family of a config without a folder to look at (a google TF release): its model_type,
  else its file name (albert_config.json), else a key only that family writes, else BERT."""
  kind = config_json.get("model_type")
  if kind:
    for f in families.registered():
      if kind in f.hf_model_types:
        return f
    raise ConversionError(f"{config_file}: model_type={kind!r} is not a family bert_jax "
                          "converts (bert_jax/families/).")
  for f in families.registered():
    if any(k in config_json for k in f.config_marker_keys):
      return f
  return next((f for f in families.registered()
               if os.path.basename(config_file) in f.tf_config_names), families.get("bert"))


def map_source(source, kind, config, where, config_file, ignore=None, seed=0):
  """(flat {path: float32 array} for every BertForPreTraining param, report dict).

  Every source variable is mapped, ignored for a stated reason, or a one-line error.
  """
  table = specs_for(config)
  by_name = {(s.hf if kind == "hf" else s.tf): s for s in table}
  ignored, casts, flat = {}, {}, {}
  for name in sorted(source.shapes):
    shape = source.shapes[name]
    why = formats.tf_ignored(name) if kind == "tf" else None
    if why is None and ignore and re.search(ignore, name):
      why = f"--ignore={ignore}"
    if why:
      ignored[name] = why
      continue
    spec = by_name.get(name)
    if spec is None:
      raise ConversionError(
          f"{where}: variable {name} (shape {shape}) has no place in BertForPreTraining "
          "(a fine-tuned head or another architecture?); skip it with --ignore='<regex>'.")
    expected = spec.source_shape(kind)
    if shape != expected:
      raise ConversionError(
          f"{where}: variable {name} has shape {shape} but {config_file} gives {expected} "
          f"(hidden_size={config.hidden_size}, intermediate_size={config.intermediate_size}, "
          f"vocab_size={config.vocab_size}); use the config that belongs to this checkpoint.")
    flat[spec.path] = names.to_flax(spec, formats.as_float32(source.get(name), name, casts),
                                    kind)
  for tied_name, (target, get) in source.tied.items():
    if target in source.shapes and not np.array_equal(get(tied_name), source.get(target)):
      raise ConversionError(f"{where}: {tied_name} differs from {target}; this model ties the "
                            "MLM decoder to the word embeddings (and its bias), as BERT does.")

  missing = [s for s in table if s.path not in flat]
  fatal = [s for s in missing if s.path.startswith("bert/") and not s.path.startswith(
      "bert/pooler/")]
  if fatal:
    s = fatal[0]
    raise ConversionError(
        f"{where}: variable {s.hf if kind == 'hf' else s.tf} (expected shape "
        f"{s.source_shape(kind)} from {config_file}) is missing ({len(fatal)} encoder variables "
        "missing); num_layers or the layout does not match the checkpoint.")
  rng = np.random.default_rng(seed)
  for s in missing:  # pooler (BertForMaskedLM) and heads (BertModel): a fresh init
    flat[s.path] = fresh_param(s, config.initializer_range, rng)
  report = {"ignored_variables": ignored, "initialized_randomly": [s.path for s in missing],
            "cast_to_float32_from": casts, "num_mapped": len(table) - len(missing)}
  return flat, report


# ----------------------------------------------------------------------------------------------
# Import (TF or HF) -> (params, BertConfig, meta).
# ----------------------------------------------------------------------------------------------
def import_checkpoint(path, source="auto", *, vocab_file=None, bert_config_file=None,
                      do_lower_case=None, gelu="auto", ignore=None, seed=0):
  """Reads a google TF or HF checkpoint; returns (params tree, BertConfig, meta). Writes nothing."""
  two = "," in path and not os.path.exists(path)   # an ELECTRA pair: DISC,GEN
  kind = ("hf" if two else detect_source(path)) if source == "auto" else source
  tokenizer_config = None
  if kind == "hf":
    family = family_of_folder(path)
    if family.import_hf:   # its own names, folders and tokenizer reading (ELECTRA, DistilBERT)
      return family.import_hf(path, vocab_file=vocab_file, do_lower_case=do_lower_case)
  if kind == "tf":
    prefix = formats.find_tf_checkpoint(path)
    base = os.path.dirname(prefix)
    config_file = bert_config_file
    if not config_file:   # bert_config.json, or a family's own name (albert_config.json)
      names_here = [n for f in families.registered() for n in f.tf_config_names
                    if os.path.isfile(os.path.join(base, n))]
      config_file = os.path.join(base, names_here[-1] if names_here else "bert_config.json")
    config_json = formats.read_json(config_file, "--bert_config_file")
    src = formats.read_tf(prefix)
    where, pre_ignored = prefix, {}
  elif kind == "hf":
    config_json, src, pre_ignored, tokenizer_config = formats.read_hf(path)
    base = path
    config_file = os.path.join(path, "config.json")
    where = ",".join(os.path.basename(f) for f in src.files)
    where = os.path.join(path, where) if len(src.files) == 1 else f"{path} ({where})"
  else:
    raise ConversionError(f"--source={kind}: import reads 'tf' or 'hf' checkpoints.")
  family = family_of_config(config_json, config_file)
  if family.import_hf:   # a TF checkpoint of a family that converts from transformers only
    raise ConversionError(f"{config_file}: a {family.name} config in a TF checkpoint; "
                          f"{family.name} converts from transformers folders only.")
  config, numerics = family.config_from_json(config_json, config_file, kind, gelu)
  if kind == "hf":   # e.g. ALBERT's transformers names onto the table's
    src, more = family.normalise_hf_names(src)
    pre_ignored = {**pre_ignored, **more}

  tokenizer_meta = read_tokenizer_meta(base, vocab_file, config, config_file,
                                       where if kind == "tf" else path, tokenizer_config,
                                       do_lower_case)
  flat, report = map_source(src, kind, config, where, config_file, ignore, seed)
  report["ignored_variables"] = {**pre_ignored, **report["ignored_variables"]}
  meta = {
      "converted_from": {"format": kind, "path": os.path.abspath(path),
                         "files": [os.path.basename(f) for f in src.files]},
      **tokenizer_meta, "numerics": numerics, **report,
  }
  return names.unflatten(flat), config, meta


def convert_to_orbax(path, output, source="auto", **kwargs):
  """google TF / HF checkpoint (any family's; an ELECTRA pair also as "DISC,GEN") -> Orbax params
  export + its vocab. Returns meta."""
  check_new_output(output)  # before the (slow) read
  # A CrossEncoder folder (a *ForSequenceClassification with one label): the body and its
  # classifier, recorded as a reranker (cross_encoder.py).
  from bert_jax.convert import cross_encoder  # pylint: disable=g-import-not-at-top
  if source in ("auto", "hf") and cross_encoder.is_cross_encoder_folder(path):
    return convert_cross_encoder(path, output, vocab_file=kwargs.get("vocab_file"),
                                 do_lower_case=kwargs.get("do_lower_case"))
  # A sentence-transformers folder: its pooling, prompts and length, read (and a pooling we do
  # not compute refused) before the weights; recorded as bert_config.json's "sentence_embedding".
  from bert_jax.convert import sentence_transformers  # pylint: disable=g-import-not-at-top
  embedding = (sentence_transformers.read_folder(path)
               if sentence_transformers.is_st_folder(path) else None)
  params, config, meta = import_checkpoint(path, source, **kwargs)
  if embedding:
    meta["sentence_embedding"] = embedding
  return write_export(output, params, config, meta)


def convert_cross_encoder(path, output, *, vocab_file=None, do_lower_case=None):
  """A sentence-transformers CrossEncoder folder (or a transformers *ForSequenceClassification
  with one label) -> an Orbax export of task_type "reranker": the body as any transformers
  folder (a tokenizer.json WordPiece without vocab.txt is read as the vocab there, as for
  all-MiniLM-L6-v2), its classifier beside it (cross_encoder.py). Returns meta."""
  from bert_jax.convert import cross_encoder  # pylint: disable=g-import-not-at-top
  check_new_output(output)
  settings = cross_encoder.check_folder(path)
  params, config, meta = import_checkpoint(path, "hf", vocab_file=vocab_file,
                                           do_lower_case=do_lower_case,
                                           ignore=r"^classifier\.")
  params, meta = cross_encoder.with_classifier(path, params, config, meta, settings)
  return write_export(output, params, config, meta)


def summary(meta, config=None):
  """What a conversion did, in a few lines (the one summary every family's import prints)."""
  numerics = meta.get("numerics") or {}
  act = (f"; hidden_act={numerics['hidden_act']} ({numerics.get('hidden_act_note', '')})"
         if numerics.get("hidden_act") else
         (f"; hidden_act={config.hidden_act}" if config is not None else ""))
  mapped = meta.get("num_mapped")
  lines = [f"  {'mapped ' + str(mapped) + ' parameters; ' if mapped is not None else ''}"
           f"do_lower_case={meta.get('do_lower_case')} "
           f"({meta.get('casing_inferred_from', 'not recorded')}){act}"]
  reasons = collections.Counter((meta.get("ignored_variables") or {}).values())
  for why, n in sorted(reasons.items()):
    lines.append(f"  ignored {n} variables: {why}")
  if meta.get("initialized_randomly"):
    lines.append(f"  not in the source, initialised randomly: "
                 f"{', '.join(meta['initialized_randomly'])}")
  if meta.get("cast_to_float32_from"):
    dtypes = collections.Counter(meta["cast_to_float32_from"].values())
    lines.append(f"  cast to float32: {dict(dtypes)}")
  if meta.get("generator"):   # a note a family's import leaves (ELECTRA without its generator)
    lines.append(f"  generator: {meta['generator']}")
  if meta.get("sentence_embedding"):   # a sentence-transformers folder's settings
    from bert_jax.convert import sentence_transformers  # pylint: disable=g-import-not-at-top
    lines.append("  sentence-transformers: "
                 + sentence_transformers.describe_record(meta["sentence_embedding"])
                 + " (bert_config.json \"sentence_embedding\"; fine-tuning and predict embed "
                 "read it)")
  if meta.get("tokenizer_framing"):   # a tokenizer.json framing a text otherwise (ModernBERT's)
    lines.append(f"  note: {meta['tokenizer_framing']}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------------
# Orbax -> Hugging Face.
# ----------------------------------------------------------------------------------------------
def hf_state_dict(params, config, where="checkpoint"):
  """Flax BertForPreTraining params -> {HF name: array} (tied decoder left to transformers)."""
  flat = names.flatten(params)
  table = specs_for(config)
  if masked_lm_only(config, flat):
    # An MLM-only model (the RoBERTa recipe, SpanBERT, a family without a sentence task) has no
    # NSP head to export and its pooler fed no loss: transformers' BertForMaskedLM, which has
    # neither (export_model_to_hf writes that architecture).
    table = [s for s in table if not s.path.startswith(("nsp_head/", "bert/pooler/"))]
  for s in table:
    if s.path not in flat:
      raise ConversionError(f"{where}: parameter {s.path} (shape {s.shape}) is missing; export "
                            "needs a BertForPreTraining checkpoint (bert, mlm_head, nsp_head).")
    if tuple(flat[s.path].shape) != s.shape:
      raise ConversionError(f"{where}: parameter {s.path} has shape {tuple(flat[s.path].shape)} "
                            f"but its {ckpt_lib.CONFIG_NAME} gives {s.shape}.")
  return {s.hf: names.from_flax(s, np.asarray(flat[s.path]), "hf") for s in table}


def masked_lm_only(config, flat):
  """A BERT-named tree without a sentence head: exported as BertForMaskedLM."""
  return config.sentence_objective is None and not any(p.startswith("nsp_head/") for p in flat)


def export_model_to_hf(m, output, checkpoint):
  """A loaded inference.InferenceModel (from `checkpoint`) -> HF folder `output`."""
  check_new_output(output)
  family = families.get(m.config.family)
  if family.export_hf:   # its own names and folders (ELECTRA: two networks, two folders)
    return family.export_hf(m, output)
  state = hf_state_dict(m.params, m.config, checkpoint)
  pad_id = m.tokenizer.vocab.pad_id

  def write(tmp):
    os.makedirs(tmp)
    writing.save_safetensors(tmp, state)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      hf_config = family.hf_config_json(m.config, pad_id)
      if hf_config.get("architectures") == ["BertForPreTraining"] and masked_lm_only(
          m.config, names.flatten(m.params)):
        hf_config["architectures"] = ["BertForMaskedLM"]
      json.dump(hf_config, f, indent=2, sort_keys=True)
    if m.spm_model_file:  # tokenizer.json (PreTrainedTokenizerFast) with the same ids
      sentencepiece_export.write_tokenizer_files(tmp, m.spm_model_file,
                                                 m.config.max_position_embeddings)
    else:
      formats.write_tokenizer_files(tmp, m.vocab_file, m.do_lower_case,
                                    m.config.max_position_embeddings)

  return finish_atomically(output, write)
