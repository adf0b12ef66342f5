"""Hugging Face `tokenizer.json` files (the `tokenizers` library): learn one, read one, encode.

The third vocabulary kind beside WordPiece `vocab.txt` and SentencePiece `.model`; what ModernBERT
(byte-level BPE, 50,368 ids), RoBERTa and most models since 2020 ship. Every tool takes it as
`--tokenizer_json=PATH`; `vocab.py` names the kind "tokenizer_json".

Ids: `encode` runs the file through the `tokenizers` library itself (the Rust code that
transformers' PreTrainedTokenizerFast runs), with add_special_tokens=False as for the other kinds
([CLS]/[SEP] are placed by the record builders). tests/data_pipelines/tokenizers/bpe_tokenizer_test.py checks the ids
against PreTrainedTokenizerFast on the standard library's docstrings and on Korean.

Special tokens: read from the file, never assumed. A role (pad, unk, cls, sep, mask) is the token
that `tokenizer_config.json` beside the file names (`mask_token`, ...: an HF model folder), else
the first of its two usual spellings that the file holds as a special added token: BERT/ModernBERT
`[PAD] [UNK] [CLS] [SEP] [MASK]` or RoBERTa `<pad> <unk> <s> </s> <mask>`. ModernBERT's own file
has them at ids 50283, 50280, 50281, 50282, 50284; what `build_vocab` learns has them at 0..4.

What `build_vocab` learns (--output=*.json; `learn` below):
  * byte-level BPE (--model_type=bpe, the default alphabet for a Latin-script corpus): the GPT-2 /
    RoBERTa / ModernBERT kind. Its alphabet is the 256 bytes, so no text is ever [UNK], but a
    piece is a run of UTF-8 bytes: a Hangul syllable is 3 bytes and the learned merges cut across
    syllables (on tests/data/korean with 2,000 ids, 'ĠëĮĢíķ' 'ľë¯¼' is "대한민" cut after the first
    byte of 민). Pieces are not characters, so no syllable guarantee holds.
  * character-level BPE or Unigram (--model_type=unigram, or --nobyte_level; the default for a
    Hangul/CJK-heavy corpus): the Metaspace pre-tokenizer, as SentencePiece. Pieces are whole
    characters, so a syllable is never split (--hangul_coverage=ksx1001 puts the 2,350 common
    syllables in the alphabet first); a character the corpus never had is UTF-8 byte pieces
    <0xEB> <0xB7> <0x81> in a BPE (byte fallback, _with_byte_fallback), [UNK] in a Unigram.
  Both kinds normalise to NFC first (learn says why not NFKC), so NFD Hangul is read as its
  syllables, and decode(encode(text)) == NFC(text) (a byte-level decode starts with the prefix
  space; a Unigram one has [UNK] where a character was unseen).
  Special tokens as ModernBERT's: [PAD] [UNK] [CLS] [SEP] [MASK] (here ids 0..4), [MASK] with
  lstrip as in ModernBERT's file (the space before it belongs to the mask), a TemplateProcessing
  post-processor "[CLS] $A [SEP]" / "[CLS] $A [SEP] $B [SEP]" as ModernBERT's. One difference:
  the byte-level pre-tokenizer adds a prefix space (ModernBERT's does not), so a sentence encoded
  on its own (create_pretraining_data encodes sentence by sentence) starts "ĠThe" as it would
  mid-document, and every word's first piece carries the word-start mark whole-word masking reads.

Gemma-style files (Gemma's 256k vocabulary, which mmBERT reuses; Llama's): a BPE with byte
fallback over SentencePiece pieces, spaces written "▁" by a Replace normalizer (no Metaspace, no
prefix "▁"), specials <pad> <eos> <bos> <unk> <mask>: <bos>/<eos> serve as [CLS]/[SEP] unless a
tokenizer_config.json beside the file names others. tests/data_pipelines/tokenizers/multilingual_vocab_test.py checks the
ids against PreTrainedTokenizerFast and transformers' GemmaTokenizer on English, Korean, German
and French.

Whole-word masking (VocabInfo.is_continuation): a piece continues a word unless it starts with
the pre-tokenizer's word-start mark ("Ġ" byte-level, as fairseq's RoBERTa whole-word mask; "▁"
Metaspace or a normalizer replacing " " with "▁"), or, for a WordPiece model, when it starts
with its "##". With a byte-level file that
adds no prefix space (ModernBERT's), a sentence's first word has no mark and is joined to the
token before it when that token is a candidate.
"""

