"""Learns a WordPiece vocab.txt, a SentencePiece model or a Hugging Face tokenizer.json.

  python -m data_pipelines.build_vocab --input_file='data/corpus/*.txt' --vocab_size=8000 \\
      --output=data/vocab.txt [--[no]lower_case] [--model_type=wordpiece|unigram|bpe] \\
      [--input_sentence_size=10000000 --seed=0] [--pretokenizer=mecab] \\
      [--hangul_coverage=auto|ksx1001|none] [--[no]byte_level]
  python -m data_pipelines.build_vocab --input_sources='en=data/en/*.txt;ko=data/ko/*.txt' \\
      --source_tau=0.3 ...   (one vocabulary over several languages: vocab_mixture.py)

WordPiece: words come from the same in-graph BERT basic tokenizer that tokenization.py uses (so
the vocab is learned on exactly the words it will see), then tensorflow_text's WordPiece learner
(`wordpiece_tokenizer_learner_lib`, the library behind `bert_vocab_from_dataset`) picks the pieces.
The file starts like BERT's: [PAD], [unused0..N-1] (--num_unused), [UNK], [CLS], [SEP], [MASK].
Words are counted while the files stream past, so memory is the word counts, not the corpus.

SentencePiece (unigram or bpe): the sentencepiece trainer with [PAD]=0 and [UNK]=1 as its pad and
unk pieces and [CLS] [SEP] [MASK] as user-defined symbols (ids 2, 3, 4); --lower_case trains with
the `nmt_nfkc_cf` rule, so the model itself case-folds. --character_coverage, --byte_fallback
(rare characters become <0xNN> byte pieces instead of [UNK]) are the trainer's own options.

tokenizer.json (--output ending in .json, --model_type=bpe or unigram): the `tokenizers` library
learns it (tokenizer_json.learn), after NFC: byte-level BPE as ModernBERT's (the 256 bytes as
alphabet, never [UNK]; the default for BPE on a Latin-script corpus) or, with --nobyte_level /
unigram / by default on a Hangul/CJK-heavy corpus, Metaspace over whole characters (BPE with
byte fallback), so a Hangul syllable is never cut into bytes. Specials [PAD] [UNK] [CLS] [SEP]
[MASK] are ids 0..4 (ModernBERT's spelling). Cased unless --lower_case (as ModernBERT and
RoBERTa), which adds a Lowercase normalizer with no NFD, so Hangul stays whole.

Corpora larger than memory: --input_sentence_size=N trains on a uniform sample of N lines
(reservoir sampling with --seed, as sentencepiece's own input_sentence_size), for both kinds.

Hangul coverage (WordPiece): BasicTokenizer keeps a Korean eojeol (대한민국은) as one word, and
WordPiece turns the whole word into [UNK] when one syllable has no piece. A small corpus misses
common syllables (the walk-through's 120 KB holds 436 distinct ones; its held-out documents had
1.56% [UNK]), so --hangul_coverage=ksx1001 reserves the 2,350 syllables of KS X 1001 as "가" and
"##가" (4,700 pieces, counted in --vocab_size; the learned pieces fill the rest), as
SentencePiece's character_coverage does for characters. Default (auto): on for a cased
WordPiece vocab of a Hangul-heavy corpus (Hangul at least half the letters), off otherwise.

Casing: --lower_case unset = from the corpus' script mix: cased when Hangul/CJK/kana make up at
least half the letters (uncased NFD splits every Hangul syllable into jamo), else uncased as
BERT's English models. The choice, its reason, the script shares, the sample and the
pre-tokenizer go to `<output>.meta.json` (vocab.py), which every later tool reads.
"""

import collections
import dataclasses
import hashlib
import io
import os
import random
import re
import sys
import time

from absl import flags

from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax_core import text_files
from data_pipelines.tokenizers import pretokenize
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import tokenizer_json
from data_pipelines.tokenizers import vocab as vocab_lib
from data_pipelines.tokenizers import vocab_mixture
from bert_jax_core.tf_setup import tf

_LINES_PER_BATCH = 4096  # lines per in-graph basic-tokenization call
HANGUL_COVERAGE = ("auto", "ksx1001", "none")
# With the syllables reserved, at least this many slots must be left for learned pieces
# (multi-syllable pieces, words of other scripts); fewer and the vocab is mostly a syllable table.
# The walk-through's 120 KB corpus fills ~2,200 slots beyond them at a count threshold of 1.
MIN_LEARNED_PIECES = 1000


class BuildVocabError(errors.UserError):
  """A bad flag or input; the message is one line that says what to fix."""


