"""Inputs of create_pretraining_data: text/JSONL globs or a TFDS split -> documents.

A *source* is one input file, or one of `--tfds_num_parts` even parts of a TFDS split; each is read
by one worker, in order, and seeds its own random streams, so sources fix the output whatever
the number of workers. A *document* is a list of sentence strings.

  text:  google-research/bert's format: one sentence per line, blank lines between documents.
  jsonl: one JSON object per line, the document text in a string field; split into sentences
         by `split_sentences` (--sentence_splitter).
  tfds:  a prepared TFDS dataset (never downloaded), its text feature split the same way.

Sentence splitters (`--sentence_splitter`; a line break always ends a sentence, so text that is
already one sentence per line stays as is). Measured on paragraphs (each document's lines joined)
by docs/non_english.md's command, on the shared 2-core box:
  regex  `split_sentences_regex`: . ! ? then whitespace then a capital, digit, quote or
         bracket (~1.2-1.4 MB/s). Korean sentences end "...한다. 최근" with no capital: konlpy's
         21 documents give 183 sentences (8.7 per document).
  kss    Korean: kss 6 (Korean Sentence Splitter) on Mecab morphemes (python-mecab-ko's packaged
         dictionary, no download): 657 sentences (31.3 per document), ~15 KB/s per worker.
  pysbd  pySBD's rule-based segmenter, language from the script (en, zh, ja), ~20 KB/s. On 300
         English stdlib docstrings: 1,668 sentences (5.6 per document) against the regex's 1,435
         (4.8): it also ends sentences before a lower-case word ("... value. foo() returns").
  auto   per document, from its letters: Hangul-heavy -> kss, CJK/kana-heavy -> pysbd (zh/ja),
         otherwise the regex (60x faster than pySBD, and google-research/bert's input is one
         sentence per line anyway); pass --sentence_splitter=pysbd for English prose.
"""

import contextlib
import dataclasses
import functools
import io
import json
import re

from bert_jax_core import errors
from bert_jax_core import text_files
from data_pipelines.tokenizers import pretokenize
from data_pipelines.tokenizers import tokenization
from bert_jax_core.tf_setup import tf


class PretrainingDataError(errors.UserError):
  """Bad flag or input: missing/unreadable file, malformed JSONL, unprepared TFDS dataset."""


@dataclasses.dataclass(frozen=True)
class Source:
  index: int
  name: str  # a file path, or "tfds:NAME/SPLIT part I of N"
  size: int  # progress units: bytes (files) or examples (tfds)
  path: str = ""
  tfds_part: tuple = ()  # (part index, number of parts)


def open_file(path, mode):
  return tf.io.gfile.GFile(path, mode) if "://" in path else open(path, mode)


def _check_readable(path, pattern):
  """Size in bytes of `path`, after reading its first block: readable (permissions, broken
  links) and UTF-8 text (text_files.not_text: no PNG, .gz or UTF-16 file in a glob)."""
  try:
    if tf.io.gfile.isdir(path):
      raise PretrainingDataError(f"--input_file={pattern}: {path} is a directory; pass "
                                 "files or a glob of them (e.g. 'corpus/*.txt').")
    with open_file(path, "rb") as f:
      head = f.read(text_files.SNIFF_BYTES)
    size = tf.io.gfile.stat(path).length
  except (OSError, tf.errors.OpError) as e:
    reason = getattr(e, "strerror", None) or getattr(e, "message", None) or str(e)
    raise PretrainingDataError(f"--input_file={pattern}: cannot read {path} ({reason}); fix "
                               "its permissions or the pattern.") from None
  why = text_files.not_text(head, path)
  if why:
    raise PretrainingDataError(f"--input_file={pattern}: {why}")
  return size


def resolve_sources(cfg):
  """The ordered list of sources; their order (sorted per glob) fixes the output."""
  if cfg.input_format == "tfds":
    return _tfds_sources(cfg)
  patterns = [p.strip() for p in cfg.input_file.split(",") if p.strip()]
  if not patterns:
    raise PretrainingDataError(f"--input_file is empty: pass a glob of {cfg.input_format} "
                               "files, e.g. --input_file='data/corpus/*.txt' (comma-separated "
                               "globs allowed).")
  paths = []
  for pattern in patterns:
    if any(c in pattern for c in "*?["):
      matched = sorted(tf.io.gfile.glob(pattern))
      if not matched:
        raise PretrainingDataError(f"--input_file={pattern}: no file matches this glob; check "
                                   "the path.")
    elif not tf.io.gfile.exists(pattern):
      raise PretrainingDataError(f"--input_file={pattern}: no such file; check the path.")
    else:
      matched = [pattern]
    paths.extend(p for p in matched if p not in paths)
  return [Source(i, p, _check_readable(p, cfg.input_file), path=p) for i, p in enumerate(paths)]