import dataclasses
import functools
import json
import os

import numpy as np

from data_pipelines.tokenizers import vocab_base as vocab_lib

FLAG = "--tokenizer_json"
# role -> accepted spellings, first preferred (BERT/ModernBERT, then RoBERTa's, then Gemma's:
# its file has <pad> <eos> <bos> <unk> <mask> at ids 0..4 and no <s>, and transformers'
# GemmaTokenizer puts <bos> first, <eos> last, the places of [CLS] and [SEP]).
ROLES = (("pad", ("[PAD]", "<pad>")), ("unk", ("[UNK]", "<unk>")),
         ("cls", ("[CLS]", "<s>", "<bos>")), ("sep", ("[SEP]", "</s>", "<eos>")),
         ("mask", ("[MASK]", "<mask>")))
SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # what `learn` writes, ids 0..4
BYTE_SPACE = "\u0120"  # "Ġ": the byte-level alphabet's stand-in for the space byte
META_SPACE = "\u2581"  # "▁": Metaspace's (and SentencePiece's) word-start mark
_BATCH = 1024  # strings per encode_batch call


class TokenizerJsonError(vocab_lib.VocabError):
  """A tokenizer.json is missing, not a tokenizer, or lacks a special token MLM needs."""


def _parse(path, flag=FLAG):
  """(tokenizers.Tokenizer, the file's JSON dict); one-line errors for a bad file."""
  from tokenizers import Tokenizer  # pylint: disable=g-import-not-at-top
  vocab_lib._check_file(path, flag)  # pylint: disable=protected-access
  raw = vocab_lib._read_bytes(path)  # pylint: disable=protected-access
  try:
    spec = json.loads(raw.decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise TokenizerJsonError(f"{flag}={path}: not a JSON file ({e}); pass a Hugging Face "
                             "tokenizer.json or build one with `python -m data_pipelines."
                             "build_vocab --model_type=bpe --output=tokenizer.json`.") from None
  if not isinstance(spec, dict) or not isinstance(spec.get("model"), dict):
    raise TokenizerJsonError(f"{flag}={path}: JSON without a tokenizer \"model\" section (is it a "
                             "tokenizer_config.json or config.json?); pass the folder's "
                             "tokenizer.json.")
  try:
    tok = Tokenizer.from_str(raw.decode("utf-8"))
  except Exception as e:  # pylint: disable=broad-except
    # tokenizers reports every deserialisation failure as a bare Exception (PyO3's default);
    # anything more specific is not a bad file and keeps its traceback.
    if type(e) is not Exception:  # pylint: disable=unidiomatic-typecheck
      raise
    raise TokenizerJsonError(f"{flag}={path}: the tokenizers library cannot read it "
                             f"({str(e).splitlines()[0]}); re-save it with tokenizers "
                             "or rebuild it with build_vocab.") from None
  return tok, spec


def _role_tokens(path):
  """role -> token text from tokenizer_config.json beside the file, or {} (none there)."""
  config = os.path.join(os.path.dirname(path), "tokenizer_config.json")
  if "://" in path or not os.path.isfile(config):
    return {}
  try:
    with open(config, encoding="utf-8") as f:
      data = json.load(f)
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise TokenizerJsonError(f"{config}: not valid JSON ({e}); fix it or remove it (the special "
                             f"tokens are then read from {path}).") from None
  out = {}
  for role, _ in ROLES:
    value = data.get(f"{role}_token") if isinstance(data, dict) else None
    if isinstance(value, dict):  # {"content": "[MASK]", "lstrip": true, ...}
      value = value.get("content")
    if isinstance(value, str):
      out[role] = value
  return out


def _word_start(spec):
  """How pieces mark a word's start: ("prefix", "Ġ"|"▁"), ("continuation", "##") or (None, '')."""
  def find(node):
    if isinstance(node, dict):
      if node.get("type") == "ByteLevel":
        return ("prefix", BYTE_SPACE)
      if node.get("type") == "Metaspace":
        return ("prefix", node.get("replacement", META_SPACE))
      for child in node.get("pretokenizers", ()) or ():
        found = find(child)
        if found:
          return found
    return None
  found = find(spec.get("pre_tokenizer")) or _replaced_space(spec.get("normalizer"))
  if found:
    return found
  if spec["model"].get("type") == "WordPiece":
    return ("continuation", spec["model"].get("continuing_subword_prefix") or "##")
  return (None, "")


def _replaced_space(node):
  """("prefix", "▁") for a normalizer that writes every space as "▁" (Gemma's and Llama's files,
  as transformers converts SentencePiece: Replace(" ", "▁"), with no Metaspace pre-tokenizer),
  alone or in a Sequence; else None."""
  if not isinstance(node, dict):
    return None
  if node.get("type") == "Sequence":
    return next(filter(None, map(_replaced_space, node.get("normalizers", ()) or ())), None)
  if (node.get("type") == "Replace" and (node.get("pattern") or {}).get("String") == " "
      and node.get("content") == META_SPACE):
    return ("prefix", META_SPACE)
  return None


@dataclasses.dataclass
class Loaded:
  tokenizer: object  # tokenizers.Tokenizer
  info: vocab_lib.VocabInfo
  tokens: list  # id -> token text ("" for an id the file does not use)
  alphabet: str  # "bytes" | "characters": whether pieces are byte runs (byte-level pre-tokenizer)


def load(path, flag=FLAG):
  """The tokenizer and its VocabInfo, special ids read from the file; one-line errors."""
  tok, spec = _parse(path, flag)
  vocab = tok.get_vocab(with_added_tokens=True)  # token -> id
  size = max(vocab.values()) + 1 if vocab else 0
  if size == 0:
    raise TokenizerJsonError(f"{flag}={path}: the tokenizer has no token.")
  tokens = [""] * size
  for t, i in vocab.items():
    tokens[i] = t
  added = tok.get_added_tokens_decoder()  # id -> AddedToken
  special_added = {a.content: i for i, a in added.items() if a.special}
  named = _role_tokens(path)
  ids, missing = {}, []
  for role, spellings in ROLES:
    if role in named:
      text = named[role]
      if text not in special_added:
        raise TokenizerJsonError(
            f"{flag}={path}: tokenizer_config.json names {role}_token {text!r}, which is not a "
            "special added token of tokenizer.json; fix one of the two files.")
      ids[role] = special_added[text]
      continue
    found = [s for s in spellings if s in special_added]
    if found:
      ids[role] = special_added[found[0]]
    else:
      missing.append(" or ".join(spellings))
  if missing:
    raise TokenizerJsonError(
        f"{flag}={path}: no special token {', '.join(missing)}; masked-LM pre-training needs "
        "[PAD] [UNK] [CLS] [SEP] [MASK] (or <pad> <unk> <s> </s> <mask>, or Gemma's <bos> "
        "<eos>) as special added tokens: learn one with build_vocab --output=tokenizer.json, "
        "or add them with tokenizers' add_special_tokens.")
  if len(set(ids.values())) < len(ids):
    raise TokenizerJsonError(f"{flag}={path}: special roles share an id ({ids}); pad, unk, cls, "
                             "sep and mask each need their own token.")
  is_special = np.array([t == "" for t in tokens], dtype=bool)  # unused ids: never drawn
  is_special[list(special_added.values())] = True
  is_special[list(ids.values())] = True
  how, mark = _word_start(spec)
  if how == "prefix":
    is_cont = np.array([not t.startswith(mark) for t in tokens], dtype=bool)
  elif how == "continuation":
    is_cont = np.array([t.startswith(mark) and len(t) > len(mark) for t in tokens], dtype=bool)
  else:  # no word marks: every piece is its own word for whole-word masking
    is_cont = np.zeros(size, dtype=bool)
  is_cont &= ~is_special
  info = vocab_lib.VocabInfo(size=size, pad_id=ids["pad"], unk_id=ids["unk"], cls_id=ids["cls"],
                             sep_id=ids["sep"], mask_id=ids["mask"], is_continuation=is_cont,
                             is_special=is_special, path=path, kind="tokenizer_json")
  alphabet = "bytes" if mark == BYTE_SPACE and how == "prefix" else "characters"
  return Loaded(tok, info, tokens, alphabet)


def info(path, flag=FLAG):
  return load(path, flag).info


def lower_case(path):
  """(whether the file's normalizer lower-cases, how that was seen): asks the normalizer."""
  tok, _ = _parse(path)
  if tok.normalizer is None:
    return False, "it has no normalizer (cased)"
  folds = tok.normalizer.normalize_str("ABCXYZ") == tok.normalizer.normalize_str("abcxyz")
  return folds, "its normalizer lower-cases" if folds else "its normalizer keeps case"


# ----------------------------------------------------------------------------------------------
# Encoding.
# ----------------------------------------------------------------------------------------------
def _text(t):
  """str or bytes -> str the Rust side accepts: invalid UTF-8 and lone surrogates -> U+FFFD."""
  if isinstance(t, str):
    try:
      t.encode("utf-8")
      return t
    except UnicodeEncodeError:
      t = t.encode("utf-8", errors="surrogatepass")
  return bytes(t).decode("utf-8", errors="replace")


def _same_length(t):
  """str -> str the Rust side accepts, character for character (offsets stay the caller's): a
  lone surrogate becomes one U+FFFD (_text would make it three)."""
  try:
    t.encode("utf-8")
    return t
  except UnicodeEncodeError:
    return "".join("\ufffd" if 0xD800 <= ord(c) <= 0xDFFF else c for c in t)


def _byte_level_alphabet():
  """{character: byte} of the byte-level alphabet (GPT-2's bytes_to_unicode, which tokenizers'
  ByteLevel uses): printable Latin-1 bytes stand for themselves, the other 68 bytes (controls,
  space, ...) for U+0100 onwards in byte order ('Ġ' = U+0120 is the space, 0x20)."""
  kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
          *range(ord("®"), ord("ÿ") + 1)]
  moved = [b for b in range(256) if b not in kept]
  return {**{chr(b): b for b in kept}, **{chr(256 + k): b for k, b in enumerate(moved)}}


