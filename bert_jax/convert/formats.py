"""Readers and writers: google TF checkpoints, Hugging Face directories, configs, vocab and casing.

Nothing here writes an output directory itself; `bert_jax.convert` composes these and renames a
finished temp directory into place.
"""

import glob
import json
import os

import numpy as np

from bert_jax.models import model as model_lib
from bert_jax_core import errors


class ConversionError(errors.UserError):
  """A one-line, actionable problem with the conversion input."""


# ----------------------------------------------------------------------------------------------
# Model configs: google's bert_config.json and HF's config.json share their field names.
# ----------------------------------------------------------------------------------------------
_FIELDS = {  # json key -> BertConfig field
    "vocab_size": "vocab_size", "hidden_size": "hidden_size",
    "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "type_vocab_size": "type_vocab_size",
}
_OPTIONAL = {"hidden_dropout_prob": "hidden_dropout_prob",
             "attention_probs_dropout_prob": "attention_dropout_prob",
             "initializer_range": "initializer_range", "layer_norm_eps": "layer_norm_eps"}
# HF ACT2FN names -> ours. gelu_new / gelu_pytorch_tanh / gelu_fast / gelu_python_tanh are all
# 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))), jax.nn.gelu(approximate=True).
_HF_ACT = {"gelu": "gelu", "gelu_python": "gelu", "gelu_new": "gelu_tanh",
           "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "gelu_python_tanh": "gelu_tanh", "relu": "relu"}
# google-research/bert modeling.py `gelu()` is the tanh approximation (the repo switched from
# erf to tanh after the first release); HF's converter maps the same config string to erf GELU.
# The two differ by at most 4.7e-4 per activation (at x = 2.70); --gelu picks either.
TF_GELU_NOTE = ("google-research/bert modeling.py gelu() is the tanh approximation "
                "(HF's converter uses erf GELU for the same checkpoints)")
ATTENTION_MASK_NOTE = (
    "padding keys: logits replaced by -0.7*float32.max (jax.nn.dot_product_attention); "
    "google-research/bert adds -10000.0, HF adds finfo.min: identical softmax in float32 since "
    "[CLS] is never masked")


def read_json(path, what):
  if not os.path.isfile(path):
    raise ConversionError(f"{what}: {path} not found.")
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except (ValueError, UnicodeDecodeError) as e:
    raise ConversionError(f"{what}: {path} is not valid JSON ({e}).") from e


def bert_config_from_json(d, path, source, gelu="auto"):
  """(BertConfig, numerics dict) from a google bert_config.json or an HF config.json."""
  missing = [k for k in _FIELDS if k not in d]
  if missing:
    raise ConversionError(f"{path}: missing key {missing[0]!r} (needs {sorted(_FIELDS)}).")
  if d.get("model_type", "bert") != "bert":
    raise ConversionError(f"{path}: model_type={d['model_type']!r}; only BERT checkpoints "
                          "(model_type 'bert') can be converted.")
  if d.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"{path}: position_embedding_type={d['position_embedding_type']!r}; "
                          "only 'absolute' (BERT's learned positions) is supported.")
  if d.get("is_decoder") or d.get("add_cross_attention"):
    raise ConversionError(f"{path}: is_decoder/add_cross_attention set; only the BERT "
                          "encoder is supported.")
  if source == "hf" and d.get("tie_word_embeddings") is False:
    raise ConversionError(f"{path}: tie_word_embeddings=false; this model ties the MLM decoder "
                          "to the word embeddings, as BERT does.")
  kw = {ours: d[k] for k, ours in _FIELDS.items()}
  kw.update({ours: d[k] for k, ours in _OPTIONAL.items() if d.get(k) is not None})
  act = d.get("hidden_act", "gelu")
  if source == "tf":
    if act not in ("gelu", "relu"):
      raise ConversionError(f"{path}: hidden_act={act!r}; google-research/bert knows "
                            "'gelu' and 'relu'.")
    ours, note = ("gelu_tanh", TF_GELU_NOTE) if act == "gelu" else ("relu", "relu")
    # tf.contrib.layers.layer_norm, used by modeling.py, hard-codes variance_epsilon=1e-12.
    kw["layer_norm_eps"] = 1e-12
  else:
    if act not in _HF_ACT:
      raise ConversionError(f"{path}: hidden_act={act!r} is not supported; use one of "
                            f"{sorted(_HF_ACT)}.")
    ours, note = _HF_ACT[act], f"transformers ACT2FN[{act!r}]"
  if gelu != "auto":
    if ours == "relu":
      raise ConversionError(f"--gelu={gelu}: the checkpoint uses relu, not GELU.")
    note = f"--gelu={gelu} (the source implementation uses {ours}: {note})"
    ours = gelu
  kw["hidden_act"] = ours
  try:
    config = model_lib.BertConfig(**kw)
  except (TypeError, ValueError) as e:
    raise ConversionError(f"{path}: {e}") from e
  numerics = {"hidden_act": ours, "hidden_act_source": act, "hidden_act_note": note,
              "layer_norm_eps": config.layer_norm_eps, "attention_mask": ATTENTION_MASK_NOTE}
  return config, numerics


