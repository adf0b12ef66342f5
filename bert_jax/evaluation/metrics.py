"""Evaluation metrics of the fine-tuning benchmarks, written to match their official tools.

* GLUE (Wang et al. 2019): Matthews correlation (CoLA), accuracy, binary F1 of the positive
  class (MRPC, QQP), Pearson and Spearman correlation (STS-B); MNLI reports accuracy on the
  matched and mismatched dev sets separately. Same values as sklearn / scipy (tested).
* SQuAD v1.1 and v2.0: EM and F1 exactly as the official `evaluate-v1.1.py` and
  `evaluate-v2.0.py` (answer normalisation, max over gold answers, v2's no-answer handling,
  `na_prob_thresh` and the best-threshold search that gives `null_score_diff_threshold`).
* Entity-level precision/recall/F1 for BIO/IOB1/IOBES tags as `seqeval` (1.2.2, default mode)
  computes it, written by hand so that seqeval is only a test dependency.

Everything here is plain Python/numpy: it runs on the host after predictions are gathered.
"""

import collections
import re
import string

import numpy as np

# ---------------------------------------------------------------------------------------------
# GLUE: classification and regression.
# ---------------------------------------------------------------------------------------------


def accuracy(predictions, labels):
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  return float(np.mean(predictions == labels)) if labels.size else 0.0


def f1_binary(predictions, labels, positive=1):
  """F1 of the positive class, as sklearn.metrics.f1_score(average='binary') (0 if undefined)."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  tp = np.sum((predictions == positive) & (labels == positive))
  fp = np.sum((predictions == positive) & (labels != positive))
  fn = np.sum((predictions != positive) & (labels == positive))
  denominator = 2 * tp + fp + fn
  return float(2 * tp / denominator) if denominator else 0.0


def matthews_corrcoef(predictions, labels):
  """Multi-class Matthews correlation, sklearn's formula (0 when a marginal is constant)."""
  predictions, labels = np.asarray(predictions), np.asarray(labels)
  _check_same_length(predictions, labels)
  classes = np.union1d(predictions, labels)
  pred_idx = np.searchsorted(classes, predictions)
  label_idx = np.searchsorted(classes, labels)
  confusion = np.zeros((len(classes), len(classes)), np.float64)  # [true, pred]
  np.add.at(confusion, (label_idx, pred_idx), 1)
  t_sum = confusion.sum(axis=1)
  p_sum = confusion.sum(axis=0)
  n_correct = np.trace(confusion)
  n = confusion.sum()
  cov_ytyp = n_correct * n - np.dot(t_sum, p_sum)
  cov_ypyp = n * n - np.dot(p_sum, p_sum)
  cov_ytyt = n * n - np.dot(t_sum, t_sum)
  if cov_ypyp * cov_ytyt == 0:
    return 0.0
  return float(cov_ytyp / np.sqrt(cov_ytyt * cov_ypyp))


def pearson(predictions, labels):
  """Pearson's r as scipy.stats.pearsonr (nan if either input is constant)."""
  x = np.asarray(predictions, np.float64)
  y = np.asarray(labels, np.float64)
  _check_same_length(x, y)
  xm, ym = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.dot(xm, xm) * np.dot(ym, ym))
  if denominator == 0:
    return float("nan")
  return float(np.clip(np.dot(xm, ym) / denominator, -1.0, 1.0))


def _average_ranks(x):
  """1-based ranks with ties given their average rank (scipy.stats.rankdata 'average')."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # Boundaries of runs of equal values.
  new_run = np.concatenate([[True], sorted_x[1:] != sorted_x[:-1]])
  run_id = np.cumsum(new_run) - 1
  run_starts = np.flatnonzero(new_run)
  run_ends = np.append(run_starts[1:], len(x))  # exclusive
  run_rank = (run_starts + 1 + run_ends) / 2.0  # mean of ranks start+1 .. end
  ranks = np.empty(len(x), np.float64)
  ranks[order] = run_rank[run_id]
  return ranks


def spearman(predictions, labels):
  """Spearman's rho as scipy.stats.spearmanr: Pearson on average ranks."""
  _check_same_length(np.asarray(predictions), np.asarray(labels))
  return pearson(_average_ranks(predictions), _average_ranks(labels))


def _check_same_length(a, b):
  if a.shape[0] != b.shape[0]:
    raise ValueError(f"metrics: {a.shape[0]} predictions but {b.shape[0]} labels; they must "
                     "be aligned one to one.")