def _show_bytes(data):
  """UTF-8 bytes as text, a byte no character completes as <0xEC> (byte-fallback pieces'
  spelling): b' \xec\x9e' -> ' <0xEC><0x9E>'."""
  out, i = [], 0
  while i < len(data):
    for j in range(min(len(data), i + 4), i, -1):   # the longest character starting at i
      try:
        out.append(data[i:j].decode("utf-8"))
        i = j
        break
      except UnicodeDecodeError:
        pass
    else:
      out.append(f"<0x{data[i]:02X}>")
      i += 1
  return "".join(out)


class JsonTokenizer:
  """A tokenizer.json; the interface of tokenization.WordPieceTokenizer (vocab, do_lower_case,
  tokenize, encode, id_to_token, token_texts)."""

  def __init__(self, path, flag=FLAG):
    loaded = load(path, flag)
    self._tok = loaded.tokenizer
    self.vocab = loaded.info
    self.tokens = loaded.tokens
    self.alphabet = loaded.alphabet
    self.do_lower_case, _ = lower_case(path)
    self.pretokenizer = None  # list[str] -> list[str], set by get_tokenizer from the settings

  def _ids(self, texts):
    encodings = self._tok.encode_batch_fast([_text(t) for t in texts], add_special_tokens=False)
    return [e.ids for e in encodings]

  def encode(self, texts):
    """list[str | bytes] -> list[list[int]], after the pre-tokenizer; no [CLS]/[SEP] added."""
    if isinstance(texts, (str, bytes)):
      raise TypeError("encode takes a list of strings; wrap a single string in a list.")
    out = []
    for start in range(0, len(texts), _BATCH):
      batch = [_text(t) for t in texts[start:start + _BATCH]]
      if self.pretokenizer is not None:
        batch = self.pretokenizer(batch)
      out.extend(self._ids(batch))
    return out

  def tokenize(self, texts):
    """tf.Tensor[string] [N] -> tf.RaggedTensor int32 [N, (tokens)].

    Not TF ops, unlike the other kinds: the `tokenizers` library runs in a tf.py_function (its
    Rust code is the reference; no tensorflow-text op reads a tokenizer.json), so a graph that
    uses it cannot be saved as a SavedModel. The pre-tokenizer is not applied (as the others).
    """
    from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top

    def ids(texts):
      rows = self._ids([bytes(t) for t in texts.numpy()])
      flat = np.fromiter((i for r in rows for i in r), np.int32)
      return flat, np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
    values, splits = tf.py_function(ids, [tf.convert_to_tensor(texts, tf.string)],
                                    [tf.int32, tf.int64])
    values.set_shape([None])
    splits.set_shape([None])
    return tf.RaggedTensor.from_row_splits(values, splits, validate=False)

  def id_to_token(self, ids):
    """Token texts; "" for an id the file does not use, within it or past its end (a model's
    padded rows: ModernBERT has 50,368 rows for 50,280 ids, and fill-mask ranks them all)."""
    n = len(self.tokens)
    return [self.tokens[int(i)] if int(i) < n else "" for i in ids]

  def token_texts(self, ids):
    """What each id reads as, for a person (fill-mask's candidates, extract_features' tokens):
    a byte-level piece decoded by the file's own decoder (tokenizers' ByteLevel), so 'Ġìŀħëł¥'
    shows as ' 입력', its leading space the word start, as transformers' fill-mask token_str
    (tokenizer.decode([id])). A piece holding only part of a character's UTF-8 bytes (small
    vocabularies cut Hangul syllables: 'Ġìŀ' 'ħ') decodes to U+FFFD there; here its bytes are
    shown instead, ' <0xEC><0x9E>' '<0x85>', as byte-fallback pieces are written. Other kinds of
    file: the pieces, which are text already. "" as id_to_token."""
    pieces = self.id_to_token(ids)
    if self.alphabet != "bytes" or self._tok.decoder is None:
      return pieces
    known = [int(i) for i, p in zip(ids, pieces) if p]
    texts = iter(self._tok.decode_batch([[i] for i in known], skip_special_tokens=False))
    out = []
    for p in pieces:
      text = next(texts) if p else ""
      if "\ufffd" in text and p in self.tokens_bytes:   # a cut character: show its bytes
        text = _show_bytes(self.tokens_bytes[p])
      out.append(text)
    return out

  @functools.cached_property
  def tokens_bytes(self):
    """{byte-level piece: its bytes} (GPT-2's alphabet, what tokenizers' ByteLevel maps), for the
    pieces whose text the decoder cannot show."""
    byte_of = _byte_level_alphabet()
    return {t: bytes(byte_of[c] for c in t) for t in self.tokens
            if t and all(c in byte_of for c in t)}

  def encode_words(self, lines):
    """list[list[str]] (the whitespace words of each line) -> [(ids, word_index)] per line: the
    line encoded whole (" ".join(words), encode_word_spans), each piece given the index of the
    word its last character falls in, and a piece of spaces only (a lone 'Ġ' before a byte the
    BPE never merged with a space) the word after it, as transformers' word_ids() does (its
    pre-token is " German"). A byte-level BPE without a prefix space (ModernBERT's) encodes
    "cat" alone as another id than " cat" in a sentence, so words are not encoded one by one,
    with a pre-tokenizer neither (it rewrites each word; the rewritten words are joined)."""
    out = []
    for ids, _, last in self.encode_word_spans(lines):
      index, following = [0] * len(ids), max(0, *last)  # trailing spaces: the last word
      for k in reversed(range(len(ids))):
        index[k] = following = last[k] if last[k] >= 0 else following
      out.append((ids, index))
    return out

  def encode_offsets(self, texts):
    """list[str] -> [(ids, offsets)] per text, encoded whole as is (the pre-tokenizer is the
    caller's: squad applies it word by word), offsets the [start, end) characters of each piece,
    its space included ('Ġcat' is " cat"): transformers' offset_mapping without the specials."""
    texts = [_same_length(t) for t in texts]
    encodings = self._tok.encode_batch(texts, add_special_tokens=False)
    return [(list(e.ids), list(e.offsets)) for e in encodings]

  def encode_word_spans(self, lines):
    """list[list[str]] -> [(ids, first, last)] per line: the line encoded whole, as
    encode_words, and for each piece the first and the last word its characters fall in (both
    -1 for a piece of spaces only: a lone 'Ġ' before a byte the BPE never merged with a space).
    first != last is a piece across a space (a tokenizer whose pre-tokenizer does not split
    there). With a pre-tokenizer, each word is rewritten by it (mecab: "대한민국은" ->
    "대한민국 은") and the rewritten words are joined and encoded whole."""
    if self.pretokenizer is not None:
      lines = [self.pretokenizer([_text(w) for w in words]) if words else [] for words in lines]
    return self._word_spans(lines)

  def _word_spans(self, lines):
    # Empty words (a pre-tokenizer may rewrite a word to "") are left out of the text: two
    # spaces in a row would change the next word's pieces.
    kept = [[(w, word) for w, word in enumerate(words) if word] for words in lines]
    texts = [" ".join(word for _, word in k) for k in kept]
    encodings = self._tok.encode_batch([_text(t) for t in texts], add_special_tokens=False)
    out = []
    for words, text, e in zip(kept, texts, encodings):
      owner = np.full(len(text) + 1, -1, np.int64)   # character -> its word, -1 for spaces
      start = 0
      for w, word in words:
        owner[start:start + len(word)] = w
        start += len(word) + 1
      first, last = [], []
      for s, t in e.offsets:   # [start, end) characters of the piece, its space included
        hits = owner[s:t][owner[s:t] >= 0]
        first.append(int(hits[0]) if len(hits) else -1)
        last.append(int(hits[-1]) if len(hits) else -1)
      out.append((list(e.ids), first, last))
    return out


