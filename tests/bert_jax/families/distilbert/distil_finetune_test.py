"""DistilBERT checkpoints feed the fine-tuning CLIs, predict's fill-mask and extract_features
(heads.py, inference.py, finetune.py, predict.py, extract_features.py): params["bert"] without
token types or pooler; [CLS] tasks get transformers' DistilBertForSequenceClassification head
(pre_classifier + ReLU, dropout, classifier). Fast tests use a random distilbert-tiny export (the
plumbing, not accuracy) and random transformers folders (parity); the slow one distils
distilbert-tiny with python -m bert_jax.train and runs the three CLIs on its workdir."""

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
from bert_jax import extract_features as ef
from bert_jax.models import heads
from bert_jax.inference import loading as inference
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax import predict
from tests.bert_jax import finetune_test
from tests.testlib import tasks_testlib

ROOT = tests.ROOT


def _config(vocab_size):
  # distilbert-tiny is one layer of width 128: every test compiles it on a shared 2-core CPU.
  return model_lib.get_bert_config("distilbert-tiny", vocab_size=vocab_size,
                                   max_position_embeddings=128)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
  """A random distilbert-tiny BertForPreTraining export (bert + mlm_head) and its vocab."""
  d = tmp_path_factory.mktemp("distilbert_export")
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(finetune_test.WORDS) + " .")
  cfg = _config(tasks_testlib.ReferenceTokenizer(vocab_file).vocab.size)
  params = jax.jit(lambda r: nn.unbox(pretraining_heads.init_params(cfg, r)))(jax.random.PRNGKey(0))
  path = ckpt_lib.save_params(str(d / "export"), params, cfg, meta={"do_lower_case": True})
  return path, vocab_file, cfg


@pytest.mark.parametrize("family", ["classification", "regression", "span", "tagging",
                                    "multiple_choice"])
def test_heads_load_the_distilbert_body_and_use_its_head_not_a_pooler(family):
  cfg = _config(99)
  model = heads.create_model(family, cfg, num_labels=3)
  ids, mask, seg = heads.dummy_inputs(family, 8)
  params = nn.unbox(jax.eval_shape(lambda r: model.init(r, ids, mask, seg),
                                   jax.random.PRNGKey(0))["params"])
  pretraining = jax.eval_shape(lambda r: nn.unbox(pretraining_heads.init_params(cfg, r)),
                               jax.random.PRNGKey(0))
  # params["bert"] is exactly a distillation checkpoint's body: no pooler, no token types.
  assert "pooler" not in params["bert"] and set(params["bert"]) == {"embeddings", "encoder"}
  assert "token_type_embeddings" not in params["bert"]["embeddings"]
  assert (jax.tree.map(lambda x: x.shape, params["bert"])
          == jax.tree.map(lambda x: x.shape, pretraining["bert"]))
  shapes = jax.tree.map(lambda x: x.shape, {k: v for k, v in params.items() if k != "bert"})
  h = cfg.hidden_size
  if family in ("classification", "regression", "multiple_choice"):   # HF's names
    n = {"classification": 3, "regression": 1, "multiple_choice": 1}[family]
    assert shapes == {"pre_classifier": {"kernel": (h, h), "bias": (h,)},
                      "classifier": {"kernel": (h, n), "bias": (n,)}}
  elif family == "span":
    assert shapes == {"qa_outputs": {"kernel": (h, 2), "bias": (2,)}}
  else:
    assert shapes == {"classifier": {"kernel": (h, 3), "bias": (3,)}}


def test_classification_head_is_relu_pre_classifier_on_cls_and_segments_are_unused():
  cfg = _config(99)
  model = heads.create_model("classification", cfg, num_labels=2)
  ids = np.asarray([[2, 7, 8, 3, 9, 10, 3, 0]], np.int32)    # [CLS] a [SEP] b [SEP] [PAD]
  mask = (ids > 0).astype(np.int32)
  pair = np.asarray([[0, 0, 0, 0, 1, 1, 1, 0]], np.int32)
  params = jax.jit(lambda r: nn.unbox(model.init(r, ids, mask, 0 * ids)))(
      jax.random.PRNGKey(1))["params"]
  body = model_lib.BertModel(cfg)
  # Jitted: op by op a tiny model's forward still takes tens of seconds on a shared CPU.
  logits, logits_pair, cls = jax.jit(lambda p: (
      model.apply({"params": p}, ids, mask, 0 * ids),
      model.apply({"params": p}, ids, mask, pair),
      body.apply({"params": p["bert"]}, ids, mask, 0 * ids)["sequence_output"][:, 0]))(params)
  x = np.maximum(cls @ params["pre_classifier"]["kernel"] + params["pre_classifier"]["bias"], 0)
  want = x @ params["classifier"]["kernel"] + params["classifier"]["bias"]
  np.testing.assert_allclose(logits, want, atol=1e-5)
  np.testing.assert_array_equal(logits_pair, logits)   # no segment embedding, as transformers


