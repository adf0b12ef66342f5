"""Shared helpers for the conversion/parity tests: random HF BERTs, a word vocab, TF checkpoints."""

import contextlib
import json
import os

import numpy as np

# A small lower-case WordPiece vocab with real words, so fill-mask prints readable tokens.
WORDS = ("the man went to store . , he bought a gallon of milk penguin are flight ##less birds "
         "she it was good day dog cat house car river city and or but in on at is".split())
SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(path, size):
  tokens = SPECIALS + WORDS
  tokens += [f"w{i}" for i in range(size - len(tokens))]
  assert len(tokens) == size, (len(tokens), size)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return tokens


@contextlib.contextmanager
def umask(mask):
  """The process umask set to `mask` in the with-block (022: every export file is then 0644;
  safetensors' own save_file writes 0600 whatever the umask)."""
  old = os.umask(mask)
  try:
    yield
  finally:
    os.umask(old)


def file_modes(directory):
  """{path under directory: permission bits} of every file below it."""
  return {os.path.relpath(os.path.join(root, f), directory):
          os.stat(os.path.join(root, f)).st_mode & 0o777
          for root, _, files in os.walk(directory) for f in files}


def hf_config(**kw):
  import transformers  # pylint: disable=g-import-not-at-top
  base = dict(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=100, max_position_embeddings=40, type_vocab_size=2)
  return transformers.BertConfig(**{**base, **kw})


def random_hf_model(config, seed=0, scale=0.2):
  """BertForPreTraining with EVERY parameter random (LayerNorm scales ~1), so a swapped bias or
  LayerNorm parameter would show up in the outputs."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  torch.manual_seed(seed)
  model = transformers.BertForPreTraining(config).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * scale + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
  return model


def save_hf(model, directory, vocab=True, do_lower_case=None):
  model.save_pretrained(directory)
  if vocab:
    write_vocab(os.path.join(directory, "vocab.txt"), model.config.vocab_size)
  if do_lower_case is not None:
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump({"do_lower_case": do_lower_case}, f)
  return directory


def batch(vocab_size, batch_size=3, seq=16, num_pred=4, seed=0):
  """Padded two-segment batch: [CLS] a [SEP] b [SEP] [PAD]..."""
  rng = np.random.default_rng(seed)
  lengths = np.array([seq, seq - 6, seq - 3])[:batch_size]
  ids = rng.integers(6, vocab_size, (batch_size, seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  segments = ((np.arange(seq)[None] >= lengths[:, None] // 2) * mask).astype(np.int32)
  ids[:, 0] = 3
  ids = ids * mask
  positions = np.stack([np.sort(rng.choice(np.arange(1, l), num_pred, replace=False))
                        for l in lengths]).astype(np.int32)
  return ids, mask, segments, positions


def hf_to_tf_variables(state_dict, with_adam=True):
  """An HF BertForPreTraining state dict -> google-research/bert TF variable names and layouts.

  Written independently of bert_jax.convert.names (from google's modeling.py /
  run_pretraining.py variable names), so the TF test checks the converter's table.
  """
  out = {}
  for name, value in state_dict.items():
    value = np.asarray(value)
    if name.startswith("cls.predictions.decoder"):
      continue  # tied: google has no separate decoder variable
    # bert.encoder.layer.0.attention.self.query.weight -> bert/encoder/layer_0/attention/...
    tf_name = name.replace("bert.encoder.layer.", "bert/encoder/layer_").replace(".", "/")
    if tf_name == "cls/predictions/bias":
      tf_name = "cls/predictions/output_bias"
    elif tf_name == "cls/seq_relationship/weight":
      tf_name = "cls/seq_relationship/output_weights"  # [2, H], same as torch
    elif tf_name == "cls/seq_relationship/bias":
      tf_name = "cls/seq_relationship/output_bias"
    elif "LayerNorm" in tf_name:
      tf_name = tf_name.replace("/weight", "/gamma").replace("/bias", "/beta")
    elif tf_name.endswith("_embeddings/weight"):
      tf_name = tf_name[:-len("/weight")]
    elif tf_name.endswith("/weight"):
      tf_name = tf_name[:-len("/weight")] + "/kernel"
      value = value.T  # torch Linear [out, in] -> tf dense kernel [in, out]
    out[tf_name] = np.ascontiguousarray(value)
  if with_adam:
    for k in list(out):
      out[k + "/adam_m"] = np.zeros_like(out[k])
      out[k + "/adam_v"] = np.ones_like(out[k])
  return out


def write_tf_checkpoint(directory, variables, config_json, with_global_step=True):
  """Saves tf.Variables with exactly these names, as google's Estimator Saver did."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  os.makedirs(directory, exist_ok=True)
  with tf.Graph().as_default():
    vs = [tf.compat.v1.Variable(v, name=n) for n, v in variables.items()]
    if with_global_step:
      vs.append(tf.compat.v1.train.get_or_create_global_step())
    saver = tf.compat.v1.train.Saver(vs)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      saver.save(sess, os.path.join(directory, "bert_model.ckpt"))
  with open(os.path.join(directory, "bert_config.json"), "w") as f:
    json.dump(config_json, f)
  return directory


def google_config_json(hf_config):
  """The bert_config.json google ships (no layer_norm_eps: modeling.py fixes it at 1e-12)."""
  keys = ("attention_probs_dropout_prob", "hidden_act", "hidden_dropout_prob", "hidden_size",
          "initializer_range", "intermediate_size", "max_position_embeddings",
          "num_attention_heads", "num_hidden_layers", "type_vocab_size", "vocab_size")
  return {k: getattr(hf_config, k) for k in keys}


def assert_trees_equal(a, b):
  """Two parameter trees with the same leaf names and bit-identical values."""
  from bert_jax.convert import names  # pylint: disable=g-import-not-at-top
  fa, fb = names.flatten(a), names.flatten(b)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
