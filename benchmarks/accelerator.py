r"""Accelerator throughput of a full pre-training step: real tokens/s, sequences/s, MFU, FLOPs.

  python -m benchmarks.accelerator                      # both cases, every backend of this chip
  python -m benchmarks.accelerator --cases=large512 --backends=splash --packing=packed
  python -m benchmarks.accelerator --profile_dir=/tmp/prof   # + traces and where the time went
  python -m benchmarks.accelerator --peer=torch         # + transformers/PyTorch on the same rows
  python -m benchmarks.accelerator --smoke              # tiny config on CPU, seconds
  bash benchmarks/gpu_session.sh                        # the H100 session's one call
  bash benchmarks/gpu_ab.sh                             # issue 38's levers, peer and profiles

Cases (bfloat16 compute, float32 parameters and Adam state, AdamW as the presets):
  base128    BERT-base, phase 1: seq 128, global batch 256, 20 predictions per instance
  large512   BERT-large, phase 2: seq 512, global batch 32 per chip (--batch overrides), 80
             predictions per instance, remat off (one H100 holds it; --remat turns it on)
Each case runs unpacked (one instance per row, padded) and packed (instances end to end,
data_pipelines/records/packing.py), once per attention backend. Attention dropout is 0 unless a variant
asks for the recipe's 0.1 (`@drop`: cuDNN drops in its kernel, xla on the probabilities; the other
fused kernels have none), so plain backends run the same maths; hidden dropout stays 0.1.

Variants (--backends, --unpacked_backends): BACKEND[@KNOB...], in one process (XLA's autotuning
carries over). Module knobs KNOBn (`bwd64`, `M8`, `vpad128`, `headbf16`: parse_variant); model
levers of issue 38, bare words: `fp8` (config.model.fp8), `gelu` (fused_bias_gelu with the tanh
GELU it needs), `resnorm` (fused_residual_norm), `drop` (attention dropout 0.1, the recipe), `all`
(the four). e.g. `auto@drop@fp8`.

Records are synthetic but shaped like real text: instance lengths follow the quick start's records
(measured quantiles below; mean 0.44 of the row is real tokens; Wikipedia at seq 512 is ~0.50,
Krell et al. 2021), so padding costs what it costs on real data.

Printed per run:
  real tok/s   real (non-padding) tokens per second
  seq/s        instances per second (a packed row holds several)
  MFU          analytic model FLOPs of the real tokens (bert_jax.train.model_flops_per_sequence
               summed over instances at their own length) / (chips x bf16 peak)
  XLA/analytic the compiled step's FLOPs (XLA cost analysis) / the analytic FLOPs of the slots it
               computes (padding included). Fused attention kernels are custom calls that XLA's cost
               analysis does not count, so their runs read low by the attention share.
The first line gives the date, commit and versions (jax, jaxlib, flax, optax, torch, transformers).

--profile_dir: per run, a trace of --profile_steps steps and the table of where the step's time
goes (matmuls, attention, LayerNorm/GELU/dropout/softmax fusions, heads, optimizer, copies, idle):
benchmarks/profile_table.py.
--peer=torch: transformers' BertForPreTraining trained on the same rows (benchmarks/torch_peer.py,
its own process, run before ours since JAX holds the GPU's memory once started); its line, and
the ratios (ours packed / the peer as a user runs it; ours unpacked / the peer: row for row).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np

from bert_jax_core import errors

# Instance length quantiles of the quick start's training records (25,334 instances of seq 128,
# runs/quickstart/records/train, measured 2026-11-22): (quantile, tokens out of 128). Scaled to T.
LENGTH_QUANTILES = ((0.0, 9), (0.05, 20), (0.1, 23), (0.2, 27), (0.3, 32), (0.4, 38),
                    (0.5, 45), (0.6, 54), (0.7, 66), (0.8, 87), (0.85, 103), (0.89, 127),
                    (0.9, 128), (1.0, 128))

CASES = {
    "base128": dict(model="base", seq=128, batch=256, per_chip=False, preds=20),
    "large512": dict(model="large", seq=512, batch=32, per_chip=True, preds=80),
    "smoke": dict(model="tiny", seq=128, batch=8, per_chip=False, preds=20),
}


# ----------------------------------------------------------------------------------------------
# Synthetic records.
# ----------------------------------------------------------------------------------------------
def sample_lengths(rng, n, seq):
  """n instance lengths with the quick start's distribution, scaled to rows of `seq`."""
  q, tokens = np.asarray(LENGTH_QUANTILES, np.float64).T
  lengths = np.interp(rng.uniform(size=n), q, tokens) * seq / 128.0
  return np.clip(np.round(lengths), 8, seq).astype(np.int32)


