"""Hard negatives mined on the mesh (issue 48 item 1): the reusable core of `python -m bert_jax.mine`.

The rule is sentence-transformers' `util.mine_hard_negatives` (6.2.0, util/hard_negatives.py),
read from its source and kept step for step so that, with exact search, the same model and the
same settings, the mined negatives are the same (ties aside; tests/bert_jax/inference/
mining_test.py checks it on stdlib docstring rows):
  - queries: the anchors, de-duplicated in first-seen order; a query's positives: every
    positive of its rows, de-duplicated;
  - corpus: the given corpus texts followed by the positives, de-duplicated (by default the
    positives alone);
  - candidates: the top range_max + max_positives corpus texts of each query by cosine
    (max_positives: the most rows one anchor has, as ST counts them), then, on the host,
    ST's filters in its order: the query's own positives out, absolute_margin (candidate +
    margin > the query's lowest positive score), relative_margin (candidate > lowest positive -
    |lowest positive| * margin: NV-Retriever's TopK-PercPos), max_score, min_score; the best
    range_max survivors, the first range_min of them skipped, then num_negatives: the top ones,
    or a seeded random sample of the survivors re-sorted by score; with a cross-encoder
    (ST's cross_encoder=) and any filter set, every candidate and positive is first rescored by
    it (its sigmoid, CrossEncoder.predict's), and the filters, ranks and scores are its (without
    a filter ST ignores the cross-encoder; resolve refuses that in one line);
  - rows: triplet (anchor, positive, negative: one row per found negative, for every positive
    of the query) or n-tuple (anchor, positive, negative_1..negative_n: only rows with all n
    found); with output_scores a `scores` list, [positive score, negative score(s)], as ST writes.
The query text itself is not excluded unless it is also one of the query's positives (ST does
not exclude it either); a corpus holding the queries should use range_min or the margins.

Where this differs from ST is how the top-k is found: the corpus is encoded in fixed-size blocks
of `block_size` texts (batches of `batch_size` split over every device of the mesh), and each
block is scored against every query (query vectors [NQ, H] sharded by rows over the mesh) and
merged into a running top-k on the devices (`jax.lax.top_k` of the running K and the block's B
columns; `jax.lax.approx_max_k` with --search=approx). Device memory is the queries' vectors and
running top-k, [NQ, H + 2K + P] floats split over the devices, plus one block: [NQ, B] scores
and [B, H] vectors, whatever the corpus size; the corpus' vectors are never all kept. The
positives' scores are taken from the blocks they fall in. The embedding itself (tokens -> one
L2-normalised vector per text) is the caller's `embed_fn`: the embedding task's model, which
sits above this layer (bert_jax/mine.py passes it).
"""

import dataclasses
import json
import math
import os
import random
import sys

import numpy as np

from bert_jax_core import errors

SAMPLING = ("top", "random")
FORMATS = ("triplet", "n-tuple")
SEARCHES = ("exact", "approx")
CORPUS_COLUMNS = ("text", "document", "passage", "corpus")


class MiningError(errors.UserError):
  """Mining inputs or settings that cannot give what was asked: one line, before any compute."""


@dataclasses.dataclass(frozen=True)
class Settings:
  """ST's arguments of the same names (their defaults); search/recall_target are ours."""
  num_negatives: int = 3
  range_min: int = 0
  range_max: int | None = None
  max_score: float | None = None
  min_score: float | None = None
  absolute_margin: float | None = None
  relative_margin: float | None = None
  sampling_strategy: str = "top"
  output_format: str = "triplet"
  output_scores: bool = False
  seed: int = 0
  search: str = "exact"
  recall_target: float = 0.95
  cross_encoder: str | None = None   # ST's cross_encoder=: a reranker that rescores (rescores())


