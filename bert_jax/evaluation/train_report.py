"""What the pre-training loop prints and writes about itself: the start-up lines (mesh, input),
the log line with throughput, MFU and ETA, and the end of a run (summary.json's record and the
commands to run next). Split from train.py so the loop reads top to bottom; train re-exports
these names (train.next_commands, train.device_peak_tflops, ...).
"""

import os

import jax

from bert_jax.layers import attention as attention_lib
from bert_jax import families
from bert_jax.layers import fp8 as fp8_lib
from bert_jax.evaluation import metrics_writer
from bert_jax.objectives import pretraining as objectives
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.parallel import tpu_specs
from bert_jax.training import trainer_lib


# Dense bf16 peak per chip, TFLOP/s (vendor figures). MFU is printed only where this is known.
PEAK_TFLOPS = {**{g.device_kind: g.peak_bf16_tflops for g in tpu_specs.GENERATIONS.values()},
               "TPU v5e": 197, "TPU v5p": 459, "TPU v6e": 918,     # other spellings of the kinds
               "NVIDIA H100": 989, "NVIDIA H200": 989, "NVIDIA A100": 312}


def device_peak_tflops(devices=None):
  """Dense bf16 peak of `devices` (default: all of this run's), TFLOP/s; None if unknown."""
  devices = jax.devices() if devices is None else list(devices)
  kind = devices[0].device_kind
  for name in sorted(PEAK_TFLOPS, key=len, reverse=True):   # "TPU v5 lite" before "TPU v5"
    if kind.startswith(name):
      return PEAK_TFLOPS[name] * len(devices)
  return None


def print_mesh_line(config, model_config, mesh, local_batch, is_main):
  """The start-up lines: mesh, batch split, device order and the attention kernel.

  The attention kernel is resolved on every host (an explicit one that cannot run here is an
  error everywhere, now), printed by host 0.
  """
  accum = int(config.grad_accum_steps)
  attention_line = attention_lib.startup_line(model_config, packed=bool(config.get("pack")),
                                              seq_len=config.seq_length)
  fp8_note = fp8_lib.startup_note(model_config, attention_lib.platform())
  attention_line += f"; {fp8_note}" if fp8_note else ""
  if is_main:
    print(f"mesh {dict(mesh.shape)} on {jax.device_count()} devices, {jax.process_count()} "
          f"host(s); global batch {config.batch_size} = {jax.process_count()} x {local_batch} "
          f"rows per host" + (f", {accum} micro-batches of {config.batch_size // accum} per "
                              "step" if accum > 1 else ""), flush=True)
    print(f"device order: {sharding_lib.device_order_source(mesh)}; {attention_line}", flush=True)


def input_line(layout, num_files, real_per_slot):
  """The start-up line of the training stream: logical shards, packing and its efficiency."""
  shards = layout["num_logical_shards"]
  return (f"input: {num_files} files in {shards} logical shards (host 0 reads "
          f"{shards // jax.process_count()}); "
          + (f"packed rows of up to {layout['max_instances_per_pack']} instances"
             if layout["pack"] else "one instance per row (--config.pack=false)")
          + f": {real_per_slot:.3f} real tokens per slot over the first batches")


# ----------------------------------------------------------------------------------------------
# The end of a run: what it did and what to run next.
# ----------------------------------------------------------------------------------------------
def run_summary(config, workdir, *, seconds, start_step, step, total_steps, history, last_eval,
                flops_per_step, ramp=None):
  """What a run did, for metrics_writer.write_summary (summary.json and the closing lines).
  ramp: a batch-size warmup (batch_warmup.Ramp), whose first steps train on fewer rows."""
  stopped = step < total_steps
  rows = config.batch_size * step if ramp is None else ramp.rows_through(step)
  return dict(
      program="train", status="stopped_early" if stopped else "finished",
      wall_time_sec=seconds, start_step=start_step, final_step=step,
      total_steps=total_steps, final_eval=last_eval,
      final_eval_step=history["eval"][-1][0] if history["eval"] else None,
      # The analytic compute of the run so far (train.step_flops: matmuls of every network the
      # step runs), the load-independent budget to compare families at equal compute.
      gflop_per_step=flops_per_step / 1e9,
      pretrain_tflop=flops_per_step / config.batch_size * rows / 1e12,
      trained_tokens=rows * config.seq_length,
      batch_warmup=ramp.record() if ramp is not None else None,
      model=f"{workdir} (checkpoint {step})",
      outputs={"tensorboard": os.path.join(workdir, "tensorboard")},
      next=next_commands(config, workdir, step, stopped))


