r"""Packed sequences: packing efficiency, real tokens/s packed vs unpacked vs peers, time to accuracy.

  bash scripts/quickstart_pretrain.sh   # builds runs/quickstart/records (then trains; Ctrl-C is fine)
  nice -n 10 .venv/bin/python -m benchmarks.packing [--model=mini --steps=10] \
      [--google_records='/tmp/gbert/out/*.tfrecord'] [--records512='runs/quickstart/records/train512/*'] \
      [--time_to_accuracy]

1. Efficiency: real tokens per slot (mean input_mask) over the first `--efficiency_batches`
   batches of 32 rows, unpacked and packed, for every record set given: the quick start's records
   (seq 128), records written by google-research/bert's create_pretraining_data.py (pre-masked)
   and seq 512 records.
2. Throughput in REAL tokens/s (padding not counted) on the quick start's records: the same real
   batches of 32 rows go through ours packed, ours unpacked, KerasHub BertMaskedLM (JAX backend,
   unpacked: it has no packed attention) and HF BertForPreTraining (PyTorch, unpacked), each in
   its own subprocess, one after the other on the same cores; ours runs at each peer's GELU
   (KerasHub tanh, HF exact erf). Ratios are printed from this one run.
3. --time_to_accuracy: the quick start's training (BERT-tiny, runlocal) packed and unpacked, with
   held-out MLM accuracy every 100 steps; prints the wall time each needs to reach the accuracy
   the unpacked run ends with.
"""

import argparse
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QS = os.path.join(ROOT, "runs", "quickstart")


def _pipeline(pattern, seq, preds, pack, batch=32, seed=0):
  from data_pipelines.input import pretrain_input
  from data_pipelines.tokenizers import vocab as vocab_lib
  vocab = vocab_lib.wordpiece_info(os.path.join(QS, "vocab.txt"))
  ds = pretrain_input.make_pretrain_dataset(pattern, batch_size=batch, seq_length=seq,
                                            max_predictions_per_seq=preds, vocab=vocab,
                                            seed=seed, pack=pack, shuffle_buffer=2000)
  return pretrain_input.as_numpy_batches(ds)


def efficiency_table(a):
  from data_pipelines.records import packing
  sets = [("quick start, seq 128", os.path.join(QS, "records/train/*.tfrecord"), 128, 20)]
  if a.google_records:
    sets.append(("google-research/bert script, seq 128", a.google_records, 128, 20))
  if a.records512:
    sets.append(("quick start, seq 512", a.records512, 512, 80))
  print(f"\n1. Real tokens per slot, first {a.efficiency_batches} batches of 32 rows")
  for name, pattern, seq, preds in sets:
    row = []
    for pack in (False, True):
      batches = list(itertools.islice(_pipeline(pattern, seq, preds, pack),
                                      a.efficiency_batches))
      row.append(packing.efficiency(batches))
    k = packing.default_max_instances(seq)
    print(f"  {name:40s} unpacked {row[0]:.3f}  packed {row[1]:.3f} (K={k})  "
          f"-> {row[1] / row[0]:.2f}x real tokens per slot", flush=True)


# ----------------------------------------------------------------------------------------------
# Throughput: each framework in its own subprocess, on the same saved real batches.
# ----------------------------------------------------------------------------------------------
def save_batches(a, path):
  import numpy as np
  pattern = os.path.join(QS, "records/train/*.tfrecord")
  out = {}
  for pack in (False, True):
    for i, b in enumerate(itertools.islice(_pipeline(pattern, 128, 20, pack, a.batch),
                                           a.num_batches)):
      for k, v in b.items():
        out[f"{'packed' if pack else 'unpacked'}/{i}/{k}"] = v
  np.savez(path, **out)


def load_batches(path, kind):
  import numpy as np
  data = np.load(path)
  batches = {}
  for key in data.files:
    k, i, name = key.split("/")
    if k == kind:
      batches.setdefault(int(i), {})[name] = data[key]
  return [batches[i] for i in sorted(batches)]


def _vocab_size():
  with open(os.path.join(QS, "vocab.txt"), encoding="utf-8") as f:
    return sum(1 for _ in f)


SIZES = dict(mini=(4, 256), tiny=(2, 128), small=(4, 512), medium=(8, 512), base=(12, 768))


