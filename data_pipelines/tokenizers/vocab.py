"""Vocabulary files and the special-token contract shared by every pipeline.

Three kinds of vocabulary are supported:
  * WordPiece `vocab.txt` (google-research/bert format: one token per line, id = line number,
    continuation pieces start with "##").
  * SentencePiece `.model` (unigram or BPE), where a piece starting with "\u2581" starts a word.
  * Hugging Face `tokenizer.json` (byte-level BPE as ModernBERT's, or any model of the
    `tokenizers` library): tokenizer_json.py, with its special-token roles.

`VocabInfo` is the small, framework-free summary the rest of the code needs: the size, the ids of
[CLS]/[SEP]/[MASK]/[PAD]/[UNK], and for whole-word masking a boolean per id saying whether the
piece continues the previous word.
"""

import dataclasses
import json
import os
import re
import unicodedata

import numpy as np
from bert_jax_core import errors

# The shared contract lives in vocab_base.py (tokenizer_json.py builds on it); its names are ours.
from data_pipelines.tokenizers.vocab_base import (SPECIAL_TOKENS, VocabError, VocabInfo,  # noqa: F401,E402
                                       _check_file, _gfile_exists, _read_bytes)


def load_wordpiece_vocab(path, flag="--vocab_file", json_flag=None):
  """Returns the list of tokens of a BERT vocab.txt (index = id). flag: the flag that named the
  file, or None for a file found without one (a checkpoint's bundled vocab.txt): the errors then
  name the file alone, not a flag the user never passed. json_flag: the flag that reads a
  tokenizer.json instead (default: flag's with tokenizer_json for vocab_file; "" where none
  does, as in convert, which takes a family's tokenizer.json by --vocab_file itself)."""
  _check_file(path, flag or "the vocab file")
  where = f"{flag}={path}" if flag else path
  raw = _read_bytes(path)
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise VocabError(f"{where}: not UTF-8 text (byte {e.start}); a BERT vocab.txt is "
                     "UTF-8, one token per line.") from e
  _refuse_tokenizer_json(text, path, where, flag, json_flag)
  # google-research/bert's load_vocab strips each line; an empty line is still a token id.
  tokens = [t.strip() for t in text.split("\n")]
  if tokens and tokens[-1] == "":
    tokens.pop()
  if not tokens:
    raise VocabError(f"{where}: the file is empty.")
  # A token listed twice has no single id: google-research/bert's load_vocab keeps the last line,
  # tensorflow_text's lookup table refuses the file (a RuntimeError traceback from
  # create_pretraining_data, issue 23 fault 7). Refused here, for every path, naming both lines.
  first = {}
  for line, t in enumerate(tokens, start=1):
    if first.setdefault(t, line) != line:
      raise VocabError(f"{where}: token {t!r} is listed twice (lines {first[t]} and {line}); "
                       "each token needs one id: remove one of the lines (or rebuild the vocab "
                       "with python -m data_pipelines.build_vocab).")
  return tokens


def _refuse_tokenizer_json(text, path, where, flag, json_flag):
  """A Hugging Face tokenizer.json passed where a vocab.txt goes: its JSON lines are no tokens
  (the checks below would report a line listed twice or [PAD] missing, which the file has);
  point at the flag that reads it (--vocab_file -> --tokenizer_json, --config.vocab_file ->
  --config.tokenizer_json)."""
  if not text.lstrip().startswith("{"):   # a vocab.txt starts with a token ([PAD])
    return
  try:
    spec = json.loads(text)
  except json.JSONDecodeError:
    return
  if isinstance(spec, dict) and isinstance(spec.get("model"), dict):
    if json_flag is None:
      json_flag = (flag[:-len("vocab_file")] + "tokenizer_json"
                   if flag and flag.endswith("vocab_file") else "--tokenizer_json")
    fix = (f"pass it as {json_flag}={path}" if json_flag else
           "this needs the WordPiece vocab.txt that belongs to the checkpoint")
    raise VocabError(f"{where}: a Hugging Face tokenizer.json, not a WordPiece vocab.txt; "
                     f"{fix}.")