def next_commands(config, workdir, step, stopped):
  """The commands a user runs next on this workdir (printed and in summary.json)."""
  if stopped:
    return ["re-run the same command to resume from checkpoint " f"{step}"]
  more = max(2 * step, step + 1)
  parts = os.path.normpath(workdir).split(os.sep)  # runs/quickstart/workdir -> "quickstart"
  name = (parts[-2] if parts[-1] == "workdir" and len(parts) > 1 else parts[-1]) or "model"
  further = (f"train further: the same command with --config.num_train_steps={more} (resumes "
             f"from step {step}; the learning-rate decay is stretched to the new total)")
  # One converter for every family; what a family adds to "train further" (DistilBERT: the
  # same teacher) is its train_further_note.
  family = families.of_preset(config.model_name) or families.get("bert")
  further += family.train_further_note
  if config.get("phases"):   # a schedule is fixed for its workdir: more steps would move it
    further = (f"train further: a new run from it, --config.init_checkpoint={workdir} "
               f"--workdir=runs/{name}-more with phases of its own (this workdir's phases end at "
               f"step {step}; a resume with other phases or steps is refused)")
  return [
      f'python -m bert_jax.predict --init_checkpoint={workdir} fill-mask '
      f'"The man went to the [MASK] ."',
      f"python -m bert_jax.convert --input={workdir} --output=hf/{name}",
      f"python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:custom "
      f"--config.init_checkpoint={workdir} --config.data_dir=DATA --workdir=runs/{name}-ft",
      further,
  ]


def nothing_to_do(config, workdir, latest, is_main):
  """A workdir whose latest checkpoint already reached num_train_steps: no compute."""
  total = int(config.num_train_steps)
  previous = metrics_writer.read_summary(workdir) if is_main else None
  if is_main:
    further = (f"--config.num_train_steps={max(2 * latest, latest + 1)} (or a new --workdir to "
               "start over)" if not config.get("phases") else
               f"--config.init_checkpoint={workdir} with a new --workdir (its phases are fixed)")
    print(f"nothing to do: {workdir} already holds checkpoint {latest} and "
          f"--config.num_train_steps={total}; to train further pass {further}", flush=True)
    if previous:
      print("\n".join(metrics_writer.summary_lines(previous)), flush=True)
  return dict(history=dict(train=[], eval=[]), final_step=latest,
              last_eval=(previous or {}).get("final_eval") or {}, stopped_early=False,
              nothing_to_do=True, summary=previous)


def summarize(host_metrics, steps_per_sec, config, flops_per_step):
  """Mean of the applied steps' metrics since the last log (skipped NaN/Inf steps left out),
  plus throughput when it was timed."""
  avg = trainer_lib.mean_of_applied(host_metrics)
  if steps_per_sec:
    # Rows per step: the steps' own while a batch-size warmup ramps (their mean since the last
    # log: metrics["batch_size"], batch_warmup.py), else the configured batch.
    rows = avg.get("batch_size", config.batch_size)
    seqs = steps_per_sec * rows
    avg.update(steps_per_sec=steps_per_sec, sequences_per_sec=seqs,
               tokens_per_sec=seqs * config.seq_length,
               real_tokens_per_sec=seqs * config.seq_length * avg["real_token_fraction"],
               tflops=steps_per_sec * flops_per_step * rows / config.batch_size / 1e12)
    peak = device_peak_tflops()
    if peak:
      avg["mfu"] = avg["tflops"] / peak
  return avg


def log_line(step, total_steps, avg, remaining_rows=None):
  """remaining_rows: the rows of steps step+1..total_steps, for the ETA while the batch ramps
  (batch_warmup.Ramp.rows_through); None: (total_steps - step) steps at the logged rate."""
  speed = " | compiling"
  if "steps_per_sec" in avg:
    eta = (remaining_rows / avg["sequences_per_sec"] if remaining_rows is not None
           else (total_steps - step) / avg["steps_per_sec"])
    speed = (f" | {avg['sequences_per_sec']:.1f} rows/s {avg['tokens_per_sec']:.0f} tok/s "
             f"({avg['real_tokens_per_sec']:.0f} real) "
             f"{avg['tflops']:.3f} TFLOP/s" + (f" MFU {avg['mfu']:.1%}" if "mfu" in avg else "")
             + f" | ETA {_fmt_time(eta)}")
  parts = ", ".join(f"{p} {avg[p + '_loss']:.3f}" + (f" acc {avg[p + '_accuracy']:.3f}" if
                                                      p + "_accuracy" in avg else "")
                    for p in objectives.PARTS if p + "_loss" in avg)   # the model's objectives
  return (f"step {step}/{total_steps} | loss {avg['loss']:.4f} ({parts}) "
          f"| lr {avg['learning_rate']:.2e} | gnorm {avg['grad_norm']:.2f}"
          + (f" | batch {avg['batch_size']:.0f}" if "batch_size" in avg else "")
          + (f" | skipped {avg['skipped_steps']}" if avg.get("skipped_steps") else "") + speed)


def _fmt_time(seconds):
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"
