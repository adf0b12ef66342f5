"""sentence-transformers CrossEncoder folders both ways (bert_jax/convert/cross_encoder.py): a
folder CrossEncoder.save wrote (a tiny random BertForSequenceClassification, one label) imported
into ours scores real standard-library docstring pairs as CrossEncoder.predict does, within 1e-4;
our reranker exported back loads in CrossEncoder(path) with the same scores; the files are what
CrossEncoder.save writes."""

import json
import os

import numpy as np
import pytest

from bert_jax import convert
from bert_jax import predict
from bert_jax.convert import cross_encoder
from tests.testlib import reranker_testlib

torch = pytest.importorskip("torch")
st = pytest.importorskip("sentence_transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("ce"))
  rows, vocab = reranker_testlib.docstring_rows(d, packages=("json", "statistics", "textwrap"))
  theirs = reranker_testlib.write_cross_encoder(d, vocab, max_length=128)
  ours = os.path.join(d, "ours")
  convert.convert_to_orbax(theirs, ours)   # what `python -m bert_jax.convert` runs
  return rows, theirs, ours, d


def _pairs(m, rows, limit=126):
  """(query, [documents]) of real rows whose every pair fits in 128 tokens (no truncation, whose
  rules differ in detail between the two tokenizers' pair cutting)."""
  out = []
  for q, p, ns in rows["train"] + rows["dev"] + rows["test"]:
    docs = [p] + ns
    n = [len(x) for x in m.tokenizer.encode([q] + docs)]
    if all(n[0] + k + 3 <= limit for k in n[1:]):
      out.append((q, docs))
  return out


def _theirs(folder, query, docs):
  model = st.CrossEncoder(folder)
  return model.predict([(query, d) for d in docs], activation_fn=torch.nn.Identity())


def test_their_folder_imported_scores_as_their_cross_encoder(folders):
  rows, theirs, ours, _ = folders
  m = predict.load_reranker(ours)
  assert m.meta["task_type"] == "reranker" and set(m.params) == {"bert", "classifier"}
  pairs = _pairs(m, rows)
  assert len(pairs) >= 10
  model = st.CrossEncoder(theirs)
  for query, docs in pairs[:10]:
    want = model.predict([(query, d) for d in docs], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(predict.rerank_scores(m, query, docs), want, atol=1e-4)
  # the batched form mining rescores with: every pair of the 10 queries in batches of 7 (the
  # last one padded), in order, the same scores as each query's own call
  flat = [(q, d) for q, docs in pairs[:10] for d in docs]
  want = np.concatenate([predict.rerank_scores(m, q, docs) for q, docs in pairs[:10]])
  np.testing.assert_allclose(predict.rerank_pair_scores(m, flat, batch_size=7), want, atol=1e-5)
  np.testing.assert_allclose(predict.apply_rerank_activation(m, want[:3]),
                             predict.rerank_predict(m, pairs[0][0], pairs[0][1])[:3], atol=1e-6)


def test_ours_exported_loads_in_cross_encoder_with_the_same_scores(folders):
  rows, theirs, ours, d = folders
  m = predict.load_reranker(ours)
  out = cross_encoder.export(m, os.path.join(d, "exported"))
  # Their files, the tokenizer as vocab.txt (transformers builds the same fast tokenizer from it)
  assert set(os.listdir(out)) >= set(os.listdir(theirs)) - {"tokenizer.json"} | {"vocab.txt"}
  st_config = json.load(open(os.path.join(out, "config_sentence_transformers.json")))
  assert st_config["model_type"] == "CrossEncoder"
  assert json.load(open(os.path.join(out, "config.json")))["architectures"] == [
      "BertForSequenceClassification"]
  model = st.CrossEncoder(out)
  assert model.num_labels == 1 and isinstance(model.activation_fn, torch.nn.Sigmoid)
  for query, docs in _pairs(m, rows)[:10]:
    ours_scores = predict.rerank_scores(m, query, docs)
    want = model.predict([(query, x) for x in docs], activation_fn=torch.nn.Identity())
    np.testing.assert_allclose(ours_scores, want, atol=1e-4)
    ranked = model.rank(query, docs)   # their ranking is ours
    assert [r["corpus_id"] for r in ranked] == list(np.argsort(-ours_scores, kind="stable"))


def test_a_plain_export_is_refused_in_one_line(folders, tmp_path):
  _, _, ours, _ = folders
  m = predict.load_reranker(ours)
  m.meta = dict(m.meta, task_type="embedding")
  with pytest.raises(cross_encoder.CrossEncoderError, match="exports a reranker"):
    cross_encoder.export(m, str(tmp_path / "x"))
  assert not (tmp_path / "x").exists()


def test_predict_rerank_refuses_an_embedding_export(folders, tmp_path):
  """An embedding run's export (task_type embedding) given to rerank: one line naming embed."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  _, _, ours, _ = folders
  found = ckpt_lib.describe(ours, verify=False)
  params = ckpt_lib.read_params(found)
  meta = dict(found.meta, task_type="embedding")
  meta["_vocab_path"] = os.path.join(ours, "vocab.txt")
  meta.pop("vocab_hash", None)
  from bert_jax.convert import writing  # pylint: disable=g-import-not-at-top
  writing.write_export(str(tmp_path / "emb"), {"bert": params["bert"]}, found.config, meta)
  with pytest.raises(predict.PredictError, match="rerank needs a reranker.*use `embed`"):
    predict.load_reranker(str(tmp_path / "emb"))


@pytest.mark.slow   # three programs in subprocesses
def test_the_programs_convert_both_ways_and_rerank(folders, tmp_path):
  """`python -m bert_jax.convert` (a CrossEncoder folder -> ours, ours --to=cross_encoder) and
  `python -m bert_jax.predict rerank`: the documents best first with CrossEncoder's scores."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests import ROOT  # pylint: disable=g-import-not-at-top
  rows, theirs, _, _ = folders
  env = dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu")

  def run(*args):
    p = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert p.returncode == 0, (p.stdout[-2000:], p.stderr[-2000:])
    return p.stdout

  ours = str(tmp_path / "ours")
  run("bert_jax.convert", f"--input={theirs}", f"--output={ours}")
  query, positive, negatives = rows["dev"][0]
  docs = [positive] + negatives
  out = run("bert_jax.predict", f"--init_checkpoint={ours}", "rerank", query, *docs)
  ranked = [l for l in out.splitlines() if l.startswith("    ")]   # "    1. 0.5613 (logit ...)"
  want = st.CrossEncoder(theirs).predict([(query, d) for d in docs])   # sigmoid, theirs
  assert len(ranked) == len(docs)
  for rank, i in enumerate(np.argsort(-want, kind="stable"), start=1):
    assert ranked[rank - 1].split()[:2] == [f"{rank}.", f"{want[i]:.4f}"], (out, want)
    assert f"[{i}]" in ranked[rank - 1]
  back = str(tmp_path / "back")
  assert "wrote a sentence-transformers CrossEncoder folder" in run(
      "bert_jax.convert", f"--input={ours}", f"--output={back}", "--to=cross_encoder")
  np.testing.assert_allclose(st.CrossEncoder(back).predict([(query, d) for d in docs]), want,
                             atol=1e-4)
