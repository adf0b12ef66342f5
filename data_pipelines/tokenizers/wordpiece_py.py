"""WordPiece in plain Python, for a few sentences at a time without importing TensorFlow.

`data_pipelines.tokenizers.tokenization.WordPieceTokenizer` (TF, in-graph) is THE tokenizer: it runs inside
tf.data for training and for every batch job. Importing TensorFlow costs a command-line program
seconds before its first word (benchmarks/startup.py), which is most of a one-sentence
`bert_jax.predict`. This module gives the same ids from the same character tables
(data_pipelines/tokenizers/bert_chars.py, probed from the HF reference) with Python's str and unicodedata,
for WordPiece vocabs without a pre-tokenizer; tests/data_pipelines/tokenizers/wordpiece_py_test.py checks it against the TF
tokenizer on every code point and on real text, cased and uncased.

Steps (as tokenization.py's docstring): literal special tokens kept whole; clean (REMOVE chars
dropped, SPACE chars -> " "); CJK ideographs surrounded by spaces; uncased only: the FIXES
characters mapped directly, every other character NFD-decomposed, MARK chars dropped, and
lower-cased one character at a time (the reference has no final-sigma rule); split on spaces and
around each PUNCT character; words over max_chars_per_word characters -> [UNK]; greedy
longest-match-first WordPiece (a word with a piece missing from the vocab -> one [UNK]).
"""

import bisect
import functools
import re
import sys
import unicodedata

from data_pipelines.tokenizers import bert_chars
from data_pipelines.tokenizers import pretokenize
from data_pipelines.tokenizers import vocab as vocab_lib

MAX_CHARS_PER_WORD = 200  # as tokenization.MAX_CHARS_PER_WORD (google-research/bert)
_SPECIAL_RE = re.compile(r"(\[(?:PAD|UNK|CLS|SEP|MASK)\])")


class _Ranges:
  """Membership in a bert_chars range spec ("41-5A 61 ..."), by bisection."""

  def __init__(self, spec):
    ranges = sorted(bert_chars.parse_ranges(spec))
    self._starts = [a for a, _ in ranges]
    self._ends = [b for _, b in ranges]

  def __contains__(self, cp):
    i = bisect.bisect_right(self._starts, cp) - 1
    return i >= 0 and cp <= self._ends[i]


@functools.lru_cache(maxsize=None)
def _tables():
  """(remove, space, cjk, punct, mark: code-point classes; fixes: {cp: cp})."""
  classes = tuple(_Ranges(spec) for spec in (
      bert_chars.REMOVE, bert_chars.SPACE, bert_chars.CJK, bert_chars.PUNCT, bert_chars.MARK))
  # As tokenization._FIXES: the probed fixes, and capital sigma always to small sigma.
  fixes = {**bert_chars.parse_fixes(bert_chars.UNCASED_FIXES), 0x3A3: 0x3C3}
  return classes + (fixes,)


def _lower_strip(text, mark, fixes):
  """Uncased: NFD over each run of characters between FIXES characters (which map directly, as
  the TF tokenizer's placeholders do), MARK characters dropped, lower-cased per character."""
  out, run = [], []

  def flush():
    if run:
      out.extend(c.lower() for c in unicodedata.normalize("NFD", "".join(run))
                 if ord(c) not in mark)
      run.clear()

  for ch in text:
    target = fixes.get(ord(ch))
    if target is None:
      run.append(ch)
    else:
      flush()
      out.append(chr(target))
  flush()
  return "".join(out)


def _normalize(text, lower_case):
  remove, space, cjk, _, mark, fixes = _tables()
  out = []
  for ch in text:
    cp = ord(ch)
    if cp in remove or 0xD800 <= cp < 0xE000:  # (lone surrogates: invalid UTF-8 in TF, removed)
      continue
    out.append(" " if cp in space else f" {ch} " if cp in cjk else ch)
  text = "".join(out)
  return _lower_strip(text, mark, fixes) if lower_case else text


def _words(text, lower_case):
  punct = _tables()[3]
  words = []
  for chunk in _normalize(text, lower_case).split(" "):
    start = 0
    for i, ch in enumerate(chunk):
      if ord(ch) in punct:
        if i > start:
          words.append(chunk[start:i])
        words.append(ch)
        start = i + 1
    if start < len(chunk):
      words.append(chunk[start:])
  return words


class PythonWordPieceTokenizer:
  """The interface of tokenization.WordPieceTokenizer that inference needs: encode, vocab,
  do_lower_case, pretokenizer (None: only for vocabs without one), id_to_token, settings."""

  def __init__(self, vocab_file, do_lower_case, max_chars_per_word=MAX_CHARS_PER_WORD):
    self.vocab = vocab_lib.wordpiece_info(vocab_file)
    self.do_lower_case = bool(do_lower_case)
    self.pretokenizer = None
    self.max_chars_per_word = int(max_chars_per_word)
    self.tokens = vocab_lib.load_wordpiece_vocab(vocab_file)
    self._index = {}
    for i, t in enumerate(self.tokens):
      self._index.setdefault(t, i)
    self._unk = self.vocab.unk_id
    ids = self.vocab.special_ids
    self._special = {"[PAD]": ids["pad"], "[UNK]": ids["unk"], "[CLS]": ids["cls"],
                     "[SEP]": ids["sep"], "[MASK]": ids["mask"]}
    self._warned_jamo = False

  def _word(self, word):
    if len(word) > self.max_chars_per_word:
      return [self._unk]
    pieces, start = [], 0
    while start < len(word):
      end = len(word)
      while end > start:
        piece = word[start:end] if start == 0 else "##" + word[start:end]
        if piece in self._index:
          pieces.append(self._index[piece])
          break
        end -= 1
      else:
        return [self._unk]
      start = end
    return pieces

  def _encode_one(self, text):
    if isinstance(text, bytes):
      text = text.decode("utf-8", errors="replace")
    ids = []
    for segment in _SPECIAL_RE.split(text):
      if segment in self._special:
        ids.append(self._special[segment])
      elif segment:
        for w in _words(segment, self.do_lower_case):
          ids.extend(self._word(w))
    return ids

  def encode(self, texts):
    """list[str] -> list[list[int]], as tokenization.WordPieceTokenizer.encode."""
    if isinstance(texts, (str, bytes)):
      raise TypeError("encode takes a list of strings; wrap a single string in a list.")
    if self.do_lower_case and not self._warned_jamo and any(
        isinstance(t, str) and pretokenize.has_hangul(t) for t in texts[:1024]):
      # The same warning as tokenization.WordPieceTokenizer.encode.
      print("warning: do_lower_case=True splits every Hangul syllable into jamo (uncased BERT "
            "NFD); for Korean use a cased vocab (build_vocab --nolower_case, the default for "
            "Hangul text).", file=sys.stderr)
      self._warned_jamo = True
    return [self._encode_one(t) for t in texts]

  def id_to_token(self, ids):
    return [self.tokens[int(i)] for i in ids]

  def token_texts(self, ids):
    """What each id reads as, for a person: the pieces themselves (text already; a byte-level
    tokenizer.json decodes its pieces, tokenizer_json.JsonTokenizer.token_texts)."""
    return self.id_to_token(ids)
