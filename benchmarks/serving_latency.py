r"""CPU serving latency: a compact student against its teacher, both exported the same way
(bert_jax/export_serving.py: TFLite through jax2tf), batch 1, in one run.

  .venv/bin/python -m benchmarks.serving_latency [--student=tinybert-4l-312] [--teacher=base] \
      [--seq=128] [--runs=50] [--warmup=5] [--threads=1]

Both are sentence classifiers (2 labels) with RANDOM weights: latency depends on the shapes,
not the values (the flatbuffers run the same kernels on any numbers). Each is exported, checked
against our own jitted forward within export_serving's tolerance, loaded in TFLite's interpreter
(XNNPACK, --threads threads), warmed up, then timed invoke by invoke with the two models
interleaved (student, teacher, student, ...) so that a change in the machine's load hits both
alike. Per model: the median wall milliseconds of one invoke and the median CPU milliseconds of
the calling thread (with --threads=1 the interpreter computes on it: the figure least moved by
other processes on a shared box); then the teacher / student ratios, the figures to read.
For context, our own jitted forward on the same CPU (XLA's threads; wall time only).
"""

import argparse
import statistics
import os
import subprocess
import sys
import time

import bert_jax  # noqa: F401  first: picks JAX's platforms (a CPU host with libtpu stays quiet)
from bert_jax import export_serving
import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bert_jax.models import heads
from bert_jax.models import model as model_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def classifier(preset, seq, seed=0):
  """(config, model, params): a random 2-label classifier of `preset`, float32, no dropout."""
  config = model_lib.get_bert_config(preset)
  model = heads.create_model("classification", config, num_labels=2)
  ids = jnp.zeros((1, seq), jnp.int32)
  params = nn.unbox(jax.jit(lambda r: model.init(r, ids, ids, ids))(jax.random.PRNGKey(seed)))
  return config, model, params["params"]


def count(params):
  return sum(int(np.prod(a.shape)) for a in jax.tree.leaves(params))


def timed_invokes(runners, batch, *, runs, warmup):
  """{name: ([wall ms], [thread CPU ms])}, the runners called in turn `runs` times each after
  `warmup` untimed calls each."""
  for _ in range(warmup):
    for run in runners.values():
      run(**batch)
  out = {name: ([], []) for name in runners}
  for _ in range(runs):
    for name, run in runners.items():
      w, c = time.perf_counter(), time.thread_time()
      run(**batch)
      out[name][0].append((time.perf_counter() - w) * 1e3)
      out[name][1].append((time.thread_time() - c) * 1e3)
  return out


def jax_wall_ms(forward, batch, *, runs, warmup):
  """Median wall ms of our jitted forward (compiled first, not timed)."""
  f = jax.jit(forward)
  for _ in range(max(warmup, 1)):
    f(**batch).block_until_ready()
  times = []
  for _ in range(runs):
    t = time.perf_counter()
    f(**batch).block_until_ready()
    times.append((time.perf_counter() - t) * 1e3)
  return statistics.median(times)


def cpu_name():
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return "unknown CPU"


def provenance():
  commit = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=ROOT,
                          capture_output=True, text=True, check=False).stdout.strip()
  return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit or 'unknown'}, "
          f"{os.cpu_count()} CPUs ({cpu_name()}), load average "
          f"{os.getloadavg()[0]:.1f}, jax {jax.__version__}, tensorflow "
          f"{export_serving._tf_version()}")  # pylint: disable=protected-access


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--student", default="tinybert-4l-312", help="student preset")
  p.add_argument("--teacher", default="base", help="teacher preset (BERT-base)")
  p.add_argument("--seq", type=int, default=128, help="sequence length (batch is 1)")
  p.add_argument("--runs", type=int, default=50, help="timed invokes per model")
  p.add_argument("--warmup", type=int, default=5, help="untimed invokes per model first")
  p.add_argument("--threads", type=int, default=1, help="TFLite interpreter threads")
  p.add_argument("--no_jax", action="store_true", help="skip our own jitted forward's timing")
  a = p.parse_args(argv)
  for name in ("student", "teacher"):
    if getattr(a, name) not in model_lib.PRESETS:
      p.error(f"--{name}={getattr(a, name)}: not a preset; e.g. tinybert-4l-312, base.")
  if min(a.seq, a.runs, a.threads) < 1 or a.warmup < 0:
    p.error("--seq, --runs and --threads must be at least 1, --warmup at least 0.")
  return a


def main(argv=None):
  a = parse_args(argv)
  rng = np.random.default_rng(0)
  runners, rows, forwards = {}, {}, {}
  for role, preset in (("student", a.student), ("teacher", a.teacher)):
    config, model, params = classifier(preset, a.seq)
    forward = export_serving.forward_fn(model, params)
    t = time.perf_counter()
    flatbuffer = export_serving.to_tflite(forward, 1, a.seq)
    runner = export_serving.TFLiteRunner(flatbuffer, num_threads=a.threads)
    theirs, ours, diff = export_serving.compare(
        runner, forward, export_serving.check_rows(config, 4, a.seq), 1)
    if not export_serving.within_tolerance(theirs, ours):
      raise SystemExit(f"{role} {preset}: TFLite logits differ from ours by {diff:.2e}")
    rows[role] = (f"{role} {preset}: {config.num_layers} x {config.hidden_size}, "
                  f"{count(params) / 1e6:.1f}M parameters, flatbuffer "
                  f"{len(flatbuffer) / 1e6:.0f} MB (exported in {time.perf_counter() - t:.0f} s, "
                  f"max |diff| to ours {diff:.1e})")
    print(rows[role], flush=True)
    runners[role], forwards[role] = runner, forward
  # One sentence pair filling the sequence: [CLS] ... [SEP] ... [SEP] (the shape is fixed).
  batch = dict(input_ids=rng.integers(1000, 30000, (1, a.seq)).astype(np.int32),
               input_mask=np.ones((1, a.seq), np.int32),
               segment_ids=(np.arange(a.seq)[None] >= a.seq // 2).astype(np.int32))
  times = timed_invokes(runners, batch, runs=a.runs, warmup=a.warmup)
  med = {r: (statistics.median(w), statistics.median(c)) for r, (w, c) in times.items()}
  print(f"TFLite, batch 1, seq {a.seq}, {a.threads} thread(s), median of {a.runs} after "
        f"{a.warmup} warm-up, interleaved:")
  for role in runners:
    print(f"  {role:<8s} wall {med[role][0]:8.1f} ms   thread CPU {med[role][1]:8.1f} ms")
  print(f"  teacher / student: wall {med['teacher'][0] / med['student'][0]:.1f}x, thread CPU "
        f"{med['teacher'][1] / med['student'][1]:.1f}x")
  if not a.no_jax:
    ours = {r: jax_wall_ms(forwards[r], batch, runs=max(a.runs // 5, 3), warmup=a.warmup)
            for r in forwards}
    print(f"ours (jax.jit on this CPU, XLA's threads; context): student "
          f"{ours['student']:.1f} ms, teacher {ours['teacher']:.1f} ms wall")
  print(f"({provenance()})")
  return med


if __name__ == "__main__":
  main(sys.argv[1:])
