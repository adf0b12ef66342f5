r"""`bert_jax.plan` for a fine-tuning config: the fine-tuning loop's own train step
(finetune.build_training) compiled for a TPU slice from this host, and with GradCache
(config.embedding.grad_cache_chunks = N > 1) the unchunked step beside it (issue 40 item 4).

  python -m bert_jax.plan --config=bert_jax/configs/finetune.py:modernbert_embed_stage1 \
      --config.model_name=modernbert-base --config.model.dtype=bfloat16 --topology=v5litepod-8

The model: config.init_checkpoint's (its config and vocabulary; no array is read) or, without
one, config.model_name's preset at config.vocab_file's size (else the preset's vocabulary). The
batch: the task type's `train_batch` (bert_jax/tasks/registry.py), the shapes its data would
have; a task type without one (only embedding has it) is refused in one line. Everything the
fine-tuning run would refuse before compute (the mesh, a chunk count that does not divide each
device's rows, a Matryoshka width above the hidden size, ...) is refused here, by the same code,
before any compile. Printed per chip, for each step: arguments (parameters, Adam's state, the
batch), temporaries (activations: what GradCache shrinks), code and the total against the HBM the
compiler allows, the compiled FLOPs, and which step fits. The run uses the configured step:
exit 0 when it fits, 1 when not, 3 when the compiler crashed (bert_jax/plan.py).
"""

import contextlib
import dataclasses
import io
import re

from bert_jax.planning import plan_compile
from bert_jax.planning.plan_compile import GiB, Compiled, PlanError


def is_finetune(config):
  """Whether `config` is bert_jax/configs/finetune.py's (a task and max_seq_length), not
  pre-training's."""
  return "task" in config and "max_seq_length" in config