def make_instances(rng, n, seq, preds, vocab):
  """n unpacked instances [n, T]: [CLS] A [SEP] B [SEP] then padding, 15% masked (<= preds)."""
  lengths = sample_lengths(rng, n, seq)
  pos = np.arange(seq)[None]
  mask = (pos < lengths[:, None]).astype(np.int32)
  ids = rng.integers(5, vocab, size=(n, seq)).astype(np.int32) * mask
  ids[:, 0] = 2                                                          # [CLS]
  a_end = np.maximum(1, lengths // 2)
  ids[np.arange(n), a_end] = 3                                           # [SEP] after A
  ids[np.arange(n), lengths - 1] = 3                                     # [SEP] after B
  segment = ((pos > a_end[:, None]) & (mask > 0)).astype(np.int32)
  out = dict(input_ids=ids, input_mask=mask, segment_ids=segment,
             masked_lm_positions=np.zeros((n, preds), np.int32),
             masked_lm_ids=np.zeros((n, preds), np.int32),
             masked_lm_weights=np.zeros((n, preds), np.float32),
             next_sentence_labels=rng.integers(0, 2, n).astype(np.int32))
  for i, length in enumerate(lengths):
    k = min(preds, max(1, int(round(0.15 * (length - 3)))))
    candidates = np.setdiff1d(np.arange(1, length - 1), [a_end[i]])
    chosen = np.sort(rng.choice(candidates, k, replace=False))
    out["masked_lm_positions"][i, :k] = chosen
    out["masked_lm_ids"][i, :k] = ids[i, chosen]
    out["masked_lm_weights"][i, :k] = 1.0
    out["input_ids"][i, chosen] = 4                                       # [MASK]
  return out, lengths


def make_batches(rng, *, count, rows, seq, preds, vocab, packed, max_instances=None):
  """`count` host batches of `rows` rows, and per batch the (length, predictions) of each
  instance it holds (for the real-token FLOPs). max_instances: the packer's K (the `@K8` knob),
  default packing.default_max_instances(seq)."""
  batches, contents = [], []
  for _ in range(count):
    if not packed:
      b, lengths = make_instances(rng, rows, seq, preds, vocab)
      batches.append(b)
      contents.append((lengths, b["masked_lm_weights"].sum(1).astype(int)))
      continue
    from data_pipelines.records import packing  # imports TensorFlow: only when packing
    k = max_instances or packing.default_max_instances(seq)
    q = packing.max_predictions_per_pack(seq, k)
    # Enough instances for `rows` full rows at the quick start's mean fill (0.44), + margin.
    inst, _ = make_instances(rng, int(rows / 0.44 * 1.3) + 8, seq, preds, vocab)
    p = packing.pack_arrays(inst, int(rng.integers(1 << 30)), max_instances=k, max_preds=q,
                            count_preds=True)
    # Rows come out shuffled; the first `rows` are a fair sample (the chunk's last, emptier rows
    # are spread among them as in training).
    b = {key: v[:rows] for key, v in p.items()}
    present = b["nsp_weights"] > 0
    lengths = np.asarray([np.sum(b["instance_ids"][r] == s + 1)
                          for r, s in zip(*np.nonzero(present))])
    preds_per = np.asarray([np.sum(b["masked_lm_weights"][r][
        b["instance_ids"][r][b["masked_lm_positions"][r]] == s + 1]) for r, s in
        zip(*np.nonzero(present))])
    batches.append(b)
    contents.append((lengths, preds_per.astype(int)))
  return batches, contents


# ----------------------------------------------------------------------------------------------
# One run: a case, a packing mode, a backend.
# ----------------------------------------------------------------------------------------------
def model_config(case, *, packed, dtype, remat, batch, hidden_dropout=None, attention="xla",
                 levers=None):
  """The pre-training config and model config of one run (no device touched). levers: config.model
  fields a variant sets (_LEVERS)."""
  from bert_jax import train
  from bert_jax.configs import pretrain
  c = pretrain.get_config(case["model"])
  c.train_input_files = "synthetic"
  c.model.vocab_size = 30522
  c.batch_size, c.seq_length, c.max_predictions_per_seq = batch, case["seq"], case["preds"]
  c.model.dtype = dtype
  c.model.remat = remat
  c.model.attention_dropout_prob = 0.0
  c.model.attention = attention
  if hidden_dropout is not None:   # --hidden_dropout: what the dropout masks cost
    c.model.hidden_dropout_prob = hidden_dropout
  for field, value in (levers or {}).items():
    c.model[field] = value
  if "pack" in c:
    c.pack = packed
  return c, train.create_model_config(c, train.load_vocab(c))


def build(case, *, packed, backend, dtype, remat, batch, interpret, hidden_dropout=None,
          levers=None):
  """The pre-training config, model config, mesh and jitted steps of one run."""
  from bert_jax import train
  from bert_jax.layers import attention
  from bert_jax.parallel import sharding as sharding_lib
  dropout = (levers or {}).get("attention_dropout_prob", 0.0)
  choice = attention.select_backend(backend, packed=packed, dtype=dtype, seq_len=case["seq"],
                                    dropout=dropout, allow_interpret=interpret)
  c, mc = model_config(case, packed=packed, dtype=dtype, remat=remat, batch=batch,
                       hidden_dropout=hidden_dropout, attention=choice.backend, levers=levers)
  mesh = sharding_lib.create_mesh((-1, 1, 1))
  return c, mc, mesh, train.build_training(c, mc, mesh), choice


def real_flops(mc, contents, used):
  """Analytic model FLOPs of the real instances in the batches `used` (each at its own length
  and predictions), the numerator of MFU for both frameworks."""
  from bert_jax import train
  return sum(sum(train.model_flops_per_sequence(mc, int(n), int(p))
                 for n, p in zip(*contents[i])) for i in used)


def run(case, *, packed, backend, dtype, steps, warmup, remat, batch, interpret, profile_dir,
        seed=0, hidden_dropout=None, profile_steps_n=3, levers=None, max_instances=None):
  import jax
  from bert_jax import train
  from bert_jax.parallel import sharding as sharding_lib
  c, mc, mesh, t, choice = build(case, packed=packed, backend=backend, dtype=dtype, remat=remat,
                                 batch=batch, interpret=interpret, hidden_dropout=hidden_dropout,
                                 levers=levers)
  rng = np.random.default_rng(seed)
  host, contents = make_batches(rng, count=4, rows=batch, seq=case["seq"], preds=case["preds"],
                                vocab=30522, packed=packed, max_instances=max_instances)
  batches = [sharding_lib.make_global_batch(b, mesh) for b in host]
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(seed))
    compiled = t.train_step.lower(state, batches[0]).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    # The step donates its state: carry on with the one the timed steps returned.
    seconds, used, state = time_steps(compiled, state, batches, warmup=warmup, steps=steps)
    profile = None
    if profile_dir:
      state, profile = profile_steps(compiled, state, batches, profile_dir, steps=profile_steps_n)
  real_tokens = sum(int(contents[i][0].sum()) for i in used)
  instances = sum(len(contents[i][0]) for i in used)
  flops = real_flops(mc, contents, used)
  width = host[0]["masked_lm_positions"].shape[1]
  slot_flops = train.model_flops_per_sequence(mc, case["seq"], width) * batch
  peak = train.device_peak_tflops()
  return dict(backend=choice.backend, reason=choice.reason, packed=packed, batch=batch,
              fill=real_tokens / (len(used) * batch * case["seq"]),
              tokens_per_s=real_tokens / seconds, seqs_per_s=instances / seconds,
              mfu=(flops / seconds / 1e12 / peak) if peak else None,
              # The cost analysis is of one device's SPMD program: x devices for the step.
              xla_flops=float(cost.get("flops", 0.0)) * mesh.size if cost else 0.0,
              slot_flops=slot_flops, real_flops=flops / len(used),
              step_ms=1e3 * seconds / len(used), profile=profile)