def wordpiece_info(path, flag="--vocab_file"):
  tokens = load_wordpiece_vocab(path, flag)
  index = {t: i for i, t in enumerate(tokens)}   # tokens are unique (load_wordpiece_vocab)
  missing = [t for t in SPECIAL_TOKENS if t not in index]
  if missing:
    raise VocabError(f"{f'{flag}={path}' if flag else path}: missing special token(s) "
                     f"{', '.join(missing)}; a BERT "
                     "vocab needs [PAD] [UNK] [CLS] [SEP] [MASK] (build_vocab reserves them).")
  is_cont = np.array([t.startswith("##") and len(t) > 2 for t in tokens], dtype=bool)
  is_special = np.array([t.startswith("[") and t.endswith("]") and len(t) > 2 for t in tokens],
                        dtype=bool)
  return VocabInfo(size=len(tokens), pad_id=index["[PAD]"], unk_id=index["[UNK]"],
                   cls_id=index["[CLS]"], sep_id=index["[SEP]"], mask_id=index["[MASK]"],
                   is_continuation=is_cont, is_special=is_special, path=path, kind="wordpiece")


def sentencepiece_info(path, flag="--spm_model_file"):
  """VocabInfo of a SentencePiece model; [CLS]/[SEP]/[MASK] must be user-defined symbols."""
  import sentencepiece as spm
  _check_file(path, flag)
  sp = spm.SentencePieceProcessor()
  try:
    sp.LoadFromSerializedProto(_read_bytes(path))
  except RuntimeError as e:  # sentencepiece's C++ parse error
    raise VocabError(f"{flag}={path}: not a SentencePiece model ({e}).") from e
  pieces = [sp.IdToPiece(i) for i in range(sp.GetPieceSize())]
  index = {p: i for i, p in enumerate(pieces)}
  ids = {}
  # SentencePiece's own <pad>/<unk> are accepted for [PAD]/[UNK].
  for name, alts in (("[PAD]", ("[PAD]", "<pad>")), ("[UNK]", ("[UNK]", "<unk>")),
                     ("[CLS]", ("[CLS]",)), ("[SEP]", ("[SEP]",)), ("[MASK]", ("[MASK]",))):
    found = [index[a] for a in alts if a in index]
    if not found:
      raise VocabError(f"{flag}={path}: missing special piece {name}; train it with "
                       "`python -m data_pipelines.build_vocab --model_type=unigram` which adds "
                       "[CLS] [SEP] [MASK] [PAD] as user-defined symbols.")
    ids[name] = found[0]
  is_cont = np.array([not p.startswith("\u2581") and not (sp.IsControl(i) or sp.IsUnknown(i))
                      and not (p.startswith("[") and p.endswith("]"))
                      for i, p in enumerate(pieces)], dtype=bool)
  is_special = np.array([sp.IsControl(i) or sp.IsUnknown(i) or
                         (p.startswith("[") and p.endswith("]") and len(p) > 2) or
                         p in ("<pad>", "<s>", "</s>")
                         for i, p in enumerate(pieces)], dtype=bool)
  return VocabInfo(size=len(pieces), pad_id=ids["[PAD]"], unk_id=ids["[UNK]"],
                   cls_id=ids["[CLS]"], sep_id=ids["[SEP]"], mask_id=ids["[MASK]"],
                   is_continuation=is_cont, is_special=is_special, path=path,
                   kind="sentencepiece")


ONE_OF = ("pass exactly one of --vocab_file (WordPiece vocab.txt), --spm_model_file "
          "(SentencePiece .model) or --tokenizer_json (Hugging Face tokenizer.json).")


def load_vocab_info(vocab_file=None, spm_model_file=None, tokenizer_json=None, prefix="--"):
  """Exactly one of the three paths must be given. prefix: how the caller's flags are spelt,
  "--" (--vocab_file) or "--config." (train's --config.vocab_file), for the errors."""
  if sum(map(bool, (vocab_file, spm_model_file, tokenizer_json))) != 1:
    raise VocabError(ONE_OF)
  if vocab_file:
    return wordpiece_info(vocab_file, f"{prefix}vocab_file")
  if tokenizer_json:
    from data_pipelines.tokenizers import tokenizer_json as tj  # pylint: disable=g-import-not-at-top
    return tj.info(tokenizer_json, f"{prefix}tokenizer_json")
  return sentencepiece_info(spm_model_file, f"{prefix}spm_model_file")


