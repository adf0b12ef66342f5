"""The `neobert` preset against NeoBERT's reference code (Le Breton et al. 2025, arXiv 2502.19587;
github.com/chandar-lab/NeoBERT, src/neobert/model/model.py: NeoBERTLMHead).

  1. Parameter count from the reference's shapes (its 172-tensor state dict: 4 + 6 x 28), by
     hand, equal to our abstract init's (jax.eval_shape, no compile): 245,136,954, of which
     221,665,536 the encoder and 23,471,418 NeoBERTLMHead's untied decoder [V, H] + bias [V].
  2. Parity of our encoder and MLM logits with the reference model.py run in PyTorch (CPU) at a
     tiny shape, random weights mapped across. The reference is read from a copy of the repo
     (NEOBERT_REPO: a checkout or its git dir; default the `fetch` mirror below) and imported
     with two stand-ins for packages it imports but this path does not use: xformers.ops
     (SwiGLU, xformers 0.0.28's packed-w12 module, written out below from its _ordered_params +
     swiglu: silu(x w1^T) * (x w2^T) w3^T with [w1; w2] = w12; memory_efficient_attention, only
     behind flash_attention=True, here False: torch SDPA) and datasets (MTEB's encode only).
     Without a copy of the repo the parity test is skipped and says so.

The weight map (`to_ours`) is what a NeoBERT converter does:
  model.encoder.weight [V, H]                    bert/embeddings/word_embeddings/embedding
  transformer_encoder.{i}.qkv.weight [3H, H]     layer_{i}/attention/{query,key,value}/kernel
      rows n*3D + s*D + d (qkv(x).view(B, T, N, 3D).chunk(3): q, k, v per head, not all q
      first); q and k channels reordered 0, 2, 4, .., 1, 3, ..: NeoBERT's RoPE turns adjacent
      pairs (view_as_complex, Meta's Llama), ours (c, c + D/2) (rotate_half), and q.k is
      unchanged by one permutation of both (as transformers' Llama conversion permutes).
  transformer_encoder.{i}.wo.weight [H, H]       layer_{i}/attention/output/kernel [N, D, H]
  transformer_encoder.{i}.ffn.w12 / w3           layer_{i}/mlp/Wi [H, 2I] / Wo [I, H] (.T)
  transformer_encoder.{i}.{attention,ffn}_norm   layer_{i}/{attention,output}_layer_norm/scale
  model.layer_norm.weight                        bert/encoder/final_norm/scale
  decoder.weight [V, H], decoder.bias [V]        mlm_head/decoder [V, H], mlm_head/output_bias
"""

import dataclasses
import importlib
import math
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax.layers import modern_layers
from bert_jax.convert import formats
from bert_jax.families import modernbert as family

MIRROR = "/work/.mirror/chandar-lab+NeoBERT/repo"   # where the `fetch` tool puts the repo
SOURCES = ("model.py", "rmsnorm.py", "rotary.py")   # of src/neobert/model/


