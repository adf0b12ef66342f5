"""Mining hard negatives (bert_jax/inference/mining.py, bert_jax/mine.py; issue 48 item 1).

Parity: a tiny random BERT saved as a sentence-transformers folder, loaded by both; on real stdlib
docstring rows (benchmarks/docstring_retrieval.py) our mined rows equal sentence-transformers'
mine_hard_negatives (6.2) row for row, columns and scores included (ties aside), for triplet and
n-tuple with a rank window and a relative margin, and with a corpus file. Bounded memory: the
result is the same whatever the block size (7 blocks or one). approx_max_k against exact. Bad
requests: one line each, before the model is read.
"""

import contextlib
import json
import os
import types

import numpy as np
import pytest

from bert_jax import mine
from bert_jax import predict
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.inference import mining
from bert_jax_core import errors
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import mining_testlib


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  d = tmp_path_factory.mktemp("mining")
  splits = mining_testlib.docstring_rows(str(d / "data"))
  return {"dir": d, "splits": splits, "train": str(d / "data" / "train.jsonl")}


@contextlib.contextmanager
def _cache(path):
  """BERT_JAX_CACHE set to path inside the block (a module fixture has no monkeypatch)."""
  saved = os.environ.get("BERT_JAX_CACHE")
  os.environ["BERT_JAX_CACHE"] = str(path)
  try:
    yield
  finally:
    if saved is None:
      os.environ.pop("BERT_JAX_CACHE")
    else:
      os.environ["BERT_JAX_CACHE"] = saved


@pytest.fixture(scope="module")
def st_model(data):
  """(folder, our embedder of it): the folder converted once into a cache of the test's own."""
  folder = mining_testlib.st_folder(data["dir"] / "model", data["splits"]["train"])
  with _cache(data["dir"] / "cache"):
    m = predict.load_embedder(folder)
  return folder, m


def _ours(m, rows, corpus=(), *, batch_size=8, block_size=16, reranker=None, **kw):
  problem = mining.build_problem([r["query"] for r in rows], [r["positive"] for r in rows],
                                 corpus, "query", "positive")
  settings = mining.resolve(mining.Settings(**kw), problem)
  pooling, prompt, length = predict.embedding_settings(m, None, "query")
  assert (pooling, prompt, length) == ("mean", "", 64)   # the folder's record
  return mine.mine(m, problem, settings, pooling=pooling, query_prompt="", corpus_prompt="",
                   max_seq_length=length, batch_size=batch_size, block_size=block_size,
                   reranker=reranker)


