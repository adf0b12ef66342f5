"""Batch-size warmup: the global batch ramps over the first tokens (ModernBERT's recipe).

Warner et al. 2024 (arXiv 2412.13663, section 2.2.2 and Table 3) warm the batch up from 768 to
4,608 rows over the first 50B tokens (base; large: 448 -> 4,928 over 10B) "with an uneven token
schedule so each batch size has the same number of update steps". Their code
(AnswerDotAI/ModernBERT src/sequence_packer.py BatchSizeWarmupScheduler) grows the batch one
micro-batch unit at a time: base 768 = 8 GPUs x 96 rows, so the sizes are 768, 1,536, ..., 4,608
(K = 6 units); the batch of K - 1 units or fewer is used while the tokens seen are below
W x j (j + 1) / (K (K - 1)) for j units, so each of the K - 1 smaller sizes runs W / (u K (K-1)/2)
steps (u = tokens of one unit). Base at 1,024 tokens a row: u = 786,432, 4,239 steps per size,
21,195 steps (50.0B tokens) before the full batch.

Here the unit is the stream's batch: the input stream yields global batches of `unit` rows
(batch_size_warmup_min_size), and optimizer step s takes k(s) of them (1 <= k <= K), so:
  * the stream is the same whatever the host count (pretrain_input's logical shards over `unit`
    rows), and the input position after step s is position(s) = k(1) + ... + k(s) stream batches,
    recorded in the checkpoint: a resume at any step reads the same next rows on any host count;
  * one compiled train step per distinct k (K of them: 6 for base, 11 for large), each through the
    one accumulation scan (trainer_lib.train_step): grad_accum_steps=1 runs the k x unit rows in
    one pass, a multiple of K (g) runs g / K micro-batches per unit;
  * the learning-rate schedule, logs and checkpoints stay in optimizer steps.
Tokens are counted as rows x seq_length (slots, fixed before any data is read); ModernBERT counts
the real (non-padding) tokens of its packed rows, ~99% of the slots here when packing.
Off (batch_size_warmup_min_size=0): unit = batch_size, K = 1, position(s) = s, as before.
"""

import itertools
import math
from typing import NamedTuple

import jax
import numpy as np

from bert_jax.parallel import distributed
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.training import trainer_lib

ConfigError = trainer_lib.ConfigError


class Ramp(NamedTuple):
  unit: int            # rows of one stream batch = the first step's global batch (768)
  sizes: int           # K: the full batch is K units (4,608 = 6 x 768); 1 = no warmup
  tokens: int          # W: the warmup's length in tokens (50e9)
  seq_length: int      # tokens per row (a unit of 768 rows x 1,024 = 786,432 tokens)
  accum: int           # config.grad_accum_steps: micro-batches of the full K-unit step
  first_steps: tuple   # first_steps[j - 1]: the first optimizer step of j units (j = 1..K)

  @property
  def on(self):
    return self.sizes > 1

  def units(self, step):
    """k(step): stream batches in optimizer step `step` (1-based)."""
    return next(j for j in range(self.sizes, 0, -1) if step >= self.first_steps[j - 1])

  def rows(self, step):
    return self.units(step) * self.unit

  def position(self, step):
    """Stream batches consumed by steps 1..step: the input position after `step`."""
    done = 0
    for j in range(1, self.sizes + 1):
      lo = self.first_steps[j - 1]
      hi = self.first_steps[j] - 1 if j < self.sizes else step
      done += j * max(0, min(hi, step) - lo + 1)
    return done

  def rows_through(self, step):
    """Rows trained on by steps 1..step (the tokens, the FLOPs and the ETA follow from it)."""
    return self.position(step) * self.unit

  def passes(self, k):
    """Micro-batches the scan runs for a step of k units: the configured split at k = K."""
    return 1 if self.accum == 1 else k * self.accum // self.sizes

  def record(self):
    """What a checkpoint keeps (None when off: checkpoints without one resume as before)."""
    if not self.on:
      return None
    return dict(min_size=self.unit, batch_size=self.unit * self.sizes, tokens=self.tokens,
                seq_length=self.seq_length)

  def startup_line(self):
    last = self.first_steps[-1] - 1
    return (f"batch-size warmup: {self.unit:,} -> {self.unit * self.sizes:,} rows, +{self.unit:,} "
            f"every ~{self.first_steps[1] - 1:,} steps ({self.sizes} sizes, one compiled step "
            f"each) over steps 1-{last:,}: "
            f"{_tokens(self.rows_through(last) * self.seq_length)} tokens at seq "
            f"{self.seq_length} (--config.batch_size_warmup_tokens={_tokens(self.tokens)})")


def _tokens(n):
  return f"{n / 1e9:.4g}B" if n >= 1e9 else f"{n / 1e6:.4g}M" if n >= 1e6 else f"{int(n):,}"


