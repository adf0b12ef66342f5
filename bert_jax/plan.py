r"""Plan before you pay: compile the real pre-training step for a TPU slice on this host.

  python -m bert_jax.plan --config=bert_jax/configs/pretrain.py:base --topology=v5litepod-16 \
      --config.model.dtype=bfloat16 [--search] [--price_per_chip_hour=1.20] [--json=plan.json]

Takes the config and every --config.* flag of `bert_jax.train`, plus the slice. Builds the step
with train.build_training (the very function `train` runs), lowers it for the slice's devices
(jax.experimental.topologies: compile-only TPU devices, no TPU needed; libtpu must be installed:
`pip install "jax[tpu]==0.10.2"`, which requirements-test.txt pins) and compiles it with the TPU
compiler, as MaxText's train_compile.py does. Then it prints, per chip: parameters, optimizer
state, batch, activations/temporaries and code against the HBM the compiler says a program may
use, FITS or DOES NOT FIT with the margin; compiled FLOPs against the analytic count; the
collectives; a step-time ESTIMATE (from the compiler's cost model, and a roofline bound); tokens/s,
MFU, time, chip-hours and cost to config.num_train_steps. An out-of-memory config fails here with
the compiler error the slice would give.

--search looks for the cheapest settings that fit the configured global batch (data parallel,
then FSDP, then remat, then gradient accumulation) and prints the flags to paste into `train`.

Exit code: 0 fits, 1 does not fit (the verdict line says why), 2 a usage error, 3 no verdict (the
TPU compiler itself crashed; libtpu 0.0.42.1 segfaulted on some remat programs here).
"""

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import platform as platform_lib
import re
import time

from absl import flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax import tpu_specs

GiB = 1024 ** 3


class PlanError(errors.UserError):
  """A plan that cannot be made: libtpu missing, a bad --topology or config."""


# ----------------------------------------------------------------------------------------------
# The slice's compile-only devices.
# ----------------------------------------------------------------------------------------------
def require_libtpu():
  """libtpu's version; a one-line error naming the install command when it is missing."""
  if importlib.util.find_spec("libtpu") is None:
    raise PlanError("bert_jax.plan compiles with the TPU compiler, which is not installed: "
                    "pip install \"jax[tpu]==0.10.2\" (or pip install -r requirements-test.txt); "
                    "training on CPU/GPU does not need it.")
  return importlib.metadata.version("libtpu")