# ----------------------------------------------------------------------------------------------
# Parity with sentence-transformers.
# ----------------------------------------------------------------------------------------------
PARITY = {
    # A rank window and NV-Retriever's relative margin (at 0.01: the random model's scores sit
    # in 0.85-0.97, so 0.05 leaves one row of 50), each output format.
    "triplet": dict(num_negatives=3, range_min=2, range_max=12, relative_margin=0.01,
                    output_format="triplet", output_scores=True),
    "n-tuple": dict(num_negatives=3, range_min=2, range_max=12, relative_margin=0.01,
                    output_format="n-tuple", output_scores=True),
    # ST's defaults for range_max (derived) with an absolute margin and max_score; a corpus.
    "corpus": dict(num_negatives=2, absolute_margin=0.005, max_score=0.96,
                   output_format="n-tuple", output_scores=True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(PARITY))
def test_mined_rows_equal_sentence_transformers(data, st_model, case):
  folder, m = st_model
  rows = data["splits"]["train"]
  corpus = ([r["positive"] for r in data["splits"]["dev"] + data["splits"]["test"]]
            + [rows[0]["positive"]] if case == "corpus" else None)   # (a duplicate of a positive)
  theirs = mining_testlib.st_mine(rows, folder, corpus=corpus, **PARITY[case])
  mined, ours = _ours(m, rows, corpus or (), **PARITY[case])
  assert len(ours) >= 9, len(ours)                    # the comparison compares something
  assert mined.skipped.get("relative_margin", 0) + mined.skipped.get("absolute_margin", 0) > 100
  ties = mining_testlib.same_rows(theirs, ours)
  assert ties <= 1, ties


@pytest.fixture(scope="module")
def cross_encoder(data, st_model):
  """(CrossEncoder folder, our reranker of it): a tiny random BertForSequenceClassification
  saved by CrossEncoder.save with the ST folder's vocab, converted once into the test's cache."""
  from tests.testlib import reranker_testlib  # pylint: disable=g-import-not-at-top
  folder = reranker_testlib.write_cross_encoder(
      str(data["dir"] / "ce"), os.path.join(st_model[0], "vocab.txt"), hidden=32, layers=2)
  with _cache(data["dir"] / "cache"):
    m = predict.load_reranker(folder)
  return folder, m


@pytest.mark.slow
def test_cross_encoder_rescoring_equals_sentence_transformers(data, st_model, cross_encoder):
  """mine_hard_negatives(cross_encoder=...) with a relative margin: the embedder's top-k, every
  candidate and positive rescored by the CrossEncoder (its sigmoid), then the filters and the
  window on those scores; our rows and scores equal theirs (scores within 1e-4, the reranker's
  conversion tolerance)."""
  from sentence_transformers import CrossEncoder  # pylint: disable=g-import-not-at-top
  folder, m = st_model
  ce_folder, ce = cross_encoder
  rows = data["splits"]["train"][:30]   # each query's candidates are 10 pairs for both rerankers
  settings = dict(num_negatives=2, range_min=1, range_max=10, relative_margin=0.05,
                  output_format="n-tuple", output_scores=True)
  theirs = mining_testlib.st_mine(rows, folder, cross_encoder=CrossEncoder(ce_folder,
                                                                           device="cpu"),
                                  **settings)
  mined, ours = _ours(m, rows, cross_encoder=ce_folder, reranker=ce, **settings)
  assert len(ours) >= 6, len(ours)
  assert mined.skipped.get("relative_margin", 0) > 10, mined.skipped
  # the scores are the cross-encoder's sigmoids, not the embedder's cosines (0.85-0.97 here)
  embedder_only, _ = _ours(m, rows, **settings)
  ce_pos, cos_pos = (np.concatenate(x.positive_scores) for x in (mined, embedder_only))
  assert np.abs(ce_pos - cos_pos).max() > 0.05, (ce_pos[:5], cos_pos[:5])
  assert mining_testlib.same_rows(theirs, ours, tie=1e-4) <= 1


def test_rescore_replaces_every_candidate_and_positive_score():
  """mining.rescore: each query's real candidates (index >= 0) and its positives get the
  cross-encoder's scores, in the search's layout; a missing candidate stays -inf."""
  problem = mining.build_problem(["q0", "q1"], ["p0", "p1"], ["d0"])   # corpus d0 p0 p1
  indices = np.array([[1, 0, -1], [2, 1, 0]])
  pos = np.array([[0.9], [0.8]], np.float32)
  calls = []

  def score_pairs(pairs):
    calls.append(tuple(pairs))
    return np.array([len(q) + 10 * int(d[1]) + (0.5 if d[0] == "p" else 0) for q, d in pairs],
                    np.float32)
  scores, positives = mining.rescore(problem, indices, pos, score_pairs)
  # one call with every pair: each query's real candidates, then its positives
  assert calls == [(("q0", "p0"), ("q0", "d0"), ("q0", "p0"), ("q1", "p1"), ("q1", "p0"),
                    ("q1", "d0"), ("q1", "p1"))]
  assert scores.tolist() == [[2.5, 2.0, -np.inf], [12.5, 2.5, 2.0]]
  assert positives.tolist() == [[2.5], [12.5]] and pos.tolist()[0][0] == pytest.approx(0.9)


def test_cross_encoder_without_a_filter_is_refused_as_st_ignores_it():
  """ST rescores only with a margin/max/min score set; --cross_encoder alone would be silently
  unused, so it is one line; with --min_score ST's range_max default takes 10x the negatives."""
  problem = mining.build_problem([f"q{i}" for i in range(40)], [f"p{i}" for i in range(40)])
  with pytest.raises(mining.MiningError) as e:
    mining.resolve(mining.Settings(num_negatives=2, cross_encoder="ce"), problem)
  _one_line(e, "--cross_encoder=ce", "only when a filter is set", "--min_score=0")
  s = mining.resolve(mining.Settings(num_negatives=2, cross_encoder="ce", min_score=0.0),
                     problem)
  assert s.range_max == 0 + 2 * 10 + 1 and mining.rescores(s)
  assert mining.resolve(mining.Settings(num_negatives=2, min_score=0.0), problem).range_max == 3
  assert not mining.rescores(mining.Settings(relative_margin=0.05))


def test_a_cross_encoder_that_is_not_a_reranker_is_one_line_before_the_model(tmp_path):
  """--cross_encoder= an encoder without a reranker's head (a plain transformers BertModel
  folder) or no checkpoint at all: one line naming --cross_encoder, before any model is read."""
  _pairs(tmp_path, ROWS)
  plain = tmp_path / "bert"
  plain.mkdir()
  (plain / "config.json").write_text(json.dumps({"architectures": ["BertModel"],
                                                 "model_type": "bert"}))
  (plain / "model.safetensors").write_text("")
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, cross_encoder=str(plain), min_score=0.0), 1)
  _one_line(e, f"--cross_encoder={plain}: is an encoder without a reranker's head, not a "
            "cross-encoder", "CrossEncoder folder")
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, cross_encoder=str(tmp_path / "nothing"), min_score=0.0), 1)
  _one_line(e, f"--cross_encoder={tmp_path / 'nothing'}")
  assert not (tmp_path / "out.jsonl").exists()


