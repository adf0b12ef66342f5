"""ALBERT conversion (bert_jax/families/albert/convert.py): transformers' AlbertForPreTraining/AlbertModel
and google-research/albert TF checkpoints -> BertForPreTraining(family="albert") and back, with
outputs equal within 1e-4 both ways."""

import json
import os
import re

import jax
import numpy as np
import pytest
from flax import linen as nn

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bert_jax.checkpoint import store as ckpt_lib  # noqa: E402
from bert_jax import convert  # noqa: E402
from bert_jax.inference import hf_export  # noqa: E402
from bert_jax.models import model as model_lib  # noqa: E402
from bert_jax.models import pretraining_heads
from bert_jax.families.albert import convert as albert  # noqa: E402
from bert_jax.convert import names  # noqa: E402
from tests.testlib import hf_testlib  # noqa: E402

VOCAB = 64


def _hf_config():
  return transformers.AlbertConfig(vocab_size=VOCAB, embedding_size=16, hidden_size=32,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   intermediate_size=48, max_position_embeddings=40,
                                   hidden_act="gelu_new", hidden_dropout_prob=0.0,
                                   attention_probs_dropout_prob=0.0)


def _randomise(model, seed):
  """Every parameter random (LayerNorm scales ~1): a swapped tensor shows in the outputs."""
  torch.manual_seed(seed)
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if name.endswith("LayerNorm.weight") else 0.0))
  return model.eval()


@pytest.fixture(scope="module")
def hf_model():
  return _randomise(transformers.AlbertForPreTraining(_hf_config()), seed=5)


@pytest.fixture(scope="module")
def hf_dir(hf_model, tmp_path_factory):
  return hf_testlib.save_hf(hf_model, str(tmp_path_factory.mktemp("albert") / "hf"))


def _hf_outputs(model, ids, mask, seg, pos):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(seg, dtype=torch.long))
  mlm = out.prediction_logits.numpy()
  return mlm[np.arange(len(ids))[:, None], pos], out.sop_logits.numpy()


def _our_outputs(params, config, ids, mask, seg, pos):
  return pretraining_heads.BertForPreTraining(config).apply({"params": params}, ids, mask, seg, pos)


def test_name_table_covers_the_albert_model_exactly():
  config = model_lib.get_bert_config("albert-tiny", vocab_size=50, embedding_size=16,
                                     max_position_embeddings=20)
  shapes = jax.eval_shape(lambda: pretraining_heads.init_params(config, jax.random.key(0)))
  flat = {k: tuple(v.value.shape) for k, v in names.flatten(dict(shapes)).items()}
  table = albert.specs(config)
  assert {s.path: s.shape for s in table} == flat
  assert len({s.hf for s in table}) == len({s.tf for s in table}) == len(table)
  hf = transformers.AlbertForPreTraining(_hf_config())
  assert {s.hf for s in albert.specs(albert.config_from_json(
      hf.config.to_dict(), "config.json", "hf")[0])} == {n for n, _ in hf.named_parameters()}


def test_hf_albert_import_gives_transformers_outputs(hf_model, hf_dir, tmp_path):
  meta = convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  params, config, _ = ckpt_lib.load_params(str(tmp_path / "orbax"))
  assert (config.family, config.share_layers, config.objectives) == ("albert", "all", "mlm,sop")
  assert config.hidden_act == "gelu_tanh" and config.embedding_size == 16
  # transformers 5 saves the tied decoder once (as the word embeddings); older files hold it too.
  assert set(meta["ignored_variables"]) <= {"predictions.decoder.bias",
                                            "predictions.decoder.weight"}
  assert meta["initialized_randomly"] == []
  ids, mask, seg, pos = hf_testlib.batch(VOCAB, seq=16)
  mlm, sop = _our_outputs(params, config, ids, mask, seg, pos)
  hf_mlm, hf_sop = _hf_outputs(hf_model, ids, mask, seg, pos)
  np.testing.assert_allclose(mlm, hf_mlm, atol=1e-4, rtol=0)
  np.testing.assert_allclose(sop, hf_sop, atol=1e-4, rtol=0)
  assert np.abs(hf_mlm).max() > 1.0   # outputs that can tell a wrong parameter apart