def test_classification_finetunes_the_distilbert_body_and_says_so(tmp_path, pretrained, capsys):
  path, vocab_file, _ = pretrained
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)   # pylint: disable=protected-access
  summary, _ = finetune_test._one_step(tmp_path, (path, vocab_file), "glue_sst2")  # pylint: disable=protected-access
  printed = capsys.readouterr().out
  assert f"init_checkpoint: {path} (params export)" in printed
  assert ("DistilBERT: fine-tuning params['bert'] (embeddings + 1 layers of width 128; no token "
          "types: a pair is [CLS] a [SEP] b [SEP] without segment embeddings; no pooler); not "
          "loaded: mlm_head; a [CLS] task gets DistilBERT's head, new (pre_classifier dense + "
          "ReLU on [CLS], dropout 0.2, classifier") in printed
  stored = json.load(open(os.path.join(summary["best_checkpoint"], ckpt_lib.CONFIG_NAME)))
  assert stored["bert_config"]["family"] == "distilbert"
  params, _, _ = ckpt_lib.load_params(summary["best_checkpoint"])
  assert set(params) == {"bert", "pre_classifier", "classifier"}
  start, _, _ = ckpt_lib.load_params(path)
  word = lambda p: np.asarray(p["bert"]["embeddings"]["word_embeddings"]["embedding"])  # noqa
  assert np.abs(word(params) - word(start)).max() < 0.01   # one step from the checkpoint's body


def test_predict_fills_masks_with_the_mlm_head(pretrained, capsys):
  path, vocab_file, cfg = pretrained
  predictor = predict.load(path, vocab_file=vocab_file)
  result = predict.predict(predictor, "the cat sat on the [MASK] .", top_k=3)
  ids, mask, seg = predict.encode(predictor, "the cat sat on the [MASK] .")
  position = np.nonzero(ids[0] == predictor.tokenizer.vocab.mask_id)[0][None]
  mlm, _ = pretraining_heads.BertForPreTraining(cfg).apply({"params": predictor.params}, ids,
                                                           mask, seg,
                                                   position)
  want = np.asarray(jax.nn.softmax(mlm[0, 0]))
  top = np.argsort(-want, kind="stable")[:3]
  assert [i for _, i, _ in result["masks"][0]] == list(top)
  np.testing.assert_allclose([p for _, _, p in result["masks"][0]], want[top], rtol=1e-5)
  with pytest.raises(predict.PredictError, match="has no sentence-pair head"):
    predict.predict(predictor, "the cat sat .", "the dog ran .")


def test_extract_features_are_the_bert_models_and_pairs_have_no_segment_embedding(pretrained):
  path, vocab_file, cfg = pretrained
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  params, _, _ = ckpt_lib.load_params(path)
  out, _ = ef.extract([("the cat".split(), "sat".split())], tokenizer, params["bert"], cfg,
                      layers=(-1,), max_seq_length=16)
  v = tokenizer.vocab
  a, b = tokenizer.encode(["the cat", "sat"])
  ids = np.asarray([[v.cls_id, *a, v.sep_id, *b, v.sep_id]])
  want = model_lib.BertModel(cfg).apply({"params": params["bert"]}, ids, np.ones_like(ids),
                                        np.zeros_like(ids))["sequence_output"][0]
  np.testing.assert_allclose(out["features"], want, atol=1e-5)
  assert list(out["segment_ids"]) == [0] * (len(a) + 2) + [1] * (len(b) + 1)


