r"""Fine-tuning BERT end to end on GLUE, SQuAD, CoNLL-2003 NER or SWAG: one loop, top to bottom.

  python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:glue_mrpc \
      --config.init_checkpoint=gs://BUCKET/bert-base --config.vocab_file=vocab.txt \
      --config.data_dir=glue_data/MRPC --workdir=runs/mrpc

--config.init_checkpoint may be any family's checkpoint (its pre-training workdir, an export or a
transformers folder): params["bert"] is fine-tuned under the family's head on [CLS]
(bert_jax/families/<name>.py: an ELECTRA's discriminator gets transformers' dense + GELU head, a
DistilBERT transformers' pre_classifier + ReLU + classifier), and the run says so.
Task-specific distillation (classification): --config.distill_teacher=RUN/best_epoch{N} (a
fine-tuned teacher of the same task and vocab, e.g. BERT-base teaching a DistilBERT) adds its
soft labels (--config.distill_temperature, --config.distill_alpha; ft.distill_loss_fn); the
teacher runs frozen inside each jitted step (trainer_lib's frozen network, as pre-training's).

Sections: set-up and validation -> tokenizer and data -> mesh -> model, optimizer, shardings ->
state (pre-trained `bert` + fresh head) -> train/eval steps -> loop (train an epoch, evaluate,
keep the best) -> predictions of the best parameters -> the summary. Outputs in --workdir:
  best_epoch{N}/          params export (bert + head) of the best dev epoch (load_params reads it)
  eval_results.json       dev metrics per epoch and the best
  summary.json            what the run did (time, steps, final dev metrics, the best export, the
                          next commands), as pre-training writes it (metrics_writer.write_summary)
  predictions/            submission files (GLUE <Task>.tsv, SQuAD predictions.json +
                          nbest_predictions.json (+ null_odds.json), CoNLL columns, SWAG csv)
  tensorboard/            training loss and dev metrics
With --config.learning_rates=(5e-5,4e-5,3e-5,2e-5) (the `sweep` preset) each rate runs in
WORKDIR/lr_<rate> and sweep_results.json names the best. A workdir whose run finished is left
as it is: running the command again says so and does nothing (an interrupted one resumes).
"""

import dataclasses
import functools
import json
import math
import os
from typing import Any, NamedTuple

from absl import flags
from etils import epath
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np

from bert_jax.layers import attention
from bert_jax.checkpoint import checkpoint_fit
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.parallel import distributed
from bert_jax import families
from bert_jax import cli
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax.training import finetune_tasks as ft
from bert_jax.training import guard
from bert_jax.models import heads
from bert_jax.inference import loading as inference
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.evaluation import metrics_writer
from bert_jax.models import model as model_lib
from bert_jax.training import optimizer as optimizer_lib
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import tasks as task_types
from bert_jax.training import trainer_lib
from bert_jax.checkpoint import workdir_lock

ConfigError = trainer_lib.ConfigError  # one class for config problems in both loops
RESULTS = "eval_results.json"


# ----------------------------------------------------------------------------------------------
# Model call and compiled steps (trainer_lib builds them).
# ----------------------------------------------------------------------------------------------
def forward(module, batch, deterministic):
  """A heads.py model on a batch dict -> the head's outputs (see finetune_tasks.loss_fn)."""
  packed = {k: batch[k] for k in model_lib.PACKED_ROW_KEYS if k in batch}  # packed rows only
  return module(batch["input_ids"], batch["input_mask"], batch["segment_ids"],
                deterministic=deterministic, **packed)


def pack_train(train, task, config):
  """config.pack: the training split's sequences packed into rows (classification and
  regression; evaluation stays unpacked, so metrics are unchanged). docs/packing.md. A type
  that packs each batch instead (embedding: pack_batches) keeps the split as it is here."""
  if train is None or not config.get("pack", False):
    return train
  if not task_types.of(task).packable:
    raise ConfigError(f"config.pack=True: packing is for sentence(-pair) classification, "
                      f"regression and embedding; task {task.name} is {task.type}: set "
                      "--config.pack=false.")
  if task_types.of(task).pack_batches:
    return train
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  f = train.features
  k = config.get("max_instances_per_pack", 0) or packing.default_max_instances(
      f["input_ids"].shape[1])
  packed = packing.pack_examples(f, max_instances=k, seed=config.seed)
  if jax.process_index() == 0:
    print(f"{task.name}/train: packed {len(f['input_ids'])} sequences into "
          f"{len(packed['input_ids'])} rows of up to {k}: real tokens per slot "
          f"{f['input_mask'].mean():.3f} -> {packed['input_mask'].mean():.3f}", flush=True)
  return dataclasses.replace(train, features=packed)


def build_training(task_type, model_config, config, mesh, *, num_train_steps, warmup_steps,
                   num_labels=2, num_choices=4, rules=sharding_lib.LOGICAL_AXIS_RULES,
                   teacher=None) -> trainer_lib.Steps:
  """The head model of `task_type` (a bert_jax/tasks name, or tasks.of(task): bound to the
  task's settings), AdamW with BERT's schedule, and jitted steps sharded by logical axes.
  teacher: a DistillTeacher (config.distill_teacher): run frozen in the steps, its logits the
  soft labels of ft.distill_loss_fn."""
  model = heads.create_model(task_type, model_config, num_labels=num_labels,
                             num_choices=num_choices)
  tx, schedule = optimizer_lib.from_config(config, num_train_steps=num_train_steps,
                                           warmup_steps=warmup_steps, model_config=model_config)
  ids, mask, segments = heads.dummy_inputs(task_type, config.max_seq_length, num_choices)
  dummy = dict(input_ids=ids, input_mask=mask, segment_ids=segments)
  loss_fn, frozen = functools.partial(ft.loss_fn, task_type), None
  if teacher is not None:
    if teacher.output_key == "teacher_logits":   # soft labels; a task type's own teacher's
      loss_fn = functools.partial(ft.distill_loss_fn, task_type,   # outputs its loss reads
                                  float(config.distill_alpha), float(config.distill_temperature))
    frozen = teacher_frozen(teacher, dummy, mesh, rules)
  # The task type's own way to take the gradient (embedding: GradCache), checked here, before
  # compute; None: jax.value_and_grad of the loss.
  train_grads = task_types.resolve(task_type).train_grads
  return trainer_lib.build_steps(
      model=model, forward=forward, loss_fn=loss_fn,
      eval_fn=lambda outputs, batch: ft.predict_outputs(task_type, outputs),
      dummy_batch=dummy, tx=tx, schedule=schedule, mesh=mesh, rules=rules, frozen=frozen,
      grads_fn=train_grads(mesh, config.batch_size) if train_grads else None)


