"""ModernBERT <-> transformers: ModernBertForMaskedLM (or a bare ModernBertModel) from and to a
BertForPreTraining tree of family "modernbert" (families/modernbert/ holds the name table in
its docstring; model.py's modern fields build it).

  python -m bert_jax.convert --input=HF_DIR --output=ckpt/modernbert     # <- transformers
  python -m bert_jax.convert --input=WORKDIR --output=hf/modernbert      # -> transformers
  python -m bert_jax.convert --input=FINETUNE_WORKDIR --output=hf/sst2   # ModernBertFor
      # SequenceClassification / MultipleChoice / TokenClassification / QuestionAnswering
      # by the run's task type (fine_tuned_task)

Orientations: torch Linear weights are [out, in]; ours are [in, out] (transposed). Wqkv
[3H, H] is q, k, v stacked (qkv.view(..., 3, N, D) in ModernBertAttention), each [H = N x D, H]:
our query/key/value kernels [H, N, D] are its thirds transposed and split by head; Wo [H, H]
is our output kernel [N, D, H] transposed. Layer 0 has no attn_norm (transformers' Identity after
the normalised embedding), as ours. The decoder weight is tied to the word embeddings (checked
equal when a file carries it). The tokenizer is the folder's tokenizer.json (byte-level BPE),
its special ids read from it (data_pipelines/tokenizers/tokenizer_json.py), bundled into the export.
"""

import dataclasses
import json
import os
import re

import numpy as np

from bert_jax.models import model as model_lib
from bert_jax import tasks as task_types
from bert_jax.convert import formats
from bert_jax.convert import writing
from bert_jax.convert.formats import ConversionError

TOKENIZER = "tokenizer.json"
# transformers' activation names <-> our hidden_act (ModernBERT uses "gelu", exact).
_ACTIVATIONS = {"gelu": "gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh"}


# ----------------------------------------------------------------------------------------------
# Configs.
# ----------------------------------------------------------------------------------------------
def _thetas(d):
  """(global, local) RoPE theta of a ModernBertConfig dict: transformers 5's rope_parameters,
  else 4's global_rope_theta / local_rope_theta, else the defaults (160,000 / 10,000)."""
  rope = d.get("rope_parameters") or {}
  full, sliding = rope.get("full_attention") or {}, rope.get("sliding_attention") or {}
  return (float(full.get("rope_theta", d.get("global_rope_theta", 160_000.0))),
          float(sliding.get("rope_theta", d.get("local_rope_theta", 10_000.0))))


def config_from_json(d, path):
  """A modernbert BertConfig from a ModernBertConfig dict (one-line errors naming the field)."""
  def need(key, value, why):
    if d.get(key, value) != value:
      raise ConversionError(f"{path}: {key}={d.get(key)!r}; bert_jax reads ModernBERT with "
                            f"{key}={value!r} ({why}).")
  if d.get("model_type") != "modernbert":
    raise ConversionError(f"{path}: model_type={d.get('model_type')!r}; expected 'modernbert'.")
  biases = {k: bool(d.get(k, False)) for k in ("attention_bias", "mlp_bias", "classifier_bias")}
  if len(set(biases.values())) > 1:
    raise ConversionError(f"{path}: {biases}; bert_jax's use_bias is one switch for all three.")
  need("decoder_bias", True, "the MLM decoder's bias, output_bias here")
  need("tie_word_embeddings", True, "the decoder tied to the word embeddings")
  act = d.get("hidden_activation", "gelu")
  if act not in _ACTIVATIONS:
    raise ConversionError(f"{path}: hidden_activation={act!r}; one of {sorted(_ACTIVATIONS)}.")
  need("classifier_activation", act, "the MLM transform's activation is hidden_activation")
  layers = d["num_hidden_layers"]
  every = d.get("global_attn_every_n_layers", 3)
  types = d.get("layer_types")
  if types:   # transformers 5 stores the pattern: read every from it, then check it
    every = next((i for i, t in enumerate(types) if i and t == "full_attention"), layers) or 1
    expected = ["full_attention" if i % every == 0 else "sliding_attention"
                for i in range(layers)]
    if list(types) != expected:
      raise ConversionError(f"{path}: layer_types {types} is not 'global every n-th layer' "
                            "(layers 0, n, 2n, ... global), the only pattern bert_jax has.")
  theta_global, theta_local = _thetas(d)
  positions = d.get("max_position_embeddings", 8192)
  try:
    return model_lib.BertConfig(
        family="modernbert", objectives="mlm", type_vocab_size=0, position_embedding="rope",
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"], num_layers=layers,
        num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
        hidden_act=_ACTIVATIONS[act], max_position_embeddings=positions,
        layer_norm_eps=d.get("norm_eps", 1e-5), initializer_range=d.get("initializer_range", 0.02),
        hidden_dropout_prob=float(d.get("mlp_dropout", 0.0)),
        attention_dropout_prob=float(d.get("attention_dropout", 0.0)),
        rope_theta_global=theta_global, rope_theta_local=theta_local,
        local_window=_local_window(d.get("local_attention", 128), positions) if every > 1
        else 0, global_every=every,
        ffn="geglu", norm="layer_norm" if d.get("norm_bias", False) else "layer_norm_no_bias",
        prenorm=True, use_bias=biases["attention_bias"])
  except KeyError as e:
    raise ConversionError(f"{path}: no {e}; a ModernBertConfig needs vocab_size, hidden_size, "
                          "num_hidden_layers, num_attention_heads, intermediate_size.") from e
  except ValueError as e:   # a value our BertConfig refuses: name the file's key beside ours
    field = re.match(r"BertConfig: (\w+)=", str(e))
    key = field and _HF_KEYS.get(field.group(1))
    raise ConversionError(f"{path}: {e}" + (f" ({field.group(1)} is this file's {key})" if key
                                            else "")) from e


