r"""BERT pre-training: one loop, read top to bottom.

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:base --workdir=DIR \
      --config.train_input_files='data/train-*' --config.vocab_file=vocab.txt

Sections: set-up and validation -> mesh -> input -> model + optimizer -> shardings -> state
(init, resume or init_checkpoint) -> train step -> loop (metrics, eval, checkpoints, SIGTERM).
Restarting with the same --workdir resumes from the latest committed checkpoint and continues
the same data stream.
"""

import functools
import glob as glob_lib
import hashlib
import json
import os
import sys
import time
from typing import Callable, NamedTuple

from absl import app, flags, logging
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np
import optax
from flax import linen as nn

from bert_jax import checkpoint as ckpt_lib
from bert_jax import distributed
from bert_jax import input_source
from bert_jax import metrics_writer
from bert_jax import model as model_lib
from bert_jax import optimizer as optimizer_lib
from bert_jax import sharding as sharding_lib


class ConfigError(ValueError):
  pass


# ----------------------------------------------------------------------------------------------
# Loss and step functions (pure).
# ----------------------------------------------------------------------------------------------
def pretraining_loss(mlm_logits, nsp_logits, batch):
  """google-research/bert's loss: weighted MLM cross-entropy + NSP cross-entropy.

  mlm_logits: [B, P, V] float32, nsp_logits: [B, 2] float32.
  """
  weights = batch["masked_lm_weights"]                                   # [B, P]
  mlm_ce = optax.softmax_cross_entropy_with_integer_labels(mlm_logits, batch["masked_lm_ids"])
  # 1e-5 as in the original: a batch with no predictions gives 0, not NaN.
  mlm_loss = jnp.sum(mlm_ce * weights) / (jnp.sum(weights) + 1e-5)
  nsp_ce = optax.softmax_cross_entropy_with_integer_labels(nsp_logits,
                                                           batch["next_sentence_labels"])
  nsp_loss = jnp.mean(nsp_ce)
  mlm_correct = (jnp.argmax(mlm_logits, -1) == batch["masked_lm_ids"]) * weights
  metrics = dict(
      loss=mlm_loss + nsp_loss, mlm_loss=mlm_loss, nsp_loss=nsp_loss,
      mlm_accuracy=jnp.sum(mlm_correct) / (jnp.sum(weights) + 1e-5),
      nsp_accuracy=jnp.mean(jnp.argmax(nsp_logits, -1) == batch["next_sentence_labels"]))
  return mlm_loss + nsp_loss, metrics


def _apply(model, params, batch, deterministic, rngs=None):
  return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                     batch["segment_ids"], batch["masked_lm_positions"],
                     deterministic=deterministic, rngs=rngs)


