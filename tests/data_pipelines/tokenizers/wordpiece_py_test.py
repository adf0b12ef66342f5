"""data_pipelines/tokenizers/wordpiece_py.py gives the ids of the in-graph TF WordPiece tokenizer."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import glob
import os

import pytest

from data_pipelines.tokenizers import bert_chars
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import wordpiece_py

ROOT = tests.ROOT
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
EDGE = ["The man went to the [MASK] .", "[CLS]x[SEP]  [mask] [MASK][MASK]", "",
        "ÀÉÎõü ΣΑΣ ß İstanbul 中文字 Ǆ ﬁ x\u0301\u0323y e\u0301 \u00e9", "a" * 250 + " b",
        "tab\tnew\nline\r\x00nul\ufffd\u200bzero-width", "don't stop-it, (now)!? ¿qué? «oui»",
        "unaffable ##less flightless", "\U0001f600 emoji \u2e43 \u166d", "ΜΆΪΟΣ ΜΆΪΟΣ."]


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
  pieces = ("the man went to store . , he bought a gallon of milk penguin are flight ##less "
            "birds un ##aff ##able don ' t stop it now ! ? ( ) - qu ##e ##é oui « » tab new "
            "line nul zero width emoji istanbul 中 文 字 e é à σ ς ß ss fi").split()
  letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
  tokens = SPECIALS + pieces + letters + ["##" + c for c in letters]
  path = tmp_path_factory.mktemp("wp") / "vocab.txt"
  path.write_text("\n".join(dict.fromkeys(tokens)) + "\n", encoding="utf-8")
  return str(path)


def _boundary_code_points():
  """Both ends of every range of every character table, and their neighbours."""
  cps = set()
  for spec in (bert_chars.REMOVE, bert_chars.SPACE, bert_chars.CJK, bert_chars.PUNCT,
               bert_chars.MARK):
    for a, b in bert_chars.parse_ranges(spec):
      cps.update((a - 1, a, b, b + 1))
  cps.update(bert_chars.parse_fixes(bert_chars.UNCASED_FIXES))
  return sorted(c for c in cps if 0 <= c < 0x110000 and not 0xD800 <= c < 0xE000)


def _doc_lines():
  lines = []
  for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")) +
                     [os.path.join(ROOT, "README.md")]):
    with open(path, encoding="utf-8") as f:
      lines += f.read().splitlines()
  return lines


def _same(vocab_file, lower, texts):
  want = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=lower).encode(texts)
  got = wordpiece_py.PythonWordPieceTokenizer(vocab_file, do_lower_case=lower).encode(texts)
  return [t for t, w, g in zip(texts, want, got) if w != g]


@pytest.mark.parametrize("lower", [True, False])
def test_same_ids_as_the_tf_tokenizer(vocab_file, lower):
  cps = sorted(set(_boundary_code_points()) | set(range(0, 0x110000, 97)) - set(
      range(0xD800, 0xE000)))
  texts = [f"a{chr(c)}b {chr(c)}" for c in cps] + EDGE + _doc_lines()
  assert len(texts) > 13_000
  assert _same(vocab_file, lower, texts) == []


@pytest.mark.slow
@pytest.mark.parametrize("lower", [True, False])
def test_same_ids_on_every_code_point(vocab_file, lower):
  texts = [f"a{chr(c)}b {chr(c)}" for c in range(0x110000) if not 0xD800 <= c < 0xE000]
  assert _same(vocab_file, lower, texts) == []


def test_interface(vocab_file):
  tok = wordpiece_py.PythonWordPieceTokenizer(vocab_file, do_lower_case=True)
  ids = tok.encode(["Flightless [MASK]"])[0]
  assert tok.id_to_token(ids) == ["flight", "##less", "[MASK]"]
  assert tok.vocab.mask_id == ids[-1] and tok.pretokenizer is None and tok.do_lower_case
  with pytest.raises(TypeError, match="wrap a single string in a list"):
    tok.encode("one string")
