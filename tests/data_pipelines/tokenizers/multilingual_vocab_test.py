"""Vocabularies for many languages (issue 42 item 3): a Gemma-style tokenizer.json read with ids
equal to transformers' on English, Korean, German and French, and build_vocab over named corpora
drawn in shares ~ lines^tau (vocab_mixture)."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess
import sys

import pytest

from data_pipelines import build_vocab
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab_mixture
from data_pipelines.tokenizers import tokenizer_json as tj
from data_pipelines.tokenizers import vocab as vocab_lib

ROOT = tests.ROOT
DATA = os.path.join(ROOT, "tests", "data")
GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]  # Gemma's ids 0..4
# Beside the corpora: unseen characters (byte fallback), runs of spaces, a tab, literal specials.
HARD = ["뷁 햏 👩‍👩‍👧 ① ﬁ", "a  b\tc   ", "<mask> x <bos>", "", " leading", "Größe: 10 €"]


def _lines(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return [l.strip() for l in f if l.strip()]


def _gemma_like(directory, lines, vocab_size=3000, config=None):
  """A tokenizer.json laid out as Gemma's (what transformers' GemmaConverter / GemmaTokenizer
  write): a BPE with byte_fallback and <0x00>..<0xFF> pieces, the normalizer Replace(" ", "▁")
  and no prefix "▁", the pre-tokenizer Split(" ", merged_with_previous), the decoder Replace ->
  ByteFallback -> Fuse, specials <pad> <eos> <bos> <unk> <mask> at 0..4. Learned here with a
  Metaspace pre-tokenizer (so no piece spans two words, as SentencePiece's split_by_whitespace),
  then given Gemma's pipeline. config: a tokenizer_config.json to write beside it."""
  from tokenizers import AddedToken, Tokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
  tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=tj.META_SPACE, prepend_scheme="never")
  trainer = trainers.BpeTrainer(vocab_size=vocab_size - 256, show_progress=False,
                                special_tokens=[AddedToken(t, special=True)
                                                for t in GEMMA_SPECIALS])
  tok.train_from_iterator(lines, trainer)
  spec = json.loads(tok.to_str())
  vocab = spec["model"]["vocab"]
  start = max(vocab.values()) + 1
  vocab.update({p: start + b for b, p in enumerate(tj.BYTE_PIECES)})
  spec["model"]["byte_fallback"] = True
  spec["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": tj.META_SPACE}
  spec["pre_tokenizer"] = {"type": "Split", "pattern": {"String": " "},
                           "behavior": "MergedWithPrevious", "invert": False}
  tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
  tok.decoder = decoders.Sequence([decoders.Replace(tj.META_SPACE, " "), decoders.ByteFallback(),
                                   decoders.Fuse()])
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  if config is not None:
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
      json.dump(config, f)
  return path


def test_gemma_style_file_reads_with_its_specials_and_word_marks(tmp_path):
  ko, de = _lines("korean", "1809890.txt"), _lines("german", "dpkg_man.txt")[:300]
  path = _gemma_like(str(tmp_path / "g"), ko + de, vocab_size=1500)
  # Before: "no special token [CLS] or <s>, [SEP] or </s>" (Gemma's are <bos>/<eos>), and every
  # piece its own word for whole-word masking (the "▁" comes from the normalizer, not Metaspace).
  info = vocab_lib.load_vocab_info(tokenizer_json=path)
  assert (info.pad_id, info.sep_id, info.cls_id, info.unk_id, info.mask_id) == (0, 1, 2, 3, 4)
  assert info.size == 1500 and info.is_special[:5].all() and not info.is_special[5:].any()
  tok = tokenization.get_tokenizer(tokenizer_json=path)
  text = "Die Datei wird gelesen. 대한민국 국회"
  ids = tok.encode([text])[0]
  pieces = tok.id_to_token(ids)
  assert pieces[0] == "Die" and "<0xEB>" in pieces  # no prefix "▁" (Gemma's); 민 unseen: bytes
  starts = [not info.is_continuation[i] for i in ids]
  assert starts == [p.startswith(tj.META_SPACE) for p in pieces]
  assert sum(starts) == len(text.split()) - 1  # every word but the first (no "▁" there)
  # The file's own tokenizers pipeline gives the same ids (transformers': the slow test).
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  raw = Tokenizer.from_file(path)
  texts = _lines("korean", "constitution.txt")[:50] + HARD
  assert tok.encode(texts) == [e.ids for e in raw.encode_batch(texts, add_special_tokens=False)]
  assert tok.encode(["뷁"])[0] == [raw.token_to_id(p) for p in ("<0xEB>", "<0xB7>", "<0x81>")]
  assert raw.decode(ids) == text  # lossless: the bytes of 민 join back


