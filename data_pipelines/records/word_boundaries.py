"""Word boundaries for whole-word masking of Chinese (create_pretraining_data --word_boundaries).

WordPiece makes every ideograph a word of its own, so "清华大学" is 4 one-character words and
google-research/bert's whole-word masking masks Chinese one character at a time (its issue #780).
Chinese BERT-wwm (Cui et al. 2019) keeps the character ids and masks whole words from a
segmenter; here the segmenter is jieba (pretokenize.jieba_words: its bundled dictionary, HMM off).

A token id that continues a jieba word carries WORD_CONT from `encode` to
records.serialize_instance: instances.py cuts, truncates and joins token lists
without looking at the ids, so the bit travels with its token through block and whole-corpus
sampling and the Beam pipeline, and `split_flags` moves it into the records' `word_continues`
feature. Vocab ids are < 2^30 (a 30k-250k vocab), and array('i') holds 2^30 | id.
"""

from data_pipelines.tokenizers import pretokenize
from data_pipelines.corpus import text_sources
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib

WORD_CONT = 1 << 30
MODES = ("auto", "none", "jieba")


def resolve(mode, vocab_file, spm_model_file, do_lower_case, tokenizer_json=None):
  """--word_boundaries (one of MODES, checked by create_pretraining_data.validate_config) ->
  "none" | "jieba"; auto = jieba when the vocab's pre-tokenizer is."""
  if mode == "auto":
    settings = vocab_lib.resolve_settings(vocab_file or None, spm_model_file or None,
                                          do_lower_case, tokenizer_json=tokenizer_json or None)
    mode = "jieba" if settings["pretokenizer"] == "jieba" else "none"
  if mode == "jieba" and (spm_model_file or tokenizer_json):
    flag = "--spm_model_file" if spm_model_file else "--tokenizer_json"
    raise text_sources.PretrainingDataError(
        "--word_boundaries=jieba needs a WordPiece --vocab_file: SentencePiece and BPE pieces "
        f"can span jieba words; pass --word_boundaries=none with {flag}.")
  if mode == "jieba":
    pretokenize.get_pretokenizer("jieba")  # a missing package fails now, not in a worker
  return mode


def encode(sentences, encode_fn, stats):
  """Sentences -> token ids with WORD_CONT set on the tokens that continue a jieba word.

  The ids are those of `encode_fn(sentences)`, whatever the boundaries: each sentence is also
  encoded word by word, and the per-word tokens give the flags only where they join up to the
  sentence's own tokens (they do unless a word boundary falls inside what the tokenizer reads as
  one word, e.g. a literal "[MASK]"); otherwise the sentence keeps token-level boundaries and
  counts in stats.word_boundary_fallbacks.
  """
  ids = encode_fn(sentences)
  words = [pretokenize.jieba_words(s if isinstance(s, str) else
                                   tokenization.decode_utf8(bytes(s))[0]) for s in sentences]
  word_ids = encode_fn([w for ws in words for w in ws]) if any(words) else []
  out, k = [], 0
  for sentence_ids, ws in zip(ids, words):
    flagged = [t | (WORD_CONT if j else 0) for wi in word_ids[k:k + len(ws)]
               for j, t in enumerate(wi)]
    k += len(ws)
    if [t & (WORD_CONT - 1) for t in flagged] != list(sentence_ids):
      stats.word_boundary_fallbacks += 1
      flagged = list(sentence_ids)
    out.append(flagged)
  return out


def split_flags(ids):
  """Flagged ids -> ([0/1 continues the word before], plain ids)."""
  return [int(t >= WORD_CONT) for t in ids], [t & (WORD_CONT - 1) for t in ids]
