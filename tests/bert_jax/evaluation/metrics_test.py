"""bert_jax.evaluation.metrics against sklearn / scipy / seqeval and hand-checked official SQuAD values."""
import math

import numpy as np
import pytest
import scipy.stats
import sklearn.metrics

from bert_jax.evaluation import metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_classification_metrics_match_sklearn_and_scipy(seed):
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, 2, size=257)
  predictions = np.where(rng.random(257) < 0.7, labels, 1 - labels)
  assert metrics.accuracy(predictions, labels) == pytest.approx(
      sklearn.metrics.accuracy_score(labels, predictions), abs=1e-12)
  assert metrics.f1_binary(predictions, labels) == pytest.approx(
      sklearn.metrics.f1_score(labels, predictions), abs=1e-12)
  assert metrics.matthews_corrcoef(predictions, labels) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(labels, predictions), abs=1e-12)
  # Three classes (MNLI-like) for MCC's multi-class formula.
  labels3 = rng.integers(0, 3, size=301)
  predictions3 = np.where(rng.random(301) < 0.5, labels3, rng.integers(0, 3, size=301))
  assert metrics.matthews_corrcoef(predictions3, labels3) == pytest.approx(
      sklearn.metrics.matthews_corrcoef(labels3, predictions3), abs=1e-12)
  # STS-B-like scores on a 0..5 grid: many ties, which Spearman must average.
  gold = rng.integers(0, 26, size=199) / 5.0
  pred = gold + rng.normal(0, 1.0, size=199)
  pred[:20] = 2.5  # a tied block in the predictions too
  assert metrics.pearson(pred, gold) == pytest.approx(scipy.stats.pearsonr(pred, gold)[0],
                                                      abs=1e-12)
  assert metrics.spearman(pred, gold) == pytest.approx(scipy.stats.spearmanr(pred, gold)[0],
                                                       abs=1e-12)


def test_degenerate_cases():
  # Constant predictions: MCC is 0 (sklearn), F1 of a never-predicted class is 0.
  labels = np.array([0, 1, 1, 0])
  assert metrics.matthews_corrcoef(np.zeros(4, int), labels) == 0.0
  assert sklearn.metrics.matthews_corrcoef(labels, np.zeros(4, int)) == 0.0
  assert metrics.f1_binary(np.zeros(4, int), labels) == 0.0
  assert math.isnan(metrics.pearson(np.ones(4), labels))
  with pytest.raises(ValueError, match="3 predictions but 4 labels"):
    metrics.accuracy([0, 1, 1], labels)


def test_glue_metric_table():
  out = metrics.glue_metrics("mrpc", [1, 1, 0, 0], [1, 0, 0, 0])
  assert out == {"accuracy": 0.75, "f1": pytest.approx(2 / 3)}
  assert set(metrics.glue_metrics("stsb", [0.1, 0.5, 0.7], [0., 1., 2.])) == {
      "pearson", "spearman"}
  assert set(metrics.glue_metrics("cola", [0, 1], [1, 1])) == {"mcc"}
  assert metrics.mnli_metrics([0, 1], [0, 1], [2, 2], [1, 2]) == {
      "matched_accuracy": 1.0, "mismatched_accuracy": 0.5}
  with pytest.raises(ValueError, match="unknown GLUE task 'mrcp'"):
    metrics.glue_metrics("mrcp", [1], [1])


# The values below were worked out by hand following evaluate-v1.1.py / evaluate-v2.0.py
# line by line (comments give the arithmetic).
def _squad(qas):
  return [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]


def test_squad_v1_official_values():
  dataset = _squad([
      {"id": "q1", "answers": [{"text": "Denver Broncos"}, {"text": "Broncos"}]},
      {"id": "q2", "answers": [{"text": "Santa Clara, California"}, {"text": "Levi's Stadium"}]},
      {"id": "q3", "answers": [{"text": "1879"}]},
      {"id": "q4", "answers": [{"text": "an apple"}]},
  ])
  predictions = {
      "q1": "the Denver Broncos.",  # normalises to "denver broncos": EM 1
      "q2": "Levi's Stadium in Santa Clara",  # vs "levis stadium": P 2/5 R 1 -> F1 4/7
      # q3 missing: scores 0 and counts in the total
      "q4": "Apple!",  # "apple" == "apple"
  }
  out = metrics.squad_v1_evaluate(dataset, predictions)
  assert out["exact_match"] == pytest.approx(100 * 2 / 4)
  assert out["f1"] == pytest.approx(100 * (1 + 4 / 7 + 0 + 1) / 4)
  assert out["total"] == 4 and out["missing"] == 1