# ----------------------------------------------------------------------------------------------
# Task-specific distillation: a fine-tuned teacher's soft labels (config.distill_teacher).
# ----------------------------------------------------------------------------------------------
class DistillTeacher(NamedTuple):
  model: Any                     # heads.BertForSequenceClassification of the teacher's config
  pretrained: trainer_lib.Pretrained
  line: str                      # what was loaded, for the start-up print
  record: dict = None            # {path, directory, sha256}: the teacher by content (resume)
  output_key: str = "teacher_logits"   # the batch key of its outputs (a task type's teacher:
                                       #   TaskType.load_teacher, e.g. embedding's vectors)


def distill_teacher_record(path, directory):
  """The teacher as the resume state records it: by content, the sha256 of its export's
  manifest (which lists every file's sha256), so the same export under another spelling of its
  path is the same teacher and another export behind the same path is not (issue 32: paths
  were compared as strings; a trailing '/' was refused)."""
  directory = str(directory)
  manifest = os.path.join(directory, manifest_lib.NAME)
  return dict(path=path, directory=directory,
              sha256=manifest_lib.sha256_file(manifest) if manifest_lib.has_manifest(directory)
              else None)


def check_same_distill_teacher(was, now, workdir):
  """A resumed run keeps its teacher: `was` (the resume state's record; a path string in runs
  from before records) against `now` (this run's record or None); one line naming both."""
  def same():
    if not was or not now:
      return not was and not now
    if isinstance(was, dict) and was.get("sha256") and now.get("sha256"):
      return was["sha256"] == now["sha256"]
    old = was.get("directory") if isinstance(was, dict) else was    # no hash: where it lives
    return os.path.realpath(str(old)) == os.path.realpath(now["directory"])
  if not same():
    side = lambda r: ("none" if not r else r if isinstance(r, str) else  # noqa: E731
                      f"{r['path']} (sha256 {str(r.get('sha256'))[:16]})")
    raise ConfigError(f"--workdir={workdir} holds a run distilled from {side(was)}, not "
                      f"--config.distill_teacher={side(now)}; use the same teacher or a new "
                      "workdir.")


def load_distill_teacher(config, task, tokenizer):
  """The DistillTeacher of config.distill_teacher, or None; checked before compute, reads no
  array: a fine-tuning export (best_epoch{N}/) of this task, with its labels in the same order,
  trained on the student's vocab (sha256) and casing; any of its families (BERT, ALBERT,
  ELECTRA, DistilBERT), any size."""
  path = config.get("distill_teacher", "")
  own = task_types.of(task).load_teacher   # the task type's own (embedding: teacher_checkpoint)
  if own is not None and not path:
    return own(task, config, tokenizer) if config.do_train else None
  if not path:
    return None
  where = f"config.distill_teacher={path}"
  if not task_types.of(task).soft_labels:
    raise ConfigError(f"{where}: soft labels are for classification; task {task.name} is "
                      f"{task.type}: drop --config.distill_teacher.")
  if not config.do_train:
    raise ConfigError(f"{where} with do_train=false: the teacher only teaches a training run; "
                      "drop one of them.")
  if not 0.0 <= config.distill_alpha <= 1.0 or config.distill_temperature <= 0:
    raise ConfigError(f"config.distill_alpha={config.distill_alpha} (0..1) and "
                      f"config.distill_temperature={config.distill_temperature} (> 0): set them "
                      "in range (defaults 0.5 and 2.0).")
  vocab = str(tokenizer.vocab.path)
  spm = vocab.endswith(".model")
  # The student's own vocab and casing, passed in: a teacher trained on another vocab (its
  # recorded sha256) or casing is a one-line error from the same checks as --init_checkpoint.
  found = inference.load_for_inference(
      path, vocab_file=None if spm else vocab, spm_model_file=vocab if spm else None,
      do_lower_case=bool(tokenizer.do_lower_case), with_params=False)
  meta = found.meta
  if meta.get("epoch") is None:
    raise ConfigError(f"{where}: {found.description} is not a fine-tuning export (no task "
                      "head); pass a bert_jax.finetune run's best_epoch{N}/ directory.")
  if meta.get("task") != task.name:
    raise ConfigError(f"{where}: fine-tuned on {meta.get('task')!r}, not {task.name!r}; pass "
                      f"a best_epoch{{N}}/ export of a {task.name} run.")
  labels = list(getattr(task, "labels", ()) or ())
  if list(meta.get("labels") or ()) != labels:
    raise ConfigError(f"{where}: its labels {meta.get('labels')} are not this run's {labels} "
                      "(names and order must match: the soft labels are per class index).")
  teacher_config = ckpt_lib.config_from_checkpoint(
      found.config, {"dtype": config.model.dtype}, where)
  trainer_lib.check_max_length(config.max_seq_length, "max_seq_length", teacher_config)
  model = heads.create_model(task.type, teacher_config,
                             num_labels=getattr(task, "num_labels", 2))
  c, a = teacher_config, float(config.distill_alpha)
  line = (f"distill_teacher: {found.description} ({c.family}, {c.num_layers} layers of width "
          f"{c.hidden_size}, fine-tuned on {task.name}); soft labels at temperature "
          f"{config.distill_temperature:g}: loss = {a:g} x T^2 x KL(teacher || student) + "
          f"{1 - a:g} x cross-entropy on the labels; the teacher runs frozen in every step "
          f"({c.dtype})")
  return DistillTeacher(model, trainer_lib.read_pretrained(found.checkpoint), line,
                        distill_teacher_record(path, found.path))