# What libtpu reads when it loads, only while it loads (os.environ is restored after: a leaked
# TPU_WORKER_HOSTNAMES makes bert_jax.distributed, and so every later run in this process tree,
# take the host for a Cloud TPU pod). Without the first two libtpu looks for a Cloud TPU VM's
# metadata and prints errors about worker hostnames on this host; ALLOW_MULTIPLE_LIBTPU_LOAD:
# libtpu takes /tmp/libtpu_lockfile so that one process owns the chips, and compiling uses none,
# so two plans (or a plan beside a test or a TPU run) must not lock each other out.
def topology_devices(spec: tpu_specs.SliceSpec):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  env = dict(TPU_ACCELERATOR_TYPE=spec.cloud_name, TPU_WORKER_HOSTNAMES="localhost",
             ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update({k: v for k, v in env.items() if saved[k] is None})
  try:
    return topologies.get_topology_desc(platform="tpu", **spec.topology_kwargs()).devices
  finally:
    for k, v in saved.items():
      if v is None:
        os.environ.pop(k, None)


_HBM_RE = re.compile(r"exceeds available HBM \(([\d.]+)([GM])\)")


@contextlib.contextmanager
def without_persistent_cache():
  """A compile for the slice's compile-only devices, not through JAX's persistent compilation
  cache (a user's JAX_COMPILATION_CACHE_DIR): such a TPU program cannot be loaded back without
  chips ("PjRtCompiler must be constructed with a Client"), so a second plan warned "Error
  reading persistent compilation cache entry for 'jit_train_step'" on stderr (issue 32).

  Turning jax_enable_compilation_cache off is not enough alone: JAX decides once per process, at
  its first compile, whether it uses the cache (jax 0.10.2 compilation_cache.is_cache_used), and
  train.build_training's eager dummy batch (DistilBERT's teacher) had already compiled on the CPU
  with it on. reset_cache (the public jax.experimental.compilation_cache API) makes JAX decide
  again, with the cache off, and again on the way out, with the user's setting."""
  import jax  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  was = jax.config.jax_enable_compilation_cache
  jax.config.update("jax_enable_compilation_cache", False)
  compilation_cache.reset_cache()
  try:
    yield
  finally:
    jax.config.update("jax_enable_compilation_cache", was)
    compilation_cache.reset_cache()


def available_hbm(device):
  """Bytes of HBM the TPU compiler lets one program use on `device`'s chip (its own figure).

  Read from the compiler's out-of-memory message for a program that cannot fit (128 GiB of
  temporaries): e.g. 15.75G on v5e, 30.75G on v4, 95.74G on v5p, 31.25G on v6e (libtpu 0.0.42.1).
  """
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top
  one = NamedSharding(Mesh(np.array([device]), ("x",)), P())
  try:
    with without_persistent_cache():
      jax.jit(lambda: jnp.zeros((2 ** 37,), jnp.int8), out_shardings=one).lower().compile()
  except jax.errors.JaxRuntimeError as e:
    m = _HBM_RE.search(str(e))
    if m:
      return float(m.group(1)) * (GiB if m.group(2) == "G" else 1024 ** 2)
  return None


# ----------------------------------------------------------------------------------------------
# Compiling one configuration.
# ----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Compiled:
  """What one compile of the train step tells, per chip (bytes, FLOPs, seconds)."""
  fits: bool
  compile_seconds: float
  error: str = ""              # the compiler's out-of-memory message when it refused
  params: int = 0
  optimizer: int = 0
  batch: int = 0
  frozen: int = 0              # DistilBERT's teacher: parameters in the step, never trained
  temporaries: int = 0
  code: int = 0
  total: int = 0
  flops: float = 0.0           # compiled, per chip
  bytes_accessed: float = 0.0  # compiled, per chip
  compiler_seconds: float = 0.0  # libtpu's cost-model step time, corrected (see `estimate`)
  compiler_raw_seconds: float = 0.0  # ... as cost_analysis()["optimal_seconds"] gives it
  concat_bitcasts: int = 0     # ConcatBitcast custom calls in the program (the correction)
  collectives: dict = dataclasses.field(default_factory=dict)   # op -> [count, bytes]
  attention: str = ""
  num_params: int = 0          # the model's, whole
  crashed: bool = False        # the compiler process died (no verdict on memory)


def _num_params(tree):
  import jax  # pylint: disable=g-import-not-at-top
  return sum(math.prod(p.shape) for p in jax.tree.leaves(tree))


def _per_device_bytes(tree):
  """Bytes one device holds of a tree of sharded ShapeDtypeStructs (its largest shard)."""
  import jax  # pylint: disable=g-import-not-at-top
  total = 0
  for leaf in jax.tree.leaves(tree):
    shape = leaf.sharding.shard_shape(leaf.shape)
    total += math.prod(shape) * leaf.dtype.itemsize
  return total


_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
                "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_COLLECTIVE_RE = re.compile(
    r"=\s*(\(?[^=]*?\)?)\s+(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
    r"(-start)?\(")