@dataclasses.dataclass
class Problem:
  """What is mined: the de-duplicated queries and corpus, and each query's positives."""
  queries: list              # unique anchors, first-seen order
  corpus: list               # unique corpus texts (the given corpus, then the positives)
  positives: list            # per query: [corpus index] of its positives, first-seen order
  max_positives: int         # ST's: the most rows of one anchor (repeated pairs counted)
  num_rows: int              # rows read
  anchor_column: str
  positive_column: str
  corpus_given: int = 0      # texts read from the corpus file (0: the positives are the corpus)


# ----------------------------------------------------------------------------------------------
# Reading.
# ----------------------------------------------------------------------------------------------
def read_corpus(path):
  """[text] of a corpus file: .txt one text a line (blank lines skipped), or a .jsonl/.csv/.tsv
  with a column `text` (or document, passage, corpus), or exactly one column."""
  from data_pipelines.tasks import common  # pylint: disable=g-import-not-at-top
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  if not os.path.isfile(path):
    raise MiningError(f"--corpus_file={path}: no such file.")
  if ext == "txt":
    texts = [l.strip() for l in common.read_text(path).splitlines() if l.strip()]
  elif ext in ("jsonl", "csv", "tsv"):
    header, rows = common.read_rows(path, ext)
    names = list(rows[0][1]) if ext == "jsonl" and rows else list(header or [])
    lower = [str(n).strip().lower() for n in names]
    column = next((lower.index(c) for c in CORPUS_COLUMNS if c in lower),
                  0 if len(names) == 1 else None)
    if column is None:
      raise MiningError(f"--corpus_file={path}: columns {names} and none is named text (or "
                        f"{', '.join(CORPUS_COLUMNS[1:])}); name the documents' column text, or "
                        "give one column (or a .txt file, one text a line).")
    key = names[column] if ext == "jsonl" else column
    texts = [str(row.get(key) if ext == "jsonl" else row[key]) for _, row in rows
             if (row.get(key) if ext == "jsonl" else row[key]) not in (None, "")]
  else:
    raise MiningError(f"--corpus_file={path}: cannot tell the format from {ext!r}; name it .txt "
                      "(one text a line), .jsonl, .csv or .tsv (a column text).")
  if not texts:
    raise MiningError(f"--corpus_file={path}: no texts.")
  return texts


def problem_of(pairs_file, corpus_file=None):
  """A Problem from an (anchor, positive) file (data_pipelines/tasks/pairs.py reads it: columns
  anchor/query and positive by name, else the first two) and an optional corpus file."""
  from data_pipelines.tasks import pairs as pairs_lib  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(pairs_file):
    raise MiningError(f"--input_file={pairs_file}: no such file.")
  anchor_column, positive_column = pairs_lib.text_column_names(pairs_file)
  rows = pairs_lib.read_pairs(pairs_file)
  given = read_corpus(corpus_file) if corpus_file else []
  return build_problem([r.anchor for r in rows], [r.positive for r in rows], given,
                       anchor_column, positive_column)


def build_problem(anchors, positives, corpus=(), anchor_column="anchor",
                  positive_column="positive"):
  """ST's de-duplication (hard_negatives.py): corpus = unique(corpus + positives), queries =
  unique(anchors), each query's unique positives, max_positives = the most rows of one anchor."""
  texts = list(dict.fromkeys(list(corpus) + list(positives)))
  corpus_idx = {t: i for i, t in enumerate(texts)}
  queries = list(dict.fromkeys(anchors))
  query_idx = {q: i for i, q in enumerate(queries)}
  own = [[] for _ in queries]
  counts = [0] * len(queries)
  for a, p in zip(anchors, positives):
    q = query_idx[a]
    counts[q] += 1
    if corpus_idx[p] not in own[q]:
      own[q].append(corpus_idx[p])
  return Problem(queries, texts, own, max(counts), len(anchors), anchor_column, positive_column,
                 len(corpus))


