"""SQuAD reading, windowing and answer mapping against google-research/bert's behaviour."""
import collections
import json
import os

import numpy as np
import pytest

from bert_jax.evaluation import metrics
from data_pipelines.tasks import squad
from data_pipelines.tasks import squad_predictions as sp
from data_pipelines.tasks.common import TaskDataError
from tests.testlib import tasks_testlib

CONTEXT_WORDS = ("the normans were people who in the 10th and 11th centuries gave their name to "
                 "normandy a region in france they were descended from norse raiders and "
                 "pirates from denmark iceland and norway cafe muller opened in zurich steve "
                 "smith s new york 1895 1943 architect")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  d = str(tmp_path_factory.mktemp("vocab"))
  return tasks_testlib.ReferenceTokenizer(tasks_testlib.write_vocab(d, CONTEXT_WORDS))


def _data(context, qas):
  return [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]


def _qa(qid, question, answers, impossible=None):
  qa = {"id": qid, "question": question, "answers": answers}
  if impossible is not None:
    qa["is_impossible"] = impossible
  return qa


def test_split_words_whitespace_rules():
  context = "New   York\tcity\n\u00a0x\u202fy  "
  words, spans, char_to_word = squad.split_words(context)
  # U+00A0 is not whitespace for run_squad.py (it stays inside a word); U+202F is.
  assert words == ["New", "York", "city", "\u00a0x", "y"]
  assert [context[a:b] for a, b in spans] == words
  assert char_to_word[:7] == [0, 0, 0, 0, 0, 0, 1]
  assert char_to_word[-1] == 4  # trailing whitespace maps to the previous word


def test_read_examples_training_skips_and_errors(tmp_path):
  context = "The Normans gave their name to Normandy, a region in France."
  data = _data(context, [
      _qa("ok", "Who?", [{"text": "Normandy", "answer_start": 31}]),
      _qa("moved", "Where?", [{"text": "France", "answer_start": 3}]),  # wrong offset
      _qa("outside", "Where?", [{"text": "France", "answer_start": 500}]),
      _qa("none", "Why?", [], impossible=True),
  ])
  examples, skips = squad.read_examples(data, "train.json", True, True)
  assert [e.qas_id for e in examples] == ["ok", "none"]
  ok = examples[0]
  assert ok.doc_tokens[ok.start_position:ok.end_position + 1] == ["Normandy,"]
  assert examples[1].is_impossible and examples[1].start_position == -1
  assert skips.counts == {"Could not find answer": 1, "answer outside its context": 1}
  assert "train.json:moved" in skips.summary()
  # v1.1 ignores is_impossible and needs exactly one training answer.
  with pytest.raises(TaskDataError, match=r"question 'none' has 0 answers"):
    squad.read_examples(data, "train.json", True, False)
  # Evaluation reads every question, answers or not.
  examples, skips = squad.read_examples(data, "dev.json", False, True)
  assert len(examples) == 4 and not skips.counts

  path = str(tmp_path / "bad.json")
  with open(path, "w") as f:
    f.write('{"data": [\n{"title": "x",}]}')
  with pytest.raises(TaskDataError, match=r"bad.json:2: not valid JSON"):
    squad.load_json(path)
  with open(path, "w") as f:
    json.dump({"data": [{"paragraphs": [{"context": "c", "qas": [{"id": "q1"}]}]}]}, f)
  with pytest.raises(TaskDataError, match=r"bad.json: question 'q1' has no \"question\" field"):
    squad.read_examples(squad.load_json(path), path, False, False)
  open(path, "w").close()
  with pytest.raises(TaskDataError, match=r"bad.json: the file is empty"):
    squad.load_json(path)