# ----------------------------------------------------------------------------------------------
# Bounded memory: blocks are an implementation detail.
# ----------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_block_size_does_not_change_the_result(data, st_model):
  """50 corpus texts in 7 blocks of 8 vs one of 56: the same indices and scores, bit for bit
  (each text's vector comes from the same batch; the merge keeps the lower index on a tie)."""
  _, m = st_model
  rows = data["splits"]["train"]
  kw = dict(num_negatives=4, range_min=1, range_max=20, relative_margin=0.005)
  small, rows_small = _ours(m, rows, block_size=8, **kw)
  large, rows_large = _ours(m, rows, block_size=56, **kw)
  np.testing.assert_array_equal(small.indices, large.indices)
  np.testing.assert_array_equal(small.scores, large.scores)
  assert rows_small == rows_large and len(rows_small) > 40


@pytest.mark.slow
def test_approx_search_recall_against_exact(data, st_model):
  """--search=approx (lax.approx_max_k) against exact on real text: the share of the exact
  candidates it finds. On CPU (and GPU) XLA lowers ApproxTopK with is_fallback=true, an exact
  top-k: recall 1.0 here; the TPU kernel's recall is its recall_target in expectation."""
  _, m = st_model
  rows = data["splits"]["train"]
  kw = dict(num_negatives=5, range_max=30)
  exact, _ = _ours(m, rows, **kw)
  approx, _ = _ours(m, rows, search="approx", recall_target=0.9, **kw)
  found = [len(set(a) & set(e)) / len(e) for a, e in zip(approx.indices, exact.indices)]
  assert np.mean(found) == 1.0


# ----------------------------------------------------------------------------------------------
# ST's selection rule on hand-made scores (no model).
# ----------------------------------------------------------------------------------------------
def test_select_follows_st_order_of_filters():
  """Ranks count after the positives and filtered candidates are out; relative margin drops
  candidates above lowest positive - |lowest positive| * m; n-tuple rows need every negative."""
  problem = mining.build_problem(["q0", "q1", "q0"], ["p0", "p1", "p2"], ["d0", "d1", "d2"])
  # corpus: d0 d1 d2 p0 p1 p2 (indices 0-5); q0's positives 3 and 5, q1's 4
  assert problem.positives == [[3, 5], [4]] and problem.max_positives == 2
  s = mining.resolve(mining.Settings(num_negatives=1, range_min=1, range_max=3,
                                     relative_margin=0.1, output_scores=True), problem)
  k = mining.candidates_k(s, problem)   # 3 + 2 = 5
  scores = np.array([[0.95, 0.9, 0.85, 0.7, 0.5], [0.99, 0.7, 0.6, 0.5, 0.4]], np.float32)
  indices = np.array([[3, 0, 5, 1, 2], [0, 4, 1, 2, 3]], np.int32)
  pos = np.array([[0.95, 0.85], [0.7, np.nan]], np.float32)
  mined = mining.select(problem, s, scores[:, :k], indices[:, :k], pos)
  # q0: positives 3, 5 out; lowest positive 0.85 -> drop above 0.765: d0 (0.9); left d1, d2;
  # range_min=1 skips d1 -> d2. q1: drop above 0.63: d0 (0.99); left d1 0.6, d2 0.5, p0 0.4 ->
  # skip d1 -> d2.
  assert mined.indices.tolist() == [[2], [2]]
  assert mined.skipped == {"positives": 3, "relative_margin": 2}
  rows = mining.rows_of(problem, s, mined)
  assert [(r["anchor"], r["positive"], r["negative"]) for r in rows] == [
      ("q0", "p0", "d2"), ("q0", "p2", "d2"), ("q1", "p1", "d2")]
  assert rows[0]["scores"] == [float(np.float32(0.95)), float(np.float32(0.5))]
  assert rows[1]["scores"][0] == float(np.float32(0.85))


def test_random_sampling_is_seeded_and_takes_the_survivors():
  """--sampling_strategy=random: a sample of the finite candidates after the window (ST's rule),
  the same for the same seed, re-sorted by score."""
  problem = mining.build_problem(["q"], ["p"], [f"d{i}" for i in range(8)])
  s = mining.resolve(mining.Settings(num_negatives=3, range_min=1, range_max=8,
                                     sampling_strategy="random", seed=7), problem)
  scores = np.linspace(0.9, 0.1, 9, dtype=np.float32)[None]        # p first, then d0 .. d7
  indices = np.array([[8, 0, 1, 2, 3, 4, 5, 6, 7]], np.int32)
  pos = np.array([[0.9]], np.float32)
  picks = {tuple(mining.select(problem, mining.Settings(**{**s.__dict__, "seed": seed}), scores,
                               indices, pos).indices[0]) for seed in range(12)}
  again = mining.select(problem, s, scores, indices, pos)
  assert tuple(again.indices[0]) == tuple(mining.select(problem, s, scores, indices, pos)
                                          .indices[0])
  assert len(picks) > 1                                               # the seed matters
  for pick in picks:   # d0 skipped (range_min=1); sorted by score = by index here
    assert 0 not in pick and list(pick) == sorted(pick) and len(set(pick)) == 3