def resolve(settings, problem):
  """Settings with range_max set as ST sets it; one MiningError line for settings that cannot
  give num_negatives a query (before any compute)."""
  s = settings
  if s.num_negatives < 1:
    raise MiningError(f"--num_negatives={s.num_negatives}: give at least 1.")
  if s.sampling_strategy not in SAMPLING:
    raise MiningError(f"--sampling_strategy={s.sampling_strategy}: use {' or '.join(SAMPLING)}.")
  if s.output_format not in FORMATS:
    raise MiningError(f"--output_format={s.output_format}: use {' or '.join(FORMATS)}.")
  if s.search not in SEARCHES:
    raise MiningError(f"--search={s.search}: use {' or '.join(SEARCHES)}.")
  if s.search == "approx" and not 0 < s.recall_target <= 1:
    raise MiningError(f"--recall_target={s.recall_target}: give a value in (0, 1].")
  if s.range_min < 0:
    raise MiningError(f"--range_min={s.range_min}: give 0 or more (ranks to skip).")
  # A query's positives are never its negatives: a corpus of n texts leaves at most n - 1.
  room = len(problem.corpus) - 1
  if s.num_negatives > room:
    raise MiningError(f"--num_negatives={s.num_negatives}: the corpus has {len(problem.corpus)} "
                      f"distinct texts, so a query has at most {room} candidates besides its "
                      f"positive; lower --num_negatives to {max(room, 1)} or less, or pass a "
                      "larger --corpus_file.")
  if s.cross_encoder and not rescores(s):
    raise MiningError(f"--cross_encoder={s.cross_encoder}: sentence-transformers rescores the "
                      "candidates with a cross-encoder only when a filter is set, and ignores it "
                      "otherwise; add --absolute_margin, --relative_margin, --max_score or "
                      "--min_score (--min_score=0 drops nothing: the scores are sigmoids), or "
                      "drop --cross_encoder.")
  range_max = s.range_max
  filtered = any(x is not None for x in (s.absolute_margin, s.relative_margin, s.max_score))
  filtered |= bool(s.cross_encoder) and s.min_score is not None   # ST's condition, as written
  if range_max is None:   # ST: room for the positives, and 10x the negatives when filters drop some
    range_max = s.range_min + s.num_negatives * (10 if filtered else 1) + problem.max_positives
  if s.range_min >= range_max:
    raise MiningError(f"--range_min={s.range_min} --range_max={range_max}: the window is empty; "
                      "give --range_max above --range_min.")
  if s.num_negatives > range_max - s.range_min:
    raise MiningError(f"--num_negatives={s.num_negatives}: the rank window --range_min="
                      f"{s.range_min} --range_max={range_max} leaves {range_max - s.range_min} "
                      f"candidates; raise --range_max to at least {s.range_min + s.num_negatives}"
                      " or lower --range_min or --num_negatives.")
  return dataclasses.replace(s, range_max=range_max)


def candidates_k(settings, problem):
  """How many corpus texts a query keeps from the search (ST's k): range_max + max_positives,
  at most the corpus."""
  return min(settings.range_max + problem.max_positives, len(problem.corpus))


# ----------------------------------------------------------------------------------------------
# The search on the devices.
# ----------------------------------------------------------------------------------------------
def positives_matrix(problem, rows):
  """[rows, P] int32: each query's positives' corpus indices, -1 padded (rows >= queries)."""
  width = max(len(p) for p in problem.positives)
  out = np.full((rows, width), -1, np.int32)
  for q, own in enumerate(problem.positives):
    out[q, :len(own)] = own
  return out