def run_bert_jax(a, batches):
  import jax
  import jax.numpy as jnp
  import optax
  from bert_jax.models import model as model_lib
  from bert_jax.objectives import pretraining as objectives
  from bert_jax.models import pretraining_heads
  from bert_jax.parallel import sharding as sharding_lib
  from bert_jax.training import trainer_lib
  mc = model_lib.get_bert_config(a.model, vocab_size=_vocab_size(), hidden_act=a.act)
  mesh = sharding_lib.create_mesh((-1, 1, 1))
  tx = optax.adamw(1e-4, weight_decay=0.01)
  steps = trainer_lib.build_steps(
      model=pretraining_heads.BertForPreTraining(mc),
      forward=pretraining_heads.pretraining_forward,
      loss_fn=objectives.pretraining_loss,
      eval_fn=lambda o, b: objectives.pretraining_loss(o, b)[1],
      dummy_batch={k: jnp.asarray(v[:1]) for k, v in batches[0].items()}, tx=tx,
      schedule=lambda s: 1e-4, mesh=mesh)
  glob = [sharding_lib.make_global_batch(b, mesh) for b in batches]
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(0))
    for b in glob[:a.warmup]:
      state, m = steps.train_step(state, b)
    jax.block_until_ready(m)
    t0 = time.perf_counter()
    for i in range(a.steps):
      state, m = steps.train_step(state, glob[i % len(glob)])
    jax.block_until_ready(m)
  return time.perf_counter() - t0


def run_keras_hub(a, batches):
  os.environ["KERAS_BACKEND"] = "jax"
  import keras
  import keras_hub
  import numpy as np
  layers, hidden = SIZES[a.model]
  backbone = keras_hub.models.BertBackbone(
      vocabulary_size=_vocab_size(), num_layers=layers, num_heads=hidden // 64,
      hidden_dim=hidden, intermediate_dim=4 * hidden, dropout=0.1, max_sequence_length=512)
  model = keras_hub.models.BertMaskedLM(backbone=backbone, preprocessor=None)
  model.compile(optimizer=keras.optimizers.AdamW(1e-4, weight_decay=0.01),
                loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                weighted_metrics=[], jit_compile=True)
  xs = [(dict(token_ids=b["input_ids"], padding_mask=b["input_mask"].astype(bool),
              segment_ids=b["segment_ids"], mask_positions=b["masked_lm_positions"]),
         b["masked_lm_ids"], b["masked_lm_weights"]) for b in batches]
  for x, y, w in xs[:a.warmup]:
    model.train_on_batch(x, y, sample_weight=w)
  t0 = time.perf_counter()
  for i in range(a.steps):
    x, y, w = xs[i % len(xs)]
    loss = model.train_on_batch(x, y, sample_weight=w)
  np.asarray(loss)
  return time.perf_counter() - t0


def run_hf_torch(a, batches):
  import torch
  import transformers
  layers, hidden = SIZES[a.model]
  cfg = transformers.BertConfig(vocab_size=_vocab_size(), hidden_size=hidden,
                                num_hidden_layers=layers, num_attention_heads=hidden // 64,
                                intermediate_size=4 * hidden)
  model = transformers.BertForPreTraining(cfg).train()
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
  prepared = []
  for b in batches:
    t = {k: torch.from_numpy(v).long() for k, v in b.items() if k != "masked_lm_weights"}
    labels = torch.full_like(t["input_ids"], -100)  # HF scores every position; -100 = ignore
    valid = torch.from_numpy(b["masked_lm_weights"] > 0)
    rows = torch.arange(labels.shape[0])[:, None].expand_as(valid)
    labels[rows[valid], t["masked_lm_positions"][valid]] = t["masked_lm_ids"][valid]
    prepared.append((t, labels))

  def step(t, labels):
    out = model(input_ids=t["input_ids"], attention_mask=t["input_mask"],
                token_type_ids=t["segment_ids"], labels=labels,
                next_sentence_label=t["next_sentence_labels"])
    out.loss.backward()
    opt.step()
    opt.zero_grad()

  for t, labels in prepared[:a.warmup]:
    step(t, labels)
  t0 = time.perf_counter()
  for i in range(a.steps):
    step(*prepared[i % len(prepared)])
  return time.perf_counter() - t0


# name -> (runner, GELU, packed batches?)
RUNNERS = dict(bert_jax_packed=(run_bert_jax, "gelu", True),
               bert_jax=(run_bert_jax, "gelu", False),
               bert_jax_tanh_packed=(run_bert_jax, "gelu_tanh", True),
               keras_hub=(run_keras_hub, "gelu_tanh", False),
               hf_torch=(run_hf_torch, "gelu", False))


def throughput(a):
  with tempfile.TemporaryDirectory() as tmp:
    path = os.path.join(tmp, "batches.npz")
    save_batches(a, path)
    results = {}
    for name, (_, act, _) in RUNNERS.items():
      result = common.run_isolated(
          "benchmarks.packing", [f"--only={name}", f"--act={act}", f"--batches_file={path}"] + [
              f"--{k}={v}" for k, v in vars(a).items() if k in ("model", "batch", "steps",
                                                               "warmup")], f"  {name}")
      if result is not None:
        results[name] = result
  print(f"\n2. BERT-{a.model}, quick start records (seq 128), batch {a.batch} rows, "
        f"{a.steps} timed steps over {a.num_batches} real batches ({os.cpu_count()} cores)")
  for name, r in results.items():
    print(f"  {name:22s} {r['real_tokens_per_s']:9.0f} real tokens/s  "
          f"({r['rows_per_s']:.1f} rows/s, {r['real_per_slot']:.3f} real tokens per slot)")
  for ours, peer, what in (("bert_jax_packed", "bert_jax", "ours packed / ours unpacked"),
                           ("bert_jax_packed", "hf_torch", "ours packed / HF BertForPreTraining"),
                           ("bert_jax_tanh_packed", "keras_hub",
                            "ours packed / KerasHub BertMaskedLM (tanh GELU)")):
    if ours in results and peer in results:
      ratio = results[ours]["real_tokens_per_s"] / results[peer]["real_tokens_per_s"]
      print(f"  {what}: {ratio:.2f}x real tokens/s")
  return results