def time_steps(step, state, batches, *, warmup, steps):
  """Seconds for `steps` steps cycling over `batches` (after `warmup`), the batch indices used
  and the last state (the step donates its input state); a device sync on both sides of the timed
  window."""
  import jax
  m = None
  for i in range(warmup):
    state, m = step(state, batches[i % len(batches)])
  jax.block_until_ready((state, m))
  used = [i % len(batches) for i in range(steps)]
  t0 = time.perf_counter()
  for i in used:
    state, m = step(state, batches[i])
  jax.block_until_ready((state, m))
  return time.perf_counter() - t0, used, state


def profile_steps(step, state, batches, profile_dir, *, steps=3):
  """Traces `steps` steps into profile_dir (with the compiled step's HLO beside the trace, which
  benchmarks/profile_table.py reads to name each op) and prints the table of where the time
  went. Returns the state and the table's data."""
  import jax
  from benchmarks import profile_table
  os.makedirs(profile_dir, exist_ok=True)
  hlo = step.as_text()
  module = hlo.split(None, 2)[1].rstrip(",")          # "HloModule jit_train_step, ..."
  with open(os.path.join(profile_dir, f"{module}.hlo.txt"), "w") as f:
    f.write(hlo)
  m = None
  jax.profiler.start_trace(profile_dir)
  for i in range(steps):
    state, m = step(state, batches[i % len(batches)])
  jax.block_until_ready((state, m))
  jax.profiler.stop_trace()
  table = profile_table.profile_table(profile_dir, module=module)
  print(f"trace of {steps} steps in {profile_dir} (TensorBoard's profile plugin or Perfetto)\n"
        + profile_table.format_table(table, title=os.path.basename(profile_dir)), flush=True)
  return state, table


