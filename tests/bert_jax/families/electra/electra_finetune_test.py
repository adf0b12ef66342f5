"""ELECTRA checkpoints feed the fine-tuning CLIs (the discriminator), extract_features (the
discriminator) and predict's fill-mask (the generator): heads.py, inference.py, finetune.py,
predict.py, extract_features.py. Fast tests use a random tiny ELECTRA export (the plumbing, not
the accuracy); the slow one pre-trains electra-tiny a few steps with python -m bert_jax.train and
runs the three CLIs on its workdir."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.families.electra import objective as electra
from bert_jax import extract_features as ef
from bert_jax import finetune
from bert_jax.models import heads
from bert_jax.models import model as model_lib
from bert_jax import predict
from tests.bert_jax import finetune_test
from tests.testlib import tasks_testlib

ROOT = tests.ROOT


def _config(vocab_size):
  # One layer per network: every test compiles them, on a shared 2-core CPU.
  return model_lib.get_bert_config("electra-tiny", vocab_size=vocab_size,
                                   max_position_embeddings=128, num_layers=1,
                                   generator_num_layers=1)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A random ElectraForPreTraining export (both networks) and its vocab, and the same
  checkpoint without its generator (as a discriminator imported alone)."""
  d = tmp_path_factory.mktemp("electra_export")
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(finetune_test.WORDS) + " .")
  cfg = _config(tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size)
  params = jax.jit(lambda r: nn.unbox(electra.init_params(cfg, r)))(jax.random.PRNGKey(0))
  path = ckpt_lib.save_params(str(d / "export"), params, cfg, meta={"do_lower_case": True})
  alone = ckpt_lib.save_params(
      str(d / "discriminator"), {k: params[k] for k in ("bert", "rtd_head")}, cfg,
      meta={"do_lower_case": True, "generator": "none: a discriminator imported alone"})
  return path, vocab_file, cfg, alone


@pytest.mark.parametrize("family", ["classification", "regression", "span", "tagging",
                                    "multiple_choice"])
def test_heads_load_the_discriminator_body_and_use_electras_head_not_a_pooler(family):
  cfg = _config(99)
  model = heads.create_model(family, cfg, num_labels=3)
  ids, mask, seg = heads.dummy_inputs(family, 8)
  params = nn.unbox(jax.eval_shape(lambda r: model.init(r, ids, mask, seg),
                                   jax.random.PRNGKey(0))["params"])
  pretraining = jax.eval_shape(lambda r: nn.unbox(electra.init_params(cfg, r)),
                               jax.random.PRNGKey(0))
  # params["bert"] is exactly the pre-training checkpoint's discriminator body: no pooler.
  assert "pooler" not in params["bert"] and set(params["bert"]) == {"embeddings", "encoder"}
  assert (jax.tree.map(lambda x: x.shape, params["bert"])
          == jax.tree.map(lambda x: x.shape, pretraining["bert"]))
  shapes = jax.tree.map(lambda x: x.shape, {k: v for k, v in params.items() if k != "bert"})
  h = cfg.hidden_size
  if family in ("classification", "regression", "multiple_choice"):   # ELECTRA's [CLS] head
    n = {"classification": 3, "regression": 1, "multiple_choice": 1}[family]
    assert shapes == {"classifier": {"dense": {"kernel": (h, h), "bias": (h,)},
                                     "out_proj": {"kernel": (h, n), "bias": (n,)}}}
  elif family == "span":
    assert shapes == {"qa_outputs": {"kernel": (h, 2), "bias": (2,)}}
  else:
    assert shapes == {"classifier": {"kernel": (h, 3), "bias": (3,)}}


