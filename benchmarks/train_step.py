r"""Pre-training step throughput: bert_jax vs KerasHub (JAX backend) vs HF transformers (PyTorch).

  .venv/bin/pip install -r requirements-bench.txt
  .venv/bin/python -m benchmarks.train_step [--model=mini --batch=32 --seq=128 --steps=20]

Same config for all: BERT-mini (L4/H256/A4), vocab 30522, seq 128, batch 32, 20 masked
positions, AdamW, dropout 0.1, and the peer's GELU (KerasHub: tanh approximation; HF: exact
erf, our default), so ours runs twice. Each framework runs in its own subprocess on the same cores, one
after the other; we time `--steps` steps after `--warmup` compiled/warm-up steps and print
sequences/s and the ratios. Also prints the XLA cost analysis FLOPs of our compiled step against
the analytic model FLOPs of bert_jax.train.model_flops_per_sequence.
"""

import argparse
import json
import os
import time

from benchmarks import common



def _batch_np(batch, seq, preds, vocab, seed=0):
  import numpy as np
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, vocab, size=(batch, seq)).astype(np.int32)
  pos = np.sort(np.stack([rng.choice(np.arange(1, seq), preds, replace=False)
                          for _ in range(batch)]), -1).astype(np.int32)
  return dict(input_ids=ids, input_mask=np.ones_like(ids), segment_ids=np.zeros_like(ids),
              masked_lm_positions=pos, masked_lm_ids=np.take_along_axis(ids, pos, 1),
              masked_lm_weights=np.ones(pos.shape, np.float32),
              next_sentence_labels=rng.integers(0, 2, batch).astype(np.int32))


def run_bert_jax(a):
  import jax
  from bert_jax import train
  from bert_jax.parallel import sharding as sharding_lib
  from bert_jax.configs import pretrain
  c = pretrain.get_config(a.model)
  c.train_input_files = "synthetic"
  c.model.vocab_size = a.vocab
  c.batch_size, c.seq_length, c.max_predictions_per_seq = a.batch, a.seq, a.preds
  c.model.dtype = a.dtype
  c.model.hidden_act = a.act
  vocab = train.load_vocab(c)
  mc = train.create_model_config(c, vocab)
  mesh = sharding_lib.create_mesh((-1, 1, 1))
  t = train.build_training(c, mc, mesh)
  batch = sharding_lib.make_global_batch(_batch_np(a.batch, a.seq, a.preds, a.vocab), mesh)
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    compiled = t.train_step.lower(state, batch).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    dt = common.time_jax_steps(t.train_step, state, batch, warmup=a.warmup, steps=a.steps)
  return dict(seq_per_s=a.steps * a.batch / dt, xla_flops=float(cost.get("flops", 0.0)),
              analytic_flops=float(train.model_flops_per_sequence(mc, a.seq, a.preds) * a.batch))


def run_keras_hub(a):
  os.environ["KERAS_BACKEND"] = "jax"
  import keras
  import keras_hub
  import numpy as np
  sizes = dict(mini=(4, 256), tiny=(2, 128), small=(4, 512), medium=(8, 512), base=(12, 768))
  layers, hidden = sizes[a.model]
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=a.vocab, num_layers=layers, num_heads=hidden // 64, hidden_dim=hidden,
      intermediate_dim=4 * hidden, dropout=0.1, max_sequence_length=512)
  model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
  model.compile(optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=[], jit_compile=True)
  b = _batch_np(a.batch, a.seq, a.preds, a.vocab)
  x = dict(token_ids=b["input_ids"], padding_mask=b["input_mask"].astype(bool),
           segment_ids=b["segment_ids"], mask_positions=b["masked_lm_positions"])
  y, w = b["masked_lm_ids"], b["masked_lm_weights"]
  for _ in range(a.warmup):
    model.train_on_batch(x, y, sample_weight=w)
  t0 = time.perf_counter()
  for _ in range(a.steps):
    loss = model.train_on_batch(x, y, sample_weight=w)
  np.asarray(loss)
  return dict(seq_per_s=a.steps * a.batch / (time.perf_counter() - t0))


def run_hf_torch(a):
  import torch
  import transformers
  sizes = dict(mini=(4, 256), tiny=(2, 128), small=(4, 512), medium=(8, 512), base=(12, 768))
  layers, hidden = sizes[a.model]
  cfg = transformers.BertConfig(vocab_size=a.vocab, hidden_size=hidden, num_hidden_layers=layers,
                                num_attention_heads=hidden // 64, intermediate_size=4 * hidden)
  model = transformers.BertForPreTraining(cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  b = {k: torch.from_numpy(v).long() for k, v in _batch_np(a.batch, a.seq, a.preds,
                                                             a.vocab).items()
       if k != "masked_lm_weights"}
  # HF computes MLM logits at every position (labels -100 elsewhere): that is its real cost.
  labels = torch.full_like(b["input_ids"], -100)
  labels.scatter_(1, b["masked_lm_positions"], b["masked_lm_ids"])

  def step():
    out = model(input_ids=b["input_ids"], attention_mask=b["input_mask"],
                token_type_ids=b["segment_ids"], labels=labels,
                next_sentence_label=b["next_sentence_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad()

  for _ in range(a.warmup):
    step()
  t0 = time.perf_counter()
  for _ in range(a.steps):
    step()
  return dict(seq_per_s=a.steps * a.batch / (time.perf_counter() - t0))


# KerasHub's BertBackbone uses the tanh GELU (as google-research/bert's modeling.py); HF uses the
# exact erf GELU (our default). Each peer is compared with our step at its own activation.
RUNNERS = dict(bert_jax=run_bert_jax, bert_jax_tanh=run_bert_jax, keras_hub=run_keras_hub,
               hf_torch=run_hf_torch)
PEER_OF = dict(keras_hub="bert_jax_tanh", hf_torch="bert_jax")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="mini")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=128)
  p.add_argument("--preds", type=int, default=20)
  p.add_argument("--vocab", type=int, default=30522)
  p.add_argument("--dtype", default="float32")
  p.add_argument("--steps", type=int, default=20)
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--act", default="gelu", help="internal: our GELU variant")
  p.add_argument("--only", default="", help="internal: run one framework and print JSON")
  a = p.parse_args()
  if a.only:
    print("RESULT " + json.dumps(RUNNERS[a.only](a)), flush=True)
    return
  results = {}
  for name in RUNNERS:
    act = "gelu_tanh" if name == "bert_jax_tanh" else "gelu"
    result = common.run_isolated("benchmarks.train_step", [f"--only={name}", f"--act={act}"] + [
        f"--{k}={v}" for k, v in vars(a).items() if k not in ("only", "act")], name)
    if result is not None:
      results[name] = result
  print(f"\nBERT-{a.model}, seq {a.seq}, batch {a.batch}, vocab {a.vocab}, {a.steps} timed steps"
        f" ({os.cpu_count()} cores)")
  for name, r in results.items():
    print(f"  {name:14s} {r['seq_per_s']:8.1f} seq/s")
  for peer, ours in PEER_OF.items():
    if peer in results and ours in results:
      print(f"  {ours} / {peer} (same GELU): "
            f"{results[ours]['seq_per_s'] / results[peer]['seq_per_s']:.2f}x")
  if "bert_jax" in results:
    r = results["bert_jax"]
    print(f"  XLA cost analysis {r['xla_flops'] / 1e9:.1f} GFLOP/step vs analytic "
          f"{r['analytic_flops'] / 1e9:.1f} GFLOP/step (ratio {r['xla_flops'] / r['analytic_flops']:.2f})")


if __name__ == "__main__":
  main()