def reserved_tokens(num_unused=0):
  return (["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)]
          + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def ksx1001_syllables():
  """The 2,350 modern Hangul syllables of KS X 1001, in code point order ("가" .. "힝").

  KS X 1001, the Korean national character set (EUC-KR's 2-byte plane), gives 2,350 of the
  11,172 possible syllables U+AC00..U+D7A3 a code of their own: the ones in common use. Python's
  euc_kr codec writes those as 2 bytes and the other 8,822 (뷁, 햏, 똠) as 8-byte jamo make-up
  sequences (KS X 1001 annex 3), so the encoded length picks them out. Measured on all Korean
  text of the konlpy 0.6.0 wheel (constitution + 10 bills): 36,038 syllables, 445 distinct, every
  one of them in this set (100%).
  """
  return [ch for ch in map(chr, range(0xAC00, 0xD7A4)) if len(ch.encode("euc_kr")) == 2]


def hangul_pieces():
  """The reserved WordPiece tokens of --hangul_coverage=ksx1001: "가".."힝" then "##가".."##힝"."""
  syllables = ksx1001_syllables()
  return syllables + ["##" + s for s in syllables]


def corpus_paths(input_file):
  """Comma-separated globs -> sorted matching paths; BuildVocabError when one matches nothing."""
  patterns = [p for p in input_file.split(",") if p.strip()]
  if not patterns:
    raise BuildVocabError("--input_file is empty: pass a glob of text files, e.g. "
                          "--input_file='data/corpus/*.txt'.")
  paths = []
  for pattern in patterns:
    matched = sorted(tf.io.gfile.glob(pattern.strip()))
    if not matched:
      raise BuildVocabError(f"--input_file={pattern}: no file matches; check the path or "
                            "build a corpus with `python -m data_pipelines.stdlib_corpus`.")
    paths.extend(matched)
  return check_text_files(paths, f"--input_file={input_file}")


def check_text_files(paths, flag):
  """`paths`, once each is known to be a file of UTF-8 text (its first block:
  text_files.not_text, the rule create_pretraining_data and the task readers apply too)."""
  for path in paths:
    if tf.io.gfile.isdir(path):
      raise BuildVocabError(f"{flag}: {path} is a directory; pass text files or a glob of them "
                            "(e.g. 'corpus/*.txt').")
    why = text_files.check(path)
    if why:
      raise BuildVocabError(f"{flag}: {why}")
  return paths


def iter_lines(paths):
  """Yields the non-empty lines of the files, streaming (one line in memory at a time). A stray
  invalid byte past the first block (which check_text_files sniffed) is refused too: a
  vocabulary is learned from every byte."""
  for path in paths:
    offset = 0
    with tf.io.gfile.GFile(path, "rb") as f:
      for number, raw in enumerate(f, 1):
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise BuildVocabError(
              f"--input_file: {path} is not UTF-8 text (invalid byte 0x{raw[e.start]:02x} at "
              f"byte {offset + e.start}, line {number}); convert it, e.g. "
              "`iconv -f latin1 -t utf-8`.") from e
        offset += len(raw)
        line = line.rstrip("\r\n")
        if number == 1:
          line = text_files.strip_bom(line)
        if line.strip():
          yield line


@dataclasses.dataclass
class Sample:
  lines: list  # every non-empty line, or a uniform sample of input_sentence_size of them
  seen: int  # non-empty lines read


def sample_lines(lines, input_sentence_size=0, seed=0):
  """All lines, or a uniform sample of `input_sentence_size` (reservoir sampling, Algorithm R).

  Memory is the sample; the result depends only on the lines, their order, the size and seed.
  """
  if input_sentence_size <= 0:
    kept = list(lines)
    return Sample(kept, len(kept))
  rng = random.Random(seed)
  reservoir, seen = [], 0
  for line in lines:
    if len(reservoir) < input_sentence_size:
      reservoir.append(line)
    else:
      j = rng.randrange(seen + 1)
      if j < input_sentence_size:
        reservoir[j] = line
    seen += 1
  return Sample(reservoir, seen)


def read_corpus(input_file, input_sentence_size=0, seed=0):
  """(paths, lines): the non-empty lines (or a sample of them). BuildVocabError on bad input."""
  paths = corpus_paths(input_file)
  sample = sample_lines(iter_lines(paths), input_sentence_size, seed)
  if not sample.lines:
    raise BuildVocabError(f"--input_file={input_file}: the {len(paths)} matching file(s) hold "
                          "no text (only blank lines); a vocab needs a non-empty corpus.")
  return paths, sample.lines


def _batches(lines, size=_LINES_PER_BATCH):
  batch = []
  for line in lines:
    batch.append(line)
    if len(batch) == size:
      yield batch
      batch = []
  if batch:
    yield batch


def count_words(lines, lower_case, pretokenizer=None):
  """Word -> count, with the words that tokenization.basic_tokenize produces (streaming)."""
  counts = collections.Counter()
  for batch in _batches(lines):
    if pretokenizer is not None:
      batch = pretokenizer(batch)
    batch = tf.constant([l.encode("utf-8") for l in batch])
    counts.update(tokenization.basic_tokenize(batch, lower_case).flat_values.numpy().tolist())
  return {w.decode("utf-8"): c for w, c in counts.items()}


def learn_wordpiece(word_counts, vocab_size, reserved, num_iterations=4, always=()):
  """tf_text's WordPiece learner with a galloping search for the count threshold.

  `always`: pieces the vocab must hold whatever the corpus (the Hangul syllables of
  --hangul_coverage). They go to the learner as reserved tokens after the specials, so every
  candidate vocab it builds holds them and counts them against vocab_size; a learned piece equal
  to one of them is not listed twice. Words are still counted as they are (a one-syllable word
  "가" is not dropped as the learner drops reserved words).

  The library's own `learn` bisects thresholds between 10 and the top word count (~13 learner
  runs of ~1 s each on a 1 MB corpus) and never goes under a threshold of 10, which caps a 1 MB
  corpus at ~2,400 tokens. A vocab shrinks as the threshold grows, and small corpora need
  thresholds of 1-5, so trying 1, 2, 4, ... and bisecting the last gap takes 3-5 runs.
  """
  from tensorflow_text.tools.wordpiece_vocab import (  # pylint: disable=g-import-not-at-top
      wordpiece_tokenizer_learner_lib as learner)
  params = learner.Params(
      upper_thresh=None, lower_thresh=1, num_iterations=num_iterations, max_input_tokens=-1,
      max_token_length=50, max_unique_chars=1000, vocab_size=vocab_size, slack_ratio=0.05,
      include_joiner_token=True, joiner="##", reserved_tokens=list(reserved) + list(always))
  words = learner.get_input_words(word_counts.items(), reserved, params.max_token_length)
  words = learner.filter_input_words(
      words, learner.get_allowed_chars(words, params.max_unique_chars), -1)
  if not words:
    raise BuildVocabError("the corpus has no word of at most 50 characters to learn from.")
  chars = learner.extract_char_tokens(words)
  smallest = learner.generate_final_vocabulary(
      params.reserved_tokens, chars, learner.ensure_all_tokens_exist(chars, {}, True, "##"))
  if always and len(smallest) + MIN_LEARNED_PIECES > vocab_size:
    others = len(smallest) - len(reserved) - len(always)
    raise BuildVocabError(
        f"--vocab_size={vocab_size} is too small for --hangul_coverage=ksx1001: "
        f"{len(reserved)} special + {len(always):,} reserved syllable pieces + {others:,} other "
        f"character pieces + {MIN_LEARNED_PIECES:,} learned pieces need "
        f"{len(smallest) + MIN_LEARNED_PIECES:,}; raise --vocab_size (e.g. 8000) or pass "
        "--hangul_coverage=none.")
  if len(smallest) > vocab_size:
    raise BuildVocabError(
        f"--vocab_size={vocab_size} is too small: the {len(reserved)} reserved tokens and "
        f"{len(chars)} characters (each also as ##char) need {len(smallest)}; raise --vocab_size.")
  tried = {}

  def size(thresh):
    if thresh not in tried:
      tried[thresh] = learner.learn_with_thresh(words, thresh, params)
    return len(tried[thresh])

  def good_enough(thresh):
    return vocab_size - size(thresh) <= params.slack_ratio * vocab_size

  lo, hi = 0, 1  # size(lo) > vocab_size (0 = not tried); find the smallest fitting threshold
  # Terminates: past the total count only `smallest` is left, and it fits (checked above).
  while size(hi) > vocab_size:
    lo, hi = hi, hi * 2
  while hi - lo > 1 and not good_enough(hi):
    mid = (lo + hi) // 2
    if size(mid) > vocab_size:
      lo = mid
    else:
      hi = mid
  return tried[hi]


@dataclasses.dataclass(frozen=True)
class SentencePieceOptions:
  model_type: str = "unigram"  # or "bpe"
  # Share of the corpus' characters the model must cover; the rest become [UNK] (or bytes with
  # byte_fallback). sentencepiece recommends 0.9995 for CJK/Korean, 1.0 for small alphabets.
  character_coverage: float = 0.9995
  byte_fallback: bool = False  # rare characters -> <0x00>..<0xFF> pieces instead of [UNK]


def train_sentencepiece(lines, vocab_size, lower_case, options=SentencePieceOptions()):
  """Returns the serialized model proto."""
  import sentencepiece as spm  # pylint: disable=g-import-not-at-top
  model = io.BytesIO()
  try:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=model, vocab_size=vocab_size,
        model_type=options.model_type, pad_id=0, pad_piece="[PAD]", unk_id=1,
        unk_piece="[UNK]", bos_id=-1, eos_id=-1, user_defined_symbols=["[CLS]", "[SEP]", "[MASK]"],
        normalization_rule_name="nmt_nfkc_cf" if lower_case else "nmt_nfkc",
        character_coverage=options.character_coverage, byte_fallback=options.byte_fallback,
        # The lines are already the sample (sample_lines); sentencepiece must not re-sample.
        input_sentence_size=0, shuffle_input_sentence=False,
        num_threads=os.cpu_count() or 1, minloglevel=2)
  except RuntimeError as e:
    # "INTERNAL: src/trainer_interface.cc(744) [...] Vocabulary size too high (40000). Please
    # set it to a value <= 7356." -> keep the sentence after the source location.
    msg = re.sub(r"^.*?\) \[.*?\] ", "", str(e).strip().splitlines()[-1])
    raise BuildVocabError(f"--vocab_size={vocab_size} with --model_type={options.model_type}: "
                          f"sentencepiece refused ({msg}); change --vocab_size.") from e
  return model.getvalue()


def check_writable(output, overwrite=True):
  """Fails before learning anything (minutes on a large corpus) if `output` cannot be written:
  the one output check (bert_jax_core.files.check_output_file); missing parent directories are
  allowed, write_atomic creates them. The program refuses an existing vocabulary or its
  <output>.meta.json unless --overwrite (main); build() writes where its caller says."""
  files_lib.check_output_file(output, "--output", make_parents=True, overwrite=overwrite)
  files_lib.check_output_file(vocab_lib.meta_path(output), "--output's settings",
                              make_parents=True, overwrite=overwrite)


def choose_casing(lower_case, shares):
  """(lower_case, reason): the flag when given, else cased for Hangul/CJK-heavy corpora."""
  if lower_case is not None:
    return bool(lower_case), "--lower_case" if lower_case else "--nolower_case"
  mix = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v >= 0.005)
  if pretokenize.is_cjk_heavy(shares):
    return False, f"default: cased for a Hangul/CJK-heavy corpus ({mix} of letters)"
  return True, f"default: uncased as BERT's English models ({mix or 'no'} letters)"


