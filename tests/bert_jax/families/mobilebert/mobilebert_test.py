"""MobileBERT (bert_jax/families/mobilebert/__init__.py, mobilebert/layers.py, families/mobilebert/convert.py)
against transformers' MobileBertForPreTraining: the name table, hidden states and MLM/NSP
logits of a random folder on padded batches (both ways: import, export), parameter counts,
its own config record, and a bad size refused before compute."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import convert
from bert_jax import families
from bert_jax.models import model as model_lib
from bert_jax.inference import hf_export
from bert_jax.families.mobilebert import convert as convert_mobilebert
from bert_jax.families import mobilebert
from bert_jax.families.mobilebert import layers as mobilebert_layers
from tests.testlib import hf_testlib
from tests.testlib import xla_test_flags

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

VOCAB = 64
# The tiny preset's shape (families/mobilebert/) at VOCAB words.
TINY = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=64, embedding_size=16, intra_bottleneck_size=32,
            num_feedforward_networks=2, classifier_activation=True, max_position_embeddings=128,
            hidden_act="relu", normalization_type="no_norm")


def _hf_model(seed=0, **kw):
  """MobileBertForPreTraining with every parameter random (norm scales ~1), eval mode."""
  torch.manual_seed(seed)
  model = transformers.MobileBertForPreTraining(
      transformers.MobileBertConfig(**{**TINY, **kw})).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "LayerNorm.weight" in name else 0.0))
  return model


def _hf_outputs(model, ids, mask, seg, pos):
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long),
                token_type_ids=torch.tensor(seg, dtype=torch.long), output_hidden_states=True)
  mlm = out.prediction_logits.numpy()[np.arange(len(ids))[:, None], pos]
  return mlm, out.seq_relationship_logits.numpy(), [h.numpy() for h in out.hidden_states]


def _our_outputs(params, config, ids, mask, seg, pos):
  apply = jax.jit(lambda p: mobilebert_layers.MobileBertForPreTraining(config).apply(
      {"params": p}, ids, mask, seg, pos, return_dict=True, output_hidden_states=True))
  out = apply(params)
  hidden = np.asarray(out["hidden_states"])                                # [B, L+1, T, H]
  return np.asarray(out["mlm"]), np.asarray(out["nsp"]), [hidden[:, i]
                                                          for i in range(hidden.shape[1])]


def _assert_equal_outputs(ours, theirs, mask):
  (mlm, nsp, hidden), (hf_mlm, hf_nsp, hf_hidden) = ours, theirs
  assert len(hidden) == len(hf_hidden) == 3          # the embeddings' output and 2 layers'
  real = mask.astype(bool)                           # padded positions: no one reads them
  for i, (a, b) in enumerate(zip(hidden, hf_hidden)):
    np.testing.assert_allclose(a[real], b[real], atol=1e-4, rtol=0, err_msg=f"hidden {i}")
  np.testing.assert_allclose(mlm, hf_mlm, atol=1e-4, rtol=0)
  np.testing.assert_allclose(nsp, hf_nsp, atol=1e-4, rtol=0)
  assert np.abs(hf_mlm).max() > 1.0   # outputs that can tell a wrong parameter apart


def test_presets_and_the_family_s_own_config_record():
  c = model_lib.get_bert_config("mobilebert")
  assert isinstance(c, mobilebert_layers.MobileBertConfig) and c.family == "mobilebert"
  assert (c.num_layers, c.hidden_size, c.true_hidden_size, c.num_heads, c.embedding_size,
          c.num_feedforward_networks, c.normalization_type, c.hidden_act) == (
              24, 512, 128, 4, 128, 4, "no_norm", "relu")
  defaults = transformers.MobileBertConfig()   # the preset is transformers' defaults ...
  for ours, theirs in convert_mobilebert._BERT.items():
    if ours != "classifier_activation":
      assert getattr(c, theirs) == getattr(defaults, ours), ours
  for f in convert_mobilebert._OWN:
    if f != "classifier_activation":  # ... but google/mobilebert-uncased's pooler: none
      assert getattr(c, f) == getattr(defaults, f), f
  assert not c.classifier_activation
  # MobileBERT's fields are its record's, not the record every family carries.
  assert not hasattr(model_lib.get_bert_config("tiny"), "intra_bottleneck_size")
  assert type(model_lib.BertConfig.from_dict(c.to_dict())) is mobilebert_layers.MobileBertConfig
  assert model_lib.BertConfig.from_dict(c.to_dict()) == c
  with pytest.raises(ValueError, match=r"true hidden size 128 \(intra_bottleneck_size\) is not "
                                       "divisible by num_heads=3"):
    model_lib.get_bert_config("mobilebert", num_heads=3)
  with pytest.raises(ValueError, match="'mlm,nsp'"):
    model_lib.get_bert_config("mobilebert", objectives="mlm,sop")


def test_name_table_is_transformers_parameter_list():
  hf = transformers.MobileBertForPreTraining(transformers.MobileBertConfig(**TINY))
  config, _ = convert_mobilebert.config_from_json(hf.config.to_dict(), "config.json")
  table = convert_mobilebert.specs(config)
  hf_shapes = {n: tuple(p.shape) for n, p in hf.named_parameters()}
  assert {s.hf: s.source_shape("hf") for s in table} == hf_shapes


@pytest.mark.parametrize("kw", [{}, dict(normalization_type="layer_norm",
                                         use_bottleneck_attention=True, trigram_input=False,
                                         classifier_activation=False)],
                         ids=["no_norm", "layer_norm"])
def test_transformers_folder_imports_with_equal_outputs(tmp_path, kw):
  model = _hf_model(**kw)
  hf_dir = hf_testlib.save_hf(model, str(tmp_path / "hf"))
  meta = convert.convert_to_orbax(hf_dir, str(tmp_path / "orbax"))
  params, config, _ = ckpt_lib.load_params(str(tmp_path / "orbax"))
  assert config.family == "mobilebert" and config.normalization_type == (
      kw.get("normalization_type", "no_norm"))
  assert meta["initialized_randomly"] == []
  ids, mask, seg, pos = hf_testlib.batch(VOCAB, seq=16)
  _assert_equal_outputs(_our_outputs(params, config, ids, mask, seg, pos),
                        _hf_outputs(model, ids, mask, seg, pos), mask)


@pytest.mark.slow   # two conversions and a transformers load: ~10 s on 2 idle cores
def test_ours_exports_to_transformers_with_equal_outputs_and_back(tmp_path):
  config = model_lib.get_bert_config("mobilebert-tiny", vocab_size=VOCAB)
  ids = jnp.zeros((1, 4), jnp.int32)
  params = jax.jit(lambda k: nn.meta.unbox(mobilebert_layers.MobileBertForPreTraining(
      config).init(k, ids, ids, ids, ids[:, :1])["params"]))(jax.random.key(7))
  rng = np.random.default_rng(7)   # every leaf off its init (norms 1/0, biases 0)
  params = jax.tree.map(lambda x: np.asarray(x) + rng.normal(0, 0.1, x.shape).astype(np.float32),
                        params)
  src = str(tmp_path / "ours")
  ckpt_lib.save_params(src, params, config, {"do_lower_case": True})
  hf_testlib.write_vocab(os.path.join(src, "vocab.txt"), VOCAB)
  hf_export.export_to_hf(src, str(tmp_path / "hf"))
  hf_json = json.load(open(tmp_path / "hf" / "config.json"))
  assert hf_json["model_type"] == "mobilebert" and hf_json["architectures"] == [
      "MobileBertForPreTraining"]
  model, info = transformers.MobileBertForPreTraining.from_pretrained(
      str(tmp_path / "hf"), output_loading_info=True)
  assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
  ids, mask, seg, pos = hf_testlib.batch(VOCAB, seq=16)
  _assert_equal_outputs(_our_outputs(params, config, ids, mask, seg, pos),
                        _hf_outputs(model.eval(), ids, mask, seg, pos), mask)
  convert.convert_to_orbax(str(tmp_path / "hf"), str(tmp_path / "back"))
  back, back_config, _ = ckpt_lib.load_params(str(tmp_path / "back"))
  assert back_config == config
  hf_testlib.assert_trees_equal(back, params)


@pytest.mark.parametrize("preset", ["mobilebert-tiny",
                                    pytest.param("mobilebert", marks=pytest.mark.slow)])
def test_parameter_counts_equal_transformers(preset):
  """MobileBertForPreTraining of the same config on torch's meta device (shapes only), ours from
  jax.eval_shape: both equal families/mobilebert.num_params (mobilebert: 36,597,564 with the MLM
  head's 11.7M-row widening of the decoder; MobileBertModel alone 24,581,888)."""
  c = model_lib.get_bert_config(preset)
  ids = jnp.zeros((1, 8), jnp.int32)
  shapes = jax.eval_shape(lambda: families.get("mobilebert").pretraining_model(c).init(
      jax.random.PRNGKey(0), ids, ids, ids, ids[:, :2]))["params"]
  hf = transformers.MobileBertConfig(**convert_mobilebert.hf_config_json(c))
  with torch.device("meta"):
    full = transformers.MobileBertForPreTraining(hf)
    want = full.num_parameters()
    body = sum(p.numel() for p in transformers.MobileBertModel(hf).parameters())
  assert model_lib.count_params(shapes) == mobilebert.num_params(c) == want
  assert model_lib.count_params(shapes["bert"]) == mobilebert.num_params(c, False) == body
  if preset == "mobilebert":
    assert (want, body) == (36_597_564, 24_581_888)


def test_a_folder_transformers_cannot_run_is_one_conversion_error(tmp_path):
  """use_bottleneck without a q/k bottleneck feeds H-wide queries to B-wide projections
  (transformers' own forward fails on it): convert refuses its config in one line."""
  model = _hf_model()
  hf_dir = hf_testlib.save_hf(model, str(tmp_path / "hf"))
  path = os.path.join(hf_dir, "config.json")
  d = json.load(open(path))
  json.dump(dict(d, key_query_shared_bottleneck=False), open(path, "w"))
  with pytest.raises(convert.ConversionError, match="config.json: MobileBertConfig: "
                                                    "use_bottleneck with neither"):
    convert.import_checkpoint(hf_dir)
  json.dump(dict(d, intra_bottleneck_size=33), open(path, "w"))
  with pytest.raises(convert.ConversionError, match=r"the true hidden size 33 "
                                                    r"\(intra_bottleneck_size\) is not divisible"):
    convert.import_checkpoint(hf_dir)


@pytest.mark.slow
def test_python_m_bert_jax_train_pretrains_mobilebert_tiny_on_mlm_and_nsp(tmp_path):
  """mobilebert-tiny through the CLI for 4 steps: MLM and NSP losses logged and finite, the
  checkpoint is a MobileBERT's (its own record, its tree); a true hidden size the heads do not
  divide is one line and exit 2, before any compute."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  root = tests.ROOT
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root,
             XLA_FLAGS=xla_test_flags.with_devices(2))
  common = ["--config=bert_jax/configs/pretrain.py:mobilebert-tiny,runlocal",
            "--config.train_input_files=synthetic", "--config.model.vocab_size=128",
            "--config.seq_length=32", "--config.max_predictions_per_seq=5",
            "--config.batch_size=4", "--config.warmup_steps=1", "--config.log_every=1",
            "--config.checkpoint_every=4", "--config.async_checkpointing=False",
            "--config.num_train_steps=4"]

  def train(workdir, *extra):
    return subprocess.run([sys.executable, "-m", "bert_jax.train", f"--workdir={workdir}",
                           *common, *extra], env=env, capture_output=True, text=True, cwd=root,
                          timeout=500)

  r = train(str(tmp_path / "bad"), "--config.model.intra_bottleneck_size=33")
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
  assert "true hidden size 33 (intra_bottleneck_size) is not divisible by num_heads=2" in lines[0]
  r = train(str(tmp_path / "run"))
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  scalars = metrics_writer.read_scalars(str(tmp_path / "run" / "tensorboard"))
  for part in ("mlm", "nsp"):
    assert len(scalars[f"train/{part}_loss"]) == 4, sorted(scalars)
  assert all(np.isfinite(v) for _, v in scalars["train/loss"])
  d = ckpt_lib.describe(str(tmp_path / "run"))
  assert isinstance(d.config, mobilebert_layers.MobileBertConfig)
  params = ckpt_lib.read_params(d)
  assert set(params) == {"bert", "mlm_head", "nsp_head"}
  assert params["mlm_head"]["dense"].shape == (64 - 16, 128)   # [H - E, V]


def test_flop_count_equals_the_matmuls_of_the_traced_training_step():
  """families/mobilebert.flops_per_sequence (train.step_flops: TFLOP/s, MFU) against the dot
  products of jax.grad of the loss traced for mobilebert-tiny (families_train_test's counter)."""
  from bert_jax.objectives import pretraining as objectives  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from ml_collections import ConfigDict as dict_config  # pylint: disable=g-import-not-at-top
  from tests.bert_jax.families.families_train_test import _dot_flops  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("mobilebert-tiny", vocab_size=1000)
  b, t, p = 2, 64, 10
  model = mobilebert_layers.MobileBertForPreTraining(cfg)
  ints = lambda *shape: np.zeros(shape, np.int32)  # noqa: E731
  batch = dict(input_ids=ints(b, t), input_mask=ints(b, t) + 1, segment_ids=ints(b, t),
               masked_lm_positions=ints(b, p) + 3, masked_lm_ids=ints(b, p),
               masked_lm_weights=np.ones((b, p), np.float32), next_sentence_labels=ints(b))
  params = jax.eval_shape(lambda: nn.unbox(model.init(
      jax.random.key(0), batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])["params"]))

  def loss(params):
    out = model.apply({"params": params}, batch, True,
                      method=pretraining_heads.pretraining_outputs)
    return objectives.pretraining_loss(out, batch)[0]

  counted = _dot_flops(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
  assert counted == b * families.get("mobilebert").flops_per_sequence(cfg, t, p)
  assert train.step_flops(dict_config(dict(batch_size=b, seq_length=t,
                                           max_predictions_per_seq=p)), cfg, None) == counted


@pytest.mark.slow   # a one-step fine-tuning run: ~20 s on the loaded 2-core box
def test_a_mobilebert_checkpoint_fine_tunes_and_fills_masks(tmp_path):
  """A mobilebert-tiny export feeds the fine-tuning loop (glue_sst2, one step: the family's
  body under BERT's [CLS] head, as MobileBertForSequenceClassification) and fill-mask (its own
  MLM head through predict)."""
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from tests.bert_jax import finetune_test  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  vocab_file = tasks_testlib.write_vocab(str(tmp_path), " ".join(finetune_test.WORDS) + " .")
  vocab = tasks_testlib.ReferenceTokenizer(vocab_file).vocab
  cfg = model_lib.get_bert_config("mobilebert-tiny", vocab_size=vocab.size)
  ids = jnp.zeros((1, 4), jnp.int32)
  params = jax.jit(lambda k: nn.meta.unbox(mobilebert_layers.MobileBertForPreTraining(cfg).init(
      k, ids, ids, ids, ids[:, :1])["params"]))(jax.random.key(0))
  path = ckpt_lib.save_params(str(tmp_path / "export"), params, cfg,
                              meta={"do_lower_case": True})
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)  # pylint: disable=protected-access
  summary, _ = finetune_test._one_step(tmp_path, (path, vocab_file), "glue_sst2")  # pylint: disable=protected-access
  assert 0.0 <= summary["history"][0]["eval/dev/accuracy"] <= 1.0
  stored = json.load(open(os.path.join(summary["best_checkpoint"], ckpt_lib.CONFIG_NAME)))
  assert stored["bert_config"]["family"] == "mobilebert"
  assert stored["bert_config"]["intra_bottleneck_size"] == 32
  predictor = predict.load(path, vocab_file=vocab_file)
  result = predict.predict(predictor, "the cat sat on the [MASK] .", top_k=3)
  assert len(result["masks"]) == 1 and len(result["masks"][0]) == 3, result
  p = predict.predict(predictor, "the cat sat .", "the dog ran .")["is_next"]   # the NSP head
  assert 0.0 <= p <= 1.0


@pytest.mark.slow   # a 3-step distillation run through the CLI: ~56 s on the loaded 2-core box
def test_knowledge_transfer_from_an_ib_bert_shaped_teacher_through_the_cli(tmp_path):
  """mobilebert-tiny learns from an ib-bert-tiny teacher (the same 64-wide stream, an inverted
  bottleneck of 128, 4 layers) with layerwise.py's objective: embedding, hidden-state and
  attention-KL losses (MobileBERT's recipe: the paper's KL, not TinyBERT's score MSE) logged and
  finite over the uniform map (student layers 1, 2 -> teacher 2, 4), the teacher recorded; a
  teacher of another width without fit_size is one line, exit 2."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  root = tests.ROOT
  teachers = {}
  for name, kw in (("teacher", {}), ("wide", dict(hidden_size=96))):
    c = model_lib.get_bert_config("ib-bert-tiny", vocab_size=128, **kw)
    ids = jnp.zeros((1, 4), jnp.int32)
    params = jax.jit(lambda k, c=c: nn.meta.unbox(mobilebert_layers.MobileBertForPreTraining(
        c).init(k, ids, ids, ids, ids[:, :1])["params"]))(jax.random.key(1))
    teachers[name] = ckpt_lib.save_params(str(tmp_path / name), params, c)
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=root,
             XLA_FLAGS=xla_test_flags.with_devices(2))

  def train(workdir, teacher):
    return subprocess.run(
        [sys.executable, "-m", "bert_jax.train", f"--workdir={workdir}",
         "--config=bert_jax/configs/pretrain.py:mobilebert-tiny,runlocal",
         f"--config.teacher_checkpoint={teacher}", "--config.train_input_files=synthetic",
         "--config.model.vocab_size=128", "--config.seq_length=32",
         "--config.max_predictions_per_seq=5", "--config.batch_size=4",
         "--config.warmup_steps=1", "--config.log_every=1", "--config.checkpoint_every=3",
         "--config.async_checkpointing=False", "--config.num_train_steps=3"],
        env=env, capture_output=True, text=True, cwd=root, timeout=500)

  r = train(str(tmp_path / "bad"), teachers["wide"])
  lines = r.stderr.strip().splitlines()
  assert r.returncode == 2 and len(lines) == 1 and "--config.fit_size=96" in lines[0], r.stderr
  r = train(str(tmp_path / "run"), teachers["teacher"])
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  scalars = metrics_writer.read_scalars(str(tmp_path / "run" / "tensorboard"))
  assert "train/distill_att_loss" not in scalars
  for part in ("distill_emb", "distill_hidden", "distill_att_kl"):
    assert len(scalars[f"train/{part}_loss"]) == 3, sorted(scalars)
    assert all(np.isfinite(v) and v > 0 for _, v in scalars[f"train/{part}_loss"])
  d = ckpt_lib.describe(str(tmp_path / "run"))
  assert d.config.family == "mobilebert" and d.meta["teacher"]["path"] == teachers["teacher"]