def reference_shapes(h=768, layers=28, heads=12, intermediate=3072, vocab=30522):
  """NeoBERTLMHead's state dict {name: shape} from its config (the released config.json:
  hidden 768, 28 layers, 12 heads, intermediate_size 3,072, vocab 30,522), written from
  model.py: EncoderBlock's Linear(H, 3H) qkv and Linear(H, H) wo (bias=False), xformers
  SwiGLU(H, I, H, bias=False) with I = 8 ceil(int(2 x 3,072 / 3) / 8) = 2,048 (w12 [2I, H],
  w3 [H, I]), two RMSNorms; NeoBERT's Embedding(V, H) and final RMSNorm; NeoBERTLMHead's
  nn.Linear(H, V) (bias=True: torch's default)."""
  assert h % heads == 0
  i = 8 * ((int(2 * intermediate / 3) + 8 - 1) // 8)                      # model.py's rounding
  shapes = {"model.encoder.weight": (vocab, h), "model.layer_norm.weight": (h,),
            "decoder.weight": (vocab, h), "decoder.bias": (vocab,)}
  for n in range(layers):
    p = f"model.transformer_encoder.{n}"
    shapes.update({f"{p}.qkv.weight": (3 * h, h), f"{p}.wo.weight": (h, h),
                   f"{p}.ffn.w12.weight": (2 * i, h), f"{p}.ffn.w3.weight": (h, i),
                   f"{p}.attention_norm.weight": (h,), f"{p}.ffn_norm.weight": (h,)})
  return shapes


def test_neobert_preset_equals_reference_shapes_and_count():
  cfg = model_lib.get_bert_config("neobert")
  ref = reference_shapes()
  assert len(ref) == 172                                     # 4 + 6 x 28 tensors
  total = sum(math.prod(s) for s in ref.values())
  # By hand: embedding 30,522 x 768 = 23,440,896; a layer 768 x 2,304 (qkv) + 768^2 (wo)
  # + 4,096 x 768 (w12) + 768 x 2,048 (w3) + 2 x 768 = 7,079,424, x 28 = 198,223,872; final
  # norm 768: encoder 221,665,536; decoder 23,440,896 + 30,522 = 23,471,418.
  assert 30522 * 768 + 28 * (768 * 2304 + 768 ** 2 + 4096 * 768 + 768 * 2048 + 2 * 768) + 768 \
      == 221_665_536
  assert total == 221_665_536 + 30522 * 768 + 30522 == 245_136_954
  assert cfg.intermediate_size == modern_layers.swiglu_width(3072) == 2048
  assert (cfg.layer_norm_eps, cfg.rope_theta_global, cfg.max_position_embeddings,
          cfg.vocab_size, cfg.use_bias, cfg.embedding_norm) == (1e-5, 10_000.0, 4096, 30522,
                                                                False, False)
  abstract = jax.eval_shape(lambda: pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  assert model_lib.count_params(abstract) == family.num_params(cfg, with_mlm_head=True) == total
  assert model_lib.count_params(abstract["bert"]) == family.num_params(cfg) == 221_665_536
  # Tensor by tensor: each reference tensor is the same number of our scalars (to_ours below
  # maps the values; here the shapes alone, at the full size).
  ours = _flat(abstract)
  for name, shape in ref.items():
    assert sum(math.prod(ours[p].shape) for p in _our_paths(name)) == math.prod(shape), name
  assert sum(len(_our_paths(n)) for n in ref) == len(ours)   # nothing of ours unmapped
  head = nn_unbox(abstract["mlm_head"])
  assert {k: v.shape for k, v in head.items()} == {"decoder": (30522, 768),
                                                   "output_bias": (30522,)}


def nn_unbox(tree):
  return model_lib.nn.meta.unbox(tree)


def _flat(params):
  flat = jax.tree_util.tree_flatten_with_path(nn_unbox(params))[0]
  return {"/".join(k.key for k in path): leaf for path, leaf in flat}


def _our_paths(name):
  """Our parameter paths holding reference tensor `name`."""
  if name.startswith("model.transformer_encoder."):
    i, rest = name.split(".")[2], ".".join(name.split(".")[3:])
    p = f"bert/encoder/layer_{i}"
    return {"qkv.weight": [f"{p}/attention/{s}/kernel" for s in ("query", "key", "value")],
            "wo.weight": [f"{p}/attention/output/kernel"],
            "ffn.w12.weight": [f"{p}/mlp/Wi/kernel"], "ffn.w3.weight": [f"{p}/mlp/Wo/kernel"],
            "attention_norm.weight": [f"{p}/attention_layer_norm/scale"],
            "ffn_norm.weight": [f"{p}/output_layer_norm/scale"]}[rest]
  return {"model.encoder.weight": ["bert/embeddings/word_embeddings/embedding"],
          "model.layer_norm.weight": ["bert/encoder/final_norm/scale"],
          "decoder.weight": ["mlm_head/decoder"], "decoder.bias": ["mlm_head/output_bias"]}[name]


def to_ours(state, cfg, rope_permute=True):
  """NeoBERTLMHead's state dict (numpy) -> our BertForPreTraining params (module docstring)."""
  h, n, d = cfg.hidden_size, cfg.num_heads, cfg.head_dim
  # Our channel j of a head is NeoBERT's perm[j]: pairs (2c, 2c + 1) -> (c, c + D/2).
  perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)]) if rope_permute else \
      np.arange(d)
  flat = {}
  for name, w in state.items():
    paths = _our_paths(name)
    if name.endswith("qkv.weight"):
      w = w.T.reshape(h, n, 3, d)                            # [H, N, (q k v), D]
      for s, path in enumerate(paths):
        flat[path] = w[:, :, s, perm] if s < 2 else w[:, :, s]
    elif name.endswith("wo.weight"):
      flat[paths[0]] = w.T.reshape(n, d, h)
    elif name.endswith(("w12.weight", "w3.weight")):
      flat[paths[0]] = w.T
    else:
      flat[paths[0]] = w
  tree = {}
  for path, value in flat.items():
    *parents, leaf = path.split("/")
    node = tree
    for p in parents:
      node = node.setdefault(p, {})
    node[leaf] = jnp.asarray(value)
  return tree


