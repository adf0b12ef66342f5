r"""ELECTRA <-> transformers: the discriminator as ElectraForPreTraining (or a bare ElectraModel)
and the generator as ElectraForMaskedLM, two folders (model.safetensors + config.json), from and to
one ElectraForPreTraining parameter tree (bert_jax/families/electra/objective.py).

  ours (Flax)                          discriminator folder               generator folder
  bert/embeddings/*_embeddings, layer_norm  electra.embeddings.*          electra.embeddings.* (*)
  bert/embeddings/projection [E, H]    electra.embeddings_project
  bert/encoder/layer_{i}/...           electra.encoder.layer.{i}.*        (BERT's names, names.py)
  rtd_head/dense, rtd_head/prediction  discriminator_predictions.dense, .dense_prediction
  generator/projection [E, Hg]                                            electra.embeddings_project
  generator/encoder/layer_{i}/...                                         electra.encoder.layer.{i}.*
  mlm_head/transform [Hg, E], transform_layer_norm                        generator_predictions.
                                                                            dense, .LayerNorm
  mlm_head/output_bias [V]                                                generator_lm_head.bias
(*) ELECTRA trains one embedding table for both networks (google-research/electra reuses
`electra/embeddings`), so a released pair holds the same embeddings twice: import checks that
they are equal (else a one-line error naming both folders) and export writes them into both.
The decoder generator_lm_head.weight is tied to the word embeddings (checked when present).

  python -m bert_jax.convert --input=WORKDIR --output=hf/electra          # -> transformers
  python -m bert_jax.convert --input=D,G --output=ckpt/electra            # <- transformers
(`python -m bert_jax.families.electra.convert`, once an alias, is a one-line error naming these.)
"""

import dataclasses
import json
import os

import numpy as np

from bert_jax.families.electra import objective as electra_lib
from bert_jax.models import model as model_lib
from bert_jax.convert import formats
from bert_jax.convert import names
from bert_jax.convert import writing
from bert_jax.convert.formats import ConversionError

DISCRIMINATOR, GENERATOR = "discriminator", "generator"


def _spec(path, hf, tf, shape, flat=None, hf_t=False):
  return names.Spec(path, hf, tf, tuple(shape), tuple(flat or shape), hf_t, False)


def _dense(path, hf, tf, n_in, n_out):
  return [_spec(f"{path}/kernel", f"{hf}.weight", f"{tf}/kernel", (n_in, n_out), hf_t=True),
          _spec(f"{path}/bias", f"{hf}.bias", f"{tf}/bias", (n_out,))]


def _layer_norm(path, hf, tf, width):
  return [_spec(f"{path}/scale", f"{hf}.weight", f"{tf}/LayerNorm/gamma", (width,)),
          _spec(f"{path}/bias", f"{hf}.bias", f"{tf}/LayerNorm/beta", (width,))]


def _encoder(config, path, tf_scope):
  """BERT's layer table (names.py) moved under `path`, with ELECTRA's prefixes."""
  out = []
  for s in names.specs(config):
    if s.path.startswith("bert/encoder/"):
      out.append(dataclasses.replace(
          s, path=path + s.path[len("bert/encoder"):],
          hf="electra.encoder." + s.hf[len("bert.encoder."):],
          tf=f"{tf_scope}/encoder/" + s.tf[len("bert/encoder/"):]))
  return out