def train_step(state, batch, *, model, tx, schedule, grad_accum_steps):
  """One micro-step: forward, backward, optax update. state: dict(step, params, opt_state, rng)."""
  dropout_rng = jax.random.fold_in(state["rng"], state["step"])

  def loss_fn(params):
    mlm_logits, nsp_logits = _apply(model, params, batch, False, {"dropout": dropout_rng})
    return pretraining_loss(mlm_logits, nsp_logits, batch)

  (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  metrics["grad_norm"] = optax.global_norm(grads)
  metrics["learning_rate"] = schedule(state["step"] // grad_accum_steps)
  new_state = dict(step=state["step"] + 1, params=params, opt_state=opt_state, rng=state["rng"])
  return new_state, metrics


def eval_step(params, batch, *, model):
  mlm_logits, nsp_logits = _apply(model, params, batch, True)
  return pretraining_loss(mlm_logits, nsp_logits, batch)[1]


class Training(NamedTuple):
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: dict       # ShapeDtypeStructs carrying their NamedShardings
  state_shardings: dict
  param_shardings: dict
  init_state: Callable       # rng -> sharded state (jitted)
  train_step: Callable       # (state, global batch) -> (state, metrics) (jitted, state donated)
  eval_step: Callable        # (params, global batch) -> metrics (jitted)


def build_training(config, model_config, mesh, rules=sharding_lib.LOGICAL_AXIS_RULES):
  """Model, optimizer and the jitted, explicitly sharded init/train/eval functions."""
  accum = int(config.grad_accum_steps)
  model = model_lib.BertForPreTraining(model_config)
  tx, schedule = optimizer_lib.create_optimizer(
      learning_rate=config.learning_rate, warmup_steps=config.warmup_steps,
      num_train_steps=config.num_train_steps, optimizer=config.optimizer,
      weight_decay=config.weight_decay, b1=config.b1, b2=config.b2, eps=config.eps,
      clip_norm=config.clip_norm, grad_accum_steps=accum)

  # Shardings come from the logical axis names on every parameter.
  dummy = {k: jnp.zeros(v, jnp.int32) for k, v in dict(
      input_ids=(1, config.seq_length), input_mask=(1, config.seq_length),
      segment_ids=(1, config.seq_length),
      masked_lm_positions=(1, config.max_predictions_per_seq)).items()}

  def init_variables(rng):
    # Without rules, boxed initialisers skip their sharding constraint: flax's DenseGeneral
    # builds a [H, N*D] kernel and reshapes it to [H, N, D] only after the box applies its 3-axis
    # constraint. Placement comes from the jit out_shardings below instead.
    with nn.logical_axis_rules(()):
      return model.init({"params": rng, "dropout": rng}, dummy["input_ids"], dummy["input_mask"],
                        dummy["segment_ids"], dummy["masked_lm_positions"],
                        deterministic=True)

  def init_state(rng):
    with nn.logical_axis_rules(()):
      params = nn.unbox(init_variables(rng)["params"])
    return dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                rng=rng)

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract_vars = jax.eval_shape(init_variables, jax.random.PRNGKey(0))
    param_shardings = sharding_lib.logical_to_sharding(
        nn.get_partition_spec(abstract_vars)["params"], mesh, rules)
    abstract_state = jax.eval_shape(init_state, jax.random.PRNGKey(0))
  repl = sharding_lib.replicated(mesh)
  state_shardings = sharding_lib.train_state_shardings(tx, abstract_state["opt_state"],
                                                       param_shardings, mesh)
  abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
      state_shardings)
  batch_sharding = sharding_lib.batch_sharding(mesh)
  return Training(
      model=model, tx=tx, schedule=schedule, abstract_state=abstract_state,
      state_shardings=state_shardings, param_shardings=param_shardings,
      init_state=jax.jit(init_state, out_shardings=state_shardings),
      train_step=jax.jit(
          functools.partial(train_step, model=model, tx=tx, schedule=schedule,
                            grad_accum_steps=accum),
          in_shardings=(state_shardings, batch_sharding), out_shardings=(state_shardings, repl),
          donate_argnums=(0,)),
      eval_step=jax.jit(functools.partial(eval_step, model=model),
                        in_shardings=(param_shardings, batch_sharding), out_shardings=repl))


# ----------------------------------------------------------------------------------------------
# FLOPs (for TFLOP/s and MFU).
# ----------------------------------------------------------------------------------------------
# Dense bf16 peak per chip, TFLOP/s (vendor figures). MFU is printed only where this is known.
PEAK_TFLOPS = {"TPU v4": 275, "TPU v5 lite": 197, "TPU v5e": 197, "TPU v5p": 459, "TPU v5": 459,
               "TPU v6 lite": 918, "TPU v6e": 918, "NVIDIA H100": 989, "NVIDIA H200": 989,
               "NVIDIA A100": 312}


def model_flops_per_sequence(cfg, seq_length, num_predictions):
  """Analytic training FLOPs per sequence (forward + backward = 3x forward).

  6 x non-embedding params per token, + attention scores/context 12 x L x T x H per token,
  + the MLM head on the masked positions only (transform H*H + decoder H*V), + NSP/pooler.
  """
  h, l, t, i = cfg.hidden_size, cfg.num_layers, seq_length, cfg.intermediate_size
  per_layer = 4 * h * h + 2 * h * i                         # q,k,v,o + two FFN matrices
  dense = 6 * l * per_layer * t
  attention = 12 * l * t * t * h
  mlm_head = 6 * num_predictions * (h * h + h * cfg.vocab_size)
  pooler_nsp = 6 * (h * h + 2 * h)
  return dense + attention + mlm_head + pooler_nsp


def device_peak_tflops():
  kind = jax.devices()[0].device_kind
  for name, peak in PEAK_TFLOPS.items():
    if kind.startswith(name):
      return peak * jax.device_count()
  return None


# ----------------------------------------------------------------------------------------------
# Validation: every problem is a one-line error before any compute.
# ----------------------------------------------------------------------------------------------
def _expand_files(pattern, field):
  if pattern == "synthetic":
    return "synthetic"
  if not pattern:
    raise ConfigError(f"config.{field} is empty: pass TFRecords from "
                      "`python -m data_pipelines.create_pretraining_data`, e.g. "
                      f"--config.{field}='data/records/train-*'.")
  files = []
  for p in pattern.split(","):
    matched = sorted(glob_lib.glob(p)) if "://" not in p else _gfile_glob(p)
    files.extend(matched)
  if not files:
    raise ConfigError(f"config.{field}={pattern}: no files match; check the path or run "
                      "`python -m data_pipelines.create_pretraining_data` first.")
  return files