def test_improve_answer_span_narrows_to_the_answer_pieces(tokenizer):
  context = "The architect (1895-1943). smith"
  data = _data(context, [_qa("q", "When?", [{"text": "1895", "answer_start": 15}])])
  examples, _ = squad.read_examples(data, "t", True, False)
  assert examples[0].doc_tokens[examples[0].start_position] == "(1895-1943)."
  features, _ = squad.convert_examples(examples, tokenizer, 32, 8, 8, is_training=True)
  s, e = features["start_positions"][0], features["end_positions"][0]
  assert tokenizer.id_to_token(features["input_ids"][0][s:e + 1]) == ["1895"]


# A literal transcription of run_squad.py's windowing (strings, nested loops): the reference.
def _reference_windows(doc_pieces, query_len, max_seq_length, doc_stride, tok_start, tok_end):
  max_tokens_for_doc = max_seq_length - query_len - 3
  spans = []
  start_offset = 0
  while start_offset < len(doc_pieces):
    length = len(doc_pieces) - start_offset
    if length > max_tokens_for_doc:
      length = max_tokens_for_doc
    spans.append((start_offset, length))
    if start_offset + length == len(doc_pieces):
      break
    start_offset += min(length, doc_stride)
  out = []
  for span_index, (start, length) in enumerate(spans):
    max_ctx = []
    for i in range(length):
      position = start + i
      best_score, best_span_index = None, None
      for j, (s, l) in enumerate(spans):
        end = s + l - 1
        if position < s or position > end:
          continue
        score = min(position - s, end - position) + 0.01 * l
        if best_score is None or score > best_score:
          best_score, best_span_index = score, j
      max_ctx.append(best_span_index == span_index)
    if tok_start >= start and tok_end <= start + length - 1:
      positions = (tok_start - start + query_len + 2, tok_end - start + query_len + 2)
    else:
      positions = (0, 0)
    out.append((start, length, max_ctx, positions))
  return out


@pytest.mark.parametrize("max_seq_length,doc_stride", [(24, 5), (30, 12), (64, 128), (20, 1)])
def test_windows_match_reference_including_answers_across_borders(tokenizer, max_seq_length,
                                                                  doc_stride):
  words = CONTEXT_WORDS.split()
  rng = np.random.default_rng(max_seq_length)
  context = "  ".join(" ".join(words[i:i + 3]) for i in range(0, len(words), 3))
  _, word_spans, _ = squad.split_words(context)
  qas = []
  for k in range(12):  # answers everywhere, many straddling window borders
    a = int(rng.integers(0, len(words) - 3))
    b = a + int(rng.integers(0, 3))
    start, stop = word_spans[a][0], word_spans[b][1]  # may hold a double space
    qas.append(_qa(f"q{k}", "who were the normans",
                   [{"text": context[start:stop], "answer_start": start}]))
  examples, skips = squad.read_examples(_data(context, qas), "t", True, False)
  assert not skips.counts
  features, stats = squad.convert_examples(examples, tokenizer, max_seq_length, doc_stride, 8,
                                           is_training=True)
  doc_pieces = [p for w in examples[0].doc_tokens for p in tokenizer.encode([w])[0]]
  query = tokenizer.encode(["who were the normans"])[0]
  f = 0
  for ex_index, ex in enumerate(examples):
    answer = tokenizer.encode([ex.orig_answer_text])[0]
    # The answers here are whole words, so the improved span is where the pieces match.
    tok_start = next(i for i in range(len(doc_pieces))
                     if doc_pieces[i:i + len(answer)] == answer
                     and i >= sum(len(tokenizer.encode([w])[0])
                                  for w in ex.doc_tokens[:ex.start_position]))
    tok_end = tok_start + len(answer) - 1
    for start, length, max_ctx, positions in _reference_windows(
        doc_pieces, len(query), max_seq_length, doc_stride, tok_start, tok_end):
      assert features["example_index"][f] == ex_index
      off = len(query) + 2
      assert list(features["input_ids"][f][off:off + length]) == doc_pieces[start:start + length]
      assert list(features["token_is_max_context"][f][off:off + length]) == max_ctx
      assert not features["token_is_max_context"][f][:off].any()
      assert (features["start_positions"][f], features["end_positions"][f]) == positions
      f += 1
  assert f == stats["features"] == len(features["input_ids"])
  if max_seq_length < 40:
    assert stats["answer_outside_window"] > 0  # some answers do straddle borders