# ----------------------------------------------------------------------------------------------
# What the run would build, checked before any compile.
# ----------------------------------------------------------------------------------------------
def model_config_of(config):
  """(BertConfig as finetune makes it, where its vocabulary size comes from); reads no array."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  if config.init_checkpoint:
    return finetune.load_init_checkpoint(config)[2], "the init checkpoint's"
  if not config.model_name:
    raise PlanError("a fine-tuning plan needs the model: --config.model_name=PRESET (e.g. "
                    "modernbert-base; shapes only) or --config.init_checkpoint=PATH (its config; "
                    "no array is read).")
  overrides = {k: v for k, v in config.model.items() if v is not None}
  if config.vocab_file or config.spm_model_file:
    from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
    info = vocab_lib.load_vocab_info(vocab_file=config.vocab_file or None,
                                     spm_model_file=config.spm_model_file or None,
                                     prefix="--config.")
    overrides["vocab_size"], source = info.size, f"{info.path}'s"
  else:
    source = "the preset's; --config.vocab_file for yours"
  try:
    return model_lib.get_bert_config(config.model_name, **overrides), source
  except (ValueError, TypeError) as e:   # an unknown preset or field, from our code
    raise PlanError(f"config.model_name={config.model_name}: {e}") from e


def check(config, devices):
  """The fine-tuning run's own checks on the slice's devices, before any compile: (config with
  a learning rate, the task, BertConfig, vocabulary source, rows a device holds, what the task
  type's step says at start-up). Refuses a task type the plan cannot build and a distillation
  teacher (whose step it does not compile)."""
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  from bert_jax.models import heads  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import sharding as sharding_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  teacher = (config.get("embedding") or {}).get("teacher_checkpoint")
  if teacher:   # before the task is built: building it reads the teacher's config
    raise PlanError(f"config.embedding.teacher_checkpoint={teacher}: bert_jax.plan does not "
                    "compile a step with a teacher inside it; drop the flag to plan the "
                    "student's step (precomputed scores and teacher_embeddings are planned).")
  task = ft.build_task(config)
  task_type = tasks.of(task)
  if task_type.train_batch is None:
    able = sorted(t for t in tasks.names() if tasks.get(t).train_batch is not None)
    raise PlanError(f"config.task={config.task}: bert_jax.plan builds the fine-tuning step of "
                    f"task types that declare their training batch ({', '.join(able)}: "
                    f"--config.task=custom --config.custom.type=<one of them>); this task is "
                    f"{task.type}, whose bert_jax/tasks/{task.type}.py declares no "
                    "`train_batch` yet.")
  if config.get("pack"):   # packed rows: how many a batch needs is the data's (pack_batches)
    raise PlanError("config.pack=true: a packed fine-tuning batch's row count comes from its "
                    "data, which the plan does not read; plan the unpacked step (drop the flag: "
                    "packed rows hold the same texts in fewer tokens, so it bounds the packed "
                    "step's activations).")
  if config.get("distill_teacher"):
    raise PlanError("config.distill_teacher: bert_jax.plan does not compile a distillation "
                    "step (the teacher inside it); drop the flag to plan the student's step.")
  model_config, vocab_source = model_config_of(config)
  trainer_lib.check_max_length(config.max_seq_length, "max_seq_length", model_config)
  heads.create_model(task_type, model_config)   # the head's own checks (Matryoshka widths)
  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size, config.eval_batch_size,
                                 devices=devices)
  said = io.StringIO()   # what the run would print of it, for the report (after its header)
  if task_type.train_grads:   # its sizes (GradCache: the chunks divide each device's rows)
    with contextlib.redirect_stdout(said):
      task_type.train_grads(mesh, config.batch_size)
  config = config.copy_and_resolve_references()
  with config.unlocked():   # the schedule's values do not change the step's memory or FLOPs
    config.learning_rate = config.learning_rate or config.paper_learning_rate
  return (config, task, model_config, vocab_source,
          config.batch_size // sharding_lib.data_parallel_size(mesh), said.getvalue())


def with_chunks(config, chunks):
  c = config.copy_and_resolve_references()
  c.embedding.grad_cache_chunks = int(chunks)
  return c


def compile_step(config, model_config, devices):
  """Lowers and compiles finetune.build_training's train step (the loop's) for `devices`, on a
  global batch of the task type's train_batch shapes; a Compiled. Also what
  benchmarks/grad_cache_memory.py compiles (for this host's CPU or a slice)."""
  from bert_jax import finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  task = ft.build_task(config)
  task_type = tasks.of(task)
  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size, devices=devices)
  # 100 steps, 10 of warmup: the schedule's values are inputs to the step, not its shapes.
  t = finetune.build_training(task_type, model_config, config, mesh, num_train_steps=100,
                              warmup_steps=10, num_labels=getattr(task, "num_labels", 2),
                              num_choices=getattr(task, "num_choices", 4))
  batch = plan_compile.abstract_batch(task_type.train_batch(task, config), mesh)
  return plan_compile.compile_train_step(t, batch, mesh, **plan_compile.attention_fields(
      model_config, packed=False, seq_len=config.max_seq_length,
      platform_name=devices[0].platform))


# ----------------------------------------------------------------------------------------------
# The plan: the configured step and, with GradCache, the unchunked one beside it.
# ----------------------------------------------------------------------------------------------
# libtpu 0.0.42.1's out-of-memory message: "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the
# total memory required for HLO temporaries (143.98G) exceeds available HBM (15.75G)"
# (modernbert-base, 2,048 rows of 2 x 128 tokens a v5e chip).
_OOM_TEMPORARIES = re.compile(r"required for HLO temporaries \(([\d.]+)([GMK])\)")
_UNIT = {"G": GiB, "M": 1024 ** 2, "K": 1024}


def temporaries_of(c: Compiled):
  """The step's temporaries (bytes a chip): the compiled figure, or for a program that ran out
  of memory the compiler's message's (None when it gives none)."""
  if c.fits:
    return c.temporaries
  m = _OOM_TEMPORARIES.search(c.error)
  return float(m.group(1)) * _UNIT[m.group(2)] if m else None


def needed(c: Compiled):
  """Bytes a chip needs for the step (at least): the compiled total, or for a program that ran
  out of memory its inputs (parameters, Adam's state, the batch) and its temporaries."""
  if c.fits:
    return c.total
  temporaries = temporaries_of(c)
  return None if temporaries is None else temporaries + c.params + c.optimizer + c.batch


