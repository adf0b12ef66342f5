r"""BERT-mini, ALBERT-mini and SpanBERT-mini side by side on the quick-start corpus, at equal
steps: held-out MLM accuracy, parameters, step time, and dev accuracy after fine-tuning each on
a small real-text task (benchmarks/docstring_task.py: which stdlib package a sentence is from).

  nice -n 19 .venv/bin/python -m benchmarks.families_side_by_side --steps=600 --seeds=0,1,2

Everything goes to --out_dir (default runs/families); a re-run reuses what is there (corpus,
vocab, records, finished pre-trainings and fine-tunes), so an interrupted run continues.
  corpus, vocab   as scripts/quickstart_pretrain.sh (stdlib docstrings, files 0-2 train, file 3
                  held out, a 5,000-piece uncased WordPiece vocab)
  records         one set per sentence objective, dupe factor --dupe_factor: NSP pairs (BERT),
                  --sop pairs (ALBERT), --no_nsp full sentences (SpanBERT)
  pre-training    the runlocal recipe (seq 128, packed, lr 1e-3) at --batch_size rows for
                  --steps optimizer steps, warmup 10%, each preset's own masking (token /
                  n-gram / span), held-out evaluation on 30 batches at the end
  fine-tuning     the custom CSV task, seq 64, the size-scaled default lr and epochs, one run
                  per seed in --seeds; dev accuracy of the best epoch
Step time is the median of the logged windows after the first (compilation excluded), wall
time on this machine, twice: in each pre-training run (minutes apart, so under different load
on a shared machine) and in --timing_steps-step runs of the three back to back; GFLOP/step is
the analytic count (train.step_flops), the load-independent cost. Prints a Markdown table and a
`RESULT {json}` line.
"""

import argparse
import glob
import json
import os
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# preset -> (records kind, create_pretraining_data flag)
PRESETS = {"mini": ("nsp", []), "albert-mini": ("sop", ["--sop"]),
           "spanbert-mini": ("full", ["--no_nsp"])}