# ----------------------------------------------------------------------------------------------
# Command line.
# ----------------------------------------------------------------------------------------------
def backends_to_run(requested, *, packed, dtype, seq, interpret):
  """`all`: xla plus every fused kernel that can run here; else the comma-separated list."""
  from bert_jax.layers import attention
  if requested != "all":
    return requested.split(",")
  fused = [b for b in attention.FUSED if attention.unsupported_reason(
      b, platform_name=attention.platform(), packed=packed, dtype=dtype, seq_len=seq, dropout=0.0,
      allow_interpret=interpret) is None]
  return ["xla"] + fused


# A/B variants of a backend, in one process so XLA's autotuning results carry over between them
# (most of a compile): `pallas_gpu@bwd64` (the Pallas kernel's backward tiles), `cudnn@M32`
# (instances per packed row cuDNN is told of), `xla@vpad128` (the MLM head's vocab padded to a
# multiple of 128 inside its matmul), `xla@headbf16` (its backward GEMMs in bf16; any n turns it on),
# `cudnn@K8` (the packer's K, instances per row at most: the width of cls_positions, which the
# model tells cuDNN; unlike M, a bound the data keeps, so no instance is left out).
_KNOBS = {"bwd": ("attention", "PALLAS_BWD_BLOCK"), "M": ("attention", "CUDNN_MAX_SEGMENTS"),
          "K": ("data", "max_instances"),
          "vpad": ("pretraining_heads", "VOCAB_PAD"),
          "headbf": ("pretraining_heads", "HEAD_BF16_BACKWARD")}
# Issue 38's levers (bare words): config.model fields, each a switch of the step (the module
# docstring). `gelu` sets the tanh GELU its cuBLASLt epilogue needs: a change of the recipe that the
# variant's name says (bert_jax/layers/fused_ops.py). `drop` is the recipe's attention dropout, 0.1.
_LEVERS = {"fp8": {"fp8": True},
           "gelu": {"fused_bias_gelu": True, "hidden_act": "gelu_tanh"},
           "resnorm": {"fused_residual_norm": True},
           "drop": {"attention_dropout_prob": 0.1}}