def test_gemma_style_roles_from_tokenizer_config(tmp_path):
  """An HF folder's tokenizer_config.json names the roles (cls_token <bos>, sep_token <eos>);
  one naming a token the file does not hold as special is refused in one line."""
  lines = _lines("korean", "1809890.txt")
  config = {"cls_token": "<bos>", "sep_token": "<eos>", "pad_token": "<pad>",
            "unk_token": "<unk>", "mask_token": "<mask>"}
  path = _gemma_like(str(tmp_path / "g"), lines, vocab_size=1200, config=config)
  info = vocab_lib.load_vocab_info(tokenizer_json=path)
  assert (info.cls_id, info.sep_id, info.mask_id) == (2, 1, 4)
  bad = _gemma_like(str(tmp_path / "bad"), lines, vocab_size=1200,
                    config={**config, "cls_token": "<s>"})
  with pytest.raises(vocab_lib.VocabError, match="names cls_token '<s>'") as e:
    vocab_lib.load_vocab_info(tokenizer_json=bad)
  assert "\n" not in str(e.value)


def test_draw_shares_repeats_and_determinism():
  big = [f"big {i}" for i in range(1000)]
  small = [f"small {i}" for i in range(10)]
  lines, stats = vocab_mixture.draw({"big": big, "small": small}, tau=1.0)
  assert sorted(lines) == sorted(big + small)  # tau 1 over every line: the plain pool
  assert stats["small"] == {"lines": 10, "share": round(10 / 1010, 6), "drawn": 10,
                            "times_seen": 1.0}
  lines, stats = vocab_mixture.draw({"big": big, "small": small}, tau=0.3)
  share = 10 ** 0.3 / (10 ** 0.3 + 1000 ** 0.3)   # 1.995 / (1.995 + 7.943) = 0.2008
  assert stats["small"]["drawn"] == round(share * 1010) == 203
  assert sum(l.startswith("small") for l in lines) == 203
  assert sum(l.startswith("big") for l in lines) == 1010 - 203 == stats["big"]["drawn"]
  assert len(set(l for l in lines if l.startswith("big"))) == 807  # thinned, no repeats
  counts = [lines.count(s) for s in small]
  assert sorted(counts) == [20] * 7 + [21] * 3   # 20 copies each + 3 drawn once more
  assert vocab_mixture.draw({"big": big, "small": small}, tau=0.3)[0] == lines
  assert vocab_mixture.draw({"big": big, "small": small}, tau=0.3, seed=1)[0] != lines
  # Another source changes no other source's choice of lines (only how many it gives).
  more, _ = vocab_mixture.draw({"big": big, "small": small, "c": ["c"] * 10}, tau=1.0)
  assert [l for l in more if l.startswith("small")] == small
  assert len(vocab_mixture.draw({"big": big, "small": small}, 0.5, total=100)[0]) == 100


def test_build_vocab_mixture_errors_are_one_line(tmp_path):
  (tmp_path / "blank.txt").write_text("\n  \n")
  ko = f"{DATA}/korean/1809890.txt"
  out = str(tmp_path / "t.json")

  def error(match, input_file="", **kw):
    with pytest.raises(build_vocab.BuildVocabError, match=match) as e:
      build_vocab.build(input_file, 3000, out, model_type="bpe", **kw)
    assert "\n" not in str(e.value)
  for tau in (0.0, -0.3, 1.5):
    error(r"^--source_tau=.*: expected 0 < tau <= 1", input_sources=f"ko={ko}", source_tau=tau)
  error("^--input_sources: source 'ko': its 1 file\\(s\\) hold no text",
        input_sources=f"de={DATA}/german/dpkg_man.txt;ko={tmp_path}/blank.txt",
        source_tau=0.5)
  error(r"^--input_sources: source 'de' \(.*nothing\*\): no file matches",
        input_sources=f"ko={ko};de={tmp_path}/nothing*")
  error("^--input_sources: 'ko' is not NAME=GLOB", input_sources="ko")
  error("^--input_sources: source 'ko' is named twice", input_sources=f"ko={ko};ko={ko}")
  error("^pass --input_file .* or --input_sources .*not both", input_file=ko,
        input_sources=f"ko={ko}")
  error("^--source_tau=0.3 without --input_sources", input_file=ko, source_tau=0.3)
  assert not os.path.exists(out)


def test_build_vocab_records_the_mixture(tmp_path):
  ko, de = f"{DATA}/korean/1809890.txt", f"{DATA}/german/dpkg_man.txt"
  out = str(tmp_path / "t.json")
  _, files, meta = build_vocab.build("", 2000, out, model_type="bpe",
                                     input_sources=f"ko={ko};de={de}", source_tau=0.5)
  mix = meta["mixture"]
  assert files == 2 and mix["tau"] == 0.5 and list(mix["sources"]) == ["ko", "de"]
  n_ko, n_de = len(_lines("korean", "1809890.txt")), len(_lines("german", "dpkg_man.txt"))
  assert (mix["sources"]["ko"]["lines"], mix["sources"]["de"]["lines"]) == (n_ko, n_de)
  share = n_ko ** 0.5 / (n_ko ** 0.5 + n_de ** 0.5)
  assert mix["sources"]["ko"]["drawn"] == round(share * (n_ko + n_de))
  assert meta["sample"]["sentences_used"] == sum(s["drawn"] for s in mix["sources"].values())
  assert vocab_lib.read_settings(out)["mixture"] == mix
  # tau 1 draws every line once, in the order given: the same file as --input_file over both.
  pooled, mixed = str(tmp_path / "pool.json"), str(tmp_path / "tau1.json")
  build_vocab.build(f"{ko},{de}", 2000, pooled, model_type="bpe")
  build_vocab.build("", 2000, mixed, model_type="bpe", input_sources=f"ko={ko};de={de}")
  with open(pooled, "rb") as a, open(mixed, "rb") as b:
    assert a.read() == b.read()


