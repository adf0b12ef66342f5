r"""Packed embedding batches (issue 40 item 2): real tokens per slot and step time, packed
against unpacked, on the docstring retrieval set's training pairs.

  python -m benchmarks.docstring_retrieval --output_dir=runs/docstring_retrieval
  python -m benchmarks.embedding_packing --data_dir=runs/docstring_retrieval \
      --vocab_file=runs/quickstart/vocab.txt --max_seq_length=64 --batch_size=32

Reads train.jsonl as the embedding task does (bert_jax.training.finetune_tasks.load_split: each text its
own [T] sequence), takes one epoch's batches in the loop's order (finetune.epoch_batches) and
packs them as --config.pack=true does (tasks/embedding.py pack_batches: R rows a batch, the most
any batch needs). Prints real tokens per slot unpacked (B x S rows of T a batch) and packed (R
rows of T), then times the loop's compiled training step (finetune.build_training, a random
BERT of --model's shape, dropout as the preset) on the same batches both ways: --steps steps
each, after one compile step, alternating unpacked / packed --rounds times so the box's load
falls on both, and prints seconds a step and their ratio.
"""

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--data_dir", default="runs/docstring_retrieval")
  p.add_argument("--vocab_file", required=True)
  p.add_argument("--max_seq_length", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--max_instances_per_pack", type=int, default=0)
  p.add_argument("--model", default="tiny")
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--rounds", type=int, default=2)
  args = p.parse_args()
  sys.path.insert(0, ROOT)
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  from data_pipelines.tokenizers import tokenization  # pylint: disable=g-import-not-at-top

  c = finetune_config.get_config("custom")
  c.custom.type, c.data_dir = "embedding", args.data_dir
  c.custom.train_file, c.custom.dev_file = "train.jsonl", "dev.jsonl"
  c.max_seq_length, c.batch_size = args.max_seq_length, args.batch_size
  c.pack, c.max_instances_per_pack = True, args.max_instances_per_pack
  c.learning_rate, c.num_train_epochs = 1e-4, 1.0
  tokenizer = tokenization.get_tokenizer(vocab_file=args.vocab_file, do_lower_case=True)
  task = ft.build_task(c)
  train = ft.load_split(task, "train", tokenizer, c, True)
  f = train.features
  n, s, t = f["input_ids"].shape
  batches = finetune.epoch_batches(task, train, c, 0)
  mesh = trainer_lib.create_mesh(c.mesh_shape, c.batch_size, c.eval_batch_size)
  packed_batch, line = tasks.of(task).pack_batches(train, c, batches, mesh)
  print(f"{n} pairs x {s} texts at T={t}, {len(batches)} batches of {c.batch_size}; {line}")
  real = sum(int(f["input_mask"][b].sum()) for b in batches)
  rows = len(packed_batch(batches[0])["input_ids"])
  unpacked_fill = real / (len(batches) * c.batch_size * s * t)
  packed_fill = real / (len(batches) * rows * t)
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  k = c.max_instances_per_pack or packing.default_max_instances(t)
  needed = [packing.text_rows(f["input_mask"][b].sum(-1), seq_length=t, max_instances=k)
            for b in batches]
  print(f"real tokens per slot: unpacked {unpacked_fill:.3f} ({c.batch_size * s} rows a batch), "
        f"packed {packed_fill:.3f} ({rows} rows a batch, K={k}; a batch needs {min(needed)}-"
        f"{max(needed)}, mean {np.mean(needed):.1f}): {packed_fill / unpacked_fill:.2f}x")

  mc = model_lib.get_bert_config(args.model, vocab_size=tokenizer.vocab.size,
                                 max_position_embeddings=max(512, t))
  keys = ("input_ids", "input_mask", "segment_ids")
  both = {"unpacked": [finetune._host_batch(f, keys, b, c.batch_size) for b in batches],  # pylint: disable=protected-access
          "packed": [packed_batch(b) for b in batches]}
  steps = finetune.build_training(tasks.of(task), mc, c, mesh, num_train_steps=10_000,
                                  warmup_steps=0)
  seconds = {k: [] for k in both}
  with trainer_lib.mesh_rules(mesh):
    states = {k: steps.init_state(jax.random.PRNGKey(0)) for k in both}
    for k, bs in both.items():   # compile each shape once
      states[k], m = steps.train_step(states[k], sharding_lib.make_global_batch(bs[0], mesh))
      jax.block_until_ready(m)
    for _ in range(args.rounds):
      for k, bs in both.items():
        start = time.perf_counter()
        for i in range(args.steps):
          states[k], m = steps.train_step(
              states[k], sharding_lib.make_global_batch(bs[(1 + i) % len(bs)], mesh))
        jax.block_until_ready(m)
        seconds[k].append((time.perf_counter() - start) / args.steps)
  u, pk = (float(np.mean(seconds[k])) for k in ("unpacked", "packed"))
  print(f"step time ({args.model}, {jax.devices()[0].platform}, {args.steps} steps x "
        f"{args.rounds} rounds): unpacked {u:.4f} s, packed {pk:.4f} s: packed/unpacked "
        f"{pk / u:.2f} (per round: " + ", ".join(
            f"{a:.4f}/{b:.4f}" for a, b in zip(seconds["unpacked"], seconds["packed"])) + ")")


if __name__ == "__main__":
  main()