def teacher_frozen(teacher, dummy, mesh, rules):
  """The teacher as trainer_lib's frozen network: every parameter it has (body and head) read
  once into the shardings its logical axes give; its logits [B, (K,) L] float32 join the batch
  as "teacher_logits" (a task type's teacher: its output_key, e.g. embedding's
  "teacher_vectors" [B, S, G]), deterministic and under stop_gradient."""
  model = teacher.model

  def apply(params, batch):
    logits = model.apply({"params": params}, batch, True, method=forward)
    return {teacher.output_key: jax.lax.stop_gradient(logits.astype(jnp.float32))}

  abstract = jax.eval_shape(
      lambda r: model.init(r, dummy["input_ids"], dummy["input_mask"], dummy["segment_ids"]),
      jax.ShapeDtypeStruct((2,), jnp.uint32))
  return trainer_lib.load_frozen(teacher.pretrained, model, forward, dummy,
                                 tuple(abstract["params"]), mesh, apply, rules)


# ----------------------------------------------------------------------------------------------
# Set-up helpers: all of them run before any compute.
# ----------------------------------------------------------------------------------------------
def load_init_checkpoint(config):
  """(tokenizer, trainer_lib.Pretrained or None, BertConfig) for config.init_checkpoint; reads
  no array.

  Accepts a params export (conversion, or a fine-tuning run's best_epoch*), a pre-training
  workdir or step directory (local or gs://). The tokenizer and its casing are found and checked
  as for inference (inference.load_for_inference: the checkpoint's own vocab unless
  config.vocab_file / spm_model_file is given). Dropout, dtype and remat come from config.model.
  """
  from data_pipelines.tokenizers import tokenization  # pylint: disable=g-import-not-at-top  (TF)
  overrides = {k: v for k, v in config.model.items() if v is not None}
  if not config.init_checkpoint:
    if not config.model_name:
      raise ConfigError("config.init_checkpoint is empty: pass a pre-trained checkpoint (a "
                        "`python -m bert_jax.convert` export or a pre-training workdir); "
                        "config.model_name=tiny trains from scratch (tests only).")
    print(f"warning: no init_checkpoint; {config.model_name} starts from random weights",
          flush=True)
    tokenizer = tokenization.get_tokenizer(
        vocab_file=config.vocab_file or None, spm_model_file=config.spm_model_file or None,
        do_lower_case=config.do_lower_case)
    return tokenizer, None, model_lib.get_bert_config(
        config.model_name, vocab_size=tokenizer.vocab.size, **overrides)
  found = inference.load_for_inference(
      config.init_checkpoint, vocab_file=config.vocab_file or None,
      spm_model_file=config.spm_model_file or None, do_lower_case=config.do_lower_case,
      with_params=False)
  pre = trainer_lib.read_pretrained(found.checkpoint)  # described once, by load_for_inference
  if trainer_lib.stored_subtree(pre, "bert") is None:
    raise ConfigError(f"init_checkpoint={config.init_checkpoint}: no 'bert' parameters "
                      f"(top-level keys {sorted(pre.params_meta)}).")
  if jax.process_index() == 0:
    print(f"init_checkpoint: {found.description}", flush=True)
    note = families.get(found.config.family).describe(found.config, "finetune",
                                                      tuple(pre.params_meta), config.do_train)
    if note:   # what of the checkpoint the family fine-tunes (ELECTRA: the discriminator)
      print(note, flush=True)
  return (found.tokenizer, pre._replace(path=config.init_checkpoint),
          ckpt_lib.config_from_checkpoint(found.config, overrides,
                                          f"init_checkpoint={config.init_checkpoint}"))


def load_splits(task, tokenizer, config):
  """(train or None, [dev splits], [test splits]) as numpy features."""
  eval_names, test_names = ft.available_splits(task, config)
  train = ft.load_split(task, "train", tokenizer, config, True) if config.do_train else None
  evals = ([ft.load_split(task, s, tokenizer, config, False) for s in eval_names]
           if config.do_eval else [])
  tests = ([ft.load_split(task, s, tokenizer, config, False) for s in test_names]
           if config.do_predict else [])
  if jax.process_index() == 0:
    for s in [train] + evals + tests:
      if s is not None:
        print(f"{task.name}/{s.name}: {len(s.examples)} examples, "
              f"{len(s.features['input_ids'])} sequences"
              + (f" ({s.notes})" if s.notes else ""), flush=True)
  if config.do_eval and not evals:
    raise ConfigError(f"{task.name}: no dev file in config.data_dir={config.data_dir} "
                      f"(expected {[task.files.get(s) for s in task.eval_splits]}).")
  return train, evals, tests


# The small-model rule for fine-tuning hyper-parameters left unset (learning_rate / num_train_epochs
# None). The paper's values (Devlin et al. 2018, A.3: lr 2e-5..5e-5, 2-4 epochs) are for
# BERT-base/large. For the smaller BERTs, Turc et al. 2019 ("Well-Read Students Learn Better",
# the 24 BERT miniatures of google-research/bert's README) searched lr in {3e-4, 1e-4, 5e-5,
# 3e-5}, 4 epochs: the smaller the model, the larger its best rate. Our rule interpolates between
# the two: lr = paper_lr * (768 / H)^1.5, at most 3e-4 (2e-5 -> 3.8e-5 at H=512, 1.0e-4 at H=256,
# 2.9e-4 at H=128; the exponent is ours, fitted to that grid's end points), and at least 4 epochs
# below H=768. Small training sets also need more optimizer steps than a few epochs give
# (Mosbach et al. 2021, "On the Stability of Fine-tuning BERT", train small GLUE sets 20 epochs):
# below H=768 we add epochs until the run makes at least 100 optimizer steps (our floor), at most
# 20 epochs. Measured on the quick-start model (issue 22): lr 2e-5 for 18 steps predicted one
# class; a larger rate and more epochs learned the task.
PAPER_HIDDEN_SIZE = 768
SMALL_MODEL_MAX_LR = 3e-4      # the top of Turc et al.'s grid
SMALL_MODEL_MIN_EPOCHS = 4     # Turc et al.
SMALL_MODEL_MIN_STEPS = 100    # ours
MAX_AUTO_EPOCHS = 20           # Mosbach et al.


