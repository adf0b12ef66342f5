"""SQuAD predictions from start/end logits: google-research/bert's `write_predictions`.

For each question: the top n_best_size (20) start and end positions of every window, kept when
both lie in the window's document part, the start is in its max-context window, end >= start
and the span is at most max_answer_length (30) pieces; sorted by start + end logit; the first
n_best_size distinct texts form the n-best list (softmax of the summed logits = "probability").
SQuAD 2.0 adds the null answer scored by the smallest [CLS] start + end logit over the windows,
and predicts "" when null score - best non-null score > null_score_diff_threshold.

Text: the predicted pieces are de-tokenized and located inside the BERT-normalised original
words (`get_final_text`), which recovers case, accents and punctuation that tokenization
dropped. Unlike the original, which returns the words re-joined by single spaces, the span is
then cut out of the context itself, so an answer is the context's text character for character
(the official evaluation normalises whitespace, so scores are unchanged).
With a tokenizer.json (squad.convert_examples' token_to_char) the span is the context's
characters from the first piece's start to the last piece's end, as transformers' run_qa does:
byte-level pieces do not de-tokenize into BERT-normalised words.
"""

import bisect
import collections
import functools
import json
import math
import os
import unicodedata

import numpy as np

from bert_jax_core import files as files_lib
from data_pipelines.tokenizers import bert_chars
from data_pipelines.tasks import common

# ---------------------------------------------------------------------------------------------
# BERT basic tokenization in Python (only for get_final_text, on short answer strings), with
# the character tables the in-graph tokenizer uses, so both split text identically.
# ---------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=None)
def _table(name):
  ranges = bert_chars.parse_ranges(getattr(bert_chars, name))
  return [a for a, _ in ranges], [b for _, b in ranges]


def _in(name, c):
  starts, ends = _table(name)
  cp = ord(c)
  i = bisect.bisect_right(starts, cp) - 1
  return i >= 0 and cp <= ends[i]


@functools.lru_cache(maxsize=None)
def _fixes():
  return bert_chars.parse_fixes(bert_chars.UNCASED_FIXES)


def basic_tokenize(text, do_lower_case):
  """HF/google BERT BasicTokenizer: clean, split CJK, (NFD, strip marks, lower), split punct."""
  out = []
  for c in text:
    if _in("REMOVE", c):
      continue
    if _in("SPACE", c):
      out.append(" ")
    elif _in("CJK", c):
      out.append(f" {c} ")
    else:
      out.append(c)
  text = "".join(out)
  if do_lower_case:
    lowered = []
    for c in text:
      if ord(c) in _fixes():
        lowered.append(_fixes()[ord(c)])
        continue
      for d in unicodedata.normalize("NFD", c):
        if not _in("MARK", d):
          lowered.append(d.lower())  # per character: no final-sigma rule, as HF
    text = "".join(lowered)
  words = []
  for word in text.split(" "):
    piece = ""
    for c in word:
      if _in("PUNCT", c):
        if piece:
          words.append(piece)
        words.append(c)
        piece = ""
      else:
        piece += c
    if piece:
      words.append(piece)
  return words


def _strip_spaces(text):
  ns_chars, ns_to_s_map = [], {}
  for i, c in enumerate(text):
    if c == " ":
      continue
    ns_to_s_map[len(ns_chars)] = i
    ns_chars.append(c)
  return "".join(ns_chars), ns_to_s_map


def final_span(pred_text, orig_text, do_lower_case):
  """(start, end_inclusive) of pred_text inside orig_text, or None (then use all of orig_text).

  get_final_text's alignment: tokenize orig_text the way BERT did, find pred_text in it, and
  map the match back through the two space-free strings, which have equal lengths when
  normalisation changed no character count.
  """
  tok_text = " ".join(basic_tokenize(orig_text, do_lower_case))
  start_position = tok_text.find(pred_text)
  if start_position == -1:
    return None
  end_position = start_position + len(pred_text) - 1
  orig_ns_text, orig_ns_to_s_map = _strip_spaces(orig_text)
  tok_ns_text, tok_ns_to_s_map = _strip_spaces(tok_text)
  if len(orig_ns_text) != len(tok_ns_text):
    return None
  tok_s_to_ns_map = {s: ns for ns, s in tok_ns_to_s_map.items()}
  ns_start = tok_s_to_ns_map.get(start_position)
  ns_end = tok_s_to_ns_map.get(end_position)
  if ns_start not in orig_ns_to_s_map or ns_end not in orig_ns_to_s_map:
    return None
  return orig_ns_to_s_map[ns_start], orig_ns_to_s_map[ns_end]


