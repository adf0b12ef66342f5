r"""sentence-transformers folders, both ways (issue 40 item 6).

  # any checkpoint here (an embedding run, a pre-training export) -> SentenceTransformer(folder)
  python -m bert_jax.convert --input=runs/embed --output=st/embed --to=sentence_transformers
  # a sentence-transformers folder -> an Orbax export whose bert_config.json records its pooling,
  # normalisation, prompts and max_seq_length ("sentence_embedding"); fine-tuning reads them
  python -m bert_jax.convert --input=st/all-MiniLM-L6-v2 --output=ckpt/minilm

The layout is what sentence-transformers 6.2 itself saves (SentenceTransformer.save, read from
its source: base/model.py, base/modules/transformer.py, sentence_transformer/modules/pooling.py):
  config.json, model.safetensors    the encoder alone, transformers' base class (BertModel,
                                    ModernBertModel: Family.hf_body), with its tokenizer files
  modules.json                      [Transformer (path ""), Pooling (1_Pooling), Normalize]
  sentence_bert_config.json         max_seq_length and the Transformer module's own keys
  1_Pooling/config.json             embedding_dimension, pooling_mode, include_prompt
  2_Normalize/config.json           (ours always compares normalised vectors)
  config_sentence_transformers.json prompts {"query", "document"} (encode_query and
                                    encode_document pick them by these names), cosine,
                                    matryoshka_dims (ours: ST itself reads truncate_dim only)
  README.md                         what was exported, the Matryoshka widths and how to use them
Pooling: our mean / cls / last are ST's "mean" / "cls" / "lasttoken" (every real token, the
specials included, as ours: both pool over the attention mask). A folder whose modules or
pooling we do not compute (Dense, max, weightedmean, ...) is one line, before any array is read.
"""

import json
import os

import numpy as np

from bert_jax import families
from bert_jax.convert import formats
from bert_jax.convert import writing
from bert_jax.convert.formats import ConversionError

MODULES = "modules.json"
OURS_TO_ST = {"mean": "mean", "cls": "cls", "last": "lasttoken"}
ST_TO_OURS = {v: k for k, v in OURS_TO_ST.items()}
# ST < 6 wrote one boolean per mode (Pooling's legacy keys; 6.x still reads them).
LEGACY_MODES = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean",
                "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean",
                "pooling_mode_lasttoken": "lasttoken"}
PROMPT_NAMES = {"query_prompt": ("query",),
                # encode_document's order of names (sentence_transformer/model.py)
                "document_prompt": ("document", "passage", "corpus")}


class SentenceTransformersError(ConversionError):
  pass


def is_st_folder(path):
  return "://" not in str(path) and os.path.isfile(os.path.join(str(path), MODULES))


# ----------------------------------------------------------------------------------------------
# sentence-transformers -> ours: the settings (the weights are the root transformers folder,
# which convert reads as any other).
# ----------------------------------------------------------------------------------------------
def _json(path, what):
  if not os.path.isfile(path):
    return None
  return formats.read_json(path, what)


