"""In-graph tokenizers: WordPiece (ids identical to `transformers.BertTokenizer`) and SentencePiece.

Both take a `tf.Tensor[string]` of shape [N] and return a `tf.RaggedTensor` int32 [N, (tokens)]
built from TF ops only, so `tokenize` runs inside `tf.data` `.map` (no Python per example).

WordPiece = HF BERT basic tokenization + greedy longest-match-first WordPiece:
  1. invalid UTF-8 -> U+FFFD (then removed, as HF removes U+FFFD),
  2. literal special tokens in the raw text ("[CLS]", "[SEP]", "[MASK]", "[PAD]", "[UNK]") are kept
     whole, as HF's added-token matching does,
  3. clean: NUL, U+FFFD and control/format characters removed; whitespace -> " ",
  4. CJK ideographs surrounded by spaces,
  5. uncased only: NFD, non-spacing marks removed, lower-cased,
  6. split on whitespace and around each punctuation character,
  7. words over `max_chars_per_word` characters -> [UNK]; others -> WordPiece (a word with a
     piece missing from the vocab -> one [UNK]).
The character classes are the reference's own (see bert_chars.py): RE2's \\p{P} or tf_text's
`case_fold_utf8` (NFKC case folding, 'ß' -> 'ss') would give different ids.

Words over 200 characters become [UNK] (google-research/bert's `max_input_chars_per_word`; HF's
default is 100, set `max_chars_per_word=100` for out-of-the-box HF ids on 101-200 char words).
"""

import functools
import sys

from data_pipelines.tokenizers import bert_chars
from data_pipelines.tokenizers import pretokenize
from data_pipelines.tokenizers import vocab as vocab_lib
from bert_jax_core.tf_setup import tf
import tensorflow_text as tf_text

MAX_CHARS_PER_WORD = 200  # google-research/bert tokenization.py WordpieceTokenizer
_ENCODE_BATCH = 1024  # strings per eager call in `encode`

_REMOVE_RE = bert_chars.re2_class(bert_chars.REMOVE)
_SPACE_RE = bert_chars.re2_class(bert_chars.SPACE)
_CJK_RE = bert_chars.re2_class(bert_chars.CJK)
_PUNCT_RE = bert_chars.re2_class(bert_chars.PUNCT)
_MARK_RE = bert_chars.re2_class(bert_chars.MARK)
# Capital sigma joins the fixes: ICU lower-cases a word-final 'Σ' to 'ς', HF always to 'σ'.
_FIXES = {**bert_chars.parse_fixes(bert_chars.UNCASED_FIXES), 0x3A3: 0x3C3}
# Full match = valid UTF-8 (RE2 compiles these explicit ranges byte-exactly, so surrogates,
# overlong forms and code points over U+10FFFF fail), with no character needing a fix.
_VALID_RE = r"[\x{0}-\x{D7FF}\x{E000}-\x{10FFFF}]*"
_VALID_NO_FIX_RE = bert_chars.re2_class(bert_chars.complement(
    sorted(_FIXES) + list(range(0xD800, 0xE000)))) + "*"
# Placeholders for the fixed characters while NFD and lower-casing run: private-use plane 15,
# which the clean step has already removed from the text, so they cannot collide with input.
_PLACEHOLDER_BASE = 0xF0000
_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_SPECIAL_RE = r"\[(?:PAD|UNK|CLS|SEP|MASK)\]"
_HAS_SPECIAL_RE = "(?s).*" + _SPECIAL_RE + ".*"


def decode_utf8(raw):
  """bytes -> (text, number of U+FFFD that invalid bytes introduced).

  Python's 'replace' handler emits one U+FFFD per maximal invalid subsequence; a U+FFFD that was
  in the input as valid UTF-8 (EF BF BD) is not counted (EF is a lead byte, so those three bytes
  always decode on their own).
  """
  text = raw.decode("utf-8", errors="replace")
  return text, text.count("\ufffd") - raw.count(b"\xef\xbf\xbd")


def _utf8_safe(texts):
  # [N] string: invalid byte sequences -> U+FFFD (RE2 and ICU need valid UTF-8).
  return tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                      replacement_char=0xFFFD)


def _table(keys, values, default):
  return tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(keys, values), default)