def sh(args, log=None):
  """Runs `python -m ...` from the repository root; its output goes to `log` (and on failure
  its tail to stderr)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  r = subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True,
                     env=env)
  if log:
    with open(log, "w", encoding="utf-8") as f:
      f.write(r.stdout + r.stderr)
  if r.returncode:
    sys.exit(f"{' '.join(args[:1])} failed ({r.returncode}):\n{r.stdout[-1500:]}\n"
             f"{r.stderr[-3000:]}")
  return r.stdout


KINDS = {"nsp": [], "sop": ["--sop"], "full": ["--no_nsp"]}   # records kind -> its flag


def data(out, dupe_factor, kinds=None):
  """Corpus, vocab, the records of each kind (default: those PRESETS use) and the task."""
  corpus = os.path.join(out, "corpus")
  if not os.path.exists(os.path.join(corpus, "stdlib-03-of-04.txt")):
    sh(["data_pipelines.stdlib_corpus", f"--output_dir={corpus}", "--num_files=4"])
  vocab = os.path.join(out, "vocab.txt")
  train_text = os.path.join(corpus, "stdlib-0[0-2]-of-04.txt")
  if not os.path.exists(vocab):
    sh(["data_pipelines.build_vocab", f"--input_file={train_text}", "--vocab_size=5000",
        "--lower_case", f"--output={vocab}"])
  for kind in kinds or sorted({k for k, _ in PRESETS.values()}):
    flag = KINDS[kind]
    for split, text, dupe, shards in (("train", train_text, dupe_factor, 4),
                                      ("eval", os.path.join(corpus, "stdlib-03-of-04.txt"), 1, 1)):
      d = os.path.join(out, kind, split)
      if not os.path.exists(os.path.join(d, "dataset_info.json")):
        sh(["data_pipelines.create_pretraining_data", f"--input_file={text}",
            f"--output_dir={d}", f"--vocab_file={vocab}", "--do_lower_case=true",
            "--max_seq_length=128", f"--dupe_factor={dupe}", f"--num_shards={shards}",
            "--num_workers=1", *flag])
  task = os.path.join(out, "task")
  if not os.path.exists(os.path.join(task, "dev.csv")):
    from benchmarks import docstring_task  # pylint: disable=g-import-not-at-top
    docstring_task.build(task)
  return vocab, task


def train_run(out, name, preset, kind, vocab, steps, batch_size, extra=()):
  """One `python -m bert_jax.train` run of `preset` (`runlocal`) on the `kind` records, in
  out/work_{name} (skipped when its summary says it finished); returns {final_eval,
  pretrain_tflop and gflop_per_step (None in a summary written before train.py recorded them),
  steps, workdir, sec_per_step, wall_time_sec}."""
  workdir = os.path.join(out, f"work_{name}")
  log = os.path.join(out, f"pretrain_{name}.log")
  summary_path = os.path.join(workdir, "summary.json")
  done = (os.path.exists(summary_path) and
          json.load(open(summary_path)).get("final_step") == steps and os.path.exists(log))
  if not done:
    sh(["bert_jax.train", f"--config=bert_jax/configs/pretrain.py:{preset},runlocal",
        f"--workdir={workdir}", f"--config.train_input_files={out}/{kind}/train/*.tfrecord",
        f"--config.eval_input_files={out}/{kind}/eval/*.tfrecord",
        f"--config.vocab_file={vocab}", f"--config.num_train_steps={steps}",
        f"--config.batch_size={batch_size}",
        f"--config.warmup_steps={steps // 10}", f"--config.log_every={max(steps // 10, 1)}",
        f"--config.eval_every={steps}", f"--config.checkpoint_every={steps}",
        "--config.eval_steps=30", *extra], log=log)
  summary = json.load(open(summary_path))
  return dict(final_eval=summary["final_eval"], pretrain_tflop=summary.get("pretrain_tflop"),
              gflop_per_step=summary.get("gflop_per_step"), steps=steps, workdir=workdir,
              sec_per_step=seconds_per_step(log, batch_size),
              wall_time_sec=summary["wall_time_sec"])


def pretrain(out, preset, vocab, steps, batch_size):
  """{params, params_with_heads, eval..., sec_per_step} of one pre-training run."""
  r = train_run(out, preset, preset, PRESETS[preset][0], vocab, steps, batch_size)
  return dict(r, gflop_per_step=step_flops(preset, batch_size, vocab_size(vocab)) / 1e9,
              **count_params(preset, vocab_size(vocab)))


def seconds_per_step(log, batch_size):
  """Median over the logged windows after the first (compilation): "| 40.1 rows/s" -> batch /
  rows per second."""
  rates = [float(x) for x in re.findall(r"\| ([\d.]+) rows/s",
                                        open(log, encoding="utf-8").read())]
  return statistics.median([batch_size / r for r in rates[1:] or rates]) if rates else None


def timing_round(out, presets, vocab, batch_size, steps):
  """{preset: s/step} of short fresh runs, one right after the other (the pre-training runs
  above are minutes apart, under whatever else the machine ran meanwhile)."""
  times = {}
  for preset in presets:
    kind = PRESETS[preset][0]
    workdir, log = os.path.join(out, f"time_{preset}"), os.path.join(out, f"time_{preset}.log")
    if not os.path.exists(os.path.join(workdir, "summary.json")):
      sh(["bert_jax.train", f"--config=bert_jax/configs/pretrain.py:{preset},runlocal",
          f"--workdir={workdir}", f"--config.train_input_files={out}/{kind}/train/*.tfrecord",
          f"--config.vocab_file={vocab}", f"--config.num_train_steps={steps}",
          f"--config.batch_size={batch_size}", f"--config.log_every={max(steps // 4, 1)}",
          f"--config.warmup_steps={steps // 10}",
          f"--config.checkpoint_every={steps}"], log=log)
    times[preset] = seconds_per_step(log, batch_size)
  return times


def vocab_size(vocab):
  with open(vocab, encoding="utf-8") as f:
    return sum(1 for _ in f)   # 4,939 pieces here: build_vocab's 5,000 is an upper bound


def step_flops(preset, batch_size, vocab_size, objectives=None, teacher_preset=None):
  """The step's analytic FLOPs (train.step_flops: the model's matmuls, packed rows of the
  runlocal recipe): the load-independent cost of a step. `objectives` overrides the preset's
  (e.g. "mlm"); `teacher_preset` adds a DistilBERT teacher's forward."""
  sys.path.insert(0, ROOT)
  from bert_jax import train
  from bert_jax.models import model as m  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config(f"{preset},runlocal")
  config.batch_size = batch_size
  overrides = dict(objectives=objectives) if objectives else {}
  teacher = None
  if teacher_preset:   # train.step_flops reads only the teacher's model_config
    teacher = argparse.Namespace(model_config=m.get_bert_config(teacher_preset,
                                                                vocab_size=vocab_size))
  return train.step_flops(config, m.get_bert_config(preset, vocab_size=vocab_size, **overrides),
                          dict(pack=True), teacher)


def count_params(preset, vocab_size):
  sys.path.insert(0, ROOT)
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as m  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  c = m.get_bert_config(preset, vocab_size=vocab_size)
  enc = jax.eval_shape(lambda: pretraining_heads.init_params(c, jax.random.key(0),
                                                             model_cls=m.BertModel))
  full = jax.eval_shape(lambda: pretraining_heads.init_params(c, jax.random.key(0)))
  return dict(params=m.count_params(enc), params_with_heads=m.count_params(full))