# ----------------------------------------------------------------------------------------------
# Task-specific distillation: --config.distill_teacher (a fine-tuned teacher's soft labels).
# ----------------------------------------------------------------------------------------------
def test_distill_loss_is_alpha_t2_kl_plus_hard_cross_entropy():
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  student, teacher = rng.normal(size=(4, 3)) * 2, rng.normal(size=(4, 3)) * 2
  batch = dict(label_ids=np.asarray([0, 1, 2, 1]), example_weights=np.asarray([1, 1, 1, 0.]),
               teacher_logits=teacher)
  hard, _ = ft.loss_fn("classification", student, batch)
  t, alpha = 2.0, 0.3
  loss, metrics = ft.distill_loss_fn("classification", alpha, t, student, batch)

  def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))
  pt = np.exp(log_softmax(teacher / t))
  kl = (pt * (log_softmax(teacher / t) - log_softmax(student / t))).sum(-1)[:3].mean()
  np.testing.assert_allclose(metrics["distill_loss"], kl * t * t, rtol=1e-5)
  np.testing.assert_allclose(loss, alpha * kl * t * t + (1 - alpha) * hard, rtol=1e-5)
  same, _ = ft.distill_loss_fn("classification", 1.0, t, teacher, batch)   # student = teacher
  np.testing.assert_allclose(same, 0.0, atol=1e-6)


def test_a_distill_teacher_that_does_not_fit_is_refused_in_one_line(tmp_path, pretrained):
  """Before compute: no training, no task head, another task, a regression task."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  path, vocab_file, cfg = pretrained
  labels = list(finetune.ft.build_task(finetune_test._config(  # pylint: disable=protected-access
      "glue_sst2", (path, vocab_file), tmp_path)).labels)
  params, _, _ = ckpt_lib.load_params(path)
  # What a sst2 run's best_epoch1/ records (the arrays are not read by these checks).
  teacher = ckpt_lib.save_params(str(tmp_path / "best_epoch1"), params, cfg, meta=dict(
      task="sst2", epoch=1, labels=labels, do_lower_case=True))
  tokenizer = None

  def refused(match, **kw):
    nonlocal tokenizer
    c = finetune_test._config("glue_sst2", (path, vocab_file), tmp_path,  # pylint: disable=protected-access
                              distill_teacher=teacher)
    for k, v in kw.items():
      setattr(c, k, v)
    tokenizer = tokenizer or finetune.load_init_checkpoint(c)[0]
    with pytest.raises(finetune.ConfigError, match=match):
      finetune.load_distill_teacher(c, finetune.ft.build_task(c), tokenizer)
  refused("with do_train=false: the teacher only teaches a training run", do_train=False)
  refused(r"is not a fine-tuning export \(no task head\)", distill_teacher=path)
  refused(r"fine-tuned on 'sst2', not 'cola'", task="cola")
  refused("soft labels are for classification; task stsb is regression", task="stsb")
  refused(r"distill_alpha=1.5 \(0..1\)", distill_alpha=1.5)


@pytest.mark.slow   # two fine-tuning runs, the second with two networks (~140 s, shared CPU)
def test_a_bert_teacher_distils_a_distilbert_student_in_finetune(tmp_path, pretrained, capsys):
  """A BERT fine-tuned on the task (one step: the plumbing) teaches the DistilBERT student:
  the teacher runs frozen in the step, the loss is the distillation loss, each part logged."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.evaluation import metrics_writer  # pylint: disable=g-import-not-at-top
  path, vocab_file, cfg = pretrained
  bert_cfg = model_lib.get_bert_config("tiny", vocab_size=cfg.vocab_size, num_layers=1,
                                       max_position_embeddings=128)
  bert = ckpt_lib.save_params(str(tmp_path / "bert"), jax.jit(lambda r: nn.unbox(
      pretraining_heads.init_params(bert_cfg, r)))(jax.random.PRNGKey(2)), bert_cfg,
      meta={"do_lower_case": True})
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)   # pylint: disable=protected-access
  teacher, _ = finetune_test._one_step(tmp_path, (bert, vocab_file), "glue_sst2")  # pylint: disable=protected-access
  capsys.readouterr()
  config = finetune_test._config("glue_sst2", (path, vocab_file), tmp_path,  # pylint: disable=protected-access
                                 num_train_epochs=1.0, do_predict=False, log_every=1,
                                 distill_teacher=teacher["best_checkpoint"],
                                 distill_alpha=0.7, distill_temperature=3.0)
  summary = finetune.finetune(config, str(tmp_path / "student"))
  assert summary["steps"] == 1 and summary["best_epoch"] == 1
  printed = capsys.readouterr().out
  assert (f"distill_teacher: {teacher['best_checkpoint']} (fine-tuning export: sst2 epoch 1) "
          "(bert, 1 layers of width 128, fine-tuned on sst2); soft labels at temperature 3: "
          "loss = 0.7 x T^2 x KL(teacher || student) + 0.3 x cross-entropy") in printed, printed
  assert "DistilBERT: fine-tuning params['bert']" in printed
  scalars = metrics_writer.read_scalars(str(tmp_path / "student" / "tensorboard"))
  ((_, loss),), ((_, soft),), ((_, hard),) = (scalars[f"train/{k}"] for k in (
      "loss", "distill_loss", "hard_loss"))
  np.testing.assert_allclose(loss, 0.7 * soft + 0.3 * hard, rtol=1e-5)
  assert soft > 0 and "train/teacher_agreement" in scalars
  params, _, _ = ckpt_lib.load_params(summary["best_checkpoint"])
  assert set(params) == {"bert", "pre_classifier", "classifier"}   # the student alone


