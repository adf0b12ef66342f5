"""SQuAD on a byte-level BPE tokenizer.json (ModernBERT's kind): the ids fed are transformers' ids
for the question and the paragraph, the answer's first and last piece are what transformers'
run_qa.py finds from offset_mapping, and a predicted span gives back the answer's text.

The tokenizer is ner_bpe_test's: learned with the `tokenizers` library on the standard library's
docstrings by modernbert_cli_test's helper, 400 learned ids, no prefix space, as ModernBERT's
file. With so few merges many words start with a lone 'Ġ' (" German" is 'Ġ' 'G' 'er' 'm' 'an')
and "(1895-1943)" is 'Ġ(' '1' '8' '9' '5' ...: the word-by-word path (google-research/bert's)
gives 're' for the paragraph's 'Ġre' in "rejects", and the answer "1895" encoded alone is not
the paragraph's pieces; test_ids_and_answer_pieces_equal_transformers fails on it.
"""
import numpy as np
import pytest

from data_pipelines.tokenizers import tokenizer_json
from data_pipelines.tasks import squad
from data_pipelines.tasks import squad_predictions as sp
from data_pipelines.tasks.common import TaskDataError
from tests.bert_jax.tasks.ner_bpe_test import lines, modern  # noqa: F401 - pytest fixtures, shared

# Two spaces and a newline between words (the paragraph is encoded as is, as transformers does),
# accents ('É' is two byte pieces), a sub-word answer ("1895" inside "(1895-1943)") and words
# that begin with a lone 'Ġ' (German, British, Blackburn).
CONTEXT = ("EU rejects German call to boycott British lamb.  Peter Blackburn met Émile in "
           "Zürich,\nbut the architect (1895-1943) didn't pay €5.")
ANSWERS = (("q_german", "  Which call?", "German call"),  # leading spaces: run_qa lstrips
           ("q_peter", "Who met him?", "Peter Blackburn"),
           ("q_year", "When was he born?", "1895"),
           ("q_emile", "Whom did he meet?", "Émile"),
           ("q_zurich", "Where?", "Zürich"),
           ("q_years", "Who?", "architect (1895-1943)"),
           ("q_euro", "How much?", "€5"))


def _examples(is_training, context=CONTEXT, answers=ANSWERS):
  qas = [{"id": qid, "question": q, "answers": [{"text": a, "answer_start": context.index(a)}]}
         for qid, q, a in answers]
  data = [{"title": "T", "paragraphs": [{"context": context, "qas": qas}]}]
  examples, skips = squad.read_examples(data, "t", is_training, False)
  assert not skips.counts
  return examples


def _run_qa_positions(hf, question, context, answer_start, answer):
  """transformers' examples/pytorch/question-answering/run_qa.py, prepare_train_features: the
  first and last token of the answer from offset_mapping (one window, the context's tokens)."""
  enc = hf(question.lstrip(), context, return_offsets_mapping=True)
  offsets, sequence_ids = enc["offset_mapping"], enc.sequence_ids()
  start_char, end_char = answer_start, answer_start + len(answer)
  token_start_index = sequence_ids.index(1)
  token_end_index = len(sequence_ids) - 1 - sequence_ids[::-1].index(1)
  assert offsets[token_start_index][0] <= start_char and offsets[token_end_index][1] >= end_char
  while token_start_index < len(offsets) and offsets[token_start_index][0] <= start_char:
    token_start_index += 1
  while offsets[token_end_index][1] >= end_char:
    token_end_index -= 1
  return enc, token_start_index - 1, token_end_index + 1


def _predict(examples, features, ours, spans):
  """Predictions with logits that make spans[f] = (start, end) the best span of window f."""
  start = np.zeros(features["input_ids"].shape, np.float32)
  end = np.zeros_like(start)
  for f, (s, e) in spans.items():
    start[f, s] = end[f, e] = 5.0
  preds, nbest, _ = sp.compute_predictions(examples, features, start, end,
                                           id_to_token=ours.id_to_token, do_lower_case=False,
                                           vocab_kind=ours.vocab.kind)
  return preds, nbest


def test_ids_and_answer_pieces_equal_transformers(modern):
  _, ours, hf = modern
  examples = _examples(True)
  features, stats = squad.convert_examples(examples, ours, 128, 128, 64, is_training=True)
  assert stats["features"] == len(ANSWERS) and stats["answer_outside_window"] == 0
  lone = 0
  for f, (_, question, answer) in enumerate(ANSWERS):
    enc, first, last = _run_qa_positions(hf, question, CONTEXT, CONTEXT.index(answer), answer)
    n = int(features["input_mask"][f].sum())
    # [CLS] question [SEP] paragraph [SEP]: the file's TemplateProcessing for the pair.
    assert features["input_ids"][f][:n].tolist() == enc["input_ids"], question
    assert (features["start_positions"][f], features["end_positions"][f]) == (first, last)
    lone += enc.tokens()[first - 1] == tokenizer_json.BYTE_SPACE
  # The rule is tested: answers after a lone 'Ġ' start at the letter (run_qa: the last token
  # starting at or before the answer), "1895" inside its word, "Émile" at É's second byte.
  assert lone >= 3
  tokens = ours.id_to_token(features["input_ids"][2])
  assert tokens[features["start_positions"][2]:features["end_positions"][2] + 1] == list("1895")
  # Why not word by word (google-research/bert's path): alone, "rejects" loses its 'Ġ'.
  by_word = squad._encode_words(ours, examples)[0]  # pylint: disable=protected-access
  alone = [i for p in by_word for i in p]
  assert alone != hf(CONTEXT, add_special_tokens=False)["input_ids"]
  assert ours.id_to_token(alone[2:3]) == ["re"]