# Metric names per GLUE task, in the order of the GLUE paper's table.
GLUE_METRICS = {
    "cola": ("mcc",),
    "sst2": ("accuracy",),
    "mrpc": ("accuracy", "f1"),
    "stsb": ("pearson", "spearman"),
    "qqp": ("accuracy", "f1"),
    "mnli": ("accuracy",),  # reported per dev set: mnli_matched / mnli_mismatched
    "qnli": ("accuracy",),
    "rte": ("accuracy",),
    "wnli": ("accuracy",),
}

_METRIC_FNS = {
    "accuracy": accuracy,
    "f1": f1_binary,
    "mcc": matthews_corrcoef,
    "pearson": pearson,
    "spearman": spearman,
}


def classification_metrics(names, predictions, labels):
  """{name: value} for metric names among accuracy, f1, mcc, pearson, spearman."""
  unknown = [n for n in names if n not in _METRIC_FNS]
  if unknown:
    raise ValueError(f"metrics: unknown metric(s) {unknown}; choose from {sorted(_METRIC_FNS)}.")
  return {n: _METRIC_FNS[n](predictions, labels) for n in names}


def glue_metrics(task, predictions, labels):
  """The official metrics of one GLUE task on one dev set, e.g. {'accuracy':..., 'f1':...}.

  STS-B takes float predictions; every other task takes class ids. For MNLI call it once per
  dev set (matched, mismatched) and prefix the keys, as `mnli_metrics` does.
  """
  if task not in GLUE_METRICS:
    raise ValueError(f"metrics: unknown GLUE task {task!r}; one of {sorted(GLUE_METRICS)}.")
  return classification_metrics(GLUE_METRICS[task], predictions, labels)


def mnli_metrics(matched_predictions, matched_labels, mismatched_predictions,
                 mismatched_labels):
  return {"matched_accuracy": accuracy(matched_predictions, matched_labels),
          "mismatched_accuracy": accuracy(mismatched_predictions, mismatched_labels)}


# ---------------------------------------------------------------------------------------------
# SQuAD: the official evaluation scripts.
# ---------------------------------------------------------------------------------------------


def normalize_answer(s):
  """Lower text and remove punctuation, articles and extra whitespace (official script)."""
  s = s.lower()
  exclude = set(string.punctuation)
  s = "".join(ch for ch in s if ch not in exclude)
  s = re.sub(r"\b(a|an|the)\b", " ", s, flags=re.UNICODE)
  return " ".join(s.split())


def _f1_v1(prediction, ground_truth):
  prediction_tokens = normalize_answer(prediction).split()
  ground_truth_tokens = normalize_answer(ground_truth).split()
  common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
  num_same = sum(common.values())
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(prediction_tokens)
  recall = 1.0 * num_same / len(ground_truth_tokens)
  return (2 * precision * recall) / (precision + recall)


def _exact_v1(prediction, ground_truth):
  return normalize_answer(prediction) == normalize_answer(ground_truth)


def squad_v1_evaluate(dataset, predictions):
  """evaluate-v1.1.py: dataset is the JSON's "data" list, predictions {qid: text}.

  A question without a prediction scores 0 and still counts in the total, as in the script.
  Returns {'exact_match': %, 'f1': %, 'total': n, 'missing': n_unanswered}.
  """
  f1 = exact_match = total = missing = 0
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        total += 1
        if qa["id"] not in predictions:
          missing += 1
          continue
        ground_truths = [a["text"] for a in qa["answers"]]
        prediction = predictions[qa["id"]]
        exact_match += max(_exact_v1(prediction, g) for g in ground_truths)
        f1 += max(_f1_v1(prediction, g) for g in ground_truths)
  total_or_one = total or 1
  return {"exact_match": 100.0 * exact_match / total_or_one, "f1": 100.0 * f1 / total_or_one,
          "total": total, "missing": missing}


def _get_tokens(s):
  if not s:
    return []
  return normalize_answer(s).split()


def compute_exact(a_gold, a_pred):
  return int(normalize_answer(a_gold) == normalize_answer(a_pred))


