r"""Issue 21's two figures on the quick-start corpus (stdlib docstrings), on whatever machine runs it.

1. ELECTRA vs BERT at equal pre-training compute: BERT (--bert, MLM only, on the same full-
   sentence records as ELECTRA, so the objective is the only difference) for --bert_steps, ELECTRA
   (--electra) for as many steps as make the same analytic FLOPs (train.step_flops: generator,
   discriminator and both heads; summary.json's pretrain_tflop, printed for each run).
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


def inference_speed(presets, vocab_size, batch, reps, seq=128):
  """{preset: median seconds} of a jitted encoder forward on [batch, seq] (all real tokens): the
  family's body (features_model: BertModel, MobileBertModel, ...), the presets timed in turn
  within each repetition so load changes hit them alike."""
  import flax.linen as nn  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as m  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  rng = np.random.default_rng(0)
  ids = jax.numpy.asarray(rng.integers(5, vocab_size, (batch, seq)), jax.numpy.int32)
  mask, seg = jax.numpy.ones_like(ids), jax.numpy.zeros_like(ids)
  fns = {}
  for preset in presets:
    c = m.get_bert_config(preset, vocab_size=vocab_size)
    body, method = families.get(c.family).features_model(c)
    params = nn.meta.unbox(pretraining_heads.init_params(c, jax.random.key(0),
                                                         model_cls=type(body)))
    fn = jax.jit(lambda p, model=body, method=method: model.apply(
        {"params": p}, ids, mask, seg, method=method)["sequence_output"])
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
  f_bert = fam.step_flops(args.bert, args.batch_size, v, objectives="mlm")
  f_electra = fam.step_flops(args.electra, args.batch_size, v)
  electra_steps = round(args.bert_steps * f_bert / f_electra)
  rows = {}
  rows[args.bert] = fam.train_run(out, args.bert, args.bert, "full", vocab, args.bert_steps,
                                  args.batch_size, ["--config.model.objectives=mlm"])
  rows[args.electra] = fam.train_run(out, args.electra, args.electra, "full", vocab,
                                     electra_steps, args.batch_size)
  for name, r in rows.items():   # each row is named by its preset
    r["params"] = fam.count_params(name, v)["params"]   # the encoder; ELECTRA: the discriminator
    r["dev"] = ft(name, r["workdir"])
    print(f"{name}: {json.dumps(r)}", flush=True)

  # 2. DistilBERT from the quick-start teacher.
  teacher = fam.train_run(out, "teacher", args.teacher, "nsp", vocab, 1500, 32)
  student = fam.train_run(out, "student", args.student, "full", vocab, args.student_steps, 32,
                          [f"--config.teacher_checkpoint={teacher['workdir']}"])
  for name, r, preset in (("teacher", teacher, args.teacher), ("student", student, args.student)):
    r["params"] = fam.count_params(preset, v)["params"]
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
