r"""The PyTorch peer of `benchmarks.accelerator`: transformers' BertForPreTraining, trained as a
PyTorch user would run it on the same chip, on the same rows.

  python -m benchmarks.accelerator --cases=large512 --peer=torch    # ours, then this, and the ratio
  python -m benchmarks.torch_peer --case=smoke --config_json='{...}' --batch=8  # what it calls

What it runs (each a choice a PyTorch user makes for speed, as NVIDIA's and HF's guides say):
  - `BertForPreTraining` (random init) with `attn_implementation="sdpa"`: PyTorch's fused
    scaled-dot-product attention; `--sdpa=cudnn` forces its cuDNN backend
    (`torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)`), `default` lets PyTorch choose;
  - float32 parameters and AdamW state, forward and loss under `torch.autocast(bfloat16)` (our
    bf16 compute with float32 parameters) on a GPU; on CPU float32 (bf16 autocast there made the
    backward pass 12x slower on this project's 2-core box, 45 s vs 3.7 s for BERT-tiny at 8 x
    128: CPUs without bf16 matrix units emulate it), `torch.optim.AdamW(fused=True)` (one
    kernel for the whole update), gradient clipping at 1.0 (our `clip_norm`, HF Trainer's
    `max_grad_norm`);
  - `torch.compile(model)` unless `--nocompile`. On CPU compiling BERT takes minutes (inductor
    generates and builds C++), so `--smoke` runs eager unless `--compile` is given.
Same model as ours (the HF `BertConfig` kwargs come from our model config: layers, hidden, heads,
intermediate, vocab 30522, erf GELU, hidden dropout 0.1, attention dropout 0 as our benchmark),
and the same rows and length mix: `accelerator.make_batches` with the same seed gives the batches
our unpacked run trains on (one instance per row, padded). HF has no packed rows: this is the
peer "as a user runs it". HF computes MLM logits at every position (labels -100 elsewhere), its
real cost; MFU counts the same model FLOPs of the real tokens for both sides.

Prints one line and a `RESULT {json}` line (seconds, the batch indices used, versions) that
`benchmarks.accelerator` reads; it runs in its own process so the two frameworks never share the
GPU's memory (JAX takes 75% of it when it starts).
"""

import argparse
import contextlib
import json
import os
import time

import numpy as np

from benchmarks import accelerator


def versions():
  import torch
  import transformers
  v = dict(torch=torch.__version__, transformers=transformers.__version__)
  if torch.cuda.is_available():
    v.update(cuda=torch.version.cuda, cudnn=str(torch.backends.cudnn.version()),
             device=torch.cuda.get_device_name(0))
  else:
    v.update(device="cpu")
  return v


def hf_batches(host, device):
  """Our unpacked host batches -> HF's inputs: labels -100 except the masked positions."""
  import torch
  out = []
  for b in host:
    ids = torch.from_numpy(b["input_ids"]).long()
    labels = torch.full_like(ids, -100)
    pos = torch.from_numpy(b["masked_lm_positions"]).long()
    real = torch.from_numpy(b["masked_lm_weights"]) > 0
    rows = torch.arange(ids.shape[0])[:, None].expand_as(pos)
    labels[rows[real], pos[real]] = torch.from_numpy(b["masked_lm_ids"]).long()[real]
    out.append({k: v.to(device) for k, v in dict(
        input_ids=ids, attention_mask=torch.from_numpy(b["input_mask"]).long(),
        token_type_ids=torch.from_numpy(b["segment_ids"]).long(), labels=labels,
        next_sentence_label=torch.from_numpy(b["next_sentence_labels"]).long()).items()})
  return out


def run(case, config_kwargs, *, batch, steps, warmup, compile_model, sdpa, seed=0):
  """Trains `steps` steps (after `warmup`) and returns seconds, the batch indices used, the
  real tokens and instances in them, and the peak GPU memory."""
  import torch
  import transformers
  from torch.nn.attention import SDPBackend, sdpa_kernel
  device = "cuda" if torch.cuda.is_available() else "cpu"
  torch.manual_seed(seed)
  cfg = transformers.BertConfig(**config_kwargs)
  model = transformers.BertForPreTraining._from_config(cfg, attn_implementation="sdpa")
  assert model.config._attn_implementation == "sdpa", model.config._attn_implementation
  model.to(device).train()
  # fused=True: one multi-tensor kernel for the whole update (CUDA; CPU since torch 2.4).
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.999), eps=1e-6,
                          weight_decay=0.01, fused=True)
  forward = torch.compile(model) if compile_model else model
  rng = np.random.default_rng(seed)
  host, contents = accelerator.make_batches(rng, count=4, rows=batch, seq=case["seq"],
                                            preds=case["preds"], vocab=cfg.vocab_size,
                                            packed=False)
  batches = hf_batches(host, device)
  backends = {"default": None, "cudnn": [SDPBackend.CUDNN_ATTENTION]}[sdpa]

  amp = device == "cuda"             # bf16 autocast on the GPU only (see the docstring)

  def step(b):
    with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=amp):
      loss = forward(**b).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss

  def sync():
    if device == "cuda":
      torch.cuda.synchronize()

  # sdpa_kernel is read when the graph is traced (torch.compile) and at each eager call.
  with (sdpa_kernel(backends) if backends else contextlib.nullcontext()):
    for i in range(warmup):
      loss = step(batches[i % len(batches)])
    sync()
    used = [i % len(batches) for i in range(steps)]
    t0 = time.perf_counter()
    for i in used:
      loss = step(batches[i])
    sync()
    seconds = time.perf_counter() - t0
  if not np.isfinite(float(loss)):
    raise RuntimeError(f"torch peer: loss {float(loss)} after {warmup + steps} steps")
  return dict(seconds=seconds, used=used, loss=float(loss), amp="bf16" if amp else "off",
              real_tokens=sum(int(contents[i][0].sum()) for i in used),
              instances=sum(len(contents[i][0]) for i in used),
              peak_gib=(torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None),
              versions=versions())


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--case", required=True, choices=sorted(accelerator.CASES))
  p.add_argument("--config_json", required=True, help="transformers.BertConfig kwargs (JSON)")
  p.add_argument("--batch", type=int, required=True)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--warmup", type=int, default=5)
  p.add_argument("--sdpa", default="default", choices=("default", "cudnn"))
  p.add_argument("--compile", dest="compile_model", action="store_true", default=None)
  p.add_argument("--nocompile", dest="compile_model", action="store_false")
  p.add_argument("--smoke", action="store_true", help="CPU plumbing check: eager unless --compile")
  a = p.parse_args(argv)
  if a.compile_model is None:
    a.compile_model = not a.smoke
  return a


def main(argv=None):
  a = parse_args(argv)
  r = run(accelerator.CASES[a.case], json.loads(a.config_json), batch=a.batch, steps=a.steps,
          warmup=a.warmup, compile_model=a.compile_model, sdpa=a.sdpa)
  r.update(sdpa=a.sdpa, compiled=a.compile_model)
  print(f"torch peer {a.case}: {r['real_tokens'] / r['seconds']:.0f} real tok/s, "
        f"{1e3 * r['seconds'] / len(r['used']):.1f} ms/step, sdpa={a.sdpa}, "
        f"compile={a.compile_model}, {r['versions']}", flush=True)
  print("RESULT " + json.dumps(r), flush=True)
  return r


if __name__ == "__main__":
  os.environ.setdefault("JAX_PLATFORMS", "cpu")   # this process never needs JAX's devices
  main()