# ----------------------------------------------------------------------------------------------
# Tokenizer settings: the one source of truth for casing and pre-tokenization.
#
# build_vocab writes `<vocab>.meta.json` beside the vocab.txt or .model it learns; every CLI reads
# the casing from there (a contradicting flag is a one-line error), records copy the fields into
# dataset_info.json and checkpoints into their metadata. Fields (names shared with
# dataset_info.json and checkpoint metadata):
#   vocab_kind      "wordpiece" | "sentencepiece" | "tokenizer_json"
#   do_lower_case   bool (SentencePiece: whether the model's normalizer case-folds)
#   normalization   "bert_uncased" (NFD, marks stripped, lower-cased) | "bert_cased" | the
#                   SentencePiece normalizer rule ("nmt_nfkc", "nmt_nfkc_cf", ...)
#   pretokenizer    "none" | "mecab" | "jieba" (data_pipelines/tokenizers/pretokenize.py), applied to text
#                   before the tokenizer by every pipeline that reads the vocab
#   casing_reason   why build_vocab chose the casing (flag, or the corpus' script mix)
#   scripts         letter shares of the corpus sample: {"latin": 0.02, "hangul": 0.97, ...}
#   sample          {"input_sentence_size": N or 0 (= all), "seed": S, "sentences_seen": M,
#                    "sentences_used": K}
#   sentencepiece   {"model_type", "character_coverage", "byte_fallback"} (SentencePiece only)
#   tokenizer_json  {"model_type": "bpe" | "unigram", "alphabet": "bytes" | "characters",
#                    "alphabet_reason", "byte_fallback"} (tokenizer.json only; its normalization
#                   is "nfc" or "nfc_lowercase"; files learned before 2026-11-26: "none",
#                   "lowercase", "nfkc" or "nfkc_lowercase")
#   hangul_coverage "ksx1001" (the 2,350 KS X 1001 syllables reserved as 가 and ##가) | "none",
#                   with hangul_coverage_reason; absent from files written before it existed
# ----------------------------------------------------------------------------------------------

META_SUFFIX = ".meta.json"
PRETOKENIZERS = ("none", "mecab", "jieba")


class CasingMismatchError(VocabError):
  """A casing (or pre-tokenizer) flag contradicts what the vocabulary records."""


def meta_path(vocab_path):
  return vocab_path + META_SUFFIX