def hf_config_json(config, pad_token_id=0):
  """The transformers BertConfig of a BertConfig (what from_pretrained reads)."""
  act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[config.hidden_act]
  return {
      "architectures": ["BertForPreTraining"], "model_type": "bert",
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size, "hidden_act": act,
      "hidden_dropout_prob": config.hidden_dropout_prob,
      "attention_probs_dropout_prob": config.attention_dropout_prob,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size, "initializer_range": config.initializer_range,
      "layer_norm_eps": config.layer_norm_eps, "pad_token_id": pad_token_id,
      "position_embedding_type": "absolute", "tie_word_embeddings": True,
      "dtype": "float32",
  }


# ----------------------------------------------------------------------------------------------
# Vocab and casing (google-research/bert `validate_case_matches_checkpoint`, generalised).
# ----------------------------------------------------------------------------------------------
def read_vocab(path, flag="--vocab_file"):
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  try:
    # convert has no --tokenizer_json: a family that reads one takes it by --vocab_file.
    return vocab_lib.load_wordpiece_vocab(path, flag, json_flag="")
  except vocab_lib.VocabError as e:
    raise ConversionError(str(e)) from e


def wordpiece_of_tokenizer_json(path):
  """(tokens by id, lowercase) of a BERT WordPiece tokenizer.json (transformers' BertTokenizerFast
  file: WordPiece model "##", BertNormalizer, BertPreTokenizer), which google-research/bert's
  tokenizer given that vocab.txt and casing reproduces (BertNormalizer's strip_accents null follows
  lowercase, as do_lower_case's accent stripping). Any other tokenizer.json is one line."""
  spec = read_json(path, path)
  model = spec.get("model") if isinstance(spec, dict) else None
  norm = spec.get("normalizer") if isinstance(spec, dict) else None
  pre = spec.get("pre_tokenizer") if isinstance(spec, dict) else None
  kind = model.get("type") if isinstance(model, dict) else None
  if (kind != "WordPiece" or model.get("continuing_subword_prefix", "##") != "##"
      or not isinstance(norm, dict) or norm.get("type") != "BertNormalizer"
      or not isinstance(pre, dict) or pre.get("type") != "BertPreTokenizer"
      or norm.get("strip_accents") not in (None, norm.get("lowercase"))):
    raise ConversionError(
        f"{path}: a {kind} tokenizer.json with normalizer "
        f"{(norm or {}).get('type')} and pre-tokenizer {(pre or {}).get('type')}; a BERT "
        "checkpoint reads a WordPiece vocab: pass its vocab.txt with --vocab_file.")
  vocab = model.get("vocab") or {}
  tokens = [None] * len(vocab)
  for token, i in vocab.items():
    if not (isinstance(i, int) and 0 <= i < len(tokens)) or tokens[i] is not None:
      raise ConversionError(f"{path}: model.vocab id {i!r} of {token!r} is not one of 0..{len(tokens) - 1} "
                            "once; pass the checkpoint's vocab.txt with --vocab_file.")
    tokens[i] = token
  return tokens, bool(norm.get("lowercase", True))


def check_vocab_size(tokens, config, vocab_file, config_file):
  if len(tokens) != config.vocab_size:
    raise ConversionError(
        f"{vocab_file} has {len(tokens)} tokens but {config_file} gives vocab_size="
        f"{config.vocab_size}; pass the vocab.txt that belongs to this checkpoint.")


