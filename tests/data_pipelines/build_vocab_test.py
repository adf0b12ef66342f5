"""Vocabulary learning: WordPiece vocab.txt and SentencePiece unigram/BPE models, and bad inputs."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

from absl import flags
import pytest
import sentencepiece as spm

from data_pipelines import build_vocab, stdlib_corpus
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib
from tests.testlib import not_text

ROOT = tests.ROOT


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  out = tmp_path_factory.mktemp("corpus")
  stdlib_corpus.write_corpus(str(out), num_files=2, max_modules=120)  # ~0.15 MB
  return str(out / "*.txt")


def test_wordpiece_vocab_with_specials_first(corpus, tmp_path):
  path = str(tmp_path / "vocab.txt")
  size, num_files, meta = build_vocab.build(corpus, 1000, path, lower_case=True, num_unused=3)
  tokens = vocab_lib.load_wordpiece_vocab(path)
  assert num_files == 2 and size == len(tokens)
  assert 950 <= len(tokens) <= 1000  # within the learner's 5% slack under the target
  assert tokens[:8] == ["[PAD]", "[unused0]", "[unused1]", "[unused2]", "[UNK]", "[CLS]",
                        "[SEP]", "[MASK]"]
  assert len(set(tokens)) == len(tokens)
  info = vocab_lib.wordpiece_info(path)
  assert (info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (0, 4, 5, 6, 7)
  assert not any(t.lower() != t for t in tokens[8:])  # uncased: no capitals
  assert any(t.startswith("##") for t in tokens) and "the" in tokens
  # Every character is a piece (alone and as ##char), so the corpus tokenizes without [UNK].
  _, lines = build_vocab.read_corpus(corpus)
  ids = tokenization.WordPieceTokenizer(path, do_lower_case=True).encode(lines)
  assert sum(i == info.unk_id for row in ids for i in row) == 0
  assert not os.path.exists(path + ".tmp")
  assert vocab_lib.read_settings(path) == meta and meta["do_lower_case"] is True
  assert meta["vocab_kind"] == "wordpiece" and meta["casing_reason"] == "--lower_case"
  assert meta["sample"]["sentences_seen"] == len(lines) == meta["sample"]["sentences_used"]


def test_cased_wordpiece_keeps_capitals(corpus, tmp_path):
  path = str(tmp_path / "vocab.txt")
  build_vocab.build(corpus, 600, path, lower_case=False)
  tokens = vocab_lib.load_wordpiece_vocab(path)
  assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  assert "A" in tokens and "##A" in tokens and len(tokens) <= 600


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_sentencepiece_models(corpus, tmp_path, model_type):
  path = str(tmp_path / f"{model_type}.model")
  build_vocab.build(corpus, 800, path, lower_case=True, model_type=model_type)
  info = vocab_lib.sentencepiece_info(path)
  assert info.size == 800 and info.kind == "sentencepiece"
  assert (info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (0, 1, 2, 3, 4)
  # --lower_case: the model case-folds (nmt_nfkc_cf).
  assert vocab_lib.sentencepiece_lower_case(path)[0] is True
  assert vocab_lib.read_settings(path)["sentencepiece"]["model_type"] == model_type
  tok = tokenization.get_tokenizer(spm_model_file=path)
  assert tok.encode(["Hello World"]) == tok.encode(["hello world"])


def _write(path, data):
  with open(path, "wb") as f:
    f.write(data)
  return str(path)


def _error(**kwargs):
  with pytest.raises(build_vocab.BuildVocabError) as e:
    build_vocab.build(**kwargs)
  message = str(e.value)
  assert "\n" not in message
  return message


def test_bad_inputs_raise_one_line_errors(corpus, tmp_path):
  out = str(tmp_path / "out" / "vocab.txt")
  msg = _error(input_file=str(tmp_path / "nothing" / "*.txt"), vocab_size=500, output=out)
  assert "--input_file=" in msg and "no file matches" in msg
  blank = _write(tmp_path / "blank.txt", b"\n  \n\t\n")
  assert "no text" in _error(input_file=blank, vocab_size=500, output=out)
  latin1 = _write(tmp_path / "latin1.txt", "ok line\ncaf\xe9\n".encode("latin-1"))
  msg = _error(input_file=latin1, vocab_size=500, output=out)
  assert "latin1.txt is not UTF-8" in msg and "byte 11, line 2" in msg
  msg = _error(input_file=corpus, vocab_size=5, output=out)
  assert "--vocab_size=5 is too small" in msg
  msg = _error(input_file=corpus, vocab_size=60, output=out)
  assert "--vocab_size=60 is too small" in msg and "characters" in msg
  msg = _error(input_file=corpus, vocab_size=40, output=out, model_type="bpe")
  assert "--vocab_size=40" in msg and "required_chars" in msg
  msg = _error(input_file=corpus, vocab_size=90000, output=out, model_type="unigram")
  assert "Vocabulary size too high" in msg
  assert "--model_type=char" in _error(input_file=corpus, vocab_size=500, output=out,
                                       model_type="char")
  assert not os.path.exists(os.path.dirname(out))  # nothing written on any error


@pytest.mark.parametrize("kind, found", [
    ("png", "it is a PNG image"), ("gzip", "it is gzip-compressed"), ("utf16", "it is UTF-16LE"),
    # No byte-order mark: every byte is valid UTF-8 and was learned from, NULs and all.
    ("utf16_no_bom", "a NUL byte at byte 1 (line 1)"),
    ("cp949", "characters are invalid UTF-8 (the first at byte 0, line 1; more than 10%")])
def test_a_file_that_is_not_text_is_refused_by_the_shared_rule(corpus, tmp_path, kind, found):
  # Issue 49: the rule create_pretraining_data and the task readers apply (text_files.not_text).
  out = str(tmp_path / "out" / "vocab.txt")
  bad = not_text.write(tmp_path, kind)
  pattern = f"{corpus},{tmp_path}/*.txt"
  msg = _error(input_file=pattern, vocab_size=500, output=out)
  assert msg.startswith(f"--input_file={pattern}: {bad} is not UTF-8 text: ") and found in msg
  msg = _error(input_file="", input_sources=f"en={corpus};bad={tmp_path}/*.txt", vocab_size=500,
               output=out)
  assert msg.startswith(f"--input_sources: source 'bad': {bad} is not UTF-8 text: ")
  assert not os.path.exists(os.path.dirname(out))


def test_a_directory_is_one_line_and_a_utf8_bom_is_no_character(corpus, tmp_path):
  out = str(tmp_path / "out" / "vocab.txt")
  msg = _error(input_file=f"{corpus},{tmp_path}", vocab_size=500, output=out)
  assert msg.startswith(f"--input_file={corpus},{tmp_path}: {tmp_path} is a directory; ")
  bom = _write(tmp_path / "bom.txt", b"\xef\xbb\xbfFirst line.\nSecond line.\n")
  assert build_vocab.read_corpus(bom)[1] == ["First line.", "Second line."]


def test_cli_error_is_one_line(corpus, tmp_path, monkeypatch):
  flag_values = flags.FlagValues()  # not the global FLAGS: other modules may define these names
  build_vocab.define_flags(flag_values)
  flag_values(["build_vocab", f"--input_file={tmp_path}/none-*.txt", "--vocab_size=100",
               f"--output={tmp_path}/v.txt"])
  monkeypatch.setattr(build_vocab, "FLAGS", flag_values)
  with pytest.raises(build_vocab.BuildVocabError, match="^--input_file=.*no file matches"):
    build_vocab.main([])
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.build_vocab", f"--input_file={tmp_path}/none-*.txt",
       f"--output={tmp_path}/v.txt"], capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 2
  assert result.stderr.strip().splitlines()[-1].startswith("error: --input_file=")


def test_an_existing_vocab_or_its_settings_is_refused_unless_overwrite(corpus, tmp_path,
                                                                     monkeypatch):
  """Issue 49's rule (docs/faults.md): an existing --output, or its <output>.meta.json, is one
  line before the corpus is read; --overwrite lets the run go on (here to its input error)."""
  from bert_jax_core import files as files_lib
  for existing in ("v.txt", "v.txt.meta.json"):
    (tmp_path / existing).write_text("old")
    for overwrite in (False, True):
      flag_values = flags.FlagValues()
      build_vocab.define_flags(flag_values)
      flag_values(["build_vocab", f"--input_file={tmp_path}/none-*.txt", "--vocab_size=100",
                   f"--output={tmp_path}/v.txt"] + (["--overwrite"] if overwrite else []))
      monkeypatch.setattr(build_vocab, "FLAGS", flag_values)
      if overwrite:
        with pytest.raises(build_vocab.BuildVocabError, match="^--input_file=.*no file matches"):
          build_vocab.main([])
        continue
      with pytest.raises(files_lib.OutputPathError, match=rf"{existing}: already exists; pass "
                         "--overwrite to replace it"):
        build_vocab.main([])
    assert (tmp_path / existing).read_text() == "old"
    (tmp_path / existing).unlink()


def test_cli_writes_vocab(corpus, tmp_path):
  out = str(tmp_path / "vocab.txt")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.build_vocab", f"--input_file={corpus}",
       "--vocab_size=500", f"--output={out}", "--nolower_case"],
      capture_output=True, text=True, cwd=ROOT, check=True)
  assert result.stdout.startswith(f"wrote {out}: wordpiece vocabulary of ")
  assert vocab_lib.wordpiece_info(out).size <= 500


KOREAN = os.path.join(ROOT, "tests", "data", "korean", "*.txt")


def test_sample_is_uniform_deterministic_and_recorded(corpus, tmp_path):
  lines = [f"line {i}" for i in range(1000)]
  a = build_vocab.sample_lines(iter(lines), 100, seed=3)
  assert a.seen == 1000 and len(a.lines) == 100 and len(set(a.lines)) == 100
  assert build_vocab.sample_lines(iter(lines), 100, seed=3).lines == a.lines
  assert build_vocab.sample_lines(iter(lines), 100, seed=4).lines != a.lines
  # Uniform: the sample's mean index is near the middle (std of the mean ~29 for 100 of 1000).
  assert abs(sum(int(l.split()[1]) for l in a.lines) / 100 - 499.5) < 120
  assert build_vocab.sample_lines(iter(lines[:10]), 100).lines == lines[:10]
  path = str(tmp_path / "vocab.txt")
  _, _, meta = build_vocab.build(corpus, 600, path, lower_case=True, input_sentence_size=500,
                                 seed=7)
  assert meta["sample"]["input_sentence_size"] == 500 and meta["sample"]["seed"] == 7
  assert meta["sample"]["sentences_used"] == 500 < meta["sample"]["sentences_seen"]


def test_korean_corpus_defaults_to_cased_and_keeps_syllables(tmp_path, capsys):
  path = str(tmp_path / "ko.txt")
  # Without the reserved syllables, so the syllable pieces counted below are learned ones.
  _, _, meta = build_vocab.build(KOREAN, 2000, path, hangul_coverage="none")
  assert meta["do_lower_case"] is False and "Hangul/CJK-heavy" in meta["casing_reason"]
  assert meta["scripts"]["hangul"] > 0.9
  tokens = vocab_lib.load_wordpiece_vocab(path)
  assert sum(any("\uac00" <= c <= "\ud7a3" for c in t) for t in tokens) > 500
  assert "jamo" not in capsys.readouterr().err
  # Asking for uncased on Hangul says once how to keep the syllables whole; the default
  # coverage is off then (a syllable piece could never match NFD jamo), so 2000 is enough.
  _, _, meta = build_vocab.build(KOREAN, 2000, str(tmp_path / "uncased.txt"), lower_case=True)
  err = capsys.readouterr().err
  assert err.count("jamo") == 1 and "--nolower_case" in err
  assert meta["hangul_coverage"] == "none" and "uncased" in meta["hangul_coverage_reason"]
  tokens = vocab_lib.load_wordpiece_vocab(str(tmp_path / "uncased.txt"))
  assert not any("\uac00" <= c <= "\ud7a3" for t in tokens for c in t)  # NFD: jamo only


def test_english_corpus_defaults_to_uncased(corpus, tmp_path):
  _, _, meta = build_vocab.build(corpus, 600, str(tmp_path / "v.txt"))
  assert meta["do_lower_case"] is True and meta["casing_reason"].startswith("default: uncased")


def test_sentencepiece_options_and_byte_fallback(tmp_path):
  path = str(tmp_path / "ko.model")
  _, _, meta = build_vocab.build(KOREAN, 1200, path, model_type="unigram",
                                 character_coverage=0.98, byte_fallback=True)
  assert meta["sentencepiece"] == {"model_type": "unigram", "character_coverage": 0.98,
                                   "byte_fallback": True}
  assert meta["normalization"] == "nmt_nfkc" and meta["do_lower_case"] is False
  assert vocab_lib.sentencepiece_lower_case(path)[0] is False
  assert "<0xEB>" in spm.SentencePieceProcessor(model_file=path).id_to_piece(list(range(1200)))
  tok = tokenization.get_tokenizer(spm_model_file=path)
  # Syllables absent from the corpus (뷁 햏 똠) become byte pieces, not [UNK].
  ids = tok.encode(["뷁 햏 똠"])[0]
  assert tok.vocab.unk_id not in ids and len(ids) >= 9
  msg = _error(input_file=KOREAN, vocab_size=500, output=str(tmp_path / "x.model"),
               model_type="bpe", character_coverage=0.5)
  assert "--character_coverage=0.5" in msg


# --hangul_coverage: the 2,350 KS X 1001 syllables reserved as "가" and "##가".

def test_ksx1001_syllables_are_the_2350_of_euc_kr():
  syllables = build_vocab.ksx1001_syllables()
  assert len(syllables) == len(set(syllables)) == 2350 and syllables == sorted(syllables)
  assert syllables[0] == "가" and syllables[-1] == "힝"
  assert all("\uac00" <= s <= "\ud7a3" for s in syllables)
  assert "한" in syllables and "뷁" not in syllables and "햏" not in syllables  # 8-byte make-ups
  pieces = build_vocab.hangul_pieces()
  assert len(pieces) == 4700 and pieces[2350:] == ["##" + s for s in syllables]


def _syllable_pieces(tokens):
  reserved = set(build_vocab.hangul_pieces())
  return reserved & set(tokens), reserved


def test_hangul_coverage_default_flag_and_meta(corpus, tmp_path):
  path = str(tmp_path / "ko.txt")
  _, _, meta = build_vocab.build(KOREAN, 6200, path)  # every default
  tokens = vocab_lib.load_wordpiece_vocab(path)
  found, reserved = _syllable_pieces(tokens)
  assert found == reserved and len(tokens) <= 6200  # the 4,700 count toward --vocab_size
  assert tokens[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and tokens[5] == "가"
  assert len(tokens) > 4705 + 1000  # learned pieces fill the rest
  assert meta["hangul_coverage"] == "ksx1001"
  assert meta["hangul_coverage_reason"].startswith("default: on for a Hangul-heavy corpus")
  assert vocab_lib.read_settings(path)["hangul_coverage"] == "ksx1001"
  # Forced off on Korean: only the corpus' own ~430 syllables, as learned pieces.
  _, _, meta = build_vocab.build(KOREAN, 6200, path, hangul_coverage="none")
  found, _ = _syllable_pieces(vocab_lib.load_wordpiece_vocab(path))
  assert meta["hangul_coverage"] == "none" and len(found) < 1500
  assert meta["hangul_coverage_reason"] == "--hangul_coverage=none"
  # English: off by default; forced on, both forms are there.
  _, _, meta = build_vocab.build(corpus, 600, path)
  assert meta["hangul_coverage"] == "none"
  assert "not a Hangul-heavy" in meta["hangul_coverage_reason"]
  assert not _syllable_pieces(vocab_lib.load_wordpiece_vocab(path))[0]
  _, _, meta = build_vocab.build(corpus, 6000, path, lower_case=False, hangul_coverage="ksx1001")
  tokens = vocab_lib.load_wordpiece_vocab(path)
  assert _syllable_pieces(tokens)[0] == _syllable_pieces(tokens)[1] and "the" in tokens
  assert meta["hangul_coverage"] == "ksx1001" and len(tokens) <= 6000
  # SentencePiece: off by default (it has --character_coverage).
  _, _, meta = build_vocab.build(KOREAN, 1200, str(tmp_path / "ko.model"), model_type="unigram")
  assert meta["hangul_coverage"] == "none"
  flag_values = flags.FlagValues()
  build_vocab.define_flags(flag_values)
  flag_values(["build_vocab", "--hangul_coverage=ksx1001"])
  assert flag_values.hangul_coverage == "ksx1001"


def test_hangul_coverage_errors_are_one_line(tmp_path):
  out = str(tmp_path / "v.txt")
  # Before counting: 5 specials + 4,700 syllable pieces + 1,000 learned > 4,000.
  msg = _error(input_file=KOREAN, vocab_size=4000, output=out)
  assert msg.startswith("--vocab_size=4000 is too small for --hangul_coverage=ksx1001")
  assert "4,700 reserved syllable pieces" in msg and "need 5,705" in msg
  assert "--hangul_coverage=none" in msg
  # After counting: the corpus' 63 other characters (126 pieces) no longer leave 1,000.
  msg = _error(input_file=KOREAN, vocab_size=5800, output=out)
  assert "126 other character pieces" in msg and "need 5,831" in msg
  msg = _error(input_file=KOREAN, vocab_size=8000, output=out, hangul_coverage="ksx1001",
               lower_case=True)
  assert "jamo" in msg and "--nolower_case" in msg
  msg = _error(input_file=KOREAN, vocab_size=8000, output=str(tmp_path / "v.model"),
               model_type="unigram", hangul_coverage="ksx1001")
  assert "is for WordPiece" in msg
  assert "expected auto, ksx1001 or none" in _error(input_file=KOREAN, vocab_size=8000,
                                                    output=out, hangul_coverage="all")
  assert not os.path.exists(out)


def _unk_rate(vocab, lines):
  tok = tokenization.get_tokenizer(vocab)
  ids = [i for row in tok.encode(lines) for i in row]
  return ids.count(tok.vocab.unk_id) / len(ids)


def test_hangul_coverage_cuts_unknowns_on_held_out_korean(tmp_path):
  # Vocab from one bill (8.6 KB, ~300 distinct syllables), text from the constitution.
  bill = os.path.join(ROOT, "tests", "data", "korean", "1809891.txt")
  with open(os.path.join(ROOT, "tests", "data", "korean", "constitution.txt"),
            encoding="utf-8") as f:
    held_out = [l.strip() for l in f if l.strip()]
  with_cov, without = str(tmp_path / "with.txt"), str(tmp_path / "without.txt")
  build_vocab.build(bill, 8000, with_cov)
  build_vocab.build(bill, 8000, without, hangul_coverage="none")
  # Measured: 0.17% (23 of 13,366 ids; hanja and symbols the bill lacks) with coverage, 11.2%
  # (1,166 of 10,406) without: a missing syllable makes its whole eojeol one [UNK].
  assert _unk_rate(with_cov, held_out) < 0.01 < 0.05 < _unk_rate(without, held_out)