@pytest.mark.slow
def test_gemma_style_ids_equal_transformers_on_four_languages(tmp_path):
  """English (the stdlib's docstrings), Korean (konlpy), German and French (dpkg's manual
  pages): our ids == PreTrainedTokenizerFast's over the file == transformers' GemmaTokenizer's
  (which rebuilds Gemma's pipeline around the file's vocab and merges)."""
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  from transformers.models.gemma import tokenization_gemma  # pylint: disable=g-import-not-at-top
  from benchmarks import vocab_tau  # pylint: disable=g-import-not-at-top
  langs = vocab_tau.corpora(str(tmp_path / "c"), max_modules=120)
  train = [l for glob, _ in langs.values() for p in glob.split(",") for l in _lines(p)]
  path = _gemma_like(str(tmp_path / "g"), train, vocab_size=6000)
  ours = tokenization.get_tokenizer(tokenizer_json=path)
  hf = PreTrainedTokenizerFast(tokenizer_file=path)
  gemma = tokenization_gemma.GemmaTokenizer.from_pretrained(str(tmp_path / "g"))
  for lang, (_, held) in langs.items():
    texts = held + HARD
    ids = ours.encode(texts)
    assert hf(texts, add_special_tokens=False)["input_ids"] == ids, lang
    assert gemma(texts, add_special_tokens=False)["input_ids"] == ids, lang
    assert sum(map(len, ids)) > 2000, lang  # real text, not a handful of lines
    assert gemma.decode(ids[0]) == held[0], lang   # lossless: byte fallback, no prefix space
  assert gemma.mask_token_id == 4 and gemma.bos_token_id == 2


@pytest.mark.slow
def test_tau_gives_the_small_language_its_own_pieces(tmp_path):
  """Over English, German, French and Korean (the smallest), a vocabulary learned at tau 0.3
  cuts held-out Korean into fewer pieces per word than one learned in proportion to size, and
  English (the largest) into more. The figures at full size are in docs/non_english.md."""
  from benchmarks import vocab_tau  # pylint: disable=g-import-not-at-top
  langs = vocab_tau.corpora(str(tmp_path / "c"), max_modules=120)
  table = vocab_tau.compare(str(tmp_path), langs, 0.3, 4000)
  assert table["ko"]["share@0.3"] > 1.5 * table["ko"]["share@1"]
  assert table["ko"]["ppw@0.3"] < 0.97 * table["ko"]["ppw@1"], table
  assert table["en"]["ppw@0.3"] > table["en"]["ppw@1"], table


@pytest.mark.slow
def test_build_vocab_cli_bad_tau_exits_2(tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.build_vocab",
       f"--input_sources=ko={DATA}/korean/*.txt", "--source_tau=1.5", "--model_type=bpe",
       f"--output={tmp_path}/t.json"], capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      "error: --source_tau=1.5: expected 0 < tau <= 1 (shares ~ lines^tau: 1 proportional to "
      "size, XLM-R 0.3, mBERT 0.7)."]
  assert not os.path.exists(tmp_path / "t.json")


@pytest.mark.slow
def test_records_from_a_gemma_style_file(tmp_path):
  """create_pretraining_data with a Gemma-style file: <bos> opens each row as [CLS], <eos> closes
  each segment as [SEP], both recorded as the file's special ids."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  from data_pipelines import create_pretraining_data as cpd  # pylint: disable=g-import-not-at-top
  from data_pipelines.records import dataset_info  # pylint: disable=g-import-not-at-top
  de = _lines("german", "dpkg_man.txt")
  path = _gemma_like(str(tmp_path / "g"), de + _lines("korean", "1809890.txt"))
  (tmp_path / "de.txt").write_text("\n".join(de[:400]) + "\n", encoding="utf-8")
  cfg = cpd.Config(input_file=str(tmp_path / "de.txt"), output_dir=str(tmp_path / "rec"),
                   tokenizer_json=path, max_seq_length=64, dupe_factor=1, num_shards=1,
                   nsp_sampling="block", document_pool_size=100)
  assert cpd.run(cfg, show_progress=False)["instances"] > 100
  assert dataset_info.read(str(tmp_path / "rec"))["special_ids"] == dict(
      pad=0, unk=3, cls=2, sep=1, mask=4)
  shard = str(tmp_path / "rec" / cpd.shard_name(0, 1))
  for raw in tf.data.TFRecordDataset(shard).take(20):
    ids = list(tf.train.Example.FromString(raw.numpy()).features.feature["input_ids"]
               .int64_list.value)
    n = ids.index(0) if 0 in ids else len(ids)
    assert ids[0] == 2 and ids[n - 1] == 1 and ids[:n].count(1) == 2, ids