def test_question_truncation_and_v2_no_answer_positions(tokenizer):
  context = "The Normans were people from Normandy."
  long_question = " ".join(["normans"] * 80)
  data = _data(context, [_qa("long", long_question, [{"text": "Normandy", "answer_start": 29}]),
                         _qa("none", "Who?", [], impossible=True)])
  examples, _ = squad.read_examples(data, "t", True, True)
  features, stats = squad.convert_examples(examples, tokenizer, 128, 128, 64, is_training=True)
  assert stats["questions_truncated"] == 1
  v = tokenizer.vocab
  row = list(features["input_ids"][0])
  assert row[:66] == [v.cls_id] + [tokenizer.encode(["normans"])[0][0]] * 64 + [v.sep_id]
  assert features["start_positions"][1] == features["end_positions"][1] == 0  # [CLS]
  assert tokenizer.id_to_token(
      features["input_ids"][0][features["start_positions"][0]:
                               features["end_positions"][0] + 1]) == ["normandy"]
  with pytest.raises(ValueError, match="question 'long': 64 pieces leave no room"):
    squad.convert_examples(examples, tokenizer, 60, 128, 64)


def test_get_final_text_cases():
  # The docstring example of run_squad.py.
  assert sp.get_final_text("steve smith", "Steve Smith's", True) == "Steve Smith"
  assert sp.get_final_text("zurich", "Zürich.", True) == "Zürich"
  assert sp.get_final_text("1895", "(1895-1943).", True) == "1895"
  assert sp.get_final_text("nowhere", "Steve", True) == "Steve"  # not found: the whole text
  assert sp.basic_tokenize("Café  MÜLLER, (1895)", True) == [
      "cafe", "muller", ",", "(", "1895", ")"]


def _predict(examples, features, tokenizer, spans_by_feature, **kw):
  """Logits that make the given (start, end) the best span of each feature (others ~0)."""
  n, seq = features["input_ids"].shape
  start = np.zeros((n, seq), np.float32)
  end = np.zeros((n, seq), np.float32)
  for f, (s, e, score) in spans_by_feature.items():
    start[f, s] = end[f, e] = score
  return sp.compute_predictions(examples, features, start, end,
                                id_to_token=tokenizer.id_to_token, do_lower_case=True, **kw)


def _piece_position(features, f, tokenizer, piece):
  toks = tokenizer.id_to_token(features["input_ids"][f])
  return toks.index(piece)


def test_answers_map_back_to_context_char_for_char(tokenizer):
  context = "Café   Müller opened in\tZürich by   Steve Smith's   architect (1895-1943)."
  data = _data(context, [_qa("acc", "Where?", []), _qa("ws", "Who?", []),
                         _qa("pun", "When?", [])])
  examples, _ = squad.read_examples(data, "dev", False, False)
  features, _ = squad.convert_examples(examples, tokenizer, 64, 128, 16)
  pos = lambda f, p: _piece_position(features, f, tokenizer, p)  # noqa: E731
  preds, nbest, _ = _predict(examples, features, tokenizer, {
      0: (pos(0, "cafe"), pos(0, "zurich"), 5.0),  # accents, 3 spaces and a tab inside
      1: (pos(1, "steve"), pos(1, "smith"), 5.0),  # "Smith's" word -> "Smith"
      2: (pos(2, "1895"), pos(2, "1895"), 5.0)})
  assert preds == {"acc": "Café   Müller opened in\tZürich", "ws": "Steve Smith",
                   "pun": "1895"}
  assert nbest["acc"][0]["text"] == preds["acc"]
  assert sum(e["probability"] for e in nbest["acc"]) == pytest.approx(1.0)
  assert len(nbest["acc"]) <= 20