_LEVERS["all"] = {k: v for lever in list(_LEVERS.values()) for k, v in lever.items()}


def parse_variant(spec):
  """`cudnn@M32` -> ("cudnn", {("attention", "CUDNN_MAX_SEGMENTS"): 32}); a lever `auto@fp8` ->
  ("auto", {("model", "fp8"): True}); a one-line error for an unknown knob."""
  backend, _, rest = spec.partition("@")
  knobs = {}
  for item in filter(None, rest.split("@")):
    if item in _LEVERS:
      knobs.update({("model", field): value for field, value in _LEVERS[item].items()})
      continue
    m = re.fullmatch(r"([A-Za-z]+?)(\d+)", item)
    if not m or m.group(1) not in _KNOBS:
      raise errors.UserError(f"--backends: {spec!r}: a variant is BACKEND@KNOBn with KNOB one of "
                             f"{', '.join(_KNOBS)} (pallas_gpu@bwd64, cudnn@M8, "
                             "pallas_gpu@vpad128@headbf16), or BACKEND@LEVER with LEVER one of "
                             f"{', '.join(_LEVERS)} (auto@drop@fp8)")
    knobs[_KNOBS[m.group(1)]] = int(m.group(2))
  return backend, knobs


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--cases", default="base128,large512", help="base128, large512 (comma list)")
  p.add_argument("--backends", default="all", help="all, or a list of auto,xla,cudnn,"
                 "pallas_gpu,splash, each with @knobs/@levers (the module docstring)")
  p.add_argument("--unpacked_backends", default="", help="the unpacked rows' list, when it "
                 "differs from --backends (e.g. cudnn there, pallas_gpu packed)")
  p.add_argument("--budget_s", type=float, default=0, help="start no further run once the "
                 "seconds since start plus the longest run so far would pass this (0: no limit); "
                 "each run not started is printed as such")
  p.add_argument("--packing", default="both", choices=("both", "packed", "unpacked"))
  p.add_argument("--steps", type=int, default=300)
  p.add_argument("--warmup", type=int, default=10)
  p.add_argument("--batch", type=int, default=0, help="global batch (0: the case's)")
  p.add_argument("--dtype", default="bfloat16")
  p.add_argument("--remat", action="store_true", help="rematerialise each layer")
  p.add_argument("--hidden_dropout", type=float, default=None,
                 help="hidden dropout (default: the preset's 0.1); 0 measures what dropout costs")
  p.add_argument("--profile_dir", default="", help="trace --profile_steps steps per run into "
                 "DIR/<case>-<packing>-<backend>/ and print where the time went "
                 "(benchmarks/profile_table.py)")
  p.add_argument("--profile_steps", type=int, default=3, help="steps per trace")
  p.add_argument("--peer", default="none", choices=("none", "torch"),
                 help="also train transformers' BertForPreTraining (PyTorch, SDPA, bf16 autocast, "
                 "fused AdamW) on the same rows, in its own process first, and print the ratio")
  p.add_argument("--peer_sdpa", default="default", help="comma list: default (PyTorch picks the "
                 "SDPA kernel), cudnn (forces cuDNN's; GPU only)")
  p.add_argument("--peer_compile", action=argparse.BooleanOptionalAction, default=None,
                 help="torch.compile the peer (default: on, off with --smoke: compiling BERT on "
                 "CPU takes minutes)")
  p.add_argument("--peer_steps", type=int, default=0, help="peer's timed steps (0: --steps)")
  p.add_argument("--peer_warmup", type=int, default=5, help="peer's warm-up steps (compilation)")
  p.add_argument("--peer_timeout", type=int, default=0, help="stop a peer run after this many "
                 "seconds, compilation included (0: never)")
  p.add_argument("--peer_attention_dropout", type=float, default=0.0, help="the peer's "
                 "attention_probs_dropout_prob (0.1: BERT's recipe, as ours with @drop)")
  p.add_argument("--interpret", action="store_true", help="allow Pallas kernels in CPU "
                 "interpret mode (for checking the plumbing; slow)")
  p.add_argument("--smoke", action="store_true", help="tiny config, 3 steps: checks the "
                 "benchmark end to end on CPU in seconds")
  a = p.parse_args(argv)
  unknown = set(a.cases.split(",")) - set(CASES)
  if unknown:
    p.error(f"--cases: unknown {sorted(unknown)}; use {', '.join(CASES)}")
  if a.smoke:
    a.cases, a.steps, a.warmup = "smoke", 3, 1
    a.peer_warmup = min(a.peer_warmup, 1)
  if a.peer_compile is None:
    a.peer_compile = not a.smoke
  return a