def _gfile_glob(pattern):
  from data_pipelines.tf_setup import tf
  return sorted(tf.io.gfile.glob(pattern))


def _check_workdir(workdir):
  if not workdir:
    raise ConfigError("--workdir is empty: pass a directory for checkpoints and logs.")
  if "://" in workdir:
    return
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir}: not writable ({e.strerror}); choose a directory "
                      "you can write to.") from e


def load_vocab(config):
  if config.train_input_files == "synthetic" and not (config.vocab_file or config.spm_model_file):
    size = config.model.vocab_size or 30522
    return input_source_vocab(size)
  from data_pipelines import vocab as vocab_lib
  try:
    return vocab_lib.load_vocab_info(vocab_file=config.vocab_file or None,
                                     spm_model_file=config.spm_model_file or None)
  except vocab_lib.VocabError as e:
    raise ConfigError(str(e).replace("--vocab_file", "config.vocab_file")
                      .replace("--spm_model_file", "config.spm_model_file")) from e


def input_source_vocab(size):
  from data_pipelines.vocab import VocabInfo
  return VocabInfo(size=size, pad_id=0, unk_id=1, cls_id=2, sep_id=3, mask_id=4,
                   is_continuation=np.zeros(size, bool),
                   is_special=np.arange(size) < 5, path="synthetic")


def create_model_config(config, vocab):
  overrides = {k: v for k, v in config.model.items() if v is not None}
  if "vocab_size" in overrides and overrides["vocab_size"] != vocab.size:
    raise ConfigError(f"config.model.vocab_size={overrides['vocab_size']} but the vocab file "
                      f"{vocab.path} has {vocab.size} tokens; drop the override (it is read "
                      "from the vocab) or use the matching vocab.")
  overrides["vocab_size"] = vocab.size
  try:
    return model_lib.get_bert_config(config.model_name, **overrides)
  except (ValueError, TypeError) as e:
    raise ConfigError(f"config.model_name={config.model_name}: {e}") from e