def choose_byte_level(byte_level, model_type, shares):
  """(byte_level, reason) for a tokenizer.json: the flag, else bytes for BPE on a corpus that is
  not Hangul/CJK-heavy (ModernBERT's kind) and whole characters otherwise."""
  if byte_level is not None:
    if byte_level and model_type != "bpe":
      raise BuildVocabError(f"--byte_level with --model_type={model_type}: byte-level is a BPE "
                            "alphabet (ModernBERT's); pass --model_type=bpe or --nobyte_level.")
    return bool(byte_level), "--byte_level" if byte_level else "--nobyte_level"
  if model_type != "bpe":
    return False, f"default: characters for --model_type={model_type}"
  mix = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if v >= 0.005)
  if pretokenize.is_cjk_heavy(shares):
    return False, (f"default: whole characters for a Hangul/CJK-heavy corpus ({mix} of letters): "
                   "byte-level BPE would cut syllables into UTF-8 bytes")
  return True, f"default: byte-level as ModernBERT's ({mix or 'no'} letters)"


def choose_hangul_coverage(mode, shares, lower_case, model_type, alphabet=None):
  """(mode, reason): "ksx1001" or "none", from --hangul_coverage (auto = from the script mix).

  alphabet: None for vocab.txt / .model, "bytes" or "characters" for a tokenizer.json (whose
  Lowercase normalizer, unlike BERT's NFD, keeps syllables whole).
  """
  if mode not in HANGUL_COVERAGE:
    raise BuildVocabError(f"--hangul_coverage={mode}: expected auto, ksx1001 or none.")
  hangul = f"hangul {shares.get('hangul', 0):.0%} of letters"
  if alphabet == "bytes":
    if mode == "ksx1001":
      raise BuildVocabError("--hangul_coverage=ksx1001 with a byte-level tokenizer.json: its "
                            "alphabet is the 256 bytes, so no syllable is ever [UNK] (but each "
                            "can be cut into bytes); pass --nobyte_level to keep syllables whole.")
    return "none", "byte-level: every syllable is covered as UTF-8 bytes"
  if alphabet == "characters":
    if mode != "auto":
      return mode, f"--hangul_coverage={mode}"
    if shares.get("hangul", 0) < pretokenize.CJK_HEAVY:
      return "none", f"default: off, not a Hangul-heavy corpus ({hangul})"
    return "ksx1001", f"default: on for a Hangul-heavy corpus ({hangul})"
  if mode == "ksx1001":
    if model_type != "wordpiece":
      raise BuildVocabError(
          f"--hangul_coverage=ksx1001 is for WordPiece, not --model_type={model_type}; "
          "SentencePiece covers rare syllables with --character_coverage=1.0 or --byte_fallback.")
    if lower_case:
      raise BuildVocabError("--hangul_coverage=ksx1001 with --lower_case: uncased NFD splits "
                            "every syllable into jamo, so no syllable piece could ever match; "
                            "pass --nolower_case or --hangul_coverage=none.")
    return mode, "--hangul_coverage=ksx1001"
  if mode == "none":
    return mode, "--hangul_coverage=none"
  if model_type != "wordpiece":
    return "none", "default: off for SentencePiece (see --character_coverage)"
  if shares.get("hangul", 0) < pretokenize.CJK_HEAVY:
    return "none", f"default: off, not a Hangul-heavy corpus ({hangul})"
  if lower_case:
    return "none", "default: off for an uncased vocab (its syllables become jamo)"
  return "ksx1001", f"default: on for a Hangul-heavy corpus ({hangul})"


