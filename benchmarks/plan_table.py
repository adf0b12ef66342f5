r"""docs/planning.md's table: `bert_jax.plan` for BERT-base phase 1 and BERT-large phase 2 on one
slice each of TPU v4, v5e, v5p and v6e, compiled on this host (no TPU needed, libtpu installed).

  python -m benchmarks.plan_table --out_dir=runs/plans            # runs the missing plans
  python -m benchmarks.plan_table --out_dir=runs/plans --rows=base128 --slices=v5litepod-16

One `python -m bert_jax.plan ... --json=OUT_DIR/<row>_<slice>.json` per cell, one after another
(a BERT-large compile takes minutes of one CPU core); cells whose JSON exists are read, not
re-run. Prints the markdown table; every figure in it is an estimate from the TPU compiler, not a
measurement on a TPU.
"""

import json
import os
import subprocess
import sys

from absl import app
from absl import flags

# row -> (what, config argument, extra flags, slices: one per generation)
ROWS = {
    "base128": ("BERT-base phase 1: seq 128, batch 256", "base", [],
                ["v4-32", "v5litepod-16", "v5p-32", "v6e-16"]),
    "base128b4096": ("BERT-base phase 1: seq 128, batch 4096", "base",
                     ["--config.batch_size=4096"],
                     ["v4-128", "v5litepod-64", "v5p-128", "v6e-64"]),
    "large512": ("BERT-large phase 2: seq 512, batch 256 (remat)", "large,phase2",
                 ["--config.batch_size=256"], ["v4-32", "v5litepod-16", "v5p-32", "v6e-16"]),
}

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "runs/plans", "Where each plan's JSON and log go.")
flags.DEFINE_list("rows", list(ROWS), f"Rows among {list(ROWS)}.")
flags.DEFINE_list("slices", [], "Only these slices (default: every slice of each row).")
flags.DEFINE_bool("search", False, "Add --search for cells that do not fit as configured.")
flags.DEFINE_bool("run", True, "Run the plans whose JSON is missing (--norun: only print).")


def run_cell(row, slice_name, out_dir, search=False, run=True):
  _, config, extra, _ = ROWS[row]
  path = os.path.join(out_dir, f"{row}_{slice_name}.json")
  if run and not os.path.exists(path):
    cmd = [sys.executable, "-m", "bert_jax.plan", f"--config=bert_jax/configs/pretrain.py:{config}",
           f"--topology={slice_name}", "--config.model.dtype=bfloat16", f"--json={path}", *extra]
    with open(path[:-len(".json")] + ".log", "w") as log:
      subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
  result = json.load(open(path)) if os.path.exists(path) else None
  if run and search and result and not result["fits"]:
    spath = path[:-len(".json")] + "_search.json"
    if not os.path.exists(spath):
      cmd = [sys.executable, "-m", "bert_jax.plan", f"--config=bert_jax/configs/pretrain.py:{config}",
             f"--topology={slice_name}", "--config.model.dtype=bfloat16", f"--json={spath}",
             "--search", *extra]
      with open(spath[:-len(".json")] + ".log", "w") as log:
        subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, check=False)
    if os.path.exists(spath):
      result["search_result"] = json.load(open(spath))
  return result


def cell_line(row, slice_name, r, log_text=""):
  what = ROWS[row][0]
  if r is None and "Segmentation fault" in log_text:
    return (f"| {what} | {slice_name} | **NO VERDICT**: libtpu 0.0.42.1 crashed (segfault) "
            "compiling it on this host | | | | | | |")
  if r is None or r.get("fits") is None:
    if r is not None:
      return f"| {what} | {slice_name} | **NO VERDICT**: {r['verdict']} | | | | | | |"
    return (f"| {what} | {slice_name} | not compiled in this session: `python -m "
            f"benchmarks.plan_table --rows={row} --slices={slice_name}` | | | | | | |")
  gib = 1024 ** 3
  head = f"| {what} | {slice_name} ({r['chips']} x {r['device_kind']}) |"
  if not r["fits"]:
    found = (r.get("search_result") or {}).get("search", {}).get("train_flags")
    return (head + " **DOES NOT FIT** | - | - | - | - | - | "
            + (f"`{found}`" if found else "try `--search`") + " |")
  c, p = r["compiled"], r["prediction"]
  return (head + f" FITS | {c['total'] / gib:.2f} of {r['hbm_available_bytes'] / gib:.2f} | "
          f"{p['flops_ratio']:.3f} | {p['step_seconds']:.4f} | {p['mfu']:.0%} | "
          f"{p['chip_hours']:,.0f} h, ${p['cost_usd']:,.0f} | as configured |")


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  print("| model and recipe | slice | verdict | GiB per chip (of allowed) | compiled / analytic "
        "FLOPs | est. step (s) | est. MFU | chip-hours, cost to the preset's steps | "
        "recommendation |")
  print("|---|---|---|---|---|---|---|---|---|")
  for row in FLAGS.rows:
    for slice_name in ROWS[row][3]:
      if FLAGS.slices and slice_name not in FLAGS.slices:
        continue
      r = run_cell(row, slice_name, FLAGS.out_dir, FLAGS.search, FLAGS.run)
      log = os.path.join(FLAGS.out_dir, f"{row}_{slice_name}.log")
      print(cell_line(row, slice_name, r, open(log).read() if os.path.exists(log) else ""),
            flush=True)


if __name__ == "__main__":
  app.run(main)