def read_folder(path):
  """The "sentence_embedding" record of a sentence-transformers folder: {pooling (ours), normalize,
  query_prompt, document_prompt, prompts (all of them), max_seq_length, truncate_dim,
  similarity, matryoshka_dims}. One SentenceTransformersError line for what we do not compute."""
  modules = formats.read_json(os.path.join(path, MODULES), MODULES)
  if not isinstance(modules, list) or not modules:
    raise SentenceTransformersError(f"{path}/{MODULES}: expected a list of modules.")
  kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
  if kinds[0] != "Transformer" or modules[0].get("path", "") not in ("", "."):
    raise SentenceTransformersError(
        f"{path}/{MODULES}: the first module is {kinds[0]} at {modules[0].get('path')!r}; "
        "bert_jax reads a Transformer saved in the folder's root (path \"\").")
  extra = [f"{k} ({m.get('path')})" for k, m in zip(kinds[1:], modules[1:])
           if k not in ("Pooling", "Normalize")]
  if extra or kinds.count("Pooling") != 1:
    raise SentenceTransformersError(
        f"{path}/{MODULES}: modules {', '.join(kinds)}; bert_jax computes Transformer, Pooling "
        f"and an optional Normalize, not {', '.join(extra) or 'this pooling'}.")
  pooling_dir = modules[kinds.index("Pooling")].get("path", "1_Pooling")
  pooling = read_pooling(os.path.join(path, pooling_dir, "config.json"))
  st_config = _json(os.path.join(path, "config_sentence_transformers.json"),
                    "config_sentence_transformers.json") or {}
  prompts = {str(k): str(v) for k, v in (st_config.get("prompts") or {}).items()
             if v is not None}
  bert_config = _json(os.path.join(path, "sentence_bert_config.json"),
                      "sentence_bert_config.json") or {}
  if bert_config.get("do_lower_case"):
    raise SentenceTransformersError(
        f"{path}/sentence_bert_config.json: do_lower_case=true (sentence-transformers lowercases "
        "before its tokenizer); bert_jax takes the casing from the tokenizer files alone.")
  max_len = bert_config.get("max_seq_length")
  if max_len is None:   # 6.x keeps it in the tokenizer's model_max_length
    tok = _json(os.path.join(path, "tokenizer_config.json"), "tokenizer_config.json") or {}
    max_len = tok.get("model_max_length")
    max_len = max_len if isinstance(max_len, int) and max_len < 1_000_000 else None
  record = {"pooling": pooling, "normalize": "Normalize" in kinds, "prompts": prompts,
            "max_seq_length": max_len, "truncate_dim": st_config.get("truncate_dim"),
            "similarity": st_config.get("similarity_fn_name") or "cosine",
            "matryoshka_dims": [int(d) for d in st_config.get("matryoshka_dims") or ()],
            "default_prompt_name": st_config.get("default_prompt_name")}
  for key, names in PROMPT_NAMES.items():
    record[key] = next((prompts[n] for n in names if n in prompts), "")
  return record


def read_pooling(path):
  """Our pooling name of a Pooling module's config.json (6.x's pooling_mode, or the legacy
  booleans); one line for a mode we do not compute."""
  if not os.path.isfile(path):
    raise SentenceTransformersError(f"{path}: missing; a sentence-transformers folder's Pooling "
                                    "module keeps its config.json there.")
  c = formats.read_json(path, "the Pooling config")
  mode = c.get("pooling_mode")
  if mode is None:
    mode = [m for k, m in LEGACY_MODES.items() if c.get(k)] or ["mean"]
  modes = [mode] if isinstance(mode, str) else list(mode)
  if len(modes) != 1 or modes[0] not in ST_TO_OURS:
    raise SentenceTransformersError(
        f"{path}: pooling_mode {'+'.join(modes)}; bert_jax reads "
        + ", ".join(f"{st} (as {ours})" for st, ours in ST_TO_OURS.items()) + ".")
  if c.get("include_prompt") is False:
    raise SentenceTransformersError(
        f"{path}: include_prompt=false (the prompt's tokens left out of the pooling); bert_jax "
        "pools over every real token, the prompt's included.")
  return ST_TO_OURS[modes[0]]


def describe_record(record):
  """One line: what a folder's (or a run's) embedding settings are."""
  prompts = ", ".join(f"{k}={record.get(k)!r}" for k in PROMPT_NAMES if record.get(k))
  dims = record.get("matryoshka_dims")
  normalised = "normalised" if record.get("normalize", True) else "not normalised"
  return (f"pooling {record['pooling']}, {normalised}, max_seq_length "
          f"{record.get('max_seq_length')}"
          + (f", prompts {prompts}" if prompts else ", no prompts")
          + (f", Matryoshka {tuple(dims)}" if dims else ""))


