r"""Fine-tuning BERT end to end on GLUE, SQuAD, CoNLL-2003 NER or SWAG: one loop, top to bottom.

  python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:glue_mrpc \
      --config.init_checkpoint=gs://BUCKET/bert-base --config.vocab_file=vocab.txt \
      --config.data_dir=glue_data/MRPC --workdir=runs/mrpc

Sections: set-up and validation -> tokenizer and data -> mesh -> model, optimizer, shardings ->
state (pre-trained `bert` + fresh head) -> train/eval steps -> loop (train an epoch, evaluate,
keep the best) -> predictions of the best parameters. Outputs in --workdir:
  best_epoch{N}/          params export (bert + head) of the best dev epoch (load_params reads it)
  eval_results.json       dev metrics per epoch and the best
  predictions/            submission files (GLUE <Task>.tsv, SQuAD predictions.json +
                          nbest_predictions.json (+ null_odds.json), CoNLL columns, SWAG csv)
  tensorboard/            training loss and dev metrics
With --config.learning_rates=(5e-5,3e-5,2e-5) (the `sweep` preset) each rate runs in
WORKDIR/lr_<rate> and sweep_results.json names the best.
"""

import functools
import os
import sys
import time
from typing import Callable, NamedTuple

from absl import app, flags
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np
import optax
from flax import linen as nn

from bert_jax import checkpoint as ckpt_lib
from bert_jax import distributed
from bert_jax import finetune_tasks as ft
from bert_jax import heads
from bert_jax import metrics_writer
from bert_jax import model as model_lib
from bert_jax import optimizer as optimizer_lib
from bert_jax import sharding as sharding_lib
from data_pipelines import vocab as vocab_lib
from data_pipelines.tasks.common import TaskDataError


class ConfigError(ValueError):
  pass


# ----------------------------------------------------------------------------------------------
# Steps (pure; jitted below with explicit shardings).
# ----------------------------------------------------------------------------------------------
def _apply(model, params, batch, deterministic, rngs=None):
  return model.apply({"params": params}, batch["input_ids"], batch["input_mask"],
                     batch["segment_ids"], deterministic=deterministic, rngs=rngs)


def train_step(state, batch, *, model, family, tx, schedule):
  dropout_rng = jax.random.fold_in(state["rng"], state["step"])

  def loss(params):
    return ft.loss_fn(family, _apply(model, params, batch, False, {"dropout": dropout_rng}),
                      batch)

  (_, metrics), grads = jax.value_and_grad(loss, has_aux=True)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  metrics.update(grad_norm=optax.global_norm(grads), learning_rate=schedule(state["step"]))
  return dict(state, step=state["step"] + 1, params=optax.apply_updates(state["params"], updates),
              opt_state=opt_state), metrics


def eval_step(params, batch, *, model, family):
  return ft.predict_outputs(family, _apply(model, params, batch, True))


class Training(NamedTuple):
  model: nn.Module
  param_shardings: dict
  init_state: Callable      # rng -> sharded state dict(step, params, opt_state, rng) (jitted)
  init_opt_state: Callable  # params -> sharded optimizer state (after loading `bert`)
  train_step: Callable      # (state, global batch) -> (state, metrics); state donated
  eval_step: Callable       # (params, global batch) -> predict_outputs (replicated)