def get_final_text(pred_text, orig_text, do_lower_case):
  """google-research/bert's get_final_text (same results)."""
  span = final_span(pred_text, orig_text, do_lower_case)
  return orig_text if span is None else orig_text[span[0]:span[1] + 1]


def detokenize(pieces, kind="wordpiece"):
  """Piece strings -> text: WordPiece joins '##' continuations, SentencePiece maps '\u2581'."""
  if kind == "sentencepiece":
    text = "".join(pieces).replace("\u2581", " ")
  else:
    text = " ".join(pieces).replace(" ##", "").replace("##", "")
  return " ".join(text.strip().split())


def _context_text(example, orig_start, orig_end, span):
  """Characters of the context covered by `span` of " ".join(doc_tokens[orig_start:orig_end+1])."""
  words = example.doc_tokens[orig_start:orig_end + 1]
  offsets = []  # start of each word in the space-joined string
  pos = 0
  for w in words:
    offsets.append(pos)
    pos += len(w) + 1
  if span is None:
    span = (0, pos - 2)

  def to_context(i):
    r = bisect.bisect_right(offsets, i) - 1
    off = i - offsets[r]
    start, end = example.word_spans[orig_start + r]
    return start + min(off, end - start)  # a joining space maps to the char after the word

  return example.context[to_context(span[0]):to_context(span[1]) + 1]


def _char_text(context, start, end):
  """context[start:end] without the whitespace around it: a tokenizer.json's piece holds the
  space before its word ('Ġcat' is " cat"), as transformers' run_qa cuts it (context[offsets])."""
  return context[int(start):int(end)].strip(" \t\r\n\u202f")


def _best_indexes(logits, n_best_size):
  # Highest first; equal logits keep position order (Python's stable sort in the original).
  return np.argsort(-np.asarray(logits, np.float64), kind="stable")[:n_best_size]


def _softmax(scores):
  if not scores:
    return []
  max_score = max(scores)
  exp_scores = [math.exp(s - max_score) for s in scores]
  total = sum(exp_scores)
  return [s / total for s in exp_scores]


_Prelim = collections.namedtuple("_Prelim", "feature start end start_logit end_logit")
_Nbest = collections.namedtuple("_Nbest", "text start_logit end_logit")


