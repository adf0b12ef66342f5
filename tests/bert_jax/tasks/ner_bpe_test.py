"""NER on a byte-level BPE tokenizer.json (ModernBERT's kind): the ids fed are transformers' ids
for the sentence, and each tag sits on the first piece of its word as transformers says.

The tokenizer is learned with the `tokenizers` library on the Python standard library's
docstrings (real English) by modernbert_cli_test's helper: 400 learned ids, no prefix space, as
ModernBERT's file. With so few merges many words start with a lone 'Ġ' (" German" is 'Ġ' 'G'
'er' 'm' 'an'), the case where "the piece's word" needs a rule: transformers' word_ids() gives
that 'Ġ' to the word after it, so it carries the word's tag. Encoding words one at a time (what
the WordPiece path does) gives 're' 'j' 'ect' 's' for "rejects" instead of the sentence's 'Ġre'
'j' 'ect' 's': test_ids_and_first_pieces_equal_transformers fails on it.
"""
import numpy as np
import pytest

from data_pipelines.tokenizers import tokenizer_json
from data_pipelines.tasks import ner
from data_pipelines.tasks.common import TaskDataError
from tests.bert_jax.families.modernbert.modernbert_cli_test import _docstring_lines, hf_tokenizer, modernbert_style_tokenizer

# CoNLL-2003's first sentences, then words a byte-level BPE splits into several pre-tokens
# ("U.S.", "don't", "1996-08-22") or into bytes ("Émile", "Zürich", "€5").
CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
to TO B-VP O
boycott VB I-VP O
British JJ B-NP B-MISC
lamb NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

BRUSSELS NNP B-NP B-LOC
1996-08-22 CD I-NP O