def auto_learning_rate(paper_lr, hidden_size):
  if hidden_size >= PAPER_HIDDEN_SIZE:
    return float(paper_lr)
  return float(min(paper_lr * (PAPER_HIDDEN_SIZE / hidden_size) ** 1.5, SMALL_MODEL_MAX_LR))


def auto_num_train_epochs(paper_epochs, hidden_size, steps_per_epoch):
  if hidden_size >= PAPER_HIDDEN_SIZE:
    return float(paper_epochs)
  epochs = max(paper_epochs, SMALL_MODEL_MIN_EPOCHS,
               math.ceil(SMALL_MODEL_MIN_STEPS / max(steps_per_epoch, 1)))
  return float(min(epochs, MAX_AUTO_EPOCHS))


def resolve_hyperparameters(config, model_config, steps_per_epoch):
  """A copy of config with learning_rate and num_train_epochs set (the rule above for those left
  None), and the start-up line that says which and why."""
  c = ml_collections.ConfigDict(config.to_dict())
  h, notes = model_config.hidden_size, []
  if c.learning_rate is None:
    c.learning_rate = auto_learning_rate(c.paper_learning_rate, h)
    notes.append(f"learning rate {c.learning_rate:.2g}")
  if c.num_train_epochs is None:
    c.num_train_epochs = auto_num_train_epochs(c.paper_num_train_epochs, h, steps_per_epoch)
    notes.append(f"{c.num_train_epochs:g} epochs")
  line = None
  if notes:
    line = (f"{' and '.join(notes)} for hidden size {h} (the paper's "
            f"{c.paper_learning_rate:g} and {c.paper_num_train_epochs:g} epochs at 768, scaled "
            "for smaller models: bert_jax/finetune.py auto_learning_rate; set "
            "--config.learning_rate / --config.num_train_epochs to choose)")
  return c, line


def schedule(config, train):
  """(steps_per_epoch, num_train_steps, warmup_steps): epochs -> steps, 10% warmup (paper), or
  config.warmup_steps when > 0 (a recipe's fixed count, e.g. modernbert-embed's 700).

  Every training sequence is used each epoch: the last batch of an epoch is the remainder,
  padded with weight-0 rows (it counts as one optimizer step)."""
  steps_per_epoch = steps_per_epoch_of(train, config.batch_size)
  num_train_steps = max(1, int(config.num_train_epochs * steps_per_epoch))
  warmup = config.get("warmup_steps", 0) or int(config.warmup_proportion * num_train_steps)
  return steps_per_epoch, num_train_steps, int(warmup)


def packed_batches(task, train, config, mesh, steps_per_epoch, num_train_steps):
  """config.pack with a task type that packs each batch (embedding): its host_batch(idx),
  sized from every batch the run will take (epoch_batches); else None. Before compute."""
  pack = task_types.of(task).pack_batches
  if train is None or not config.get("pack", False) or pack is None:
    return None
  epochs = math.ceil(num_train_steps / steps_per_epoch)
  batches = [b for e in range(epochs) for b in epoch_batches(task, train, config, e)]
  host_batch, line = pack(train, config, batches[:num_train_steps], mesh)
  if jax.process_index() == 0:
    print(line, flush=True)
  return host_batch


def epoch_batches(task, train, config, epoch):
  """The index arrays of an epoch's training batches: a function of (seed, epoch) alone, in the
  task type's order (embedding: no text twice in a batch), else a shuffle."""
  epoch_order = task_types.of(task).epoch_order
  shuffle = functools.partial(epoch_order, train, config.batch_size) if epoch_order else None
  rng = np.random.default_rng([config.seed, epoch + 1])
  return _splits_batches(len(train.features["input_ids"]), config.batch_size, rng, shuffle)


def steps_per_epoch_of(train, batch_size):
  return 1 if train is None else math.ceil(len(train.features["input_ids"]) / batch_size)


def batches_line(task, train, batch_size):
  """The start-up line about an epoch's batches, naming the partial last one."""
  n = len(train.features["input_ids"])
  full, rest = divmod(n, batch_size)
  return (f"{task.name}/train: {n} sequences per epoch in {full} batches of {batch_size}"
          + (f" + 1 of {rest} (padded with weight-0 rows)" if rest else ""))


def _splits_batches(n, batch_size, rng=None, shuffle=None):
  """Index arrays of batches: training shuffled (rng.permutation, or shuffle(rng): the task
  type's epoch_order), eval in order; the last one may be partial (_host_batch pads it with
  weight-0 rows)."""
  order = (np.arange(n) if rng is None else shuffle(rng) if shuffle else rng.permutation(n))
  return [order[i:i + batch_size] for i in range(0, n, batch_size)]


def _host_batch(features, keys, idx, batch_size):
  """This host's rows of a global batch; eval batches are padded with weight-0 copies of row 0."""
  pad = batch_size - len(idx)
  full = np.concatenate([idx, np.full(pad, idx[0])]) if pad else idx
  weights = np.concatenate([np.ones(len(idx), np.float32), np.zeros(pad, np.float32)])
  per_host = batch_size // jax.process_count()
  rows = slice(jax.process_index() * per_host, (jax.process_index() + 1) * per_host)
  batch = {k: features[k][full[rows]] for k in keys if k in features}
  batch["example_weights"] = weights[rows]
  if "example_weights" in features:  # packed training rows: one weight per instance [B, K]
    batch["example_weights"] = features["example_weights"][full[rows]] * weights[rows, None]
  return batch


