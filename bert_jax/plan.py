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

A fine-tuning config (bert_jax/configs/finetune.py's, as `bert_jax.finetune` takes it; task types
that declare their training batch: embedding) plans the fine-tuning loop's step instead, and
with GradCache (config.embedding.grad_cache_chunks = N > 1) the unchunked step beside it:
memory per chip and compiled FLOPs of both, and which fits (bert_jax/planning/plan_finetune.py).

bert_jax/configs/mine.py plans `bert_jax.mine`'s encoding step and block merge instead: memory
per chip at a stated block, batch and query count (bert_jax/planning/plan_mine.py).

Exit code: 0 fits, 1 does not fit (the verdict line says why), 2 a usage error, 3 no verdict (the
TPU compiler itself crashed; libtpu 0.0.42.1 segfaulted on some remat programs here).
"""

import dataclasses
import json
import math
import os
import platform as platform_lib

from absl import flags
from ml_collections import config_flags

from bert_jax import cli
from bert_jax_core import files as files_lib
from bert_jax.parallel import tpu_specs
# The compile itself (the slice's devices, compile_step, Compiled, IsolatedCompiler, the model
# config as train makes it) lives in plan_compile.py; its names stay reachable here
# (plan.compile_step, plan.PlanError, ...), as the tests and users' scripts call them.
from bert_jax.planning.plan_compile import (  # pylint: disable=unused-import
    GiB, Compiled, IsolatedCompiler, PlanError, available_hbm, collectives, compile_step,
    hbm_per_chip, layout_of, model_config_factory, require_libtpu, topology_devices,
    without_persistent_cache)


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


def splash_flops(config, model_config, kinds=("global", "local")):
  """Training FLOPs of one step's attention scores and context in the main network, on the
  layers of `kinds` ("global", "local": those whose training kernel is splash): 12 x T x S x H a
  layer (3 x forward, 2 a multiply-add, QK^T and PV), S = T keys on global layers and
  min(T, W + 1) on windowed ones (ModernBERT's local layers), x rows. On TPU they run in the
  splash kernel, whose pallas_call carries no cost estimate (JAX 0.10.2): the compiled FLOPs and
  libtpu's cost model both leave them out. modernbert-base at 8,192, 9 rows a chip: 4.6e13 of
  the step's 1.0e14 analytic FLOPs a chip, and the compiled count was 0.55x the analytic
  (2026-11-26, docs/models.md). A lower bound: ELECTRA's generator and a DistilBERT teacher run
  splash too and are not counted here."""
  from bert_jax.families import bert  # pylint: disable=g-import-not-at-top
  return (bert.attention_flops_per_sequence(model_config, int(config.seq_length), kinds)
          * int(config.batch_size))


def predict(config, model_config, spec, c: Compiled, price, teacher=None):
  """The numbers a user pays by: tokens/s, MFU, hours, chip-hours and cost."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  gen = spec.generation
  step_s, how = estimate(c, gen)
  splash = tuple(kind for kind, kernel in (c.kernels or {}).items() if kernel == "splash")
  if splash:
    # The cost model does not see the splash kernels: add their FLOPs at the chip's peak, the
    # least time they can take (a tiny model's are ~nothing; long rows' are half the step).
    unseen = splash_flops(config, model_config, splash) / spec.chips
    extra = unseen / (gen.peak_bf16_tflops * 1e12)
    step_s += extra
    how += (f"; + {extra:.4f} s for the splash attention kernels at peak ({unseen:.3e} FLOPs a "
            "chip, which the compiled count leaves out and the cost model has no estimate of)")
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
def plan(config, topology, *, search_settings=False, price=None, hbm_gib=None, log=print,
         isolate=True):
  """The whole plan as a dict (what --json writes); `log` gets the report's lines.

  train's checks first, then the slice's HBM, the header lines, --search's settings, the one
  compile of the step, and the verdict from it."""
  spec = tpu_specs.parse_topology(topology)     # the cheap checks first
  libtpu = require_libtpu()
  from bert_jax.planning import plan_finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.planning import plan_mine  # pylint: disable=g-import-not-at-top
  if plan_mine.is_mine(config):   # bert_jax/configs/mine.py's: bert_jax.mine's two programs
    if search_settings or price is not None:
      raise PlanError("--search and --price_per_chip_hour are pre-training's; a mining plan "
                      "prints memory per chip: drop them.")
    return plan_mine.plan(config, spec, libtpu, hbm_gib, log=log, isolate=isolate)
  if plan_finetune.is_finetune(config):   # bert_jax/configs/finetune.py's: the loop's step
    if search_settings:
      raise PlanError("--search looks for pre-training settings (mesh, remat, accumulation); "
                      "drop it for a fine-tuning config (GradCache's chunks: "
                      "--config.embedding.grad_cache_chunks=N).")
    if price is not None:   # its step count depends on the data, which the plan does not read
      raise PlanError("--price_per_chip_hour: a fine-tuning plan prints memory and FLOPs, no "
                      "cost (the steps depend on the data); drop the flag.")
    return plan_finetune.plan(config, spec, libtpu, hbm_gib, log=log, isolate=isolate)
  make_model_config, vocab, teacher, devices = _check_as_train(config, spec, search_settings)
  model_config = make_model_config(config)
  gen = spec.generation
  price = gen.price_per_chip_hour if price is None else float(price)
  hbm, hbm_source = hbm_per_chip(devices[0], gen, hbm_gib)
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
  from bert_jax.training import preflight  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
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
                                  "(e.g. bert_jax/configs/pretrain.py:base), or a fine-tuning "
                                  "one, as bert_jax.finetune's (embedding tasks: "
                                  "bert_jax/configs/finetune.py:modernbert_embed_stage1).",
                                  lock_config=True)
  flags.DEFINE_string("topology", None, "The TPU slice: v5p-128, v5litepod-16, v4-32, v6e-64 or "
                      "JAX's form v5e:4x4.")
  flags.DEFINE_bool("search", False, "Find the cheapest mesh/remat/accumulation settings that fit "
                    "the configured global batch, and print the flags for bert_jax.train.")
  flags.DEFINE_float("price_per_chip_hour", None, "USD per chip-hour for the cost line (default: "
                     "the dated on-demand list price in bert_jax/parallel/tpu_specs.py).")
  flags.DEFINE_string("json", None, "Also write the plan as JSON to this file.")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --json file (without it: refused, "
                    "before any compile).")
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
    files_lib.check_output_file(FLAGS.json, "--json", overwrite=FLAGS.overwrite)
  if FLAGS.hbm_gib is not None and FLAGS.hbm_gib <= 0:
    raise PlanError(f"--hbm_gib={FLAGS.hbm_gib}: expected a positive size in GiB.")
  result = plan(FLAGS.config, FLAGS.topology, search_settings=FLAGS.search,
                price=FLAGS.price_per_chip_hour, hbm_gib=FLAGS.hbm_gib,
                log=lambda line: print(line, flush=True))
  if FLAGS.json:
    files_lib.write_atomic(FLAGS.json, json.dumps(result, indent=2, default=str))
    print(f"wrote {FLAGS.json}", flush=True)
  if result["fits"]:
    program = {"finetune": "bert_jax.finetune", "mine": "bert_jax.mine (its flags of the same "
               "names)"}.get(result.get("kind"), "launch/run.sh")
    print(f"next: create the slice (launch/create.sh with ACCELERATOR_TYPE={result['topology']}), "
          f"then {program} with the same --config flags; docs/planning.md", flush=True)
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
