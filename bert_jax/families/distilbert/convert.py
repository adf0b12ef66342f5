r"""DistilBERT <-> transformers: DistilBertForMaskedLM (or a bare DistilBertModel) from and to a
BertForPreTraining tree of family "distilbert" (model.py; bert_jax/families/distilbert/distil.py trains it).

  ours (Flax)                                   transformers
  bert/embeddings/{word,position}_embeddings    distilbert.embeddings.{word,position}_embeddings
  bert/embeddings/layer_norm                    distilbert.embeddings.LayerNorm
  bert/encoder/layer_{i}/attention/{query,key,value,output}
                                                distilbert.transformer.layer.{i}.attention.
                                                  {q_lin,k_lin,v_lin,out_lin}
  bert/encoder/layer_{i}/attention_layer_norm   ....sa_layer_norm
  bert/encoder/layer_{i}/{intermediate,output}  ....ffn.{lin1,lin2}
  bert/encoder/layer_{i}/output_layer_norm      ....output_layer_norm
  mlm_head/transform, transform_layer_norm      vocab_transform, vocab_layer_norm
  mlm_head/output_bias                          vocab_projector.bias (its weight is tied to the
                                                word embeddings: checked equal when present)
BERT's table (names.py) with DistilBERT's names: the same orientations (torch Linear [out, in]).
A bare DistilBertModel has no MLM head: it starts fresh (model.py's init) and the export's meta
lists it under initialized_randomly. transformers' DistilBERT fixes LayerNorm eps at 1e-12 and has
no token types and no pooler, as ours.

  python -m bert_jax.convert --input=WORKDIR --output=hf/distilbert   # -> transformers
  python -m bert_jax.convert --input=HF_DIR --output=ckpt/distilbert  # <- transformers
(`python -m bert_jax.families.distilbert.convert`, once an alias, is a one-line error naming this.)
"""

import dataclasses
import glob
import json
import os
import re

import numpy as np

from bert_jax.models import model as model_lib
from bert_jax.convert import formats
from bert_jax.convert import names
from bert_jax.convert import writing
from bert_jax.convert.formats import ConversionError

# HF DistilBERT's activation names <-> our hidden_act.
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "relu": "relu"}
_LAYER = [(r"attention\.self\.query\.", "attention.q_lin."),
          (r"attention\.self\.key\.", "attention.k_lin."),
          (r"attention\.self\.value\.", "attention.v_lin."),
          (r"attention\.output\.dense\.", "attention.out_lin."),
          (r"attention\.output\.LayerNorm\.", "sa_layer_norm."),
          (r"intermediate\.dense\.", "ffn.lin1."),
          (r"^output\.dense\.", "ffn.lin2."),
          (r"^output\.LayerNorm\.", "output_layer_norm.")]
_HEAD = {"cls.predictions.transform.dense.": "vocab_transform.",
         "cls.predictions.transform.LayerNorm.": "vocab_layer_norm.",
         "cls.predictions.bias": "vocab_projector.bias"}
TIED = "vocab_projector.weight"


def _hf_name(bert_name):
  """names.py's HF BERT name -> transformers' DistilBERT name."""
  if bert_name.startswith("bert.embeddings."):
    return "distilbert." + bert_name[len("bert."):]
  m = re.match(r"bert\.encoder\.layer\.(\d+)\.(.*)", bert_name)
  if m:
    rest = m.group(2)
    for pattern, new in _LAYER:
      if re.search(pattern, rest):
        return f"distilbert.transformer.layer.{m.group(1)}." + re.sub(pattern, new, rest)
  for old, new in _HEAD.items():
    if bert_name.startswith(old):
      return new + bert_name[len(old):]
  raise AssertionError(f"no DistilBERT name for {bert_name}")