def _warn_jamo(shares, lower_case, model_type):
  # Uncased WordPiece = NFD: every Hangul syllable becomes 2-3 jamo (SentencePiece's NFKC keeps
  # them whole). Said once, with the fix.
  if lower_case and model_type == "wordpiece" and shares.get("hangul", 0) > 0:
    print(f"build_vocab: warning: --lower_case splits every Hangul syllable into jamo "
          f"({shares['hangul']:.1%} of the letters are Hangul); pass --nolower_case to keep "
          "them whole.", file=sys.stderr)


def _check_json_flags(output, model_type, byte_level, character_coverage, byte_fallback):
  """One-line errors for flags that do not go with the output's kind; True for a tokenizer.json."""
  if not output.endswith(".json"):
    if byte_level is not None:
      raise BuildVocabError(f"--[no]byte_level is for a tokenizer.json output, not {output}; "
                            "pass --output=PATH.json.")
    return False
  if model_type == "wordpiece":
    raise BuildVocabError(f"--output={output} is a tokenizer.json: pass --model_type=bpe "
                          "(byte-level, ModernBERT's) or unigram; WordPiece writes a vocab.txt.")
  if byte_fallback or character_coverage != SentencePieceOptions.character_coverage:
    raise BuildVocabError("--byte_fallback and --character_coverage are SentencePiece options; "
                          f"a tokenizer.json ({output}) keeps every character it sees, and "
                          "--byte_level covers every byte.")
  return True


