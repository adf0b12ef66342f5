"""Vocabulary files and the special-token contract shared by every pipeline.

Two kinds of vocabulary are supported:
  * WordPiece `vocab.txt` (google-research/bert format: one token per line, id = line number,
    continuation pieces start with "##").
  * SentencePiece `.model` (unigram or BPE), where a piece starting with "\u2581" starts a word.

`VocabInfo` is the small, framework-free summary the rest of the code needs: the size, the ids of
[CLS]/[SEP]/[MASK]/[PAD]/[UNK], and for whole-word masking a boolean per id saying whether the
piece continues the previous word.
"""

import dataclasses
import os

import numpy as np
from bert_jax import errors

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class VocabError(errors.UserError):
  """A vocabulary file is missing, unreadable or lacks a required special token."""


@dataclasses.dataclass(frozen=True)
class VocabInfo:
  size: int
  pad_id: int
  unk_id: int
  cls_id: int
  sep_id: int
  mask_id: int
  # [size] bool: True where the piece continues a word ("##ing" in WordPiece, a piece without
  # the leading "\u2581" in SentencePiece). Used by whole-word masking.
  is_continuation: np.ndarray
  # [size] bool: True for tokens that masking must never select or insert ([CLS], [SEP], [PAD],
  # [MASK], [UNK] and any other "[...]" control token such as [unused0]).
  is_special: np.ndarray
  path: str = ""
  kind: str = "wordpiece"  # or "sentencepiece"

  @property
  def special_ids(self):
    return dict(pad=self.pad_id, unk=self.unk_id, cls=self.cls_id, sep=self.sep_id,
                mask=self.mask_id)


def _check_file(path, flag):
  if not path:
    raise VocabError(f"{flag} is empty: pass the path of a vocabulary file.")
  try:
    exists = _gfile_exists(path)
  except Exception as e:  # pragma: no cover - GCS auth errors and the like
    raise VocabError(f"{flag}={path}: cannot be read ({e}).") from e
  if not exists:
    raise VocabError(f"{flag}={path}: no such file; build one with "
                     "`python -m data_pipelines.build_vocab` or fix the path.")


def _gfile_exists(path):
  if "://" in path:
    import tensorflow as tf  # only for gs:// and other remote paths
    return tf.io.gfile.exists(path)
  return os.path.isfile(path)


def _read_bytes(path):
  if "://" in path:
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()


def load_wordpiece_vocab(path, flag="--vocab_file"):
  """Returns the list of tokens of a BERT vocab.txt (index = id)."""
  _check_file(path, flag)
  raw = _read_bytes(path)
  try:
    text = raw.decode("utf-8")
  except UnicodeDecodeError as e:
    raise VocabError(f"{flag}={path}: not UTF-8 text (byte {e.start}); a BERT vocab.txt is "
                     "UTF-8, one token per line.") from e
  # google-research/bert's load_vocab strips each line; an empty line is still a token id.
  tokens = [t.strip() for t in text.split("\n")]
  if tokens and tokens[-1] == "":
    tokens.pop()
  if not tokens:
    raise VocabError(f"{flag}={path}: the file is empty.")
  return tokens


def wordpiece_info(path, flag="--vocab_file"):
  tokens = load_wordpiece_vocab(path, flag)
  # A token listed twice maps to its last line, as google-research/bert's load_vocab and HF do.
  index = {t: i for i, t in enumerate(tokens)}
  missing = [t for t in SPECIAL_TOKENS if t not in index]
  if missing:
    raise VocabError(f"{flag}={path}: missing special token(s) {', '.join(missing)}; a BERT "
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
  except Exception as e:
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


def load_vocab_info(vocab_file=None, spm_model_file=None):
  """Exactly one of the two paths must be given."""
  if bool(vocab_file) == bool(spm_model_file):
    raise VocabError("pass exactly one of --vocab_file (WordPiece vocab.txt) or "
                     "--spm_model_file (SentencePiece .model).")
  if vocab_file:
    return wordpiece_info(vocab_file)
  return sentencepiece_info(spm_model_file)