def build_training(family, model_config, config, mesh, *, num_train_steps, warmup_steps,
                   num_labels=2, num_choices=4, rules=sharding_lib.LOGICAL_AXIS_RULES):
  """The head model, AdamW with BERT's schedule, and jitted steps sharded by logical axes."""
  model = heads.create_model(family, model_config, num_labels=num_labels,
                             num_choices=num_choices)
  tx, schedule = optimizer_lib.create_optimizer(
      learning_rate=config.learning_rate, warmup_steps=warmup_steps,
      num_train_steps=num_train_steps, optimizer=config.optimizer,
      weight_decay=config.weight_decay, b1=config.b1, b2=config.b2, eps=config.eps,
      clip_norm=config.clip_norm)
  dummy = heads.dummy_inputs(family, config.max_seq_length, num_choices=num_choices)

  def init_params(rng, unbox=False):
    with nn.logical_axis_rules(()):  # placement comes from out_shardings (see train.py)
      params = model.init({"params": rng, "dropout": rng}, *dummy, deterministic=True)["params"]
      return nn.unbox(params) if unbox else params

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract = jax.eval_shape(init_params, jax.random.PRNGKey(0))
    param_shardings = sharding_lib.logical_to_sharding(nn.get_partition_spec(abstract), mesh,
                                                       rules)
    abstract_params = jax.eval_shape(functools.partial(init_params, unbox=True),
                                     jax.random.PRNGKey(0))
    abstract_opt = jax.eval_shape(tx.init, abstract_params)
  repl = sharding_lib.replicated(mesh)
  state_shardings = sharding_lib.train_state_shardings(tx, abstract_opt, param_shardings, mesh)
  opt_shardings = state_shardings["opt_state"]
  batch_sharding = sharding_lib.batch_sharding(mesh)

  def init_state(rng):
    params = init_params(rng, unbox=True)
    return dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                rng=jax.random.fold_in(rng, 1))

  return Training(
      model=model, param_shardings=param_shardings,
      init_state=jax.jit(init_state, out_shardings=state_shardings),
      init_opt_state=jax.jit(tx.init, out_shardings=opt_shardings),
      train_step=jax.jit(functools.partial(train_step, model=model, family=family, tx=tx,
                                           schedule=schedule),
                         in_shardings=(state_shardings, batch_sharding),
                         out_shardings=(state_shardings, repl), donate_argnums=(0,)),
      eval_step=jax.jit(functools.partial(eval_step, model=model, family=family),
                        in_shardings=(param_shardings, batch_sharding), out_shardings=repl))


# ----------------------------------------------------------------------------------------------
# Set-up helpers.
# ----------------------------------------------------------------------------------------------
def load_init_checkpoint(config, vocab):
  """(bert params or None, head params or None, BertConfig) from config.init_checkpoint.

  Accepts a params export (conversion, or a fine-tuning run's best_epoch*), a pre-training
  workdir or step directory. Dropout, dtype and remat come from config.model.
  """
  overrides = {k: v for k, v in config.model.items() if v is not None}
  if not config.init_checkpoint:
    if not config.model_name:
      raise ConfigError("config.init_checkpoint is empty: pass a pre-trained checkpoint (a "
                        "`python -m bert_jax.convert` export or a pre-training workdir); "
                        "config.model_name=tiny trains from scratch (tests only).")
    print(f"warning: no init_checkpoint; {config.model_name} starts from random weights",
          flush=True)
    return None, None, model_lib.get_bert_config(config.model_name, vocab_size=vocab.size,
                                                 **overrides)
  try:
    params, model_config, meta = ckpt_lib.load_params(config.init_checkpoint)
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(str(e)) from e
  stored_case = meta.get("do_lower_case")
  if stored_case is not None and bool(stored_case) != bool(config.do_lower_case):
    raise ConfigError(f"config.do_lower_case={config.do_lower_case} but init_checkpoint was "
                      f"trained with do_lower_case={stored_case}; set "
                      f"--config.do_lower_case={stored_case}.")
  if model_config.vocab_size != vocab.size:
    raise ConfigError(f"init_checkpoint={config.init_checkpoint} has vocab_size="
                      f"{model_config.vocab_size} but {vocab.path} has {vocab.size} tokens; use "
                      "the vocab the checkpoint was trained with.")
  model_config = model_lib.BertConfig(**{**model_config.to_dict(), **overrides})
  bert = params.get("bert", params if "embeddings" in params else None)
  if bert is None:
    raise ConfigError(f"init_checkpoint={config.init_checkpoint}: no 'bert' parameters "
                      f"(top-level keys {sorted(params)}).")
  head = {k: v for k, v in params.items() if k != "bert"} if "bert" in params else {}
  return bert, head, model_config


def _splits_batches(n, batch_size, rng=None):
  """Index arrays of full batches (training: shuffled, remainder dropped) or padded eval ones."""
  if rng is not None:
    order = rng.permutation(n)
    return [order[i:i + batch_size] for i in range(0, n - batch_size + 1, batch_size)]
  return [np.arange(i, min(i + batch_size, n)) for i in range(0, n, batch_size)]