# ----------------------------------------------------------------------------------------------
# The run: set-up, then the loop over global steps, then predictions of the best parameters.
# ----------------------------------------------------------------------------------------------
class Run(NamedTuple):
  """What stays fixed during a run (the state does not live here)."""
  config: Any
  workdir: str
  task: Any
  tokenizer: Any
  model_config: model_lib.BertConfig
  mesh: Any
  steps: trainer_lib.Steps
  evals: list
  input_keys: tuple
  writer: Any
  is_main: bool
  distill_teacher: dict = None   # DistillTeacher.record, or None
  train_batch: Any = None        # idx -> this host's training batch (None: _host_batch's rows)
  task_data: dict = None         # checkpoint_fit.task_data: the training rows and seed


def finetune(config: ml_collections.ConfigDict, workdir: str):
  """Trains, evaluates each epoch, keeps the best and writes predictions; returns a summary.

  One run per workdir: a second one is refused at once, naming the first (workdir_lock.py).
  """
  trainer_lib.check_workdir(workdir)
  with workdir_lock.hold(workdir, "bert_jax.finetune"):
    return _sweep(config, workdir) if config.learning_rates else _finetune(config, workdir)


def _finetune(config, workdir):
  # --- Set-up and validation: every bad input fails here, before any compute. ---
  clock = metrics_writer.Clock()
  done = _finished_summary(workdir)
  if done is not None:  # a finished run is the product: never retrain over it
    return nothing_to_do(workdir, done)
  tokenizer, pre, model_config = load_init_checkpoint(config)
  task = ft.build_task(config)
  trainer_lib.check_max_length(config.max_seq_length, "max_seq_length", model_config)
  lr_decay_line = optimizer_lib.check_layerwise_lr_decay(
      config.get("layerwise_lr_decay", 1.0), model_config)
  teacher = load_distill_teacher(config, task, tokenizer)
  if teacher is not None and jax.process_index() == 0:
    print(teacher.line, flush=True)
  trainer_lib.check_same_on_all_hosts(config, tokenizer.vocab.path, tokenizer.vocab.size)
  train, evals, tests = load_splits(task, tokenizer, config)
  # A run that cannot learn (one class, one pair a batch, ...) stops here; warnings print.
  for line in ft.check_can_learn(task, train, tokenizer, config):
    if jax.process_index() == 0:
      print(f"warning: {line}", flush=True)
  train = pack_train(train, task, config)
  config, hp_line = resolve_hyperparameters(config, model_config,
                                            steps_per_epoch_of(train, config.batch_size))
  steps_per_epoch, num_train_steps, warmup_steps = schedule(config, train)
  if jax.process_index() == 0:
    if train is not None:
      print(batches_line(task, train, config.batch_size) + f"; {num_train_steps} steps "
            f"({config.num_train_epochs:g} epochs) at learning rate {config.learning_rate:.2g}",
            flush=True)
    if hp_line and train is not None:
      print(hp_line, flush=True)
    if lr_decay_line and train is not None:
      print(lr_decay_line, flush=True)
  # A preempted run's resume state must fit this one (task, steps, teacher, rows, seed): checked
  # here, before the model is built.
  data, resumed = None, None
  if train is not None:
    data = checkpoint_fit.task_data(task.name, train_source(task, config), train.features,
                                    config.seed)
    resumed = open_resume(workdir, config, task, num_train_steps, teacher, data)

  # --- Mesh, model, optimizer, shardings and the compiled steps. ---
  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size, config.eval_batch_size)
  t = build_training(task_types.of(task), model_config, config, mesh,
                     num_train_steps=num_train_steps, warmup_steps=warmup_steps,
                     num_labels=getattr(task, "num_labels", 2),
                     num_choices=getattr(task, "num_choices", 4), teacher=teacher)
  run = Run(config, workdir, task, tokenizer, model_config, mesh, t, evals,
            ft.input_keys(task) + model_lib.PACKED_ROW_KEYS,
            metrics_writer.MetricsWriter(workdir, enabled=jax.process_index() == 0),
            jax.process_index() == 0, teacher.record if teacher else None,
            packed_batches(task, train, config, mesh, steps_per_epoch, num_train_steps), data)

  # --- State: pre-trained `bert` + a fresh head (or the export's head when only evaluating). ---
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(config.seed))
    if pre is not None:
      keys = ("bert",) if config.do_train else tuple(t.abstract_state["params"])
      state = trainer_lib.load_pretrained(state, t, pre, keys, required=keys)
  history, best = [], dict(score=-np.inf, epoch=None, step=None, dir=None, outputs=None)

  # --- Train (resuming a preempted run), evaluating at every epoch end; or evaluate only. ---
  step = start_step = 0
  if train is not None:
    state, step, stopped, start_step = train_loop(run, resumed, state, train, steps_per_epoch,
                                                  num_train_steps, history, best)
    if stopped:
      run.writer.close()
      write_summary(run, clock, "stopped_early", start_step, step, num_train_steps, history,
                    best)
      return dict(task=task.name, stopped_early=True, steps=step, history=history)
  elif evals:
    evaluate(run, state["params"], 0, 0, history, best, export=False)

  # --- Predictions of the best parameters (or the final ones when nothing was evaluated). ---
  written = write_predictions(run, state, step, best, tests, trained=train is not None)
  run.writer.close()
  summary = dict(task=task.name, best_epoch=best["epoch"], best_metric=ft.primary_metric(task),
                 best_score=None if best["epoch"] is None else float(best["score"]),
                 best_checkpoint=best["dir"], history=history, steps=step, predictions=written,
                 stopped_early=False)
  write_results(run, dict(summary, finished=True))
  write_summary(run, clock, "finished", start_step, step, num_train_steps, history, best,
                written)
  return summary