Émile NNP B-NP B-PER
met VBD B-VP O
U.S. NNP B-NP B-LOC
officials NNS I-NP O
in IN B-PP O
Zürich NNP B-NP B-LOC
, , O O
but CC O O
don't VBP B-VP O
pay VB I-VP O
€5 CD B-NP O
. . O O
"""
TASK = ner.TASKS["conll03"]


@pytest.fixture(scope="module")
def lines():
  return _docstring_lines()


@pytest.fixture(scope="module")
def modern(lines, tmp_path_factory):
  """(tokenizer.json path, our JsonTokenizer, transformers' PreTrainedTokenizerFast)."""
  path = str(tmp_path_factory.mktemp("modern") / "tokenizer.json")
  modernbert_style_tokenizer(lines).save(path)
  return path, tokenizer_json.JsonTokenizer(path), hf_tokenizer(path)


@pytest.fixture(scope="module")
def sentences(tmp_path_factory):
  d = tmp_path_factory.mktemp("conll")
  (d / "train.txt").write_text(CONLL, encoding="utf-8")
  return ner.read_examples(TASK, str(d), "train")


def _transformers_first_pieces(enc, words):
  """The first token of each CoNLL word by transformers' word_ids(): the sentence's encoding
  numbers its pre-tokens ("U.S." is 'ĠU' '.' 'S' '.': four), so each pre-token is placed in the
  CoNLL word its last character falls in (word_to_chars)."""
  starts = np.cumsum([0] + [len(w) + 1 for w in words[:-1]])
  first = {}
  for t, p in enumerate(enc.word_ids()):
    if p is None:
      continue
    _, end = enc.word_to_chars(p)
    first.setdefault(int(np.searchsorted(starts, end - 1, side="right") - 1), t)
  return [first[w] for w in range(len(words))]


def _check_against_transformers(features, sentences, hf):
  lone = 0
  for n, s in enumerate(sentences):
    length = int(features["input_mask"][n].sum())
    enc = hf(" ".join(s.words))  # [CLS] ... [SEP] from the file's TemplateProcessing
    assert features["input_ids"][n][:length].tolist() == enc["input_ids"], s.words
    first = _transformers_first_pieces(enc, s.words)
    assert np.flatnonzero(features["label_weights"][n]).tolist() == first, s.words
    assert features["label_ids"][n][first].tolist() == [TASK.labels.index(t) for t in s.tags]
    lone += sum(enc.tokens()[t] == tokenizer_json.BYTE_SPACE for t in first)
  return lone


def test_ids_and_first_pieces_equal_transformers(modern, sentences):
  _, ours, hf = modern
  features, stats = ner.convert_examples(TASK, sentences, ours, 64)
  assert stats["sentences_split"] == 0 and stats["features"] == 4
  assert stats["words_without_pieces"] == 0
  # A lone 'Ġ' starts (and tags) 'German', 'British', 'Blackburn', ... here: the rule is tested.
  assert _check_against_transformers(features, sentences, hf) >= 3
  # Why not transformers' is_split_into_words: each word is pre-tokenized alone, so without a
  # prefix space 'Ġre' becomes 're'; the model never saw those ids mid-sentence.
  words = sentences[0].words
  split = hf(words, is_split_into_words=True)["input_ids"]
  assert split != hf(" ".join(words))["input_ids"]
  assert hf.convert_ids_to_tokens(split)[3] == "re"


def test_prefix_space_bpe_equals_transformers_split_into_words(lines, sentences, tmp_path):
  """build_vocab's byte-level BPE adds a prefix space (RoBERTa's add_prefix_space=True): there
  transformers' is_split_into_words is the sentence's encoding, and its word_ids() are the
  CoNLL words themselves, the RoBERTa way of token classification."""
  text, _ = tokenizer_json.learn(lines, 400, model_type="bpe", byte_level=True, lower_case=False)
  path = tmp_path / "tokenizer.json"
  path.write_text(text, encoding="utf-8")
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  hf = PreTrainedTokenizerFast(tokenizer_file=str(path))
  features, _ = ner.convert_examples(TASK, sentences, tokenizer_json.JsonTokenizer(str(path)), 64)
  for n, s in enumerate(sentences):
    enc = hf(s.words, is_split_into_words=True)
    length = int(features["input_mask"][n].sum())
    assert features["input_ids"][n][:length].tolist() == enc["input_ids"]
    word_ids = enc.word_ids()
    first = [word_ids.index(w) for w in range(len(s.words))]
    assert np.flatnonzero(features["label_weights"][n]).tolist() == first


def test_windows_and_predictions_map_back(modern, sentences, tmp_path):
  _, ours, hf = modern
  whole, _ = ner.convert_examples(TASK, sentences, ours, 64)
  # Word-level predictions: the gold tag on each word's first piece (transformers' positions),
  # another tag everywhere else; reading back must give the gold tags.
  predicted = np.full_like(whole["label_ids"], TASK.labels.index("I-MISC"))
  for n, s in enumerate(sentences):
    first = _transformers_first_pieces(hf(" ".join(s.words)), s.words)
    predicted[n, first] = [TASK.labels.index(t) for t in s.tags]
  assert ner.predictions_to_tags(TASK, sentences, whole, predicted) == [s.tags for s in sentences]
  path = ner.write_predictions(str(tmp_path / "p.txt"), sentences, [s.tags for s in sentences])
  assert "Émile B-PER B-PER\n" in open(path, encoding="utf-8").read()
  # Windows of at most 14 pieces are slices of the sentence's encoding, cut at word borders.
  windows, stats = ner.convert_examples(TASK, sentences, ours, 16)
  assert stats["sentences_split"] >= 2 and stats["words_truncated"] == 0
  for n, s in enumerate(sentences):
    rows = np.flatnonzero(windows["sentence_index"] == n)
    ids = [i for r in rows
           for i in windows["input_ids"][r][1:windows["input_mask"][r].sum() - 1].tolist()]
    assert ids == hf(" ".join(s.words), add_special_tokens=False)["input_ids"]
  gold = ner.predictions_to_tags(TASK, sentences, windows, windows["label_ids"])
  assert gold == [s.tags for s in sentences]


def test_pretokenizer_rewrites_words_then_the_sentence_is_encoded(modern, sentences):
  """With a pre-tokenizer (mecab, jieba) each word is rewritten, the rewritten words joined and
  encoded whole; the tag sits on the first piece of the rewritten word."""
  path, _, hf = modern
  ours = tokenizer_json.JsonTokenizer(path)
  ours.pretokenizer = lambda words: [w.replace("-", " - ") for w in words]
  features, _ = ner.convert_examples(TASK, sentences[2:3], ours, 64)
  rewritten = ["BRUSSELS", "1996 - 08 - 22"]
  enc = hf(" ".join(rewritten))
  assert features["input_ids"][0][:features["input_mask"][0].sum()].tolist() == enc["input_ids"]
  first = _transformers_first_pieces(enc, rewritten)
  assert np.flatnonzero(features["label_weights"][0]).tolist() == first


def test_a_piece_across_a_space_is_a_one_line_error(tmp_path):
  """A tokenizer whose pieces cross spaces (no pre-tokenizer: here a merge 'a Ġ' + 'b') cannot
  tag one word per piece: refused before any compute, naming the sentence, file and fix."""
  from tokenizers import AddedToken, Tokenizer, models  # pylint: disable=g-import-not-at-top
  vocab = {c: i for i, c in enumerate("ab ")}
  vocab.update({"a ": 3, "a b": 4})
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[("a", " "), ("a ", "b")]))
  tok.add_special_tokens([AddedToken(t, special=True) for t in tokenizer_json.SPECIALS])
  path = str(tmp_path / "crossing.json")
  tok.save(path)
  crossing = tokenizer_json.JsonTokenizer(path)
  s = ner.Sentence(["b", "a", "b"], ["O", "B-PER", "I-PER"], 7, "train.txt")
  with pytest.raises(TaskDataError) as e:
    ner.convert_examples(TASK, [s], crossing, 16)
  message = str(e.value)
  assert "\n" not in message
  assert message.startswith(f"train.txt:7: the tokenizer {path} makes a piece 'a b' of the "
                            "words 'a' and 'b'; ")
  assert "pre_tokenizer splits at spaces" in message and "build_vocab" in message