def _host_batch(features, keys, idx, batch_size):
  """This host's rows of a global batch; eval batches are padded with weight-0 copies of row 0."""
  pad = batch_size - len(idx)
  full = np.concatenate([idx, np.full(pad, idx[0])]) if pad else idx
  weights = np.concatenate([np.ones(len(idx), np.float32), np.zeros(pad, np.float32)])
  per_host = batch_size // jax.process_count()
  rows = slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)
  batch = {k: features[k][full[rows]] for k in keys}
  batch["example_weights"] = weights[rows]
  return batch


# ----------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------
def finetune(config: ml_collections.ConfigDict, workdir: str):
  """Trains, evaluates each epoch, keeps the best and writes predictions; returns a summary."""
  if config.learning_rates:
    return _sweep(config, workdir)

  # --- Set-up and validation: every bad input fails here, before any compute. ---
  if not workdir:
    raise ConfigError("--workdir is empty: pass a directory for checkpoints and predictions.")
  from data_pipelines import tokenization  # TF: imported only when a run starts
  if not (config.vocab_file or config.spm_model_file) and config.init_checkpoint:
    # `python -m bert_jax.convert` exports carry their vocab.txt.
    bundled = os.path.join(config.init_checkpoint, "vocab.txt")
    if os.path.isfile(bundled):
      config = ml_collections.ConfigDict(config.to_dict())
      config.vocab_file = bundled
  try:
    tokenizer = tokenization.get_tokenizer(
        vocab_file=config.vocab_file or None, spm_model_file=config.spm_model_file or None,
        do_lower_case=config.do_lower_case)
  except vocab_lib.VocabError as e:
    raise ConfigError(str(e).replace("--", "config.")) from e
  task = ft.build_task(config)
  family = task.family
  bert_params, head_params, model_config = load_init_checkpoint(config, tokenizer.vocab)
  if config.max_seq_length > model_config.max_position_embeddings:
    raise ConfigError(f"config.max_seq_length={config.max_seq_length} exceeds the model's "
                      f"max_position_embeddings={model_config.max_position_embeddings}.")
  is_main = jax.process_index() == 0

  # --- Data: every split as numpy features, read before the model is built. ---
  eval_names, test_names = ft.available_splits(task, config)
  train = ft.load_split(task, "train", tokenizer, config, True) if config.do_train else None
  evals = [ft.load_split(task, s, tokenizer, config, False) for s in eval_names] \
      if config.do_eval else []
  tests = [ft.load_split(task, s, tokenizer, config, False) for s in test_names] \
      if config.do_predict else []
  if is_main:
    for s in [train] + evals + tests:
      if s is not None:
        print(f"{task.name}/{s.name}: {len(s.examples)} examples, "
              f"{len(s.features['input_ids'])} sequences"
              + (f" ({s.notes})" if s.notes else ""), flush=True)
  if config.do_eval and not evals:
    raise ConfigError(f"{task.name}: no dev file in config.data_dir={config.data_dir} "
                      f"(expected {[task.files.get(s) for s in task.eval_splits]}).")

  # --- Mesh. ---
  try:
    mesh = sharding_lib.create_mesh(config.mesh_shape)
    sharding_lib.check_batch_size(config.batch_size, mesh)
    sharding_lib.check_batch_size(config.eval_batch_size, mesh)
  except sharding_lib.ShardingError as e:
    raise ConfigError(str(e)) from e
  rules = sharding_lib.LOGICAL_AXIS_RULES

  # --- Schedule: epochs -> steps, 10% warmup (the paper's and google-research/bert's). ---
  steps_per_epoch = 1
  if train is not None:
    n_train = len(train.features["input_ids"])
    steps_per_epoch = n_train // config.batch_size
    if steps_per_epoch == 0:
      raise ConfigError(f"config.batch_size={config.batch_size} exceeds the {n_train} training "
                        "sequences; lower the batch size.")
  num_train_steps = max(1, int(config.num_train_epochs * steps_per_epoch))
  warmup_steps = int(config.warmup_proportion * num_train_steps)

  # --- Model, optimizer, shardings and the compiled steps. ---
  t = build_training(family, model_config, config, mesh, num_train_steps=num_train_steps,
                     warmup_steps=warmup_steps, num_labels=getattr(task, "num_labels", 2),
                     num_choices=getattr(task, "num_choices", 4))
  param_shardings, p_train, p_eval = t.param_shardings, t.train_step, t.eval_step

  # --- State: pre-trained `bert`, a freshly initialised head (or the checkpoint's head when
  # only evaluating a fine-tuned export). ---
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    state = t.init_state(jax.random.PRNGKey(config.seed))
    params = _merge_pretrained(state["params"], bert_params, head_params, param_shardings,
                               config)
    state = dict(state, params=params, opt_state=t.init_opt_state(params))

  input_keys = ft.INPUT_KEYS + ft.LABEL_KEYS[family]

  # --- Resume: a preempted run continues from its last epoch end or SIGTERM save. ---
  manager = ckpt_lib.create_manager(workdir, max_to_keep=1, async_save=False) \
      if train is not None else None
  resume = None
  if manager is not None and manager.latest_step() is not None:
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                            state)
    with jax.set_mesh(mesh):
      state, resume = ckpt_lib.restore(manager, manager.latest_step(), abstract)
    if resume["num_train_steps"] != num_train_steps or resume["task"] != task.name:
      raise ConfigError(f"--workdir={workdir} holds a {resume['task']} run of "
                        f"{resume['num_train_steps']} steps, not {task.name} with "
                        f"{num_train_steps}; use a new workdir.")
    if is_main:
      print(f"resuming from step {resume['step']} (epoch {resume['epoch']}, batch "
            f"{resume['batch_in_epoch']}) in {workdir}", flush=True)

  def predict(params, split):
    """Host numpy outputs for every sequence of a split, in order."""
    outs = []
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
      for idx in _splits_batches(len(split.features["input_ids"]), config.eval_batch_size):
        batch = _host_batch(split.features, input_keys, idx, config.eval_batch_size)
        out = jax.device_get(p_eval(params, sharding_lib.make_global_batch(batch, mesh)))
        outs.append({k: v[:len(idx)] for k, v in out.items()})
    return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]} if outs else {}

  writer = metrics_writer.MetricsWriter(workdir, enabled=is_main)
  primary = ft.primary_metric(task)
  history, best = [], {"score": -np.inf, "epoch": None, "params": None, "outputs": None,
                       "dir": None}
  if resume is not None:
    history = resume["history"]
    best.update(score=resume["best_score"], epoch=resume["best_epoch"], dir=resume["best_dir"])

  def run_eval(epoch, step):
    results, outputs = {}, {}
    for split in evals:
      outputs[split.name] = predict(state["params"], split)
      scores = ft.evaluate(task, split, outputs[split.name], tokenizer, config)
      results.update({f"{split.name}/{k}": v for k, v in scores.items()})
    writer.write_scalars(step, {f"eval/{k}": v for k, v in results.items()})
    score = results[f"{evals[0].name}/{primary}"]
    history.append(dict(epoch=epoch, step=step, **results))
    if is_main:
      print(f"eval epoch {epoch} (step {step}): "
            + ", ".join(f"{k} {v:.4f}" for k, v in results.items()), flush=True)
    if score > best["score"]:
      best.update(score=score, epoch=epoch, params=jax.device_get(state["params"]),
                  outputs=outputs)
      # Without training the parameters are init_checkpoint's own: nothing new to save.
      best["dir"] = (_save_best(workdir, best, model_config, task, config, results)
                     if train is not None else config.init_checkpoint)
    ft.dump_json(os.path.join(workdir, "eval_results.json"),
                 dict(history=history, best_epoch=best["epoch"], best_metric=primary,
                      best_score=float(best["score"]), best_checkpoint=best["dir"]))

  # --- The loop: an epoch of shuffled full batches, then the dev sets. ---
  def save(step, epoch, batch_in_epoch):
    ckpt_lib.save(manager, step, state, dict(
        task=task.name, num_train_steps=num_train_steps, step=step, epoch=epoch,
        batch_in_epoch=batch_in_epoch, history=history, best_score=float(best["score"]),
        best_epoch=best["epoch"], best_dir=best["dir"], model_config=model_config.to_dict(),
        input_position=step), force=True)
    manager.wait_until_finished()

  # SIGTERM (preemption): save at the next step and stop; a re-run resumes.
  preempted = distributed.preemption_check() if train is not None else None

  t0, seen, step = time.time(), 0, 0
  stopped_early = False
  if train is not None:
    epoch = 0
    skip = 0
    if resume is not None:
      step, epoch, skip = resume["step"], resume["epoch"], resume["batch_in_epoch"]
      if skip == 0:
        epoch += 1  # saved at an epoch end: the next epoch starts fresh
      epoch -= 1    # the loop below increments first
    while step < num_train_steps and not stopped_early:
      epoch += 1
      pending = []
      # Each epoch's order is a function of (seed, epoch) alone, so a resumed run replays it.
      rng = np.random.default_rng([config.seed, epoch])
      with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        batches = _splits_batches(len(train.features["input_ids"]), config.batch_size, rng)
        for i, idx in enumerate(batches):
          if i < skip:
            continue
          if step >= num_train_steps:
            break
          batch = _host_batch(train.features, input_keys, idx, config.batch_size)
          state, m = p_train(state, sharding_lib.make_global_batch(batch, mesh))
          pending.append(m)
          step += 1
          seen += config.batch_size
          if step == 1:  # throughput without the compilation of the first step
            jax.block_until_ready(m)
            t0, seen = time.time(), 0
          if step % config.log_every == 0 or step == num_train_steps:
            host = jax.device_get(pending)
            avg = {k: float(np.mean([x[k] for x in host])) for k in host[0]}
            avg["sequences_per_sec"] = seen / max(time.time() - t0, 1e-9)
            writer.write_scalars(step, {f"train/{k}": v for k, v in avg.items()})
            if is_main:
              print(f"epoch {epoch} step {step}/{num_train_steps} | loss {avg['loss']:.4f} | gnorm {avg['grad_norm']:.3f} | "
                    f"lr {avg['learning_rate']:.2e} | {avg['sequences_per_sec']:.1f} seq/s",
                    flush=True)
            pending = []
          if step < num_train_steps and preempted(step):
            save(step, epoch, i + 1)
            if is_main:
              print(f"SIGTERM: saved step {step} (epoch {epoch}, batch {i + 1}); re-run the "
                    "same command to resume", flush=True)
            stopped_early = True
            break
      skip = 0
      if stopped_early:
        break
      if evals:
        run_eval(epoch, step)
      if step < num_train_steps:
        save(step, epoch, 0)
      t0, seen = time.time(), 0  # evaluation time is not training throughput
  elif evals:
    run_eval(0, 0)

  if stopped_early:
    writer.close()
    return dict(task=task.name, stopped_early=True, steps=step, history=history)
  if manager is not None:
    manager.close()
    # Training finished: the best-epoch export is the product; the resume state goes, so a
    # re-run of the same command starts over instead of replaying the last epoch.
    if is_main:
      ckpt_lib.remove_dir(os.path.join(os.path.abspath(workdir), "checkpoints"))

  # --- Predictions of the best parameters (or the final ones when nothing was evaluated). ---
  out_dir = os.path.join(workdir, "predictions")
  if best["params"] is None and best["dir"] and train is not None:
    # The best epoch came before a resume: its export holds the parameters.
    best["params"] = ckpt_lib.load_params(best["dir"])[0]
    with jax.set_mesh(mesh):
      best_device = jax.device_put(best["params"], param_shardings)
    best["outputs"] = {split.name: predict(best_device, split) for split in evals}
  final_params = best["params"] if best["params"] is not None else jax.device_get(
      state["params"])
  written = []
  with jax.set_mesh(mesh):
    device_params = jax.device_put(final_params, param_shardings)
  for split in evals:
    if family in ("span", "tagging") and is_main:  # dev prediction files (SQuAD: the submission)
      ft.evaluate(task, split, best["outputs"][split.name], tokenizer, config, out_dir)
      written.append(split.name)
  for split in tests:
    outputs = predict(device_params, split)
    if is_main:
      written += ft.write_test(task, split, outputs, tokenizer, config, out_dir)
  writer.close()
  summary = dict(task=task.name, best_epoch=best["epoch"], best_metric=primary,
                 best_score=None if best["epoch"] is None else float(best["score"]),
                 best_checkpoint=best["dir"], history=history, steps=step, predictions=written)
  if is_main:
    print(f"done: best {primary} {summary['best_score']} at epoch {best['epoch']}; "
          f"checkpoint {best['dir']}; predictions in {out_dir}", flush=True)
  return summary


