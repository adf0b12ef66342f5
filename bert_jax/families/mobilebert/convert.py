"""MobileBERT's name table and configs: transformers' MobileBertForPreTraining /
MobileBertForMaskedLM / MobileBertModel folders <-> MobileBertForPreTraining(family="mobilebert")
(bert_jax/families/mobilebert/layers.py), through the one-folder import and export of
convert/__init__.py (vocab.txt and casing as BERT's).

  python -m bert_jax.convert --input=HF_MOBILEBERT_DIR --output=ckpt/mobilebert   # <- transformers
  python -m bert_jax.convert --input=WORKDIR --output=hf/mobilebert              # -> transformers

The network's module names are transformers' (layer_{i} for layer.{i}, ffn_{j} for ffn.{j}), so
the table is a rename of the model's own parameter paths (read from its shapes, nothing built):

  ours (Flax)                                  transformers
  bert/embeddings/word_embeddings/embedding    mobilebert.embeddings.word_embeddings.weight
  bert/embeddings/LayerNorm/{scale,bias}       mobilebert.embeddings.LayerNorm.{weight,bias}
  bert/encoder... bert/layer_{i}/attention/self/query/kernel [in, out]
                                               mobilebert.encoder.layer.{i}.attention.self.
                                                 query.weight [out, in]
  bert/pooler/{kernel,bias}                    mobilebert.pooler.dense.{weight,bias}
  mlm_head/transform/*, transform_layer_norm   cls.predictions.transform.{dense,LayerNorm}.*
  mlm_head/dense [H - E, V]                    cls.predictions.dense.weight [H - E, V] (as is)
  mlm_head/output_bias [V]                     cls.predictions.bias (= decoder.bias)
  nsp_head/{kernel,bias}                       cls.seq_relationship.{weight,bias}

The decoder weight is tied to the word table (checked equal when a file carries it); NoNorm's
weight is our scale. No google TF MobileBERT checkpoints are read (transformers folders only).
"""

import re

from bert_jax.models import model as model_lib
from bert_jax.convert import names
from bert_jax.convert.formats import ConversionError

# transformers' ACT2FN names -> ours (MobileBERT is relu).
_HF_ACT = {"relu": "relu", "gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh":
           "gelu_tanh"}
# MobileBertConfig keys -> ours, besides the BERT ones below.
_OWN = ("embedding_size", "trigram_input", "use_bottleneck", "intra_bottleneck_size",
        "use_bottleneck_attention", "key_query_shared_bottleneck", "num_feedforward_networks",
        "normalization_type", "classifier_activation")
_BERT = {"vocab_size": "vocab_size", "hidden_size": "hidden_size",
         "num_hidden_layers": "num_layers", "num_attention_heads": "num_heads",
         "intermediate_size": "intermediate_size", "hidden_dropout_prob": "hidden_dropout_prob",
         "attention_probs_dropout_prob": "attention_dropout_prob",
         "max_position_embeddings": "max_position_embeddings",
         "type_vocab_size": "type_vocab_size", "initializer_range": "initializer_range",
         "layer_norm_eps": "layer_norm_eps"}
# transformers' MobileBertConfig defaults, for keys a config.json leaves out.
_DEFAULTS = dict(vocab_size=30_522, hidden_size=512, num_hidden_layers=24, num_attention_heads=4,
                 intermediate_size=512, hidden_dropout_prob=0.0,
                 attention_probs_dropout_prob=0.1, max_position_embeddings=512,
                 type_vocab_size=2, initializer_range=0.02, layer_norm_eps=1e-12,
                 embedding_size=128, trigram_input=True, use_bottleneck=True,
                 intra_bottleneck_size=128, use_bottleneck_attention=False,
                 key_query_shared_bottleneck=True, num_feedforward_networks=4,
                 normalization_type="no_norm", classifier_activation=True)