def write_summary(run, clock, status, start_step, step, num_train_steps, history, best,
                  predictions=()):
  """The end-of-run summary (metrics_writer.write_summary), printed and in summary.json."""
  last = history[-1] if history else {}
  final_eval = {k: v for k, v in last.items() if k not in ("epoch", "step")}
  w = run.workdir
  outputs = {"eval_results": os.path.join(w, RESULTS), "tensorboard": os.path.join(w,
                                                                                "tensorboard")}
  if predictions:
    outputs["predictions"] = os.path.join(w, "predictions")
  if status == "stopped_early":
    nxt = [f"re-run the same command to resume from step {step}"]
  else:
    nxt = [f"python -m bert_jax.report {w}     # curves (PNG) and this summary as a table"]
    if best["dir"] and best["dir"] != run.config.init_checkpoint:
      nxt += [f"python -m bert_jax.extract_features --init_checkpoint={best['dir']} "
              "--input_file=sentences.txt --output_file=features.npz",
              f"evaluate it on other data: the same command with --config.init_checkpoint="
              f"{best['dir']} --config.do_train=false --workdir=NEW_DIR"]
      more = task_types.of(run.task).next_commands   # what the task type's product is for
      nxt += more(best["dir"]) if more else []
  best_line = (f"best {ft.primary_metric(run.task)} {best['score']:.4f} at epoch {best['epoch']}: "
               f"{best['dir']}" if best["epoch"] is not None else None)
  return metrics_writer.write_summary(w, dict(
      program="finetune", status=status, task=run.task.name,
      wall_time_sec=clock.seconds(), start_step=start_step, final_step=step,
      total_steps=num_train_steps, final_eval=final_eval,
      final_eval_step=last.get("step"), model=best_line, best_checkpoint=best["dir"],
      best_epoch=best["epoch"], learning_rate=float(run.config.learning_rate),
      num_train_epochs=float(run.config.num_train_epochs), outputs=outputs, next=nxt),
      is_main=run.is_main)


def nothing_to_do(workdir, results):
  """A workdir whose run finished (eval_results.json says so): report it, change nothing."""
  if jax.process_index() == 0:
    print(f"nothing to do: {workdir} holds a finished {results.get('task', '')} fine-tuning run "
          "(best "
          f"{results.get('best_metric')} {results.get('best_score')} at epoch "
          f"{results.get('best_epoch')}: {results.get('best_checkpoint')}); pass a new "
          "--workdir to train again", flush=True)
    previous = metrics_writer.read_summary(workdir)
    if previous:
      print("\n".join(metrics_writer.summary_lines(previous)), flush=True)
  return dict(results, nothing_to_do=True)


def train_loop(run, resumed, state, train, steps_per_epoch, num_train_steps, history, best):
  """Optimizer steps from the last saved one to num_train_steps -> (state, step, stopped,
  the step it started from). resumed: open_resume's (manager, latest step or None).

  The position in the data is a function of the global step alone (epoch, i = divmod(step,
  steps_per_epoch), each epoch's order drawn from (seed, epoch)), so a resumed run replays the
  same batches. The resume state is saved at every epoch end (after its evaluation) and on
  SIGTERM; `history` and `best` carry across.
  """
  config = run.config
  manager, latest = resumed
  state, step = resume(run, manager, latest, state, steps_per_epoch, history, best)
  start_step = step

  def save(step):
    ckpt_lib.save(manager, step, state, dict(
        task=run.task.name, num_train_steps=num_train_steps, step=step, history=history,
        best_score=float(best["score"]), best_epoch=best["epoch"], best_step=best["step"],
        best_dir=best["dir"], model_config=run.model_config.to_dict(), input_position=step,
        distill_teacher=run.distill_teacher or "", task_data=run.task_data),
        force=True)
    manager.wait_until_finished()

  timer, pending, order = trainer_lib.StepTimer(), [], None
  # NaN/Inf steps are skipped inside the step and counted one step late (guard.SkipTracker).
  skips = guard.SkipTracker(config.get("max_consecutive_skips", 10), what="fine-tuning")
  host_batch = run.train_batch or functools.partial(_host_batch, train.features, run.input_keys,
                                                    batch_size=config.batch_size)
  # SIGTERM (preemption) or Ctrl-C: save at the next step and stop; the handlers are undone on
  # leaving.
  with trainer_lib.mesh_rules(run.mesh), distributed.preemption_check() as preempted:
    while step < num_train_steps:
      epoch, i = divmod(step, steps_per_epoch)  # epochs are 1-based in logs and results
      if order is None or i == 0:  # each epoch's order is a function of (seed, epoch) alone
        order = epoch_batches(run.task, train, config, epoch)
      batch = host_batch(order[i])
      state, m = run.steps.train_step(state, sharding_lib.make_global_batch(batch, run.mesh))
      step += 1
      skips.step_done(step, m["skipped"])
      timer.step_done(m)
      pending.append(m)
      if step % config.log_every == 0 or step == num_train_steps:
        log_train(run, step, epoch + 1, num_train_steps, jax.device_get(pending), timer.rate(),
                  skips.flush())
        pending = []
      epoch_end = step % steps_per_epoch == 0 or step == num_train_steps
      if epoch_end:
        with timer.paused():
          if run.evals:
            evaluate(run, state["params"], epoch + 1, step, history, best, export=True)
          if step < num_train_steps:
            save(step)
      if step < num_train_steps and preempted(step):
        if not epoch_end:
          save(step)
        if run.is_main:
          print(f"{preempted.signal_name}: saved step {step} (epoch {epoch + 1}); re-run the "
                "same command to resume", flush=True)
        manager.close()
        return state, step, True, start_step
  manager.close()
  # Training finished: the best-epoch export is the product; the resume state goes, so a re-run
  # of the same command starts over instead of replaying the last epoch.
  if run.is_main:
    ckpt_lib.remove_dir(os.path.join(run.workdir, "checkpoints"))
  return state, step, False, start_step


