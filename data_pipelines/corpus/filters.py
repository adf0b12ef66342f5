"""Document filters for web corpora: exact duplicates, minimum length, script. Off by default.

The paper's recipe (BooksCorpus + Wikipedia) filters nothing, so neither does the default; users
of crawled text usually want:
  * `--dedup_documents`: drop documents whose sentences (after whitespace normalisation) equal an
    earlier document's; "earlier" is in input order (source index, then position), so the kept
    copy is the same in the local and the Beam path. Keyed by a 16-byte blake2b digest: a
    collision among 10^9 documents has probability ~10^-21.
  * `--min_document_tokens=N`: drop documents with fewer than N tokens (after tokenization; a
    one-line boilerplate page makes only NotNext pairs).
  * `--keep_scripts=Latin,Han`: keep a document only if at least `--min_script_fraction` (0.5)
    of its letters are in the listed Unicode scripts. A script, not a language: a language
    identifier needs a model file (e.g. fastText lid.176, 126 MB), which this project does not
    download; the script separates e.g. English from Chinese or Russian but not from French.
Each drop is counted (`filtered_*` in dataset_info.json and the summary).
"""

import dataclasses
import functools
import hashlib
import unicodedata

from bert_jax_core import errors


class FilterError(errors.UserError):
  """A bad filter flag."""


@dataclasses.dataclass(frozen=True)
class FilterConfig:
  dedup_documents: bool = False
  min_document_tokens: int = 0
  keep_scripts: str = ""  # comma-separated script names, e.g. "Latin,Cyrillic"; "" = all
  min_script_fraction: float = 0.5

  @property
  def enabled(self):
    return self.dedup_documents or self.min_document_tokens > 0 or bool(self.keep_scripts)


# Script of a letter = the first word of its Unicode name ("LATIN SMALL LETTER A" -> LATIN);
# CJK ideographs are named "CJK UNIFIED IDEOGRAPH-4E00", so "Han" maps to CJK.
_SCRIPT_ALIASES = {"HAN": "CJK"}
KNOWN_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARABIC", "HEBREW", "DEVANAGARI", "BENGALI",
                 "TAMIL", "THAI", "HANGUL", "HIRAGANA", "KATAKANA", "CJK", "ARMENIAN", "GEORGIAN",
                 "ETHIOPIC", "TELUGU", "KANNADA", "MALAYALAM", "GUJARATI", "GURMUKHI", "SINHALA",
                 "KHMER", "LAO", "MYANMAR", "TIBETAN")


def parse_scripts(keep_scripts):
  """'Latin,Han' -> frozenset({'LATIN', 'CJK'}); unknown names are a one-line error."""
  names = set()
  for raw in keep_scripts.split(","):
    name = raw.strip().upper()
    if not name:
      continue
    name = _SCRIPT_ALIASES.get(name, name)
    if name not in KNOWN_SCRIPTS:
      raise FilterError(f"--keep_scripts={keep_scripts}: unknown script {raw.strip()!r}; "
                        f"expected some of {', '.join(s.title() for s in KNOWN_SCRIPTS if s != 'CJK')}, Han.")
    names.add(name)
  return frozenset(names)


def validate(cfg):
  if cfg.min_document_tokens < 0:
    raise FilterError(f"--min_document_tokens={cfg.min_document_tokens}: must be >= 0.")
  if not 0.0 < cfg.min_script_fraction <= 1.0:
    raise FilterError(f"--min_script_fraction={cfg.min_script_fraction}: expected a fraction "
                      "in (0, 1].")
  parse_scripts(cfg.keep_scripts)


@functools.lru_cache(maxsize=1 << 16)
def _script(ch):
  name = unicodedata.name(ch, "")
  return name.split(" ", 1)[0] if name else ""


def script_fraction(sentences, scripts):
  """Fraction of the letters (Unicode category L*) of `sentences` whose script is in `scripts`;
  1.0 for text without letters (numbers, punctuation: nothing to judge)."""
  letters = inside = 0
  for sentence in sentences:
    for ch in sentence:
      if ch.isalpha():
        letters += 1
        inside += _script(ch) in scripts
  return inside / letters if letters else 1.0


def document_digest(sentences):
  """16-byte digest of a document's whitespace-normalised sentences (the dedup key)."""
  h = hashlib.blake2b(digest_size=16)
  for sentence in sentences:
    h.update(" ".join(sentence.split()).encode("utf-8"))
    h.update(b"\n")
  return h.digest()


def keep_text(sentences, cfg, scripts, counts):
  """The per-document text filter (script); dedup needs the whole corpus, see
  `first_occurrences`. `counts` has the filtered_* fields of create_pretraining_data.Stats."""
  if scripts and script_fraction(sentences, scripts) < cfg.min_script_fraction:
    counts.filtered_script += 1
    return False
  return True


def keep_tokens(token_sentences, cfg, counts):
  """The per-document length filter, on token ids."""
  if cfg.min_document_tokens and sum(map(len, token_sentences)) < cfg.min_document_tokens:
    counts.filtered_short += 1
    return False
  return True


def first_occurrences(keyed_digests):
  """[(order key, digest)] -> the set of order keys that are the first of their digest."""
  first = {}
  for order, digest in keyed_digests:
    if digest not in first or order < first[digest]:
      first[digest] = order
  return set(first.values())