def specs(config):
  """[names.Spec] of every parameter of BertForPreTraining(config), config a distilbert one."""
  if config.family != "distilbert":
    raise ConversionError(f"a {config.family} model; the DistilBERT converter needs family "
                          "'distilbert' (a distilbert-* preset).")
  out = []
  for s in names.specs(dataclasses.replace(config, type_vocab_size=1, family="bert",
                                           objectives="mlm")):
    if s.path.startswith(("bert/embeddings/token_type", "bert/pooler", "nsp_head")):
      continue
    out.append(dataclasses.replace(s, hf=_hf_name(s.hf)))
  return out


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------
def hf_config_json(config, pad_token_id=0):
  """transformers' DistilBertConfig (as DistilBertForMaskedLM's config.json) of a BertConfig."""
  specs(config)
  act = {v: k for k, v in _ACTIVATIONS.items()}[config.hidden_act]
  if config.layer_norm_eps != 1e-12:
    raise ConversionError(f"layer_norm_eps={config.layer_norm_eps}: transformers' DistilBERT "
                          "fixes it at 1e-12; only such a model exports exactly.")
  return {"architectures": ["DistilBertForMaskedLM"], "model_type": "distilbert",
          "vocab_size": config.vocab_size, "dim": config.hidden_size,
          "n_layers": config.num_layers, "n_heads": config.num_heads,
          "hidden_dim": config.intermediate_size, "activation": act,
          "dropout": config.hidden_dropout_prob, "attention_dropout": config.attention_dropout_prob,
          "max_position_embeddings": config.max_position_embeddings,
          "sinusoidal_pos_embds": False, "initializer_range": config.initializer_range,
          "qa_dropout": 0.1, "seq_classif_dropout": 0.2, "pad_token_id": pad_token_id,
          "tie_word_embeddings": True, "dtype": "float32"}


def config_from_json(d, path):
  """A distilbert BertConfig from a DistilBertConfig dict (one-line error naming the field)."""
  if d.get("model_type") != "distilbert":
    raise ConversionError(f"{path}: model_type={d.get('model_type')!r}; expected 'distilbert' "
                          "(python -m bert_jax.convert reads BERT and ALBERT).")
  if d.get("sinusoidal_pos_embds"):
    raise ConversionError(f"{path}: sinusoidal_pos_embds=true; only learned position "
                          "embeddings (every released DistilBERT) are supported.")
  act = d.get("activation", "gelu")
  if act not in _ACTIVATIONS:
    raise ConversionError(f"{path}: activation={act!r}; one of {sorted(_ACTIVATIONS)} expected.")
  try:
    return model_lib.BertConfig(
        family="distilbert", objectives="mlm", type_vocab_size=0, vocab_size=d["vocab_size"],
        hidden_size=d["dim"], num_layers=d["n_layers"], num_heads=d["n_heads"],
        intermediate_size=d["hidden_dim"], hidden_act=_ACTIVATIONS[act],
        max_position_embeddings=d.get("max_position_embeddings", 512),
        hidden_dropout_prob=d.get("dropout", 0.1),
        attention_dropout_prob=d.get("attention_dropout", 0.1),
        initializer_range=d.get("initializer_range", 0.02), layer_norm_eps=1e-12)
  except (KeyError, ValueError) as e:
    raise ConversionError(f"{path}: {e!r} (a DistilBertConfig needs vocab_size, dim, n_layers, "
                          "n_heads, hidden_dim).") from e


# ----------------------------------------------------------------------------------------------
# transformers -> ours.
# ----------------------------------------------------------------------------------------------
def import_hf(path):
  """(params tree, BertConfig, meta) from a DistilBertForMaskedLM / DistilBertModel folder."""
  return _import_hf(path, None, None)