def train_source(task, config):
  """Where the training rows come from, for checkpoint_fit's messages."""
  if config.data_source == "tfds":
    return f"tfds {task.name} in {config.data_dir}"
  return os.path.join(config.data_dir, task.files.get("train") or "")


def open_resume(workdir, config, task, num_train_steps, teacher, data):
  """(manager, latest verified step or None) of the workdir's resume state, its meta checked
  against this run before the model is built: the task and its step count, the distillation
  teacher, the training rows and seed (checkpoint_fit.check_task_data; issue 49: a run resumed
  on the same rows with every label flipped, unsaid). The manager is closed on a refusal."""
  manager = ckpt_lib.create_manager(workdir, max_to_keep=1, async_save=False)
  latest = ckpt_lib.latest_verified_step(manager)  # SHA-256 manifest; falls back if damaged
  if latest is None:
    return manager, None
  try:
    meta = ckpt_lib.read_meta(manager, latest)
    if meta["num_train_steps"] != num_train_steps or meta["task"] != task.name:
      raise ConfigError(f"--workdir={workdir} holds a {meta['task']} run of "
                        f"{meta['num_train_steps']} steps, not {task.name} with "
                        f"{num_train_steps}; use a new workdir.")
    check_same_distill_teacher(meta.get("distill_teacher"), teacher and teacher.record,
                               workdir)
    checkpoint_fit.check_task_data(
        meta, data, workdir=workdir, step=latest, error=ConfigError,
        restart=bool(config.get("restart_data_stream", False)))
  except errors.UserError:
    manager.close()
    raise
  return manager, latest


def _here(workdir, path):
  """The run's best export as its resume state recorded it (WORKDIR/best_epoch{N} of the
  workdir it was saved in), in this workdir: a preempted workdir copied elsewhere resumes with
  its own export, not the original's (issue 49: the copy's summary named the original's, and
  its next best epoch removed the original's export)."""
  if not path:
    return path
  name = os.path.basename(str(path).rstrip("/"))
  return os.path.join(workdir, name) if name.startswith("best_epoch") else path


def resume(run, manager, latest, state, steps_per_epoch, history, best):
  """(state, step) from the workdir's resume checkpoint `latest` (None: none; checked by
  open_resume), or (state, 0); fills history/best."""
  if latest is None:
    return state, 0
  state, meta = ckpt_lib.restore(manager, latest, run.steps.abstract_state)
  history.extend(metrics_writer.eval_tags(h) for h in meta["history"])  # older names too
  best.update(score=meta["best_score"], epoch=meta["best_epoch"], step=meta.get("best_step"),
              dir=_here(run.workdir, meta["best_dir"]))
  epoch, i = divmod(meta["step"], steps_per_epoch)
  if run.is_main:
    print(f"resuming from step {meta['step']} (epoch {epoch + 1}, batch {i}) in {run.workdir}",
          flush=True)
  return state, int(meta["step"])


def log_train(run, step, epoch, num_train_steps, host_metrics, steps_per_sec, skipped_steps=0):
  avg = trainer_lib.mean_of_applied(host_metrics)
  avg["skipped_steps"] = skipped_steps
  if steps_per_sec:
    avg["sequences_per_sec"] = steps_per_sec * run.config.batch_size
  run.writer.write_scalars(step, {f"train/{k}": v for k, v in avg.items()})
  if run.is_main:
    speed = (f"{avg['sequences_per_sec']:.1f} seq/s" if steps_per_sec else "compiling")
    print(f"epoch {epoch} step {step}/{num_train_steps} | loss {avg['loss']:.4f} | gnorm "
          f"{avg['grad_norm']:.3f} | lr {avg['learning_rate']:.2e} | {speed}"
          + (f" | skipped {skipped_steps}" if skipped_steps else ""), flush=True)


def predict(run, params, split):
  """Host numpy outputs for every sequence of a split, in order."""
  outs, bs = [], run.config.eval_batch_size
  with trainer_lib.mesh_rules(run.mesh):
    for idx in _splits_batches(len(split.features["input_ids"]), bs):
      batch = _host_batch(split.features, run.input_keys, idx, bs)
      out = jax.device_get(run.steps.eval_step(params,
                                               sharding_lib.make_global_batch(batch, run.mesh)))
      outs.append({k: v[:len(idx)] for k, v in out.items()})
  return {k: np.concatenate([o[k] for o in outs]) for k in outs[0]} if outs else {}


def evaluate(run, params, epoch, step, history, best, *, export):
  """Dev metrics of `params`; a new best is exported (export=True) to workdir/best_epoch{N}."""
  results, outputs = {}, {}
  for split in run.evals:
    outputs[split.name] = predict(run, params, split)
    warning = ft.single_class_warning(run.task, split, outputs[split.name])
    if warning and run.is_main:
      print(f"warning: epoch {epoch}: {warning}; it has not learned the task yet: try a larger "
            f"--config.learning_rate (now {run.config.learning_rate:.2g}) or more "
            f"--config.num_train_epochs (now {run.config.num_train_epochs:g})", flush=True)
    scores = ft.evaluate(run.task, split, outputs[split.name], run.tokenizer, run.config)
    # metrics_writer's scheme, the same in TensorBoard, eval_results.json and summary.json
    results.update({f"eval/{split.name}/{k}": v for k, v in scores.items()})
  run.writer.write_scalars(step, results)
  history.append(dict(epoch=epoch, step=step, **results))
  if run.is_main:
    print(f"eval epoch {epoch} (step {step}): "
          + ", ".join(f"{k.removeprefix('eval/')} {v:.4f}" for k, v in results.items()),
          flush=True)
  score = results[f"eval/{run.evals[0].name}/{ft.primary_metric(run.task)}"]
  if score > best["score"]:
    best.update(score=score, epoch=epoch, step=step, outputs=outputs)
    # Without training the parameters are init_checkpoint's own: nothing new to save.
    best["dir"] = (_save_best(run, params, epoch, best["dir"], results) if export
                   else run.config.init_checkpoint)
  write_results(run, dict(history=history, best_epoch=best["epoch"],
                          best_metric=ft.primary_metric(run.task),
                          best_score=float(best["score"]), best_checkpoint=best["dir"],
                          finished=False))


