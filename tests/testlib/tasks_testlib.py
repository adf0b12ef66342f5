"""Test helpers for the fine-tuning task tests: a tiny WordPiece vocab and a reference tokenizer.

The tokenizer is HF `tokenizers`' BERT pipeline (BertNormalizer + BertPreTokenizer + WordPiece),
the same behaviour as google-research/bert's FullTokenizer, behind the interface of
`data_pipelines.tokenizers.tokenization.get_tokenizer`: encode(list[str]) -> list[list[int]],
id_to_token(ids) -> list[str], and .vocab (VocabInfo).
"""
import os

from data_pipelines.tokenizers import vocab as vocab_lib

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_vocab(directory, text, extra=()):
  """A vocab.txt holding every lower-cased word and punctuation of `text`, plus letters and
  '##'-letters so that unseen words still split into pieces instead of becoming [UNK]."""
  import string
  words = set()
  for w in text.lower().replace("\n", " ").split():
    piece = ""
    for ch in w:
      if ch in string.punctuation:
        if piece:
          words.add(piece)
        words.add(ch)
        piece = ""
      else:
        piece += ch
    if piece:
      words.add(piece)
  letters = list(string.ascii_lowercase + string.digits)
  tokens = SPECIAL + sorted(words | set(extra)) + [c for c in letters if c not in words]
  tokens += ["##" + c for c in letters] + [p for p in string.punctuation if p not in words]
  path = os.path.join(directory, "vocab.txt")
  with open(path, "w", encoding="utf-8") as f:
    f.write("\n".join(tokens) + "\n")
  return path


class ReferenceTokenizer:
  """google-research/bert FullTokenizer behaviour via HF `tokenizers`."""

  def __init__(self, vocab_file, do_lower_case=True):
    import tokenizers
    from tokenizers import models, normalizers, pre_tokenizers
    tokens = vocab_lib.load_wordpiece_vocab(vocab_file)
    self._tokens = tokens
    index = {}
    for i, t in enumerate(tokens):
      index.setdefault(t, i)
    tok = tokenizers.Tokenizer(models.WordPiece(index, unk_token="[UNK]",
                                                max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=None, lowercase=do_lower_case)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    self._tok = tok
    self.vocab = vocab_lib.wordpiece_info(vocab_file)
    self.do_lower_case = do_lower_case

  def encode(self, texts):
    return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

  def id_to_token(self, ids):
    return [self._tokens[i] for i in ids]

  def token_texts(self, ids):   # WordPiece pieces are text already
    return self.id_to_token(ids)