def _gib(n):
  """GiB with 2 decimals, MiB below 1 GiB (a tiny model's step is a few MiB)."""
  if n is None:
    return "-"
  return f"{n / GiB:.2f} GiB" if n >= GiB else f"{n / 1024 ** 2:.1f} MiB"


def chunks_of(config):
  return int(config.embedding.get("grad_cache_chunks", 0)) if "embedding" in config else 0


def labels(config, per_device):
  """{"unchunked": ..., "grad_cache": ...} column titles (only the first without GradCache)."""
  chunks = chunks_of(config)
  names = {"unchunked": "unchunked step"}
  if chunks > 1:
    names["grad_cache"] = f"GradCache {chunks} x {per_device // chunks} rows"
  return names


def report_lines(config, steps, names, hbm, hbm_source, spec):
  """The memory table (per chip, a column a step), the compiled FLOPs and GradCache's ratios to
  the unchunked step, as `plan` prints them before the verdict."""
  cols = list(names)
  width = max(len(n) for n in names.values()) + 2

  def row(title, value):
    return f"  {title:<24}" + "".join(f"{value(steps[k]):>{width}}" for k in cols)

  # A step the compiler refused (OOM): its inputs from their shapes, its temporaries from the
  # compiler's message, its total at least their sum (">=").
  lines = ["memory per chip:        " + "".join(f"{names[k]:>{width}}" for k in cols),
           row("parameters", lambda c: _gib(c.params)),
           row("optimizer state", lambda c: _gib(c.optimizer)),
           row("batch", lambda c: _gib(c.batch)),
           row("arguments (all inputs)", lambda c: _gib(c.arguments) if c.fits else "-"),
           row("temporaries", lambda c: _gib(temporaries_of(c))),
           row("code", lambda c: _gib(c.code) if c.fits else "-"),
           row("total", lambda c: ("" if c.fits else ">= ") + _gib(needed(c))),
           f"  of {_gib(hbm)} a chip {hbm_source} ({spec.generation.hbm_gib} GiB HBM)",
           row("FLOPs (compiled)", lambda c: f"{c.flops:.3e}" if c.fits else "-")]
  if "grad_cache" in steps:
    gc, plain = steps["grad_cache"], steps["unchunked"]
    if gc.fits and needed(plain) and temporaries_of(plain):
      lines.append(f"GradCache's temporaries are {gc.temporaries / temporaries_of(plain):.3f}x "
                   f"the unchunked step's, its total {gc.total / needed(plain):.3f}x"
                   + ("" if plain.fits else " (at most: the unchunked total is a lower bound)"))
    if gc.fits:
      # The chunks run in lax.map and lax.scan loops, whose body XLA's cost analysis counts
      # once: tiny, 4 chunks on v5e:2x2, 4.92e8 compiled against the unchunked 1.43e9; x 4 =
      # 1.97e9 = 1.37x, GradCache's one more forward (~4/3).
      n = chunks_of(config)
      lines.append(f"FLOPs: GradCache's compiled count has each chunk loop's body once (XLA's "
                   f"cost analysis); x {n} chunks = {n * gc.flops:.3e} a chip, an ESTIMATE"
                   + (f", {n * gc.flops / plain.flops:.2f}x the unchunked step's (~4/3: one "
                      "more forward)" if plain.fits and plain.flops else ""))
  return lines


def verdict(steps, names, hbm, spec):
  """(fits: the configured step's, the verdict line). The configured step is GradCache's when
  it is on, else the unchunked one."""
  def said(key):
    c, need = steps[key], needed(steps[key])
    if c.crashed:
      return f"{names[key]}: NO VERDICT ({c.error})"
    if c.fits and c.total <= hbm:
      return (f"{names[key]} FITS on {spec.cloud_name} with {_gib(hbm - c.total)} "
              f"({(hbm - c.total) / hbm:.0%}) of HBM to spare per chip")
    why = c.error or f"needs {_gib(need)} per chip, {_gib(hbm)} allowed"
    return f"{names[key]} DOES NOT FIT on {spec.cloud_name}: {why}"
  used = "grad_cache" if "grad_cache" in steps else "unchunked"
  c = steps[used]
  fits = None if c.crashed else bool(c.fits and c.total <= hbm)
  line = said(used) + ("" if used == "unchunked" else "; the " + said("unchunked"))
  if used == "unchunked" and not fits and fits is not None:
    line += ("; GradCache holds one chunk's activations at a time: "
             "--config.embedding.grad_cache_chunks=N (custom.type=embedding)")
  return fits, line


