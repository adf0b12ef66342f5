r"""Issue 21's two figures on the quick-start corpus (stdlib docstrings), on whatever machine runs it.

1. ELECTRA vs BERT at equal pre-training compute: BERT (--bert, MLM only, on the same full-
   sentence records as ELECTRA, so the objective is the only difference) for --bert_steps, ELECTRA
   (--electra) for as many steps as make the same analytic FLOPs (train.step_flops: generator,
   discriminator and both heads; summary.json's pretrain_tflop, checked equal within one step).
   Then each is fine-tuned on the docstring task (benchmarks/docstring_task.py: which of six
   stdlib packages a sentence is from) with every seed in --seeds; ELECTRA from its discriminator.
2. DistilBERT from the quick-start teacher: the teacher is scripts/quickstart_pretrain.sh's run
   (BERT-tiny, `tiny,runlocal`: 1,500 steps of 32 x 128 on NSP records); the student
   (`distilbert-tiny`: every other teacher layer, no token types, no pooler) distils from it for
   --student_steps steps of 32 x 128 (`runlocal`) on full-sentence records. Both are fine-tuned
   as above; reported: the fraction of the teacher's dev accuracy the student keeps, parameters,
   and the encoder's inference speed ratio (jitted forward of --speed_batch x 128 on this
   machine's devices, median of --speed_reps interleaved timings, after compilation).

  nice -n 19 .venv/bin/python -m benchmarks.electra_distil --seeds=0,1,2

Everything goes to --out_dir (default runs/electra_distil); a re-run reuses what is finished, so
an interrupted run continues. Prints Markdown tables and a `RESULT {json}` line.
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import families_side_by_side as fam  # noqa: E402  pylint: disable=g-import-not-at-top


def step_flops(preset, batch_size, vocab_size, teacher_preset=None, objectives=None):
  """Analytic FLOPs of one `runlocal` optimizer step (packed rows), as train.py logs them."""
  from bert_jax import model as m, train  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  config = pretrain.get_config(f"{preset},runlocal")
  config.batch_size = batch_size
  overrides = dict(objectives=objectives) if objectives else {}
  teacher = None
  if teacher_preset:
    class _T:   # train.step_flops reads teacher.model_config only
      model_config = m.get_bert_config(teacher_preset, vocab_size=vocab_size)
    teacher = _T
  return train.step_flops(config, m.get_bert_config(preset, vocab_size=vocab_size, **overrides),
                          dict(pack=True), teacher)


def train_run(out, name, preset, kind, vocab, steps, batch_size, extra=()):
  """One `python -m bert_jax.train` run (skipped when its summary says it finished); returns
  {summary fields, sec_per_step, workdir}."""
  workdir = os.path.join(out, f"work_{name}")
  log = os.path.join(out, f"pretrain_{name}.log")
  path = os.path.join(workdir, "summary.json")
  if not (os.path.exists(path) and json.load(open(path)).get("final_step") == steps
          and os.path.exists(log)):
    fam.sh(["bert_jax.train", f"--config=bert_jax/configs/pretrain.py:{preset},runlocal",
            f"--workdir={workdir}", f"--config.train_input_files={out}/{kind}/train/*.tfrecord",
            f"--config.eval_input_files={out}/{kind}/eval/*.tfrecord",
            f"--config.vocab_file={vocab}", f"--config.num_train_steps={steps}",
            f"--config.batch_size={batch_size}", f"--config.warmup_steps={steps // 10}",
            f"--config.log_every={max(steps // 10, 1)}", f"--config.eval_every={steps}",
            f"--config.checkpoint_every={steps}", "--config.eval_steps=30", *extra], log=log)
  s = json.load(open(path))
  return dict(final_eval=s["final_eval"], pretrain_tflop=s["pretrain_tflop"],
              gflop_per_step=s["gflop_per_step"], steps=steps, workdir=workdir,
              sec_per_step=fam.seconds_per_step(log, batch_size),
              wall_time_sec=s["wall_time_sec"])


def encoder_params(preset, vocab_size):
  """Parameters of the encoder a fine-tuning starts from (ELECTRA: the discriminator)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import model as m  # pylint: disable=g-import-not-at-top
  c = m.get_bert_config(preset, vocab_size=vocab_size)
  return m.count_params(jax.eval_shape(
      lambda: m.init_params(c, jax.random.key(0), model_cls=m.BertModel)))