def test_squad_v2_official_values_and_best_threshold():
  dataset = _squad([
      {"id": "a", "answers": [{"text": "Normandy"}, {"text": "Normandy, France"}]},
      {"id": "b", "answers": []},
      {"id": "c", "answers": []},
      {"id": "d", "answers": [{"text": "10th and 11th centuries"}]},
      {"id": "e", "answers": [{"text": "Rollo"}]},
  ])
  predictions = {"a": "Normandy", "b": "", "c": "France", "d": "", "e": "Rollo the Viking"}
  # exact: a 1, b 1, c 0, d 0, e 0; f1: a 1, b 1, c 0, d 0, e 2/3 ("rollo viking" vs "rollo").
  out = metrics.squad_v2_evaluate(dataset, predictions)
  assert out["exact"] == pytest.approx(40.0)
  assert out["f1"] == pytest.approx(100 * (2 + 2 / 3) / 5)
  assert out["HasAns_exact"] == pytest.approx(100 / 3)
  assert out["HasAns_f1"] == pytest.approx(100 * (1 + 2 / 3) / 3)
  assert out["NoAns_exact"] == out["NoAns_f1"] == pytest.approx(50.0)
  assert out["total"] == 5 and out["HasAns_total"] == 3 and out["NoAns_total"] == 2
  assert "best_f1" not in out

  na_probs = {"a": 0.1, "b": 0.9, "c": 0.7, "d": 0.8, "e": 0.3}
  out = metrics.squad_v2_evaluate(dataset, predictions, na_probs=na_probs)
  # Sweep in na order a, e, c, d, b starting from 2 (the no-answer count):
  # exact 2 -> 3 (a) -> 3 -> 2 (c predicted text) -> 2 -> 2: best 3/5 at 0.1.
  # f1    2 -> 3 (a) -> 3 2/3 (e) -> ...: best (3 + 2/3)/5 at 0.3.
  assert out["best_exact"] == pytest.approx(60.0) and out["best_exact_thresh"] == 0.1
  assert out["best_f1"] == pytest.approx(100 * (3 + 2 / 3) / 5)
  assert out["best_f1_thresh"] == 0.3
  # na_prob_thresh 0.5: c, d, b are predicted no-answer -> scores 1, 0, 1.
  out = metrics.squad_v2_evaluate(dataset, predictions, na_probs=na_probs, na_prob_thresh=0.5)
  assert out["exact"] == pytest.approx(60.0)
  assert out["f1"] == pytest.approx(100 * (3 + 2 / 3) / 5)

  with pytest.raises(ValueError, match="1 of 5 questions have no prediction"):
    metrics.squad_v2_evaluate(dataset, {k: v for k, v in predictions.items() if k != "d"})


def test_entities_match_seqeval_on_random_tags():
  seqeval_metrics = pytest.importorskip("seqeval.metrics")
  rng = np.random.default_rng(0)
  tags = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "E-LOC", "S-PER", "I-ORG"]
  for _ in range(30):
    y_true, y_pred = [], []
    for _ in range(rng.integers(1, 6)):
      n = int(rng.integers(1, 12))
      y_true.append([tags[i] for i in rng.integers(0, len(tags), n)])
      # Mostly right predictions so that true positives exist.
      y_pred.append([t if rng.random() < 0.7 else tags[rng.integers(0, len(tags))]
                     for t in y_true[-1]])
    ours = metrics.entity_scores(y_true, y_pred)
    assert ours["precision"] == pytest.approx(seqeval_metrics.precision_score(y_true, y_pred))
    assert ours["recall"] == pytest.approx(seqeval_metrics.recall_score(y_true, y_pred))
    assert ours["f1"] == pytest.approx(seqeval_metrics.f1_score(y_true, y_pred))
    report = seqeval_metrics.classification_report(y_true, y_pred, output_dict=True)
    for type_, scores in ours["per_type"].items():
      assert scores["f1"] == pytest.approx(report[type_]["f1-score"])
      assert scores["support"] == report[type_]["support"]


def test_entities_hand_example():
  # IOB1 as in CoNLL-2003's original files: an I- after O starts an entity.
  y_true = [["I-PER", "I-PER", "O", "I-LOC", "B-LOC"]]
  assert metrics.get_entities(y_true) == [("PER", 0, 1), ("LOC", 3, 3), ("LOC", 4, 4)]
  y_pred = [["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]]  # PER right, LOC borders wrong
  out = metrics.entity_scores(y_true, y_pred)
  assert (out["precision"], out["recall"]) == (pytest.approx(1 / 2), pytest.approx(1 / 3))
  with pytest.raises(ValueError, match="invalid tag 'PER'"):
    metrics.entity_scores([["PER"]], [["O"]])
  with pytest.raises(ValueError, match="sentence 0 has 2 gold tags but 1 predicted"):
    metrics.entity_scores([["O", "O"]], [["O"]])
