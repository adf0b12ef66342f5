"""Document filters: script detection, dedup digests and keys, length, flag errors."""

import array

import pytest

from data_pipelines import create_pretraining_data as cpd
from data_pipelines.corpus import filters


def test_parse_scripts_aliases_and_errors():
  assert filters.parse_scripts("Latin, han") == {"LATIN", "CJK"}
  assert filters.parse_scripts("") == frozenset()
  with pytest.raises(filters.FilterError, match=r"--keep_scripts=Latin,Elvish: unknown script "
                                                r"'Elvish'; expected some of Latin, Cyrillic"):
    filters.parse_scripts("Latin,Elvish")


def test_script_fraction_counts_letters_only():
  latin = filters.parse_scripts("Latin")
  assert filters.script_fraction(["Hello, world 123!"], latin) == 1.0
  assert filters.script_fraction(["Привет мир"], latin) == 0.0
  assert filters.script_fraction(["abcd", "абвг"], latin) == 0.5
  assert filters.script_fraction(["12 + 3 = 15."], latin) == 1.0  # no letter: kept
  assert filters.script_fraction(["中文 text"], filters.parse_scripts("Han")) == pytest.approx(
      2 / 6)
  assert filters.script_fraction(["한국어"], filters.parse_scripts("Hangul")) == 1.0


def test_keep_text_and_tokens_count_what_they_drop():
  cfg = filters.FilterConfig(min_document_tokens=5, keep_scripts="Latin",
                             min_script_fraction=0.6)
  stats = cpd.Stats()
  latin = filters.parse_scripts(cfg.keep_scripts)
  assert filters.keep_text(["Mostly English, ein bisschen"], cfg, latin, stats)
  assert not filters.keep_text(["Mostly English", "но больше русского текста"], cfg, latin,
                               stats)
  assert filters.keep_tokens([array.array("i", [1, 2, 3]), array.array("i", [4, 5])], cfg, stats)
  assert not filters.keep_tokens([array.array("i", [1, 2, 3, 4])], cfg, stats)
  assert (stats.filtered_script, stats.filtered_short) == (1, 1)
  assert not filters.FilterConfig().enabled and cfg.enabled


def test_digest_ignores_whitespace_only_and_first_occurrences_win():
  d = filters.document_digest
  assert d(["A  sentence.", "Two"]) == d([" A sentence. ", "Two"])
  assert d(["A sentence.", "Two"]) != d(["A sentence. Two"])  # sentence boundaries count
  assert d(["a"]) != d(["A"])
  keyed = [((1, 0), b"x"), ((0, 5), b"y"), ((0, 2), b"x"), ((2, 0), b"y"), ((0, 9), b"z")]
  assert filters.first_occurrences(keyed) == {(0, 2), (0, 5), (0, 9)}


def test_validate_flags():
  filters.validate(filters.FilterConfig())
  with pytest.raises(filters.FilterError, match="--min_document_tokens=-1"):
    filters.validate(filters.FilterConfig(min_document_tokens=-1))
  with pytest.raises(filters.FilterError, match=r"--min_script_fraction=0.0: expected a fraction"):
    filters.validate(filters.FilterConfig(min_script_fraction=0.0))