def _file_hash(path):
  if not path or path == "synthetic":
    return ""
  from data_pipelines.tf_setup import tf
  with tf.io.gfile.GFile(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()[:16]


# ----------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------
def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) pre-training; returns the last logged and evaluated metrics."""
  # --- Set-up and validation (no compute before this passes). ---
  _check_workdir(workdir)
  train_files = _expand_files(config.train_input_files, "train_input_files")
  eval_files = (_expand_files(config.eval_input_files, "eval_input_files")
                if config.eval_input_files else None)
  vocab = load_vocab(config)
  model_config = create_model_config(config, vocab)
  if config.seq_length > model_config.max_position_embeddings:
    raise ConfigError(f"config.seq_length={config.seq_length} exceeds the model's "
                      f"max_position_embeddings={model_config.max_position_embeddings}.")
  is_main = jax.process_index() == 0
  # Every host must train the same model on the same vocabulary: a mismatch is an error on all
  # hosts at start-up, not a hang in the first collective.
  distributed.assert_same_on_all_hosts("config", config.to_json_best_effort(sort_keys=True))
  vocab_hash = _file_hash(vocab.path)
  distributed.assert_same_on_all_hosts("vocab", vocab_hash or str(vocab.size))
  accum = int(config.grad_accum_steps)
  total_steps = int(config.num_train_steps) * accum     # micro-steps (one host batch each)

  # --- Mesh. ---
  try:
    mesh = sharding_lib.create_mesh(config.mesh_shape)
    sharding_lib.check_batch_size(config.batch_size, mesh, accum)
  except sharding_lib.ShardingError as e:
    raise ConfigError(str(e)) from e
  micro_batch = config.batch_size // accum
  local_batch = micro_batch // jax.process_count()
  if is_main:
    print(f"mesh {dict(mesh.shape)} on {jax.device_count()} devices, {jax.process_count()} "
          f"host(s); global batch {micro_batch} = {jax.process_count()} x {local_batch} rows per "
          f"host" + (f", {accum} micro-batches per step" if accum > 1 else ""), flush=True)
  rules = sharding_lib.LOGICAL_AXIS_RULES

  # --- Model, optimizer, shardings, compiled steps. ---
  t = build_training(config, model_config, mesh)
  model, state_shardings, param_shardings = t.model, t.state_shardings, t.param_shardings
  abstract_state, repl = t.abstract_state, sharding_lib.replicated(mesh)

  # --- State: resume > init_checkpoint > fresh init. ---
  manager = ckpt_lib.create_manager(workdir, max_to_keep=config.keep_checkpoints,
                                    keep_period=config.keep_every or None,
                                    async_save=config.async_checkpointing)
  meta_base = dict(config=json.loads(config.to_json_best_effort()),
                   model_config=model_config.to_dict(), vocab_hash=vocab_hash)
  latest = manager.latest_step()
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    if latest is not None:
      old_meta = ckpt_lib.read_meta(manager, latest)
      if old_meta["model_config"] != model_config.to_dict():
        diff = {k: (old_meta["model_config"].get(k), v) for k, v in model_config.to_dict().items()
                if old_meta["model_config"].get(k) != v}
        raise ConfigError(f"--workdir={workdir} holds a checkpoint of another model "
                          f"(checkpoint vs config: {diff}); use a new workdir or the same config.")
      state, meta = ckpt_lib.restore(manager, latest, abstract_state)
      start = int(meta["input_position"])
      print(f"resuming from step {latest // accum} in {workdir} (input position {start})",
            flush=True)
    else:
      state = t.init_state(jax.random.PRNGKey(config.seed))
      start = 0
      if config.init_checkpoint:
        state = _load_init_checkpoint(state, config.init_checkpoint, param_shardings, model_config)
  start_step = int(latest) if latest is not None else 0

  # --- Input. ---
  train_iter = input_source.make_batches(
      config, vocab, files=train_files, local_batch_size=local_batch, seed=config.seed,
      start_batch=start, process_index=jax.process_index(),
      process_count=jax.process_count())

  def eval_batches():
    return input_source.make_batches(
        config, vocab, files=eval_files, local_batch_size=local_batch, seed=config.seed + 1,
        start_batch=0, process_index=jax.process_index(), process_count=jax.process_count(),
        train=False)

  p_train_step, p_eval_step = t.train_step, t.eval_step

  # --- Preemption: SIGTERM -> save at the next step and exit cleanly. ---
  preempted = distributed.preemption_check()

  writer = metrics_writer.MetricsWriter(workdir, enabled=is_main)
  if is_main:
    writer.write_text("config", config.to_json_best_effort(indent=2))
  flops_per_step = model_flops_per_sequence(model_config, config.seq_length,
                                            config.max_predictions_per_seq) * micro_batch
  peak = device_peak_tflops()

  def run_eval(step):
    if not eval_files:
      return {}
    sums, n = {}, 0
    for _, batch in zip(range(config.eval_steps), eval_batches()):
      m = jax.device_get(p_eval_step(state["params"], sharding_lib.make_global_batch(batch, mesh)))
      for k, v in m.items():
        sums[k] = sums.get(k, 0.0) + float(v)
      n += 1
    result = {f"eval_{k}": v / max(n, 1) for k, v in sums.items()}
    writer.write_scalars(step, result)
    if is_main:
      print(f"eval @ step {step}: mlm_accuracy {result['eval_mlm_accuracy']:.4f} "
            f"mlm_loss {result['eval_mlm_loss']:.4f} nsp_accuracy "
            f"{result['eval_nsp_accuracy']:.4f}", flush=True)
    return result

  def save(step, force=False):
    meta = dict(meta_base, input_position=step, step=step)
    ckpt_lib.save(manager, step, state, meta, force=force)

  # --- The loop. ---
  history = dict(train=[], eval=[])
  last_eval = {}
  if start_step == 0 and eval_files:
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      last_eval = run_eval(0)
      history["eval"].append((0, last_eval))
  log_every = config.log_every * accum
  # `paused` excludes evaluation and checkpoint time from the throughput figures.
  t0, t_start, pending, paused = time.time(), time.time(), [], 0.0
  step = start_step
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    for step in range(start_step + 1, total_steps + 1):
      if config.profile_start_step >= 0 and step == config.profile_start_step * accum + 1:
        jax.profiler.start_trace(os.path.join(workdir, "profile"))
      batch = sharding_lib.make_global_batch(next(train_iter), mesh)
      state, metrics = p_train_step(state, batch)
      pending.append(metrics)
      if config.profile_start_step >= 0 and step == (config.profile_start_step +
                                                       config.profile_steps) * accum:
        jax.block_until_ready(state)
        jax.profiler.stop_trace()
      opt_step = step // accum
      if step % log_every == 0 or step == total_steps:
        host = jax.device_get(pending)
        avg = {k: float(np.mean([m[k] for m in host])) for k in host[0]}
        dt = time.time() - t0 - paused
        seqs = len(host) * micro_batch / dt
        avg.update(sequences_per_sec=seqs, tokens_per_sec=seqs * config.seq_length,
                   tflops=len(host) * flops_per_step / dt / 1e12)
        if peak:
          avg["mfu"] = avg["tflops"] / peak
        writer.write_scalars(opt_step, avg)
        history["train"].append((opt_step, avg))
        if is_main:
          eta = (total_steps - step) * (time.time() - t_start) / max(step - start_step, 1)
          print(f"step {opt_step}/{config.num_train_steps} | loss {avg['loss']:.4f} "
                f"(mlm {avg['mlm_loss']:.3f} acc {avg['mlm_accuracy']:.3f}, nsp "
                f"{avg['nsp_loss']:.3f} acc {avg['nsp_accuracy']:.3f}) | lr "
                f"{avg['learning_rate']:.2e} | gnorm {avg['grad_norm']:.2f} | {seqs:.1f} seq/s "
                f"{seqs * config.seq_length:.0f} tok/s {avg['tflops']:.3f} TFLOP/s"
                + (f" MFU {avg['mfu']:.1%}" if peak else "")
                + f" | ETA {_fmt_time(eta)}", flush=True)
        pending, t0, paused = [], time.time(), 0.0
      if eval_files and step % accum == 0 and (opt_step % config.eval_every == 0
                                               or step == total_steps):
        t_pause = time.time()
        last_eval = run_eval(opt_step)
        history["eval"].append((opt_step, last_eval))
        paused += time.time() - t_pause
      if step % accum == 0 and (opt_step % config.checkpoint_every == 0 or step == total_steps):
        t_pause = time.time()
        save(step)
        paused += time.time() - t_pause
      # Checked only at optimizer-step boundaries, so a saved state never holds half-accumulated
      # gradients.
      if step % accum == 0 and step < total_steps and preempted(step):
        if is_main:
          print(f"SIGTERM: saving step {opt_step} and exiting", flush=True)
        save(step, force=True)
        break
  manager.wait_until_finished()
  manager.close()
  writer.close()
  return dict(history=history, final_step=step // accum, last_eval=last_eval,
              stopped_early=step < total_steps)


def _load_init_checkpoint(state, path, param_shardings, model_config):
  """Phase 2 / fine-tune start: parameters from `path`, a fresh optimizer state."""
  try:
    params, ckpt_config, _ = ckpt_lib.load_params(path)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(str(e)) from e
  sizes = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
           "max_position_embeddings", "type_vocab_size")
  diff = {k: (getattr(ckpt_config, k), getattr(model_config, k)) for k in sizes
          if getattr(ckpt_config, k) != getattr(model_config, k)}
  if diff:
    raise ConfigError(f"init_checkpoint={path} is another model size (checkpoint vs config: "
                      f"{diff}); set --config.model_name (and the vocab) to the checkpoint's.")
  target = jax.device_get(state["params"])
  # Heads missing in a BertModel-only checkpoint keep their fresh initialisation.
  merged = dict(target)
  for k in target:
    if k in params:
      merged[k] = params[k]
  try:
    ckpt_lib.check_params_match(merged, target, f"init_checkpoint={path}")
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(str(e)) from e
  merged = jax.tree.map(lambda v, t: np.asarray(v, t.dtype), merged, target)
  state = dict(state, params=jax.device_put(merged, param_shardings))
  print(f"initialised parameters from {path} ({ckpt_config.num_layers} layers, hidden "
        f"{ckpt_config.hidden_size}); optimizer state is fresh", flush=True)
  return state


def _fmt_time(seconds):
  seconds = int(seconds)
  h, rem = divmod(seconds, 3600)
  return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                  "bert_jax/configs/pretrain.py:base[,runlocal].",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard events and logs go here.")


def main(argv):
  # Orbax and TF log every save at INFO; keep the console to our progress lines unless the user
  # asks for more with --verbosity=0.
  if not FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; pass options as --config.FIELD=V.")
  distributed.maybe_initialize_distributed()
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. "
                         "--config=bert_jax/configs/pretrain.py:tiny,runlocal")
  try:
    train_and_evaluate(FLAGS.config, FLAGS.workdir)
  except (ConfigError, ckpt_lib.CheckpointError, optimizer_lib.OptimizerError,
          distributed.DistributedSetupError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
