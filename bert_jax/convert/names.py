"""One table: every parameter of BertForPreTraining with its Hugging Face and google TF names.

Orientation conventions (the only subtle part of BERT conversion):
  * google TF dense kernels are [in, out]; the Flax kernels here are [in, out] too, except that
    q/k/v are split per head ([H, N, D], 'BTH,HND->BTND') and the attention output merges them
    ([N, D, H]). A plain reshape maps one onto the other: column n * D + d of the [H, H] kernel
    is head n, dim d, exactly the order of google's `transpose_for_scores` and HF's
    `view(B, T, N, D)`.
  * PyTorch nn.Linear weights are [out, in]: transposed.
  * google's NSP classifier `cls/seq_relationship/output_weights` is [2, H] (it is used as
    `matmul(pooled, W, transpose_b=True)`): transposed, like the HF weight.
  * LayerNorm: TF gamma/beta, HF weight/bias (old HF files: gamma/beta), Flax scale/bias.

`specs(config)` lists them; `to_flax` / `from_flax` apply the orientation; `flatten` / `unflatten`
move between the nested Flax tree and "a/b/c" paths.
"""

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Spec:
  path: str            # Flax path, "bert/encoder/layer_0/attention/query/kernel"
  hf: str              # "bert.encoder.layer.0.attention.self.query.weight"
  tf: str              # "bert/encoder/layer_0/attention/self/query/kernel"
  shape: tuple         # Flax shape
  flat: tuple          # the [in, out] (or [n]) shape before splitting heads
  hf_transposed: bool  # HF stores flat.T
  tf_transposed: bool  # TF stores flat.T

  def source_shape(self, source):
    transposed = self.hf_transposed if source == "hf" else self.tf_transposed
    return tuple(reversed(self.flat)) if transposed else tuple(self.flat)


def specs(config):
  """All parameters of BertForPreTraining(config), in a fixed order."""
  h, i, n, d = config.hidden_size, config.intermediate_size, config.num_heads, config.head_dim
  out = []

  def add(path, hf, tf, shape, flat=None, hf_t=False, tf_t=False):
    out.append(Spec(path, hf, tf, tuple(shape), tuple(flat or shape), hf_t, tf_t))

  def dense(path, hf, tf, n_in, n_out, kernel_shape=None, bias_shape=None, tf_t=False):
    add(f"{path}/kernel", f"{hf}.weight", f"{tf}/{'output_weights' if tf_t else 'kernel'}",
        kernel_shape or (n_in, n_out), (n_in, n_out), hf_t=True, tf_t=tf_t)
    add(f"{path}/bias", f"{hf}.bias", f"{tf}/{'output_bias' if tf_t else 'bias'}",
        bias_shape or (n_out,), (n_out,))

  def layer_norm(path, hf, tf):
    add(f"{path}/scale", f"{hf}.weight", f"{tf}/gamma", (h,))
    add(f"{path}/bias", f"{hf}.bias", f"{tf}/beta", (h,))

  for name, rows in [("word", config.vocab_size), ("position", config.max_position_embeddings),
                     ("token_type", config.type_vocab_size)]:
    add(f"bert/embeddings/{name}_embeddings/embedding", f"bert.embeddings.{name}_embeddings.weight",
        f"bert/embeddings/{name}_embeddings", (rows, h))
  layer_norm("bert/embeddings/layer_norm", "bert.embeddings.LayerNorm", "bert/embeddings/LayerNorm")
  for l in range(config.num_layers):
    p, hf, tf = f"bert/encoder/layer_{l}", f"bert.encoder.layer.{l}", f"bert/encoder/layer_{l}"
    for m in ("query", "key", "value"):
      dense(f"{p}/attention/{m}", f"{hf}.attention.self.{m}", f"{tf}/attention/self/{m}", h, h,
            kernel_shape=(h, n, d), bias_shape=(n, d))
    add(f"{p}/attention/output/kernel", f"{hf}.attention.output.dense.weight",
        f"{tf}/attention/output/dense/kernel", (n, d, h), (h, h), hf_t=True)
    add(f"{p}/attention/output/bias", f"{hf}.attention.output.dense.bias",
        f"{tf}/attention/output/dense/bias", (h,))
    layer_norm(f"{p}/attention_layer_norm", f"{hf}.attention.output.LayerNorm",
               f"{tf}/attention/output/LayerNorm")
    dense(f"{p}/intermediate", f"{hf}.intermediate.dense", f"{tf}/intermediate/dense", h, i)
    dense(f"{p}/output", f"{hf}.output.dense", f"{tf}/output/dense", i, h)
    layer_norm(f"{p}/output_layer_norm", f"{hf}.output.LayerNorm", f"{tf}/output/LayerNorm")
  dense("bert/pooler", "bert.pooler.dense", "bert/pooler/dense", h, h)
  dense("mlm_head/transform", "cls.predictions.transform.dense",
        "cls/predictions/transform/dense", h, h)
  layer_norm("mlm_head/transform_layer_norm", "cls.predictions.transform.LayerNorm",
             "cls/predictions/transform/LayerNorm")
  add("mlm_head/output_bias", "cls.predictions.bias", "cls/predictions/output_bias",
      (config.vocab_size,))
  dense("nsp_head", "cls.seq_relationship", "cls/seq_relationship", h, 2, tf_t=True)
  return out


def to_flax(spec, array, source):
  """A source ("hf" or "tf") array in its own orientation -> the Flax array."""
  transposed = spec.hf_transposed if source == "hf" else spec.tf_transposed
  array = np.asarray(array)
  return (array.T if transposed else array).reshape(spec.shape)


def from_flax(spec, array, source):
  transposed = spec.hf_transposed if source == "hf" else spec.tf_transposed
  flat = np.asarray(array).reshape(spec.flat)
  return np.ascontiguousarray(flat.T) if transposed else flat


def flatten(tree, prefix=""):
  """{"a": {"b": x}} -> {"a/b": x}."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}/"))
    else:
      out[f"{prefix}{k}"] = v
  return out


def unflatten(flat):
  tree = {}
  for path, v in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = v
  return tree