def write_settings(vocab_path, settings):
  """Writes `<vocab_path>.meta.json` (atomically: tmp file, then rename)."""
  path = meta_path(vocab_path)
  data = (json.dumps(settings, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode()
  if "://" in path:
    import tensorflow as tf
    with tf.io.gfile.GFile(path + ".tmp", "wb") as f:
      f.write(data)
    tf.io.gfile.rename(path + ".tmp", path, overwrite=True)
    return path
  with open(path + ".tmp", "wb") as f:
    f.write(data)
  os.replace(path + ".tmp", path)
  return path


def read_settings(vocab_path):
  """The settings dict written by build_vocab, or None (google / HF vocabularies have none)."""
  if not vocab_path:
    return None
  path = meta_path(vocab_path)
  if not _gfile_exists(path):
    return None
  try:
    settings = json.loads(_read_bytes(path).decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise VocabError(f"{path}: not valid JSON ({e}); rebuild the vocab with build_vocab or "
                     "delete the file to fall back to inferring the casing.") from e
  if not isinstance(settings, dict) or not isinstance(settings.get("do_lower_case"), bool):
    raise VocabError(f"{path}: no boolean do_lower_case; rebuild the vocab with build_vocab.")
  return settings


def _survives_uncased(ch):
  """Whether BERT's uncased normalization (NFD, drop Mn, lower) leaves the character as is."""
  if ch.isascii():
    return not ch.isupper()
  out = "".join(c for c in unicodedata.normalize("NFD", ch)
                if unicodedata.category(c) != "Mn").lower()
  return out == ch


def infer_wordpiece_casing(tokens, path=""):
  """(do_lower_case or None, reason) for a vocab.txt without metadata (google's, HF's).

  An uncased vocab is learned from lower-cased NFD text, so every character of every token is a
  fixed point of that normalization (bert-base-uncased: no upper-case piece in 30,522). A token
  holding a character that lower-casing would change is unreachable in an uncased pipeline:
  upper-case letters (bert-base-cased: ~11,000 of 28,996), accented letters, whole Hangul
  syllables (NFD splits them into jamo) and voiced kana (NFD + mark stripping turns が into か).
  CJK ideographs and jamo survive lower-casing, so a Chinese vocab without upper-case pieces
  stays uncased, as google's chinese_L-12_H-768_A-12 is.
  """
  m = _GOOGLE_NAME.search(os.path.abspath(path)) if path else None
  if m:  # google's released names: uncased/multilingual/chinese lower-case; cased/multi_cased not
    return m.group(1) != "cased", f"google model name {m.group(0).strip('/_')!r}"
  words = [t[2:] if t.startswith("##") else t for t in tokens
           if not (t.startswith("[") and t.endswith("]"))]
  changed = [w for w in words if not all(_survives_uncased(c) for c in w)]
  hangul = sum(any("\uac00" <= c <= "\ud7a3" for c in w) for w in changed)
  if not changed:
    return True, "every vocab token survives lower-casing (uncased vocab)"
  if len(changed) > 0.01 * len(words) or hangul:
    what = f"{hangul} whole Hangul syllable token(s)" if hangul else \
        f"{len(changed)} upper-case or accented token(s)"
    return False, f"vocab holds {what} that lower-casing would make unreachable"
  return None, f"undetermined ({len(changed)} of {len(words)} tokens change when lower-cased)"


_GOOGLE_NAME = re.compile(r"(?:^|[/_])(uncased|cased|multilingual|chinese)_L-\d+_H-\d+_A-\d+")


def sentencepiece_lower_case(path):
  """(whether a SentencePiece model case-folds, how that was seen).

  Asks the model's own normalizer (build_vocab --lower_case trains with `nmt_nfkc_cf`) rather
  than parsing the proto: sentencepiece_model_pb2 needs a protobuf runtime as new as its gencode.
  """
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  sp = spm.SentencePieceProcessor(model_proto=_read_bytes(path))
  folds = sp.Normalize("ABCXYZ") == sp.Normalize("abcxyz")
  return folds, "its normalizer case-folds" if folds else "its normalizer keeps case"


def resolve_settings(vocab_file=None, spm_model_file=None, do_lower_case=None,
                     pretokenizer=None, flag="--do_lower_case", recorded=None,
                     tokenizer_json=None):
  """The tokenizer settings to use: the vocab's own, checked against the flags.

  do_lower_case / pretokenizer: None = take the vocab's. `recorded` = (settings dict, where)
  from records or a checkpoint, checked too. A contradiction is a CasingMismatchError naming both
  sides. Returns a dict with vocab_kind, do_lower_case, pretokenizer and casing_source.
  """
  path = vocab_file or spm_model_file or tokenizer_json
  settings = read_settings(path)
  if settings is not None:
    value, source = settings["do_lower_case"], meta_path(path)
  elif tokenizer_json:  # an HF tokenizer.json: ask its normalizer
    from data_pipelines.tokenizers import tokenizer_json as tj  # pylint: disable=g-import-not-at-top
    value, how = tj.lower_case(tokenizer_json)
    source = f"{tokenizer_json} ({how})"
  elif spm_model_file:
    _check_file(spm_model_file, "--spm_model_file")
    value, how = sentencepiece_lower_case(spm_model_file)
    source = f"{spm_model_file} ({how})"
  else:
    value, how = infer_wordpiece_casing(load_wordpiece_vocab(vocab_file), vocab_file)
    source = f"{vocab_file}: {how}"
  if recorded is not None and recorded[0] and recorded[0].get("do_lower_case") is not None:
    rec, where = recorded
    if value is not None and bool(rec["do_lower_case"]) != value:
      raise CasingMismatchError(
          f"{where} says do_lower_case={bool(rec['do_lower_case'])} but {source} says "
          f"do_lower_case={value}; use the vocab the model was trained with.")
    source = where if value is None else f"{where}, and {source}"
    value = bool(rec["do_lower_case"])
  if do_lower_case is not None and value is not None and bool(do_lower_case) != value:
    subject = source.split(": ")[0]
    detail = f" ({source})" if source != subject else ""
    raise CasingMismatchError(f"{flag}={bool(do_lower_case)} but {subject} is "
                              f"{'uncased' if value else 'cased'}{detail}; drop {flag} or "
                              f"pass {flag}={value}.")
  if value is None:
    if do_lower_case is None:
      # No default here: guessing uncased for a cased vocab turns its upper-case words into
      # [UNK] (a 65% [UNK] rate for a cased Korean vocab in issue 14's experiment).
      raise CasingMismatchError(f"cannot tell whether {source.split(': ')[0]} is cased "
                                f"({source.split(': ', 1)[-1]}); pass {flag}=true or {flag}=false.")
    value, source = bool(do_lower_case), flag
  recorded_pre = (settings or {}).get("pretokenizer", "none")
  if recorded is not None and recorded[0] and recorded[0].get("pretokenizer") not in (
      None, recorded_pre):
    raise CasingMismatchError(f"{recorded[1]} says pretokenizer={recorded[0]['pretokenizer']} "
                              f"but {meta_path(path)} says pretokenizer={recorded_pre}.")
  if pretokenizer not in (None, recorded_pre):
    raise CasingMismatchError(f"--pretokenizer={pretokenizer} contradicts "
                              f"{meta_path(path) if settings else path} "
                              f"(pretokenizer={recorded_pre}); drop --pretokenizer or rebuild "
                              "the vocab with it.")
  kind = "wordpiece" if vocab_file else "sentencepiece" if spm_model_file else "tokenizer_json"
  return {"vocab_kind": kind,
          "do_lower_case": bool(value), "pretokenizer": recorded_pre, "casing_source": source}