# ----------------------------------------------------------------------------------------------
# Parity with the reference code (PyTorch, CPU).
# ----------------------------------------------------------------------------------------------
def _reference_sources():
  """{file: text} of src/neobert/model/{model,rmsnorm,rotary}.py, or None (no copy here)."""
  root = os.environ.get("NEOBERT_REPO", MIRROR)
  tree = os.path.join(root, "src", "neobert", "model")
  if os.path.isdir(tree):
    out = {}
    for f in SOURCES:
      with open(os.path.join(tree, f), encoding="utf-8") as fh:
        out[f] = fh.read()
    return out
  if not os.path.isdir(root):
    return None
  try:   # a git dir without a work tree (the `fetch` mirror)
    return {f: subprocess.run(["git", "--git-dir", root, "show", f"HEAD:src/neobert/model/{f}"],
                              check=True, capture_output=True, text=True).stdout
            for f in SOURCES}
  except (OSError, subprocess.CalledProcessError):
    return None


def _stand_ins(torch):
  """xformers.ops and datasets as the reference imports them (module docstring)."""
  class SwiGLU(torch.nn.Module):   # xformers.ops.SwiGLU, _pack_weights=True (its default)
    def __init__(self, in_features, hidden_features, out_features=None, bias=True):
      super().__init__()
      self.w12 = torch.nn.Linear(in_features, 2 * hidden_features, bias=bias)
      self.w3 = torch.nn.Linear(hidden_features, out_features or in_features, bias=bias)

    def forward(self, x):
      x1, x2 = self.w12(x).chunk(2, dim=-1)   # w1, w2 = w12.view(2, I, H).unbind(0)
      return self.w3(torch.nn.functional.silu(x1) * x2)

  def memory_efficient_attention(*args, **kwargs):
    raise AssertionError("flash_attention=False: the reference must take torch's SDPA path")

  ops = types.ModuleType("xformers.ops")
  ops.SwiGLU, ops.memory_efficient_attention = SwiGLU, memory_efficient_attention
  xformers = types.ModuleType("xformers")
  xformers.ops = ops
  datasets = types.ModuleType("datasets")
  datasets.Dataset = type("Dataset", (), {})
  return {"xformers": xformers, "xformers.ops": ops, "datasets": datasets}