def run_one(a):
  runner, _, packed = RUNNERS[a.only]
  batches = load_batches(a.batches_file, "packed" if packed else "unpacked")
  seconds = runner(a, batches)
  real = sum(int(batches[i % len(batches)]["input_mask"].sum()) for i in range(a.steps))
  slots = a.steps * batches[0]["input_mask"].size
  print("RESULT " + json.dumps(dict(real_tokens_per_s=real / seconds,
                                    rows_per_s=a.steps * a.batch / seconds,
                                    real_per_slot=real / slots)), flush=True)


# ----------------------------------------------------------------------------------------------
# Time to the same held-out MLM accuracy (the quick start's training, packed vs unpacked).
# ----------------------------------------------------------------------------------------------
def _train_curve(pack, steps, warmup_steps, workdir):
  """[(seconds since start, step, eval mlm_accuracy)] of one quick-start training."""
  cmd = [sys.executable, "-m", "bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny,runlocal",
         f"--workdir={workdir}",
         f"--config.train_input_files={QS}/records/train/*.tfrecord",
         f"--config.eval_input_files={QS}/records/eval/*.tfrecord",
         f"--config.vocab_file={QS}/vocab.txt", f"--config.num_train_steps={steps}",
         f"--config.warmup_steps={warmup_steps}",
         "--config.eval_every=100", "--config.checkpoint_every=100000",
         f"--config.pack={str(pack).lower()}"]
  proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  t0, curve, lines = time.monotonic(), [], []
  for line in proc.stdout:
    lines.append(line)
    m = re.match(r"eval @ step (\d+): mlm_accuracy ([\d.]+)", line)
    if m:
      curve.append((time.monotonic() - t0, int(m.group(1)), float(m.group(2))))
  if proc.wait():
    raise SystemExit("training failed:\n" + "".join(lines[-30:]))
  return curve


def time_to_accuracy(a):
  curves = {}
  with tempfile.TemporaryDirectory() as tmp:
    for pack in (False, True):
      curves[pack] = _train_curve(pack, a.train_steps, a.train_warmup_steps,
                                  os.path.join(tmp, f"pack{pack}"))
  target = curves[False][-1][2]

  def first(curve):
    return next(((t, s) for t, s, acc in curve if acc >= target), (None, None))

  print(f"\n3. Quick start (BERT-tiny, runlocal, {a.train_steps} steps, warmup "
        f"{a.train_warmup_steps}): wall time to held-out "
        f"MLM accuracy {target:.4f} (the unpacked run's last evaluation); evaluations included")
  for pack in (False, True):
    t, s = first(curves[pack])
    final = curves[pack][-1]
    print(f"  {'packed  ' if pack else 'unpacked'}: reached at step {s} after "
          f"{'%.0f s' % t if t else 'never'}; final accuracy {final[2]:.4f} after {final[0]:.0f} s")
  tu, tp = first(curves[False])[0], first(curves[True])[0]
  if tu and tp:
    print(f"  unpacked / packed wall time to that accuracy: {tu / tp:.2f}x")


def main():
  p = argparse.ArgumentParser()
  p.add_argument("--model", default="mini")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--steps", type=int, default=10)
  p.add_argument("--warmup", type=int, default=2)
  p.add_argument("--num_batches", type=int, default=8)
  p.add_argument("--efficiency_batches", type=int, default=200)
  p.add_argument("--google_records", default="")
  p.add_argument("--records512", default="")
  p.add_argument("--skip_throughput", action="store_true")
  p.add_argument("--time_to_accuracy", action="store_true")
  p.add_argument("--train_steps", type=int, default=1500)
  p.add_argument("--train_warmup_steps", type=int, default=150)
  p.add_argument("--act", default="gelu", help="internal")
  p.add_argument("--only", default="", help="internal: run one framework and print JSON")
  p.add_argument("--batches_file", default="", help="internal")
  a = p.parse_args()
  if a.only:
    run_one(a)
    return
  if not os.path.exists(os.path.join(QS, "records/train/dataset_info.json")):
    raise SystemExit("no quick-start records: run scripts/quickstart_pretrain.sh first.")
  efficiency_table(a)
  if not a.skip_throughput:
    throughput(a)
  if a.time_to_accuracy:
    time_to_accuracy(a)


if __name__ == "__main__":
  main()