def _import_hf(path, vocab_file, do_lower_case):
  config_json, raw, _, tokenizer_config = _read(path)
  config_file = os.path.join(path, "config.json")
  config = config_from_json(config_json, config_file)
  bare = not any(n.startswith("distilbert.") for n in raw.shapes)
  table = {s.hf: s for s in specs(config)}
  flat, ignored = {}, {}
  for name in sorted(raw.shapes):
    new = f"distilbert.{name}" if bare and name.split(".")[0] in ("embeddings",
                                                                   "transformer") else name
    if new == TIED or new.endswith("position_ids"):
      ignored[name] = ("tied to the word embeddings (checked equal)" if new == TIED
                       else "buffer (position ids)")
      continue
    spec = table.get(new)
    if spec is None:
      raise ConversionError(f"{path}: variable {name} (shape {raw.shapes[name]}) has no place in "
                            "DistilBertForMaskedLM (a fine-tuned head?).")
    if raw.shapes[name] != spec.source_shape("hf"):
      raise ConversionError(f"{path}: variable {name} has shape {raw.shapes[name]} but "
                            f"{config_file} gives {spec.source_shape('hf')}.")
    flat[spec.path] = names.to_flax(spec, formats.as_float32(raw.get(name), name, {}), "hf")
  tied = [n for n in raw.shapes if n == TIED or n == "distilbert." + TIED]
  if tied and not np.array_equal(raw.get(tied[0]), flat["bert/embeddings/word_embeddings/embedding"]):
    raise ConversionError(f"{path}: {tied[0]} differs from the word embeddings; DistilBERT ties "
                          "its decoder to them.")
  missing = [s for s in table.values() if s.path not in flat]
  if any(not s.path.startswith("mlm_head/") for s in missing):
    s = next(s for s in missing if not s.path.startswith("mlm_head/"))
    raise ConversionError(f"{path}: variable {s.hf} (shape {s.source_shape('hf')}) is missing "
                          f"({len(missing)} missing); n_layers or the layout does not match.")
  rng = np.random.default_rng(0)
  for s in missing:   # a bare DistilBertModel: the MLM head as model.py initialises it
    flat[s.path] = writing.fresh_param(s, config.initializer_range, rng)
  tokenizer_meta = writing.read_tokenizer_meta(path, vocab_file, config, config_file, path,
                                               tokenizer_config, do_lower_case)
  meta = {"converted_from": {"format": "hf", "path": os.path.abspath(path),
                             "files": [os.path.basename(f) for f in raw.files]},
          **tokenizer_meta, "ignored_variables": ignored,
          "initialized_randomly": [s.path for s in missing]}
  return names.unflatten(flat), config, meta


def _read(path):
  """formats.read_hf's files without its BERT renaming: (config, raw Source, {}, tokenizer)."""
  if not os.path.isfile(os.path.join(path, "config.json")):
    raise ConversionError(f"{path}: no config.json (a transformers DistilBERT folder holds "
                          "config.json and model.safetensors).")
  config = formats.read_json(os.path.join(path, "config.json"), "Hugging Face config")
  if config.get("model_type") != "distilbert":
    config_from_json(config, os.path.join(path, "config.json"))   # the one-line error
  weights = os.path.join(path, "model.safetensors")
  if not os.path.isfile(weights):
    raise ConversionError(f"{path}: no model.safetensors (save the model with "
                          "save_pretrained(..., safe_serialization=True)).")
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  with safe_open(weights, framework="numpy") as st:
    shapes = {k: tuple(st.get_slice(k).get_shape()) for k in st.keys()}

  def get(name):
    with safe_open(weights, framework="numpy") as st:
      return st.get_tensor(name)
  tok = os.path.join(path, "tokenizer_config.json")
  return (config, formats.Source(shapes, get, [weights]), {},
          formats.read_json(tok, "tokenizer config") if os.path.isfile(tok) else None)


def convert_to_orbax(path, output, *, vocab_file=None, do_lower_case=None):
  """A transformers DistilBERT folder -> an Orbax params export (+ its vocab.txt), usable by
  predict and as a student's --config.init_checkpoint. Returns meta."""
  writing.check_new_output(output)
  params, config, meta = import_with_tokenizer(path, vocab_file=vocab_file,
                                               do_lower_case=do_lower_case)
  return writing.write_export(output, params, config, meta)


