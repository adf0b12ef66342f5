"""ALBERT's name table and configs: transformers' AlbertForPreTraining / AlbertModel and
google-research/albert TF checkpoints <-> BertForPreTraining(family="albert").

Both sources hold one shared layer (num_hidden_groups = inner_group_num = 1, every released
ALBERT), which is share_layers="all" here:

  ours (Flax)                         transformers                         google-research/albert
  bert/embeddings/word_embeddings     albert.embeddings.word_embeddings    bert/embeddings/word_embeddings
  bert/embeddings/projection [E, H]   albert.encoder.embedding_hidden_     bert/encoder/embedding_hidden_
                                        mapping_in                           mapping_in
  bert/encoder/layer_shared/          albert.encoder.albert_layer_groups.  bert/encoder/transformer/
    attention/{query,key,value}         0.albert_layers.0.attention.*        group_0/inner_group_0/
    attention/output                    ... .attention.dense                 attention_1/{self/*,output/dense}
    attention_layer_norm                ... .attention.LayerNorm             LayerNorm
    intermediate, output                ... .ffn, .ffn_output                ffn_1/intermediate/dense,
                                                                             ffn_1/intermediate/output/dense
    output_layer_norm                   ... .full_layer_layer_norm           LayerNorm_1
  mlm_head/transform [H, E]           predictions.dense                    cls/predictions/transform/dense
  sop_head [H, 2]                     sop_classifier.classifier            cls/seq_relationship

The orientation rules are BERT's (names.py): Flax/TF kernels [in, out], torch Linear [out, in],
q/k/v split per head by a reshape, TF's seq_relationship/output_weights stored [2, H].
"""

from bert_jax.models import model as model_lib
from bert_jax.convert import names
from bert_jax.convert.formats import ConversionError

# HF ACT2FN names -> ours; google-research/albert's modeling.py gelu() is the tanh form too.
_HF_ACT = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu_fast": "gelu_tanh",
           "gelu": "gelu", "relu": "relu"}


def specs(config):
  """All parameters of BertForPreTraining(config) for an ALBERT config, in a fixed order."""
  if config.family != "albert" or config.share_layers != "all":
    raise ConversionError(f"ALBERT conversion needs family='albert', share_layers='all' (one "
                          "shared layer, as every released ALBERT); this model has "
                          f"family={config.family!r}, share_layers={config.share_layers!r}.")
  h, e, i = config.hidden_size, config.embed_dim, config.intermediate_size
  n, d = config.num_heads, config.head_dim
  out = []

  def add(path, hf, tf, shape, flat=None, hf_t=False, tf_t=False):
    out.append(names.Spec(path, hf, tf, tuple(shape), tuple(flat or shape), hf_t, tf_t))

  def dense(path, hf, tf, n_in, n_out, kernel_shape=None, bias_shape=None, tf_t=False):
    add(f"{path}/kernel", f"{hf}.weight", f"{tf}/{'output_weights' if tf_t else 'kernel'}",
        kernel_shape or (n_in, n_out), (n_in, n_out), hf_t=True, tf_t=tf_t)
    add(f"{path}/bias", f"{hf}.bias", f"{tf}/{'output_bias' if tf_t else 'bias'}",
        bias_shape or (n_out,), (n_out,))

  def layer_norm(path, hf, tf, width):
    add(f"{path}/scale", f"{hf}.weight", f"{tf}/gamma", (width,))
    add(f"{path}/bias", f"{hf}.bias", f"{tf}/beta", (width,))

  for name, rows in [("word", config.vocab_size), ("position", config.max_position_embeddings),
                     ("token_type", config.type_vocab_size)]:
    add(f"bert/embeddings/{name}_embeddings/embedding",
        f"albert.embeddings.{name}_embeddings.weight", f"bert/embeddings/{name}_embeddings",
        (rows, e))
  layer_norm("bert/embeddings/layer_norm", "albert.embeddings.LayerNorm",
             "bert/embeddings/LayerNorm", e)
  dense("bert/embeddings/projection", "albert.encoder.embedding_hidden_mapping_in",
        "bert/encoder/embedding_hidden_mapping_in", e, h)
  p = "bert/encoder/layer_shared"
  hf = "albert.encoder.albert_layer_groups.0.albert_layers.0"
  tf = "bert/encoder/transformer/group_0/inner_group_0"
  for m in ("query", "key", "value"):
    dense(f"{p}/attention/{m}", f"{hf}.attention.{m}", f"{tf}/attention_1/self/{m}", h, h,
          kernel_shape=(h, n, d), bias_shape=(n, d))
  add(f"{p}/attention/output/kernel", f"{hf}.attention.dense.weight",
      f"{tf}/attention_1/output/dense/kernel", (n, d, h), (h, h), hf_t=True)
  add(f"{p}/attention/output/bias", f"{hf}.attention.dense.bias",
      f"{tf}/attention_1/output/dense/bias", (h,))
  layer_norm(f"{p}/attention_layer_norm", f"{hf}.attention.LayerNorm", f"{tf}/LayerNorm", h)
  dense(f"{p}/intermediate", f"{hf}.ffn", f"{tf}/ffn_1/intermediate/dense", h, i)
  dense(f"{p}/output", f"{hf}.ffn_output", f"{tf}/ffn_1/intermediate/output/dense", i, h)
  layer_norm(f"{p}/output_layer_norm", f"{hf}.full_layer_layer_norm", f"{tf}/LayerNorm_1", h)
  dense("bert/pooler", "albert.pooler", "bert/pooler/dense", h, h)
  dense("mlm_head/transform", "predictions.dense", "cls/predictions/transform/dense", h, e)
  layer_norm("mlm_head/transform_layer_norm", "predictions.LayerNorm",
             "cls/predictions/transform/LayerNorm", e)
  add("mlm_head/output_bias", "predictions.bias", "cls/predictions/output_bias",
      (config.vocab_size,))
  dense("sop_head", "sop_classifier.classifier", "cls/seq_relationship", h, 2, tf_t=True)
  return out