@functools.lru_cache(maxsize=None)
def _fix_tables():
  # Two code-point maps: fixed char -> placeholder (before NFD), placeholder -> HF's result.
  cps = sorted(_FIXES)
  holders = [_PLACEHOLDER_BASE + i for i in range(len(cps))]
  targets = [_FIXES[cp] for cp in cps]
  with tf.init_scope():  # eager, once: first use may be inside a tf.function or tf.data trace
    to_holder = _table(tf.constant(cps, tf.int32), tf.constant(holders, tf.int32), -1)
    from_holder = _table(tf.constant(holders, tf.int32), tf.constant(targets, tf.int32), -1)
  return to_holder, from_holder


def _map_codepoints(texts, table):
  cps = tf.strings.unicode_decode(texts, "UTF-8")  # [N, (chars)] int32
  mapped = table.lookup(cps.flat_values)
  cps = cps.with_flat_values(tf.where(mapped >= 0, mapped, cps.flat_values))
  return tf.strings.unicode_encode(cps, "UTF-8")


def _on_subset(texts, mask, fn):
  """texts [N] with fn applied to texts[mask] only; free when `mask` is all False."""
  def apply():
    idx = tf.where(mask)  # [E, 1]
    return tf.tensor_scatter_nd_update(texts, idx, fn(tf.gather_nd(texts, idx)))
  return tf.cond(tf.reduce_any(mask), apply, lambda: texts)


def _lower_strip(texts, exotic):
  """HF's uncased steps: NFD, drop non-spacing marks, per-character lower-casing."""
  to_holder, from_holder = _fix_tables()
  texts = _on_subset(texts, exotic, lambda t: _map_codepoints(t, to_holder))
  texts = tf_text.normalize_utf8(texts, "NFD")
  texts = tf.strings.regex_replace(texts, _MARK_RE, "")
  texts = tf.strings.lower(texts, encoding="utf-8")
  return _on_subset(texts, exotic, lambda t: _map_codepoints(t, from_holder))


def _check(texts, lower_case):
  """[N] string (any bytes) -> ([N] valid UTF-8 string, `exotic`: [N] bool).

  Exotic strings hold invalid UTF-8 or one of the ~120 rare letters (Unicode 14-16 scripts,
  and 'Σ') that need the code-point fixes; only they pay for transcoding and the two code-point
  decode/encode passes, and a batch without any (nearly all) pays one regex scan.
  """
  exotic = tf.logical_not(tf.strings.regex_full_match(
      texts, _VALID_NO_FIX_RE if lower_case else _VALID_RE))
  return _on_subset(texts, exotic, _utf8_safe), exotic


def _normalize(texts, lower_case, exotic):
  texts = tf.strings.regex_replace(texts, _REMOVE_RE, "")
  texts = tf.strings.regex_replace(texts, _SPACE_RE, " ")
  texts = tf.strings.regex_replace(texts, _CJK_RE, r" \0 ")
  if lower_case:
    texts = _lower_strip(texts, exotic)
  return texts


def _split_words(normalized):
  texts = tf.strings.regex_replace(normalized, _PUNCT_RE, r" \0 ")
  # After normalization the only whitespace left is " " (the rest was removed or replaced).
  return tf.strings.split(texts)  # [N, (words)]


def normalize(texts, lower_case):
  """HF BertNormalizer: [N] string (any bytes) -> [N] valid UTF-8 string."""
  texts, exotic = _check(texts, lower_case)
  return _normalize(texts, lower_case, exotic)


def basic_tokenize(texts, lower_case):
  """HF BERT normalizer + pre-tokenizer: [N] string -> RaggedTensor string [N, (words)].

  Literal special tokens are not kept whole here (build_vocab counts words with it).
  """
  return _split_words(normalize(texts, lower_case))