# ----------------------------------------------------------------------------------------------
# transformers folders, converted on the fly (inference.convert_distilbert_for_inference).
# ----------------------------------------------------------------------------------------------
def _hf_folders(tmp_path):
  """A random DistilBertForSequenceClassification, its body saved as DistilBertModel, and a
  random DistilBertForMaskedLM, each with a vocab.txt."""
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  from tests.testlib import hf_testlib  # pylint: disable=g-import-not-at-top
  config = transformers.DistilBertConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4,
                                         hidden_dim=48, max_position_embeddings=40, num_labels=3)
  torch.manual_seed(0)
  classifier = transformers.DistilBertForSequenceClassification(config).eval()
  with torch.no_grad():
    for name, p in classifier.named_parameters():
      p.copy_(torch.randn_like(p) * 0.2 + (1.0 if "layer_norm.weight" in name.lower() or
                                           name.endswith("LayerNorm.weight") else 0.0))
  body = hf_testlib.save_hf(classifier.distilbert, str(tmp_path / "body"), do_lower_case=True)
  mlm = hf_testlib.save_hf(transformers.DistilBertForMaskedLM(config).eval(),
                           str(tmp_path / "mlm"), do_lower_case=True)
  return torch, classifier, body, mlm


def test_hf_folders_convert_on_the_fly_and_our_head_is_transformers(tmp_path, monkeypatch,
                                                                      capsys):
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  torch, hf_classifier, body_dir, mlm_dir = _hf_folders(tmp_path)
  m = inference.load_for_inference(body_dir)
  printed = capsys.readouterr().out
  assert "a Hugging Face folder (distilbert; no MLM head: initialised randomly" in printed
  assert m.config.family == "distilbert" and m.config.type_vocab_size == 0
  # Our classification head with the HF head's weights gives DistilBertForSequenceClassification's
  # logits (torch Linear [out, in] -> our kernel [in, out]).
  sd = {k: v.numpy() for k, v in hf_classifier.state_dict().items()}
  params = {"bert": m.params["bert"],
            "pre_classifier": {"kernel": sd["pre_classifier.weight"].T,
                               "bias": sd["pre_classifier.bias"]},
            "classifier": {"kernel": sd["classifier.weight"].T, "bias": sd["classifier.bias"]}}
  ids = np.asarray([[3, 10, 11, 12, 4, 13, 14, 4, 0, 0]], np.int32)
  mask = (ids > 0).astype(np.int32)
  ours = heads.create_model("classification", m.config, num_labels=3).apply(
      {"params": params}, ids, mask, np.zeros_like(ids))
  with torch.no_grad():
    want = hf_classifier(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask, dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(ours, want, atol=1e-4)
  # fill-mask refuses the body's random MLM head, in one line; the ForMaskedLM folder works.
  with pytest.raises(predict.PredictError, match="MLM head was initialised randomly"):
    predict.load(body_dir)
  predictor = predict.load(mlm_dir)
  printed = capsys.readouterr().out
  assert f"{mlm_dir}: a Hugging Face folder (distilbert); converted to Orbax" in printed
  assert len(predict.predict(predictor, "the man went to the [MASK] .")["masks"]) == 1
  # Converted once: the second load reads the cache.
  inference.load_for_inference(mlm_dir, with_params=False)
  assert "using its converted copy" in capsys.readouterr().out


def test_an_hf_folder_without_its_vocab_is_one_line(tmp_path, monkeypatch):
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  _, _, body_dir, _ = _hf_folders(tmp_path)
  os.remove(os.path.join(body_dir, "vocab.txt"))
  from bert_jax.convert import ConversionError  # pylint: disable=g-import-not-at-top
  with pytest.raises(ConversionError,   # the one converter's (families/distilbert/'s import)
                     match=r"a transformers DistilBERT folder without its tokenizer \(vocab.txt\)"
                           r"; save the tokenizer into it too"):
    inference.load_for_inference(body_dir)


# ----------------------------------------------------------------------------------------------
# Slow: distilbert-tiny distilled with python -m bert_jax.train, then the three CLIs on it.
# ----------------------------------------------------------------------------------------------
def _run(*args):
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=600, check=False)
  assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
  return r.stdout


