"""The vocabulary contract every vocabulary kind shares (vocab.py and tokenizer_json.py build on
it): the special tokens, the error class, VocabInfo and reading a local or gs:// file. Its own
module so tokenizer_json.py can build on it while vocab.py dispatches to tokenizer_json.py,
without an import cycle (tests/layers_test.py); vocab.py re-exports every name.
"""

import dataclasses
import os

import numpy as np
from bert_jax_core import errors

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
  kind: str = "wordpiece"  # or "sentencepiece" or "tokenizer_json"

  @property
  def special_ids(self):
    return dict(pad=self.pad_id, unk=self.unk_id, cls=self.cls_id, sep=self.sep_id,
                mask=self.mask_id)


def _check_file(path, flag):
  if not path:
    raise VocabError(f"{flag} is empty: pass the path of a vocabulary file.")
  exists = _gfile_exists(path, flag)
  if not exists and "://" not in path and os.path.isdir(path):
    # Was "no such file" for a folder (a checkpoint's or a tokenizer's directory; issue 49 item 7).
    raise VocabError(f"{flag}={path}: is a directory, not a vocabulary file; name the file in "
                     f"it (e.g. {flag}={path.rstrip('/')}/vocab.txt).")
  if not exists:
    raise VocabError(f"{flag}={path}: no such file; build one with "
                     "`python -m data_pipelines.build_vocab` or fix the path.")


def _gfile_exists(path, flag="--vocab_file"):
  if "://" in path:
    import tensorflow as tf  # only for gs:// and other remote paths
    try:
      return tf.io.gfile.exists(path)
    except tf.errors.OpError as e:  # pragma: no cover - GCS auth errors and the like
      raise VocabError(f"{flag}={path}: cannot be read ({e.message}).") from e
  return os.path.isfile(path)


def _read_bytes(path):
  if "://" in path:
    import tensorflow as tf
    with tf.io.gfile.GFile(path, "rb") as f:
      return f.read()
  with open(path, "rb") as f:
    return f.read()
