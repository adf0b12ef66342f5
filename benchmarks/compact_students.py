r"""Issue 41's evidence on the quick-start corpus (stdlib docstrings): compact students of the quick
start's BERT-tiny at equal student compute, and MobileBERT-tiny, fine-tuned on the docstring task.

1. The teacher: scripts/quickstart_pretrain.sh's run, as benchmarks/electra_distil.py trains it
   (BERT-tiny, `tiny,runlocal`: 1,500 steps of 32 x 128 on NSP records).
2. Three students of ONE shape, 1 layer x 128 (2 heads, FFN 512: distilbert-tiny's, the only
   shape all three recipes reach from this teacher: DistilBERT compares hidden states one to one,
   so it must be as wide as the teacher, and it starts from the teacher's layer 0), each --steps
   steps of --batch_size x 128 on the same --no_nsp records (equal student compute: the same
   steps, rows and records; the two distilled ones also run the frozen teacher's forward in each
   step, which the FLOPs columns show):
     tinybert-1l-128  TinyBERT's general distillation (bert_jax/objectives/layerwise.py: embedding, hidden-
                      state and attention-score MSE, layer map g(1) = 2, no fit_dense; the
                      student from random weights, as TinyBERT's)
     distilbert-tiny  DistilBERT's recipe (bert_jax/families/distilbert/distil.py: soft CE x 5 + MLM x 2 + cosine x 1,
                      T 2; the student initialised from the teacher's layer 0)
     tiny-1l          the same BertModel from scratch, MLM only
   All under the `runlocal` recipe (lr 1e-3, 10% warmup), the families' own objectives.
3. MobileBERT-tiny (2 x 64, bottleneck 32) pre-trained from scratch (MLM + NSP) for --steps on
   the NSP records; with --transfer also its knowledge transfer (layer-wise, all layers at once)
   from an ib-bert-tiny teacher pre-trained on the same records for the same steps.
4. Every model (the teachers included) fine-tuned on the docstring task (benchmarks/
   docstring_task.py) with each seed in --seeds at electra_distil's rule (lr 5e-4, 8 epochs):
   dev accuracy of the last epoch, mean ± sd and per seed.
5. CPU inference speed: a jitted encoder forward of --speed_batch x 128 (electra_distil.
   inference_speed: each family's own body, the presets in turn within each of --speed_reps
   repetitions, the median), each student against its teacher.

  nice -n 5 .venv/bin/python -m benchmarks.compact_students --seeds=0,1,2

Everything goes to --out_dir (default runs/compact_students); a re-run reuses what is finished,
so an interrupted run continues. Prints Markdown tables and a `RESULT {json}` line.
"""

import argparse
from concurrent import futures
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)

from benchmarks import electra_distil as ed  # noqa: E402  pylint: disable=g-import-not-at-top
from benchmarks import families_side_by_side as fam  # noqa: E402  pylint: disable=g-import-not-at-top

# name -> (preset, what it is): the students' rows, in order.
STUDENTS = {"tinybert": ("tinybert-1l-128", "TinyBERT, general distillation"),
            "distilbert": ("distilbert-tiny", "DistilBERT, its recipe"),
            "scratch": ("tiny-1l", "the same model from scratch, MLM only")}


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out_dir", default=os.path.join(ROOT, "runs", "compact_students"))
  p.add_argument("--teacher", default="tiny", help="the quick-start preset")
  p.add_argument("--teacher_steps", type=int, default=1500, help="the quick start's 1,500")
  p.add_argument("--steps", type=int, default=1500, help="each student's (and MobileBERT's)")
  p.add_argument("--batch_size", type=int, default=32, help="rows of 128 a step (runlocal's)")
  p.add_argument("--dupe_factor", type=int, default=5, help="5: the quick start's")
  p.add_argument("--mobilebert", default="mobilebert-tiny")
  p.add_argument("--ib_teacher", default="ib-bert-tiny", help="MobileBERT's transfer teacher")
  p.add_argument("--transfer", action=argparse.BooleanOptionalAction, default=True,
                 help="also MobileBERT by knowledge transfer from --ib_teacher")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--ft_learning_rate", type=float, default=5e-4)
  p.add_argument("--ft_epochs", type=float, default=8)
  p.add_argument("--speed_batch", type=int, default=32)
  p.add_argument("--speed_reps", type=int, default=30)
  p.add_argument("--no_finetune", default="", type=lambda x: x.split(",") if x else [],
                 help="rows not fine-tuned (e.g. ib_teacher: the transfer's teacher only)")
  p.add_argument("--jobs", type=int, default=1,
                 help="runs at once (pre-trainings and fine-tunes are independent processes)")
  args = p.parse_args(argv)
  try:
    args.seed_list = [int(s) for s in args.seeds.split(",")]
  except ValueError:
    p.error(f"--seeds={args.seeds}: expected comma-separated integers, e.g. --seeds=0,1,2")
  rows = ("teacher", *STUDENTS, "mobilebert", "ib_teacher", "mobilebert_kt")
  unknown = sorted(set(args.no_finetune) - set(rows))
  if unknown:
    p.error(f"--no_finetune={','.join(unknown)}: not a row; the rows are {', '.join(rows)}")
  for flag in ("teacher_steps", "steps", "batch_size", "speed_batch", "speed_reps", "jobs"):
    if getattr(args, flag) < 1:
      p.error(f"--{flag}={getattr(args, flag)}: must be at least 1")
  return args