def test_nbest_rules_and_v2_null_threshold(tokenizer, tmp_path):
  context = "The Normans were people who gave their name to Normandy, a region in France."
  data = _data(context, [_qa("a", "Where?", [{"text": "Normandy", "answer_start": 47}]),
                         _qa("b", "Who?", [])])
  examples, _ = squad.read_examples(data, "dev", False, True)
  features, _ = squad.convert_examples(examples, tokenizer, 64, 128, 16)
  n, seq = features["input_ids"].shape
  start = np.full((n, seq), -10.0, np.float32)
  end = np.full((n, seq), -10.0, np.float32)
  norm0 = _piece_position(features, 0, tokenizer, "normandy")
  france0 = _piece_position(features, 0, tokenizer, "france")
  start[0, norm0], end[0, norm0] = 4.0, 4.0  # "Normandy": 8.0
  end[0, norm0 - 1] = 9.0  # would score 13 with start norm0, but ends before it starts
  start[0, 1] = 10.0  # would score 14 with end norm0, but starts in the question
  start[0, 0], end[0, 0] = 1.0, 1.0  # null score 2.0
  start[1, 0], end[1, 0] = 6.0, 6.0  # null 12.0 vs best non-null -20
  kwargs = dict(id_to_token=tokenizer.id_to_token, do_lower_case=True,
                version_2_with_negative=True)
  preds, nbest, null_odds = sp.compute_predictions(examples, features, start, end, **kwargs)
  assert preds == {"a": "Normandy", "b": ""}
  assert null_odds["a"] == pytest.approx(2.0 - 8.0)
  assert null_odds["b"] == pytest.approx(12.0 + 20.0)
  assert nbest["a"][0]["text"] == "Normandy" and "" in [e["text"] for e in nbest["a"]]
  texts = [e["text"] for e in nbest["a"]]
  assert len(texts) == len(set(texts))  # de-duplicated
  # max_answer_length: "name ... France" (14.0) is 8 pieces; "name to Normandy" (11.0) is 3.
  start[0, norm0] = end[0, norm0 - 1] = -10.0
  start[0, norm0 - 2] = 7.0
  end[0, france0] = 7.0
  preds, _, _ = sp.compute_predictions(examples, features, start, end, max_answer_length=3,
                                       **kwargs)
  assert preds["a"] == "name to Normandy"
  preds, _, _ = sp.compute_predictions(examples, features, start, end, **kwargs)
  assert preds["a"] == "name to Normandy, a region in France"
  # A threshold above the null odds turns "b" back into its best non-null text.
  preds, _, odds = sp.compute_predictions(examples, features, start, end,
                                          null_score_diff_threshold=100.0, **kwargs)
  assert preds["b"] != ""
  paths = sp.write_predictions(str(tmp_path), preds, nbest, odds)
  assert sorted(os.listdir(tmp_path)) == ["nbest_predictions.json", "null_odds.json",
                                          "predictions.json"]
  assert json.load(open(paths["predictions"])) == preds
  # The null odds are the official script's na_probs: its best threshold reads them.
  out = metrics.squad_v2_evaluate(data, json.load(open(paths["predictions"])),
                                  na_probs=json.load(open(paths["null_odds"])))
  assert "best_f1_thresh" in out