def build(input_file, vocab_size, output, lower_case=None, model_type="wordpiece",
          num_unused=0, input_sentence_size=0, seed=0, character_coverage=0.9995,
          byte_fallback=False, pretokenizer="none", hangul_coverage="auto", byte_level=None,
          input_sources="", source_tau=1.0):
  """Learns and writes the vocabulary and its .meta.json; returns (tokens, input files, meta).

  An output ending in .json is a Hugging Face tokenizer.json (byte_level: None = from the
  corpus, choose_byte_level). Every flag is checked before the corpus is read past its first
  ~4M characters (the script mix that the defaults come from). input_sources (instead of
  input_file): 'NAME=GLOB;NAME=GLOB', lines drawn in shares ~ lines^source_tau (vocab_mixture).
  """
  sources = _check_sources(input_file, input_sources, source_tau)
  is_json = _check_options(output, model_type, byte_level, character_coverage, byte_fallback,
                           input_sentence_size)
  pre = pretokenize.get_pretokenizer(pretokenizer)
  reserved = reserved_tokens(num_unused if model_type == "wordpiece" else 0)
  if vocab_size <= len(reserved):
    raise BuildVocabError(f"--vocab_size={vocab_size} is too small: the {len(reserved)} "
                          "special tokens alone fill it; use thousands (BERT uses 30522).")
  paths = ([p for _, ps in sources for p in ps] if sources else corpus_paths(input_file))
  shares = pretokenize.script_shares(iter_lines(paths))  # first ~4M characters
  byte_level, alphabet, alphabet_reason = _choose_alphabet(is_json, byte_level, model_type,
                                                           shares, vocab_size, reserved)
  if is_json and lower_case is None:  # ModernBERT, RoBERTa and GPT-2 are cased
    lower_case, reason = False, "default: cased as ModernBERT's tokenizer.json"
  else:
    lower_case, reason = choose_casing(lower_case, shares)
  _warn_jamo(shares, lower_case, model_type)
  coverage, coverage_reason, always = _hangul_pieces(hangul_coverage, shares, lower_case,
                                                     model_type, alphabet, vocab_size, reserved)
  if sources:
    sample, mixture = _read_mixture(sources, source_tau, input_sentence_size, seed)
    counts = count_words(sample.lines, lower_case, pre) if model_type == "wordpiece" else None
  else:
    sample, counts = _read_corpus(paths, input_file, model_type, input_sentence_size, seed,
                                  lower_case, pre)
  if is_json:
    text, size = tokenizer_json.learn(_pretokenized(sample.lines, pre), vocab_size,
                                      model_type=model_type, byte_level=byte_level,
                                      lower_case=lower_case, initial_alphabet=always)
    data, kind_meta = text.encode("utf-8"), {"tokenizer_json": {
        "model_type": model_type, "alphabet": alphabet, "alphabet_reason": alphabet_reason,
        "byte_fallback": model_type == "bpe" and not byte_level}}  # tokenizer_json.learn
    normalization = "nfc_lowercase" if lower_case else "nfc"
  elif model_type != "wordpiece":
    options = SentencePieceOptions(model_type, character_coverage, byte_fallback)
    data = train_sentencepiece(_pretokenized(sample.lines, pre), vocab_size, lower_case, options)
    size, kind_meta = vocab_size, {"sentencepiece": dataclasses.asdict(options)}
    normalization = "nmt_nfkc_cf" if lower_case else "nmt_nfkc"
  else:
    vocab = learn_wordpiece(counts, vocab_size, reserved, always=always)
    data, size, kind_meta = ("\n".join(vocab) + "\n").encode("utf-8"), len(vocab), {}
    normalization = "bert_uncased" if lower_case else "bert_cased"
  meta = {
      "vocab_kind": "tokenizer_json" if is_json else
                    "wordpiece" if model_type == "wordpiece" else "sentencepiece",
      "do_lower_case": lower_case, "casing_reason": reason, "normalization": normalization,
      "pretokenizer": pretokenizer or "none", "scripts": shares,
      "hangul_coverage": coverage, "hangul_coverage_reason": coverage_reason,
      "sample": {"input_sentence_size": input_sentence_size, "seed": seed,
                 "sentences_seen": sample.seen,
                 "sentences_used": sample.seen if sample.lines is None else len(sample.lines)},
      "vocab_size": size, "vocab_sha256": hashlib.sha256(data).hexdigest(),
      "input_files": len(paths), "created_by": "data_pipelines.build_vocab", **kind_meta,
  }
  if sources:
    meta["mixture"] = {"tau": source_tau, "sources": mixture}
  files_lib.write_atomic(output, data)
  vocab_lib.write_settings(output, meta)
  return size, len(paths), meta


