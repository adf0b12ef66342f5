"""DistilBERT conversion (bert_jax/families/distilbert/convert.py): transformers' DistilBertForMaskedLM /
DistilBertModel <-> BertForPreTraining(family="distilbert"), outputs equal within 1e-4 both ways."""

import json
import os

import jax
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.checkpoint import store as ckpt_lib  # noqa: E402
from bert_jax.models import model as model_lib  # noqa: E402
from bert_jax.models import pretraining_heads
from bert_jax.families.distilbert import convert as distilbert  # noqa: E402
from bert_jax.convert import names  # noqa: E402
from tests.testlib import hf_testlib  # noqa: E402

VOCAB = 64


def _hf_config():
  return transformers.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=4,
                                       hidden_dim=48, max_position_embeddings=40, dropout=0.0,
                                       attention_dropout=0.0)


def _randomise(model, seed):
  """Every parameter random (LayerNorm scales ~1): a swapped tensor shows in the outputs."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "layer_norm.weight" in name.lower() or
                                           name.endswith("LayerNorm.weight") else 0.0))
  return model.eval()


def _hf_outputs(model, ids, mask, pos):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long), output_hidden_states=True)
  logits = out.logits.numpy()
  return logits[np.arange(len(ids))[:, None], pos], out.hidden_states[-1].numpy()


def _our_outputs(params, config, ids, mask, pos):
  out = pretraining_heads.BertForPreTraining(config).apply(
      {"params": params}, ids, mask, np.zeros_like(ids), pos, return_dict=True,
      output_sequence=True)
  return np.asarray(out["mlm"]), np.asarray(out["sequence_output"])


def test_name_table_is_exactly_transformers_and_our_tree():
  hf = transformers.DistilBertForMaskedLM(_hf_config())
  config = distilbert.config_from_json(hf.config.to_dict(), "config.json")
  shapes = jax.eval_shape(lambda: pretraining_heads.init_params(config, jax.random.key(0)))
  flat = {k: tuple(v.value.shape) for k, v in names.flatten(dict(shapes)).items()}
  table = distilbert.specs(config)
  assert {s.path: s.shape for s in table} == flat
  assert {s.hf for s in table} | {distilbert.TIED} == {n for n, _ in hf.named_parameters()} | {
      distilbert.TIED}


def test_hf_distilbert_import_gives_transformers_outputs(tmp_path):
  hf_model = _randomise(transformers.DistilBertForMaskedLM(_hf_config()), 3)
  hf_dir = hf_testlib.save_hf(hf_model, str(tmp_path / "hf"))
  meta = distilbert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  assert meta["initialized_randomly"] == []
  params, config, _ = ckpt_lib.load_params(str(tmp_path / "orbax"))
  assert (config.family, config.type_vocab_size, config.num_layers) == ("distilbert", 0, 2)
  ids, mask, _, pos = hf_testlib.batch(VOCAB, seq=16)
  mlm, seq = _our_outputs(params, config, ids, mask, pos)
  hf_mlm, hf_seq = _hf_outputs(hf_model, ids, mask, pos)
  real = mask > 0   # transformers leaves padding positions' states unmasked garbage too
  np.testing.assert_allclose(mlm, hf_mlm, atol=1e-4, rtol=0)
  np.testing.assert_allclose(seq[real], hf_seq[real], atol=1e-4, rtol=0)
  assert np.abs(hf_mlm).max() > 1.0   # outputs that can tell a wrong parameter apart


def test_bare_distilbert_model_imports_with_a_fresh_mlm_head(tmp_path):
  hf_model = _randomise(transformers.DistilBertModel(_hf_config()), 4)
  hf_dir = hf_testlib.save_hf(hf_model, str(tmp_path / "hf"))
  params, config, meta = distilbert.import_hf(hf_dir)
  assert meta["initialized_randomly"] and all(p.startswith("mlm_head/")
                                              for p in meta["initialized_randomly"])
  ids, mask, _, pos = hf_testlib.batch(VOCAB, seq=16)
  _, seq = _our_outputs(params, config, ids, mask, pos)
  with torch.no_grad():
    hf_seq = hf_model(input_ids=torch.tensor(ids, dtype=torch.long),
                      attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
  np.testing.assert_allclose(seq[mask > 0], hf_seq[mask > 0], atol=1e-4, rtol=0)


def test_our_distilbert_exports_to_transformers_with_equal_outputs_and_back(tmp_path):
  config = model_lib.get_bert_config("distilbert-tiny", vocab_size=VOCAB, num_layers=2,
                                     hidden_size=32, num_heads=4, intermediate_size=48,
                                     max_position_embeddings=40, hidden_dropout_prob=0.0,
                                     attention_dropout_prob=0.0)
  params = nn.meta.unbox(pretraining_heads.init_params(config, jax.random.key(7)))
  rng = np.random.default_rng(7)
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.05, x.shape).astype(np.float32),
                        params)
  src = str(tmp_path / "ours")
  ckpt_lib.save_params(src, params, config, {"do_lower_case": True})
  hf_testlib.write_vocab(os.path.join(src, "vocab.txt"), VOCAB)
  with hf_testlib.umask(0o022):
    distilbert.export_checkpoint_to_hf(src, str(tmp_path / "hf"))
  # Every file readable by others, model.safetensors too (was 0600: safetensors' own mode).
  modes = hf_testlib.file_modes(tmp_path / "hf")
  assert set(modes.values()) == {0o644} and "model.safetensors" in modes, modes
  hf_json = json.load(open(tmp_path / "hf" / "config.json"))
  assert hf_json["model_type"] == "distilbert" and hf_json["n_layers"] == 2
  assert os.path.isfile(tmp_path / "hf" / "vocab.txt")
  model, info = transformers.DistilBertForMaskedLM.from_pretrained(
      str(tmp_path / "hf"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  ids, mask, _, pos = hf_testlib.batch(VOCAB, seq=16)
  mlm, seq = _our_outputs(params, config, ids, mask, pos)
  hf_mlm, hf_seq = _hf_outputs(model.eval(), ids, mask, pos)
  np.testing.assert_allclose(hf_mlm, mlm, atol=1e-4, rtol=0)
  np.testing.assert_allclose(hf_seq[mask > 0], seq[mask > 0], atol=1e-4, rtol=0)
  # And back: the same tree and config.
  distilbert.convert_to_orbax(str(tmp_path / "hf"), str(tmp_path / "back"))
  back, back_config, _ = ckpt_lib.load_params(str(tmp_path / "back"))
  assert back_config == config
  fa, fb = names.flatten(back), names.flatten(params)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_a_bert_folder_or_checkpoint_is_one_line_naming_the_right_converter(tmp_path):
  hf_dir = hf_testlib.save_hf(hf_testlib.random_hf_model(hf_testlib.hf_config()),
                              str(tmp_path / "bert"))
  with pytest.raises(distilbert.ConversionError, match="expected 'distilbert'"):
    distilbert.import_hf(hf_dir)


def test_python_m_bert_jax_convert_reads_and_writes_a_distilbert_folder(tmp_path):
  """The one converter (python -m bert_jax.convert) imports a transformers DistilBERT folder
  with DistilBERT's table (was: BERT's names, 'token_type_embeddings missing') and exports a
  DistilBERT with DistilBERT's names (was: an error naming convert.distilbert): the family's
  exporter, found in bert_jax/families/distilbert/__init__.py."""
  from bert_jax import convert
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  hf_model = _randomise(transformers.DistilBertForMaskedLM(_hf_config()), 5)
  hf_dir = hf_testlib.save_hf(hf_model, str(tmp_path / "hf"))
  params, config, _ = convert.import_checkpoint(hf_dir)
  ours, our_config, _ = distilbert.import_hf(hf_dir)
  assert config == our_config and config.family == "distilbert"
  fa, fb = names.flatten(params), names.flatten(ours)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
  convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  m = inference.load_for_inference(str(tmp_path / "orbax"))
  out = convert.export_model_to_hf(m, str(tmp_path / "out"), str(tmp_path / "orbax"))
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  exported = load_file(os.path.join(out, "model.safetensors"))
  original = load_file(os.path.join(hf_dir, "model.safetensors"))
  for name, array in exported.items():   # every exported tensor is the source's, bit for bit
    np.testing.assert_array_equal(array, original[name], err_msg=name)
  assert json.load(open(os.path.join(out, "config.json")))["model_type"] == "distilbert"
  assert os.path.isfile(os.path.join(out, "vocab.txt"))   # the tokenizer goes with it
