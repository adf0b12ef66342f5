"""ModernBERT as a family of the one encoder (bert_jax/families/modernbert/__init__.py, model.py's modern
fields, bert_jax/families/modernbert/convert.py).

- Presets: parameter counts equal transformers' ModernBertModel (149,014,272 for base,
  394,781,696 for large), counted from transformers' modules on the meta device (no memory).
- Forward parity: a random transformers ModernBertForMaskedLM (every parameter random, tiny
  config, window 16) saved with its tokenizer.json converts through bert_jax.convert's
  import_checkpoint; our hidden states and MLM logits equal transformers' (eager attention)
  within 1e-4 on a padded batch of rows longer than the window (48 > 3 x 8: the blocked kernel).
- Export: the converted tree written back gives a folder transformers loads with equal logits.
- Config rules and FLOPs.
"""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax import convert
from bert_jax import families
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax.families.modernbert import convert as convert_modernbert
from bert_jax.families import modernbert as family
from tests.bert_jax.families.families_train_test import records  # noqa: F401 (the records fixture)

TOL = 1e-4


def _hf_modernbert(**kw):
  import transformers  # pylint: disable=g-import-not-at-top
  base = dict(vocab_size=96, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
              intermediate_size=80, max_position_embeddings=128, local_attention=16,
              global_attn_every_n_layers=3, pad_token_id=0, cls_token_id=2, sep_token_id=3,
              bos_token_id=2, eos_token_id=3)
  return transformers.ModernBertConfig(**{**base, **kw})


# ----------------------------------------------------------------------------------------------
# Presets and config rules.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,expected", [("modernbert-base", 149_014_272),
                                             ("modernbert-large", 394_781_696)])
def test_parameter_counts_equal_transformers(preset, expected):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config(preset)
  hf = transformers.ModernBertConfig(
      vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
      num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
      intermediate_size=cfg.intermediate_size)
  with torch.device("meta"):
    counted = sum(p.numel() for p in transformers.ModernBertModel(hf).parameters())
  assert counted == expected == family.num_params(cfg)
  # Ours, from the shapes of the abstract init (no allocation).
  abstract = jax.eval_shape(lambda: pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  assert model_lib.count_params(abstract["bert"]) == expected


def test_presets_keep_bert_configs_as_they_were():
  bert = model_lib.BertConfig()
  assert not set(model_lib.MODERN_FIELDS) & set(bert.to_dict())
  tiny = model_lib.get_bert_config("modernbert-tiny")
  assert model_lib.BertConfig.from_dict(tiny.to_dict()) == tiny
  assert families.of_preset("neobert").name == "modernbert"
  neo = model_lib.get_bert_config("neobert")
  assert (neo.ffn, neo.norm, neo.embedding_norm, neo.local_window) == ("swiglu", "rms_norm",
                                                                       False, 0)


@pytest.mark.parametrize("override,message", [
    (dict(local_window=7), "local_window=7"),
    (dict(rope_theta_global=0.0), "rope_theta_global=0.0"),
    (dict(global_every=0), "global_every=0"),
    (dict(local_window=2048), r"local_window=2048 reaches past any row of "
                              r"max_position_embeddings=1024; set local_window=2046 \(local "
                              r"layers that see every key, with rope_theta_local\) or 0 "
                              r"\(no window\)"),
    (dict(ffn="dense"), "gated"),
    (dict(objectives="mlm,nsp"), "exactly 'mlm'"),
    (dict(type_vocab_size=2), "type_vocab_size=2"),
    (dict(norm="batch_norm"), "norm='batch_norm'"),
])
def test_bad_fields_are_one_line_errors(override, message):
  with pytest.raises(ValueError, match=message):
    model_lib.get_bert_config("modernbert-tiny", **override)


def test_flops_count_windowed_layers_by_their_window():
  cfg = model_lib.get_bert_config("modernbert-base")
  t = 8192
  full = dataclasses.replace(cfg, local_window=0, global_every=1)
  f_local, f_full = (family.flops_per_sequence(c, t, 0) for c in (cfg, full))
  # 8 of 22 layers global: the 14 local ones pay 129 keys instead of 8,192.
  h = cfg.hidden_size
  assert f_full - f_local == 14 * 12 * t * (t - 129) * h
  # GeGLU: three H x I matrices per layer.
  assert family.flops_per_sequence(cfg, 1, 0) == 6 * 22 * (4 * h * h + 3 * h * 1152) + \
      12 * 22 * h


def test_recipe_masks_30_percent_without_a_sentence_task():
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("modernbert-tiny")
  assert c.masked_lm_prob == 0.3
  assert c.max_predictions_per_seq == int(0.305 * c.seq_length)
  assert model_lib.get_bert_config("modernbert-tiny").objectives == "mlm"


def test_packed_rows_equal_their_instances_alone():
  """RoPE reads each instance's own positions and the window stays inside it: a packed row of
  two instances gives each the hidden states it has alone."""
  cfg = model_lib.get_bert_config("modernbert-tiny", local_window=4)
  params = pretraining_heads.init_params(cfg, jax.random.PRNGKey(1), seq_len=16)["bert"]
  body = model_lib.BertModel(cfg)
  rng = np.random.default_rng(0)
  a, b = rng.integers(5, 96, 9), rng.integers(5, 96, 7)
  ids = jnp.asarray(np.concatenate([a, b])[None], jnp.int32)
  packed = body.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids),
                      instance_ids=jnp.asarray([[1] * 9 + [2] * 7]),
                      position_ids=jnp.asarray([list(range(9)) + list(range(7))]),
                      cls_positions=jnp.asarray([[0, 9]]))["sequence_output"]
  for x, sl in ((a, slice(0, 9)), (b, slice(9, 16))):
    x = jnp.asarray(x[None], jnp.int32)
    alone = body.apply({"params": params}, x, jnp.ones_like(x), jnp.zeros_like(x))
    np.testing.assert_allclose(packed[:, sl], alone["sequence_output"], atol=1e-5)