def test_windowed_prediction_uses_max_context_window(tokenizer):
  # A long context with stride: the answer appears in two windows; only the window where it
  # has the most context may propose it.
  words = CONTEXT_WORDS.split()
  context = " ".join(words)
  examples, _ = squad.read_examples(_data(context, [_qa("q", "who", [])]), "dev", False, False)
  features, _ = squad.convert_examples(examples, tokenizer, 24, 6, 8)
  assert len(features["input_ids"]) > 3
  target = "normandy"
  holders = [f for f in range(len(features["input_ids"]))
             if target in tokenizer.id_to_token(features["input_ids"][f])]
  assert len(holders) >= 2
  best = [f for f in holders
          if features["token_is_max_context"][f][_piece_position(features, f, tokenizer,
                                                                 target)]]
  assert len(best) == 1
  n, seq = features["input_ids"].shape
  start = np.full((n, seq), -10.0, np.float32)
  end = np.full((n, seq), -10.0, np.float32)
  for f in holders:  # the non-max windows score higher but must be ignored
    p = _piece_position(features, f, tokenizer, target)
    start[f, p] = end[f, p] = 1.0 if f == best[0] else 5.0
  preds, _, _ = sp.compute_predictions(examples, features, start, end,
                                       id_to_token=tokenizer.id_to_token, do_lower_case=True)
  assert preds["q"] == "normandy"


def test_tfds_path_through_mock_data(tokenizer):
  tfds = pytest.importorskip("tensorflow_datasets")
  from bert_jax_core.tf_setup import tf
  with tfds.testing.mock_data(num_examples=4, policy=tfds.testing.MockPolicy.USE_CODE):
    for name in ("squad_v1", "squad_v2"):  # random records: the reading path end to end
      examples, data, _ = squad.read_tfds(squad.TASKS[name], "/nonexistent", "dev", False)
      assert len(examples) == 4 and data[0]["paragraphs"][0]["qas"]
      features, _ = squad.convert_examples(examples, tokenizer, 64, 32, 16)
      assert features["input_ids"].shape[1] == 64

  context = "The Normans gave their name to Normandy, a region in France."
  records = [("q1", "Where?", ["Normandy"], [31]), ("q2", "Which country?", ["France"], [54]),
             ("q3", "Bad?", ["France"], [0])]

  def as_dataset(self, split, **kwargs):
    del self, split, kwargs

    def gen():
      for qid, question, texts, starts in records:
        yield {"id": qid, "title": "Normans", "context": context, "question": question,
               "answers": {"text": texts, "answer_start": starts}}

    string = tf.TensorSpec((), tf.string)
    return tf.data.Dataset.from_generator(gen, output_signature={
        "id": string, "title": string, "context": string, "question": string,
        "answers": {"text": tf.TensorSpec([None], tf.string),
                    "answer_start": tf.TensorSpec([None], tf.int32)}})

  with tfds.testing.mock_data(as_dataset_fn=as_dataset, policy=tfds.testing.MockPolicy.USE_CODE):
    examples, data, skips = squad.read_tfds(squad.TASKS["squad_v1"], "/nonexistent", "train",
                                            True)
  # Questions regrouped under one paragraph (one tokenization of the context).
  assert len(data) == 1 and len(data[0]["paragraphs"]) == 1
  assert [e.qas_id for e in examples] == ["q1", "q2"]
  assert skips.counts == {"Could not find answer": 1}
  features, _ = squad.convert_examples(examples, tokenizer, 64, 32, 16, is_training=True)
  s, e = features["start_positions"][1], features["end_positions"][1]
  assert tokenizer.id_to_token(features["input_ids"][1][s:e + 1]) == ["france"]


def test_project_tokenizer_gives_the_same_windows(tokenizer):
  tokenization = pytest.importorskip("data_pipelines.tokenizers.tokenization")
  ours = tokenization.get_tokenizer(vocab_file=tokenizer.vocab.path, do_lower_case=True)
  context = "Café   Müller opened in\tZürich by Steve Smith's architect (1895-1943). " * 3
  data = _data(context, [_qa("q", "Who opened the café in Zürich?",
                             [{"text": "Steve Smith", "answer_start": 34}])])
  examples, _ = squad.read_examples(data, "t", True, False)
  want, _ = squad.convert_examples(examples, tokenizer, 32, 8, 12, is_training=True)
  got, _ = squad.convert_examples(examples, ours, 32, 8, 12, is_training=True)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)