def encoder_params(preset, vocab_size):
  """Parameters of the family's body (BertModel; MobileBertModel for MobileBERT), from shapes."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as m  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  c = m.get_bert_config(preset, vocab_size=vocab_size)
  body = type(families.get(c.family).features_model(c)[0])
  return m.count_params(jax.eval_shape(
      lambda: pretraining_heads.init_params(c, jax.random.key(0), model_cls=body)))


def main():
  args = parse_args()
  out = os.path.abspath(args.out_dir)
  os.makedirs(out, exist_ok=True)
  vocab, task = fam.data(out, args.dupe_factor, kinds=("nsp", "full"))
  v = fam.vocab_size(vocab)
  n, bs = args.steps, args.batch_size

  pool = futures.ThreadPoolExecutor(args.jobs)   # runs are subprocesses: threads only wait
  runs = {}   # name -> future of its row

  def pretrain(name, preset, what, kind, steps, extra=(), teacher=None):
    def go():
      more = list(extra)
      if teacher:   # the teacher's run first (submitted earlier, so started: no deadlock)
        more.append(f"--config.teacher_checkpoint={runs[teacher].result()['workdir']}")
      r = dict(preset=preset, what=what, **fam.train_run(out, name, preset, kind, vocab, steps,
                                                         32 if name == "teacher" else bs, more))
      print(f"{name}: {json.dumps(r)}", flush=True)
      return r
    runs[name] = pool.submit(go)

  # ---- pre-training: the teacher, three students, MobileBERT (each reused when finished) -----
  pretrain("teacher", args.teacher, "the quick start's BERT-tiny", "nsp", args.teacher_steps)
  pretrain("scratch", STUDENTS["scratch"][0], STUDENTS["scratch"][1], "full", n,
           ["--config.model.objectives=mlm"])
  pretrain("mobilebert", args.mobilebert, "MobileBERT from scratch, MLM + NSP", "nsp", n)
  if args.transfer:
    pretrain("ib_teacher", args.ib_teacher, "its transfer teacher, MLM + NSP", "nsp", n)
  pretrain("tinybert", STUDENTS["tinybert"][0], STUDENTS["tinybert"][1], "full", n,
           ["--config.fit_size=0"], teacher="teacher")
  pretrain("distilbert", STUDENTS["distilbert"][0], STUDENTS["distilbert"][1], "full", n,
           teacher="teacher")
  if args.transfer:
    pretrain("mobilebert_kt", args.mobilebert, "MobileBERT by layer-wise transfer from it",
             "nsp", n, teacher="ib_teacher")

  # ---- fine-tuning, every model, every seed (after the pre-trainings in the queue; those that
  # need no distillation last, as they are the likeliest to be finished by an earlier run) -----
  order = ["teacher", "tinybert", "distilbert", "mobilebert_kt", "scratch", "mobilebert",
           "ib_teacher"]
  tunes = {name: [pool.submit(lambda name=name, s=s: fam.finetune(
      out, name, runs[name].result()["workdir"], vocab, task, s, args.ft_learning_rate,
      args.ft_epochs)) for s in args.seed_list] if name not in args.no_finetune else []
           for name in order if name in runs}
  rows = {}
  for name, fs in tunes.items():   # the analytic costs here, in this thread (jax traces)
    r = rows[name] = dict(runs[name].result(),
                          dev=ed.dev_summary([f.result() for f in fs]) if fs else None)
    own = fam.step_flops(r["preset"], 32 if name == "teacher" else bs, v,
                         "mlm" if name == "scratch" else None) / 1e9
    r["own_gflop_per_step"] = own   # the network's training step alone (no teacher)
    r["teacher_gflop_per_step"] = r["gflop_per_step"] - own if r["gflop_per_step"] else None
    r["params"] = encoder_params(r["preset"], v)
    print(f"{name} dev: {json.dumps(r['dev'])}", flush=True)
  pool.shutdown()

  # ---- inference speed (random weights: the time depends on the shapes only) -----------------
  presets = list(dict.fromkeys([args.teacher, *(p for p, _ in STUDENTS.values()),
                                args.mobilebert, args.ib_teacher]))
  speed = ed.inference_speed(presets, v, args.speed_batch, args.speed_reps)
  print(tables(args, rows, speed))
  print("RESULT " + json.dumps(dict(args={k: x for k, x in vars(args).items()}, rows=rows,
                                    speed=speed)))


def tables(args, rows, speed):
  """The students' table, MobileBERT's, and the speeds against each teacher."""
  fmt = lambda d: (f"{d['mean']:.3f} ± {d['sd']:.3f} | "  # noqa: E731
                   f"{' '.join(f'{x:.3f}' for x in d['per_seed'])}" if d else "not fine-tuned | -")
  mlm = lambda r: r["final_eval"].get("eval/mlm_accuracy", float("nan"))  # noqa: E731
  ms = lambda r: speed[r["preset"]] * 1e3  # noqa: E731
  head = ("| model | preset | encoder params | steps x rows | GFLOP/step: own training + "
          "teacher forward | pre-training TFLOP (summary.json) | held-out MLM acc | "
          f"dev acc (mean ± sd) | per seed | forward {args.speed_batch} x 128, ms | vs its "
          "teacher |")
  rule = "|---|---|---|---|---|---|---|---|---|---|---|"

  def line(name, r, teacher):
    t = r["teacher_gflop_per_step"]
    cost = f"{r['own_gflop_per_step']:.1f}" + (f" + {t:.1f}" if t and t > 0.05 else "")
    vs = f"{speed[teacher['preset']] / speed[r['preset']]:.2f}x" if teacher else "-"
    rows_ = 32 if name == "teacher" else args.batch_size
    return (f"| {name}: {r['what']} | {r['preset']} | {r['params'] / 1e6:.2f}M | "
            f"{r['steps']} x {rows_} | {cost} | {r['pretrain_tflop']:.2f} | {mlm(r):.4f} | "
            f"{fmt(r['dev'])} | {ms(r):.1f} | {vs} |")

  t = rows["teacher"]
  lines = [f"Students of the quick-start teacher at equal student compute ({args.steps} steps of "
           f"{args.batch_size} x 128 each; fine-tuning lr {args.ft_learning_rate:g}, "
           f"{args.ft_epochs:g} epochs, seeds {args.seeds})", "", head, rule,
           line("teacher", t, None)]
  lines += [line(name, rows[name], t) for name in STUDENTS]
  lines += ["", f"MobileBERT ({args.steps} steps of {args.batch_size} x 128)", "", head, rule]
  ib = rows.get("ib_teacher")
  lines.append(line("mobilebert", rows["mobilebert"], ib or t))
  if ib:
    lines += [line("ib_teacher", ib, None), line("mobilebert_kt", rows["mobilebert_kt"], ib)]
  else:
    lines.append("(its speed against the quick-start teacher: no transfer run, --no-transfer)")
  lines += ["", f"Encoder forward, {args.speed_batch} x 128, median of {args.speed_reps} "
            "interleaved repetitions (random weights: the time is the shape's)", "",
            f"| preset | ms | {t['preset']}'s time / its |", "|---|---|---|"]
  lines += [f"| {p} | {s * 1e3:.1f} | {speed[t['preset']] / s:.2f}x |" for p, s in speed.items()]
  return "\n".join(lines)


if __name__ == "__main__":
  main()
