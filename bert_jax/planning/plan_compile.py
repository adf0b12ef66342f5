"""The TPU compile behind `bert_jax.plan`: the slice's compile-only devices, the step compiled for
them (train.build_training, the function `train` runs) with what the compiler says of it
(memory by kind, FLOPs, collectives: Compiled), and IsolatedCompiler, which runs compiles in a
child process so a libtpu crash is a verdict, not a dead planner. bert_jax/plan.py turns these
into the plan, the search and the CLI.
"""

import contextlib
import dataclasses
import importlib.metadata
import importlib.util
import io
import math
import os
import re
import time

from bert_jax_core import errors
from bert_jax.parallel import tpu_specs

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
# TPU_WORKER_HOSTNAMES makes bert_jax.parallel.distributed, and so every later run in this process tree,
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


def hbm_per_chip(device, gen, hbm_gib):
  """(bytes a program may use on one chip, where the figure comes from): the compiler's own,
  else the generation's nominal HBM; at most --hbm_gib."""
  hbm, source = available_hbm(device), "the compiler allows"
  if hbm is None:
    hbm, source = gen.hbm_gib * GiB, "(nominal; the compiler gave no figure)"
  if hbm_gib is not None:
    hbm, source = min(hbm, hbm_gib * GiB), "allowed by --hbm_gib"
  return hbm, source


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
  arguments: int = 0           # all the step's inputs (memory_analysis): the four above and more
  temporaries: int = 0
  code: int = 0
  total: int = 0
  flops: float = 0.0           # compiled, per chip
  bytes_accessed: float = 0.0  # compiled, per chip
  compiler_seconds: float = 0.0  # libtpu's cost-model step time, corrected (see `estimate`)
  compiler_raw_seconds: float = 0.0  # ... as cost_analysis()["optimal_seconds"] gives it
  concat_bitcasts: int = 0     # ConcatBitcast custom calls in the program (the correction)
  collectives: dict = dataclasses.field(default_factory=dict)   # op -> [count, bytes]
  attention: str = ""          # the start-up line's words
  kernels: dict = dataclasses.field(default_factory=dict)  # {"global"[, "local"]: kernel}, training
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
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  from bert_jax.training import input_source  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top

  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size,
                                 grad_accum_steps=int(config.grad_accum_steps), devices=devices)
  t = train.build_training(config, model_config, mesh,
                           teacher=families.get(model_config.family).planning_teacher(
                               config, model_config))
  batch = abstract_batch(input_source.batch_spec(config, layout_of(config)), mesh)
  return compile_train_step(t, batch, mesh, **attention_fields(
      model_config, packed=bool(config.pack), seq_len=config.seq_length,
      platform_name=devices[0].platform))


def attention_fields(model_config, **where):
  """Compiled's attention (the start-up line's words, fp8's note) and kernels (training's
  kernel by layer kind) for the step on `where` (packed, seq_len, platform_name)."""
  from bert_jax.layers import attention as attention_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.layers import fp8 as fp8_lib  # pylint: disable=g-import-not-at-top
  attention = attention_lib.startup_line(model_config, **where)
  fp8_note = fp8_lib.startup_note(model_config, where["platform_name"])
  attention += f"; {fp8_note}" if fp8_note else ""
  return dict(attention=attention, kernels=attention_lib.training_backends(model_config, **where))