# ----------------------------------------------------------------------------------------------
# Learning (build_vocab --output=*.json).
# ----------------------------------------------------------------------------------------------
def learn(lines, vocab_size, *, model_type, byte_level, lower_case, initial_alphabet=()):
  """Learns a tokenizer.json from `lines`; returns (its text, its number of ids).

  model_type "bpe" | "unigram"; byte_level (BPE only): the 256-byte alphabet and the ByteLevel
  pre-tokenizer, else Metaspace over whole characters. Every kind normalises to NFC first, and
  lower_case adds a Lowercase normalizer (no NFD, no accent stripping: Hangul stays whole).
  A character-level BPE gets byte fallback: the last 256 of its vocab_size ids are <0x00>..<0xFF>.
  """
  from tokenizers import AddedToken, Tokenizer  # pylint: disable=g-import-not-at-top
  from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers
  specials = [AddedToken(t, special=True, lstrip=(t == "[MASK]")) for t in SPECIALS]
  # NFC, not NFKC (what this used before, SentencePiece's nmt_nfkc): NFC only composes, so NFD
  # Hangul (decomposed jamo, e.g. text from macOS file names) becomes the syllables it stands
  # for and decode(encode(text)) == NFC(text). NFKC also rewrites characters Korean text uses:
  # on the konlpy corpus 14 distinct ones (the constitution's paragraph marks ① -> 1, the
  # middle dot ㆍ U+318D -> the archaic vowel jamo U+119E, ｢ -> 「), and it turns compatibility
  # jamo typed alone into conjoining ones that then compose (ㅎㅏ -> 하, ㅋㅋ -> ᄏᄏ).
  # The byte-level kind gets NFC too: without it NFD Hangul is other bytes than the syllables
  # the merges were learned on.
  steps = [normalizers.NFC()] + ([normalizers.Lowercase()] if lower_case else [])
  fallback = model_type == "bpe" and not byte_level
  if model_type == "bpe":
    tok = Tokenizer(models.BPE(unk_token=None if byte_level else "[UNK]"))
    alphabet = pre_tokenizers.ByteLevel.alphabet() if byte_level else list(initial_alphabet)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - (256 if fallback else 0),
                                  special_tokens=specials, initial_alphabet=alphabet,
                                  show_progress=False)
  elif model_type == "unigram" and not byte_level:
    tok = Tokenizer(models.Unigram())
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials,
                                      unk_token="[UNK]", initial_alphabet=list(initial_alphabet),
                                      show_progress=False)
  else:
    raise ValueError(f"learn(model_type={model_type!r}, byte_level={byte_level}): a bug in "
                     "the caller (build_vocab checks the flags).")
  tok.normalizer = normalizers.Sequence(steps) if len(steps) > 1 else steps[0]
  if byte_level:
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
  else:
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=META_SPACE, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=META_SPACE, prepend_scheme="always")
  tok.train_from_iterator(lines, trainer, length=len(lines))
  if fallback:
    tok = _with_byte_fallback(tok)
  cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
  tok.post_processor = processors.TemplateProcessing(
      single="[CLS] $A [SEP]", pair="[CLS] $A:0 [SEP]:0 $B:1 [SEP]:1",
      special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
  # BPE training is byte-identical run to run (3 runs of each alphabet on the Korean test
  # corpus); the Unigram trainer's parallel EM is not: the same pieces, scores differing in the
  # last bits, and 25-52 of 4,000 tied ids in another order on the stdlib corpus. Records are
  # checked by the file's sha256, so a Unigram file must be kept, not re-learned.
  return tok.to_str(), tok.get_vocab_size(with_added_tokens=True)


BYTE_PIECES = tuple(f"<0x{b:02X}>" for b in range(256))  # sentencepiece's and Llama's spelling


def _with_byte_fallback(tok):
  """A character-level BPE whose unseen characters become UTF-8 byte pieces, not [UNK].

  Over whole characters a character the corpus never had is [UNK] (a rare syllable such as 뷁,
  which KS X 1001 lacks, a hanja, an emoji), and decode(encode(text)) loses it. With the model's
  byte_fallback the Rust BPE looks up <0xEB> <0xB7> <0x81> for such a character instead, and the
  ByteFallback decoder joins them back (U+FFFD only for a run that is not UTF-8, e.g. one byte
  piece alone). The trainer cannot add them (as special tokens they would also match the literal
  text "<0x41>"), so they go into the model's vocab after the learned ids.
  """
  from tokenizers import Tokenizer, decoders  # pylint: disable=g-import-not-at-top
  spec = json.loads(tok.to_str())
  vocab = spec["model"]["vocab"]  # token -> id, the specials included
  learned = [p for p in BYTE_PIECES if p in vocab]
  if learned:  # merges never build "<0x41>" from a text without it; a corpus with it would clash
    raise TokenizerJsonError(f"the corpus taught the BPE the piece(s) {learned[:3]}, which byte "
                             "fallback reserves; remove that text or pass --model_type=unigram.")
  start = max(vocab.values()) + 1
  vocab.update({p: start + b for b, p in enumerate(BYTE_PIECES)})
  spec["model"]["byte_fallback"] = True
  tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
  tok.decoder = decoders.Sequence([
      decoders.ByteFallback(),
      decoders.Metaspace(replacement=META_SPACE, prepend_scheme="always")])
  return tok