def test_encode_words_follows_word_ids_with_and_without_a_pretokenizer(modern, sentences):
  """JsonTokenizer.encode_words (extract_features' word map): each piece to its pre-token's word
  as transformers' word_ids() says, so a lone 'Ġ' to the word after it; with a pre-tokenizer the
  rewritten words are joined and encoded whole (alone, "1996 - 08 - 22" loses its 'Ġ')."""
  path, ours, hf = modern
  lone = 0
  for s in sentences:
    [(ids, index)] = ours.encode_words([s.words])
    enc = hf(" ".join(s.words), add_special_tokens=False)
    assert ids == enc["input_ids"]
    starts = np.cumsum([0] + [len(w) + 1 for w in s.words[:-1]])
    assert index == [int(np.searchsorted(starts, enc.word_to_chars(p)[1] - 1, side="right") - 1)
                     for p in enc.word_ids()], s.words
    lone += enc.tokens().count(tokenizer_json.BYTE_SPACE)
  assert lone >= 3
  pre = tokenizer_json.JsonTokenizer(path)
  pre.pretokenizer = lambda words: [w.replace("-", " - ") for w in words]
  [(ids, index)] = pre.encode_words([sentences[2].words])  # BRUSSELS 1996-08-22
  enc = hf("BRUSSELS 1996 - 08 - 22", add_special_tokens=False, return_offsets_mapping=True)
  assert ids == enc["input_ids"]
  assert index == [0 if end <= len("BRUSSELS") else 1 for _, end in enc["offset_mapping"]]