def abstract_batch(spec, mesh):
  """{key: (shape, dtype)} of a global batch -> ShapeDtypeStructs sharded as the loops shard a
  batch (rows over data x fsdp)."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  shard = sharding_lib.batch_sharding(mesh)
  return {k: jax.ShapeDtypeStruct(shape, dtype, sharding=shard)
          for k, (shape, dtype) in spec.items()}


def compile_train_step(t, batch, mesh, **fields):
  """Lowers and compiles a trainer_lib.Steps' train_step (pre-training's or fine-tuning's) for
  its abstract state and `batch` (abstract_batch), not through the persistent cache, and reads
  what the compiler says of it per chip: a Compiled (`fields`: its start-up words). A program
  that runs out of the chip's memory is Compiled(fits=False) with the compiler's message."""
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  state = t.abstract_state
  start = time.perf_counter()
  with trainer_lib.mesh_rules(mesh):
    lowered = t.train_step.lower(state, batch)
  try:
    with without_persistent_cache():
      compiled = lowered.compile()
  except jax.errors.JaxRuntimeError as e:
    if "RESOURCE_EXHAUSTED" not in str(e):
      raise
    # What the step's inputs hold is known from their shapes without the program.
    return Compiled(False, time.perf_counter() - start,
                    error=" ".join(str(e).split()).rstrip("."),
                    num_params=_num_params(state["params"]),
                    params=_per_device_bytes(state["params"]),
                    optimizer=_per_device_bytes(state["opt_state"]),
                    batch=_per_device_bytes(batch), **fields)
  seconds = time.perf_counter() - start
  mem = compiled.memory_analysis()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  hlo = compiled.as_text()
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
      arguments=mem.argument_size_in_bytes,
      temporaries=mem.temp_size_in_bytes, code=mem.generated_code_size_in_bytes, total=total,
      flops=float(cost.get("flops", 0.0)), bytes_accessed=float(cost.get("bytes accessed", 0.0)),
      compiler_seconds=float(cost.get("optimal_seconds", 0.0)) + concat_bitcasts,
      compiler_raw_seconds=float(cost.get("optimal_seconds", 0.0)), concat_bitcasts=concat_bitcasts,
      collectives=collectives(hlo), **fields)


def _compile_worker(conn, topology, step_fn=None):
  """A child process that compiles configs it receives (dicts) for `topology` until told to stop
  (None), answering each with Compiled as a dict. See IsolatedCompiler."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  import traceback  # pylint: disable=g-import-not-at-top
  devices = topology_devices(tpu_specs.parse_topology(topology))
  while (message := conn.recv()) is not None:
    config_dict, model_config = message
    config = ml_collections.ConfigDict(config_dict)
    try:
      if step_fn is not None:   # the parent made its model config (and said so)
        with contextlib.redirect_stdout(io.StringIO()):   # ... and the task's start-up lines
          c = step_fn(config, model_config, devices)
      else:
        make_model_config, _ = model_config_factory(config)
        c = compile_step(config, make_model_config(config), devices)
      conn.send(dataclasses.asdict(c))
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

  def __init__(self, topology, step_fn=None):
    """step_fn: (config, model_config, devices) -> Compiled for a step other than pre-training's
    (plan_finetune.compile_step), a module-level function: spawn pickles it by name, so the
    child imports its module and this one names none (no plan_compile <-> plan_finetune cycle)."""
    import multiprocessing  # pylint: disable=g-import-not-at-top
    self._ctx, self._topology, self._child = multiprocessing.get_context("spawn"), topology, None
    self._step_fn = step_fn

  def __call__(self, config, model_config=None):
    """config's step compiled in the child: a Compiled. model_config: a fine-tuning config's
    BertConfig as the parent made it (pre-training's is made from the config in the child)."""
    start = time.perf_counter()
    if self._child is None:
      self._conn, child_end = self._ctx.Pipe()
      self._child = self._ctx.Process(target=_compile_worker, args=(child_end, self._topology, self._step_fn),
                                      daemon=True)
      self._child.start()
      child_end.close()
    try:
      self._conn.send((config.to_dict(), model_config))
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


def model_config_factory(config):
  """config -> BertConfig, as train makes it (the vocabulary's size: its file's, a tokenizer.json's,
  else the config's or the preset's, train.synthetic_vocab_size)."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  if train.names_a_vocab(config):
    vocab = train.load_vocab(config)
  else:
    vocab = train.input_source_vocab(train.synthetic_vocab_size(config))

  def make(c):
    return train.create_model_config(c, vocab)
  return make, vocab


def layout_of(config):
  """The stream layout train would store, as far as the step's shapes depend on it."""
  return dict(pack=bool(config.pack), max_instances_per_pack=int(config.max_instances_per_pack))
