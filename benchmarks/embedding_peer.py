r"""Contrastive training speed and memory against sentence-transformers (issue 40 item 8), at equal
batch, in one run: ours (plain and GradCache) and sentence-transformers 6.x on torch CPU
(MultipleNegativesRankingLoss and CachedMultipleNegativesRankingLoss).

  .venv/bin/python -m benchmarks.embedding_peer --batch=64 --seq=64 --steps=5

Each variant runs in its own process (`--variant=...`, so peak memory is its own): the same
BERT-tiny shape on both sides (2 layers, H 128, 2 heads, FFN 512, vocab 5,000, dropout 0.1,
random init), the same random (anchor, positive) token rows [batch, 2, seq], mean pooling, InfoNCE
scale 20, AdamW. It times `--steps` optimizer steps after one warm-up step (our compile) and
reads the process's peak RSS (ru_maxrss): the whole process (framework, XLA's compile, the
training step), so at this size it says more about the frameworks than about the losses; XLA's
own figure for the step's activations is bert_jax.plan's. Prints one line per variant and each
one's time ratio to ours. Measure on an idle box: on a loaded one torch's OpenMP threads wait on
each other (st_mnrl at batch 16 x 32 took 2.4 s a step with 2 threads, 0.52 s with 1, at load
average 12 on the 2-core box).
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

VARIANTS = ("ours", "ours_gradcache", "st_mnrl", "st_cached_mnrl")
SHAPE = dict(vocab_size=5000, hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512)


def rows(batch, seq, seed=0):
  """[batch, 2, seq] int32 token ids (ids 5.. : no special token), mask of real lengths."""
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SHAPE["vocab_size"], size=(batch, 2, seq)).astype(np.int32)
  lengths = rng.integers(seq // 4, seq + 1, size=(batch, 2))
  mask = (np.arange(seq) < lengths[..., None]).astype(np.int32)
  return ids * mask, mask


def peak_mb():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024   # Linux: KiB


def run_ours(batch, seq, steps, chunks):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import optax  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import embedding  # pylint: disable=g-import-not-at-top
  cfg = model_lib.get_bert_config("tiny", max_position_embeddings=max(seq, 64), **SHAPE)
  model = embedding.EmbeddingModel(cfg, "mean")
  ids, mask = (jnp.asarray(x) for x in rows(batch, seq))
  seg = jnp.zeros_like(ids)
  params = model.init(jax.random.PRNGKey(0), ids[:1], mask[:1], seg[:1])["params"]
  tx = optax.adamw(1e-4)
  opt = tx.init(params)

  def embed(p, x, rng):   # x: (ids, mask, seg) [b, 2, seq] -> [b, 2, H]
    return model.apply({"params": p}, *x, deterministic=False, rngs={"dropout": rng})

  def loss_of(e):
    return contrastive.info_nce(e[:, 0], e[:, 1:], 20.0)

  @jax.jit
  def step(p, o, rng):
    if chunks > 1:
      loss, g = contrastive.grad_cache(embed, p, (ids, mask, seg), loss_of, chunks, rng)
    else:
      loss, g = jax.value_and_grad(lambda q: loss_of(embed(q, (ids, mask, seg), rng)))(p)
    u, o = tx.update(g, o, p)
    return optax.apply_updates(p, u), o, loss

  params, opt, loss = step(params, opt, jax.random.PRNGKey(1))   # compile + warm-up
  loss.block_until_ready()
  before, t0 = peak_mb(), time.perf_counter()
  for i in range(steps):
    params, opt, loss = step(params, opt, jax.random.PRNGKey(2 + i))
  loss.block_until_ready()
  return (time.perf_counter() - t0) / steps, before, float(loss)


def run_st(batch, seq, steps, cached):
  import tempfile  # pylint: disable=g-import-not-at-top
  import torch  # pylint: disable=g-import-not-at-top
  import transformers  # pylint: disable=g-import-not-at-top
  # pylint: disable=g-import-not-at-top
  from sentence_transformers import SentenceTransformer, losses
  from sentence_transformers.sentence_transformer import modules
  # pylint: enable=g-import-not-at-top
  torch.manual_seed(0)
  config = transformers.BertConfig(
      vocab_size=SHAPE["vocab_size"], hidden_size=SHAPE["hidden_size"],
      num_hidden_layers=SHAPE["num_layers"], num_attention_heads=SHAPE["num_heads"],
      intermediate_size=SHAPE["intermediate_size"], max_position_embeddings=max(seq, 64))
  with tempfile.TemporaryDirectory() as d:
    transformers.BertModel(config).save_pretrained(d)
    with open(f"{d}/vocab.txt", "w", encoding="utf-8") as f:   # a tokenizer the folder needs
      f.write("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                        + [f"w{i}" for i in range(SHAPE["vocab_size"] - 5)]))
    transformers.BertTokenizerFast(f"{d}/vocab.txt").save_pretrained(d)
    body = modules.Transformer(d, max_seq_length=seq)
  model = SentenceTransformer(modules=[body, modules.Pooling(SHAPE["hidden_size"], "mean")])
  model.train()
  loss_fn = (losses.CachedMultipleNegativesRankingLoss(model, mini_batch_size=batch // 4)
             if cached else losses.MultipleNegativesRankingLoss(model))
  opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
  ids, mask = rows(batch, seq)
  features = [{"input_ids": torch.as_tensor(ids[:, j], dtype=torch.long),
               "attention_mask": torch.as_tensor(mask[:, j], dtype=torch.long),
               "token_type_ids": torch.zeros(batch, seq, dtype=torch.long)} for j in (0, 1)]

  def step():
    opt.zero_grad()
    loss = loss_fn([dict(f) for f in features], None)
    loss.backward()
    opt.step()
    return float(loss.detach())

  step()   # warm-up
  before, t0 = peak_mb(), time.perf_counter()
  for _ in range(steps):
    loss = step()
  return (time.perf_counter() - t0) / steps, before, loss


def one(variant, batch, seq, steps):
  if variant.startswith("ours"):
    sec, before, loss = run_ours(batch, seq, steps, 4 if variant == "ours_gradcache" else 1)
  else:
    sec, before, loss = run_st(batch, seq, steps, variant == "st_cached_mnrl")
  del before   # (the warm-up step has already reached the peak)
  return dict(variant=variant, seconds_per_step=sec, peak_mb=peak_mb(), loss=loss,
              cpu_count=os.cpu_count(),
              load_average=os.getloadavg()[0])


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--batch", type=int, default=64)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--steps", type=int, default=5)
  p.add_argument("--variant", choices=VARIANTS)
  args = p.parse_args()
  if args.batch % 4:
    sys.exit(f"error: --batch={args.batch}: must divide by 4 (the GradCache chunks); use 64.")
  if args.variant:
    print("RESULT " + json.dumps(one(args.variant, args.batch, args.seq, args.steps)), flush=True)
    return
  results = []
  for v in VARIANTS:
    out = subprocess.run([sys.executable, "-m", "benchmarks.embedding_peer", f"--variant={v}",
                          f"--batch={args.batch}", f"--seq={args.seq}", f"--steps={args.steps}"],
                         capture_output=True, text=True, check=False,
                         env=dict(os.environ, JAX_PLATFORMS="cpu"))
    lines = [l for l in out.stdout.splitlines() if l.startswith("RESULT ")]
    if out.returncode or not lines:
      sys.exit(f"error: variant {v} failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    results.append(json.loads(lines[0][7:]))
  ours = results[0]["seconds_per_step"]
  print(f"batch {args.batch} pairs x seq {args.seq}, BERT-tiny shape, {args.steps} steps each "
        f"(load average {results[-1]['load_average']:.1f} on {results[-1]['cpu_count']} CPUs: "
        "on a loaded box torch's OpenMP threads wait on each other, so compare on an idle one):")
  for r in results:
    ratio = r["seconds_per_step"] / ours
    print(f"  {r['variant']:<15} {r['seconds_per_step']:.3f} s/step ({ratio:.2f}x ours)  peak RSS "
          f"{r['peak_mb']:.0f} MB (the whole process)")


if __name__ == "__main__":
  main()