def test_our_albert_exports_to_transformers_with_equal_outputs(tmp_path):
  config = model_lib.get_bert_config("albert-tiny", vocab_size=VOCAB, embedding_size=16,
                                     max_position_embeddings=40)
  params = nn.meta.unbox(pretraining_heads.init_params(config, jax.random.key(7)))
  # Every leaf moved off its init (LayerNorm 1/0, biases 0), so a swapped one would show.
  rng = np.random.default_rng(7)
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.05, x.shape).astype(np.float32),
                        params)
  src = str(tmp_path / "ours")
  ckpt_lib.save_params(src, params, config, {"do_lower_case": True})
  hf_testlib.write_vocab(os.path.join(src, "vocab.txt"), VOCAB)
  hf_export.export_to_hf(src, str(tmp_path / "hf"))
  hf_json = json.load(open(tmp_path / "hf" / "config.json"))
  assert hf_json["model_type"] == "albert" and hf_json["embedding_size"] == 16
  model, info = transformers.AlbertForPreTraining.from_pretrained(
      str(tmp_path / "hf"), output_loading_info=True)
  assert not info["missing_keys"] and not info["unexpected_keys"], info
  assert not info["mismatched_keys"], info
  ids, mask, seg, pos = hf_testlib.batch(VOCAB, seq=16)
  mlm, sop = _our_outputs(params, config, ids, mask, seg, pos)
  hf_mlm, hf_sop = _hf_outputs(model.eval(), ids, mask, seg, pos)
  np.testing.assert_allclose(hf_mlm, mlm, atol=1e-4, rtol=0)
  np.testing.assert_allclose(hf_sop, sop, atol=1e-4, rtol=0)
  # And back: HF -> ours is the same tree.
  convert.convert_to_orbax(str(tmp_path / "hf"), str(tmp_path / "back"))
  back, back_config, _ = ckpt_lib.load_params(str(tmp_path / "back"))
  assert back_config.to_dict() == dict(config.to_dict(), attention_dropout_prob=0.0,
                                       hidden_dropout_prob=0.0)
  fa, fb = names.flatten(back), names.flatten(params)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def _tf_variables(state_dict):
  """HF ALBERT names -> google-research/albert's (from its modeling.py / run_pretraining.py),
  written here by rules independent of albert.specs."""
  rules = [(r"^albert\.embeddings\.(\w+_embeddings)\.weight$", r"bert/embeddings/\1"),
           (r"^albert\.embeddings\.LayerNorm\.", "bert/embeddings/LayerNorm."),
           (r"^albert\.encoder\.embedding_hidden_mapping_in\.",
            "bert/encoder/embedding_hidden_mapping_in."),
           (r"^albert\.encoder\.albert_layer_groups\.0\.albert_layers\.0\.",
            "bert/encoder/transformer/group_0/inner_group_0/"),
           (r"inner_group_0/attention\.(query|key|value)\.", r"inner_group_0/attention_1/self/\1."),
           (r"inner_group_0/attention\.dense\.", "inner_group_0/attention_1/output/dense."),
           (r"inner_group_0/attention\.LayerNorm\.", "inner_group_0/LayerNorm."),
           (r"inner_group_0/ffn\.", "inner_group_0/ffn_1/intermediate/dense."),
           (r"inner_group_0/ffn_output\.", "inner_group_0/ffn_1/intermediate/output/dense."),
           (r"inner_group_0/full_layer_layer_norm\.", "inner_group_0/LayerNorm_1."),
           (r"^albert\.pooler\.", "bert/pooler/dense."),
           (r"^predictions\.dense\.", "cls/predictions/transform/dense."),
           (r"^predictions\.LayerNorm\.", "cls/predictions/transform/LayerNorm."),
           (r"^predictions\.bias$", "cls/predictions/output_bias"),
           (r"^sop_classifier\.classifier\.weight$", "cls/seq_relationship/output_weights"),
           (r"^sop_classifier\.classifier\.bias$", "cls/seq_relationship/output_bias")]
  out = {}
  for name, value in state_dict.items():
    if name.startswith("predictions.decoder"):
      continue
    value, tf_name = np.asarray(value), name
    for pattern, repl in rules:
      tf_name = re.sub(pattern, repl, tf_name)
    if re.search(r"LayerNorm(_1)?\.", tf_name):
      tf_name = re.sub(r"(LayerNorm(_1)?)\.weight$", r"\1/gamma", tf_name)
      tf_name = re.sub(r"(LayerNorm(_1)?)\.bias$", r"\1/beta", tf_name)
    elif tf_name.endswith(".weight"):
      tf_name = tf_name[:-len(".weight")] + "/kernel"
      value = value.T
    elif tf_name.endswith(".bias"):
      tf_name = tf_name[:-len(".bias")] + "/bias"
    out[tf_name] = np.ascontiguousarray(value)
  return out