# ----------------------------------------------------------------------------------------------
# transformers both ways.
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
  """A random ModernBertForMaskedLM (every parameter random, LayerNorm scales ~1) + a learned
  byte-level BPE tokenizer.json, saved as transformers saves them."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from data_pipelines.tokenizers import tokenizer_json  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path_factory.mktemp("hf") / "modernbert")
  lines = ["the quick brown fox jumps over the lazy dog", "a modern encoder with rotary "
           "positions and a sliding window", "pack the rows and mask thirty percent"] * 20
  # Byte-level BPE: 256 bytes + 5 specials + merges; the model pads the table to 320 rows
  # (ModernBERT pads 50,280 ids to 50,368).
  text, size = tokenizer_json.learn(lines, 300, model_type="bpe", byte_level=True,
                                    lower_case=False)
  torch.manual_seed(0)
  model = transformers.ModernBertForMaskedLM(_hf_modernbert(vocab_size=320)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name else 0.0))
  model.save_pretrained(folder)
  with open(os.path.join(folder, "tokenizer.json"), "w", encoding="utf-8") as f:
    f.write(text)
  assert 261 < size <= 320
  return folder


def _hf_outputs(folder, ids, mask):
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  model = transformers.ModernBertForMaskedLM.from_pretrained(
      folder, attn_implementation="eager").eval()
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask),
                output_hidden_states=True)
    hidden = model.model(input_ids=torch.tensor(ids),
                         attention_mask=torch.tensor(mask)).last_hidden_state
  return hidden.numpy(), out.logits.numpy()


def _ours(params, config, ids, mask):
  ids, mask = jnp.asarray(ids, jnp.int32), jnp.asarray(mask, jnp.int32)
  b, t = ids.shape
  positions = jnp.broadcast_to(jnp.arange(t), (b, t))
  out = pretraining_heads.BertForPreTraining(config).apply(
      {"params": params}, ids, mask, jnp.zeros_like(ids), positions, return_dict=True,
      output_sequence=True)
  return np.asarray(out["sequence_output"]), np.asarray(out["mlm"])


def _batch(t=48):
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 300, (3, t))
  mask = np.ones((3, t), np.int64)
  mask[1, 30:] = 0   # padded rows, one shorter than the window's reach from its end
  mask[2, 11:] = 0
  ids[mask == 0] = 0
  return ids, mask


@pytest.mark.slow
def test_import_equals_transformers_hidden_states_and_logits(hf_folder):
  params, config, meta = convert.import_checkpoint(hf_folder)
  assert config.family == "modernbert" and config.local_window == 16
  assert config.global_every == 3 and meta["tokenizer_json"] == "tokenizer.json"
  assert meta["special_ids"]["mask"] == 4 and meta["initialized_randomly"] == []
  ids, mask = _batch()
  hidden, logits = _hf_outputs(hf_folder, ids, mask)
  ours_hidden, ours_logits = _ours(params, config, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours_hidden[real], hidden[real], atol=TOL, rtol=TOL)
  np.testing.assert_allclose(ours_logits[real], logits[real], atol=TOL, rtol=TOL)


@pytest.mark.slow
def test_convert_writes_an_export_with_its_tokenizer_json(hf_folder, tmp_path):
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  out = str(tmp_path / "orbax")
  meta = convert.convert_to_orbax(hf_folder, out)
  assert os.path.isfile(os.path.join(out, "tokenizer.json")) and meta["vocab_hash"]
  assert not os.path.exists(os.path.join(out, "vocab.txt"))
  params, config, _ = ckpt_lib.load_params(out)
  expected, expected_config, _ = convert.import_checkpoint(hf_folder)
  assert config == expected_config
  jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, params),
               jax.tree.map(np.asarray, expected))


@pytest.mark.slow
def test_export_gives_a_folder_transformers_loads_with_equal_logits(hf_folder, tmp_path):
  params, config, meta = convert.import_checkpoint(hf_folder)
  out = convert_modernbert.export_to_hf(params, config, str(tmp_path / "back"),
                                        tokenizer_file=meta["_vocab_path"],
                                        special_ids=meta["special_ids"])
  ids, mask = _batch()
  _, before = _hf_outputs(hf_folder, ids, mask)
  _, after = _hf_outputs(out, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(after[real], before[real], atol=TOL, rtol=TOL)
  with open(os.path.join(out, "config.json"), encoding="utf-8") as f:
    written = json.load(f)
  assert written["layer_types"] == ["full_attention", "sliding_attention",
                                    "sliding_attention", "full_attention"]
  assert os.path.isfile(os.path.join(out, "tokenizer.json"))


def _json_config(**kw):
  base = dict(model_type="modernbert", vocab_size=96, hidden_size=64, num_hidden_layers=4,
              num_attention_heads=4, intermediate_size=80, max_position_embeddings=1024,
              local_attention=128, global_attn_every_n_layers=3)
  return {**base, **kw}


def test_a_window_past_the_positions_is_read_as_transformers_computes_it():
  """local_attention=2048 > max_position_embeddings=1024: transformers loads and runs it (each
  local layer sees |i - j| <= 1024, every key); we read the window that sees every key, 2046
  (was: `ValueError('BertConfig: local_window=2048 is larger than ...')` naming our field and
  the unrelated list of required fields)."""
  read = convert_modernbert.config_from_json
  assert read(_json_config(local_attention=2048), "c.json").local_window == 2046
  assert read(_json_config(local_attention=2046), "c.json").local_window == 2046
  assert read(_json_config(local_attention=128), "c.json").local_window == 128
  assert read(_json_config(local_attention=129), "c.json").local_window == 128   # 129 // 2 = 64
  # A field our config refuses names the file's key; a missing one names itself.
  with pytest.raises(convert.ConversionError, match=r"^c.json: BertConfig: global_every=0; .* "
                     r"\(global_every is this file's global_attn_every_n_layers\)$"):
    read(_json_config(global_attn_every_n_layers=0), "c.json")
  with pytest.raises(convert.ConversionError, match=r"^c.json: no 'vocab_size'; a "):
    read({k: v for k, v in _json_config().items() if k != "vocab_size"}, "c.json")


@pytest.mark.slow
def test_a_window_past_the_positions_imports_with_transformers_logits(hf_folder, tmp_path):
  """A random ModernBertForMaskedLM with local_attention=128 > max_position_embeddings=48 (its
  local layers see every key, with the local RoPE theta): our import gives its hidden states
  and logits, and exports back to a folder transformers runs to the same logits."""
  import shutil  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  folder = str(tmp_path / "wide")
  torch.manual_seed(1)
  model = transformers.ModernBertForMaskedLM(_hf_modernbert(
      vocab_size=320, max_position_embeddings=48, local_attention=128)).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "norm" in name else 0.0))
  model.save_pretrained(folder)
  shutil.copy(os.path.join(hf_folder, "tokenizer.json"), folder)
  params, config, meta = convert.import_checkpoint(folder)
  assert (config.local_window, config.max_position_embeddings) == (94, 48)
  assert config.rope_theta_local != config.rope_theta_global   # the local layers are not global
  ids, mask = _batch(t=48)
  hidden, logits = _hf_outputs(folder, ids, mask)
  ours_hidden, ours_logits = _ours(params, config, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours_hidden[real], hidden[real], atol=TOL, rtol=TOL)
  np.testing.assert_allclose(ours_logits[real], logits[real], atol=TOL, rtol=TOL)
  # Reading the window as "every layer global" (the global RoPE theta) would not be its model.
  _, all_global = _ours(params, dataclasses.replace(config, local_window=0, global_every=1), ids,
                        mask)
  assert np.abs(all_global[real] - logits[real]).max() > 100 * TOL
  out = convert_modernbert.export_to_hf(params, config, str(tmp_path / "back"),
                                        tokenizer_file=meta["_vocab_path"],
                                        special_ids=meta["special_ids"])
  _, back = _hf_outputs(out, ids, mask)
  np.testing.assert_allclose(back[real], logits[real], atol=TOL, rtol=TOL)


def test_a_folder_without_its_tokenizer_is_one_line(hf_folder, tmp_path):
  import shutil  # pylint: disable=g-import-not-at-top
  bare = tmp_path / "bare"
  shutil.copytree(hf_folder, bare)
  os.remove(bare / "tokenizer.json")
  with pytest.raises(convert.ConversionError, match="without its tokenizer.json"):
    convert.import_checkpoint(str(bare))


def test_flop_count_equals_the_matmuls_of_the_traced_training_step():
  """flops_per_sequence against the dot products of jax.grad of the loss (as
  families_train_test does for BERT, ALBERT, SpanBERT): equal but for the local layers, where
  the blocked kernel (T = 64 > 3 x W/2) scores 3 blocks of W/2 = 8 keys per query (24) and the
  formula counts the W + 1 = 17 that the output depends on."""
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import pretraining as objectives  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.families.families_train_test import _dot_flops  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("modernbert-tiny", vocab_size=1000)
  b, t, p = 2, 64, 10
  model = pretraining_heads.BertForPreTraining(cfg)
  params = jax.eval_shape(lambda: nn.unbox(pretraining_heads.init_params(cfg, jax.random.key(0))))
  ints = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
  batch = dict(input_ids=ints(b, t), input_mask=ints(b, t) + 1, segment_ids=ints(b, t),
               masked_lm_positions=ints(b, p) + 3, masked_lm_ids=ints(b, p),
               masked_lm_weights=np.ones((b, p), np.float32))

  def loss(params):
    out = model.apply({"params": params}, batch, True, method=pretraining_heads.pretraining_outputs)
    return objectives.pretraining_loss(out, batch)[0]

  counted = _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  local = sum(cfg.layer_attention(i)[0] is not None for i in range(cfg.num_layers))
  assert local == 2
  w = cfg.local_window
  extra = local * 12 * t * (3 * w // 2 - (w + 1)) * cfg.hidden_size
  assert counted == b * (family.flops_per_sequence(cfg, t, p) + extra)


@pytest.mark.slow
def test_pretrains_through_the_loop_and_exports_to_transformers(records, tmp_path):
  """modernbert-tiny pre-trains on packed --no_nsp records (MLM only, loss finite and falling
  from ln(V)), and its checkpoint exported through convert.export_model_to_hf gives transformers'
  ModernBertForMaskedLM the MLM logits of our model within 1e-4."""
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.families import families_train_test  # pylint: disable=g-import-not-at-top
  config = families_train_test._config("modernbert-tiny", records, "full", num_train_steps=4)
  assert config.masked_lm_prob == 0.3 and config.pack
  out = train.train_and_evaluate(config, str(tmp_path / "run"))
  losses = [m["loss"] for _, m in out["history"]["train"]]
  assert np.isfinite(losses).all() and set(out["history"]["train"][-1][1]) >= {"mlm_loss"}
  assert not {"nsp_loss", "sop_loss"} & set(out["history"]["train"][-1][1])
  m = inference.load_for_inference(str(tmp_path / "run"))
  hf_dir = convert.export_model_to_hf(m, str(tmp_path / "hf"), str(tmp_path / "run"))
  hf = transformers.ModernBertForMaskedLM.from_pretrained(hf_dir, attn_implementation="eager")
  ids = np.random.default_rng(0).integers(5, m.config.vocab_size, (2, 40))
  mask = np.ones_like(ids)
  mask[1, 25:] = 0
  with torch.no_grad():
    theirs = hf.eval()(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits
  _, ours = _ours(m.params, m.config, ids, mask)
  real = mask.astype(bool)
  np.testing.assert_allclose(ours[real], theirs.numpy()[real], atol=TOL, rtol=TOL)
  assert os.path.isfile(os.path.join(hf_dir, "vocab.txt"))