@pytest.mark.slow
def test_distilled_workdir_feeds_finetune_predict_and_extract_features(tmp_path):
  from data_pipelines import build_vocab  # pylint: disable=g-import-not-at-top
  from data_pipelines import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  stdlib_corpus.write_corpus(str(tmp_path / "text"), num_files=2, max_modules=20)
  vocab = str(tmp_path / "vocab.txt")
  build_vocab.build(str(tmp_path / "text" / "*.txt"), 1000, vocab, lower_case=True)
  cpd.run(cpd.Config(input_file=str(tmp_path / "text" / "*.txt"),
                     output_dir=str(tmp_path / "full"), vocab_file=vocab, max_seq_length=48,
                     dupe_factor=1, num_shards=2, no_nsp=True), show_progress=False)
  # The teacher: a random BERT-tiny export with the same vocab (any checkpoint we load).
  size = tasks_testlib.ReferenceTokenizer(vocab).vocab.size
  teacher_cfg = model_lib.get_bert_config("tiny", vocab_size=size)   # 512 positions, as the student
  teacher = ckpt_lib.save_params(
      str(tmp_path / "teacher"), jax.jit(lambda r: nn.unbox(pretraining_heads.init_params(
          teacher_cfg, r)))(jax.random.PRNGKey(0)), teacher_cfg,
      meta={"do_lower_case": True, "vocab_file": vocab})
  workdir = str(tmp_path / "distil")
  _run("bert_jax.train", "--config=bert_jax/configs/pretrain.py:distilbert-tiny,runlocal",
       f"--workdir={workdir}", f"--config.teacher_checkpoint={teacher}",
       f"--config.train_input_files={tmp_path}/full/part-*", f"--config.vocab_file={vocab}",
       "--config.seq_length=48", "--config.max_predictions_per_seq=8", "--config.batch_size=8",
       "--config.num_train_steps=3", "--config.warmup_steps=1",
       "--config.async_checkpointing=False")

  # A sentence-pair custom CSV task from the workdir's step 3: no segment embeddings.
  rng = np.random.default_rng(0)
  words = "the and for def return class import if else self value".split()
  for name, n in (("train.csv", 16), ("dev.csv", 8)):
    rows = ["id,a,b,stars"]
    for i in range(n):
      y = int(rng.integers(0, 2))
      rows.append(f'{i},"{" ".join(rng.choice(words, 3))}","{("return", "import")[y]} self",'
                  f'{("neg", "pos")[y]}')
    (tmp_path / name).write_text("\n".join(rows) + "\n")
  out = _run("bert_jax.finetune", "--config=bert_jax/configs/finetune.py:custom,runlocal",
             f"--workdir={tmp_path / 'ft'}", f"--config.init_checkpoint={workdir}",
             f"--config.data_dir={tmp_path}", "--config.custom.format=csv",
             "--config.custom.text_a=a", "--config.custom.text_b=b",
             "--config.custom.label=stars", "--config.custom.labels=neg,pos",
             "--config.custom.train_file=train.csv", "--config.custom.dev_file=dev.csv",
             "--config.max_seq_length=32", "--config.batch_size=8", "--config.eval_batch_size=8",
             "--config.num_train_epochs=1", "--config.learning_rate=1e-3")
  assert f"init_checkpoint: step 3 of {workdir}" in out, out[-3000:]
  assert "DistilBERT: fine-tuning params['bert'] (embeddings + 1 layers" in out
  assert "not loaded: mlm_head" in out
  results = json.load(open(tmp_path / "ft" / "eval_results.json"))
  assert results["finished"] and 0 <= results["best_score"] <= 1

  out = _run("bert_jax.predict", f"--init_checkpoint={workdir}", "fill-mask",
             "def foo ( self ) : [MASK] value")
  assert f"loaded step 3 of {workdir}" in out and "DistilBERT: fill-mask with its MLM head" in out
  assert "[MASK] #1:" in out

  (tmp_path / "lines.txt").write_text("return the value\nimport self ||| class foo\n")
  out = _run("bert_jax.extract_features", f"--init_checkpoint={workdir}",
             f"--input_file={tmp_path / 'lines.txt'}",
             f"--output_file={tmp_path / 'features.npz'}")
  assert f"loaded step 3 of {workdir}" in out and "DistilBERT: features of params['bert']" in out
  assert np.load(tmp_path / "features.npz")["features"].shape[1] == 128   # 1 layer x H