@pytest.fixture(name="reference")
def fixture_reference(tmp_path, monkeypatch):
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformers")
  sources = _reference_sources()
  if sources is None:
    pytest.skip(f"no copy of github.com/chandar-lab/NeoBERT at NEOBERT_REPO or {MIRROR}")
  package = tmp_path / "neobert_reference"
  package.mkdir()
  (package / "__init__.py").write_text("")
  for f, text in sources.items():
    (package / f).write_text(text)
  for name, module in _stand_ins(torch).items():
    monkeypatch.setitem(sys.modules, name, module)
  # RMSNorm.forward is decorated with @torch.compile: eager here (the same arithmetic, no
  # C++ toolchain needed on CPU).
  monkeypatch.setattr(torch, "compile", lambda fn=None, **kwargs: fn)
  monkeypatch.syspath_prepend(str(tmp_path))
  try:
    yield importlib.import_module("neobert_reference.model"), torch
  finally:
    for name in [m for m in sys.modules if m.startswith("neobert_reference")]:
      del sys.modules[name]


def _tiny(torch, model_mod, seed=0):
  """A NeoBERTLMHead at 2 x 64, 4 heads (D = 16), intermediate 192 (SwiGLU 128), vocab 101, with
  every tensor random (norm scales around 1, the decoder bias nonzero) -> (module, state)."""
  config = model_mod.NeoBERTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   intermediate_size=192, vocab_size=101, max_length=32,
                                   norm_eps=1e-5, hidden_act="swiglu", rms_norm=True, rope=True,
                                   flash_attention=False, dropout=0.0, pad_token_id=0)
  ref = model_mod.NeoBERTLMHead(config).eval()
  g = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for name, p in ref.named_parameters():
      base = 1.0 if name.endswith("norm.weight") else 0.0
      p.copy_(base + 0.3 * torch.randn(p.shape, generator=g))
  state = {k: v.numpy() for k, v in ref.state_dict().items()}
  return ref, state


def _ours_cfg():
  return model_lib.get_bert_config("neobert", num_layers=2, hidden_size=64, num_heads=4,
                                   intermediate_size=128, vocab_size=101,
                                   max_position_embeddings=32)


def _run_ours(cfg, params, ids, mask):
  positions = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
  out = pretraining_heads.BertForPreTraining(cfg).apply(
      {"params": params}, jnp.asarray(ids), jnp.asarray(mask), jnp.zeros_like(ids),
      jnp.asarray(positions), return_dict=True, output_sequence=True)
  return np.asarray(out["sequence_output"]), np.asarray(out["mlm"])


def test_encoder_and_mlm_logits_equal_reference(reference):
  model_mod, torch = reference
  ref, state = _tiny(torch, model_mod)
  assert set(state) == set(reference_shapes(64, 2, 4, 192, 101))   # the same 16 tensors
  assert {k: tuple(v.shape) for k, v in state.items()} == reference_shapes(64, 2, 4, 192, 101)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 101, size=(2, 24)).astype(np.int32)
  mask = np.ones_like(ids)
  mask[1, 17:] = 0                                                    # row 1: 7 padding tokens
  ids[mask == 0] = 0
  with torch.no_grad():
    additive = torch.where(torch.from_numpy(mask) == 1, 0.0, float("-inf"))
    out = ref(torch.from_numpy(ids).long(), additive)
  hidden, logits = out["hidden_representation"].numpy(), out["logits"].numpy()
  cfg = _ours_cfg()
  ours_hidden, ours_logits = _run_ours(cfg, to_ours(state, cfg), ids, mask)
  real = mask == 1
  assert np.abs(hidden[real]).max() > 0.5 and np.abs(logits[real]).max() > 1.0
  np.testing.assert_allclose(ours_hidden[real], hidden[real], atol=2e-5, rtol=1e-5)
  np.testing.assert_allclose(ours_logits[real], logits[real], atol=1e-4, rtol=1e-5)
  # The RoPE channel order is what the map is about: without it the scores differ.
  _, unpermuted = _run_ours(cfg, to_ours(state, cfg, rope_permute=False), ids, mask)
  assert np.abs(unpermuted[real] - logits[real]).max() > 1e-2