def plan(config, spec, libtpu, hbm_gib=None, *, log=print, isolate=True):
  """The fine-tuning plan as a dict (what --json writes): the checks, the slice's HBM, the
  header, one compile per step (the unchunked step, and GradCache's when it is on), the table
  and the verdict."""
  import os  # pylint: disable=g-import-not-at-top
  import platform as platform_lib  # pylint: disable=g-import-not-at-top
  devices = plan_compile.topology_devices(spec)
  config, task, model_config, vocab_source, per_device, said = check(config, devices)
  hbm, hbm_source = plan_compile.hbm_per_chip(devices[0], spec.generation, hbm_gib)
  names = labels(config, per_device)
  gen = spec.generation
  shape = tuple(batch_shape(config, task))
  log(f"plan: fine-tuning {config.model_name or config.init_checkpoint} "
      f"({model_config.num_layers} layers, hidden {model_config.hidden_size}, vocab "
      f"{model_config.vocab_size}: {vocab_source}), task {task.name} ({task.type}), global batch "
      f"{config.batch_size} ({per_device} rows a chip), batch arrays "
      f"{list(shape)}, {model_config.dtype}, remat {model_config.remat}, mesh "
      f"{tuple(config.mesh_shape)}")
  log(f"slice: {spec.cloud_name} = {spec.chips} x {gen.device_kind} chips on {spec.hosts} "
      f"host(s) (JAX topology {spec.jax_topology}); compiling with libtpu {libtpu} on this "
      f"{platform_lib.machine()} host ({os.cpu_count()} CPUs)")
  for line in said.splitlines():   # GradCache's start-up line: its chunks of each chip's rows
    log(line)
  if model_config.dtype == "float32":
    log("note: config.model.dtype=float32 computes in f32; TPUs run BERT in bf16: "
        "--config.model.dtype=bfloat16")
  result = dict(topology=spec.cloud_name, jax_topology=spec.jax_topology, chips=spec.chips,
                hosts=spec.hosts, device_kind=gen.device_kind, libtpu=libtpu, kind="finetune",
                hbm_available_bytes=hbm, hbm_nominal_gib=gen.hbm_gib,
                config=dict(model_name=config.model_name, init_checkpoint=config.init_checkpoint,
                            task=task.name, task_type=task.type,
                            max_seq_length=config.max_seq_length, batch_size=config.batch_size,
                            batch_shape=list(shape), mesh_shape=list(config.mesh_shape),
                            remat=bool(model_config.remat), dtype=model_config.dtype,
                            grad_cache_chunks=chunks_of(config)),
                steps={})
  compiler = plan_compile.IsolatedCompiler(spec.name, compile_step) if isolate else None
  steps = {}
  try:
    for key in names:   # the unchunked step first: the reference GradCache is read against
      c = with_chunks(config, 0) if key == "unchunked" and "embedding" in config else config
      steps[key] = (compiler(c, model_config) if compiler
                    else compile_step(c, model_config, devices))
      log(f"{names[key]}: " + (f"compiled in {steps[key].compile_seconds:.0f} s" if
                               steps[key].fits else (steps[key].error[:160] or "did not compile")))
  finally:
    if compiler:
      compiler.close()
  result["steps"] = {names[k]: dict(dataclasses.asdict(c), key=k) for k, c in steps.items()}
  first = next(iter(steps.values()))
  if first.attention:
    log(f"{first.attention}; {first.num_params / 1e6:.1f}M parameters")
  for line in report_lines(config, steps, names, hbm, hbm_source, spec):
    log(line)
  fits, line = verdict(steps, names, hbm, spec)
  result.update(fits=fits, verdict=line)
  log("verdict: " + line)
  return result


def batch_shape(config, task):
  """The training batch's input_ids shape (the task type's train_batch), for the header."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  return tasks.of(task).train_batch(task, config)["input_ids"][0]