# ----------------------------------------------------------------------------------------------
# Bad requests: one line each, before the model is read.
# ----------------------------------------------------------------------------------------------
def _args(tmp_path, **kw):
  defaults = {f.name: f.default for f in __import__("dataclasses").fields(mining.Settings)}
  base = dict(defaults, output_file=str(tmp_path / "out.jsonl"), overwrite=False,
              input_file=str(tmp_path / "pairs.jsonl"), corpus_file=None, batch_size=8,
              block_size=16, init_checkpoint=str(tmp_path / "missing_model"))
  return types.SimpleNamespace(**dict(base, **kw))


def _pairs(tmp_path, rows, name="pairs.jsonl"):
  path = tmp_path / name
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def _one_line(excinfo, *parts):
  message = str(excinfo.value)
  assert "\n" not in message and isinstance(excinfo.value, errors.UserError), message
  for part in parts:
    assert part in message, message


ROWS = [{"query": f"question {i}", "positive": f"answer {i}"} for i in range(6)]


def test_bad_requests_are_one_line_before_the_model(tmp_path):
  _pairs(tmp_path, ROWS)
  # queries file without a positive column
  only = _pairs(tmp_path, [{"query": "q", "answer_text": "a"}], "only.jsonl")
  with pytest.raises(TaskDataError) as e:
    mine.check_request(_args(tmp_path, input_file=only), 8)
  _one_line(e, "only.jsonl", "no column 'positive'")
  # corpus file with several columns and none named text
  corpus = tmp_path / "corpus.jsonl"
  corpus.write_text(json.dumps({"id": 1, "body": "x"}) + "\n")
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, corpus_file=str(corpus)), 8)
  _one_line(e, "--corpus_file=", "none is named text")
  # more negatives than the corpus holds (6 positives: at most 5 besides a query's own)
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, num_negatives=6), 8)
  _one_line(e, "--num_negatives=6", "6 distinct texts", "lower --num_negatives to 5")
  # a rank window narrower than the count
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, num_negatives=3, range_min=2, range_max=4), 8)
  _one_line(e, "--range_min=2 --range_max=4 leaves 2 candidates", "raise --range_max to at "
            "least 5")
  # an output file that exists
  (tmp_path / "out.jsonl").write_text("x")
  with pytest.raises(errors.UserError) as e:
    mine.check_request(_args(tmp_path), 8)
  _one_line(e, "--output_file=", "already exists", "--overwrite")
  assert (tmp_path / "out.jsonl").read_text() == "x"
  # scores into a CSV; a batch the devices do not divide
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, output_file=str(tmp_path / "o.csv"),
                             output_scores=True), 8)
  _one_line(e, "only JSONL holds")
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, output_file=str(tmp_path / "o.jsonl"), batch_size=12), 8)
  _one_line(e, "--batch_size=12", "multiple of the 8 devices")


def test_a_cross_encoder_is_refused_as_the_embedder(tmp_path):
  _pairs(tmp_path, ROWS)
  # A transformers SequenceClassification folder (what a sentence-transformers CrossEncoder saves)
  ce = tmp_path / "ce"
  ce.mkdir()
  (ce / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"],
                                              "model_type": "bert"}))
  (ce / "modules.json").write_text("[]")
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, output_file=str(tmp_path / "a.jsonl"),
                             init_checkpoint=str(ce)), 8)
  _one_line(e, f"--init_checkpoint={ce}", "BertForSequenceClassification folder is a "
            "cross-encoder", "mine with a bi-encoder")
  # One of our classification exports (its task_type recorded): refused from bert_config.json
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("tiny", vocab_size=16, hidden_size=8, num_heads=1,
                                  intermediate_size=8)
  export = ckpt_lib.save_params(str(tmp_path / "cls"), {"bert": {"w": np.zeros(1, np.float32)}},
                                cfg, meta={"task": "mrpc", "task_type": "classification",
                                           "epoch": 1})
  with pytest.raises(mining.MiningError) as e:
    mine.check_request(_args(tmp_path, output_file=str(tmp_path / "a.jsonl"),
                             init_checkpoint=export), 8)
  _one_line(e, "task type classification (mrpc) is a cross-encoder")
