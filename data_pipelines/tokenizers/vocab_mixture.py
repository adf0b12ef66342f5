"""The lines a vocabulary learns from, drawn from several named corpora in shares ~ size^tau.

  python -m data_pipelines.build_vocab --input_sources='en=data/en/*.txt;ko=data/ko/*.txt' \\
      --source_tau=0.3 --model_type=bpe --vocab_size=32000 --output=tokenizer.json

A vocabulary learned on the pooled lines gives each language pieces in proportion to its text:
a language with 2% of the lines gets few merges of its own and its words fall apart into
characters (or bytes). mBERT (exponent 0.7), XLM-R (0.3) and mmBERT (0.7 -> 0.5 -> 0.3) sample
each language with probability ~ size^tau instead, as `data_pipelines/input/mixture.py` does for the
training stream (--config.source_tau). Here:

  * size = the source's non-empty lines; share_i = size_i^tau / sum_j size_j^tau (tau = 1: the
    plain pool's shares);
  * the draw has as many lines as the sources hold together (or --input_sentence_size when
    given): source i gives round(share_i * total) lines, its whole text repeated as often as
    that fits, the rest a uniform sample without replacement (random.Random keyed by --seed and
    the source's name, so adding a source changes no other source's lines). A small source is
    repeated (its words count more in the learner's statistics), a large one thinned.
Each source's lines are held in memory (as every non-WordPiece build already holds its sample).
What each source had and gave goes to <output>.meta.json ("mixture").
"""

import random
import zlib

FLAG = "--input_sources"


def parse(spec, error):
  """'NAME=GLOB[,GLOB];NAME=GLOB' -> [(name, pattern)] in the order given; error(msg) raises."""
  out = []
  for part in (p.strip() for p in spec.split(";")):
    if not part:
      continue
    name, eq, pattern = (x.strip() for x in part.partition("="))
    if not eq or not name or not pattern:
      raise error(f"{FLAG}: {part!r} is not NAME=GLOB; expected e.g. "
                  "'en=data/en/*.txt;ko=data/ko/*.txt' (sources separated by ';').")
    if any(name == n for n, _ in out):
      raise error(f"{FLAG}: source {name!r} is named twice; give each source its own name.")
    out.append((name, pattern))
  if not out:
    raise error(f"{FLAG}={spec!r} names no source; expected 'NAME=GLOB;NAME=GLOB'.")
  return out


def check_tau(tau, error):
  if not 0 < tau <= 1:
    raise error(f"--source_tau={tau!r}: expected 0 < tau <= 1 (shares ~ lines^tau: 1 "
                "proportional to size, XLM-R 0.3, mBERT 0.7).")


def shares(sizes, tau):
  """{name: size^tau / sum size^tau}."""
  raw = {n: float(s) ** tau for n, s in sizes.items()}
  total = sum(raw.values())
  return {n: r / total for n, r in raw.items()}


def _seed(seed, name):
  return seed * 1_000_003 + zlib.crc32(name.encode("utf-8"))


def draw(corpora, tau, total=0, seed=0):
  """corpora: {name: [line, ...]} (each non-empty) -> (lines, {name: stats}).

  total: lines to draw (0 = as many as the corpora hold together). Deterministic in the
  corpora, tau, total and seed; the lines come source by source in the order given.
  """
  sizes = {n: len(lines) for n, lines in corpora.items()}
  total = total or sum(sizes.values())
  share = shares(sizes, tau)
  out, stats = [], {}
  for name, lines in corpora.items():
    want = round(share[name] * total)
    copies, rest = divmod(want, len(lines))
    rng = random.Random(_seed(seed, name))
    picked = sorted(rng.sample(range(len(lines)), rest))  # kept in the text's order
    out.extend(lines * copies)
    out.extend(lines[i] for i in picked)
    stats[name] = {"lines": len(lines), "share": round(share[name], 6), "drawn": want,
                   "times_seen": round(want / len(lines), 4)}
  return out, stats