def finetune(out, preset, workdir, vocab, task, seed, learning_rate=None, epochs=None):
  """Dev accuracy of one fine-tuning run: the size-scaled default lr and epochs, or those given."""
  tag = (f"_lr{learning_rate:g}" if learning_rate else "") + (f"_ep{epochs:g}" if epochs else "")
  ft = os.path.join(out, f"ft_{preset}{tag}_seed{seed}")
  chosen = ([f"--config.learning_rate={learning_rate}"] if learning_rate else []) + (
      [f"--config.num_train_epochs={epochs}"] if epochs else [])
  results = os.path.join(ft, "eval_results.json")
  if not (os.path.exists(results) and json.load(open(results)).get("finished")):
    from benchmarks import docstring_task  # pylint: disable=g-import-not-at-top
    sh(["bert_jax.finetune", "--config=bert_jax/configs/finetune.py:custom",
        f"--config.init_checkpoint={workdir}", f"--config.vocab_file={vocab}",
        f"--config.data_dir={task}", "--config.custom.format=csv",
        "--config.custom.text_a=text", "--config.custom.label=label",
        f"--config.custom.labels={','.join(docstring_task.PACKAGES)}",
        "--config.custom.train_file=train.csv", "--config.custom.dev_file=dev.csv",
        "--config.max_seq_length=64", f"--config.seed={seed}", "--config.do_predict=false",
        *chosen, f"--workdir={ft}"], log=os.path.join(out, f"ft_{preset}{tag}_seed{seed}.log"))
  r = json.load(open(results))
  last = r["history"][-1]
  acc = next(k for k in last if k.endswith("accuracy"))  # e.g. "dev/accuracy"
  # best: the epoch chosen on dev (what the export keeps; optimistic); last: the final epoch
  return dict(best=r["best_score"], best_epoch=r["best_epoch"], last=last[acc],
              epochs=len(r["history"]))


def add_run_flags(p, out_dir, steps_help=None):
  """The flags every side-by-side benchmark takes: where, how long, the data, the seeds and the
  fine-tuning rule (this module's and benchmarks/modern_side_by_side.py's)."""
  p.add_argument("--out_dir", default=os.path.join(ROOT, "runs", out_dir))
  p.add_argument("--steps", type=int, default=600, help=steps_help)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--dupe_factor", type=int, default=3)
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--ft_learning_rate", type=float, default=None,
                 help="fine-tuning rate (default: finetune's size-scaled rule)")
  p.add_argument("--ft_epochs", type=float, default=None,
                 help="fine-tuning epochs (default: finetune's size-scaled rule)")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  add_run_flags(p, "families")
  p.add_argument("--timing_steps", type=int, default=40,
                 help="steps of the back-to-back timing runs (0: none)")
  p.add_argument("--presets", default=",".join(PRESETS))
  args = p.parse_args()
  out = os.path.abspath(args.out_dir)
  os.makedirs(out, exist_ok=True)
  vocab, task = data(out, args.dupe_factor)
  presets = args.presets.split(",")
  rows = {preset: pretrain(out, preset, vocab, args.steps, args.batch_size) for preset in presets}
  if args.timing_steps:
    for preset, sec in timing_round(out, presets, vocab, args.batch_size,
                                    args.timing_steps).items():
      rows[preset]["sec_per_step_timing_round"] = sec
  for preset, r in rows.items():
    r["dev"] = [finetune(out, preset, r["workdir"], vocab, task, int(s), args.ft_learning_rate,
                         args.ft_epochs) for s in args.seeds.split(",")]
    print(f"{preset}: {json.dumps(r)}", flush=True)
  print(table(rows, args))
  print("RESULT " + json.dumps(dict(steps=args.steps, seeds=args.seeds, rows=rows)))


def table(rows, args):
  lines = [f"{args.steps} pre-training steps of {args.batch_size} x 128 each; fine-tuning seeds "
           f"{args.seeds}, learning rate {args.ft_learning_rate or 'default'}, epochs "
           f"{args.ft_epochs or 'default'}", "",
           "| model | encoder params | with heads | held-out MLM acc | held-out MLM loss | "
           "sentence / SBO acc (held out) | GFLOP/step | s/step (in the run; back to back) | dev acc, last epoch (mean ± sd) | per seed | "
           "best epoch's (mean) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for preset, r in rows.items():
    e = r["final_eval"]
    other = ", ".join(f"{k.split('/')[-1].split('_')[0].upper()} {v:.3f}" for k, v in e.items()
                      if k.endswith("_accuracy") and "mlm" not in k)
    dev = [d["last"] for d in r["dev"]]
    best = statistics.mean(d["best"] for d in r["dev"])
    sd = statistics.stdev(dev) if len(dev) > 1 else 0.0
    lines.append(f"| {preset} | {r['params'] / 1e6:.2f}M | {r['params_with_heads'] / 1e6:.2f}M "
                 f"| {e['eval/mlm_accuracy']:.4f} | {e['eval/mlm_loss']:.3f} | {other or '-'} | "
                 f"{r['gflop_per_step']:.0f} | {r['sec_per_step']:.3f}; "
                 f"{r.get('sec_per_step_timing_round') or float('nan'):.3f} | "
                 f"{statistics.mean(dev):.3f} ± {sd:.3f} | "
                 f"{' '.join(f'{x:.3f}' for x in dev)} | {best:.3f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