def config_from_json(d, path, kind="hf"):
  """(MobileBertConfig, numerics) from a transformers MobileBertConfig dict."""
  if kind != "hf" or d.get("model_type") != "mobilebert":
    raise ConversionError(f"{path}: model_type={d.get('model_type')!r}; MobileBERT converts from "
                          "transformers folders of model_type 'mobilebert' only.")
  if d.get("tie_word_embeddings") is False:
    raise ConversionError(f"{path}: tie_word_embeddings=false; MobileBERT's MLM decoder is the "
                          "word table (widened by cls.predictions.dense), tied.")
  act = d.get("hidden_act", "relu")
  if act not in _HF_ACT:
    raise ConversionError(f"{path}: hidden_act={act!r}; one of {sorted(_HF_ACT)}.")
  kw = {ours: d.get(k, _DEFAULTS[k]) for k, ours in _BERT.items()}
  kw.update({k: d.get(k, _DEFAULTS[k]) for k in _OWN})
  try:
    config = model_lib.get_bert_config("mobilebert", **kw, hidden_act=_HF_ACT[act])
  except (TypeError, ValueError) as e:
    raise ConversionError(f"{path}: {e}") from e
  numerics = {"hidden_act": config.hidden_act, "hidden_act_source": act,
              "hidden_act_note": f"transformers ACT2FN[{act!r}]",
              "layer_norm_eps": config.layer_norm_eps}
  return config, numerics


def hf_config_json(config, pad_token_id=0):
  """transformers' MobileBertConfig (config.json) of a MobileBertConfig."""
  act = {v: k for k, v in _HF_ACT.items() if k not in ("gelu_new",)}[config.hidden_act]
  mlm_only = config.sentence_objective is None
  out = {"architectures": ["MobileBertForMaskedLM" if mlm_only else "MobileBertForPreTraining"],
         "model_type": "mobilebert", "hidden_act": act, "pad_token_id": pad_token_id,
         "tie_word_embeddings": True, "dtype": "float32",
         "true_hidden_size": config.true_hidden_size}
  out.update({k: getattr(config, ours) for k, ours in _BERT.items()})
  out.update({k: getattr(config, k) for k in _OWN})
  return out


def _hf_name(path):
  """Our flat parameter path -> transformers' state-dict name."""
  for ours, hf in (("bert/pooler/", "mobilebert.pooler.dense/"),
                   ("mlm_head/transform_layer_norm/", "cls.predictions.transform.LayerNorm/"),
                   ("mlm_head/transform/", "cls.predictions.transform.dense/"),
                   ("mlm_head/output_bias", "cls.predictions.bias"),
                   ("mlm_head/dense", "cls.predictions.dense/weight"),
                   ("nsp_head/", "cls.seq_relationship/"),
                   ("bert/layer_", "mobilebert/encoder/layer_"), ("bert/", "mobilebert/")):
    if path.startswith(ours):
      path = hf + path[len(ours):]
      break
  path = re.sub(r"(layer|ffn)_(\d+)", r"\1.\2", path)
  *parents, leaf = path.split("/")
  leaf = {"kernel": "weight", "scale": "weight", "embedding": "weight"}.get(leaf, leaf)
  return ".".join(parents + [leaf])


def specs(config):
  """Every parameter of MobileBertForPreTraining(config) with its transformers name, read from
  the model's abstract init (jax.eval_shape: shapes only)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.families.mobilebert import layers as mobilebert_layers  # pylint: disable=g-import-not-at-top
  if config.family != "mobilebert":
    raise ConversionError(f"MobileBERT conversion needs family='mobilebert'; this model has "
                          f"family={config.family!r}.")
  ids = jnp.zeros((1, 4), jnp.int32)
  shapes = jax.eval_shape(lambda: mobilebert_layers.MobileBertForPreTraining(config).init(
      jax.random.PRNGKey(0), ids, ids, ids, ids[:, :1]))["params"]
  out = []
  for path, s in names.flatten(nn.meta.unbox(shapes)).items():
    shape = tuple(s.shape)
    transposed = path.endswith("/kernel")   # torch Linear [out, in]; mlm_head/dense as is
    out.append(names.Spec(path, _hf_name(path), "", shape, shape, transposed, False))
  return out


def normalise_hf_names(source):
  """transformers' MobileBERT names onto the table's: a bare MobileBertModel's (no
  "mobilebert." prefix) get it; the decoder's weight and bias are ties (checked equal) to the
  word table and cls.predictions.bias (formats.read_hf named BERT's word table as the first
  one's target)."""
  renamed, ignored, tied = {}, {}, {}
  for name in source.shapes:
    # read_hf gave a bare model's names BERT's "bert." prefix
    renamed[f"mobilebert.{name[5:]}" if name.startswith("bert.") else name] = name
  for name, (target, get) in source.tied.items():
    if name.endswith("decoder.weight"):
      tied[name] = ("mobilebert.embeddings.word_embeddings.weight", get)
    else:
      tied[name] = (target, get)
  out = type(source)({n: source.shapes[o] for n, o in renamed.items()},
                     lambda n: source.get(renamed[n]), source.files)
  out.tied = tied
  return out, ignored