class BlockSearch:
  """A running top-k of every query over corpus blocks, on the mesh.

  embed_fn(params, input_ids, input_mask, segment_ids) -> [B, H] L2-normalised float32, jittable;
  tokenize(texts) -> (input_ids, input_mask, segment_ids) numpy [len(texts), T] int32 (the same
  on every host). Queries (and every state array) are split by rows over all the mesh's devices;
  a block's vectors are replicated for its [NQ, B] scores.
  """

  def __init__(self, mesh, embed_fn, params, tokenize, *, batch_size, block_size, k,
               positives, search="exact", recall_target=0.95):
    import jax  # pylint: disable=g-import-not-at-top
    from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
    self.mesh, self.tokenize, self.k = mesh, tokenize, k
    self.batch_size, self.block_size = batch_size, block_size
    self.rows = NamedSharding(mesh, P(tuple(mesh.axis_names)))    # split over every device
    self.repl = NamedSharding(mesh, P())
    self.params = jax.tree.map(lambda x: _global(x, self.repl), params)
    self._embed = jax.jit(embed_fn, out_shardings=self.rows)
    # One program a number of batches (the queries', a block's): made once, not a lambda a call
    # (a new function is a new trace and compile every block).
    self._concat = jax.jit(_concatenate, out_shardings=self.rows)
    self.positives = positives                                      # [NQpad, P] int32, host
    self.search, self.recall_target = search, recall_target

  def encode(self, texts):
    """[len(texts) rounded up to batch_size, H] vectors, rows split over the mesh; the pad rows
    are [CLS] [SEP] (the caller ignores them)."""
    out = []
    for start in range(0, len(texts), self.batch_size):
      chunk = list(texts[start:start + self.batch_size])
      chunk += [""] * (self.batch_size - len(chunk))
      arrays = [_global(x, self.rows) for x in self.tokenize(chunk)]
      out.append(self._embed(self.params, *arrays))                # [batch, H]
    return self._concat(*out)

  def start(self, queries):
    """Encodes the queries; the running state: scores/indices [NQpad, K] (-inf / -1) and the
    positives' scores [NQpad, P] (NaN until their block is seen)."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    import jax  # pylint: disable=g-import-not-at-top
    self.q = self.encode(queries)                                   # [NQpad, H]
    n = self.q.shape[0]
    pad = np.full((n - self.positives.shape[0], self.positives.shape[1]), -1, np.int32)
    self.pos_idx = _global(np.concatenate([self.positives, pad]), self.rows)
    init = jax.jit(lambda: (jnp.full((n, self.k), -jnp.inf, jnp.float32),
                            jnp.full((n, self.k), -1, jnp.int32),
                            jnp.full(self.pos_idx.shape, jnp.nan, jnp.float32)),
                   out_shardings=(self.rows,) * 3)
    self.state = init()
    self._merge = merge_program(self.mesh, self.k, self.search, self.recall_target)

  def add_block(self, start, texts, num_corpus):
    """Scores corpus texts start .. start + len(texts) - 1 and merges them into the top-k."""
    import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
    texts = list(texts) + [""] * (self.block_size - len(texts))     # fixed shapes: one compile
    c = self.encode(texts)                                          # [block, H]
    self.state = self._merge(num_corpus, self.state, self.q, c, jnp.int32(start), self.pos_idx)

  def result(self, num_queries):
    """(scores [NQ, K] float32 descending, indices [NQ, K] int32, positive scores [NQ, P]) on
    every host."""
    return tuple(_to_host(x)[:num_queries] for x in self.state)


def merge_block(num_corpus, state, q, c, start, pos_idx, *, k, search, recall_target,
                replicated):
  """The search state + one block: c [B, H] vectors of corpus texts start .. start + B - 1.

  state: (top scores [NQ, K] descending, their corpus indices [NQ, K], positives' scores
  [NQ, P]); q [NQ, H] the queries' vectors; pos_idx [NQ, P] their positives' indices (-1 pad)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  top_s, top_i, pos_s = state
  c = jax.lax.with_sharding_constraint(c, replicated)              # every device: the block
  s = jnp.einsum("qh,bh->qb", q, c, precision=jax.lax.Precision.HIGHEST)   # [NQ, B]
  col = start + jnp.arange(c.shape[0], dtype=jnp.int32)            # [B] corpus indices
  s = jnp.where(col[None] < num_corpus, s, -jnp.inf)               # the last block's padding
  local = pos_idx - start                                          # [NQ, P]
  here = (pos_idx >= 0) & (local >= 0) & (local < c.shape[0])
  got = jnp.take_along_axis(s, jnp.clip(local, 0, c.shape[0] - 1), axis=1)
  pos_s = jnp.where(here, got, pos_s)
  cand_s = jnp.concatenate([top_s, s], axis=1)                     # [NQ, K + B]
  cand_i = jnp.concatenate([top_i, jnp.broadcast_to(col, s.shape)], axis=1)
  if search == "approx":
    new_s, j = jax.lax.approx_max_k(cand_s, k, recall_target=recall_target)
  else:
    new_s, j = jax.lax.top_k(cand_s, k)                           # ties: the lower column first
  return new_s, jnp.take_along_axis(cand_i, j, axis=1), pos_s