def specs(config):
  """{"discriminator": [Spec], "generator": [Spec]} for an ELECTRA BertConfig. `tf` names are
  google-research/electra's variables (not read or written here yet)."""
  electra_lib.check_electra(config)
  gc = electra_lib.generator_config(config)
  v, e, h = config.vocab_size, config.embed_dim, config.hidden_size
  shared = [_spec(f"bert/embeddings/{n}_embeddings/embedding", f"electra.embeddings.{n}_embeddings."
                  "weight", f"electra/embeddings/{n}_embeddings", (rows, e))
            for n, rows in (("word", v), ("position", config.max_position_embeddings),
                            ("token_type", config.type_vocab_size))]
  shared += [dataclasses.replace(s, tf=s.tf.replace("/LayerNorm/LayerNorm", "/LayerNorm"))
             for s in _layer_norm("bert/embeddings/layer_norm", "electra.embeddings.LayerNorm",
                                  "electra/embeddings/LayerNorm", e)]
  disc = list(shared)
  if config.factorised:
    disc += _dense("bert/embeddings/projection", "electra.embeddings_project",
                   "electra/embeddings_project", e, h)
  disc += _encoder(config, "bert/encoder", "electra")
  disc += _dense("rtd_head/dense", "discriminator_predictions.dense",
                 "discriminator_predictions/dense", h, h)
  disc += _dense("rtd_head/prediction", "discriminator_predictions.dense_prediction",
                 "discriminator_predictions/dense_1", h, 1)
  gen = list(shared)
  if gc.factorised:
    gen += _dense("generator/projection", "electra.embeddings_project",
                  "generator/embeddings_project", e, gc.hidden_size)
  gen += _encoder(gc, "generator/encoder", "generator")
  gen += _dense("mlm_head/transform", "generator_predictions.dense", "generator_predictions/dense",
                gc.hidden_size, e)
  gen += _layer_norm("mlm_head/transform_layer_norm", "generator_predictions.LayerNorm",
                     "generator_predictions", e)
  gen.append(_spec("mlm_head/output_bias", "generator_lm_head.bias",
                   "generator_predictions/output_bias", (v,)))
  return {DISCRIMINATOR: disc, GENERATOR: gen}


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------
def hf_config_jsons(config, pad_token_id=0):
  """{"discriminator": ElectraConfig dict, "generator": ElectraConfig dict}."""
  specs(config)
  if config.hidden_act != "gelu":   # HF's generator head hard-codes gelu (module docstring)
    raise ConversionError(f"hidden_act={config.hidden_act!r}: transformers' ELECTRA generator "
                          "head always uses 'gelu'; only hidden_act='gelu' exports exactly.")

  def one(c, arch):
    return {"architectures": [arch], "model_type": "electra", "vocab_size": c.vocab_size,
            "embedding_size": c.embed_dim, "hidden_size": c.hidden_size,
            "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
            "intermediate_size": c.intermediate_size, "hidden_act": "gelu",
            "hidden_dropout_prob": c.hidden_dropout_prob,
            "attention_probs_dropout_prob": c.attention_dropout_prob,
            "max_position_embeddings": c.max_position_embeddings,
            "type_vocab_size": c.type_vocab_size, "initializer_range": c.initializer_range,
            "layer_norm_eps": c.layer_norm_eps, "pad_token_id": pad_token_id,
            "position_embedding_type": "absolute", "tie_word_embeddings": True,
            "dtype": "float32"}
  return {DISCRIMINATOR: one(config, "ElectraForPreTraining"),
          GENERATOR: one(electra_lib.generator_config(config), "ElectraForMaskedLM")}


def config_from_jsons(disc, gen, disc_path, gen_path):
  """One ELECTRA BertConfig from the two ElectraConfig dicts; what the pair must share is
  checked (one line naming both files)."""
  for d, path in ((disc, disc_path), (gen, gen_path)):
    if d.get("model_type") != "electra":
      raise ConversionError(f"{path}: model_type={d.get('model_type')!r}; expected 'electra'.")
    if d.get("hidden_act", "gelu") != "gelu":
      raise ConversionError(f"{path}: hidden_act={d['hidden_act']!r}; only 'gelu' (every "
                            "released ELECTRA) is supported.")
    if d.get("position_embedding_type", "absolute") != "absolute":
      raise ConversionError(f"{path}: position_embedding_type={d['position_embedding_type']!r};"
                            " only 'absolute' is supported.")
  for k in ("vocab_size", "embedding_size", "max_position_embeddings", "type_vocab_size",
            "layer_norm_eps"):
    if disc.get(k) != gen.get(k):
      raise ConversionError(f"{k}: {disc.get(k)} in {disc_path} but {gen.get(k)} in {gen_path}; "
                            "the generator and discriminator of one ELECTRA share embeddings: "
                            "pass the pair that was trained together.")
  e, h = disc["embedding_size"], disc["hidden_size"]
  try:
    return model_lib.BertConfig(
        family="electra", objectives="mlm,rtd", vocab_size=disc["vocab_size"],
        embedding_size=0 if e == h else e, hidden_size=h, num_layers=disc["num_hidden_layers"],
        num_heads=disc["num_attention_heads"], intermediate_size=disc["intermediate_size"],
        max_position_embeddings=disc["max_position_embeddings"],
        type_vocab_size=disc.get("type_vocab_size", 2),
        hidden_dropout_prob=disc.get("hidden_dropout_prob", 0.1),
        attention_dropout_prob=disc.get("attention_probs_dropout_prob", 0.1),
        initializer_range=disc.get("initializer_range", 0.02),
        layer_norm_eps=disc.get("layer_norm_eps", 1e-12),
        generator_hidden_size=gen["hidden_size"], generator_num_layers=gen["num_hidden_layers"],
        generator_num_heads=gen["num_attention_heads"],
        generator_intermediate_size=gen["intermediate_size"])
  except ValueError as err:
    raise ConversionError(f"{disc_path}, {gen_path}: {err}") from err