def _check_options(output, model_type, byte_level, character_coverage, byte_fallback,
                   input_sentence_size):
  """build's flag checks that need no corpus, in the order a user fixes them; returns whether
  the output is a tokenizer.json."""
  if model_type not in ("wordpiece", "unigram", "bpe"):
    raise BuildVocabError(f"--model_type={model_type}: expected wordpiece, unigram or bpe.")
  if not output:
    raise BuildVocabError("--output is empty: pass the vocab.txt, .model or tokenizer.json path "
                          "to write.")
  is_json = _check_json_flags(output, model_type, byte_level, character_coverage, byte_fallback)
  check_writable(output)
  if not 0.9 <= character_coverage <= 1.0:
    raise BuildVocabError(f"--character_coverage={character_coverage}: expected a share in "
                          "[0.9, 1] (0.9995 for CJK/Korean, 1.0 for small alphabets).")
  if input_sentence_size < 0:
    raise BuildVocabError(f"--input_sentence_size={input_sentence_size}: must be >= 0 "
                          "(0 = every line).")
  return is_json


def _choose_alphabet(is_json, byte_level, model_type, shares, vocab_size, reserved):
  """(byte_level, alphabet "bytes" | "characters", reason) of a tokenizer.json; (byte_level,
  None, None) for a vocab.txt or .model. A byte-level one needs room for its 256 byte pieces."""
  if not is_json:
    return byte_level, None, None
  byte_level, reason = choose_byte_level(byte_level, model_type, shares)
  if model_type == "bpe" and vocab_size < len(reserved) + 256 + MIN_LEARNED_PIECES:
    raise BuildVocabError(  # 256 bytes: the alphabet, or a character BPE's byte fallback
        f"--vocab_size={vocab_size} is too small for a BPE tokenizer.json: "
        f"{len(reserved)} special + 256 byte pieces + {MIN_LEARNED_PIECES:,} learned pieces "
        f"need {len(reserved) + 256 + MIN_LEARNED_PIECES:,} (ModernBERT has 50,368).")
  return byte_level, "bytes" if byte_level else "characters", reason