def _merge_pretrained(params, bert_params, head_params, param_shardings, config):
  if bert_params is None:
    return params
  target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)
  try:
    ckpt_lib.check_params_match(bert_params, target["bert"],
                                f"init_checkpoint={config.init_checkpoint}")
  except ckpt_lib.CheckpointError as e:
    raise ConfigError(str(e)) from e
  merged = dict(params)
  merged["bert"] = jax.device_put(
      jax.tree.map(lambda v, t: np.asarray(v, t.dtype), bert_params, target["bert"]),
      param_shardings["bert"])
  if not config.do_train:
    # Evaluating/predicting with a fine-tuned export: its head must match this task's.
    for k in params:
      if k == "bert":
        continue
      if k not in head_params:
        raise ConfigError(f"config.do_train=False but init_checkpoint has no '{k}' head; point "
                          "it at a fine-tuned best_epoch* export of this task.")
      try:
        ckpt_lib.check_params_match(head_params[k], target[k], f"init_checkpoint head {k}")
      except ckpt_lib.CheckpointError as e:
        raise ConfigError(str(e)) from e
      merged[k] = jax.device_put(jax.tree.map(lambda v, t: np.asarray(v, t.dtype),
                                              head_params[k], target[k]), param_shardings[k])
  return merged


def _save_best(workdir, best, model_config, task, config, results):
  """Exports the best params as workdir/best_epoch{N} and removes the previous best."""
  # Every host calls this: Orbax coordinates the hosts and writes from the primary one.
  path = os.path.join(workdir, f"best_epoch{best['epoch']}")
  ckpt_lib.remove_dir(path)  # a re-run into the same workdir
  ckpt_lib.save_params(path, best["params"], model_config, meta=dict(
      task=task.name, epoch=best["epoch"], do_lower_case=bool(config.do_lower_case),
      labels=list(getattr(task, "labels", ()) or ()), dev_metrics=results))
  previous = best.get("dir")
  if previous and previous != path:
    ckpt_lib.remove_dir(previous)
  return path