def import_with_tokenizer(path, *, vocab_file=None, do_lower_case=None):
  """import_hf, with --vocab_file / --do_lower_case (when given) replacing the tokenizer the
  folder's own files name (checked against the model's vocab_size by the same reader)."""
  own = os.path.isfile(os.path.join(path, writing.VOCAB_NAME)) or glob.glob(
      os.path.join(path, "*.model"))
  if not own and not vocab_file:
    raise ConversionError(
        f"{path}: a transformers DistilBERT folder without its tokenizer ({writing.VOCAB_NAME}); "
        "save the tokenizer into it too (tokenizer.save_pretrained(folder)), or pass "
        "--vocab_file.")
  if not own:   # import_hf reads the folder's own tokenizer: only the flag's here
    params, config, meta = _import_hf(path, vocab_file, do_lower_case)
  else:
    params, config, meta = import_hf(path)
    if vocab_file or do_lower_case is not None:
      tok = os.path.join(path, "tokenizer_config.json")
      meta.update(writing.read_tokenizer_meta(
          path, vocab_file, config, os.path.join(path, "config.json"), path,
          formats.read_json(tok, "tokenizer config") if os.path.isfile(tok) else None,
          do_lower_case))
  meta["num_mapped"] = len(specs(config)) - len(meta["initialized_randomly"])
  return params, config, meta


# ----------------------------------------------------------------------------------------------
# ours -> transformers.
# ----------------------------------------------------------------------------------------------
def hf_state_dict(params, config):
  """{DistilBertForMaskedLM name: array} of a distilbert BertForPreTraining tree."""
  flat = names.flatten(params)
  out = {}
  for s in specs(config):
    if s.path not in flat or tuple(np.shape(flat[s.path])) != s.shape:
      raise ConversionError(f"parameter {s.path} is missing or not of shape {s.shape}; export "
                            "needs a DistilBERT tree (bert, mlm_head) of this config.")
    out[s.hf] = names.from_flax(s, np.asarray(flat[s.path]), "hf")
  return out


def export_to_hf(params, config, output, *, vocab_file=None, do_lower_case=None, pad_token_id=0):
  """output/{model.safetensors, config.json} (+ tokenizer files with a vocab_file), atomically."""
  state, config_json = hf_state_dict(params, config), hf_config_json(config, pad_token_id)

  def write(tmp):
    os.makedirs(tmp)
    writing.save_safetensors(tmp, state)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(config_json, f, indent=2, sort_keys=True)
    if vocab_file:
      formats.write_tokenizer_files(tmp, vocab_file, do_lower_case,
                                    config.max_position_embeddings)

  return writing.finish_atomically(output, write)


def export_checkpoint_to_hf(checkpoint, output, *, vocab_file=None, do_lower_case=None):
  """An Orbax export, pre-training workdir or step directory of a DistilBERT -> transformers."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  writing.check_new_output(output)
  params, config, meta = ckpt_lib.load_params(checkpoint)
  if config.family != "distilbert":
    raise ConversionError(f"{checkpoint}: a {config.family} checkpoint; this exports DistilBERT "
                          "(python -m bert_jax.convert exports BERT and ALBERT).")
  if vocab_file is None:
    vocab_file = (meta.get("config") or {}).get("vocab_file") or None
    bundled = os.path.join(str(ckpt_lib.describe(checkpoint, verify=False).directory),
                           "vocab.txt")
    vocab_file = vocab_file or (bundled if os.path.isfile(bundled) else None)
  if do_lower_case is None:
    do_lower_case = meta.get("do_lower_case")
  return export_to_hf(params, config, output, vocab_file=vocab_file,
                      do_lower_case=do_lower_case)