def _hangul_pieces(hangul_coverage, shares, lower_case, model_type, alphabet, vocab_size,
                   reserved):
  """(coverage, reason, pieces every vocab keeps): with ksx1001 coverage the 2,350 KS X 1001
  syllables (a tokenizer.json's alphabet takes them; WordPiece reserves 가 and ##가), checked
  against --vocab_size here and again after counting, with the corpus' other characters
  (learn_wordpiece)."""
  coverage, reason = choose_hangul_coverage(hangul_coverage, shares, lower_case, model_type,
                                            alphabet)
  if coverage != "ksx1001":
    return coverage, reason, []
  always = ksx1001_syllables() if alphabet else hangul_pieces()
  fallback = 256 if alphabet and model_type == "bpe" else 0  # tokenizer_json's byte pieces
  need = len(reserved) + len(always) + fallback + MIN_LEARNED_PIECES
  if need > vocab_size:
    raise BuildVocabError(
        f"--vocab_size={vocab_size} is too small for --hangul_coverage=ksx1001 ({reason}"
        f"): {len(reserved)} special + {len(always):,} reserved syllable pieces + "
        + (f"{fallback} byte-fallback pieces + " if fallback else "")
        + f"{MIN_LEARNED_PIECES:,} learned pieces need {need:,}; raise --vocab_size (e.g. 8000) "
        "or pass --hangul_coverage=none.")
  return coverage, reason, always


def _read_corpus(paths, input_file, model_type, input_sentence_size, seed, lower_case, pre):
  """(Sample, WordPiece word counts or None). WordPiece over every line streams: memory is the
  word counts, whatever the corpus size (Sample.lines is None); otherwise the lines or a uniform
  sample of input_sentence_size of them are kept."""
  counts = None
  if model_type == "wordpiece" and input_sentence_size == 0:
    sample = Sample(None, 0)

    def counted():
      for line in iter_lines(paths):
        sample.seen += 1
        yield line
    counts = count_words(counted(), lower_case, pre)
  else:
    sample = sample_lines(iter_lines(paths), input_sentence_size, seed)
    if sample.lines and model_type == "wordpiece":
      counts = count_words(sample.lines, lower_case, pre)
  if not sample.seen:
    raise BuildVocabError(f"--input_file={input_file}: the {len(paths)} matching file(s) hold "
                          "no text (only blank lines); a vocab needs a non-empty corpus.")
  return sample, counts


def _check_sources(input_file, input_sources, source_tau):
  """[(name, paths)] of --input_sources, or None for --input_file; one-line errors, checked
  before anything is read."""
  if not input_sources:
    if source_tau != 1.0:
      raise BuildVocabError(f"--source_tau={source_tau:g} without --input_sources: tau sets the "
                            "shares of named corpora; pass --input_sources='en=GLOB;ko=GLOB'.")
    return None
  if input_file:
    raise BuildVocabError("pass --input_file (one pool of text) or --input_sources (named "
                          "corpora drawn in shares ~ size^tau), not both.")
  vocab_mixture.check_tau(source_tau, BuildVocabError)
  out = []
  for name, pattern in vocab_mixture.parse(input_sources, BuildVocabError):
    paths = [p for g in pattern.split(",") if g.strip()
             for p in sorted(tf.io.gfile.glob(g.strip()))]
    if not paths:
      raise BuildVocabError(f"{vocab_mixture.FLAG}: source {name!r} ({pattern}): no file "
                            "matches; check the path.")
    out.append((name, check_text_files(paths, f"{vocab_mixture.FLAG}: source {name!r}")))
  return out


def _read_mixture(sources, tau, input_sentence_size, seed):
  """(Sample of the drawn lines, {name: what it had and gave}); a source whose files hold no
  text is a one-line error."""
  corpora = {}
  for name, paths in sources:
    corpora[name] = list(iter_lines(paths))
    if not corpora[name]:
      raise BuildVocabError(f"{vocab_mixture.FLAG}: source {name!r}: its {len(paths)} file(s) "
                            "hold no text (only blank lines); remove the source or fix its glob.")
  lines, stats = vocab_mixture.draw(corpora, tau, input_sentence_size, seed)
  return Sample(lines, sum(len(c) for c in corpora.values())), stats


def _pretokenized(lines, pre):
  """The lines a SentencePiece or tokenizer.json trainer learns from: as read, or each as the
  pre-tokenizer (mecab, jieba) cuts it, in batches."""
  return lines if pre is None else [l for b in _batches(lines) for l in pre(b)]


FLAGS = flags.FLAGS