def normalise_hf_names(source):
  """transformers' AlbertModel (no "albert." prefix; read_hf prefixes a bare model's
  embeddings/encoder/pooler with "bert.") and AlbertForPreTraining/AlbertForMaskedLM names ->
  the table's. Returns (renamed source, ignored {name: why}); the tied decoder is checked."""
  renamed, ignored, tied = {}, {}, {}
  for name in source.shapes:
    new = "albert." + name[len("bert."):] if name.startswith("bert.") else name
    if new.endswith("embeddings.position_ids"):
      ignored[name] = "buffer (position ids)"
    elif new == "predictions.decoder.weight":
      ignored[name] = "tied to the word embeddings (checked equal)"
      tied[name] = "albert.embeddings.word_embeddings.weight"
    elif new == "predictions.decoder.bias":
      ignored[name] = "alias of predictions.bias (checked equal)"
      tied[name] = "predictions.bias"
    else:
      renamed[new] = name
  get = source.get
  out = type(source)({new: source.shapes[old] for new, old in renamed.items()},
                     lambda n: get(renamed[n]), source.files)
  out.tied = {old: (target, lambda n, g=get: g(n)) for old, target in tied.items()}
  return out, ignored


def config_from_json(d, path, source):
  """(BertConfig family="albert", numerics) from transformers' config.json or google's
  albert_config.json (same keys)."""
  keys = ("vocab_size", "embedding_size", "hidden_size", "num_hidden_layers",
          "num_attention_heads", "intermediate_size", "max_position_embeddings")
  missing = [k for k in keys if k not in d]
  if missing:
    raise ConversionError(f"{path}: missing key {missing[0]!r} (an ALBERT config needs "
                          f"{list(keys)}).")
  groups = (d.get("num_hidden_groups", 1), d.get("inner_group_num", 1))
  if groups != (1, 1):
    raise ConversionError(f"{path}: num_hidden_groups={groups[0]}, inner_group_num={groups[1]}; "
                          "only one shared layer (1, 1), as every released ALBERT, is supported.")
  if d.get("position_embedding_type", "absolute") != "absolute":
    raise ConversionError(f"{path}: position_embedding_type={d['position_embedding_type']!r}; "
                          "only 'absolute' is supported.")
  act = d.get("hidden_act", "gelu_new")
  if source == "tf":   # google-research/albert modeling.py: "gelu" is its tanh gelu()
    ours = {"gelu": "gelu_tanh", "relu": "relu"}.get(act)
  else:
    ours = _HF_ACT.get(act)
  if ours is None:
    raise ConversionError(f"{path}: hidden_act={act!r} is not supported ({source}); use one of "
                          f"{sorted(_HF_ACT)}.")
  kw = dict(family="albert", share_layers="all", objectives="mlm,sop",
            vocab_size=d["vocab_size"], embedding_size=d["embedding_size"],
            hidden_size=d["hidden_size"], num_layers=d["num_hidden_layers"],
            num_heads=d["num_attention_heads"], intermediate_size=d["intermediate_size"],
            max_position_embeddings=d["max_position_embeddings"],
            type_vocab_size=d.get("type_vocab_size", 2), hidden_act=ours,
            hidden_dropout_prob=d.get("hidden_dropout_prob", 0.0),
            attention_dropout_prob=d.get("attention_probs_dropout_prob", 0.0),
            initializer_range=d.get("initializer_range", 0.02),
            layer_norm_eps=1e-12 if source == "tf" else d.get("layer_norm_eps", 1e-12))
  try:
    config = model_lib.BertConfig(**kw)
  except (TypeError, ValueError) as e:
    raise ConversionError(f"{path}: {e}") from e
  numerics = {"hidden_act": ours, "hidden_act_source": act,
              "hidden_act_note": f"{'google-research/albert' if source == 'tf' else 'transformers'}"
                                 f" {act!r}", "layer_norm_eps": config.layer_norm_eps}
  return config, numerics


def hf_config_json(config, pad_token_id=0):
  """transformers' AlbertConfig of an ALBERT BertConfig."""
  specs(config)  # one-line error for a layout transformers cannot hold
  act = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu"}[config.hidden_act]
  return {
      "architectures": ["AlbertForPreTraining"], "model_type": "albert",
      "vocab_size": config.vocab_size, "embedding_size": config.embed_dim,
      "hidden_size": config.hidden_size, "num_hidden_layers": config.num_layers,
      "num_hidden_groups": 1, "inner_group_num": 1,
      "num_attention_heads": config.num_heads, "intermediate_size": config.intermediate_size,
      "hidden_act": act, "hidden_dropout_prob": config.hidden_dropout_prob,
      "attention_probs_dropout_prob": config.attention_dropout_prob,
      "classifier_dropout_prob": 0.1,
      "max_position_embeddings": config.max_position_embeddings,
      "type_vocab_size": config.type_vocab_size, "initializer_range": config.initializer_range,
      "layer_norm_eps": config.layer_norm_eps, "pad_token_id": pad_token_id,
      "position_embedding_type": "absolute", "tie_word_embeddings": True, "dtype": "float32",
  }