def inference_speed(presets, vocab_size, batch, reps, seq=128):
  """{preset: median seconds} of a jitted BertModel forward on [batch, seq] (all real tokens),
  the presets timed in turn within each repetition so load changes hit them alike."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax import model as m  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  ids = jax.numpy.asarray(rng.integers(5, vocab_size, (batch, seq)), jax.numpy.int32)
  mask, seg = jax.numpy.ones_like(ids), jax.numpy.zeros_like(ids)
  fns = {}
  for preset in presets:
    c = m.get_bert_config(preset, vocab_size=vocab_size)
    params = nn.meta.unbox(m.init_params(c, jax.random.key(0), model_cls=m.BertModel))
    fn = jax.jit(lambda p, model=m.BertModel(c): model.apply(
        {"params": p}, ids, mask, seg)["sequence_output"])
    jax.block_until_ready(fn(params))   # compile
    fns[preset] = (fn, params)
  times = {p: [] for p in presets}
  for _ in range(reps):
    for preset, (fn, params) in fns.items():
      t = time.perf_counter()
      jax.block_until_ready(fn(params))
      times[preset].append(time.perf_counter() - t)
  return {p: statistics.median(t) for p, t in times.items()}


def dev_summary(runs):
  last = [r["last"] for r in runs]
  return dict(mean=statistics.mean(last), sd=statistics.stdev(last) if len(last) > 1 else 0.0,
              per_seed=last, best_mean=statistics.mean(r["best"] for r in runs))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out_dir", default=os.path.join(ROOT, "runs", "electra_distil"))
  p.add_argument("--bert", default="mini")
  p.add_argument("--electra", default="electra-mini")
  p.add_argument("--bert_steps", type=int, default=400)
  p.add_argument("--batch_size", type=int, default=16)
  p.add_argument("--teacher", default="tiny", help="the quick-start preset")
  p.add_argument("--student", default="distilbert-tiny")
  p.add_argument("--student_steps", type=int, default=1500)
  p.add_argument("--dupe_factor", type=int, default=5, help="5: the quick start's")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--ft_learning_rate", type=float, default=5e-4)
  p.add_argument("--ft_epochs", type=float, default=8)
  p.add_argument("--speed_batch", type=int, default=32)
  p.add_argument("--speed_reps", type=int, default=30)
  args = p.parse_args()
  out = os.path.abspath(args.out_dir)
  os.makedirs(out, exist_ok=True)
  vocab, task = fam.data(out, args.dupe_factor, kinds=("nsp", "full"))
  v = fam.vocab_size(vocab)
  seeds = [int(s) for s in args.seeds.split(",")]
  ft = lambda name, workdir: dev_summary([fam.finetune(  # noqa: E731
      out, name, workdir, vocab, task, s, args.ft_learning_rate, args.ft_epochs) for s in seeds])

  # 1. ELECTRA vs BERT at equal compute.
  f_bert = step_flops(args.bert, args.batch_size, v, objectives="mlm")
  f_electra = step_flops(args.electra, args.batch_size, v)
  electra_steps = round(args.bert_steps * f_bert / f_electra)
  rows = {}
  rows[args.bert] = train_run(out, args.bert, args.bert, "full", vocab, args.bert_steps,
                              args.batch_size, ["--config.model.objectives=mlm"])
  rows[args.electra] = train_run(out, args.electra, args.electra, "full", vocab, electra_steps,
                                 args.batch_size)
  for name, r in rows.items():
    r["params"] = encoder_params(args.bert if name == args.bert else args.electra, v)
    r["dev"] = ft(name, r["workdir"])
    print(f"{name}: {json.dumps(r)}", flush=True)

  # 2. DistilBERT from the quick-start teacher.
  teacher = train_run(out, "teacher", args.teacher, "nsp", vocab, 1500, 32)
  student = train_run(out, "student", args.student, "full", vocab, args.student_steps, 32,
                      [f"--config.teacher_checkpoint={teacher['workdir']}"])
  for name, r, preset in (("teacher", teacher, args.teacher), ("student", student, args.student)):
    r["params"] = encoder_params(preset, v)
    r["dev"] = ft(name, r["workdir"])
    print(f"{name}: {json.dumps(r)}", flush=True)
  speed = inference_speed([args.teacher, args.student], v, args.speed_batch, args.speed_reps)

  print(tables(args, rows, electra_steps, teacher, student, speed))
  print("RESULT " + json.dumps(dict(args=vars(args), electra_steps=electra_steps, rows=rows,
                                    teacher=teacher, student=student, speed=speed)))


def tables(args, rows, electra_steps, teacher, student, speed):
  fmt = lambda d: (f"{d['mean']:.3f} ± {d['sd']:.3f} | "  # noqa: E731
                   f"{' '.join(f'{x:.3f}' for x in d['per_seed'])} | {d['best_mean']:.3f}")
  lines = [f"ELECTRA vs BERT at equal compute ({args.batch_size} x 128 per step; fine-tuning lr "
           f"{args.ft_learning_rate:g}, {args.ft_epochs:g} epochs, seeds {args.seeds})", "",
           "| model | steps | GFLOP/step | pre-training TFLOP | s/step | encoder params | "
           "held-out MLM acc (generator for ELECTRA) | dev acc, last epoch (mean ± sd) | "
           "per seed | best epoch's (mean) |", "|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in rows.items():
    lines.append(f"| {name} | {r['steps']} | {r['gflop_per_step']:.1f} | "
                 f"{r['pretrain_tflop']:.2f} | {r['sec_per_step']:.3f} | {r['params'] / 1e6:.2f}M"
                 f" | {r['final_eval'].get('eval/mlm_accuracy', float('nan')):.4f} | "
                 f"{fmt(r['dev'])} |")
  kept = student["dev"]["mean"] / teacher["dev"]["mean"]
  lines += ["", f"DistilBERT from the quick-start teacher ({args.student_steps} distillation "
            "steps of 32 x 128)", "",
            "| model | params (encoder) | dev acc, last epoch (mean ± sd) | per seed | "
            f"best epoch's (mean) | forward {args.speed_batch} x 128, ms (median) |",
            "|---|---|---|---|---|---|"]
  for name, r, preset in (("teacher", teacher, args.teacher), ("student", student, args.student)):
    lines.append(f"| {name} ({preset}) | {r['params'] / 1e6:.2f}M | {fmt(r['dev'])} | "
                 f"{speed[preset] * 1e3:.1f} |")
  lines += ["", f"student keeps {kept:.1%} of the teacher's dev accuracy with "
            f"{student['params'] / teacher['params']:.1%} of its parameters, "
            f"{speed[args.teacher] / speed[args.student]:.2f}x its inference speed"]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
