r"""ModernBERT-mini against BERT-mini on the quick-start corpus at equal analytic pre-training
FLOPs (issue 30 item 7): held-out MLM of each, and dev accuracy after fine-tuning each on the
docstring task (benchmarks/docstring_task.py) over seeds.

  nice -n 19 .venv/bin/python -m benchmarks.modern_side_by_side --steps=600 --seeds=0,1,2

  mini             BERT: the 5,000-piece uncased WordPiece vocab, NSP records (dupe factor
                   --dupe_factor), 15% token masking (20 predictions a 128-token row), MLM + NSP
  modernbert-mini  its own byte-level BPE tokenizer.json (5,000 ids, cased, as ModernBERT's)
                   learned by `python -m data_pipelines.build_vocab` from the same training
                   files (stdlib-0[0-2]-of-04.txt), its own --no_nsp records (full sentences),
                   30% masking (39 predictions a row), MLM only
Both: the runlocal recipe (seq 128, packed, AdamW at 1e-3, warmup 10% of each run's steps) at
--batch_size rows. The budget: --steps steps of whichever model costs more per step (train.
step_flops, the project's analytic count, packed rows); the other gets round(budget / its
FLOPs) steps, so the totals differ by at most half of one of its steps (equal_flops_steps).
Both totals and their ratio are printed, and each run's own summary.json count is checked
against this one. Fine-tuning: families_side_by_side's (the custom CSV task, seq 64, the
size-scaled default rate and epochs, one run per seed; dev accuracy of the last epoch and the
best epoch's). Held-out MLM is not one task across the two: another tokenizer (WordPiece
pieces vs BPE ids of another length) and another masking rate (15% vs 30%) give different
questions; the table says so.

Everything goes to --out_dir (default runs/modern); a re-run reuses what is there (corpus,
vocab, tokenizer.json, records, finished pre-trainings and fine-tunes; workdirs are named by
their step count, so another --steps trains afresh). Prints a Markdown table and a
`RESULT {json}` line. The 8,192-token check is benchmarks/long_context.py.
"""

import argparse
import json
import os
import statistics
import sys

from benchmarks import families_side_by_side as fsbs

ROOT = fsbs.ROOT
# preset -> (records kind: a directory of out_dir, the tokenizer it reads)
PRESETS = {"mini": ("nsp", "wordpiece"), "modernbert-mini": ("bpe", "tokenizer_json")}
VOCAB_SIZE = 5000   # both tokenizers' upper bound (WordPiece stops at 4,939 here)


def equal_flops_steps(flops_per_step, steps):
  """{name: steps} spending the same FLOPs: the name with the largest per-step count gets
  `steps`, each other round(budget / its count). |steps_i x F_i - budget| <= F_i / 2, so no
  two totals differ by more than one step of the cheaper model. E.g. {a: 3e9, b: 2e9} at 100
  steps: a 100 (3e11), b 150 (3e11)."""
  if steps < 1 or not flops_per_step or min(flops_per_step.values()) <= 0:
    raise ValueError(f"equal_flops_steps: steps={steps} and FLOPs {flops_per_step} must be > 0")
  budget = steps * max(flops_per_step.values())
  return {name: max(1, round(budget / f)) for name, f in flops_per_step.items()}


def bpe_data(out, dupe_factor, seq_length=128, splits=("train", "eval"), num_shards=4):
  """The quick-start corpus (shared with families_side_by_side's layout), a byte-level BPE
  tokenizer.json learned on its training files, and --no_nsp records at seq_length in
  out/bpe{suffix}/{split}; returns the tokenizer.json's path."""
  corpus = os.path.join(out, "corpus")
  if not os.path.exists(os.path.join(corpus, "stdlib-03-of-04.txt")):
    fsbs.sh(["data_pipelines.stdlib_corpus", f"--output_dir={corpus}", "--num_files=4"])
  train_text = os.path.join(corpus, "stdlib-0[0-2]-of-04.txt")
  tokenizer = os.path.join(out, "tokenizer.json")
  if not os.path.exists(tokenizer):
    fsbs.sh(["data_pipelines.build_vocab", f"--input_file={train_text}",
             f"--vocab_size={VOCAB_SIZE}", "--model_type=bpe", "--byte_level",
             f"--output={tokenizer}"])
  kind = "bpe" if seq_length == 128 else f"bpe{seq_length}"
  for split in splits:
    text, dupe, shards = ((train_text, dupe_factor, num_shards) if split == "train" else
                          (os.path.join(corpus, "stdlib-03-of-04.txt"), 1, 1))
    d = os.path.join(out, kind, split)
    if not os.path.exists(os.path.join(d, "dataset_info.json")):
      fsbs.sh(["data_pipelines.create_pretraining_data", f"--input_file={text}",
               f"--output_dir={d}", f"--tokenizer_json={tokenizer}", "--no_nsp",
               f"--max_seq_length={seq_length}", f"--dupe_factor={dupe}",
               f"--num_shards={shards}", "--num_workers=1"])
  return tokenizer


def vocab_size(path):
  """Ids of a vocab.txt or tokenizer.json, as train reads them (its model's vocab_size)."""
  sys.path.insert(0, ROOT)
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  json_file = path.endswith(".json")
  return vocab_lib.load_vocab_info(vocab_file=None if json_file else path,
                                   tokenizer_json=path if json_file else None).size


