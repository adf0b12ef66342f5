"""ALBERT and SpanBERT checkpoints feed the existing fine-tuning CLIs, predict and
extract_features (tiny random checkpoints: one step each, the plumbing, not the accuracy)."""

import json
import os

import jax
import numpy as np
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax import extract_features as ef
from bert_jax import finetune
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax import predict
from tests.bert_jax import finetune_test
from tests.testlib import tasks_testlib

FAMILIES = {"albert": dict(name="albert-tiny", embedding_size=32),
            "spanbert": dict(name="spanbert-tiny")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def pretrained(request, tmp_path_factory):
  d = tmp_path_factory.mktemp(request.param)
  vocab_file = tasks_testlib.write_vocab(str(d), " ".join(finetune_test.WORDS) + " .")
  vocab = tasks_testlib.ReferenceTokenizer(vocab_file).vocab
  kw = dict(FAMILIES[request.param])
  cfg = model_lib.get_bert_config(kw.pop("name"), vocab_size=vocab.size,
                                  max_position_embeddings=128, hidden_size=64, num_heads=2,
                                  intermediate_size=128, **kw)
  params = nn.unbox(pretraining_heads.init_params(cfg, jax.random.PRNGKey(0)))
  path = ckpt_lib.save_params(str(d / "export"), params, cfg, meta={"do_lower_case": True})
  return path, vocab_file, cfg


def test_classification_finetunes_from_the_checkpoint(tmp_path, pretrained):
  path, vocab_file, cfg = pretrained
  finetune_test._sst2(tmp_path, np.random.default_rng(0), 8, 8)
  summary, workdir = finetune_test._one_step(tmp_path, (path, vocab_file), "glue_sst2")
  assert 0.0 <= summary["history"][0]["eval/dev/accuracy"] <= 1.0
  _assert_same_family(summary, cfg)


def _assert_same_family(summary, cfg):
  """The fine-tuned encoder is the checkpoint's family (shared layers, E=32 for ALBERT)."""
  stored = json.load(open(os.path.join(summary["best_checkpoint"], ckpt_lib.CONFIG_NAME)))
  config = stored["bert_config"]
  assert config.get("family", "bert") == cfg.family
  assert config.get("share_layers", "none") == cfg.share_layers
  assert config.get("embedding_size", 0) == cfg.embedding_size


def test_tagging_and_multiple_choice_finetune_from_the_checkpoint(tmp_path, pretrained,
                                                                  monkeypatch):
  """NER (conll03) and SWAG: finetune_test's one-step runs, started from ALBERT / SpanBERT."""
  path, vocab_file, cfg = pretrained
  summaries = []
  real = finetune.finetune
  monkeypatch.setattr(finetune, "finetune", lambda *a: summaries.append(real(*a)) or summaries[-1])
  for name, test in (("ner", finetune_test.test_one_step_tagging),
                     ("swag", finetune_test.test_one_step_multiple_choice)):
    (tmp_path / name).mkdir()
    test(tmp_path / name, (path, vocab_file))
  assert len(summaries) == 2
  for summary in summaries:
    _assert_same_family(summary, cfg)


def test_span_qa_finetunes_from_the_checkpoint(tmp_path, pretrained):
  path, vocab_file, _ = pretrained
  articles = []
  for i, (who, city) in enumerate([("john", "paris"), ("mary", "rome")] * 4):
    context = f"the cat sat . {who.title()} went to {city.title()} . the end."
    articles.append({"title": f"t{i}", "paragraphs": [{"context": context, "qas": [{
        "id": f"q{i}", "question": f"where did {who} go", "is_impossible": False,
        "answers": [{"text": city.title(), "answer_start": context.index(city.title())}]}]}]})
  for name in ("train-v1.1.json", "dev-v1.1.json"):
    (tmp_path / name).write_text(json.dumps({"version": "1.1", "data": articles}))
  summary, _ = finetune_test._one_step(tmp_path, (path, vocab_file), "squad_v1",
                                       max_seq_length=48, doc_stride=16, max_query_length=12)
  assert "eval/dev/f1" in summary["history"][0]


def test_predict_and_extract_features_from_the_checkpoint(pretrained):
  path, vocab_file, cfg = pretrained
  predictor = predict.load(path, vocab_file=vocab_file)
  result = predict.predict(predictor, "the cat sat on the [MASK] .", top_k=3)
  assert len(result["masks"]) == 1 and len(result["masks"][0]) == 3
  if cfg.sentence_objective == "sop":
    p = predict.predict(predictor, "the cat sat .", "the dog ran .")["is_next"]
    assert 0.0 <= p <= 1.0
  else:
    with pytest.raises(predict.PredictError, match="has no sentence-pair head"):
      predict.predict(predictor, "the cat sat .", "the dog ran .")
  tokenizer = tasks_testlib.ReferenceTokenizer(vocab_file)
  params, _, _ = ckpt_lib.load_params(path)
  out, _ = ef.extract([("the cat sat".split(), None)], tokenizer, params["bert"], cfg,
                      layers=(-1,), max_seq_length=16)
  ids = np.asarray([[tokenizer.vocab.cls_id, *tokenizer.encode(["the cat sat"])[0],
                     tokenizer.vocab.sep_id]])
  want = model_lib.BertModel(cfg).apply({"params": params["bert"]}, ids, np.ones_like(ids),
                                        np.zeros_like(ids))["sequence_output"][0]
  np.testing.assert_allclose(out["features"], want, atol=1e-5)