# ----------------------------------------------------------------------------------------------
# Ours -> sentence-transformers.
# ----------------------------------------------------------------------------------------------
def check_flags_against_record(path, recorded, *, takes=None, **given):
  """The one rule of every reader of a "sentence_embedding" record (an embedding run's export, a
  sentence-transformers import: `recorded`, {} when the checkpoint has none): convert
  --to=sentence_transformers, predict embed and extract_features --pooling=mean|cls|last. A flag
  (given: its name -> value, None when not passed) that contradicts the record is one line: the
  vectors would not be the ones the model was trained to give. takes: what uses the record when
  the flag is dropped ("the export"); None where dropping it asks for something else
  (extract_features' default --pooling=concat gives no sentence vector): give the recorded value."""
  for key, value in given.items():
    was = recorded.get(key)
    if value is None or was is None or value == was:
      continue
    fix = (f"drop the flag, {takes} takes the checkpoint's" if takes else
           f"give the checkpoint's --{key}={was}")
    raise SentenceTransformersError(
        f"--{key}={value!r}: {path} was trained with {key}={was!r} (its bert_config.json "
        f"\"sentence_embedding\"); {fix}.")


def export_settings(m, *, pooling=None, query_prompt=None, document_prompt=None,
                    max_seq_length=None):
  """The settings an export writes: the checkpoint's record (an embedding run's best export, a
  sentence-transformers import) where there is one, the flags where it has none, else mean, no
  prompts and the model's max_position_embeddings. A flag that contradicts the record is one
  line: the vectors would not be the ones the model was trained to give."""
  recorded = dict(m.meta.get("sentence_embedding") or {})
  given = dict(pooling=pooling, query_prompt=query_prompt, document_prompt=document_prompt)
  check_flags_against_record(m.path, recorded, takes="the export", **given)
  out = {"pooling": "mean", "query_prompt": "", "document_prompt": ""}
  out.update({k: v for k, v in recorded.items() if k in out and v is not None})
  out.update({k: v for k, v in given.items() if v is not None})
  if out["pooling"] not in OURS_TO_ST:
    raise SentenceTransformersError(f"--pooling={out['pooling']!r}; use one of "
                                    f"{', '.join(OURS_TO_ST)}.")
  limit = m.config.max_position_embeddings
  length = max_seq_length or recorded.get("max_seq_length") or limit
  if not 2 < int(length) <= limit:
    raise SentenceTransformersError(f"--max_seq_length={length}: give 3 to the model's "
                                    f"max_position_embeddings={limit}.")
  out.update(max_seq_length=int(length), normalize=True,
             matryoshka_dims=[int(d) for d in recorded.get("matryoshka_dims") or ()])
  return out


def export(m, output, **flags):
  """A loaded inference.InferenceModel -> sentence-transformers folder `output` (atomic).
  Returns (path, settings)."""
  writing.check_new_output(output)
  settings = export_settings(m, **flags)
  family = families.get(m.config.family)
  if family.hf_body is None:
    raise SentenceTransformersError(f"a {family.display} model: no sentence-transformers export.")
  if "bert" not in m.params:
    raise SentenceTransformersError(f"{m.path}: no 'bert' parameters (top-level keys "
                                    f"{sorted(m.params)}); export needs the encoder.")
  base_class, state = family.hf_body({"bert": m.params["bert"]}, m.config)
  vocab = m.tokenizer.vocab
  ids = {r: getattr(vocab, f"{r}_id", None) for r in ("pad", "unk", "cls", "sep", "mask")}
  ids = {k: int(v) for k, v in ids.items() if v is not None}
  hf_config = family.hf_config_json(m.config, vocab.pad_id)
  hf_config["architectures"] = [base_class]

  def write(tmp):
    os.makedirs(tmp)
    writing.save_safetensors(tmp, {k: np.ascontiguousarray(v) for k, v in state.items()})
    _dump(tmp, "config.json", hf_config)
    _write_tokenizer(tmp, m, ids)
    _write_modules(tmp, settings, m.config.hidden_size)
    with open(os.path.join(tmp, "README.md"), "w", encoding="utf-8") as f:
      f.write(model_card(m, settings, base_class, output))

  return writing.finish_atomically(output, write), settings


def _dump(directory, name, content):
  os.makedirs(os.path.dirname(os.path.join(directory, name)), exist_ok=True)
  with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
    json.dump(content, f, indent=2)


