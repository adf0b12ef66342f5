r"""Fine-tuning step throughput: bert_jax vs HF transformers (PyTorch), same config, one run.

  .venv/bin/python -m benchmarks.finetune [--model=base --batch=32 --steps=20 --dtype=bfloat16]

Two workloads, as the paper fine-tunes them:
  pair   sentence-pair classification (MRPC/MNLI-like), seq 128, 2 or 3 labels: BERT + pooled
         [CLS] classifier.  Ours: heads.BertForSequenceClassification through finetune's
         build_training; HF: BertForSequenceClassification.
  squad  span prediction at seq 384: BERT + start/end dense. Ours: heads.BertForQuestionAnswering;
         HF: BertForQuestionAnswering.
Same model size, vocab 30522, batch, AdamW (lr 2e-5, weight decay 0.01, clip 1.0 on our side
as google-research/bert), dropout 0.1, full-length random batches. Each framework runs in its
own subprocess on the same devices, one after the other; `--steps` steps are timed after
`--warmup` steps (ours: compiled). On a GPU, HF runs on CUDA (with torch.autocast to bf16 when
--dtype=bfloat16); on CPU both use all cores. The ratio is the figure to read: the machine may
be shared.
"""

import argparse
import json
import os
import time

from benchmarks import common

SIZES = dict(tiny=(2, 128), mini=(4, 256), small=(4, 512), medium=(8, 512), base=(12, 768),
             large=(24, 1024))
WORKLOADS = dict(pair=128, squad=384)


def _batch_np(workload, batch, seq, vocab, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32)
  segment_ids = (np.arange(seq)[None] >= seq // 3).astype(np.int32).repeat(batch, 0)
  out = dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=segment_ids,
             example_weights=np.ones(batch, np.float32))
  if workload == "pair":
    out["label_ids"] = rng.integers(0, 2, batch).astype(np.int32)
  else:
    start = rng.integers(seq // 3, seq - 10, batch).astype(np.int32)
    out.update(start_positions=start, end_positions=start + 3)
  return out


def run_bert_jax(a):
  import jax
  from bert_jax import finetune
  from bert_jax.training import finetune_tasks as ft
  from bert_jax.models import model as model_lib
  from bert_jax.parallel import sharding as sharding_lib
  from bert_jax.configs import finetune as finetune_config
  layers, hidden = SIZES[a.model]
  seq = WORKLOADS[a.workload]
  c = finetune_config.get_config("squad_v1" if a.workload == "squad" else "glue_mrpc")
  c.max_seq_length, c.batch_size, c.learning_rate = seq, a.batch, 2e-5
  mc = model_lib.BertConfig(vocab_size=a.vocab, num_layers=layers, hidden_size=hidden,
                            num_heads=hidden // 64, intermediate_size=4 * hidden, dtype=a.dtype)
  mesh = sharding_lib.create_mesh((-1, 1, 1))
  task_type = ft.build_task(c).type   # squad_v1: span QA; glue_mrpc: classification
  t = finetune.build_training(task_type, mc, c, mesh, num_train_steps=10_000,
                              warmup_steps=1_000)
  batch = sharding_lib.make_global_batch(_batch_np(a.workload, a.batch, seq, a.vocab), mesh)
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    dt = common.time_jax_steps(t.train_step, state, batch, warmup=a.warmup, steps=a.steps)
  return dict(seq_per_s=a.steps * a.batch / dt, device=jax.devices()[0].device_kind,
              n_devices=jax.device_count())


def run_hf_torch(a):
  import contextlib
  import torch
  import transformers
  layers, hidden = SIZES[a.model]
  seq = WORKLOADS[a.workload]
  cfg = transformers.BertConfig(vocab_size=a.vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
  cls = (transformers.BertForQuestionAnswering if a.workload == "squad"
         else transformers.BertForSequenceClassification)
  device = "cuda" if torch.cuda.is_available() else "cpu"
  model = cls(cfg).to(device).train()
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
  b = {k: torch.from_numpy(v).long().to(device)
       for k, v in _batch_np(a.workload, a.batch, seq, a.vocab).items()
       if k != "example_weights"}
  labels = (dict(start_positions=b["start_positions"], end_positions=b["end_positions"])
            if a.workload == "squad" else dict(labels=b["label_ids"]))
  autocast = (torch.autocast(device, dtype=torch.bfloat16) if a.dtype == "bfloat16"
              else contextlib.nullcontext())

  def step():
    with autocast:
      out = model(input_ids=b["input_ids"], attention_mask=b["input_mask"],
                  token_type_ids=b["segment_ids"], **labels)
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # as our clip_norm=1.0
    opt.step()
    opt.zero_grad()

  sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
  for _ in range(a.warmup):
    step()
  sync()
  t0 = time.perf_counter()
  for _ in range(a.steps):
    step()
  sync()
  return dict(seq_per_s=a.steps * a.batch / (time.perf_counter() - t0), device=device)


RUNNERS = dict(bert_jax=run_bert_jax, hf_torch=run_hf_torch)


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="base", choices=sorted(SIZES))
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--vocab", type=int, default=30522)
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--workloads", default="pair,squad")
  p.add_argument("--only", default="", help="internal: one framework, prints JSON")
  p.add_argument("--workload", default="pair", help="internal")
  a = p.parse_args()
  unknown = set(a.workloads.split(",")) - set(WORKLOADS)
  if unknown:
    p.error(f"--workloads: unknown {sorted(unknown)}; choose from {', '.join(WORKLOADS)}")
  if a.only:
    print("RESULT " + json.dumps(RUNNERS[a.only](a)), flush=True)
    return
  rows = []
  for workload in a.workloads.split(","):
    results = {}
    for name in RUNNERS:
      result = common.run_isolated(
          "benchmarks.finetune", [f"--only={name}", f"--workload={workload}"] + [
              f"--{k}={v}" for k, v in vars(a).items()
              if k not in ("only", "workload", "workloads")], f"{workload}/{name}")
      if result is not None:
        results[name] = result
    rows.append((workload, results))
  print(f"\nBERT-{a.model} fine-tuning, batch {a.batch}, {a.dtype}, {a.steps} timed steps "
        f"({os.cpu_count()} CPU cores)")
  for workload, results in rows:
    seq = WORKLOADS[workload]
    line = f"  {workload:5s} seq {seq}: " + ", ".join(
        f"{n} {r['seq_per_s']:.1f} seq/s ({r['device']})" for n, r in results.items())
    if len(results) == 2:
      line += (f" | bert_jax / hf_torch = "
               f"{results['bert_jax']['seq_per_s'] / results['hf_torch']['seq_per_s']:.2f}x")
    print(line)


if __name__ == "__main__":
  main()