def plan_steps(sizes, tokens, unit_tokens):
  """first_steps of the ramp: size j (1 <= j < K) runs while the tokens seen before the step are
  below W j (j + 1) / (K (K - 1)) (BatchSizeWarmupScheduler's thresholds, exact integers)."""
  first, seen, step, denom = [1], 0, 0, sizes * (sizes - 1)
  for j in range(1, sizes):
    gap = tokens * j * (j + 1) - seen * denom        # threshold minus seen, x denom
    n = max(0, -(-gap // (j * unit_tokens * denom)))  # ceil: steps at j units
    step, seen = step + n, seen + n * j * unit_tokens
    first.append(step + 1)
  return tuple(first)


def from_config(config, mesh=None):
  """The config's Ramp, checked (one ConfigError line before any compute); off when
  batch_size_warmup_min_size is 0 or the batch itself."""
  unit = int(config.get("batch_size_warmup_min_size", 0) or 0)
  tokens = int(config.get("batch_size_warmup_tokens", 0) or 0)
  batch, accum = int(config.batch_size), int(config.grad_accum_steps)
  off = Ramp(batch, 1, 0, int(config.seq_length), accum, (1,))
  if unit < 0 or tokens < 0:
    raise ConfigError(f"config.batch_size_warmup_min_size={unit}, batch_size_warmup_tokens="
                      f"{tokens}: expected >= 0 (0 = no batch-size warmup).")
  if not unit or unit == batch:
    return off
  if not tokens:
    raise ConfigError(f"config.batch_size_warmup_min_size={unit} with batch_size_warmup_tokens=0:"
                      " set the tokens the batch ramps over (ModernBERT-base: 50e9), or "
                      "batch_size_warmup_min_size=0 for no warmup.")
  if batch % unit:
    raise ConfigError(f"config.batch_size={batch} is not a multiple of "
                      f"config.batch_size_warmup_min_size={unit}: the batch grows by that many "
                      f"rows a size (ModernBERT-base: 768 -> 4,608 = 6 x 768); use a divisor of "
                      f"{batch} or a batch_size multiple of {unit}.")
  sizes = batch // unit
  if accum > 1 and accum % sizes:
    raise ConfigError(f"config.grad_accum_steps={accum} with a batch-size warmup of {sizes} sizes "
                      f"({unit} -> {batch} rows): a micro-batch of {batch // accum} rows does "
                      f"not divide the {unit}-row steps; use grad_accum_steps=1 or a multiple of "
                      f"{sizes}.")
  if mesh is not None:
    dp, hosts = sharding_lib.data_parallel_size(mesh), sharding_lib.num_hosts(mesh)
    per_pass = unit // max(1, accum // sizes)   # rows of one pass of the smallest step
    if per_pass % dp or unit % hosts:
      raise ConfigError(f"config.batch_size_warmup_min_size={unit}: its steps' micro-batches of "
                        f"{per_pass} rows do not split over the data-parallel size {dp} (mesh "
                        f"{dict(mesh.shape)}) and the {hosts} host(s); use a multiple of "
                        f"{math.lcm(dp, hosts) * max(1, accum // sizes)}.")
  seq = int(config.seq_length)
  return Ramp(unit, sizes, tokens, seq, accum, plan_steps(sizes, tokens, unit * seq))


def check_resume(stored, ramp, workdir):
  """A resume continues the checkpoint's ramp: another one would read the stream in other
  steps (another input position for the same step). No record: a run without one."""
  now = ramp.record()
  if (stored or None) != now:
    raise ConfigError(f"--workdir={workdir} was trained with batch-size warmup {stored} but this "
                      f"run has {now}; resume with the checkpoint's --config.batch_size_warmup_"
                      "min_size/_tokens (and batch_size, seq_length), or use a new --workdir.")


def take(batches, k):
  """The host-local batch of a k-unit step: the next k stream batches, rows concatenated."""
  parts = list(itertools.islice(batches, k))
  if k == 1:
    return parts[0]
  return {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}


def stream_order(batch, hosts, k):
  """[hosts x k x n rows] -> [k x hosts x n]: the global rows as on one host.

  make_global_batch lays host p's rows at [p k n, (p + 1) k n): its n rows of each of the k
  stream batches, one after another. One host has stream batch after stream batch; this swaps
  the two leading axes so every host count sees the same global batch, row for row (dropout's
  masks and the accumulation's strided micro-batches follow the row index)."""
  def swap(x):
    return x.reshape(hosts, k, -1, *x.shape[1:]).swapaxes(0, 1).reshape(x.shape)
  return jax.tree.map(swap, batch)


class GlobalBatches:
  """Step s's global batch: take(k) on this host, sharded, put into stream order when several
  hosts hold it (a jitted permutation per k, compiled on first use)."""

  def __init__(self, mesh):
    self._mesh, self._hosts, self._order = mesh, sharding_lib.num_hosts(mesh), {}

  def __call__(self, batches, k):
    batch = sharding_lib.make_global_batch(take(batches, k), self._mesh)
    if self._hosts == 1 or k == 1:
      return batch
    if k not in self._order:
      spec = sharding_lib.batch_sharding(self._mesh)
      self._order[k] = distributed.TogetherOnFirstCall(
          jax.jit(lambda b, k=k: stream_order(b, self._hosts, k), in_shardings=(spec,),
                  out_shardings=spec), f"batch order of {k} units")
    return self._order[k](batch)