class WordPieceTokenizer:
  """BERT WordPiece over a vocab.txt; ids identical to `transformers.BertTokenizer`."""

  def __init__(self, vocab_file, do_lower_case=None, max_chars_per_word=MAX_CHARS_PER_WORD):
    """do_lower_case None = the vocab's own casing (vocab.resolve_settings)."""
    self.vocab = vocab_lib.wordpiece_info(vocab_file)
    if do_lower_case is None:
      do_lower_case = vocab_lib.resolve_settings(vocab_file=vocab_file)["do_lower_case"]
    self.do_lower_case = bool(do_lower_case)
    self.pretokenizer = None  # list[str] -> list[str], set by get_tokenizer from the settings
    self._warned_jamo = False
    self.max_chars_per_word = int(max_chars_per_word)
    self.tokens = vocab_lib.load_wordpiece_vocab(vocab_file)
    self._unk = self.tokens[self.vocab.unk_id]
    # A word within max_chars_per_word characters has at most 4 bytes per character, so
    # FastWordpiece's own byte limit never cuts in before the character limit applied here.
    self._wordpiece = tf_text.FastWordpieceTokenizer(
        vocab=self.tokens, suffix_indicator="##", max_bytes_per_word=4 * self.max_chars_per_word,
        token_out_type=tf.int32, unknown_token=self._unk, no_pretokenization=True)
    ids = self.vocab.special_ids
    with tf.init_scope():
      self._special_table = _table(
          tf.constant(_SPECIALS),
          tf.constant([ids["pad"], ids["unk"], ids["cls"], ids["sep"], ids["mask"]], tf.int32), -1)

  def _word_ids(self, texts, exotic):
    """[N] valid UTF-8 (no special tokens), [N] bool -> RaggedTensor int32 [N, (tokens)]."""
    words = _split_words(_normalize(texts, self.do_lower_case, exotic))  # [N, (words)]
    flat = words.flat_values  # [W]
    too_long = tf.strings.length(flat, unit="UTF8_CHAR") > self.max_chars_per_word
    flat = tf.cond(tf.reduce_any(too_long), lambda: tf.where(too_long, self._unk, flat),
                   lambda: flat)
    pieces = self._wordpiece.tokenize(flat)  # [W, (pieces)]
    return tf.RaggedTensor.from_row_splits(pieces, words.row_splits,
                                           validate=False).merge_dims(1, 2)

  def _ids_with_specials(self, texts, exotic):
    # tf_text's regex_split stops at a NUL byte; NUL and U+0001 are both removed later anyway.
    texts = tf.strings.regex_replace(texts, r"\x00", "\x01")
    segments = tf_text.regex_split(texts, _SPECIAL_RE, _SPECIAL_RE)  # [N, (segments)]
    flat = segments.flat_values  # [S]
    exotic = tf.gather(exotic, segments.value_rowids())  # [S]
    special = self._special_table.lookup(flat)  # [S], -1 where not a special token
    is_special = special >= 0
    ids = self._word_ids(tf.where(is_special, "", flat), exotic)  # [S, (tokens)]; specials: []
    own = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(special, is_special),
                                           tf.cast(is_special, tf.int64))  # [S, (0 or 1)]
    ids = tf.concat([own, ids], axis=1)
    return tf.RaggedTensor.from_row_splits(ids, segments.row_splits,
                                           validate=False).merge_dims(1, 2)

  def tokenize(self, texts):
    """tf.Tensor[string] [N] -> tf.RaggedTensor int32 [N, (tokens)]; TF ops only."""
    texts, exotic = _check(tf.convert_to_tensor(texts, tf.string), self.do_lower_case)
    has_special = tf.reduce_any(tf.strings.regex_full_match(texts, _HAS_SPECIAL_RE))
    return tf.cond(has_special, lambda: self._ids_with_specials(texts, exotic),
                   lambda: self._word_ids(texts, exotic))

  @functools.cached_property
  def _tokenize_fn(self):
    return tf.function(self.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])

  def encode(self, texts):
    """list[str] -> list[list[int]] (eager, in batches of 1024), after the pre-tokenizer."""
    if self.do_lower_case and not self._warned_jamo:
      self._warned_jamo = _warn_jamo(texts)
    return _encode(self._tokenize_fn, texts, self.pretokenizer)

  def id_to_token(self, ids):
    return [self.tokens[int(i)] for i in ids]

  def token_texts(self, ids):
    """What each id reads as, for a person: the pieces themselves (text already; a byte-level
    tokenizer.json decodes its pieces, tokenizer_json.JsonTokenizer.token_texts)."""
    return self.id_to_token(ids)


def _warn_jamo(texts):
  """Says once that uncased WordPiece splits Hangul (BERT's NFD); True when it said so."""
  if isinstance(texts, (list, tuple)) and any(
      isinstance(t, str) and pretokenize.has_hangul(t) for t in texts[:_ENCODE_BATCH]):
    print("warning: do_lower_case=True splits every Hangul syllable into jamo (uncased BERT "
          "NFD); for Korean use a cased vocab (build_vocab --nolower_case, the default for "
          "Hangul text).", file=sys.stderr)
    return True
  return False