# ----------------------------------------------------------------------------------------------
# Import.
# ----------------------------------------------------------------------------------------------
def _electra_names(source):
  """formats.read_hf's names (a bare model's embeddings/encoder prefixed "bert.") -> ELECTRA's
  ("electra." prefix); the tied generator_lm_head.weight set aside."""
  out, tied = {}, None
  for name in source.shapes:
    if name.startswith("bert."):
      new = "electra." + name[len("bert."):]
    elif name.startswith("embeddings_project."):
      new = "electra." + name
    else:
      new = name
    if new == "generator_lm_head.weight":
      tied = name
    elif not new.endswith("embeddings.token_type_ids"):   # a buffer of old checkpoints
      out[new] = name
  return out, tied


def default_generator_json(disc):
  """The ElectraConfig dict of google-research/electra's default generator for discriminator
  config `disc` (run_pretraining.get_generator_config: the same depth, 1/4 of the width, 4x FFN,
  max(1, H/64) heads): the generator sizes a discriminator imported alone records (BertConfig
  of family electra needs them), with no generator parameters behind them."""
  hg = max(1, disc["hidden_size"] // 4)
  return dict(disc, hidden_size=hg, num_attention_heads=max(1, hg // 64),
              intermediate_size=4 * hg)


def import_hf(discriminator_dir, generator_dir=None):
  """(params tree, BertConfig, meta) from a discriminator folder (ElectraForPreTraining or
  ElectraModel: the rtd head then starts fresh) and a generator folder (ElectraForMaskedLM).

  generator_dir=None: the discriminator alone (params["bert"] and "rtd_head", what fine-tuning
  and extract_features read); the config's generator sizes are then default_generator_json's and
  meta["generator"] says there is none (fill-mask and pre-training need the pair)."""
  paths = {DISCRIMINATOR: discriminator_dir}
  if generator_dir:
    paths[GENERATOR] = generator_dir
  read = {k: formats.read_hf(p) for k, p in paths.items()}
  disc_json = read[DISCRIMINATOR][0]
  if "ElectraForMaskedLM" in (disc_json.get("architectures") or []):
    raise ConversionError(f"{discriminator_dir}: an ElectraForMaskedLM (a generator) given as the "
                          "discriminator; pass the ElectraForPreTraining / ElectraModel folder.")
  config = config_from_jsons(
      disc_json, read[GENERATOR][0] if generator_dir else default_generator_json(disc_json),
      os.path.join(discriminator_dir, "config.json"),
      os.path.join(generator_dir or discriminator_dir, "config.json"))
  table = specs(config)
  flat, ignored, fresh = {}, {}, []
  for net, (_, source, pre_ignored, _) in read.items():
    where = paths[net]
    ignored.update({f"{net}:{k}": v for k, v in pre_ignored.items()})
    renamed, tied = _electra_names(source)
    by_name = {s.hf: s for s in table[net]}
    for new, old in sorted(renamed.items()):
      spec = by_name.get(new)
      if spec is None:
        raise ConversionError(f"{where}: variable {old} (shape {source.shapes[old]}) has no place "
                              f"in an ELECTRA {net} (a fine-tuned head or another model?).")
      if source.shapes[old] != spec.source_shape("hf"):
        raise ConversionError(f"{where}: variable {old} has shape {source.shapes[old]} but its "
                              f"config.json gives {spec.source_shape('hf')}.")
      array = names.to_flax(spec, formats.as_float32(source.get(old), old, {}), "hf")
      if spec.path in flat:   # the shared embeddings, read from both folders
        if not np.array_equal(flat[spec.path], array):
          raise ConversionError(
              f"{old} differs between {discriminator_dir} and {generator_dir}; an ELECTRA pair "
              "shares its embeddings (trained together): pass the generator of this "
              "discriminator.")
        continue
      flat[spec.path] = array
    if tied is not None:
      word = source.get(tied)
      if not np.array_equal(word, flat["bert/embeddings/word_embeddings/embedding"]):
        raise ConversionError(f"{where}: {tied} differs from the word embeddings; ELECTRA ties "
                              "the generator's decoder to them.")
      ignored[f"{net}:{tied}"] = "tied to the word embeddings (checked equal)"
    missing = [s for s in table[net] if s.path not in flat]
    for s in missing:
      if not s.path.startswith("rtd_head/"):   # a bare ElectraModel has no rtd head
        raise ConversionError(f"{where}: variable {s.hf} (shape {s.source_shape('hf')}) is "
                              f"missing; an ELECTRA {net} folder needs it.")
      fresh.append(s)
  rng = np.random.default_rng(0)
  for s in fresh:   # model.py's initialisation: kernels truncated normal, biases zero
    flat[s.path] = (_truncated_normal(s.shape, config.initializer_range, rng)
                    if s.path.endswith("kernel") else np.zeros(s.shape, np.float32))
  disc_abs = os.path.abspath(discriminator_dir)
  gen_abs = os.path.abspath(generator_dir) if generator_dir else None
  meta = {"converted_from": {"format": "hf",   # what loads print
                             "path": f"{disc_abs} + {gen_abs}" if gen_abs else disc_abs,
                             DISCRIMINATOR: disc_abs, GENERATOR: gen_abs},
          "ignored_variables": ignored, "initialized_randomly": [s.path for s in fresh]}
  if not generator_dir:
    meta[GENERATOR] = ("none: a discriminator imported alone; the config's generator sizes are "
                       "google-research/electra's default for it, with no parameters")
  return names.unflatten(flat), config, meta


def _truncated_normal(shape, stddev, rng):
  x = rng.standard_normal(shape)
  while (bad := np.abs(x) > 2).any():
    x[bad] = rng.standard_normal(int(bad.sum()))
  return (x * stddev).astype(np.float32)


# ----------------------------------------------------------------------------------------------
# Export.
# ----------------------------------------------------------------------------------------------
def hf_state_dicts(params, config):
  """{"discriminator": {HF name: array}, "generator": {...}} of an ElectraForPreTraining tree."""
  flat = names.flatten(params)
  out = {}
  for net, table in specs(config).items():
    for s in table:
      if s.path not in flat or tuple(np.shape(flat[s.path])) != s.shape:
        raise ConversionError(f"parameter {s.path} is missing or not of shape {s.shape}; export "
                              "needs an ElectraForPreTraining tree of this config.")
    out[net] = {s.hf: names.from_flax(s, np.asarray(flat[s.path]), "hf") for s in table}
  return out


def export_to_hf(params, config, output, *, vocab_file=None, do_lower_case=None, pad_token_id=0):
  """Writes output/discriminator (ElectraForPreTraining) and output/generator
  (ElectraForMaskedLM), each model.safetensors + config.json (+ the tokenizer files when a
  vocab_file is given), atomically. Returns output."""
  states = hf_state_dicts(params, config)
  configs = hf_config_jsons(config, pad_token_id)

  def write(tmp):
    for net in (DISCRIMINATOR, GENERATOR):
      d = os.path.join(tmp, net)
      os.makedirs(d)
      writing.save_safetensors(d, states[net])
      with open(os.path.join(d, "config.json"), "w", encoding="utf-8") as f:
        json.dump(configs[net], f, indent=2, sort_keys=True)
      if vocab_file:
        formats.write_tokenizer_files(d, vocab_file, do_lower_case,
                                      config.max_position_embeddings)

  return writing.finish_atomically(output, write)


# ----------------------------------------------------------------------------------------------
# Orbax (the checkpoints bert_jax trains from and writes).
# ----------------------------------------------------------------------------------------------
def convert_to_orbax(discriminator_dir, generator_dir, output, *, vocab_file=None,
                     do_lower_case=None):
  """A transformers pair -> an Orbax params export (checkpoint.save_params layout, the
  discriminator's vocab bundled) usable as --config.init_checkpoint of an electra-* pre-training,
  by predict, extract_features and fine-tuning. Returns meta."""
  writing.check_new_output(output)
  params, config, meta = import_with_tokenizer(f"{discriminator_dir},{generator_dir}",
                                               vocab_file=vocab_file, do_lower_case=do_lower_case)
  return writing.write_export(output, params, config, meta)


def import_with_tokenizer(path, *, vocab_file=None, do_lower_case=None):
  """import_hf of `path`: "DISC,GEN" (two folders), a pair folder (discriminator/ + generator/)
  or a discriminator folder alone, with the discriminator's tokenizer (its vocab.txt, or
  --vocab_file, and its casing) recorded as every converted export records it."""
  if "," in path and not os.path.exists(path):
    disc, gen = (p.strip() for p in path.split(",", 1))
    for d in (disc, gen):
      if not os.path.isfile(os.path.join(d, "config.json")):
        raise ConversionError(f"--input={path}: {d} is not a transformers folder (no "
                              "config.json); give DISCRIMINATOR_DIR,GENERATOR_DIR.")
  else:
    disc, gen = pair_folders(path)
  params, config, meta = import_hf(disc, gen)
  meta.update(writing.read_tokenizer_meta(disc, vocab_file, config,
                                          os.path.join(disc, "config.json"), disc,
                                          formats.read_hf(disc)[3], do_lower_case))
  meta["num_mapped"] = sum(len(t) for t in specs(config).values()) - len(
      meta["initialized_randomly"])
  return params, config, meta


def pair_folders(path):
  """(discriminator_dir, generator_dir or None) of a transformers ELECTRA at `path`: a folder
  holding discriminator/ and generator/ (what export_to_hf writes) is the pair; any other is one
  discriminator folder."""
  disc, gen = os.path.join(path, DISCRIMINATOR), os.path.join(path, GENERATOR)
  if all(os.path.isfile(os.path.join(d, "config.json")) for d in (disc, gen)):
    return disc, gen
  return path, None


def is_hf_electra(path):
  """A local transformers ELECTRA: a folder with config.json of model_type 'electra', or one
  holding discriminator/ and generator/ folders (export_to_hf's output)."""
  path = str(path)
  if "://" in path or not os.path.isdir(path):
    return False
  disc, _ = pair_folders(path)
  config = os.path.join(disc, "config.json")
  if not os.path.isfile(config):
    return False
  try:
    with open(config, encoding="utf-8") as f:
      return json.load(f).get("model_type") == "electra"
  except (OSError, ValueError):
    return False   # not readable as JSON: the BERT path reports it in one line


def convert_for_inference(path, output, *, vocab_file=None, do_lower_case=None):
  """A transformers ELECTRA (pair_folders: the pair, or a discriminator folder alone) -> an Orbax
  params export with the discriminator's vocab.txt bundled and its casing recorded, as
  bert_jax.convert.convert_to_orbax writes a BERT folder: what predict, extract_features and
  fine-tuning load (inference.from_hf_folder). Returns meta."""
  writing.check_new_output(output)
  params, config, meta = import_with_tokenizer(path, vocab_file=vocab_file,
                                               do_lower_case=do_lower_case)
  return writing.write_export(output, params, config, meta)


def export_checkpoint_to_hf(checkpoint, output, *, vocab_file=None, do_lower_case=None):
  """An Orbax export, pre-training workdir or step directory of an ELECTRA -> the two
  transformers folders (export_to_hf)."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  params, config, meta = ckpt_lib.load_params(checkpoint)
  if config.family != "electra":
    raise ConversionError(f"{checkpoint}: a {config.family} checkpoint; ELECTRA export needs an "
                          "electra-* model (python -m bert_jax.convert exports the others).")
  if do_lower_case is None:
    do_lower_case = meta.get("do_lower_case")
  return export_to_hf(params, config, output, vocab_file=vocab_file, do_lower_case=do_lower_case)