def merge_program(mesh, k, search="exact", recall_target=0.95):
  """merge_block jitted for `mesh`: the state split by rows over every device, donated."""
  import functools  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  rows = NamedSharding(mesh, P(tuple(mesh.axis_names)))
  fn = functools.partial(merge_block, k=k, search=search, recall_target=recall_target,
                         replicated=NamedSharding(mesh, P()))
  return jax.jit(fn, static_argnums=(0,), donate_argnums=(1,), out_shardings=(rows,) * 3)


def _concatenate(*xs):
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  return jnp.concatenate(xs)


def _global(x, sharding):
  """A host array (the same on every host) as a global jax.Array of `sharding`."""
  import jax  # pylint: disable=g-import-not-at-top
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])


def _to_host(x):
  """A global array in full on this host (every host's rows: a gather across processes)."""
  import jax  # pylint: disable=g-import-not-at-top
  if jax.process_count() == 1:
    return np.asarray(x)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))


def search(problem, block_search, *, corpus_prompt="", query_prompt="", progress=True):
  """Runs the block search: (scores [NQ, K], indices [NQ, K], positive scores [NQ, P])."""
  import tqdm  # pylint: disable=g-import-not-at-top
  queries = [query_prompt + q for q in problem.queries]
  block_search.start(queries)
  corpus, b = problem.corpus, block_search.block_size
  starts = range(0, len(corpus), b)
  bar = tqdm.tqdm(starts, desc="corpus blocks", unit="block", file=sys.stderr,
                  disable=not progress)
  for start in bar:
    block_search.add_block(start, [corpus_prompt + t for t in corpus[start:start + b]],
                           len(corpus))
  return block_search.result(len(problem.queries))


# ----------------------------------------------------------------------------------------------
# ST's selection, on the host.
# ----------------------------------------------------------------------------------------------
def rescores(settings):
  """ST's rule (hard_negatives.py, "Rescore with cross_encoder"): the cross-encoder replaces the
  embedder's scores only when a filter is set (absolute/relative margin, max/min score)."""
  s = settings
  return bool(s.cross_encoder) and any(
      x is not None for x in (s.absolute_margin, s.relative_margin, s.max_score, s.min_score))


def rescore(problem, indices, positive_scores, score_pairs):
  """The search's candidates and each query's positives scored by a cross-encoder, as ST does
  before its filters: every candidate of a query (indices [NQ, K], -1: none, left -inf for
  select) and its positives, by score_pairs([(query, document)]) -> [n] float32 (the
  cross-encoder's activation applied: CrossEncoder.predict's), called once with every pair (it
  batches them: predict.rerank_pair_scores). Returns (scores [NQ, K], positive_scores [NQ, P])
  in the search's layout."""
  indices = np.asarray(indices, np.int64)
  scores = np.full(indices.shape, -np.inf, np.float32)
  positives = np.array(positive_scores, np.float32, copy=True)
  pairs, where = [], []   # where: (array, query, column) of each pair's score
  for q, query in enumerate(problem.queries):
    for j in np.flatnonzero(indices[q] >= 0):
      pairs.append((query, problem.corpus[indices[q, j]]))
      where.append((scores, q, j))
    for j, i in enumerate(problem.positives[q]):
      pairs.append((query, problem.corpus[i]))
      where.append((positives, q, j))
  if pairs:
    got = np.asarray(score_pairs(pairs), np.float32)
    for (array, q, j), value in zip(where, got):
      array[q, j] = value
  return scores, positives


