"""In-graph tokenizers vs the reference, `transformers.BertTokenizer` (HF Rust `tokenizers`).

The vocab is learned (cased) from the stdlib corpus, plus tokens for the hard cases below, so
that accents, CJK, 'ß', final sigma etc. are in-vocab in some texts and [UNK] in others.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import random
import subprocess
import sys

import pytest
import sentencepiece as spm
from tokenizers import normalizers, pre_tokenizers
from transformers import BertTokenizer
from transformers.models.bert.tokenization_bert import load_vocab
from transformers.models.bert.tokenization_bert_legacy import BertTokenizerLegacy

from data_pipelines import build_vocab, stdlib_corpus
from data_pipelines.tokenizers import bert_chars
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib
from bert_jax_core.tf_setup import tf

ROOT = tests.ROOT

# Pieces that make the hard cases observable: with them in the vocab a wrong normalization
# gives a different id instead of the same [UNK].
EXTRA_TOKENS = [
    "Café", "café", "cafe", "naïve", "naive", "é", "##é", "ï", "##ï", "Ångström", "ångström",
    "angstrom", "Å", "##å", "中", "文", "字", "日", "本", "語", "😀", "##😀", "❤", "##\ufe0f",
    "straße", "strasse", "ß", "##ß", "ss", "##ss", "οδοσ", "οδος", "σ", "##σ", "ς", "##ς", "α",
    "##λ", "##φ", "istanbul", "İstanbul", "i̇stanbul", "ǆ", "ǅ", "ﬁ", "fi", "ａｂｃ", "abc",
    "é", "₂", "²", "ⅷ", "ⓐ", "ꟁ", "ꟑ", "𐖗", "\U00010570", "ɤ", "x", "##x", "ab", "##ab",
    "—", "«", "»", "¿", "‽", "\u2e43", "\u166d", "\U0002b820", "\U00020000", "ı", "k", "K",
]

LONG_WORD = "a" * 250  # over 200 characters -> [UNK]
WORD_150 = "ab" * 75  # under 200: WordPiece pieces (HF's default limit of 100 would say [UNK])

EDGE_TEXTS = [
    "Hello, World! This is a test of the tokenizer's behaviour (e.g. 3.14, $5, 100%).",
    "Café naïve Ångström façade Straße ŒUVRE İstanbul ǅungla DŽ Kelvin K ıi",
    "Cafe\u0301 nai\u0308ve A\u030angstro\u0308m",  # decomposed accents (NFD input)
    "中文字符和日本語のテキスト，한국어 텍스트。漢字\u3000全角　スペース",
    "I ❤️ tokenizers 😀👍🏽 family: 👨‍👩‍👧 flags 🇫🇷",
    "a\x00b\x07c\u200bd\ufeffe\x7ff\x85g\u00adh",  # NUL, BEL, ZWSP, BOM, DEL, NEL, soft hyphen
    "tab\there\nnew\r\nline\x0bvt\x0cff\u2028ls\u2029ps\u00a0nbsp\u3000ideo\u2003em",
    f"{LONG_WORD} and {WORD_150} and {LONG_WORD[:201]} {LONG_WORD[:200]}",
    "ΟΔΟΣ Σ ΣΑΣ Άλφα οδος σίσυφος ΣΊΣΥΦΟΣ",
    "foo—bar «quote» ¿qué? ‽ ⁂ \u2e43x\u166dy \u111c9z \U0002b820w \U00020000v",
    "ＡＢＣ１２３ ﬁle ｶﾀｶﾅ ² ₂ Ⅷ ⓐ ㎏ ℌ",  # compatibility characters: no NFKC in BERT
    "Ꟁ Ꟑ \U00010570 \ua7cb \U00010d50 \U000105c9 \U00016121",  # Unicode 14-16 letters
    "\ue000private \U000f0000use \u0378unassigned \U000e0001tag",
    "[CLS] hello [SEP] [MASK]ed [mask] [unused0] [PAD][UNK]x [MA SK] [[MASK]]",
    "https://example.com/path?q=1&r=2 user@example.com C++ x86_64 1,000.5 -42 3e-5",
    "",
    "   \t \n ",
    "x",
    "word " * 3000 + "end",  # a very long line (15,000 characters)
]

INVALID_BYTES = [
    b"valid \xff\xfe bytes \xc3\x28 caf\xc3\xa9 \xe2\x82",
    b"\xed\xa0\x80 surrogate \xf4\x90\x80\x80 big \xc0\xaf overlong [MASK]\xff[SEP]x\x80y",
    b"ab\xffcd",  # U+FFFD is removed, so "abcd" is one word
    b"\xce\xa3\xff",  # capital sigma with an invalid byte
]


def hf_tokenizer(vocab_file, lower_case, max_chars=tokenization.MAX_CHARS_PER_WORD):
  tok = BertTokenizer(vocab=load_vocab(vocab_file), do_lower_case=lower_case)
  tok.backend_tokenizer.model.max_input_chars_per_word = max_chars
  return tok


def hf_ids(tok, texts):
  return tok(list(texts), add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  out = tmp_path_factory.mktemp("corpus")
  # The first 300 modules: ~0.4 MB, 5,000 distinct words; a 2,000-piece vocab learns in ~2 s.
  stdlib_corpus.write_corpus(str(out), num_files=2, max_modules=300)
  return str(out / "*.txt")


@pytest.fixture(scope="module")
def vocab_file(corpus, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("vocab") / "vocab.txt")
  build_vocab.build(corpus, 2000, path, lower_case=False)
  tokens = open(path, encoding="utf-8").read().split("\n")[:-1]
  tokens += [t for t in dict.fromkeys(EXTRA_TOKENS) if t not in set(tokens)]
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path


@pytest.fixture(scope="module")
def ours_by_case(vocab_file):
  # Shared: each tokenizer traces its tf.function once (~2 s).
  return {lower: tokenization.WordPieceTokenizer(vocab_file, lower) for lower in (True, False)}


@pytest.fixture(scope="module", params=[True, False], ids=["uncased", "cased"])
def pair(request, vocab_file, ours_by_case):
  lower = request.param
  return ours_by_case[lower], hf_tokenizer(vocab_file, lower)


def test_edge_cases_match_hf(pair):
  ours, hf = pair
  expected = hf_ids(hf, EDGE_TEXTS)
  got = ours.encode(EDGE_TEXTS)
  for text, e, g in zip(EDGE_TEXTS, expected, got):
    assert g == e, f"{text[:60]!r}: {ours.id_to_token(g)[:20]} != {ours.id_to_token(e)[:20]}"
  # Not vacuous: accents and CJK hit real pieces, and both [UNK] and specials occur.
  flat = [t for ids in got for t in ours.id_to_token(ids)]
  assert "[UNK]" in flat and "[MASK]" in flat and "中" in flat
  assert ("Café" if not ours.do_lower_case else "cafe") in flat


def test_invalid_utf8_matches_hf_on_replacement_decoding(pair):
  ours, hf = pair
  got = ours.tokenize(tf.constant(INVALID_BYTES)).to_list()
  expected = hf_ids(hf, [tokenization.decode_utf8(b)[0] for b in INVALID_BYTES])
  assert got == expected
  assert ours.id_to_token(got[2]) == ours.id_to_token(hf_ids(hf, ["abcd"])[0])


def _fuzz_texts(seed, pool, n=1500):
  rng = random.Random(seed)
  texts = []
  for _ in range(n):
    length = rng.choice([1, 2, 5, 12, 40, 120, 230])
    texts.append("".join(rng.choice(pool) for _ in range(length)))
  return texts


def _fuzz_pool(with_fixes):
  pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
  pool += list("     .,;:!?'\"()[]{}<>-_/\\@#$%^&*+=~`|\t\n\r")
  pool += list("éèêëÉÈàâäÅåçÇñÑöÖøØüÜßÆæœŒİıǅǆ") + [chr(c) for c in range(0x300, 0x370, 7)]
  pool += list("αβγδΆΈΉσςΛΩ中文字日本語漢のテキ한국") + ["\U00020000", "\U0002b820", "\uf900"]
  pool += ["😀", "👍", "\U0001f3fd", "\u200d", "\ufe0f", "❤", "\x00", "\x07", "\x1f", "\x7f",
           "\x85", "\u200b", "\ufeff", "\u2028", "\u00a0", "\u3000", "\u2003", "\ue000",
           "\u0378", "\u2e43", "\u166d", "ﬁ", "Ａ", "²", "—", "«", "¿", "\ufffd"]
  if with_fixes:
    fixes = list(tokenization._FIXES)  # pylint: disable=protected-access
    pool += ["Σ", "ΣΑΣ"] + [chr(c) for c in fixes[::6]]
  return pool


@pytest.mark.parametrize("with_fixes", [False, True], ids=["ordinary", "exotic"])
def test_random_text_matches_hf(pair, with_fixes):
  ours, hf = pair
  texts = _fuzz_texts(7 + with_fixes, _fuzz_pool(with_fixes))
  got, expected = ours.encode(texts), hf_ids(hf, texts)
  bad = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
  assert not bad, f"{len(bad)} differ, first {texts[bad[0]]!r}: {got[bad[0]]} != {expected[bad[0]]}"


@pytest.mark.slow  # ~6 s per case: guards the probed tables when tokenizers or TF change
@pytest.mark.parametrize("lower_case", [True, False], ids=["uncased", "cased"])
def test_every_code_point_splits_like_hf(lower_case):
  """Word strings, HF normalizer + pre-tokenizer vs ours, for all 1,112,064 code points."""
  norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                    strip_accents=None, lowercase=lower_case)
  pre = pre_tokenizers.BertPreTokenizer()
  cps = [cp for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF]
  fixes = set(tokenization._FIXES)  # pylint: disable=protected-access
  # Each character between two letters: "aXb aYb ...", 64 per line.
  lines = [" ".join(f"a{chr(c)}b" for c in cps[i:i + 64]) for i in range(0, len(cps), 64)]
  ordinary = [l for l, i in zip(lines, range(0, len(cps), 64))
              if not fixes.intersection(cps[i:i + 64])]
  expected = {l: [w for w, _ in pre.pre_tokenize_str(norm.normalize_str(l))] for l in lines}

  def words(batch):
    return [[w.decode("utf-8") for w in row]
            for row in tokenization.basic_tokenize(tf.constant(batch), lower_case).to_list()]

  # Both code paths: the lines without fix characters as they are (ordinary), then every line
  # behind an invalid byte, which makes it exotic (transcoding and the fixes); the U+FFFD that
  # replaces the byte is removed, as HF removes it.
  for batch_lines, prefix in ((ordinary, b""), (lines, b"\xff")):
    for start in range(0, len(batch_lines), 4096):
      batch = [prefix + l.encode("utf-8") for l in batch_lines[start:start + 4096]]
      got = words(batch)
      for line, g in zip(batch_lines[start:start + 4096], got):
        if g != expected[line]:
          diff = next((e, o) for e, o in zip(expected[line], g) if e != o)
          raise AssertionError(f"HF word {diff[0]!r} (U+{ord(diff[0][1]):04X}), ours {diff[1]!r}")


def test_final_sigma_and_case_folding_differ_from_icu(ours_by_case):
  ours = ours_by_case[True]
  # HF lower-cases per character: no final-sigma rule, no NFKC case folding ('ß' stays).
  assert ours.id_to_token(ours.encode(["ΟΔΟΣ straße ﬁ"])[0]) == ["οδοσ", "straße", "ﬁ"]


def test_word_length_limit(vocab_file, ours_by_case):
  ours = ours_by_case[True]
  ids = ours.encode(["a" * 200, "a" * 201, "ß" * 200])
  assert ids[1] == [ours.vocab.unk_id] and ids[0] != ids[1] and len(ids[0]) > 1
  assert ids[2] != [ours.vocab.unk_id]  # 200 characters but 400 bytes: still tokenized
  # max_chars_per_word=100 reproduces an out-of-the-box transformers.BertTokenizer.
  short = tokenization.WordPieceTokenizer(vocab_file, True, max_chars_per_word=100)
  default_hf = BertTokenizer(vocab=load_vocab(vocab_file), do_lower_case=True)
  texts = ["ab" * 50, "ab" * 50 + "a", WORD_150]
  assert short.encode(texts) == hf_ids(default_hf, texts)


def test_legacy_python_bert_tokenizer_agrees_on_ordinary_text(vocab_file, ours_by_case):
  """The slow Python BertTokenizer (transformers' legacy) agrees where the two HF ones agree.

  They differ on NFD input (legacy NFC-composes first), CJK Ext-E and post-Unicode-9
  punctuation, word-final 'Σ' (Python's str.lower), where the Rust one is the reference.
  """
  texts = [EDGE_TEXTS[i] for i in (0, 1, 3, 4, 5, 6, 7, 13, 14, 15, 16, 17, 18)]
  for lower in (True, False):
    legacy = BertTokenizerLegacy(vocab_file, do_lower_case=lower)
    legacy.wordpiece_tokenizer.max_input_chars_per_word = tokenization.MAX_CHARS_PER_WORD
    expected = [legacy.encode(t, add_special_tokens=False) for t in texts]
    assert ours_by_case[lower].encode(texts) == expected


def test_single_words_and_tf_data(vocab_file, ours_by_case):
  ours = ours_by_case[True]
  hf = hf_tokenizer(vocab_file, True)
  words = EDGE_TEXTS[0].split() + EDGE_TEXTS[1].split() + ["", "[MASK]", "İ"]
  assert ours.encode(words) == hf_ids(hf, words)
  dataset = tf.data.Dataset.from_tensor_slices(EDGE_TEXTS).batch(4).map(ours.tokenize)
  assert [row for batch in dataset for row in batch.to_list()] == ours.encode(EDGE_TEXTS)
  batch = next(iter(dataset))
  assert isinstance(batch, tf.RaggedTensor) and batch.dtype == tf.int32


def test_decode_utf8_counts_only_introduced_replacements():
  assert tokenization.decode_utf8(b"caf\xc3\xa9") == ("café", 0)
  assert tokenization.decode_utf8("\ufffd".encode()) == ("\ufffd", 0)  # valid U+FFFD
  text, count = tokenization.decode_utf8(b"a\xffb\xe2\x82 \xef\xbf\xbd\xed\xa0\x80")
  assert text == "a\ufffdb\ufffd \ufffd\ufffd\ufffd\ufffd" and count == 5


def test_get_tokenizer_errors(vocab_file, tmp_path):
  with pytest.raises(vocab_lib.VocabError, match="exactly one"):
    tokenization.get_tokenizer()
  with pytest.raises(vocab_lib.VocabError, match="exactly one"):
    tokenization.get_tokenizer(vocab_file, str(tmp_path / "x.model"))
  with pytest.raises(vocab_lib.VocabError, match="no such file") as e:
    tokenization.get_tokenizer(str(tmp_path / "missing.txt"))
  assert "\n" not in str(e.value)
  # Issue 49 item 7: a folder (a checkpoint's, a tokenizer's) was "no such file".
  with pytest.raises(vocab_lib.VocabError) as e:
    vocab_lib.load_wordpiece_vocab(str(tmp_path) + "/", flag="--vocab_file")
  assert str(e.value) == (f"--vocab_file={tmp_path}/: is a directory, not a vocabulary file; "
                          f"name the file in it (e.g. --vocab_file={tmp_path}/vocab.txt).")
  tok = tokenization.get_tokenizer(vocab_file, do_lower_case=False)
  assert isinstance(tok, tokenization.WordPieceTokenizer) and not tok.do_lower_case
  assert isinstance(tok, tokenization.Tokenizer)


@pytest.fixture(scope="module")
def spm_model(corpus, tmp_path_factory):
  path = str(tmp_path_factory.mktemp("spm") / "spm.model")
  build_vocab.build(corpus, 2000, path, lower_case=True, model_type="unigram")
  return path


def test_sentencepiece_ids_specials_and_round_trip(spm_model, corpus):
  tok = tokenization.get_tokenizer(spm_model_file=spm_model)
  assert isinstance(tok, tokenization.SentencePieceTokenizer) and tok.do_lower_case
  v = tok.vocab
  assert (v.pad_id, v.unk_id, v.cls_id, v.sep_id, v.mask_id) == (0, 1, 2, 3, 4)
  assert tok.id_to_token(range(5)) == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  sp = spm.SentencePieceProcessor(model_file=spm_model)
  _, lines = build_vocab.read_corpus(corpus)
  texts = lines[:300] + [t for t in EDGE_TEXTS if t.isascii()]
  assert tok.encode(texts) == [sp.encode(t) for t in texts]
  ids = tok.encode(["Hello [MASK] world [SEP]"])[0]
  assert v.mask_id in ids and v.sep_id in ids
  simple = [l for l in lines[:300]
            if l.isascii() and "  " not in l and v.unk_id not in sp.encode(l)]
  assert len(simple) > 100
  # Round trip up to the model's case folding.
  assert [sp.decode(i) for i in tok.encode(simple)] == [l.lower() for l in simple]
  got = tok.tokenize(tf.constant(INVALID_BYTES)).to_list()
  assert got == [sp.encode(tokenization.decode_utf8(b)[0]) for b in INVALID_BYTES]


def test_tokenize_cli(vocab_file):
  stdin = "\n".join(EDGE_TEXTS[:8]).encode("utf-8") + b"\n" + INVALID_BYTES[0] + b"\n"
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.tokenize", f"--vocab_file={vocab_file}",
       "--do_lower_case=false"], input=stdin, capture_output=True, cwd=ROOT, check=True)
  lines = result.stdout.decode().split("\n")
  assert lines[-1] == ""  # every output line ends with a newline
  got = [[int(i) for i in l.split()] for l in lines[:-1]]
  text, count = tokenization.decode_utf8(stdin)
  expected = hf_ids(hf_tokenizer(vocab_file, False), text.split("\n")[:-1])
  # EDGE_TEXTS[6] holds \n and \r\n: the CLI sees those as line breaks, like any line reader.
  assert len(got) == len(expected) and got == expected
  assert f"{count} invalid UTF-8" in result.stderr.decode() and count == 4


def test_char_tables_are_well_formed():
  for spec in (bert_chars.REMOVE, bert_chars.SPACE, bert_chars.CJK, bert_chars.PUNCT,
               bert_chars.MARK):
    ranges = bert_chars.parse_ranges(spec)
    assert all(a <= b for a, b in ranges)
    assert all(b1 < a2 for (_, b1), (a2, _) in zip(ranges, ranges[1:]))  # sorted, disjoint
  assert bert_chars.parse_ranges(bert_chars.complement([0, 5, 6, 0x10FFFF])) == [
      (1, 4), (7, 0x10FFFE)]