def _version(name):
  """An installed package's version, read without importing it ("-" when absent)."""
  from importlib import metadata
  try:
    return metadata.version(name)
  except metadata.PackageNotFoundError:
    return "-"


def _commit():
  """`git describe` of this checkout (with -dirty), or "" outside git."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  return subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=7"], cwd=root,
                        capture_output=True, text=True).stdout.strip()


def provenance():
  """One line for every figure: date, commit, the packages' versions (read without importing)."""
  pkgs = " ".join(f"{n} {_version(n)}" for n in ("jax", "jaxlib", "flax", "optax", "torch",
                                                   "transformers"))
  return (f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit "
          f"{_commit() or 'unknown'}, python {sys.version.split()[0]}, {pkgs}")


def run_peer(name, case, a, batch, sdpa):
  """The torch peer in its own process (before JAX takes the GPU's memory): its RESULT dict with
  the case's name, or None after printing why it failed or that it ran past --peer_timeout (so a
  slow compile cannot eat a device session's time for our runs)."""
  _, mc = model_config(case, packed=False, dtype=a.dtype, remat=False, batch=batch,
                       hidden_dropout=a.hidden_dropout)
  # The same model in transformers' terms (our erf "gelu" is HF's "gelu").
  hf = dict(vocab_size=mc.vocab_size, hidden_size=mc.hidden_size,
            num_hidden_layers=mc.num_layers, num_attention_heads=mc.num_heads,
            intermediate_size=mc.intermediate_size, hidden_act=mc.hidden_act,
            max_position_embeddings=mc.max_position_embeddings,
            type_vocab_size=mc.type_vocab_size, hidden_dropout_prob=mc.hidden_dropout_prob,
            attention_probs_dropout_prob=a.peer_attention_dropout,
            layer_norm_eps=mc.layer_norm_eps)
  compile_flag = ("--compile" if a.peer_compile else "--nocompile")
  cmd = [sys.executable, "-m", "benchmarks.torch_peer", f"--case={name}",
         f"--config_json={json.dumps(hf)}", f"--batch={batch}",
         f"--steps={a.peer_steps or a.steps}", f"--warmup={a.peer_warmup}", f"--sdpa={sdpa}",
         compile_flag]
  label = f"torch peer {name} sdpa={sdpa}"
  t0 = time.perf_counter()
  try:
    p = subprocess.run(cmd, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       capture_output=True, text=True, timeout=a.peer_timeout or None,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  except subprocess.TimeoutExpired:
    print(f"{label}: stopped after --peer_timeout={a.peer_timeout} s (compilation included)",
          flush=True)
    return None
  line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
  if p.returncode or not line:
    tail = " | ".join(p.stderr.strip().splitlines()[-3:])
    print(f"{label}: FAILED (exit {p.returncode}): {tail}", flush=True)
    return None
  r = json.loads(line[0][len("RESULT "):])
  r.update(case=name, mc=mc, batch=batch, wall_s=time.perf_counter() - t0)
  print(f"{label} compile={r['compiled']}: done in {r['wall_s']:.0f} s "
        f"({r['real_tokens'] / r['seconds']:.0f} real tok/s; {r['versions']})", flush=True)
  return r


def peer_row(r, seed=0):
  """The peer's figures in our row's terms: real tokens/s, instances/s, ms/step and MFU (the same
  analytic FLOPs of the same real instances: the batches are ours, remade from the seed)."""
  import jax
  from bert_jax import train
  case = CASES[r["case"]]
  _, contents = make_batches(np.random.default_rng(seed), count=4, rows=r["batch"],
                             seq=case["seq"], preds=case["preds"], vocab=r["mc"].vocab_size,
                             packed=False)
  peak = train.device_peak_tflops(jax.devices()[:1])
  seconds = r["seconds"]
  return dict(tokens_per_s=r["real_tokens"] / seconds, seqs_per_s=r["instances"] / seconds,
              step_ms=1e3 * seconds / len(r["used"]),
              mfu=(real_flops(r["mc"], contents, r["used"]) / seconds / 1e12 / peak)
              if peak else None)


def format_peer(r, row):
  mfu = f"{row['mfu']:6.1%}" if row["mfu"] is not None else "   n/a"
  peak = f", peak {r['peak_gib']:.1f} GiB" if r["peak_gib"] is not None else ""
  return (f"{r['case']:9s} unpacked torch sdpa={r['sdpa']} compile={r['compiled']} "
          f"amp={r['amp']} "
          f"batch {r['batch']:4d} | {row['tokens_per_s']:10.0f} real tok/s "
          f"{row['seqs_per_s']:8.1f} seq/s {row['step_ms']:8.1f} ms/step | MFU {mfu} | "
          f"loss {r['loss']:.2f}{peak} | {r['versions']}")


def compare(name, ours, peers, chips):
  """The ratio lines of one case: ours packed (best) and ours unpacked (best) over the peer's
  best, per chip (the peer runs on one)."""
  lines = []
  best_peer = max(peers, key=lambda p: p[1]["tokens_per_s"], default=None)
  if best_peer is None:
    return lines
  peer_rate = best_peer[1]["tokens_per_s"]
  for packed, what in ((True, "ours packed / torch as a user runs it"),
                       (False, "row for row, packing off")):
    mine = [r for r in ours if r["case"] == name and r["packed"] == packed]
    if mine:
      best = max(mine, key=lambda r: r["tokens_per_s"])
      lines.append(f"ratio {name}: {what}: {best['tokens_per_s'] / chips / peer_rate:.2f}x real "
                   f"tok/s per chip (ours {best['backend']}, torch sdpa={best_peer[0]['sdpa']})")
  # Every row of ours against the peer (row for row where ours is unpacked too).
  for r in ours:
    if r["case"] == name:
      lines.append(f"ratio {name}: {'packed' if r['packed'] else 'unpacked'} {r['backend']} / "
                   f"torch unpacked: {r['tokens_per_s'] / chips / peer_rate:.2f}x")
  return lines


def backend_list(a, packed):
  """The variants to run for packed or unpacked rows (--unpacked_backends, else --backends)."""
  return a.backends if packed or not a.unpacked_backends else a.unpacked_backends


def over_budget(started, longest, budget_s, now=None):
  """True when a further run, as long as the longest so far, would end past --budget_s."""
  now = time.perf_counter() if now is None else now
  return bool(budget_s) and (now - started) + longest > budget_s


def main(argv=None):
  a = parse_args(argv)
  print(provenance(), flush=True)
  cases = a.cases.split(",")
  peers = []
  if a.peer == "torch":   # first: JAX keeps 75% of the GPU's memory from its first step on
    for name in cases:
      batch = a.batch or CASES[name]["batch"]           # one chip's rows
      for sdpa in a.peer_sdpa.split(","):
        r = run_peer(name, CASES[name], a, batch, sdpa)
        if r is not None:
          peers.append(r)
  import jax
  from bert_jax.layers import attention
  from bert_jax.models import pretraining_heads
  device = jax.devices()[0]
  print(f"{jax.device_count()} x {device.device_kind} ({attention.platform()}), jax "
        f"{jax.__version__}", flush=True)
  results, failed, skipped = [], [], []
  started, longest = time.perf_counter(), 0.0
  versions = short_versions()
  for name in cases:
    case = CASES[name]
    batch = a.batch or case["batch"] * (jax.device_count() if case["per_chip"] else 1)
    for packed in {"both": (False, True), "packed": (True,), "unpacked": (False,)}[a.packing]:
      for spec in backends_to_run(backend_list(a, packed), packed=packed, dtype=a.dtype,
                                  seq=case["seq"], interpret=a.interpret):
        backend, knobs = parse_variant(spec)
        levers = {k: v for (m, k), v in knobs.items() if m == "model"}
        data = {k: v for (m, k), v in knobs.items() if m == "data"}
        knobs = {mk: v for mk, v in knobs.items() if mk[0] not in ("model", "data")}
        if over_budget(started, longest, a.budget_s):
          print(f"{name:9s} {'packed' if packed else 'unpacked':8s} {spec}: not run (--budget_s="
                f"{a.budget_s:g}: {time.perf_counter() - started:.0f} s gone, the longest run "
                f"{longest:.0f} s)", flush=True)
          skipped.append(spec)
          continue
        modules = {"attention": attention, "pretraining_heads": pretraining_heads}
        saved = {(m, k): getattr(modules[m], k) for m, k in knobs}
        for (m, k), v in knobs.items():
          setattr(modules[m], k, v)
        t_run = time.perf_counter()
        try:
          r = run(case, packed=packed, backend=backend, dtype=a.dtype, steps=a.steps,
                  warmup=a.warmup, remat=a.remat, batch=batch, interpret=a.interpret,
                  hidden_dropout=a.hidden_dropout, profile_steps_n=a.profile_steps,
                  levers=levers, max_instances=data.get("max_instances"),
                  profile_dir=a.profile_dir and os.path.join(
                      a.profile_dir, f"{name}-{'packed' if packed else 'unpacked'}-{spec}"))
        except errors.UserError:
          raise                     # a refusal (before any compute): one line, exit 2
        except Exception as e:  # pylint: disable=broad-except
          # A kernel that fails on this chip costs its own row, not the A/B's other rows.
          first = (str(e).strip().splitlines() or [""])[0][:300]
          print(f"{name:9s} {'packed' if packed else 'unpacked':8s} {spec}: FAILED: "
                f"{type(e).__name__}: {first}", flush=True)
          failed.append(spec)
          continue
        finally:
          for (m, k), v in saved.items():
            setattr(modules[m], k, v)
          longest = max(longest, time.perf_counter() - t_run)
        r["case"] = name
        r["backend"] = spec
        r["versions"] = versions
        results.append(r)
        print(format_row(r), flush=True)
  for name in cases:
    rows = [(p, peer_row(p)) for p in peers if p["case"] == name]
    for p, row in rows:
      p["row"] = row
      print(format_peer(p, row), flush=True)
    for line in compare(name, results, rows, jax.device_count()):
      print(line, flush=True)
  if skipped:
    print(f"not run (time budget): {', '.join(skipped)}: a second call with VARIANTS=... runs them",
          flush=True)
  if failed:
    print(f"error: these runs failed on the chip: {', '.join(failed)} (their lines above)",
          file=sys.stderr)
    sys.exit(1)
  if a.peer == "torch":
    return results, peers
  return results


def format_row(r):
  mfu = f"{r['mfu']:6.1%}" if r["mfu"] is not None else "   n/a"
  ratio = r["xla_flops"] / r["slot_flops"] if r["slot_flops"] else float("nan")
  versions = f" | {r['versions']}" if r.get("versions") else ""
  return (f"{r['case']:9s} {'packed' if r['packed'] else 'unpacked':8s} {r['backend']:10s} "
          f"batch {r['batch']:4d} fill {r['fill']:.2f} | {r['tokens_per_s']:10.0f} real tok/s "
          f"{r['seqs_per_s']:8.1f} seq/s {r['step_ms']:8.1f} ms/step | MFU {mfu} | "
          f"XLA/analytic FLOPs {ratio:.2f} | {r['reason']}{versions}")


def short_versions():
  """jax/jaxlib/flax and the commit, for the end of every row (figures travel alone)."""
  return (f"jax {_version('jax')} jaxlib {_version('jaxlib')} flax {_version('flax')} "
          f"commit {_commit() or 'unknown'}")


if __name__ == "__main__":
  errors.run_main(main, None)   # a backend that cannot run here: one line on stderr, exit 2
