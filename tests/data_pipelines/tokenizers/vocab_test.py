"""Tokenizer settings: <vocab>.meta.json, casing inference for vocabs without it, contradictions."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import pytest

from bert_jax_core import errors
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib

ROOT = tests.ROOT
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def _vocab(tmp_path, words, name="vocab.txt", meta=None):
  path = str(tmp_path / name)
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(SPECIALS + words) + "\n")
  if meta is not None:
    vocab_lib.write_settings(path, meta)
  return path


@pytest.mark.parametrize("words,expected", [
    (["the", "##ing", "hello"], True),  # bert-base-uncased-like
    (["The", "the", "Paris", "##ing"], False),  # capitals: cased
    (["ᄒ", "##ᅡ", "##ᆫ", "the"], True),  # uncased NFD Korean: jamo only (mBERT uncased)
    (["한국", "##어", "the"], False),  # whole syllables cannot come out of NFD
    (["中", "国", "the"], True),  # ideographs survive lower-casing (google's chinese_L-12 is uncased)
    (["が", "the"], False),  # NFD + mark stripping turns が into か
])
def test_casing_inferred_from_vocab_without_metadata(tmp_path, words, expected):
  path = _vocab(tmp_path, words)
  assert tokenization.get_tokenizer(path).do_lower_case is expected
  assert vocab_lib.resolve_settings(vocab_file=path)["do_lower_case"] is expected


def test_undetermined_casing_needs_the_flag(tmp_path):
  # 1 token of 201 changes when lower-cased: too few to call it cased, too many for uncased.
  path = _vocab(tmp_path, [f"w{i}" for i in range(200)] + ["Zebra"])
  with pytest.raises(vocab_lib.CasingMismatchError) as e:
    tokenization.get_tokenizer(path)
  msg = str(e.value)
  assert "cannot tell whether" in msg and "1 of 201" in msg and "--do_lower_case=" in msg
  assert "\n" not in msg
  assert tokenization.get_tokenizer(path, do_lower_case=False).do_lower_case is False
  assert vocab_lib.resolve_settings(vocab_file=path, recorded=(
      {"do_lower_case": True}, "dataset_info.json"))["do_lower_case"] is True


def test_google_name_wins(tmp_path):
  os.makedirs(tmp_path / "multi_cased_L-12_H-768_A-12")
  path = _vocab(tmp_path, ["the"], "multi_cased_L-12_H-768_A-12/vocab.txt")
  assert vocab_lib.resolve_settings(vocab_file=path)["do_lower_case"] is False


def test_metadata_is_the_source_of_truth(tmp_path):
  meta = {"vocab_kind": "wordpiece", "do_lower_case": False, "pretokenizer": "none"}
  path = _vocab(tmp_path, ["the", "hello"], meta=meta)  # no capitals, but recorded cased
  tok = tokenization.get_tokenizer(path)
  assert tok.do_lower_case is False and tok.settings["casing_source"].endswith(".meta.json")
  with pytest.raises(vocab_lib.CasingMismatchError) as e:
    tokenization.get_tokenizer(path, do_lower_case=True)
  assert isinstance(e.value, errors.UserError)
  msg = str(e.value)
  assert "--do_lower_case=True" in msg and "vocab.txt.meta.json" in msg and "\n" not in msg
  # Records or a checkpoint that recorded another casing: both sides named.
  with pytest.raises(vocab_lib.CasingMismatchError, match="dataset_info.json says "
                     "do_lower_case=True but .*vocab.txt.meta.json says do_lower_case=False"):
    vocab_lib.resolve_settings(vocab_file=path, recorded=({"do_lower_case": True},
                                                          "dataset_info.json"))
  with pytest.raises(vocab_lib.CasingMismatchError, match="--pretokenizer=mecab"):
    vocab_lib.resolve_settings(vocab_file=path, pretokenizer="mecab")


def test_bad_metadata_is_a_user_error(tmp_path):
  path = _vocab(tmp_path, ["the"])
  with open(path + ".meta.json", "w") as f:
    f.write("{not json")
  with pytest.raises(vocab_lib.VocabError, match="not valid JSON"):
    vocab_lib.read_settings(path)


def test_contradicting_flag_on_inferred_vocab(tmp_path):
  path = _vocab(tmp_path, ["한국", "##어"])
  with pytest.raises(vocab_lib.CasingMismatchError, match="whole Hangul syllable"):
    tokenization.get_tokenizer(path, do_lower_case=True)


def test_tokenize_cli_contradiction_exits_2(tmp_path):
  path = _vocab(tmp_path, ["the"], meta={"do_lower_case": False, "pretokenizer": "none"})
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.tokenize", f"--vocab_file={path}",
       "--do_lower_case=true"], input=b"hi\n", capture_output=True, cwd=ROOT)
  assert result.returncode == 2
  last = result.stderr.decode().strip().splitlines()[-1]
  assert last.startswith("error: --do_lower_case=True but ") and "is cased" in last
  assert "meta.json" in last