# ----------------------------------------------------------------------------------------------
# The two head fields: old checkpoints and the other presets unchanged, refusals.
# ----------------------------------------------------------------------------------------------
def test_head_fields_default_to_the_tied_transform_head():
  base = model_lib.get_bert_config("modernbert-base")
  assert base.mlm_transform and base.tie_word_embeddings
  for cfg in (base, model_lib.get_bert_config("base")):
    assert not {"mlm_transform", "tie_word_embeddings"} & set(cfg.to_dict())
  neo = model_lib.get_bert_config("neobert")
  assert (neo.to_dict()["mlm_transform"], neo.to_dict()["tie_word_embeddings"]) == (False, False)
  assert model_lib.BertConfig.from_dict(neo.to_dict()) == neo
  # A neobert checkpoint written before the fields existed stored neither: it loads as what it
  # was trained as (the transform and the tied decoder), not as the new preset.
  old = {k: v for k, v in neo.to_dict().items()
         if k not in ("mlm_transform", "tie_word_embeddings")}
  old_cfg = model_lib.BertConfig.from_dict(old)
  assert old_cfg.mlm_transform and old_cfg.tie_word_embeddings
  tree = jax.eval_shape(lambda: pretraining_heads.init_params(
      dataclasses.replace(old_cfg, num_layers=1), jax.random.PRNGKey(0)))
  assert set(tree["mlm_head"]) == {"transform", "transform_layer_norm", "output_bias"}
  # Fields of what the weights are (train.py's init_checkpoint keeps the checkpoint's).
  assert {"mlm_transform", "tie_word_embeddings"} <= set(model_lib.MODERN_FIELDS)


def test_untied_decoder_is_the_one_used():
  cfg = dataclasses.replace(_ours_cfg(), num_layers=1)
  params = nn_unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(1)))
  ids = np.arange(1, 9, dtype=np.int32)[None]
  mask = np.ones_like(ids)
  _, logits = _run_ours(cfg, params, ids, mask)
  words = params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  moved = jax.tree.map(lambda x: x, params)
  moved["bert"]["embeddings"]["word_embeddings"]["embedding"] = words.at[50].add(1.0)
  _, same = _run_ours(cfg, moved, np.where(ids == 50, 1, ids), mask)   # row 50 is never read
  np.testing.assert_array_equal(same, logits)
  moved = jax.tree.map(lambda x: x, params)
  moved["mlm_head"]["decoder"] = params["mlm_head"]["decoder"].at[50].add(1.0)
  _, changed = _run_ours(cfg, moved, ids, mask)
  assert np.abs(changed[..., 50] - logits[..., 50]).max() > 1e-3
  np.testing.assert_array_equal(np.delete(changed, 50, -1), np.delete(logits, 50, -1))


def test_refusals():
  with pytest.raises(ValueError, match="tie_word_embeddings=False needs prenorm=True"):
    model_lib.get_bert_config("base", tie_word_embeddings=False)
  with pytest.raises(ValueError, match="mlm_transform=False needs prenorm=True"):
    model_lib.get_bert_config("base", mlm_transform=False)
  with pytest.raises(ValueError, match="share_layers='none' and embedding_size=0"):
    model_lib.get_bert_config("albert-base", tie_word_embeddings=False)
  # transformers' ModernBertForMaskedLM ties its decoder: no folder for an untied head.
  m = types.SimpleNamespace(config=model_lib.get_bert_config(
      "modernbert-tiny", tie_word_embeddings=False), path="runs/x")
  with pytest.raises(formats.ConversionError, match="tie_word_embeddings=False"):
    family.export_hf(m, "/nonexistent/out")


def test_flops_count_the_decoder_alone():
  neo = model_lib.get_bert_config("neobert")
  tied = dataclasses.replace(neo, mlm_transform=True, tie_word_embeddings=True)
  # The transform's H x H multiply-adds on each of 20 predictions, 6 FLOPs each (fwd + bwd).
  assert family.flops_per_sequence(tied, 128, 20) - family.flops_per_sequence(neo, 128, 20) \
      == 6 * 20 * 768 * 768