def test_classification_head_is_dense_gelu_on_cls_then_the_output_layer():
  cfg = _config(99)
  model = heads.create_model("classification", cfg, num_labels=2)
  ids = np.asarray([[2, 7, 8, 9, 3, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  params = jax.jit(lambda r: nn.unbox(model.init(r, ids, mask, 0 * ids)))(
      jax.random.PRNGKey(1))["params"]
  body = electra.ElectraBody(cfg)
  # Jitted: op by op a tiny model's forward still takes tens of seconds on a shared CPU.
  logits, cls = jax.jit(lambda p: (
      model.apply({"params": p}, ids, mask, 0 * ids),
      body.apply({"params": p["bert"]}, ids, mask, 0 * ids,
                 method=body.model_outputs)["sequence_output"][:, 0]))(params)
  c = params["classifier"]
  x = jax.nn.gelu(cls @ c["dense"]["kernel"] + c["dense"]["bias"], approximate=False)
  np.testing.assert_allclose(logits, x @ c["out_proj"]["kernel"] + c["out_proj"]["bias"],
                             atol=1e-5)


def test_classification_finetunes_the_discriminator_and_says_so(tmp_path, pretrained, capsys):
  path, vocab_file, cfg, _ = pretrained
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)
  summary, _ = finetune_test._one_step(tmp_path, (path, vocab_file), "glue_sst2")
  printed = capsys.readouterr().out
  assert f"init_checkpoint: {path} (params export)" in printed
  assert ("ELECTRA: fine-tuning the discriminator: params['bert'] (embeddings + 1 layers of "
          "width 128; ELECTRA has no pooler); not loaded: generator, mlm_head, rtd_head") in printed
  stored = json.load(open(os.path.join(summary["best_checkpoint"], ckpt_lib.CONFIG_NAME)))
  assert stored["bert_config"]["family"] == "electra"
  params, _, _ = ckpt_lib.load_params(summary["best_checkpoint"])
  assert set(params) == {"bert", "classifier"} and set(params["classifier"]) == {"dense",
                                                                                 "out_proj"}
  # The body the run started from is the checkpoint's discriminator (one step moved it a little).
  start, _, _ = ckpt_lib.load_params(path)
  word = lambda p: np.asarray(p["bert"]["embeddings"]["word_embeddings"]["embedding"])  # noqa
  assert np.abs(word(params) - word(start)).max() < 0.01


@pytest.mark.slow   # two more fine-tuning runs (~100 s on a shared 2-core CPU)
def test_tagging_and_multiple_choice_finetune_from_the_discriminator(tmp_path, pretrained):
  path, vocab_file, _, alone = pretrained
  (tmp_path / "ner").mkdir()
  finetune_test.test_one_step_tagging(tmp_path / "ner", (path, vocab_file))
  (tmp_path / "swag").mkdir()   # from the discriminator alone: fine-tuning needs no generator
  finetune_test.test_one_step_multiple_choice(tmp_path / "swag", (alone, vocab_file))


def test_predict_fills_masks_with_the_generator(pretrained):
  path, vocab_file, cfg, alone = pretrained
  predictor = predict.load(path, vocab_file=vocab_file)
  result = predict.predict(predictor, "the cat sat on the [MASK] .", top_k=3)
  ids, mask, seg = predict.encode(predictor, "the cat sat on the [MASK] .")
  model = electra.ElectraForPreTraining(cfg)
  position = np.nonzero(ids[0] == predictor.tokenizer.vocab.mask_id)[0][None]
  want = jax.nn.softmax(model.apply({"params": predictor.params}, ids, mask, seg, position,
                                    method=model.generator_logits)[0, 0])
  top = np.argsort(-np.asarray(want))[:3]
  assert [i for _, i, _ in result["masks"][0]] == list(top)
  np.testing.assert_allclose([p for _, _, p in result["masks"][0]], np.asarray(want)[top],
                             rtol=1e-5)
  with pytest.raises(predict.PredictError, match="has no sentence-pair head"):
    predict.predict(predictor, "the cat sat .", "the dog ran .")
  with pytest.raises(predict.PredictError, match="an ELECTRA without its generator .*none: a "
                                                 "discriminator imported alone.*bert_jax.convert exports"):
    predict.load(alone, vocab_file=vocab_file)


def test_extract_features_are_the_discriminators(pretrained):
  path, vocab_file, cfg, _ = pretrained
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  params, _, _ = ckpt_lib.load_params(path)
  out, _ = ef.extract([("the cat sat".split(), None)], tokenizer, params["bert"], cfg,
                      layers=(-1,), max_seq_length=16)
  ids = np.asarray([[tokenizer.vocab.cls_id, *tokenizer.encode(["the cat sat"])[0],
                     tokenizer.vocab.sep_id]])
  # The discriminator's last layer (ElectraBody, what its replaced-token head reads).
  want = electra.ElectraBody(cfg).apply({"params": params["bert"]}, ids, np.ones_like(ids),
                                        np.zeros_like(ids), True)[0]
  np.testing.assert_allclose(out["features"], want, atol=1e-5)


# ----------------------------------------------------------------------------------------------
# Slow: electra-tiny pre-trained with python -m bert_jax.train, then the three CLIs on it.
# ----------------------------------------------------------------------------------------------
def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=600, check=False)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  return r.stdout


@pytest.mark.slow
def test_pretrained_electra_workdir_feeds_finetune_predict_and_extract_features(tmp_path):
  from data_pipelines import build_vocab  # pylint: disable=g-import-not-at-top
  from data_pipelines import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  stdlib_corpus.write_corpus(str(tmp_path / "text"), num_files=2, max_modules=20)
  vocab = str(tmp_path / "vocab.txt")
  build_vocab.build(str(tmp_path / "text" / "*.txt"), 1000, vocab, lower_case=True)
  cpd.run(cpd.Config(input_file=str(tmp_path / "text" / "*.txt"),
                     output_dir=str(tmp_path / "full"), vocab_file=vocab, max_seq_length=48,
                     dupe_factor=1, num_shards=2, no_nsp=True), show_progress=False)
  workdir = str(tmp_path / "electra")
  _run("bert_jax.train", "--config=bert_jax/configs/pretrain.py:electra-tiny,runlocal",
       f"--workdir={workdir}", f"--config.train_input_files={tmp_path}/full/part-*",
       f"--config.vocab_file={vocab}", "--config.seq_length=48",
       "--config.max_predictions_per_seq=8", "--config.batch_size=8",
       "--config.num_train_steps=4", "--config.warmup_steps=1",
       "--config.async_checkpointing=False")

  # Fine-tuning on the custom CSV task, from the workdir's step 4: the discriminator.
  rng = np.random.default_rng(0)
  words = "the and for def return class import if else self value".split()
  for name, n in (("train.csv", 16), ("dev.csv", 8)):
    rows = ["id,review,stars"]
    for i in range(n):
      y = int(rng.integers(0, 2))
      rows.append(f'{i},"{" ".join(rng.choice(words, 4))} {("return", "import")[y]}",'
                  f'{("neg", "pos")[y]}')
    (tmp_path / name).write_text("\n".join(rows) + "\n")
  out = _run("bert_jax.finetune", "--config=bert_jax/configs/finetune.py:custom,runlocal",
             f"--workdir={tmp_path / 'ft'}", f"--config.init_checkpoint={workdir}",
             f"--config.data_dir={tmp_path}", "--config.custom.format=csv",
             "--config.custom.text_a=review", "--config.custom.label=stars",
             "--config.custom.labels=neg,pos", "--config.custom.train_file=train.csv",
             "--config.custom.dev_file=dev.csv", "--config.max_seq_length=32",
             "--config.batch_size=8", "--config.eval_batch_size=8",
             "--config.num_train_epochs=1", "--config.learning_rate=1e-3")
  assert f"init_checkpoint: step 4 of {workdir}" in out, out[-3000:]
  assert "ELECTRA: fine-tuning the discriminator: params['bert'] (embeddings + 2 layers" in out
  assert "not loaded: generator, mlm_head, rtd_head" in out
  results = json.load(open(tmp_path / "ft" / "eval_results.json"))
  assert results["finished"] and 0 <= results["best_score"] <= 1

  out = _run("bert_jax.predict", f"--init_checkpoint={workdir}", "fill-mask",
             "def foo ( self ) : [MASK] value")
  assert f"loaded step 4 of {workdir}" in out and "ELECTRA: fill-mask with the generator" in out
  assert "[MASK] #1:" in out

  (tmp_path / "lines.txt").write_text("return the value\nimport self ||| class foo\n")
  out = _run("bert_jax.extract_features", f"--init_checkpoint={workdir}",
             f"--input_file={tmp_path / 'lines.txt'}",
             f"--output_file={tmp_path / 'features.npz'}")
  assert f"loaded step 4 of {workdir}" in out and "ELECTRA: features of the discriminator" in out
  assert np.load(tmp_path / "features.npz")["features"].shape[1] == 2 * 128   # 2 layers x H