@dataclasses.dataclass
class Mined:
  indices: np.ndarray        # [NQ, num_negatives] corpus indices (-1: none)
  scores: np.ndarray         # [NQ, num_negatives] float32 (-inf: none)
  positive_scores: list      # per query: [float32] of its positives, in Problem.positives order
  skipped: dict              # filter name -> candidates it removed


def select(problem, settings, scores, indices, positive_scores):
  """ST's filters and sampling (hard_negatives.py, after its top-k) on the search's candidates."""
  s = settings
  n, width = len(problem.queries), s.range_max + problem.max_positives
  scores = np.asarray(scores, np.float32)
  indices = np.asarray(indices, np.int64)
  if scores.shape[1] < width:   # ST pads a small corpus' top-k to range_max + max_positives
    pad = width - scores.shape[1]
    scores = np.concatenate([scores, np.full((n, pad), -np.inf, np.float32)], axis=1)
    indices = np.concatenate([indices, np.full((n, pad), -1, np.int64)], axis=1)
  scores = np.where(indices < 0, np.float32(-np.inf), scores)
  own = [np.asarray(positive_scores[q, :len(p)], np.float32) for q, p in
         enumerate(problem.positives)]
  skipped = {}

  def drop(name, removed):
    nonlocal scores
    removed &= np.isfinite(scores)
    if removed.any():
      skipped[name] = skipped.get(name, 0) + int(removed.sum())
    scores = np.where(removed, np.float32(-np.inf), scores)

  drop("positives", np.stack([np.isin(indices[q], problem.positives[q]) for q in range(n)]))
  lowest = np.asarray([p.min() for p in own], np.float32)[:, None]  # the hardest positive
  if s.absolute_margin is not None:
    drop("absolute_margin", scores + np.float32(s.absolute_margin) > lowest)
  if s.relative_margin is not None:
    drop("relative_margin", scores > lowest - np.abs(lowest) * np.float32(s.relative_margin))
  if s.max_score is not None:
    drop("max_score", scores > np.float32(s.max_score))
  if s.min_score is not None:
    drop("min_score", scores < np.float32(s.min_score))
  order = np.argsort(-scores, axis=1, kind="stable")[:, :s.range_max]   # torch.topk(range_max)
  scores = np.take_along_axis(scores, order, 1)[:, s.range_min:]
  indices = np.take_along_axis(indices, order, 1)[:, s.range_min:]
  if s.sampling_strategy == "top":
    scores, indices = scores[:, :s.num_negatives], indices[:, :s.num_negatives]
  else:   # a sample of the finite candidates (of -inf ones too where fewer remain, as ST)
    rng = random.Random(s.seed)
    options = np.maximum(np.isfinite(scores).sum(1), s.num_negatives)
    picked = np.asarray([rng.sample(range(o), k=s.num_negatives) for o in options])
    scores = np.take_along_axis(scores, picked, 1)
    indices = np.take_along_axis(indices, picked, 1)
    resort = np.argsort(-scores, axis=1, kind="stable")
    scores, indices = (np.take_along_axis(x, resort, 1) for x in (scores, indices))
  indices = np.where(np.isfinite(scores), indices, -1)
  return Mined(indices, scores, own, skipped)


def rows_of(problem, settings, mined, anchor_column=None, positive_column=None):
  """The output rows (dicts, column order as ST's Dataset): ST's triplet or n-tuple layout."""
  a = anchor_column or problem.anchor_column
  p = positive_column or problem.positive_column
  out = []
  for q, own in enumerate(problem.positives):
    found = [(int(i), float(x)) for i, x in zip(mined.indices[q], mined.scores[q]) if i >= 0]
    for pos, pos_score in zip(own, mined.positive_scores[q]):
      base = {a: problem.queries[q], p: problem.corpus[pos]}
      if settings.output_format == "triplet":
        for i, x in found:
          row = dict(base, negative=problem.corpus[i])
          if settings.output_scores:
            row["scores"] = [float(pos_score), x]
          out.append(row)
      elif len(found) == settings.num_negatives:
        row = dict(base, **{f"negative_{j + 1}": problem.corpus[i]
                            for j, (i, _) in enumerate(found)})
        if settings.output_scores:
          row["scores"] = [float(pos_score)] + [x for _, x in found]
        out.append(row)
  return out