def vocab_record(path):
  """The export's vocab: its file and sha256, so that extract_features, predict and a further
  fine-tuning refuse another vocab of the same size (issue 23, fault 3: best_epochN recorded
  neither, and a wrong vocab gave other features, rc 0)."""
  key = ("spm_model_file" if str(path).endswith(".model") else
         "tokenizer_json" if str(path).endswith(".json") else "vocab_file")   # ModernBERT's BPE
  return {key: str(path), "vocab_hash": files_lib.sha256_file(path)}


def _save_best(run, params, epoch, previous, results):
  """Exports params as workdir/best_epoch{N} and removes the previous best; returns the path."""
  # Every host calls this: each writes its own shards of the (possibly FSDP-sharded) params,
  # process 0 the rest (checkpoint.save_params); directories are removed by process 0 only.
  path = os.path.join(run.workdir, f"best_epoch{epoch}")
  if run.is_main:
    ckpt_lib.remove_dir(path)  # a re-run into the same workdir
  record = task_types.of(run.task).export_record   # what the task type keeps (embedding)
  ckpt_lib.save_params(path, params, run.model_config, meta=dict(
      task=run.task.name, task_type=run.task.type, epoch=epoch,
      do_lower_case=bool(run.tokenizer.do_lower_case),
      labels=list(getattr(run.task, "labels", ()) or ()), dev_metrics=results,
      **vocab_record(run.tokenizer.vocab.path),
      **(record(run.task, run.config) if record else {})))
  if run.is_main and previous and previous != path:
    ckpt_lib.remove_dir(previous)
  return path


def write_results(run, results):
  """workdir/eval_results.json, written by process 0 only, atomically; it records the workdir,
  so a copy of it read elsewhere names its own exports (_finished_summary)."""
  if run.is_main:
    ft.dump_json(os.path.join(run.workdir, RESULTS), dict(results, workdir=run.workdir))


def write_predictions(run, state, step, best, tests, *, trained):
  """Dev prediction files (SQuAD, NER) and test submissions from the best parameters."""
  params, all_keys = state["params"], tuple(run.steps.abstract_state["params"])
  if trained and best["dir"] and best["step"] != step:
    # The best epoch is not the final state: restore its export into the same shardings.
    params = trainer_lib.load_pretrained(state, run.steps, trainer_lib.read_pretrained(
        best["dir"]), all_keys, required=all_keys)["params"]
  out_dir, written = os.path.join(run.workdir, "predictions"), []
  for split in run.evals:
    if task_types.of(run.task).dev_prediction_files:  # SQuAD's are its submission
      outputs = (best["outputs"] or {}).get(split.name) or predict(run, params, split)
      if run.is_main:
        ft.evaluate(run.task, split, outputs, run.tokenizer, run.config, out_dir)
        written.append(split.name)
  for split in tests:
    outputs = predict(run, params, split)
    if run.is_main:
      written += ft.write_test(run.task, split, outputs, run.tokenizer, run.config, out_dir)
  return written


def _finished_summary(workdir):
  """The summary of a finished run in `workdir` (eval_results.json with finished=True), or None."""
  path = epath.Path(workdir) / RESULTS
  if not path.exists():
    return None
  results = json.loads(path.read_text())
  # Files written before the one naming scheme have history keys "dev/accuracy": renamed on read.
  results["history"] = [metrics_writer.eval_tags(h) for h in results.get("history", [])]
  if not results.get("finished"):
    return None
  # Its paths (the best export) in this workdir, wherever it was written (issue 49); a file
  # from before it recorded its workdir: summary.json's record of it.
  recorded = results.get("workdir")
  if recorded is None and (epath.Path(workdir) / metrics_writer.SUMMARY_NAME).exists():
    recorded = json.loads((epath.Path(workdir) / metrics_writer.SUMMARY_NAME).read_text()).get(
        "workdir")
  return dict(metrics_writer.reroot(results, recorded, workdir), workdir=workdir)


def _sweep(config, workdir):
  """The paper's grid over learning rates: one run each, the best by dev metric.

  Re-running a preempted sweep skips the finished rates and resumes the interrupted one.
  """
  runs = []
  for lr in config.learning_rates:
    c = ml_collections.ConfigDict(config.to_dict())
    c.learning_rates = ()
    c.learning_rate = float(lr)
    run_dir = os.path.join(workdir, f"lr_{lr:g}")
    result = _finished_summary(run_dir) or finetune(c, run_dir)
    if result.get("stopped_early"):
      if jax.process_index() == 0:
        print(f"sweep: stopped in the run of learning rate {lr:g}; re-run the same command to "
              "resume it", flush=True)
      return dict(stopped_early=True, runs=runs, steps=result["steps"])
    runs.append(dict(learning_rate=float(lr), **result))
  scored = [r for r in runs if r["best_score"] is not None]
  best = max(scored, key=lambda r: r["best_score"]) if scored else None
  summary = dict(runs=[{k: r[k] for k in ("learning_rate", "best_score", "best_epoch",
                                          "best_checkpoint")} for r in runs],
                 best_learning_rate=best and best["learning_rate"],
                 best_checkpoint=best and best["best_checkpoint"], stopped_early=False)
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
    raise ConfigError(f"unexpected arguments {argv[1:]}; pass options as --config.FIELD=V.")
  if FLAGS.config is None:
    raise ConfigError("--config is required, e.g. "
                      "--config=bert_jax/configs/finetune.py:glue_mrpc")
  trainer_lib.quiet_logging()
  attention.prepare_xla_flags(FLAGS.config.model)  # before JAX starts: cuDNN's dropout
  finetune(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  define_flags()
  cli.run(main, init_distributed=True,  # multi-host start-up inside the one-line errors
          help_config="bert_jax/configs/finetune.py", program="python -m bert_jax.finetune")
