"""Script detection and optional pre-tokenization hooks that run before WordPiece/SentencePiece.

Script mix: `script_shares(lines)` counts letters per script (Hangul, CJK ideographs, kana,
Latin, other) so that build_vocab can default to a cased vocab for Hangul/CJK-heavy corpora and
create_pretraining_data can pick a sentence segmenter.

Pre-tokenizers (recorded as `pretokenizer` in the vocab's .meta.json, so training and inference
apply the same one; `tokenization.get_tokenizer` applies it inside `encode`):
  none   the text as is.
  mecab  Korean morphemes from Mecab (`python-mecab-ko` with its packaged mecab-ko-dic), joined
         by spaces before WordPiece, as KLUE-BERT does: "대한민국은" -> "대한민국 은".
  jieba  Chinese words from jieba (its bundled dictionary, HMM off so the output depends only on
         the dictionary), joined by spaces. BERT already splits every ideograph, so this changes
         only mixed-script text; it is the word-boundary source for Chinese whole-word masking.
"""

import functools
import re

from bert_jax_core import errors

# Letter classes (RE2/Python syntax); CJK ranges are BERT's (bert_chars.CJK) plus compatibility.
_SCRIPTS = {
    "hangul": "\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\uac00-\ud7a3\ud7b0-\ud7ff",
    "cjk": "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002ffff",
    "kana": "\u3040-\u30ff\u31f0-\u31ff\uff66-\uff9f",
    "latin": "A-Za-z\u00c0-\u024f\u1e00-\u1eff",
}
_SCRIPT_RE = {name: re.compile(f"[{cls}]") for name, cls in _SCRIPTS.items()}
_LETTER_RE = re.compile(r"[^\W\d_]")
# Hangul + CJK + kana at or above this share of the letters = a cased default and a CJK/Korean
# segmenter. Korean text with English terms (konlpy's kobill) is ~0.97 Hangul; English
# Wikipedia with the odd Chinese name well under 0.01.
CJK_HEAVY = 0.5
SAMPLE_CHARS = 4_000_000  # letters counted at most (~1 s): enough to tell the mix apart


class PretokenizeError(errors.UserError):
  """An unknown pre-tokenizer, or its package is not installed."""


def script_shares(lines, max_chars=SAMPLE_CHARS):
  """Iterable of str -> {script: share of letters} over the first `max_chars` characters.

  The shares of hangul, cjk, kana, latin and other sum to 1 (all 0 when there is no letter).
  """
  counts = dict.fromkeys(_SCRIPTS, 0)
  letters = seen = 0
  for line in lines:
    letters += len(_LETTER_RE.findall(line))
    for name, rx in _SCRIPT_RE.items():
      counts[name] += len(rx.findall(line))
    seen += len(line)
    if seen >= max_chars:
      break
  counts["other"] = max(0, letters - sum(counts.values()))
  total = max(1, letters, sum(counts.values()))
  return {k: round(v / total, 4) for k, v in counts.items()} if letters else \
      dict.fromkeys(counts, 0.0)


def is_cjk_heavy(shares):
  return shares.get("hangul", 0) + shares.get("cjk", 0) + shares.get("kana", 0) >= CJK_HEAVY


def has_hangul(text):
  return bool(_SCRIPT_RE["hangul"].search(text))


def _require(module, package):
  try:
    return __import__(module)
  except ImportError as e:
    raise PretokenizeError(f"--pretokenizer needs the {package} package ({e}); "
                           f"pip install {package} (pinned in requirements.txt).") from None


@functools.lru_cache(maxsize=None)
def _mecab():
  mecab = _require("mecab", "python-mecab-ko")
  return mecab.MeCab()  # packaged mecab-ko-dic (python-mecab-ko-dic), no system install


@functools.lru_cache(maxsize=None)
def _jieba():
  jieba = _require("jieba", "jieba")
  jieba.setLogLevel(60)  # its "Building prefix dict" chatter goes to stderr at INFO
  tok = jieba.Tokenizer()
  tok.initialize()
  return tok


def _mecab_line(line):
  return " ".join(_mecab().morphs(line)) if line.strip() else line


def _jieba_line(line):
  return " ".join(w for w in _jieba().cut(line, HMM=False) if w.strip())


def get_pretokenizer(name):
  """Name -> function list[str] -> list[str] (None for "none")."""
  if name in (None, "", "none"):
    return None
  if name == "mecab":
    _mecab()  # fail now (missing package) rather than in a worker
    return lambda texts: [_mecab_line(t) for t in texts]
  if name == "jieba":
    _jieba()
    return lambda texts: [_jieba_line(t) for t in texts]
  raise PretokenizeError(f"--pretokenizer={name}: expected none, mecab or jieba.")


def jieba_words(text):
  """Chinese words of `text` (jieba, HMM off): the boundaries for whole-word masking."""
  return [w for w in _jieba().cut(text, HMM=False) if w.strip()]