def pretrain(out, preset, vocab, steps, batch_size, flops):
  """One pre-training run (families_side_by_side.train_run) in out/work_{preset}_s{steps}; the
  run's own summary must carry the FLOPs the budget was computed from."""
  kind, how = PRESETS[preset]
  extra = [f"--config.tokenizer_json={vocab}"] if how == "tokenizer_json" else []
  r = fsbs.train_run(out, f"{preset}_s{steps}", preset, kind,
                     vocab if how == "wordpiece" else "", steps, batch_size, extra)
  logged = r["gflop_per_step"]
  if logged is not None and abs(logged * 1e9 - flops) > 1e-6 * flops:
    sys.exit(f"error: {preset}: the run's summary.json counts {logged:.4f} GFLOP/step but the "
             f"budget used {flops / 1e9:.4f}; train.step_flops and this script disagree "
             "(another seq_length or batch?), so the steps are not at equal FLOPs.")
  return dict(r, gflop_per_step=flops / 1e9, total_tflop=steps * flops / 1e12,
              vocab=vocab, vocab_size=vocab_size(vocab),
              **fsbs.count_params(preset, vocab_size(vocab)))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  fsbs.add_run_flags(p, "modern", steps_help="steps of the model that costs more per step "
                     "(the other gets more)")
  args = p.parse_args()
  if args.steps < 1 or args.batch_size < 1 or args.dupe_factor < 1:
    p.error("--steps, --batch_size and --dupe_factor must be at least 1")
  seeds = [int(s) for s in args.seeds.split(",")]
  out = os.path.abspath(args.out_dir)
  os.makedirs(out, exist_ok=True)

  wordpiece, task = fsbs.data(out, args.dupe_factor, kinds=["nsp"])
  vocabs = {"mini": wordpiece, "modernbert-mini": bpe_data(out, args.dupe_factor)}
  flops = {preset: fsbs.step_flops(preset, args.batch_size, vocab_size(vocabs[preset]))
           for preset in PRESETS}
  steps = equal_flops_steps(flops, args.steps)
  totals = {preset: steps[preset] * flops[preset] for preset in PRESETS}
  print("equal FLOPs: " + "; ".join(
      f"{preset} {flops[preset] / 1e9:.3f} GFLOP/step x {steps[preset]} steps = "
      f"{totals[preset] / 1e12:.4f} TFLOP" for preset in PRESETS) +
        f"; ratio {totals['modernbert-mini'] / totals['mini']:.4f}", flush=True)

  rows = {preset: pretrain(out, preset, vocabs[preset], steps[preset], args.batch_size,
                           flops[preset]) for preset in PRESETS}
  for preset, r in rows.items():
    r["dev"] = [fsbs.finetune(out, f"{preset}_s{steps[preset]}", r["workdir"], r["vocab"],
                              task, s, args.ft_learning_rate, args.ft_epochs) for s in seeds]
    print(f"{preset}: {json.dumps(r)}", flush=True)
  print(table(rows, args))
  print("RESULT " + json.dumps(dict(budget_steps=args.steps, batch_size=args.batch_size,
                                    seeds=args.seeds, ratio=totals["modernbert-mini"] /
                                    totals["mini"], rows=rows)))


def table(rows, args):
  """The Markdown table: one row per model, its steps, the TFLOP spent, held-out MLM (with the
  caveat) and dev accuracy mean ± sd and per seed."""
  ratio = rows["modernbert-mini"]["total_tflop"] / rows["mini"]["total_tflop"]
  lines = [f"Equal pre-training FLOPs (train.step_flops): {args.steps} steps of the dearer "
           f"model, batch {args.batch_size} x 128; modernbert-mini / mini total = {ratio:.4f}. "
           f"Fine-tuning seeds {args.seeds}, learning rate {args.ft_learning_rate or 'default'}"
           f", epochs {args.ft_epochs or 'default'}.", "",
           "Held-out MLM is NOT one task across the rows: WordPiece (15% masked, uncased) vs "
           "byte-level BPE (30% masked, cased) ask different questions; compare dev accuracy.",
           "",
           "| model | encoder params | vocab | steps | GFLOP/step | TFLOP total | s/step | "
           "held-out MLM acc | held-out MLM loss | dev acc, last epoch (mean ± sd) | per seed "
           "| best epoch's (mean) |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
  for preset, r in rows.items():
    e = r["final_eval"]
    dev = [d["last"] for d in r["dev"]]
    sd = statistics.stdev(dev) if len(dev) > 1 else 0.0
    best = statistics.mean(d["best"] for d in r["dev"])
    lines.append(f"| {preset} | {r['params'] / 1e6:.2f}M | {r['vocab_size']:,} | {r['steps']} "
                 f"| {r['gflop_per_step']:.2f} | {r['total_tflop']:.3f} | "
                 f"{r['sec_per_step'] or float('nan'):.3f} | {e['eval/mlm_accuracy']:.4f} | "
                 f"{e['eval/mlm_loss']:.3f} | {statistics.mean(dev):.3f} ± {sd:.3f} | "
                 f"{' '.join(f'{x:.3f}' for x in dev)} | {best:.3f} |")
  return "\n".join(lines)


if __name__ == "__main__":
  main()