def compute_predictions(examples, features, start_logits, end_logits, *, id_to_token,
                        do_lower_case, vocab_kind="wordpiece", n_best_size=20,
                        max_answer_length=30, version_2_with_negative=False,
                        null_score_diff_threshold=0.0):
  """(predictions {qid: text}, nbest {qid: [..]}, null_odds {qid: score_diff} (v2 only)).

  features: squad.convert_examples output; start_logits, end_logits: [num_features, seq].
  """
  start_logits = np.asarray(start_logits)
  end_logits = np.asarray(end_logits)
  if start_logits.shape != features["input_ids"].shape or end_logits.shape != start_logits.shape:
    raise ValueError(f"squad predictions: logits {start_logits.shape}/{end_logits.shape} do not "
                     f"match features {features['input_ids'].shape}.")
  by_example = collections.defaultdict(list)
  for f, e in enumerate(features["example_index"]):
    by_example[int(e)].append(f)
  to_orig_all = features["token_to_orig"]
  is_max_all = features["token_is_max_context"]
  to_char_all = features.get("token_to_char")  # a tokenizer.json's eval windows: [n, seq, 2]
  predictions, nbest_out, null_odds = {}, {}, {}
  for example_index, ex in enumerate(examples):
    feats = by_example[example_index]
    prelim = []
    score_null = 1000000.0  # large and positive
    min_null_feature, null_start_logit, null_end_logit = 0, 0.0, 0.0
    for f in feats:
      sl, el = start_logits[f], end_logits[f]
      if version_2_with_negative:
        feature_null = float(sl[0]) + float(el[0])
        if feature_null < score_null:
          score_null, min_null_feature = feature_null, f
          null_start_logit, null_end_logit = float(sl[0]), float(el[0])
      starts = _best_indexes(sl, n_best_size)[:, None]  # [n, 1]
      ends = _best_indexes(el, n_best_size)[None, :]  # [1, n]
      to_orig, is_max = to_orig_all[f], is_max_all[f]
      valid = ((to_orig[starts] >= 0) & (to_orig[ends] >= 0) & is_max[starts]
               & (ends >= starts) & (ends - starts + 1 <= max_answer_length))  # [n, n]
      for i, j in zip(*np.nonzero(valid)):  # start-major, as the nested loops
        s, e = int(starts[i, 0]), int(ends[0, j])
        prelim.append(_Prelim(f, s, e, float(sl[s]), float(el[e])))
    if version_2_with_negative:
      prelim.append(_Prelim(min_null_feature, 0, 0, null_start_logit, null_end_logit))
    prelim = sorted(prelim, key=lambda x: x.start_logit + x.end_logit, reverse=True)

    seen, nbest = set(), []
    for pred in prelim:
      if len(nbest) >= n_best_size:
        break
      if pred.start > 0 and to_char_all is not None:  # cut out by the pieces' characters
        f = pred.feature
        final_text = _char_text(ex.context, to_char_all[f][pred.start][0],
                                to_char_all[f][pred.end][1])
        if final_text in seen:
          continue
        seen.add(final_text)
      elif pred.start > 0:  # a non-null prediction
        f = pred.feature
        pieces = id_to_token(features["input_ids"][f][pred.start:pred.end + 1])
        tok_text = detokenize(pieces, vocab_kind)
        orig_start = int(to_orig_all[f][pred.start])
        orig_end = int(to_orig_all[f][pred.end])
        orig_text = " ".join(ex.doc_tokens[orig_start:orig_end + 1])
        span = final_span(tok_text, orig_text, do_lower_case)
        key = orig_text if span is None else orig_text[span[0]:span[1] + 1]
        if key in seen:  # de-duplicate on the original's text, so the n-best set is the same
          continue
        seen.add(key)
        final_text = _context_text(ex, orig_start, orig_end, span)
      else:
        final_text = ""
        seen.add(final_text)
      nbest.append(_Nbest(final_text, pred.start_logit, pred.end_logit))

    if version_2_with_negative and "" not in seen:
      nbest.append(_Nbest("", null_start_logit, null_end_logit))
    if not nbest or (version_2_with_negative and not any(e.text for e in nbest)):
      # No valid span at all (tiny contexts, untrained models): a nonce entry, as the original
      # does for an empty list; for v2 it is also where the original would crash, and HF's
      # port inserts the same entry.
      nbest.insert(0, _Nbest("empty", 0.0, 0.0))

    probs = _softmax([e.start_logit + e.end_logit for e in nbest])
    nbest_out[ex.qas_id] = [
        collections.OrderedDict(text=e.text, probability=p, start_logit=e.start_logit,
                                end_logit=e.end_logit) for e, p in zip(nbest, probs)]
    if not version_2_with_negative:
      predictions[ex.qas_id] = nbest[0].text
    else:
      best = next(e for e in nbest if e.text)
      score_diff = score_null - best.start_logit - best.end_logit
      null_odds[ex.qas_id] = score_diff
      predictions[ex.qas_id] = "" if score_diff > null_score_diff_threshold else best.text
  return predictions, nbest_out, null_odds


def write_predictions(output_dir, predictions, nbest, null_odds=None, prefix=""):
  """predictions.json, nbest_predictions.json (and null_odds.json for v2); returns the paths.

  null_odds.json is the official v2 script's --na-prob-file; its best_f1_thresh is the value
  to use as null_score_diff_threshold.
  """
  paths = {}
  files = [("predictions", predictions), ("nbest_predictions", nbest)]
  if null_odds:
    files.append(("null_odds", null_odds))
  for name, obj in files:
    path = os.path.join(output_dir, f"{prefix}{name}.json")
    files_lib.write_atomic(path, json.dumps(obj, indent=4, ensure_ascii=False) + "\n")
    paths[name] = path
  return paths