def define_flags(flag_values=flags.FLAGS):
  """CLI flags; defined only when run as a program, so importing this module defines none."""
  fv = dict(flag_values=flag_values)
  flags.DEFINE_string("input_file", None, "Glob(s) of UTF-8 text files, comma-separated.", **fv)
  flags.DEFINE_string("input_sources", None, "Instead of --input_file: named corpora, "
                      "'NAME=GLOB[,GLOB];NAME=GLOB' (e.g. one per language), whose lines are "
                      "drawn in shares ~ lines^--source_tau.", **fv)
  flags.DEFINE_float("source_tau", 1.0, "With --input_sources: each corpus' share ~ its "
                     "lines^tau, 0 < tau <= 1 (1 = proportional to size; XLM-R 0.3, mBERT 0.7).",
                     **fv)
  flags.DEFINE_integer("vocab_size", 30522, "Largest vocabulary size (WordPiece may stop short "
                       "when the corpus has fewer useful pieces).", **fv)
  flags.DEFINE_string("output", None, "vocab.txt (wordpiece), .model (SentencePiece unigram/bpe) "
                      "or *.json (a Hugging Face tokenizer.json, bpe/unigram) to write; its "
                      "settings go to <output>.meta.json.", **fv)
  flags.DEFINE_bool("lower_case", None, "Lower-case and strip accents (BERT uncased). Unset: "
                    "cased when Hangul/CJK/kana are half the letters, else uncased.", **fv)
  flags.DEFINE_enum("model_type", "wordpiece", ["wordpiece", "unigram", "bpe"],
                    "WordPiece vocab.txt, or a SentencePiece unigram/BPE model.", **fv)
  flags.DEFINE_integer("num_unused", 0, "WordPiece only: [unused0..N-1] tokens after [PAD], "
                       "free slots for tokens added at fine-tuning time (BERT has 994).", **fv)
  flags.DEFINE_integer("input_sentence_size", 0, "Learn from a uniform sample of this many "
                       "lines (0 = all); for corpora larger than memory.", **fv)
  flags.DEFINE_integer("seed", 0, "Seed of the line sample (--input_sentence_size).", **fv)
  flags.DEFINE_float("character_coverage", 0.9995, "SentencePiece: share of characters "
                     "covered (0.9995 for CJK/Korean, 1.0 for small alphabets).", **fv)
  flags.DEFINE_bool("byte_fallback", False, "SentencePiece: rare characters become UTF-8 byte "
                    "pieces instead of [UNK].", **fv)
  flags.DEFINE_enum("hangul_coverage", "auto", list(HANGUL_COVERAGE), "WordPiece: reserve the "
                    "2,350 KS X 1001 Hangul syllables as 가 and ##가 (4,700 pieces of "
                    "--vocab_size) so no common syllable makes a word [UNK]. auto: on for a "
                    "cased vocab of a Hangul-heavy corpus.", **fv)
  flags.DEFINE_bool("byte_level", None, "tokenizer.json BPE: the 256-byte alphabet of "
                    "ModernBERT (never [UNK], but Hangul syllables are cut into bytes). Unset: "
                    "byte-level unless Hangul/CJK/kana are half the letters.", **fv)
  flags.DEFINE_enum("pretokenizer", "none", list(vocab_lib.PRETOKENIZERS), "Split text before "
                    "learning (mecab: Korean morphemes); recorded so every tool applies it.", **fv)
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output and its "
                    "<output>.meta.json (without it: refused, before any work).", **fv)


def main(argv):
  del argv
  start = time.time()
  if FLAGS.output and not FLAGS.overwrite:   # the program's rule; build() writes where told
    check_writable(FLAGS.output, overwrite=False)
  try:
    size, num_files, meta = build(
        FLAGS.input_file or "", FLAGS.vocab_size, FLAGS.output or "", FLAGS.lower_case,
        FLAGS.model_type, FLAGS.num_unused, FLAGS.input_sentence_size, FLAGS.seed,
        FLAGS.character_coverage, FLAGS.byte_fallback, FLAGS.pretokenizer,
        FLAGS.hangul_coverage, FLAGS.byte_level, FLAGS.input_sources or "", FLAGS.source_tau)
  except tf.errors.OpError as e:
    raise BuildVocabError(f"--input_file={FLAGS.input_file}: {str(e).splitlines()[0]}") from e
  sample = meta["sample"]
  print(f"wrote {FLAGS.output}: {FLAGS.model_type} vocabulary of {size} tokens from "
        f"{num_files} file(s) ({sample['sentences_used']:,} of {sample['sentences_seen']:,} "
        f"lines) in {time.time() - start:.1f} s; do_lower_case={meta['do_lower_case']} "
        f"({meta['casing_reason']}); hangul_coverage={meta['hangul_coverage']} "
        f"({meta['hangul_coverage_reason']})"
        + (f"; alphabet={meta['tokenizer_json']['alphabet']} "
           f"({meta['tokenizer_json']['alphabet_reason']})" if "tokenizer_json" in meta else "")
        + f"; settings in {vocab_lib.meta_path(FLAGS.output)}")
  if "mixture" in meta:   # e.g. "en 62.1% (x0.41), ko 20.3% (x3.95)": share, times each line seen
    print(f"sources (lines^{meta['mixture']['tau']:g}): " + ", ".join(
        f"{n} {s['share']:.1%} of the lines drawn ({s['drawn']:,} from {s['lines']:,}, "
        f"x{s['times_seen']:.2f})" for n, s in meta["mixture"]["sources"].items()))


if __name__ == "__main__":
  define_flags()
  errors.run(main)