def _tfds_builder(cfg):
  import tensorflow_datasets as tfds
  kwargs = dict(data_dir=cfg.tfds_data_dir) if cfg.tfds_data_dir else {}
  try:
    builder = tfds.builder(cfg.tfds_name, **kwargs)
  # tfds 4.9: DatasetNotFoundError (a ValueError) for an unknown name, ValueError for an unknown
  # config, AssertionError for an unknown version; messages run over several lines.
  except (AssertionError, ValueError) as e:
    raise PretrainingDataError(f"--tfds_name={cfg.tfds_name}: not found in --tfds_data_dir="
                               f"{cfg.tfds_data_dir or '(default)'} ({type(e).__name__}); "
                               "prepare it with `tfds build` first (this tool never "
                               "downloads).") from None
  if not builder.is_prepared():
    raise PretrainingDataError(f"--tfds_name={cfg.tfds_name}: not prepared in "
                               f"{builder.data_dir}; run `tfds build` first (this tool never "
                               "downloads).")
  return builder


def _tfds_sources(cfg):
  if not cfg.tfds_name:
    raise PretrainingDataError("--tfds_name is empty: --input_format=tfds needs the name of a "
                               "prepared TFDS dataset.")
  builder = _tfds_builder(cfg)
  splits = builder.info.splits
  if cfg.tfds_split not in splits:
    raise PretrainingDataError(f"--tfds_split={cfg.tfds_split}: {cfg.tfds_name} has splits "
                               f"{', '.join(sorted(splits))}.")
  if cfg.tfds_text_key not in builder.info.features:
    raise PretrainingDataError(f"--tfds_text_key={cfg.tfds_text_key}: {cfg.tfds_name} has "
                               f"features {', '.join(sorted(builder.info.features))}.")
  total = splits[cfg.tfds_split].num_examples
  n = max(1, min(cfg.tfds_num_parts, total))
  return [Source(i, f"tfds:{cfg.tfds_name}/{cfg.tfds_split} part {i} of {n}",
                 total // n + (i < total % n), tfds_part=(i, n)) for i in range(n)]


# ----------------------------------------------------------------------------------------------
# Reading: a source -> documents (lists of sentence strings), with drop/replace counts.
# ----------------------------------------------------------------------------------------------
def _read_text(source, stats, progress):
  document = []
  with open_file(source.path, "rb") as f:
    for number, raw in enumerate(f):
      progress(len(raw))
      line, n = tokenization.decode_utf8(raw)
      stats.replaced += n
      line = (text_files.strip_bom(line) if number == 0 else line).strip()
      if line:
        document.append(line)
      elif document:  # blank lines separate documents
        yield document
        document = []
  if document:
    yield document


SPLITTERS = ("auto", "regex", "kss", "pysbd")


@functools.lru_cache(maxsize=None)
def _kss():
  try:
    with contextlib.redirect_stdout(io.StringIO()):  # kss prints its backend choice on import
      import kss  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise PretrainingDataError(f"--sentence_splitter=kss needs the kss package ({e}); pip "
                               "install kss (pinned in requirements.txt).") from None
  return kss


@functools.lru_cache(maxsize=None)
def _pysbd(language):
  try:
    import pysbd  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise PretrainingDataError(f"--sentence_splitter=pysbd needs the pysbd package ({e}); pip "
                               "install pysbd (pinned in requirements.txt).") from None
  return pysbd.Segmenter(language=language, clean=False)


def choose_splitter(text, splitter="auto"):
  """(splitter, pysbd language) for one document."""
  if splitter not in SPLITTERS:
    raise PretrainingDataError(f"--sentence_splitter={splitter}: expected one of "
                               f"{', '.join(SPLITTERS)}.")
  shares = pretokenize.script_shares([text], max_chars=20_000)
  if splitter == "auto":
    if shares["hangul"] >= pretokenize.CJK_HEAVY:
      splitter = "kss"
    elif pretokenize.is_cjk_heavy(shares):
      splitter = "pysbd"
    else:
      splitter = "regex"
  language = "ja" if shares["kana"] > 0.1 else "zh" if pretokenize.is_cjk_heavy(shares) else "en"
  return splitter, language


def split_sentences(text, splitter="auto"):
  """Free text -> list of sentences (whitespace runs folded to one space, blank text -> [])."""
  splitter, language = choose_splitter(text, splitter)
  if splitter == "regex":
    return split_sentences_regex(text)
  lines = [" ".join(line.split()) for line in text.splitlines()]
  lines = [line for line in lines if line]
  if not lines:
    return []
  if splitter == "kss":
    # mecab backend: python-mecab-ko is pinned, so kss never falls back to another analyser.
    # One call per line: given a one-element list kss returns that line's sentences unwrapped.
    kss = _kss()
    sentences = [s for line in lines for s in kss.split_sentences(line, backend="mecab")]
  else:
    segmenter = _pysbd(language)
    sentences = [s for line in lines for s in segmenter.segment(line)]
  return [" ".join(s.split()) for s in sentences if s.strip()]


def _text_document(text, stats, splitter="auto"):
  """Free text (JSONL, TFDS) -> sentences; blank text is a dropped document."""
  sentences = split_sentences(text, splitter)
  if not sentences:
    stats.dropped += 1
  return sentences


def _read_jsonl(source, key, stats, progress, splitter="auto"):
  with open_file(source.path, "rb") as f:
    for line_number, raw in enumerate(f, 1):
      progress(len(raw))
      line, n = tokenization.decode_utf8(raw)
      stats.replaced += n
      if line_number == 1:
        line = text_files.strip_bom(line)
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise PretrainingDataError(f"{source.path}:{line_number}: not JSON ({e.msg}); "
                                   "--input_format=jsonl needs one JSON object per line.") from None
      text = obj.get(key) if isinstance(obj, dict) else None
      if not isinstance(text, str):
        raise PretrainingDataError(f"{source.path}:{line_number}: no string field {key!r}; set "
                                   "--jsonl_text_key to the field that holds the document text.")
      sentences = _text_document(text, stats, splitter)
      if sentences:
        yield sentences


def _read_tfds(source, cfg, stats, progress):
  import tensorflow_datasets as tfds
  builder = _tfds_builder(cfg)
  part, n = source.tfds_part
  split = tfds.even_splits(cfg.tfds_split, n=n)[part]
  ds = builder.as_dataset(split=split, shuffle_files=False)
  for example in tfds.as_numpy(ds):
    progress(1)
    value = example[cfg.tfds_text_key]
    if isinstance(value, bytes):
      value, n_replaced = tokenization.decode_utf8(value)
      stats.replaced += n_replaced
    sentences = _text_document(str(value), stats, getattr(cfg, "sentence_splitter", "auto"))
    if sentences:
      yield sentences


def read_documents(source, cfg, stats, progress=lambda n: None):
  """Yields the documents of `source`; progress(n) per line's bytes (files) or example (tfds)."""
  if cfg.input_format == "text":
    return _read_text(source, stats, progress)
  if cfg.input_format == "jsonl":
    return _read_jsonl(source, cfg.jsonl_text_key, stats, progress,
                       getattr(cfg, "sentence_splitter", "auto"))
  return _read_tfds(source, cfg, stats, progress)


# Sentence end: . ! ? (optionally followed by closing quotes/brackets), whitespace, then what
# can open a sentence: an upper-case letter, a digit, a quote or an opening bracket. Crude (it
# splits after "Dr. Smith") but, like the original's "one sentence per line" input, only the NSP
# split points depend on it; no text is lost.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'\u201d\u2019)\]]*\s+(?=[\"'\u201c\u2018(\[0-9A-Z])")


def split_sentences_regex(text):
  """Text (e.g. a JSONL or TFDS document) -> list of sentences.

  Lines are split first (a line break always ends a sentence: headings, list items), then each
  line at sentence-ending punctuation followed by whitespace and a sentence opener. Blank-only
  text gives [].
  """
  sentences = []
  for line in text.splitlines():
    line = " ".join(line.split())
    if not line:
      continue
    start = 0
    for m in _SENTENCE_END.finditer(line):
      sentences.append(line[start:m.start() + len(m.group(0).rstrip())].rstrip())
      start = m.end()
    sentences.append(line[start:])
  return [s for s in sentences if s]