def test_windows_are_slices_and_predictions_give_back_the_answers(modern):
  _, ours, hf = modern
  whole = hf(CONTEXT, add_special_tokens=False)["input_ids"]
  for max_seq_length, stride in ((128, 128), (28, 8)):
    train, stats = squad.convert_examples(_examples(True), ours, max_seq_length, stride, 64,
                                          is_training=True)
    examples = _examples(False)
    evals, _ = squad.convert_examples(examples, ours, max_seq_length, stride, 64)
    assert "token_to_char" in evals and "token_to_char" not in train
    for k in ("input_ids", "token_to_orig", "example_index"):
      np.testing.assert_array_equal(evals[k], train[k], err_msg=k)
    # Each window's document part is a slice of the paragraph's ids, its characters with it.
    for f in range(len(evals["input_ids"])):
      doc = np.flatnonzero(evals["token_to_orig"][f] >= 0)
      ids = evals["input_ids"][f][doc].tolist()
      start = next(i for i in range(len(whole)) if whole[i:i + len(ids)] == ids)
      chars = hf(CONTEXT, add_special_tokens=False, return_offsets_mapping=True)
      assert evals["token_to_char"][f][doc].tolist() == [
          list(o) for o in chars["offset_mapping"][start:start + len(ids)]]
    # The gold span of the window holding the answer (in its max-context part) reads back as
    # the answer, character for character ('Ġ' and bytes are cut out of the context itself).
    spans = {}
    for f in range(len(train["input_ids"])):
      s, e = int(train["start_positions"][f]), int(train["end_positions"][f])
      if s and train["token_is_max_context"][f][s]:
        spans.setdefault(int(train["example_index"][f]), (f, s, e))
    # In 28-piece windows the 16 pieces of "architect (1895-1943)" start near a window's left
    # edge, where no window gives its first piece the most context: not predictable there.
    assert len(spans) == (len(ANSWERS) if max_seq_length == 128 else len(ANSWERS) - 1)
    preds, nbest = _predict(examples, evals, ours, {f: (s, e) for f, s, e in spans.values()})
    assert {examples[i].qas_id: preds[examples[i].qas_id] for i in spans} == {
        ANSWERS[i][0]: ANSWERS[i][2] for i in spans}, max_seq_length
    assert nbest["q_peter"][0]["text"] == "Peter Blackburn"
    if max_seq_length == 28:
      assert stats["answer_outside_window"] > 0 and len(evals["input_ids"]) > len(ANSWERS)


def test_pretokenizer_rewrites_words_then_the_paragraph_is_encoded(modern):
  """With a pre-tokenizer (mecab, jieba) each word is rewritten ("(1895-1943)" -> "(1895 - 1943)"),
  the words joined by single spaces and encoded whole; answers are still found by character."""
  path, _, hf = modern
  ours = tokenizer_json.JsonTokenizer(path)
  ours.pretokenizer = lambda words: [w.replace("-", " - ") for w in words]
  answers = (("q_year", "Born?", "1895"), ("q_years", "Who?", "architect (1895-1943)"),
             ("q_end", "Died?", "1943"))
  train, _ = squad.convert_examples(_examples(True, answers=answers), ours, 128, 128, 64,
                                    is_training=True)
  rewritten = " ".join(w.replace("-", " - ") for w in CONTEXT.split())
  for f, (_, question, answer) in enumerate(answers):
    enc, first, last = _run_qa_positions(hf, question, rewritten,
                                         rewritten.index(answer.replace("-", " - ")), answer)
    assert train["input_ids"][f][:train["input_mask"][f].sum()].tolist() == enc["input_ids"]
    if "-" not in answer:   # the rewritten answer is longer: its end is checked by its text
      assert (train["start_positions"][f], train["end_positions"][f]) == (first, last)
  examples = _examples(False, answers=answers)
  evals, _ = squad.convert_examples(examples, ours, 128, 128, 64)
  preds, _ = _predict(examples, evals, ours, {f: (int(train["start_positions"][f]),
                                                  int(train["end_positions"][f]))
                                              for f in range(len(answers))})
  assert preds == {qid: a for qid, _, a in answers}
  # A pre-tokenizer that changes characters cannot be mapped back: one line, before compute.
  ours.pretokenizer = lambda words: [w.upper() for w in words]
  with pytest.raises(TaskDataError, match=r"question 'q_year': the pre-tokenizer rewrote the "
                                          r"word 'rejects' as 'REJECTS'"):
    squad.convert_examples(examples, ours, 128, 128, 64)