def infer_casing(path, tokens, recorded=None):
  """(do_lower_case or None, how it was inferred); `recorded` = (value, where) wins."""
  if recorded is not None and recorded[0] is not None:
    return bool(recorded[0]), recorded[1]
  # google's released names, then pieces that lower-casing would change (upper-case letters,
  # and whole Hangul syllables: a Hangul-only vocab has no upper-case piece yet is cased).
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  return vocab_lib.infer_wordpiece_casing(tokens, path)


def resolve_casing(requested, inferred, how, flag="--do_lower_case"):
  """The casing to use; a one-line error when the request contradicts the checkpoint."""
  if requested is None:
    return True if inferred is None else inferred
  if inferred is not None and bool(requested) != inferred:
    kind = "uncased (lower-cased)" if inferred else "cased"
    raise ConversionError(f"{flag}={bool(requested)} but the checkpoint is {kind} ({how}); "
                          f"pass {flag}={inferred} or use a matching checkpoint.")
  return bool(requested)


def check_casing(meta, do_lower_case, what="--do_lower_case"):
  """For fine-tuning: the requested casing must be the checkpoint's (when it records one)."""
  stored = meta.get("do_lower_case")
  if stored is not None and bool(do_lower_case) != bool(stored):
    raise ConversionError(f"{what}={bool(do_lower_case)} but the checkpoint was trained with "
                          f"do_lower_case={bool(stored)}; set {what}={bool(stored)}.")


# ----------------------------------------------------------------------------------------------
# Sources: name -> shape, and a getter. Arrays are read lazily, one at a time.
# ----------------------------------------------------------------------------------------------
class Source:

  def __init__(self, shapes, get, files):
    self.shapes = dict(shapes)   # name -> tuple
    self.get = get               # name -> np.ndarray
    self.files = list(files)
    self.tied = {}               # HF only: name -> (name it must equal, getter)