# ----------------------------------------------------------------------------------------------
# Writing and the summary.
# ----------------------------------------------------------------------------------------------
OUTPUT_EXTENSIONS = ("jsonl", "csv", "tsv")


def check_output(path, settings):
  """An output name this writer writes (before any work): .jsonl, or .csv/.tsv without scores."""
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  if ext not in OUTPUT_EXTENSIONS:
    raise MiningError(f"--output_file={path}: name a .jsonl file (or .csv/.tsv), the formats "
                      "the embedding task reads.")
  if settings.output_scores and ext != "jsonl":
    raise MiningError(f"--output_file={path}: --output_scores writes a list column (scores), "
                      "which only JSONL holds; name a .jsonl file.")


def write_rows(path, rows, columns):
  """JSONL (one object a line, as datasets' Dataset.to_json) or CSV/TSV with a header."""
  import csv  # pylint: disable=g-import-not-at-top
  from bert_jax_core import files as files_lib  # pylint: disable=g-import-not-at-top
  ext = os.path.splitext(path)[1].lower().lstrip(".")
  with files_lib.atomic_path(path) as tmp:
    with open(tmp, "w", encoding="utf-8", newline="") as f:
      if ext == "jsonl":
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
      else:
        w = csv.writer(f, delimiter="\t" if ext == "tsv" else ",",
                       quoting=csv.QUOTE_NONE if ext == "tsv" else csv.QUOTE_MINIMAL,
                       escapechar="\\" if ext == "tsv" else None)
        w.writerow(columns)
        w.writerows([[r[c] for c in columns] for r in rows])


def columns_of(problem, settings, anchor_column=None, positive_column=None):
  cols = [anchor_column or problem.anchor_column, positive_column or problem.positive_column]
  cols += (["negative"] if settings.output_format == "triplet"
           else [f"negative_{j + 1}" for j in range(settings.num_negatives)])
  return cols + (["scores"] if settings.output_scores else [])


def summary(problem, settings, mined, rows):
  """Lines: what was mined, ST's statistics in brief, what the filters removed."""
  found = np.isfinite(mined.scores)
  full = found.all(1).sum()
  pos = np.concatenate(mined.positive_scores)
  neg = mined.scores[found]
  lines = [f"mined {int(found.sum()):,} negatives for {len(problem.queries):,} queries "
           f"({int(full):,} with all {settings.num_negatives}; rank window "
           f"{settings.range_min}..{settings.range_max}, {settings.sampling_strategy}, "
           f"{settings.search} search)"]
  if neg.size:
    lines.append(f"  scores: positive mean {pos.mean():.4f}, negative mean {neg.mean():.4f} "
                 f"(min {neg.min():.4f}, max {neg.max():.4f})")
  for name, count in mined.skipped.items():
    value = getattr(settings, name, None)
    lines.append(f"  skipped {count:,} candidates: {name}" + (f" {value}" if value is not None
                                                             else ""))
  short = len(problem.queries) - int(full)
  if short:
    lines.append(f"  {short:,} queries got fewer than {settings.num_negatives} negatives: widen "
                 "--range_max, or loosen the margins / --max_score")
  lines.append(f"  rows: {len(rows):,} ({settings.output_format})")
  return lines


def device_bytes(num_queries, hidden, k, positives, block_size, num_devices):
  """Bytes the search keeps on each device: the queries' vectors and running state (split
  over the devices) and one block's vectors and scores (this device's rows of them)."""
  rows = math.ceil(num_queries / num_devices)
  state = rows * (hidden + 2 * k + positives) * 4
  block = block_size * hidden * 4 + rows * (block_size + 2 * (k + block_size)) * 4
  return state + block