# Our BertConfig fields a ModernBertConfig's key gives (the others have the same name).
_HF_KEYS = {"num_layers": "num_hidden_layers", "num_heads": "num_attention_heads",
            "local_window": "local_attention", "global_every": "global_attn_every_n_layers",
            "layer_norm_eps": "norm_eps", "rope_theta_global": "rope_parameters.full_attention",
            "rope_theta_local": "rope_parameters.sliding_attention"}


def _local_window(local_attention, positions):
  """Our local_window of transformers' local_attention, as transformers computes it: a local
  layer sees |i - j| <= local_attention // 2 (ModernBertConfig.sliding_window), and no row of
  `positions` tokens has keys farther than positions - 1, so a wider window (local_attention
  2,048 at max_position_embeddings 1,024, which transformers loads and runs) is the window that
  sees every key, 2 (positions - 1); its layers keep the local RoPE theta."""
  return 2 * min(int(local_attention) // 2, positions - 1)


def hf_config_json(config, pad_token_id=0, special_ids=None):
  """transformers' ModernBertConfig (ModernBertForMaskedLM's config.json) of a BertConfig."""
  if config.family != "modernbert" or config.ffn != "geglu" or not config.embedding_norm:
    raise ConversionError(f"a {config.family} model with ffn={config.ffn!r}, embedding_norm="
                          f"{config.embedding_norm}; transformers' ModernBERT is GeGLU with a "
                          "normalised embedding (NeoBERT is not in transformers).")
  act = {v: k for k, v in _ACTIVATIONS.items() if k != "gelu_new"}[config.hidden_act]
  every = config.global_every if config.local_window else config.num_layers + 1
  ids = special_ids or {}
  return {
      "architectures": ["ModernBertForMaskedLM"], "model_type": "modernbert",
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "num_hidden_layers": config.num_layers, "num_attention_heads": config.num_heads,
      "intermediate_size": config.intermediate_size, "hidden_activation": act,
      "classifier_activation": act, "max_position_embeddings": config.max_position_embeddings,
      "initializer_range": config.initializer_range, "norm_eps": config.layer_norm_eps,
      "norm_bias": config.norm == "layer_norm", "attention_bias": config.use_bias,
      "mlp_bias": config.use_bias, "classifier_bias": config.use_bias, "decoder_bias": True,
      "attention_dropout": config.attention_dropout_prob, "mlp_dropout": config.hidden_dropout_prob,
      "embedding_dropout": 0.0, "classifier_dropout": 0.0,
      "local_attention": config.local_window or config.max_position_embeddings,
      "layer_types": ["full_attention" if i % every == 0 else "sliding_attention"
                      for i in range(config.num_layers)],
      "rope_parameters": {
          "full_attention": {"rope_type": "default", "rope_theta": config.rope_theta_global},
          "sliding_attention": {"rope_type": "default", "rope_theta": config.rope_theta_local}},
      # transformers 4.x's names for the same (it ignores rope_parameters and layer_types and
      # would take its defaults, 160,000 and every 3rd layer: a first-phase model at 10,000
      # would load silently wrong there); 5.x reads rope_parameters first, pops these.
      "global_rope_theta": config.rope_theta_global, "local_rope_theta": config.rope_theta_local,
      "global_attn_every_n_layers": every,
      "pad_token_id": pad_token_id, "cls_token_id": ids.get("cls"), "sep_token_id": ids.get("sep"),
      "bos_token_id": ids.get("cls"), "eos_token_id": ids.get("sep"),
      "tie_word_embeddings": True, "dtype": "float32"}


# ----------------------------------------------------------------------------------------------
# The name table: (our path, HF name, to ours, to HF) per tensor.
# ----------------------------------------------------------------------------------------------
def _pairs(config, head="mlm"):
  """[(our path, HF name)] of every plain tensor (transposed when 2-D): the body, then the MLM
  head (head="mlm") or a fine-tuned head ([CLS] or token, head="cls": ModernBertPredictionHead +
  the classifier, which has a bias whatever classifier_bias says: nn.Linear's default); head=None:
  the body alone (ModernBertModel's tensors under "model.")."""
  b = "bert"
  out = [(f"{b}/embeddings/word_embeddings/embedding", "model.embeddings.tok_embeddings.weight")]
  norm = lambda ours, hf: [(f"{ours}/scale", f"{hf}.weight")] + (
      [(f"{ours}/bias", f"{hf}.bias")] if config.norm == "layer_norm" else [])
  linear = lambda ours, hf: [(f"{ours}/kernel", f"{hf}.weight")] + (
      [(f"{ours}/bias", f"{hf}.bias")] if config.use_bias else [])
  out += norm(f"{b}/embeddings/layer_norm", "model.embeddings.norm")
  for i in range(config.num_layers):
    p, hf = f"{b}/encoder/layer_{i}", f"model.layers.{i}"
    if i:
      out += norm(f"{p}/attention_layer_norm", f"{hf}.attn_norm")
    out += norm(f"{p}/output_layer_norm", f"{hf}.mlp_norm")
    out += linear(f"{p}/mlp/Wi", f"{hf}.mlp.Wi") + linear(f"{p}/mlp/Wo", f"{hf}.mlp.Wo")
  out += norm(f"{b}/encoder/final_norm", "model.final_norm")
  if head is None:
    return out
  if head == "cls":
    return out + linear("head/dense", "head.dense") + norm("head/norm", "head.norm") + [
        ("classifier/kernel", "classifier.weight"), ("classifier/bias", "classifier.bias")]
  out += linear("mlm_head/transform", "head.dense")
  out += norm("mlm_head/transform_layer_norm", "head.norm")
  out += [("mlm_head/output_bias", "decoder.bias")]
  return out


def _to_ours(name, array):
  return array.T if array.ndim == 2 and not name.endswith("embeddings.weight") else array


def hf_state_dict(params, config, head="mlm"):
  """{transformers name: array} of a modernbert tree: BertForPreTraining's (head="mlm":
  ModernBertForMaskedLM), a fine-tuned head's (head="cls": every ModernBertFor* task class,
  the same names) or the body alone (head=None: ModernBertModel's, under "model.")."""
  flat = _flatten(params)
  h, n, d = config.hidden_size, config.num_heads, config.head_dim
  out = {}
  for ours, hf in _pairs(config, head):
    if ours not in flat:
      need = {"mlm": "bert, mlm_head", "cls": "bert, head, classifier", None: "bert"}[head]
      raise ConversionError(f"parameter {ours} is missing; export needs a ModernBERT tree "
                            f"({need}) of this config.")
    out[hf] = np.ascontiguousarray(_to_ours(hf, np.asarray(flat[ours], np.float32)))
  for i in range(config.num_layers):
    p, hf = f"bert/encoder/layer_{i}/attention", f"model.layers.{i}.attn"
    qkv = [np.asarray(flat[f"{p}/{m}/kernel"], np.float32).reshape(h, h).T
           for m in ("query", "key", "value")]                          # [H(out), H(in)] each
    out[f"{hf}.Wqkv.weight"] = np.ascontiguousarray(np.concatenate(qkv, 0))  # [3H, H]
    out[f"{hf}.Wo.weight"] = np.ascontiguousarray(
        np.asarray(flat[f"{p}/output/kernel"], np.float32).reshape(n * d, h).T)
    if config.use_bias:
      out[f"{hf}.Wqkv.bias"] = np.concatenate(
          [np.asarray(flat[f"{p}/{m}/bias"], np.float32).reshape(h)
           for m in ("query", "key", "value")])
      out[f"{hf}.Wo.bias"] = np.asarray(flat[f"{p}/output/bias"], np.float32)
  return out


def _flatten(params):
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  return {"/".join(k): v for k, v in
          traverse_util.flatten_dict(nn.meta.unbox(params)).items()}


# ----------------------------------------------------------------------------------------------
# transformers -> ours.
# ----------------------------------------------------------------------------------------------
def import_hf(path, vocab_file=None, do_lower_case=None):
  """(params tree, BertConfig, meta) from a ModernBertForMaskedLM / ModernBertModel folder with
  its tokenizer.json."""
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  from safetensors import safe_open  # pylint: disable=g-import-not-at-top
  config_file = os.path.join(path, "config.json")
  config = config_from_json(formats.read_json(config_file, "Hugging Face config"), config_file)
  weights = os.path.join(path, "model.safetensors")
  if not os.path.isfile(weights):
    raise ConversionError(f"{path}: no model.safetensors (save the model with "
                          "save_pretrained(..., safe_serialization=True)).")
  tokenizer_meta = _tokenizer_meta(path, vocab_file, do_lower_case, config)
  with safe_open(weights, framework="numpy") as st:
    raw = {k: st.get_tensor(k) for k in st.keys()}
  if not any(k.startswith("model.") for k in raw):   # a bare ModernBertModel
    raw = {f"model.{k}": v for k, v in raw.items()}
  casts, flat, used = {}, {}, set()

  def get(name, shape):
    if name not in raw:
      return None
    a = formats.as_float32(raw[name], name, casts)
    if a.shape != shape:
      raise ConversionError(f"{path}: variable {name} has shape {a.shape} but {config_file} "
                            f"gives {shape}.")
    used.add(name)
    return a

  h, n, d = config.hidden_size, config.num_heads, config.head_dim
  shapes = _hf_shapes(config)
  missing = []
  for ours, hf in _pairs(config):
    a = get(hf, shapes[hf])
    if a is None:
      missing.append((ours, hf))
      continue
    flat[ours] = _to_ours(hf, a)
  for i in range(config.num_layers):
    p, hf = f"bert/encoder/layer_{i}/attention", f"model.layers.{i}.attn"
    wqkv, wo = get(f"{hf}.Wqkv.weight", (3 * h, h)), get(f"{hf}.Wo.weight", (h, h))
    if wqkv is None or wo is None:
      raise ConversionError(f"{path}: variable {hf}.Wqkv/Wo.weight is missing; "
                            "num_hidden_layers or the layout does not match.")
    for j, m in enumerate(("query", "key", "value")):
      flat[f"{p}/{m}/kernel"] = wqkv[j * h:(j + 1) * h].T.reshape(h, n, d)   # [H, N, D]
      if config.use_bias:
        flat[f"{p}/{m}/bias"] = get(f"{hf}.Wqkv.bias", (3 * h,))[j * h:(j + 1) * h].reshape(n, d)
    flat[f"{p}/output/kernel"] = wo.T.reshape(n, d, h)                          # [N, D, H]
    if config.use_bias:
      flat[f"{p}/output/bias"] = get(f"{hf}.Wo.bias", (h,))
  body = [hf for ours, hf in missing if not ours.startswith("mlm_head/")]
  if body:
    raise ConversionError(f"{path}: variable {body[0]} is missing ({len(body)} missing); "
                          "the config and the weights do not match.")
  initialized = []
  if missing:   # a bare ModernBertModel: the MLM head as model.py initialises it
    rng = np.random.default_rng(0)
    for ours, hf in missing:
      spec = _Spec(ours, tuple(reversed(shapes[hf])) if len(shapes[hf]) == 2 else shapes[hf])
      flat[ours] = writing.fresh_param(spec, config.initializer_range, rng)
      initialized.append(ours)
  ignored = {}
  if "decoder.weight" in raw:
    if not np.array_equal(raw["decoder.weight"], raw["model.embeddings.tok_embeddings.weight"]):
      raise ConversionError(f"{path}: decoder.weight differs from the word embeddings; "
                            "ModernBERT ties its decoder to them.")
    used.add("decoder.weight")
    ignored["decoder.weight"] = "tied to the word embeddings (checked equal)"
  extra = sorted(set(raw) - used)
  if extra:
    raise ConversionError(f"{path}: variable {extra[0]} (shape {raw[extra[0]].shape}) has no "
                          "place in ModernBertForMaskedLM (a fine-tuned head?).")
  meta = {"converted_from": {"format": "hf", "path": os.path.abspath(path),
                             "files": [os.path.basename(weights)]},
          **tokenizer_meta, "ignored_variables": ignored, "initialized_randomly": initialized,
          "num_mapped": len(used) - len(ignored)}
  if casts:
    meta["cast_to_float32_from"] = casts
  params = traverse_util.unflatten_dict({tuple(k.split("/")): v for k, v in flat.items()})
  return params, config, meta


@dataclasses.dataclass
class _Spec:   # what writing.fresh_param reads
  path: str
  shape: tuple


def _hf_shapes(config):
  h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
  shapes = {}
  for ours, hf in _pairs(config):
    leaf = ours.rsplit("/", 1)[1]
    if ours.endswith("word_embeddings/embedding"):
      shapes[hf] = (v, h)
    elif ours == "mlm_head/output_bias":
      shapes[hf] = (v,)
    elif leaf == "kernel":
      shapes[hf] = {"Wi": (2 * i, h), "Wo": (h, i)}.get(ours.split("/")[-2], (h, h))
    elif leaf == "bias":
      shapes[hf] = {"Wi": (2 * i,)}.get(ours.split("/")[-2], (h,))
    else:
      shapes[hf] = (h,)
  return shapes


def _tokenizer_meta(path, vocab_file, do_lower_case, config):
  """The folder's tokenizer.json (or --vocab_file naming one): its special ids, size (at most
  the model's vocab_size: ModernBERT pads 50,280 tokens to 50,368 rows) and casing."""
  from data_pipelines.tokenizers import tokenizer_json  # pylint: disable=g-import-not-at-top
  tok = vocab_file or os.path.join(path, TOKENIZER)
  if not os.path.isfile(tok) and os.path.isfile(os.path.join(path, "tokenizer.model")):
    raise ConversionError(f"{path}: a SentencePiece tokenizer.model but no {TOKENIZER} (a Gemma "
                          "or mmBERT folder saved without it); write it with transformers: "
                          "AutoTokenizer.from_pretrained(folder).save_pretrained(folder).")
  if not os.path.isfile(tok):
    raise ConversionError(f"{path}: a transformers ModernBERT folder without its {TOKENIZER}; "
                          "save the tokenizer into it too (tokenizer.save_pretrained(folder)), "
                          "or pass --vocab_file=TOKENIZER_JSON.")
  try:
    info = tokenizer_json.info(tok, flag="--vocab_file" if vocab_file else "tokenizer")
    lower, how = tokenizer_json.lower_case(tok)
  except tokenizer_json.TokenizerJsonError as e:
    raise ConversionError(str(e)) from None
  if info.size > config.vocab_size:
    raise ConversionError(f"{tok} has {info.size} ids but {path}/config.json gives vocab_size="
                          f"{config.vocab_size}; pass the tokenizer of this checkpoint.")
  if do_lower_case is not None and do_lower_case != lower:
    raise ConversionError(f"--do_lower_case={do_lower_case} but {tok}: {how}; the tokenizer's "
                          "normalizer decides the casing (leave the flag out).")
  framing = _framing(tok, info)
  return {"_vocab_path": tok, "tokenizer_json": TOKENIZER, "vocab_size": info.size,
          "do_lower_case": lower, "casing_inferred_from": f"{TOKENIZER}: {how}",
          "special_ids": {r: int(getattr(info, f"{r}_id"))
                          for r in ("pad", "unk", "cls", "sep", "mask")},
          **({"tokenizer_framing": framing} if framing else {})}


def _framing(tok, info):
  """None when the file's post-processor frames one text as we do ([cls] $A [sep]: records,
  predict, fine-tuning), else a line saying how it differs. Gemma's own file frames "<bos> $A"
  (a decoder's), an mmBERT-style one "<bos> $A <eos>" as here; the weights convert either way,
  but a model trained on another frame is given ids here that transformers' tokenizer(text)
  would not give it, so the conversion says so (convert.summary prints it) and goes on."""
  with open(tok, encoding="utf-8") as f:
    post = json.load(f).get("post_processor") or {}
  if post.get("type") != "TemplateProcessing":
    return None   # none (nothing added), or BERT/RoBERTa processors: cls ... sep
  ids = {t: (v.get("ids") or [None])[0] for t, v in (post.get("special_tokens") or {}).items()}
  frame = [ids.get(next(iter(p.values()))["id"]) if "SpecialToken" in p else "$A"
           for p in post.get("single") or []]
  if frame == [info.cls_id, "$A", info.sep_id]:
    return None
  shown = " ".join(p if p == "$A" else f"id {p}" for p in frame)
  return (f"{TOKENIZER} frames one text as '{shown}' but bert_jax frames it [cls] $A [sep] "
          f"(ids {info.cls_id} ... {info.sep_id}): the model is given ids transformers' "
          "tokenizer(text) does not give it")


# ----------------------------------------------------------------------------------------------
# ours -> transformers.
# ----------------------------------------------------------------------------------------------
def export_to_hf(params, config, output, *, tokenizer_file=None, special_ids=None,
                 vocab_file=None, do_lower_case=None, special_tokens=None, task=None):
  """output/{model.safetensors, config.json} + the tokenizer, atomically: its tokenizer.json with
  a tokenizer_config.json naming the special tokens (special_tokens: role -> text, "[MASK]"...:
  without it transformers' AutoTokenizer has no mask_token and fill-mask fails), or (a model
  pre-trained here on a WordPiece vocab) vocab.txt + BertTokenizer's config files. task (a
  FineTuned, from fine_tuned_task): the fine-tuned head's class instead of the MLM's."""
  import shutil  # pylint: disable=g-import-not-at-top
  ids = special_ids or {}
  state = hf_state_dict(params, config, "cls" if task else "mlm")
  config_json = hf_config_json(config, ids.get("pad", 0), ids)
  if task:
    config_json.update(task.config_fields())

  def write(tmp):
    os.makedirs(tmp)
    writing.save_safetensors(tmp, state)
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(config_json, f, indent=2, sort_keys=True)
    if tokenizer_file:
      shutil.copyfile(tokenizer_file, os.path.join(tmp, TOKENIZER))
      writing.write_tokenizer_config(tmp, special_tokens or {}, config.max_position_embeddings)
    elif vocab_file:
      formats.write_tokenizer_files(tmp, vocab_file, do_lower_case,
                                    config.max_position_embeddings)

  return writing.finish_atomically(output, write)


def export_model(m, output):
  """A loaded inference.InferenceModel -> transformers folder (the family's export_hf hook): a
  pre-training tree as ModernBertForMaskedLM, a fine-tuned one as its task's class."""
  task = fine_tuned_task(m.params, m.meta, m.path)
  tokenizer_file = m.tokenizer_json   # a converted (or tokenizer.json-trained) ModernBERT
  vocab = m.tokenizer.vocab
  ids = {r: getattr(vocab, f"{r}_id", None) for r in ("pad", "unk", "cls", "sep", "mask")}
  ids = {k: int(v) for k, v in ids.items() if v is not None}
  return export_to_hf(m.params, m.config, output, tokenizer_file=tokenizer_file,
                      special_ids=ids,
                      special_tokens=dict(zip(ids, m.tokenizer.id_to_token(list(ids.values())))),
                      vocab_file=None if tokenizer_file else m.vocab_file,
                      do_lower_case=m.do_lower_case, task=task)


# ----------------------------------------------------------------------------------------------
# A fine-tuned tree (bert_jax.finetune: heads.py with families/modernbert's cls_logits and
# token_logits) -> the transformers class that computes the same logits. transformers'
# ModernBertFor* all read the last hidden state through ModernBertPredictionHead (dense H -> H,
# act, norm) then a classifier nn.Linear with a bias, classifier_dropout 0.0 as ours; the [CLS]
# classes with classifier_pooling "cls" (position 0; MultipleChoice: the first unpadded
# position, also 0 for our right-padded rows), the token classes on every position.
#   task type        our tree (all: bert, head/{dense,norm})   transformers
#   classification   classifier [H, L] on [CLS]                  ModernBertForSequenceClassification
#   regression       the same, L = 1                             the same, problem_type regression
#   multiple_choice  the same, L = 1, each choice's [CLS]        ModernBertForMultipleChoice
#   tagging          classifier [H, L] on every position         ModernBertForTokenClassification
#   span             classifier [H, 2] on every position         ModernBertForQuestionAnswering
# The trees are alike, so the run's record names the type: best_epoch{N}'s task_type (task_family
# in exports written before bert_jax/tasks), else its registered task's, else (a custom task
# exported before either was recorded, when ModernBERT token heads had no `head`) glue's by the
# number of outputs. Each task type declares its class's suffix (TaskType.hf_head).
# ----------------------------------------------------------------------------------------------


@dataclasses.dataclass
class FineTuned:
  type: str          # the task type's name (bert_jax/tasks/<type>.py)
  name: str          # the task's name (sst2, swag, a custom task's), "" if not recorded
  num_labels: int    # the classifier's outputs: L, 1 for regression and multiple choice, 2 span
  labels: tuple      # the label names in class order (finetune records them), or ()

  def config_fields(self):
    """What config.json adds to ModernBertConfig for this head."""
    tt = task_types.get(self.type)
    named = tt.hf_named_labels and len(self.labels) == self.num_labels
    names = self.labels if named else tuple(f"LABEL_{i}" for i in range(self.num_labels))
    fields = {"architectures": [f"ModernBertFor{tt.hf_head}"], "classifier_pooling": "cls",
              "id2label": {str(i): str(t) for i, t in enumerate(names)},
              "label2id": {str(t): i for i, t in enumerate(names)}}
    if tt.hf_problem_type:   # its loss picks MSE / cross-entropy
      fields["problem_type"] = tt.hf_problem_type
    return fields


def fine_tuned_task(params, meta, where):
  """FineTuned for a fine-tuned ModernBERT tree, None for a pre-training one (bert, mlm_head);
  one ConversionError line for a tree no transformers class computes."""
  keys = set(params)
  if "mlm_head" in keys:
    return None
  name = str(meta.get("task") or "")
  if keys in ({"bert", "classifier"}, {"bert", "qa_outputs"}):
    raise ConversionError(
        f"{where}: a fine-tuned ModernBERT token head without `head` (task "
        f"{name or 'not recorded'}): a bert_jax tagging/SQuAD head from before transformers' "
        "ModernBertPredictionHead was added, which no transformers class computes; fine-tune "
        "again (the head is now transformers') or predict with bert_jax.finetune "
        "--config.do_predict.")
  if keys != {"bert", "head", "classifier"}:
    raise ConversionError(f"{where}: parameters {sorted(keys)}; a ModernBERT export reads a "
                          "pre-training tree (bert, mlm_head) or a fine-tuned head's "
                          "(bert, head, classifier).")
  num_labels = int(np.shape(_flatten(params["classifier"])["kernel"])[-1])   # kernel [H, L]
  kind = task_types.recorded_type(meta)
  if kind is None:
    named = task_types.named_tasks()   # swag is L = 1 too; a custom task (not named) is glue's
    kind = named[name].type if name in named else (
        "classification" if num_labels > 1 else "regression")
  exported = {n: task_types.get(n) for n in task_types.names() if task_types.get(n).hf_head}
  fixed = exported[kind].hf_num_labels if kind in exported else None
  if kind not in exported or fixed not in (None, num_labels):
    raise ConversionError(
        f"{where}: task {name!r} ({kind}) with a head of {num_labels} outputs; expected one of "
        + ", ".join(f"{n} ({t.hf_num_labels})" if t.hf_num_labels else n
                    for n, t in sorted(exported.items())) + ".")
  return FineTuned(kind, name, num_labels, tuple(meta.get("labels") or ()))