def find_tf_checkpoint(path):
  """A checkpoint prefix from a directory (google's `bert_model.ckpt`) or a prefix."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  if os.path.isdir(path):
    latest = tf.train.latest_checkpoint(path)
    if latest:
      return latest
    indexes = sorted(glob.glob(os.path.join(path, "*.index")))
    if len(indexes) != 1:
      raise ConversionError(f"{path}: expected one TF checkpoint (*.index), found "
                            f"{len(indexes)}; pass the prefix, e.g. {path}/bert_model.ckpt.")
    return indexes[0][:-len(".index")]
  if not os.path.isfile(path + ".index"):
    raise ConversionError(f"{path}: no TF checkpoint ({path}.index not found).")
  return path


def read_tf(prefix):
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  try:
    reader = tf.train.load_checkpoint(prefix)
  except tf.errors.OpError as e:  # DataLossError, NotFoundError, ... for corrupt files
    raise ConversionError(f"{prefix}: cannot read the TF checkpoint "
                          f"({str(e).splitlines()[0]}).") from e
  shapes = {k: tuple(v) for k, v in reader.get_variable_to_shape_map().items()}
  return Source(shapes, reader.get_tensor, glob.glob(prefix + ".*"))


# Optimizer state and bookkeeping in google's (and NVIDIA's) TF checkpoints.
_TF_SLOTS = ("adam_m", "adam_v", "Adam", "Adam_1", "LAMB", "LAMB_1", "Momentum")
_TF_BOOKKEEPING = ("global_step", "loss_scale", "good_steps", "current_loss_scale",
                   "_CHECKPOINTABLE_OBJECT_GRAPH")


def tf_ignored(name):
  """Why a TF variable is skipped ("optimizer slot", ...), or None when it must be mapped."""
  if name.rsplit("/", 1)[-1] in _TF_SLOTS:
    return "optimizer slot"
  if name in _TF_BOOKKEEPING or name.rsplit("/", 1)[-1] in _TF_BOOKKEEPING:
    return "training state"
  return None


def read_hf(path):
  """(config.json dict, Source with normalised names, ignored {name: why}, tokenizer config)."""
  if not os.path.isdir(path):
    raise ConversionError(f"{path}: not a directory (expected config.json and model.safetensors "
                          "or pytorch_model.bin).")
  config = read_json(os.path.join(path, "config.json"), "Hugging Face config")
  single = os.path.join(path, "model.safetensors")
  index = os.path.join(path, "model.safetensors.index.json")
  binary = os.path.join(path, "pytorch_model.bin")
  if os.path.isfile(single) or os.path.isfile(index):
    files = ([single] if os.path.isfile(single) else
             sorted({os.path.join(path, f)
                     for f in read_json(index, "safetensors index")["weight_map"].values()}))
    shapes, where = {}, {}
    from safetensors import SafetensorError, safe_open  # pylint: disable=g-import-not-at-top
    for f in files:
      try:
        with safe_open(f, framework="numpy") as st:
          for k in st.keys():
            shapes[k] = tuple(st.get_slice(k).get_shape())
            where[k] = f
      except (SafetensorError, OSError) as e:  # a corrupt header, or an unreadable file
        raise ConversionError(f"{f}: cannot read safetensors ({e}).") from e

    def get(name):
      with safe_open(where[name], framework="numpy") as st:
        return st.get_tensor(name)
    raw = Source(shapes, get, files)
  elif os.path.isfile(binary):
    try:
      import torch  # pylint: disable=g-import-not-at-top
    except ImportError as e:
      raise ConversionError(f"{binary}: reading pytorch_model.bin needs torch (pip install "
                            "torch), or save the model as model.safetensors.") from e
    state = torch.load(binary, map_location="cpu", weights_only=True)
    arrays = {k: v.float().numpy() if v.is_floating_point() else v.numpy()
              for k, v in state.items()}
    raw = Source({k: tuple(v.shape) for k, v in arrays.items()}, arrays.__getitem__, [binary])
  else:
    raise ConversionError(f"{path}: no model.safetensors, model.safetensors.index.json or "
                          "pytorch_model.bin.")
  tok_path = os.path.join(path, "tokenizer_config.json")
  tokenizer_config = read_json(tok_path, "tokenizer config") if os.path.isfile(tok_path) else None
  source, ignored = _normalise_hf(raw)
  return config, source, ignored, tokenizer_config


def _normalise_hf(raw):
  """Maps every HF layout onto BertForPreTraining names ("bert." prefix, weight/bias)."""
  names = list(raw.shapes)
  if not any(n.startswith("bert.") for n in names):  # a bare BertModel
    names_map = {(f"bert.{n}" if n.split(".")[0] in ("embeddings", "encoder", "pooler")
                  else n): n for n in names}
  else:
    names_map = {n: n for n in names}
  renamed, ignored, tied = {}, {}, {}
  for new, old in names_map.items():
    if "LayerNorm." in new:  # checkpoints saved by old transformers use gamma/beta
      new = new.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta",
                                                                       "LayerNorm.bias")
    if new.endswith("embeddings.position_ids"):
      ignored[old] = "buffer (position ids)"
      continue
    if new == "cls.predictions.decoder.weight":
      ignored[old] = "tied to the word embeddings (checked equal)"
      tied[old] = "bert.embeddings.word_embeddings.weight"
      continue
    if new == "cls.predictions.decoder.bias":
      if "cls.predictions.bias" in names_map:
        ignored[old] = "alias of cls.predictions.bias (checked equal)"
        tied[old] = "cls.predictions.bias"
        continue
      new = "cls.predictions.bias"
    renamed[new] = old
  shapes = {new: raw.shapes[old] for new, old in renamed.items()}
  source = Source(shapes, lambda n: raw.get(renamed[n]), raw.files)
  # tied: {HF name: the normalised name it must equal}, checked by the converter.
  source.tied = {old: (target, raw.get) for old, target in tied.items()}
  return source, ignored


def write_tokenizer_files(directory, vocab_file, do_lower_case, max_length):
  """vocab.txt + tokenizer_config.json + special_tokens_map.json for transformers' BertTokenizer."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  with tf.io.gfile.GFile(vocab_file, "rb") as src, \
      open(os.path.join(directory, "vocab.txt"), "wb") as dst:  # vocab_file may be on gs://
    dst.write(src.read())
  special = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]",
             "cls_token": "[CLS]", "mask_token": "[MASK]"}
  tok = {"tokenizer_class": "BertTokenizer", "do_lower_case": bool(do_lower_case),
         "tokenize_chinese_chars": True, "strip_accents": None,
         "model_max_length": int(max_length), **special}
  for name, content in [("tokenizer_config.json", tok), ("special_tokens_map.json", special)]:
    with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
      json.dump(content, f, indent=2)


def as_float32(array, name, casts):
  array = np.asarray(array)
  if array.dtype != np.float32:
    casts[name] = str(array.dtype)
    array = array.astype(np.float32)
  return array
