r"""CLI start-up: `python -m bert_jax.predict fill-mask` vs transformers' pipeline("fill-mask"),
on the same exported model, in one run.

  .venv/bin/python -m benchmarks.startup [--repeats=5] [--before=/path/to/an/older/checkout]

The model is the quick start's size (BERT-tiny: 2 layers, hidden 128, a 5,000-token vocab) with
random weights, written once as our Orbax export and, through `bert_jax.convert`, as a Hugging
Face folder. Each command is a fresh process, as a user runs it:
  ours          python -m bert_jax.predict --init_checkpoint=EXPORT fill-mask TEXT   (this tree)
  ours-before   the same from --before (e.g. a `git worktree` of an older commit), if given
  hf            python -c "pipeline('fill-mask', model=HF_FOLDER)(TEXT)"   (transformers, CPU)
Runs are interleaved (ours, ours-before, hf, ours, ...) so a load change on a shared machine hits
all alike. Per command: the median wall time to its first line of output, to its exit (the
answer printed), and the CPU seconds it used (user + sys of the child: the figure least moved by
other work on the machine). The ratios to hf are the figures to read.
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEXT = "the man went to the [MASK] ."

HF_SCRIPT = """
import sys
from transformers import pipeline
fill = pipeline("fill-mask", model=sys.argv[1], device="cpu")
for r in fill(sys.argv[2], top_k=5):
  print(f"{r['token_str']:<20s} {r['score']:.4f}")
"""


def build_model(directory):
  """(Orbax export, HF folder) of a random BERT-tiny with a 5,000-token vocab."""
  sys.path.insert(0, ROOT)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import hf_export  # pylint: disable=g-import-not-at-top
  from tests.testlib import hf_testlib  # pylint: disable=g-import-not-at-top
  vocab = os.path.join(directory, "vocab.txt")
  hf_testlib.write_vocab(vocab, 5000)
  cfg = model_lib.get_bert_config("tiny", vocab_size=5000)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(cfg,
                                                                           jax.random.PRNGKey(0))))
  export = os.path.join(directory, "export")
  ckpt_lib.save_params(export, params, cfg, meta={"do_lower_case": True})
  shutil.copyfile(vocab, os.path.join(export, "vocab.txt"))
  return export, hf_export.export_to_hf(export, os.path.join(directory, "hf"))


def timed(cmd, cwd, env):
  """(seconds to the first stdout line, seconds to exit, CPU seconds) of one fresh process."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  p = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
  first = p.stdout.readline()
  t_first = time.perf_counter() - t0
  out, err = p.communicate()
  t_exit = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if p.returncode:
    raise SystemExit(f"{cmd[:4]} failed ({p.returncode}):\n{first}{out}\n{err[-3000:]}")
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return t_first, t_exit, cpu, first.strip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--before", default="", help="an older checkout to time as ours-before")
  a = parser.parse_args()
  tmp = tempfile.mkdtemp(prefix="startup-bench-")
  export, hf = build_model(tmp)
  base_env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  base_env["JAX_PLATFORMS"] = "cpu"

  def ours(checkout):
    # A fresh compilation cache: the first run compiles (cold), later ones read it (warm).
    return ([sys.executable, "-m", "bert_jax.predict", f"--init_checkpoint={export}",
             "fill-mask", TEXT], checkout,
            dict(base_env, PYTHONPATH=checkout, BERT_JAX_CACHE=tempfile.mkdtemp(dir=tmp)))

  commands = {"ours": ours(ROOT)}
  if a.before:
    commands["ours-before"] = ours(os.path.abspath(a.before))
  commands["hf"] = ([sys.executable, "-c", HF_SCRIPT, hf, TEXT], tmp,
                    dict(base_env, TRANSFORMERS_VERBOSITY="error"))
  runs = {name: [] for name in commands}
  firsts = {}
  for _ in range(a.repeats):
    for name, (cmd, cwd, env) in commands.items():
      t_first, t_exit, cpu, first = timed(cmd, cwd, env)
      runs[name].append((t_first, t_exit, cpu))
      firsts[name] = first
  med = {name: [statistics.median(x[i] for x in r) for i in range(3)] for name, r in runs.items()}
  print(f"{'command':<12} {'first output s':>14} {'answer s':>9} {'CPU s':>7}  "
        "(medians of {n}; ratio to hf)  1st run: answer s, CPU s  first line".replace(
            "{n}", str(a.repeats)))
  for name, (t_first, t_exit, cpu) in med.items():
    h, cold = med["hf"], runs[name][0]
    print(f"{name:<12} {t_first:>14.2f} {t_exit:>9.2f} {cpu:>7.2f}  "
          f"({t_first / h[0]:.2f}x {t_exit / h[1]:.2f}x {cpu / h[2]:.2f}x)  "
          f"{cold[1]:.2f} {cold[2]:.2f}  {firsts[name][:50]}")
  print("RESULT " + json.dumps({name: dict(first_output_s=m[0], answer_s=m[1], cpu_s=m[2],
                                           first_run_answer_s=runs[name][0][1],
                                           first_run_cpu_s=runs[name][0][2])
                                for name, m in med.items()}))
  shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
  main()