def test_google_albert_tf_checkpoint_gives_the_same_params_as_hf(hf_model, hf_dir, tmp_path):
  hf_params, _, _ = convert.import_checkpoint(hf_dir)
  tf_dir = str(tmp_path / "albert_tiny")
  variables = _tf_variables(hf_model.state_dict())
  config = {k: getattr(hf_model.config, k) for k in (
      "vocab_size", "embedding_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
      "intermediate_size", "max_position_embeddings", "type_vocab_size", "num_hidden_groups",
      "inner_group_num")}
  hf_testlib.write_tf_checkpoint(tf_dir, variables, dict(config, hidden_act="gelu"))
  os.rename(os.path.join(tf_dir, "bert_config.json"), os.path.join(tf_dir, "albert_config.json"))
  hf_testlib.write_vocab(os.path.join(tf_dir, "vocab.txt"), VOCAB)
  tf_params, tf_config, meta = convert.import_checkpoint(tf_dir)
  assert tf_config.hidden_act == "gelu_tanh" and meta["num_mapped"] == len(variables)
  fa, fb = names.flatten(tf_params), names.flatten(hf_params)
  assert sorted(fa) == sorted(fb)
  for k in fa:
    np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_bare_albert_model_and_bad_layouts(hf_model, tmp_path):
  d = hf_testlib.save_hf(hf_model.albert, str(tmp_path / "bare"))
  params, config, meta = convert.import_checkpoint(d)
  assert sorted({p.split("/")[0] for p in meta["initialized_randomly"]}) == ["mlm_head", "sop_head"]
  ours = model_lib.BertModel(config).apply({"params": params["bert"]},
                                           *hf_testlib.batch(VOCAB, seq=16)[:3])
  ids, mask, seg, _ = hf_testlib.batch(VOCAB, seq=16)
  with torch.no_grad():
    ref = hf_model.albert(input_ids=torch.tensor(ids, dtype=torch.long),
                          attention_mask=torch.tensor(mask, dtype=torch.long),
                          token_type_ids=torch.tensor(seg, dtype=torch.long))
  valid = mask.astype(bool)
  np.testing.assert_allclose(ours["sequence_output"][valid],
                             ref.last_hidden_state.numpy()[valid], atol=1e-4, rtol=0)
  np.testing.assert_allclose(ours["pooled_output"], ref.pooler_output.numpy(), atol=1e-4, rtol=0)
  cfg = json.load(open(os.path.join(d, "config.json")))
  cfg["num_hidden_groups"] = 2
  json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
  with pytest.raises(convert.ConversionError, match="num_hidden_groups=2, inner_group_num=1"):
    convert.import_checkpoint(d)
  with pytest.raises(convert.ConversionError, match="share_layers='ffn'"):
    albert.hf_config_json(model_lib.get_bert_config("albert-tiny", share_layers="ffn"))


def test_albert_with_a_sentencepiece_model_imports_predicts_and_exports(tmp_path):
  """The ALBERT way: spiece.model and no vocab.txt (the released models ship one)."""
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from data_pipelines import build_vocab  # pylint: disable=g-import-not-at-top
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  stdlib_corpus.write_corpus(str(tmp_path / "text"), num_files=1, max_modules=20)
  spm_path = str(tmp_path / "spm.model")
  build_vocab.build(str(tmp_path / "text" / "*.txt"), 400, spm_path, model_type="unigram",
                    lower_case=True, character_coverage=1.0)
  from data_pipelines.tokenizers import tokenization  # pylint: disable=g-import-not-at-top
  size = tokenization.get_tokenizer(spm_model_file=spm_path).vocab.size
  cfg = _hf_config()
  cfg.vocab_size = size
  hf = _randomise(transformers.AlbertForPreTraining(cfg), seed=6)
  hf_dir = str(tmp_path / "hf")
  hf_testlib.save_hf(hf, hf_dir, vocab=False, do_lower_case=True)
  with open(spm_path, "rb") as src, open(os.path.join(hf_dir, "spiece.model"), "wb") as dst:
    dst.write(src.read())
  meta = convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  assert meta["spm_model_file"] == "spiece.model" and meta["vocab_size"] == size
  assert meta["do_lower_case"] is True
  m = inference.load_for_inference(str(tmp_path / "orbax"))
  assert m.spm_model_file.endswith("spiece.model") and m.config.family == "albert"
  result = predict.predict(predict.load(str(tmp_path / "orbax")), "the [MASK] of the module")
  assert len(result["masks"]) == 1
  out = hf_export.export_to_hf(str(tmp_path / "orbax"), str(tmp_path / "back"))
  model = transformers.AlbertForPreTraining.from_pretrained(out).eval()
  tok = transformers.AutoTokenizer.from_pretrained(out)
  text = "return the value of the module"
  ids = [m.tokenizer.vocab.cls_id] + m.tokenizer.encode([text])[0] + [m.tokenizer.vocab.sep_id]
  assert tok(text)["input_ids"] == ids
  x = np.asarray([ids])
  ours, _ = _our_outputs(m.params, m.config, x, np.ones_like(x), np.zeros_like(x),
                         np.arange(len(ids))[None])
  with torch.no_grad():
    theirs = model(torch.tensor(x)).prediction_logits.numpy()
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)