def _sweep(config, workdir):
  """The paper's grid over learning rates: one run each, the best by dev metric."""
  runs = []
  for lr in config.learning_rates:
    c = ml_collections.ConfigDict(config.to_dict())
    c.learning_rates = ()
    c.learning_rate = float(lr)
    runs.append(dict(learning_rate=float(lr),
                     **finetune(c, os.path.join(workdir, f"lr_{lr:g}"))))
  scored = [r for r in runs if r["best_score"] is not None]
  best = max(scored, key=lambda r: r["best_score"]) if scored else None
  summary = dict(runs=[{k: r[k] for k in ("learning_rate", "best_score", "best_epoch",
                                          "best_checkpoint")} for r in runs],
                 best_learning_rate=best and best["learning_rate"],
                 best_checkpoint=best and best["best_checkpoint"])
  if jax.process_index() == 0:
    ft.dump_json(os.path.join(workdir, "sweep_results.json"), summary)
    print(f"sweep: best learning rate {summary['best_learning_rate']}", flush=True)
  return summary


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                  "bert_jax/configs/finetune.py:glue_mrpc[,runlocal][,sweep].",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Best checkpoint, eval results and predictions go here.")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; pass options as --config.FIELD=V.")
  if FLAGS.config is None:
    raise app.UsageError("--config is required, e.g. "
                         "--config=bert_jax/configs/finetune.py:glue_mrpc")
  # The same multi-host start-up as pre-training (a no-op on one host).
  distributed.maybe_initialize_distributed()
  try:
    finetune(FLAGS.config, FLAGS.workdir)
  except (ConfigError, TaskDataError, ckpt_lib.CheckpointError, vocab_lib.VocabError,
          optimizer_lib.OptimizerError, sharding_lib.ShardingError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  define_flags()
  app.run(main)