def compute_f1(a_gold, a_pred):
  gold_toks = _get_tokens(a_gold)
  pred_toks = _get_tokens(a_pred)
  common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
  num_same = sum(common.values())
  if not gold_toks or not pred_toks:
    # If either is no-answer, then F1 is 1 if they agree, 0 otherwise.
    return int(gold_toks == pred_toks)
  if num_same == 0:
    return 0
  precision = 1.0 * num_same / len(pred_toks)
  recall = 1.0 * num_same / len(gold_toks)
  return (2 * precision * recall) / (precision + recall)


def _v2_raw_scores(dataset, predictions):
  exact_scores, f1_scores, has_answer = {}, {}, {}
  for article in dataset:
    for p in article["paragraphs"]:
      for qa in p["qas"]:
        qid = qa["id"]
        has_answer[qid] = bool(qa["answers"])
        gold_answers = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])]
        if not gold_answers:
          # For unanswerable questions, only correct answer is empty string.
          gold_answers = [""]
        if qid not in predictions:
          continue  # the script prints "Missing prediction" and leaves it out of the total
        a_pred = predictions[qid]
        exact_scores[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
        f1_scores[qid] = max(compute_f1(a, a_pred) for a in gold_answers)
  return exact_scores, f1_scores, has_answer


def _apply_no_answer_threshold(scores, na_probs, has_answer, na_prob_thresh):
  new_scores = {}
  for qid, s in scores.items():
    if na_probs[qid] > na_prob_thresh:
      new_scores[qid] = float(not has_answer[qid])
    else:
      new_scores[qid] = s
  return new_scores


def _eval_dict(exact_scores, f1_scores, qid_list=None):
  if not qid_list:
    total = len(exact_scores)
    return collections.OrderedDict([
        ("exact", 100.0 * sum(exact_scores.values()) / total if total else 0.0),
        ("f1", 100.0 * sum(f1_scores.values()) / total if total else 0.0),
        ("total", total)])
  total = len(qid_list)
  return collections.OrderedDict([
      ("exact", 100.0 * sum(exact_scores[k] for k in qid_list) / total),
      ("f1", 100.0 * sum(f1_scores[k] for k in qid_list) / total),
      ("total", total)])


def _find_best_thresh(predictions, scores, na_probs, has_answer):
  """Sweep the no-answer threshold over the sorted na_probs; the script's find_best_thresh."""
  num_no_ans = sum(1 for k in has_answer if not has_answer[k])
  cur_score = num_no_ans
  best_score = cur_score
  best_thresh = 0.0
  qid_list = sorted(na_probs, key=lambda k: na_probs[k])
  for qid in qid_list:
    if qid not in scores:
      continue
    if has_answer[qid]:
      diff = scores[qid]
    else:
      diff = -1 if predictions[qid] else 0
    cur_score += diff
    if cur_score > best_score:
      best_score = cur_score
      best_thresh = na_probs[qid]
  return 100.0 * best_score / len(scores), best_thresh


def squad_v2_evaluate(dataset, predictions, na_probs=None, na_prob_thresh=1.0):
  """evaluate-v2.0.py: {exact, f1, total, HasAns_*, NoAns_*[, best_exact(_thresh), best_f1(_thresh)]}.

  `na_probs` is the --na-prob-file content ({qid: score}); google-research/bert's
  null_odds.json (score_null - best_non_null) is that file, and `best_f1_thresh` is the value
  to pass back as null_score_diff_threshold. Without na_probs every score is 0.0 and no
  best-threshold entries are returned, as in the script.
  """
  exact_raw, f1_raw, has_answer = _v2_raw_scores(dataset, predictions)
  if na_probs is None:
    na_probs_used = {k: 0.0 for k in predictions}
  else:
    na_probs_used = na_probs
  exact_thresh = _apply_no_answer_threshold(exact_raw, na_probs_used, has_answer, na_prob_thresh)
  f1_thresh = _apply_no_answer_threshold(f1_raw, na_probs_used, has_answer, na_prob_thresh)
  out = _eval_dict(exact_thresh, f1_thresh)
  has_ans_qids = [k for k, v in has_answer.items() if v]
  no_ans_qids = [k for k, v in has_answer.items() if not v]
  # The script's HasAns/NoAns subsets index every question of the dataset, so it crashes
  # (KeyError) on a missing prediction; say so in one line instead.
  missing = [k for k in has_answer if k not in predictions]
  if missing:
    raise ValueError(f"squad v2 evaluation: {len(missing)} of {len(has_answer)} questions have "
                     f"no prediction (first: {missing[0]!r}); predict every question id.")
  if has_ans_qids:
    for k, v in _eval_dict(exact_thresh, f1_thresh, has_ans_qids).items():
      out[f"HasAns_{k}"] = v
  if no_ans_qids:
    for k, v in _eval_dict(exact_thresh, f1_thresh, no_ans_qids).items():
      out[f"NoAns_{k}"] = v
  if na_probs is not None:
    out["best_exact"], out["best_exact_thresh"] = _find_best_thresh(
        predictions, exact_raw, na_probs, has_answer)
    out["best_f1"], out["best_f1_thresh"] = _find_best_thresh(
        predictions, f1_raw, na_probs, has_answer)
  return dict(out)


# ---------------------------------------------------------------------------------------------
# Entity-level P/R/F1 as seqeval 1.2.2 (default, non-strict mode).
# ---------------------------------------------------------------------------------------------


def _end_of_chunk(prev_tag, tag, prev_type, type_):
  return (prev_tag in ("E", "S")
          or (prev_tag in ("B", "I") and tag in ("B", "S", "O"))
          or (prev_tag not in ("O", ".") and prev_type != type_))


def _start_of_chunk(prev_tag, tag, prev_type, type_):
  return (tag in ("B", "S")
          or (prev_tag in ("E", "S", "O") and tag in ("E", "I"))
          or (tag not in ("O", ".") and prev_type != type_))


def get_entities(seq):
  """[(type, start, end_inclusive)] of a tag list or a list of tag lists (seqeval semantics).

  A list of sentences is flattened with an "O" after each sentence, so offsets are global and
  an entity never crosses a sentence border. An I- tag after O or after another type starts an
  entity, as in conlleval; this makes IOB1 (CoNLL-2003's original files) and IOB2 both work.
  """
  if any(isinstance(s, (list, tuple)) for s in seq):
    seq = [item for sentence in seq for item in list(sentence) + ["O"]]
  prev_tag, prev_type, begin = "O", "", 0
  chunks = []
  for i, chunk in enumerate(list(seq) + ["O"]):
    if chunk not in ("O", "B", "I", "E", "S") and not chunk.startswith(("B-", "I-", "E-", "S-")):
      raise ValueError(f"metrics: invalid tag {chunk!r} at position {i}; expected O or "
                       "B-/I-/E-/S- followed by an entity type.")
    tag = chunk[0]
    type_ = chunk[1:].split("-", maxsplit=1)[-1] or "_"
    if _end_of_chunk(prev_tag, tag, prev_type, type_):
      chunks.append((prev_type, begin, i - 1))
    if _start_of_chunk(prev_tag, tag, prev_type, type_):
      begin = i
    prev_tag, prev_type = tag, type_
  return chunks


def entity_scores(y_true, y_pred):
  """Micro and per-type entity P/R/F1: {'precision','recall','f1','per_type': {type: {...}}}.

  y_true, y_pred: lists of sentences, each a list of tag strings of equal lengths. An entity is
  right only if its type and both borders match. Undefined ratios are 0 (seqeval warns and
  returns 0 as well).
  """
  if len(y_true) != len(y_pred):
    raise ValueError(f"metrics: {len(y_true)} gold sentences but {len(y_pred)} predicted.")
  for i, (t, p) in enumerate(zip(y_true, y_pred)):
    if len(t) != len(p):
      raise ValueError(f"metrics: sentence {i} has {len(t)} gold tags but {len(p)} predicted.")
  true_set = collections.defaultdict(set)
  pred_set = collections.defaultdict(set)
  for type_, start, end in get_entities([list(s) for s in y_true]):
    true_set[type_].add((start, end))
  for type_, start, end in get_entities([list(s) for s in y_pred]):
    pred_set[type_].add((start, end))

  def prf(tp, n_pred, n_true):
    p = tp / n_pred if n_pred else 0.0
    r = tp / n_true if n_true else 0.0
    f = 2 * p * r / (p + r) if p + r else 0.0
    return {"precision": p, "recall": r, "f1": f, "support": n_true}

  per_type = {}
  tp_all = pred_all = true_all = 0
  for type_ in sorted(set(true_set) | set(pred_set)):
    tp = len(true_set[type_] & pred_set[type_])
    per_type[type_] = prf(tp, len(pred_set[type_]), len(true_set[type_]))
    tp_all += tp
    pred_all += len(pred_set[type_])
    true_all += len(true_set[type_])
  out = prf(tp_all, pred_all, true_all)
  out["per_type"] = per_type
  return out