def collectives(hlo_text):
  """{op: [count, bytes]} of the cross-chip collectives in a compiled module's HLO text (the
  result shapes' bytes; an async op counted once, at its -start)."""
  found = {}
  for line in hlo_text.splitlines():
    m = _COLLECTIVE_RE.search(re.sub(r"/\*.*?\*/", "", line))   # tuples carry /*index=5*/
    if not m:
      continue
    size = sum(_DTYPE_BYTES.get(dt, 4) * math.prod(int(d) for d in dims.split(",") if d)
               for dt, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", m.group(1)))
    entry = found.setdefault(m.group(2), [0, 0])
    entry[0] += 1
    entry[1] += size
  return found


def compile_step(config, model_config, devices):
  """Lowers and compiles train.build_training's step for `devices`; a Compiled. DistilBERT's
  step runs with its frozen teacher as train's does, from the teacher's shapes
  (its family's planning_teacher: nothing is read)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import attention as attention_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax import input_source  # pylint: disable=g-import-not-at-top
  from bert_jax import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax import trainer_lib  # pylint: disable=g-import-not-at-top

  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size,
                                 grad_accum_steps=int(config.grad_accum_steps), devices=devices)
  attention = attention_lib.startup_line(model_config, packed=bool(config.pack),
                                         seq_len=config.seq_length,
                                         platform_name=devices[0].platform)
  t = train.build_training(config, model_config, mesh,
                           teacher=families.get(model_config.family).planning_teacher(
                               config, model_config))
  shard = sharding_lib.batch_sharding(mesh)
  batch = {k: jax.ShapeDtypeStruct(shape, dtype, sharding=shard)
           for k, (shape, dtype) in input_source.batch_spec(config, layout_of(config)).items()}
  start = time.perf_counter()
  with trainer_lib.mesh_rules(mesh):
    lowered = t.train_step.lower(t.abstract_state, batch)
  try:
    with without_persistent_cache():
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    return Compiled(False, time.perf_counter() - start,
                    error=" ".join(str(e).split()).rstrip("."), attention=attention,
                    num_params=_num_params(t.abstract_state["params"]))
  seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  hlo = compiled.as_text()
  state = t.abstract_state
  total = (mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
           + mem.temp_size_in_bytes + mem.generated_code_size_in_bytes)
  # libtpu 0.0.42.1's cost model counts each ConcatBitcast custom call as -1 s (tiny: -1.9988 s
  # with 2 of them; BERT-base: -491.9 s); adding them back gives its real estimate.
  concat_bitcasts = hlo.count('custom_call_target="ConcatBitcast"')
  return Compiled(
      True, seconds, num_params=_num_params(state["params"]),
      params=_per_device_bytes(state["params"]),
      optimizer=_per_device_bytes(state["opt_state"]), batch=_per_device_bytes(batch),
      frozen=_per_device_bytes(t.frozen) if t.frozen is not None else 0,
      temporaries=mem.temp_size_in_bytes, code=mem.generated_code_size_in_bytes, total=total,
      flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      compiler_seconds=float(cost.get("optimal_seconds", 0.0)) + concat_bitcasts,
      compiler_raw_seconds=float(cost.get("optimal_seconds", 0.0)), concat_bitcasts=concat_bitcasts,
      collectives=collectives(hlo), attention=attention)


def _compile_worker(conn, topology):
  """A child process that compiles configs it receives (dicts) for `topology` until told to stop
  (None), answering each with Compiled as a dict. See IsolatedCompiler."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  devices = topology_devices(tpu_specs.parse_topology(topology))
  while (config_dict := conn.recv()) is not None:
    config = ml_collections.ConfigDict(config_dict)
    try:
      make_model_config, _ = model_config_factory(config)
      conn.send(dataclasses.asdict(compile_step(config, make_model_config(config), devices)))
    except errors.UserError as e:   # the parent checks first (plan); any it missed is one line
      conn.send({"user_error": str(e)})
    except Exception:  # pylint: disable=broad-except  a bug: its traceback, in the parent
      conn.send({"bug": traceback.format_exc()})


class IsolatedCompiler:
  """compile_step in a child process, for the search's many candidates.

  libtpu 0.0.42.1's compiler has crashed (segfault) on some programs (seen: BERT-tiny with FSDP +
  remat on v5e:2x2, twice; BERT-large phase 2 with remat on v6e-16), and one candidate must not
  take a search (or a plan) down: a crash
  comes back as a Compiled that does not fit, and the next compile starts a new child. One child
  serves many compiles (JAX and the model code are imported once).
  """

  def __init__(self, topology):
    import multiprocessing  # pylint: disable=g-import-not-at-top
    self._ctx, self._topology, self._child = multiprocessing.get_context("spawn"), topology, None

  def __call__(self, config):
    start = time.perf_counter()
    if self._child is None:
      self._conn, child_end = self._ctx.Pipe()
      self._child = self._ctx.Process(target=_compile_worker, args=(child_end, self._topology),
                                      daemon=True)
      self._child.start()
      child_end.close()
    try:
      self._conn.send(config.to_dict())
      answer = self._conn.recv()
    except (EOFError, BrokenPipeError):   # the child died: the compiler crashed
      self._child.join()
      code, self._child = self._child.exitcode, None
      return Compiled(False, time.perf_counter() - start, crashed=True,
                      error=f"the TPU compiler crashed (exit code {code})")
    # Not a crash: the config (a one-line error) or our code (its traceback, not NO VERDICT).
    if "user_error" in answer:
      raise PlanError(answer["user_error"])
    if "bug" in answer:
      raise RuntimeError(f"the compile process raised:\n{answer['bug']}")
    return Compiled(**answer)

  def close(self):
    if self._child is not None:
      self._conn.send(None)
      self._child.join()
      self._child = None


def layout_of(config):
  """The stream layout train would store, as far as the step's shapes depend on it."""
  return dict(pack=bool(config.pack), max_instances_per_pack=int(config.max_instances_per_pack))


# ----------------------------------------------------------------------------------------------
# From a compile to a prediction.
# ----------------------------------------------------------------------------------------------
def estimate(c: Compiled, gen: tpu_specs.Generation):
  """(step seconds, how it was derived): an ESTIMATE, not a measurement.

  libtpu's cost model where it gives a time (never below the compute floor, the step at 100% of
  the chip's bf16 peak); else a roofline from the compiled FLOPs and bytes accessed (which counts
  every operand read, so it leans slow).
  """
  floor = c.flops / (gen.peak_bf16_tflops * 1e12)
  if c.compiler_seconds > 0:
    return max(c.compiler_seconds, floor), (
        f"libtpu's cost model (cost_analysis optimal_seconds, +1 s per ConcatBitcast call); "
        f"compute floor at peak {floor:.4f} s")
  roofline = max(floor, c.bytes_accessed / (gen.hbm_gb_per_s * 1e9))
  return roofline, ("a roofline: max(compiled FLOPs / bf16 peak, bytes accessed / HBM "
                    "bandwidth); the compiler gave no step time")


def predict(config, model_config, spec, c: Compiled, price, teacher=None):
  """The numbers a user pays by: tokens/s, MFU, hours, chip-hours and cost."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  gen = spec.generation
  step_s, how = estimate(c, gen)
  analytic = train.step_flops(config, model_config, layout_of(config), teacher) / spec.chips
  steps = int(config.num_train_steps)
  hours = steps * step_s / 3600
  return dict(step_seconds=step_s, step_time_source=how, analytic_flops_per_chip=analytic,
              flops_ratio=c.flops / analytic if analytic else None,
              tokens_per_second=config.batch_size * config.seq_length / step_s,
              mfu=analytic / (step_s * gen.peak_bf16_tflops * 1e12), train_steps=steps,
              hours=hours, chip_hours=hours * spec.chips, price_per_chip_hour=price,
              cost_usd=hours * spec.chips * price)


def _gib(n):
  return f"{n / GiB:.2f} GiB"


def report_lines(config, model_config, spec, c: Compiled, hbm, pred, hbm_source):
  """The plan, as the lines `main` prints (the verdict last)."""
  gen = spec.generation
  lines = [f"memory per chip: params {_gib(c.params)} | optimizer {_gib(c.optimizer)} | "
           + (f"teacher (frozen) {_gib(c.frozen)} | " if c.frozen else "") + "batch "
           f"{_gib(c.batch)} | activations/temporaries {_gib(c.temporaries)} | code "
           f"{_gib(c.code)} | total {_gib(c.total)} of {_gib(hbm)} {hbm_source} "
           f"({gen.hbm_gib} GiB HBM)",
           f"FLOPs per chip per step: compiled {c.flops:.3e}, analytic "
           f"{pred['analytic_flops_per_chip']:.3e} ({pred['flops_ratio']:.3f}x"
           + (", remat recomputes the forward" if model_config.remat else "") + ")",
           "collectives per step: " + (", ".join(
               f"{op} x{n} ({b / 1e9:.3g} GB)" for op, (n, b) in sorted(c.collectives.items()))
               or "none"),
           f"step time {pred['step_seconds']:.4f} s: an ESTIMATE, not a measurement, from "
           f"{pred['step_time_source']}",
           f"predicted: {pred['tokens_per_second']:,.0f} tokens/s (row slots), MFU "
           f"{pred['mfu']:.1%} of {gen.peak_bf16_tflops:g} TFLOP/s bf16 per chip; "
           f"{pred['train_steps']:,} steps in {pred['hours']:,.1f} h = "
           f"{pred['chip_hours']:,.0f} chip-hours = ${pred['cost_usd']:,.0f} at "
           f"${pred['price_per_chip_hour']:.2f}/chip-hour"]
  margin = hbm - c.total
  lines.append(f"verdict: FITS on {spec.cloud_name} with {_gib(margin)} ({margin / hbm:.0%}) of "
               "HBM to spare per chip")
  return lines


# ----------------------------------------------------------------------------------------------
# Search: the cheapest settings that fit the configured global batch.
# ----------------------------------------------------------------------------------------------
# Cheapest first: plain data parallelism; FSDP shards parameters and Adam state (ZeRO-3: an
# all-gather per layer, cheap next to BERT's matmuls); remat recomputes each layer's forward in
# the backward pass (~ +33% FLOPs); gradient accumulation last (same FLOPs, smaller matmuls).
SETTINGS = (("data parallel", (-1, 1, 1), False), ("fsdp", (1, -1, 1), False),
            ("data parallel + remat", (-1, 1, 1), True), ("fsdp + remat", (1, -1, 1), True))


def _with(config, *, mesh_shape, remat, per_chip, chips, accum=1):
  c = config.copy_and_resolve_references()   # the same (locked) fields, new values
  c.mesh_shape, c.grad_accum_steps = tuple(mesh_shape), int(accum)
  c.batch_size = int(per_chip * chips * accum)
  c.model.remat = bool(remat)
  return c


def largest_batch(config, compile_fn, chips, hbm, *, mesh_shape, remat, need, log):
  """(largest power-of-two per-chip micro-batch up to `need` that compiles within `hbm` or 0,
  the per-chip batch at which memory would reach `hbm`).

  Memory grows about linearly with the batch (activations) over a fixed part (parameters,
  optimizer state, code): two small compiles give the line; the batch it predicts (at most
  `need`: larger ones take longer to compile and are not asked for) is then compiled to confirm
  it, halving while it does not fit, doubling while twice it still does.
  """
  seen = {}   # batch -> (fits, result): the doubling loop asks again for a batch the line
  # overshot to (fsdp on tiny v5e: 16 compiled twice, 13 s each; the second time libtpu crashed)

  def fits(b):
    if b not in seen:
      c = _with(config, mesh_shape=mesh_shape, remat=remat, per_chip=b, chips=chips)
      r = compile_fn(c)
      log(f"  per-chip batch {b}: " + (f"{_gib(r.total)}" if r.fits else r.error[:120] or
                                       "out of memory") + f" ({r.compile_seconds:.0f} s to compile)")
      seen[b] = (r.fits and r.total <= hbm, r)
    return seen[b]

  ok1, one = fits(1)
  if not ok1:
    return 0, 0
  if need == 1:
    return 1, 1
  ok2, two = fits(2)
  if not ok2:
    return 1, 1
  slope = max(two.total - one.total, 1)
  predicted = int(2 + (hbm - two.total) // slope)
  b = 2 ** int(math.log2(max(2, min(predicted, need))))
  while b > 2 and not fits(b)[0]:          # the line overshot: halve until it compiles
    b //= 2
  while b < need and fits(2 * b)[0]:       # it undershot (memory is not quite linear): double
    b *= 2
  return b, predicted


def search(config, topology, hbm, log=print):
  """(settings dict or None, {setting: (largest verified per-chip batch, predicted largest)}):
  the first of SETTINGS that holds the configured per-chip batch; otherwise the setting with the
  largest micro-batch and the fewest accumulation steps that reach the configured batch."""
  chips = tpu_specs.parse_topology(topology).chips
  need = config.batch_size // chips
  largest = {}
  settings = [s for s in SETTINGS if chips > 1 or s[1] == (-1, 1, 1)]  # 1 chip: fsdp = data
  compile_fn = IsolatedCompiler(topology)
  try:
    for label, mesh_shape, remat in settings:
      log(f"search: {label}")
      largest[label] = largest_batch(config, compile_fn, chips, hbm, mesh_shape=mesh_shape,
                                     remat=remat, need=need, log=log)
      if largest[label][0] >= need:
        return dict(label=label, mesh_shape=mesh_shape, remat=remat, accum=1,
                    per_chip=need), largest
  finally:
    compile_fn.close()
  label, mesh_shape, remat = max(settings, key=lambda s: largest[s[0]][0])
  top = largest[label][0]
  if top == 0:
    return None, largest
  accum = next(k for k in range(1, need + 1) if need % k == 0 and need // k <= top)
  return dict(label=label, mesh_shape=mesh_shape, remat=remat, accum=accum,
              per_chip=need // accum), largest


def train_flags(config, found):
  mesh = "(" + ",".join(str(s) for s in found["mesh_shape"]) + ")"
  return (f"--config.batch_size={config.batch_size} --config.mesh_shape='{mesh}' "
          f"--config.model.remat={str(found['remat']).lower()} "
          f"--config.grad_accum_steps={found['accum']}")


# ----------------------------------------------------------------------------------------------
# The program.
# ----------------------------------------------------------------------------------------------
def model_config_factory(config):
  """config -> BertConfig, as train makes it (the vocab file's size; BERT's 30,522 without one)."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  if config.vocab_file or config.spm_model_file:
    vocab = train.load_vocab(config)
  else:
    vocab = train.input_source_vocab(config.model.vocab_size or 30522)

  def make(c):
    return train.create_model_config(c, vocab)
  return make, vocab


def plan(config, topology, *, search_settings=False, price=None, hbm_gib=None, log=print,
         isolate=True):
  """The whole plan as a dict (what --json writes); `log` gets the report's lines.

  train's checks first, then the slice's HBM, the header lines, --search's settings, the one
  compile of the step, and the verdict from it."""
  spec = tpu_specs.parse_topology(topology)     # the cheap checks first
  libtpu = require_libtpu()
  make_model_config, vocab, teacher, devices = _check_as_train(config, spec, search_settings)
  model_config = make_model_config(config)
  gen = spec.generation
  price = gen.price_per_chip_hour if price is None else float(price)
  hbm, hbm_source = _hbm_per_chip(devices[0], gen, hbm_gib)
  _log_header(log, config, model_config, vocab, spec, libtpu, teacher)
  result = dict(topology=spec.cloud_name, jax_topology=spec.jax_topology, chips=spec.chips,
                hosts=spec.hosts, device_kind=gen.device_kind, libtpu=libtpu,
                hbm_available_bytes=hbm, hbm_nominal_gib=gen.hbm_gib,
                config=dict(model_name=config.model_name, seq_length=config.seq_length,
                            batch_size=config.batch_size, grad_accum_steps=config.grad_accum_steps,
                            mesh_shape=list(config.mesh_shape), remat=bool(model_config.remat),
                            dtype=model_config.dtype, pack=bool(config.pack)))
  if search_settings:
    config = _apply_search(config, topology, spec, hbm, result, log)
    if config is None:
      return _verdict(result, False, f"DOES NOT FIT: not even 1 sequence per chip fits "
                      f"{spec.cloud_name} with remat and FSDP; pick a slice with more chips or "
                      "HBM", log)
    model_config = make_model_config(config)
  if isolate:   # in a child process: a compiler crash becomes a verdict, not a dead process
    compiler = IsolatedCompiler(spec.name)
    try:
      c = compiler(config)
    finally:
      compiler.close()
  else:
    c = compile_step(config, model_config, devices)
  result["compiled"] = dataclasses.asdict(c)
  if c.crashed:
    return _verdict(result, None, f"NO VERDICT for {spec.cloud_name}: {c.error}; the compiler "
                    f"(libtpu {libtpu}) failed, not the config: try another libtpu, mesh_shape "
                    "or remat setting", log)
  log(f"{c.attention}; {c.num_params / 1e6:.1f}M parameters; compiled in "
      f"{c.compile_seconds:.0f} s")
  if not c.fits or c.total > hbm:
    why = c.error or f"needs {_gib(c.total)} per chip, {_gib(hbm)} {hbm_source}"
    return _verdict(result, False, f"DOES NOT FIT on {spec.cloud_name}: {why}; try --search "
                    "(FSDP, remat, gradient accumulation) or a larger slice", log)
  pred = predict(config, model_config, spec, c, price, teacher)
  result.update(fits=True, prediction=pred, price_note=tpu_specs.PRICE_NOTE if price ==
                gen.price_per_chip_hour else "price given by --price_per_chip_hour")
  lines = report_lines(config, model_config, spec, c, hbm, pred, hbm_source)
  result["verdict"] = lines[-1][len("verdict: "):]
  for line in lines:
    log(line)
  if price == gen.price_per_chip_hour:
    log(f"price: {tpu_specs.PRICE_NOTE}")
  return result


def _check_as_train(config, spec, search_settings):
  """train's own checks (no copies), in this process before any compile: a mistake train names
  in one line was a traceback from the compile process and NO VERDICT here (issue 32). Returns
  (config -> BertConfig, the vocab, DistilBERT's teacher as shapes or None, the slice's
  compile-only devices)."""
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax import preflight  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax import trainer_lib  # pylint: disable=g-import-not-at-top
  preflight.check_config_values(config)
  make_model_config, vocab = model_config_factory(config)
  model_config = make_model_config(config)
  train.check_objectives(config, model_config)
  trainer_lib.check_max_length(config.seq_length, "seq_length", model_config)
  teacher = families.get(model_config.family).planning_teacher(config, model_config)
  devices = topology_devices(spec)
  # The mesh and the batch split over the slice's chips (train: trainer_lib.create_mesh on its
  # devices). --search picks mesh, remat and accumulation itself; the global batch it keeps must
  # still split over the chips.
  if search_settings:
    trainer_lib.create_mesh((-1, 1, 1), config.batch_size, devices=devices)
  else:
    trainer_lib.create_mesh(config.mesh_shape, config.batch_size,
                            grad_accum_steps=int(config.grad_accum_steps), devices=devices)
  return make_model_config, vocab, teacher, devices


def _hbm_per_chip(device, gen, hbm_gib):
  """(bytes a program may use on one chip, where the figure comes from): the compiler's own,
  else the generation's nominal HBM; at most --hbm_gib."""
  hbm, source = available_hbm(device), "the compiler allows"
  if hbm is None:
    hbm, source = gen.hbm_gib * GiB, "(nominal; the compiler gave no figure)"
  if hbm_gib is not None:
    hbm, source = min(hbm, hbm_gib * GiB), "allowed by --hbm_gib"
  return hbm, source


def _log_header(log, config, model_config, vocab, spec, libtpu, teacher):
  """The report's first lines: the model and batch, the slice, the teacher, a dtype note."""
  gen = spec.generation
  log(f"plan: {config.model_name} ({model_config.num_layers} layers, hidden "
      f"{model_config.hidden_size}, vocab {vocab.size}), seq {config.seq_length}, global batch "
      f"{config.batch_size} ({config.batch_size // spec.chips} per chip"
      + (f", {config.grad_accum_steps} micro-batches" if config.grad_accum_steps > 1 else "")
      + f"), {model_config.dtype}, remat {model_config.remat}, packed {bool(config.pack)}, mesh "
      f"{tuple(config.mesh_shape)}")
  log(f"slice: {spec.cloud_name} = {spec.chips} x {gen.device_kind} chips on {spec.hosts} "
      f"host(s) (JAX topology {spec.jax_topology}); compiling with libtpu {libtpu} on this "
      f"{platform_lib.machine()} host ({os.cpu_count()} CPUs)")
  if teacher is not None:
    log(f"teacher: {teacher.path}, {teacher.model_config.num_layers} layers of width "
        f"{teacher.model_config.hidden_size}, frozen in the step (its forward is compiled and "
        "its parameters counted)")
  if model_config.dtype == "float32":
    log("note: config.model.dtype=float32 computes in f32; TPUs run BERT in bf16: "
        "--config.model.dtype=bfloat16")


def _apply_search(config, topology, spec, hbm, result, log):
  """--search: the config with the settings it found (result["search"] says what and why), or
  None when not even 1 sequence per chip fits."""
  found, largest = search(config, topology, hbm, log=log)
  result["search"] = dict(largest_per_chip_batch=largest, found=found)
  if found is None:
    return None
  config = _with(config, mesh_shape=found["mesh_shape"], remat=found["remat"],
                 per_chip=found["per_chip"], chips=spec.chips, accum=found["accum"])
  result["search"]["train_flags"] = train_flags(config, found)
  sizes = "; ".join(f"{k} {v[0]} (memory full at ~{v[1]})" for k, v in largest.items())
  log(f"search: {found['label']}, per-chip micro-batch {found['per_chip']} x "
      f"{found['accum']} accumulation step(s); largest per-chip batches that compiled: {sizes}")
  log(f"flags for bert_jax.train: {result['search']['train_flags']}")
  return config


def _verdict(result, fits, verdict, log):
  """result with fits (True, False, None: no verdict) and its verdict line, said."""
  result.update(fits=fits, verdict=verdict)
  log("verdict: " + verdict)
  return result


FLAGS = flags.FLAGS


def define_flags():
  config_flags.DEFINE_config_file("config", None, "The pre-training config, as bert_jax.train's "
                                  "(e.g. bert_jax/configs/pretrain.py:base).", lock_config=True)
  flags.DEFINE_string("topology", None, "The TPU slice: v5p-128, v5litepod-16, v4-32, v6e-64 or "
                      "JAX's form v5e:4x4.")
  flags.DEFINE_bool("search", False, "Find the cheapest mesh/remat/accumulation settings that fit "
                    "the configured global batch, and print the flags for bert_jax.train.")
  flags.DEFINE_float("price_per_chip_hour", None, "USD per chip-hour for the cost line (default: "
                     "the dated on-demand list price in bert_jax/tpu_specs.py).")
  flags.DEFINE_string("json", None, "Also write the plan as JSON to this file.")
  flags.DEFINE_float("hbm_gib", None, "Plan for at most this much HBM per chip (GiB), e.g. to keep "
                     "headroom; default: what the TPU compiler allows a program.")


def main(argv):
  from absl import logging  # pylint: disable=g-import-not-at-top
  # What is said is the report; JAX's INFO lines (without_persistent_cache's "Resetting cache
  # at ...") are not part of it.
  logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise PlanError(f"unexpected arguments {argv[1:]}; pass options as --flag=value.")
  if FLAGS.config is None or not FLAGS.topology:
    raise PlanError("--config and --topology are required, e.g. --config=bert_jax/configs/"
                    "pretrain.py:base --topology=v5litepod-16")
  if FLAGS.price_per_chip_hour is not None and FLAGS.price_per_chip_hour < 0:
    raise PlanError(f"--price_per_chip_hour={FLAGS.price_per_chip_hour}: expected >= 0 (USD).")
  if FLAGS.json:   # the one output check (bert_jax_core.files), before any compile
    files_lib.check_output_file(FLAGS.json, "--json")
  if FLAGS.hbm_gib is not None and FLAGS.hbm_gib <= 0:
    raise PlanError(f"--hbm_gib={FLAGS.hbm_gib}: expected a positive size in GiB.")
  result = plan(FLAGS.config, FLAGS.topology, search_settings=FLAGS.search,
                price=FLAGS.price_per_chip_hour, hbm_gib=FLAGS.hbm_gib,
                log=lambda line: print(line, flush=True))
  if FLAGS.json:
    files_lib.write_atomic(FLAGS.json, json.dumps(result, indent=2, default=str))
    print(f"wrote {FLAGS.json}", flush=True)
  if result["fits"]:
    print(f"next: create the slice (launch/create.sh with ACCELERATOR_TYPE={result['topology']}), "
          "then launch/run.sh with the same --config flags; docs/planning.md", flush=True)
  return {True: 0, False: 1, None: 3}[result["fits"]]


def prepare_environment():
  """Before JAX starts a backend: the plan only compiles, so this process runs on the CPU even
  where libtpu is installed (whose TPU start-up would otherwise look for chips and print errors
  on a host that has none)."""
  os.environ.setdefault("JAX_PLATFORMS", "cpu")


if __name__ == "__main__":
  prepare_environment()
  define_flags()
  cli.run(main)   # absl exits with main's return value