def _write_tokenizer(tmp, m, ids):
  """The checkpoint's tokenizer as transformers reads it (as the family's own export writes it):
  a tokenizer.json with its special tokens, a SentencePiece model's tokenizer.json, or vocab.txt."""
  import shutil  # pylint: disable=g-import-not-at-top
  length = m.config.max_position_embeddings
  if m.tokenizer_json:
    shutil.copyfile(m.tokenizer_json, os.path.join(tmp, "tokenizer.json"))
    writing.write_tokenizer_config(tmp, dict(zip(ids, m.tokenizer.id_to_token(
        list(ids.values())))), length)
  elif m.spm_model_file:
    from bert_jax.convert import sentencepiece_export  # pylint: disable=g-import-not-at-top
    sentencepiece_export.write_tokenizer_files(tmp, m.spm_model_file, length)
  else:
    formats.write_tokenizer_files(tmp, m.vocab_file, m.do_lower_case, length)


def _write_modules(tmp, settings, hidden):
  """modules.json and each module's config, as SentenceTransformer.save writes them (6.2)."""
  base = "sentence_transformers.base.modules"
  modules = [("", f"{base}.transformer.Transformer"),
             ("1_Pooling", "sentence_transformers.sentence_transformer.modules.pooling.Pooling"),
             ("2_Normalize", f"{base}.normalize.Normalize")]
  _dump(tmp, MODULES, [{"idx": i, "name": str(i), "path": p, "type": t}
                       for i, (p, t) in enumerate(modules)])
  _dump(tmp, "sentence_bert_config.json", {
      "max_seq_length": settings["max_seq_length"],   # Transformer(max_seq_length=): truncation
      "transformer_task": "feature-extraction",
      "modality_config": {"text": {"method": "forward", "method_output_name": "last_hidden_state"}},
      "module_output_name": "token_embeddings"})
  _dump(tmp, "1_Pooling/config.json", {"embedding_dimension": hidden,
                                       "pooling_mode": OURS_TO_ST[settings["pooling"]],
                                       "include_prompt": True})
  _dump(tmp, "2_Normalize/config.json", {"module_input_name": "sentence_embedding",
                                         "module_output_name": "sentence_embedding"})
  _dump(tmp, "config_sentence_transformers.json", {
      "model_type": "SentenceTransformer",
      "prompts": {"query": settings["query_prompt"], "document": settings["document_prompt"]},
      "default_prompt_name": None, "similarity_fn_name": "cosine",
      # Not read by sentence-transformers (it reads truncate_dim, which we leave unset: the full
      # width is the default); the widths the model was trained to be cut to (README.md).
      "matryoshka_dims": settings["matryoshka_dims"]})


def model_card(m, settings, base_class, output):
  """README.md: what was exported, from where, with which settings, and how to call it."""
  dims = settings["matryoshka_dims"]
  matryoshka = (f"Trained with Matryoshka widths {dims}: "
                f"`SentenceTransformer(path, truncate_dim={min(dims)})` keeps the first "
                f"{min(dims)} dimensions (recorded as `matryoshka_dims` in "
                "config_sentence_transformers.json, which sentence-transformers does not read)."
                if dims else "No Matryoshka widths recorded: use the full width.")
  return f"""---
library_name: sentence-transformers
pipeline_tag: sentence-similarity
tags:
- sentence-transformers
- feature-extraction
---

# {os.path.basename(os.path.abspath(str(output).rstrip("/")))}

Exported by bert_jax (`python -m bert_jax.convert --to=sentence_transformers`) from
`{m.path}`: {m.config.family} encoder ({base_class}, {m.config.num_layers} layers, width
{m.config.hidden_size}), {describe_record(settings)}.

```python
from sentence_transformers import SentenceTransformer
model = SentenceTransformer("path/to/this/folder")
queries = model.encode_query(["..."])      # prompt "query": {settings["query_prompt"]!r}
documents = model.encode_document(["..."])  # prompt "document": {settings["document_prompt"]!r}
```

{matryoshka}
"""
