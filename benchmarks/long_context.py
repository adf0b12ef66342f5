r"""The long-context check of issue 30 item 7: a tiny modern encoder trains on 8,192-token packed
rows on CPU, a few steps; prints each step's loss, the step time and the run's peak RSS.

  nice -n 19 .venv/bin/python -m benchmarks.long_context --steps=6

  corpus, tokenizer  the quick-start corpus and byte-level BPE tokenizer.json of
                     benchmarks/modern_side_by_side.py (same --out_dir layout, shared if equal)
  records            create_pretraining_data --no_nsp --max_seq_length=8192 on the training
                     files, dupe factor 1 (full-sentence rows of up to 8,192 tokens; the loader
                     packs them best-fit into full rows, docs/packing.md)
  training           modernbert-tiny (3 x 128, GeGLU 192, window 16, layer 0 global) with its
                     context limit raised to 8,192 (--config.model.max_position_embeddings: RoPE
                     has no position table, so no parameter changes), --batch_size rows of
                     8,192 tokens, 30% masking (int(0.305 x 8,192) = 2,498 predictions a row),
                     AdamW at 1e-3 (runlocal), global RoPE theta 160,000 as ModernBERT's
                     context extension, no evaluation
Step time: the median of the logged windows after step 2 (compilation excluded), wall time on
this machine; GFLOP/step: train's analytic count (its summary.json). Peak RSS: the training
process's ru_maxrss (os.wait4). Prints a `RESULT {json}` line.
"""

import argparse
import json
import os
import re
import statistics
import subprocess
import sys

from benchmarks import families_side_by_side as fsbs
from benchmarks import modern_side_by_side as msbs

ROOT = fsbs.ROOT
SEQ = 8192


def train(out, steps, batch_size, tokenizer):
  """One `python -m bert_jax.train` run in a fresh out/long_s{steps}_b{batch}; returns (log
  text, summary, peak RSS in bytes)."""
  workdir = os.path.join(out, f"long_s{steps}_b{batch_size}")
  if os.path.exists(workdir):   # a fresh run each time: its RSS and step time are the figures
    import shutil  # pylint: disable=g-import-not-at-top
    shutil.rmtree(workdir)
  args = [sys.executable, "-m", "bert_jax.train",
          "--config=bert_jax/configs/pretrain.py:modernbert-tiny,runlocal",
          f"--workdir={workdir}", f"--config.train_input_files={out}/bpe{SEQ}/train/*.tfrecord",
          f"--config.tokenizer_json={tokenizer}", f"--config.seq_length={SEQ}",
          f"--config.model.max_position_embeddings={SEQ}",
          f"--config.max_predictions_per_seq={int((0.3 + 0.005) * SEQ)}",
          "--config.model.rope_theta_global=160000", f"--config.batch_size={batch_size}",
          f"--config.num_train_steps={steps}", "--config.warmup_steps=1",
          "--config.log_every=1", f"--config.eval_every={steps}",
          f"--config.checkpoint_every={steps}"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  log_path = os.path.join(out, f"long_s{steps}_b{batch_size}.log")
  with open(log_path, "w", encoding="utf-8") as log:
    proc = subprocess.Popen(args, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env)
    _, status, usage = os.wait4(proc.pid, 0)   # this child's own peak RSS (KiB on Linux)
    proc.returncode = os.waitstatus_to_exitcode(status)
  text = open(log_path, encoding="utf-8").read()
  if proc.returncode:
    sys.exit(f"bert_jax.train failed ({proc.returncode}); {log_path}:\n{text[-3000:]}")
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  return text, summary, usage.ru_maxrss * 1024, log_path


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out_dir", default=os.path.join(ROOT, "runs", "modern"))
  p.add_argument("--steps", type=int, default=6)
  p.add_argument("--batch_size", type=int, default=1, help="rows of 8,192 tokens a step")
  args = p.parse_args()
  if args.steps < 3 or args.batch_size < 1:
    p.error("--steps must be at least 3 (step 1 compiles, step 2's window overlaps it) and "
            "--batch_size at least 1")
  out = os.path.abspath(args.out_dir)
  os.makedirs(out, exist_ok=True)
  tokenizer = msbs.bpe_data(out, 1, seq_length=SEQ, splits=("train",), num_shards=1)
  info = json.load(open(os.path.join(out, f"bpe{SEQ}", "train", "dataset_info.json")))
  text, summary, rss, log_path = train(out, args.steps, args.batch_size, tokenizer)
  losses = [float(x) for x in re.findall(r"step \d+/\d+ \| loss ([\d.]+)", text)]
  # s/step from the logged tok/s (rows/s is printed to 0.1: "0.1 rows/s 685 tok/s"), the median
  # of the windows after the first timed one (step 2's, which still overlaps the compilation).
  rates = [float(x) for x in re.findall(r"rows/s ([\d.]+) tok/s", text)][1:]
  sec = args.batch_size * SEQ / statistics.median(rates) if rates else None
  result = dict(seq_length=SEQ, batch_size=args.batch_size, steps=args.steps, losses=losses,
                sec_per_step=sec, tokens_per_sec=args.batch_size * SEQ / sec if sec else None,
                gflop_per_step=summary.get("gflop_per_step"), peak_rss_gib=rss / 2**30,
                final_step=summary.get("final_step"), records=info["num_instances"],
                record_tokens=info.get("input_tokens"),
                # the loader's "packed rows ...: 0.999 real tokens per slot" (not padding)
                real_token_fraction=float(next(iter(re.findall(
                    r"([\d.]+) real tokens per slot", text)), "nan")))
  print(f"modernbert-tiny, {args.batch_size} x {SEQ:,}-token packed rows, {args.steps} steps: "
        f"loss {' -> '.join(f'{x:.3f}' for x in losses)}; "
        f"{sec if sec is not None else float('nan'):.2f} s/step "
        f"({result['tokens_per_sec'] or float('nan'):,.0f} tokens/s) after compilation; "
        f"{result['gflop_per_step'] or float('nan'):.1f} GFLOP/step; "
        f"{result['real_token_fraction']:.3f} real tokens per slot; peak RSS "
        f"{result['peak_rss_gib']:.2f} GiB")
  print("RESULT " + json.dumps(result))


if __name__ == "__main__":
  main()