class SentencePieceTokenizer:
  """SentencePiece `.model` in-graph. [CLS]/[SEP]/[MASK] are user-defined pieces (matched whole).

  Case handling belongs to the model: build_vocab --lower_case trains with SentencePiece's
  `nmt_nfkc_cf` (NFKC + case folding) rule, and `do_lower_case` reports whether the model folds.
  """

  def __init__(self, spm_model_file):
    import sentencepiece as spm  # pylint: disable=g-import-not-at-top
    self.vocab = vocab_lib.sentencepiece_info(spm_model_file)
    proto = vocab_lib._read_bytes(spm_model_file)  # pylint: disable=protected-access
    self.do_lower_case, _ = vocab_lib.sentencepiece_lower_case(spm_model_file)
    processor = spm.SentencePieceProcessor(model_proto=proto)
    self.pretokenizer = None  # list[str] -> list[str], set by get_tokenizer from the settings
    self.tokens = [processor.IdToPiece(i) for i in range(processor.GetPieceSize())]
    self._sp = tf_text.SentencepieceTokenizer(model=proto, out_type=tf.int32)

  def tokenize(self, texts):
    """tf.Tensor[string] [N] -> tf.RaggedTensor int32 [N, (tokens)]; TF ops only."""
    texts, _ = _check(tf.convert_to_tensor(texts, tf.string), lower_case=False)
    ids = self._sp.tokenize(texts)
    return ids.with_row_splits_dtype(tf.int64)

  @functools.cached_property
  def _tokenize_fn(self):
    return tf.function(self.tokenize, input_signature=[tf.TensorSpec([None], tf.string)])

  def encode(self, texts):
    """list[str] -> list[list[int]] (eager, in batches of 1024), after the pre-tokenizer."""
    return _encode(self._tokenize_fn, texts, self.pretokenizer)

  def id_to_token(self, ids):
    return [self.tokens[int(i)] for i in ids]

  def token_texts(self, ids):
    """What each id reads as, for a person: the pieces themselves (text already; a byte-level
    tokenizer.json decodes its pieces, tokenizer_json.JsonTokenizer.token_texts)."""
    return self.id_to_token(ids)


# One name for either in-graph kind; tokenizer_json.JsonTokenizer has the same interface (vocab,
# do_lower_case, tokenize, encode, id_to_token, token_texts).
Tokenizer = WordPieceTokenizer | SentencePieceTokenizer


def _encode(fn, texts, pretokenizer=None):
  if isinstance(texts, (str, bytes)):
    raise TypeError("encode takes a list of strings; wrap a single string in a list.")
  out = []
  for start in range(0, len(texts), _ENCODE_BATCH):
    batch = texts[start:start + _ENCODE_BATCH]
    if pretokenizer is not None:
      batch = pretokenizer([t if isinstance(t, str) else decode_utf8(bytes(t))[0] for t in batch])
    batch = [t.encode("utf-8", errors="surrogatepass") if isinstance(t, str) else bytes(t)
             for t in batch]
    out.extend(fn(tf.constant(batch, tf.string)).to_list())
  return out


def get_tokenizer(vocab_file=None, spm_model_file=None, do_lower_case=None,
                  max_chars_per_word=MAX_CHARS_PER_WORD, pretokenizer=None, recorded=None,
                  flag="--do_lower_case", tokenizer_json=None):
  """WordPiece from `vocab_file`, SentencePiece from `spm_model_file` or a Hugging Face
  tokenizer.json (tokenizer_json.JsonTokenizer) from `tokenizer_json`: exactly one.

  Casing and pre-tokenizer come from the vocab's settings (vocab.resolve_settings): None takes
  them; a value that contradicts them, or `recorded` = (records'/checkpoint's settings, where),
  is a one-line CasingMismatchError. The result's `settings` holds what was used and why.
  """
  if sum(map(bool, (vocab_file, spm_model_file, tokenizer_json))) != 1:
    raise vocab_lib.VocabError(vocab_lib.ONE_OF)
  settings = vocab_lib.resolve_settings(vocab_file, spm_model_file, do_lower_case, pretokenizer,
                                        flag, recorded, tokenizer_json)
  if vocab_file:
    tok = WordPieceTokenizer(vocab_file, settings["do_lower_case"], max_chars_per_word)
  elif tokenizer_json:
    from data_pipelines.tokenizers import tokenizer_json as tj  # pylint: disable=g-import-not-at-top
    tok = tj.JsonTokenizer(tokenizer_json)
  else:
    tok = SentencePieceTokenizer(spm_model_file)
  tok.settings = settings
  tok.pretokenizer = pretokenize.get_pretokenizer(settings["pretokenizer"])
  return tok
