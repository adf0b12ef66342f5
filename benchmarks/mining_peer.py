r"""Mining hard negatives against sentence-transformers on the same CPU, in one run (issue 48 item
6): texts/s and peak memory of `bert_jax.mine`'s search (bert_jax/inference/mining.py) and of
sentence-transformers' encode + `util.mine_hard_negatives` (6.2), same model, rows and settings.

  .venv/bin/python -m benchmarks.mining_peer [--hidden=128 --layers=2] [--block_sizes=256,4096]

Rows: every stdlib docstring pair of benchmarks/docstring_retrieval.py's train split (the
queries), the corpus its train + dev + test documents (1,251 queries and 1,747 documents with
Python 3.11). The model: a random BERT of the given shape (vocab of the rows' words) saved as a
sentence-transformers folder (mean pooling, Normalize), read by both. Settings: 5 negatives,
range_max 50, relative_margin 0.01 (a random model's scores are close), n-tuple. Each variant runs in its own process (peak RSS is
its own): ours once per --block_sizes entry (one CPU device: XLA's default; the first call
compiles, so it is timed twice, cold and warm), then ST (torch's threads). Prints one JSON line
per variant, then ours' texts/s over ST's, and whether the mined rows are the same (ties aside:
mining_testlib.same_rows). texts/s = (queries + corpus texts) / seconds of encode + search +
selection, model loading excluded. Bounded memory: ours with the smallest block once more on
--memory_copies copies of the corpus (each copy's texts made distinct), peak RSS against one
copy's. Nothing here asserts a speed.
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = dict(num_negatives=5, range_max=50, relative_margin=0.01, output_format="n-tuple",
                output_scores=True)


def data(work, hidden, layers):
  """(train rows, corpus texts, ST folder), built once in `work`."""
  sys.path.insert(0, ROOT)
  from tests.testlib import mining_testlib  # pylint: disable=g-import-not-at-top
  from benchmarks import docstring_retrieval  # pylint: disable=g-import-not-at-top
  splits = docstring_retrieval.build(os.path.join(work, "data"))
  corpus = [r["positive"] for s in ("train", "dev", "test") for r in splits[s]]
  folder = os.path.join(work, "model", "st")
  if not os.path.isdir(folder):
    mining_testlib.st_folder(os.path.join(work, "model"), splits["train"] + splits["dev"]
                             + splits["test"], hidden=hidden, layers=layers)
  return splits["train"], corpus, folder


def run_ours(rows, corpus, folder, block_size, batch_size, repeats=2):
  from bert_jax import mine  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import mining  # pylint: disable=g-import-not-at-top
  m = predict.load_embedder(folder)
  pooling, _, length = predict.embedding_settings(m, None, "query")
  times, out = [], None
  for _ in range(repeats):   # cold (compiles), warm
    t = time.perf_counter()
    problem = mining.build_problem([r["query"] for r in rows], [r["positive"] for r in rows],
                                   corpus, "query", "positive")
    settings = mining.resolve(mining.Settings(**SETTINGS), problem)
    _, out = mine.mine(m, problem, settings, pooling=pooling, query_prompt="", corpus_prompt="",
                       max_seq_length=length, batch_size=batch_size, block_size=block_size)
    times.append(time.perf_counter() - t)
  return times, out, len(problem.queries) + len(problem.corpus)


def run_st(rows, corpus, folder, batch_size):
  from tests.testlib import mining_testlib  # pylint: disable=g-import-not-at-top
  t = time.perf_counter()
  out = mining_testlib.st_mine(rows, folder, corpus=corpus, batch_size=batch_size, **SETTINGS)
  return [time.perf_counter() - t], out


def variant(args):
  rows, corpus, folder = data(args.work, args.hidden, args.layers)
  if args.variant == "st":
    times, out = run_st(rows, corpus, folder, args.batch_size)
    texts = len(dict.fromkeys(r["query"] for r in rows)) + len(dict.fromkeys(corpus))
  else:   # ours_<block>[_x<copies>]: the corpus <copies> times, each copy's texts made distinct
    parts = args.variant.split("_")
    copies = int(parts[2][1:]) if len(parts) > 2 else 1
    corpus = [t if i == 0 else f"{t} ({i})" for i in range(copies) for t in corpus]
    times, out, texts = run_ours(rows, corpus, folder, int(parts[1]), args.batch_size,
                                 repeats=1 if copies > 1 else 2)
  with open(os.path.join(args.work, f"{args.variant}.json"), "w", encoding="utf-8") as f:
    json.dump(out, f)
  print(json.dumps({"variant": args.variant, "texts": texts, "rows": len(out),
                    "seconds": [round(t, 2) for t in times],
                    "texts_per_s": round(texts / times[-1], 1),
                    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}))


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--hidden", type=int, default=128)
  p.add_argument("--layers", type=int, default=2)
  p.add_argument("--batch_size", type=int, default=64)
  p.add_argument("--block_sizes", default="256,4096")
  p.add_argument("--memory_copies", type=int, default=8, help="Also ours with the smallest "
                 "block on the corpus this many times over (distinct texts): its peak RSS "
                 "against one copy's; 0: skip.")
  p.add_argument("--work", default=None)
  p.add_argument("--variant", default=None)
  args = p.parse_args()
  if args.variant:
    return variant(args)
  work = args.work or tempfile.mkdtemp(prefix="mining_peer_")
  base = [sys.executable, "-m", "benchmarks.mining_peer", f"--work={work}",
          f"--hidden={args.hidden}", f"--layers={args.layers}", f"--batch_size={args.batch_size}"]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env.setdefault("JAX_PLATFORMS", "cpu")
  env.setdefault("BERT_JAX_CACHE", os.path.join(work, "cache"))
  results = {}
  blocks = args.block_sizes.split(",")
  names = [f"ours_{b}" for b in blocks] + ["st"]
  extra = [f"ours_{blocks[0]}_x{args.memory_copies}"] if args.memory_copies > 1 else []
  for name in names + extra:
    r = subprocess.run(base + [f"--variant={name}"], cwd=ROOT, env=env, capture_output=True,
                       text=True, check=False)
    line = next((l for l in r.stdout.splitlines() if l.startswith("{")), None)
    if line is None:
      sys.exit(f"{name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    print(line, flush=True)
    results[name] = json.loads(line)
  sys.path.insert(0, ROOT)
  from tests.testlib import mining_testlib  # pylint: disable=g-import-not-at-top
  with open(os.path.join(work, "st.json"), encoding="utf-8") as f:
    theirs = json.load(f)
  for name in names[:-1]:
    with open(os.path.join(work, f"{name}.json"), encoding="utf-8") as f:
      ties = mining_testlib.same_rows(theirs, json.load(f))
    print(f"{name}: {results[name]['texts_per_s'] / results['st']['texts_per_s']:.2f}x ST's "
          f"texts/s (warm), {results[name]['peak_rss_mb']} MB peak RSS vs ST's "
          f"{results['st']['peak_rss_mb']}; rows equal to ST's ({ties} near-tie rows)")
  for name in extra:
    print(f"{name}: {results[name]['texts']:,} texts in blocks of {blocks[0]}: "
          f"{results[name]['peak_rss_mb']} MB peak RSS (one copy, {results[names[0]]['texts']:,} "
          f"texts: {results[names[0]]['peak_rss_mb']} MB), {results[name]['texts_per_s']} texts/s")


if __name__ == "__main__":
  main()
