r"""BERT pre-training: one loop, read top to bottom.

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:base --workdir=DIR \
      --config.train_input_files='data/train-*' --config.vocab_file=vocab.txt

Sections: set-up and validation -> mesh -> input (its first batch checked before any model
exists) -> model + optimizer + compiled steps -> state (resume, init_checkpoint or fresh) -> loop
(metrics, eval, checkpoints, SIGTERM). A step is an optimizer step everywhere (with
grad_accum_steps=k it scans k micro-batches inside the jitted step; a batch-size warmup's step
takes a growing number of stream batches: batch_warmup.py). Restarting with the same --workdir
resumes from the latest committed checkpoint and continues the same data stream. The shared
plumbing (steps, pre-trained loading, checks, timing, log averaging) is in trainer_lib.py; what
the loop prints and writes (start-up lines, log lines, the summary) in train_report.py.
"""

import contextlib
import dataclasses
import functools
import json
import os

from absl import flags
import jax
import jax.numpy as jnp
import ml_collections
from ml_collections import config_flags
import numpy as np

from bert_jax.layers import attention
from bert_jax.training import batch_warmup
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.checkpoint import checkpoint_fit
from bert_jax.parallel import distributed
from bert_jax import families
from bert_jax.families import bert as families_bert
from bert_jax import cli
from bert_jax_core import errors
from bert_jax.training import guard
from bert_jax.inference import loading as inference
from bert_jax.training import input_source
from bert_jax.evaluation import metrics_writer
from bert_jax.models import model as model_lib
from bert_jax.objectives import pretraining as objectives
from bert_jax.training import optimizer as optimizer_lib
from bert_jax.training import preflight
from bert_jax.models import pretraining_heads
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.training import trainer_lib
from bert_jax.checkpoint import workdir_lock
# What the loop prints and writes (start-up lines, log line, summary, next commands); these names
# stay importable from here (train.next_commands, train.device_peak_tflops, ...).
from bert_jax.evaluation.train_report import (  # noqa: F401
    PEAK_TFLOPS, device_peak_tflops, input_line, log_line, next_commands, nothing_to_do,
    print_mesh_line, run_summary, summarize)

ConfigError = trainer_lib.ConfigError  # one class for config problems in both loops


# ----------------------------------------------------------------------------------------------
# Model call and loss (pure).
# ----------------------------------------------------------------------------------------------
def forward(module, batch, deterministic):
  """BertForPreTraining on a batch dict -> {objective: logits} float32 (model.objective_list):
  mlm [B, P, V]; nsp or sop [B, 2] (packed: [B, K, 2], one per instance); sbo [B, P, V]."""
  return pretraining_heads.pretraining_outputs(module, batch, deterministic)


def pretraining_loss(outputs, batch, weights=None):
  """The sum of the objectives' losses (bert_jax/objectives/pretraining.py): BERT's MLM + NSP as
  google-research/bert, ALBERT's MLM + SOP, SpanBERT's MLM + SBO; `weights` DistilBERT's."""
  loss, metrics = objectives.pretraining_loss(outputs, batch, weights)
  # Real tokens per slot of the batch (1 - padding); x tokens/s = real tokens/s in the log.
  metrics["real_token_fraction"] = jnp.mean(batch["input_mask"].astype(jnp.float32))
  return loss, metrics


def eval_metrics(outputs, batch):
  return pretraining_loss(outputs, batch)[1]


def dummy_batch(config):
  """Zeros of the batch contract's model inputs (batch 1), for model.init; the span boundaries
  are the SBO head's (span masking adds them to real batches; other heads ignore them)."""
  t, p = config.seq_length, config.max_predictions_per_seq
  return dict(input_ids=jnp.zeros((1, t), jnp.int32), input_mask=jnp.ones((1, t), jnp.int32),
              segment_ids=jnp.zeros((1, t), jnp.int32),
              masked_lm_positions=jnp.zeros((1, p), jnp.int32),
              masked_lm_span_left=jnp.zeros((1, p), jnp.int32),
              masked_lm_span_right=jnp.zeros((1, p), jnp.int32))


def check_objectives(config, model_config):
  """The masking scheme and the model's objectives fit together (one line, before compute)."""
  scheme = config.get("masking", "token")
  if scheme not in ("token", "ngram", "span"):   # masking.SCHEMES, without importing TF here
    raise ConfigError(f"config.masking={scheme!r}: expected token (BERT), ngram (ALBERT) or "
                      "span (SpanBERT).")
  family = families.get(model_config.family)
  if model_config.mlm_loss_chunk and (family.forward is not pretraining_heads.pretraining_outputs
                                      or family.step_parts is not families_bert.step_parts):
    # ELECTRA samples from its generator's logits, DistilBERT compares them with its teacher's.
    raise ConfigError(f"config.model.mlm_loss_chunk={model_config.mlm_loss_chunk}: "
                      f"{family.display}'s step reads the whole MLM logits outside the loss, so "
                      "they cannot be made a chunk at a time there: set it to 0.")
  if "sbo" in model_config.objective_list and config.train_input_files == "synthetic":
    raise ConfigError("config.train_input_files=synthetic has no span boundaries for the SBO "
                      "objective; train SpanBERT on records (create_pretraining_data --no_nsp).")
  if "sbo" in model_config.objective_list and scheme != "span":
    raise ConfigError(f"config.model.objectives={model_config.objectives!r} has the span-boundary "
                      f"objective but config.masking={scheme!r}; SBO predicts masked spans from "
                      "their boundaries: set --config.masking=span.")


def build_training(config, model_config, mesh, teacher=None,
                   rules=sharding_lib.LOGICAL_AXIS_RULES) -> trainer_lib.Steps:
  """Model, optimizer and the jitted, explicitly sharded init/train/eval functions (DistilBERT:
  its teacher, distil.load_teacher's, loaded here once onto the mesh: Steps.frozen)."""
  tx, schedule = optimizer_lib.from_config(config, num_train_steps=config.num_train_steps,
                                           warmup_steps=config.warmup_steps)
  # What the family trains (bert_jax/families/<name>.py): its network, the step's forward, the
  # loss weights (None: the objectives') and a frozen network in the step (DistilBERT's teacher).
  family = families.get(model_config.family)
  model = family.pretraining_model(model_config)
  fwd, weights, frozen = family.step_parts(config, model_config, teacher, dummy_batch(config),
                                           mesh, rules)
  loss_fn = functools.partial(pretraining_loss, weights=weights)
  return trainer_lib.build_steps(
      model=model, forward=fwd, loss_fn=loss_fn, eval_fn=lambda out, b: loss_fn(out, b)[1],
      dummy_batch=dummy_batch(config), tx=tx, schedule=schedule, mesh=mesh,
      grad_accum_steps=int(config.grad_accum_steps), rules=rules, frozen=frozen)


# ----------------------------------------------------------------------------------------------
# FLOPs (for TFLOP/s and MFU).
# ----------------------------------------------------------------------------------------------
# Analytic training FLOPs per sequence of BERT-style encoders (families/bert/, where the
# accounting is written out); a family's own count is its Family.flops_per_sequence.
model_flops_per_sequence = families_bert.flops_per_sequence


def step_flops(config, model_config, layout, teacher=None):
  """FLOPs of one optimizer step as the step computes them: a packed row carries Q prediction
  slots and K NSP slots (pretrain_input's widths), an unpacked one max_predictions_per_seq and 1."""
  preds, nsp = config.max_predictions_per_seq, 1
  if layout and layout.get("pack"):
    nsp, preds = input_source.packed_widths(config, layout)
  # Every network the step runs (ELECTRA's two; DistilBERT's student + its teacher's forward).
  flops = families.get(model_config.family).flops_per_sequence(
      model_config, config.seq_length, preds, nsp, teacher.model_config if teacher else None)
  return flops * config.batch_size



# ----------------------------------------------------------------------------------------------
# Validation: every problem is a one-line error before any compute.
# ----------------------------------------------------------------------------------------------
def expand_files(pattern, field):
  """The record files of config.<field> ("synthetic" passes through), globbed once."""
  if pattern == "synthetic":
    return "synthetic"
  if not pattern:
    raise ConfigError(f"config.{field} is empty: pass TFRecords from "
                      "`python -m data_pipelines.create_pretraining_data`, e.g. "
                      f"--config.{field}='data/records/train-*'.")
  from data_pipelines.input import pretrain_input  # pylint: disable=g-import-not-at-top
  files = pretrain_input.expand_file_pattern(pattern, what=f"config.{field}")
  # Empty files dropped: else a shard of them hangs the stream.
  kept, empty = pretrain_input.drop_empty_files(files, f"config.{field}")
  if empty and jax.process_index() == 0:
    print(pretrain_input.empty_files_note(empty, len(files), f"config.{field}"), flush=True)
  return kept


def names_a_vocab(config):
  """Whether the config names a vocabulary: a WordPiece vocab file, a SentencePiece model or a
  Hugging Face tokenizer.json (train.load_vocab and bert_jax.plan read it alike)."""
  return bool(config.vocab_file or config.spm_model_file or config.get("tokenizer_json"))


def load_vocab(config):
  tokenizer_json = config.get("tokenizer_json") or None   # a Hugging Face tokenizer.json
  if config.train_input_files == "synthetic" and not names_a_vocab(config):
    return input_source_vocab(synthetic_vocab_size(config))
  from data_pipelines.tokenizers import vocab as vocab_lib  # pylint: disable=g-import-not-at-top
  info = vocab_lib.load_vocab_info(vocab_file=config.vocab_file or None,
                                   spm_model_file=config.spm_model_file or None,
                                   tokenizer_json=tokenizer_json, prefix="--config.")
  # Casing from the vocab's own settings (None takes them; a contradiction is a one-line error),
  # recorded in the config so the records' check and the checkpoints carry the real value.
  settings = vocab_lib.resolve_settings(config.vocab_file or None,
                                        config.spm_model_file or None,
                                        config.get("do_lower_case"),
                                        flag="--config.do_lower_case",
                                        tokenizer_json=tokenizer_json)
  config.do_lower_case = settings["do_lower_case"]
  return info


def synthetic_vocab_size(config):
  """The vocabulary size of a run without a vocabulary (synthetic input, bert_jax.plan): the
  config's override, else the preset's (ModernBERT's 50,368, NeoBERT's 30,522). It was BERT's
  30,522 for every preset, so `plan` sized modernbert-base's embedding and decoder 40% small."""
  return int(config.model.get("vocab_size") or
             model_lib.get_bert_config(config.model_name).vocab_size)


def input_source_vocab(size):
  from data_pipelines.tokenizers.vocab import VocabInfo  # pylint: disable=g-import-not-at-top
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
  except (ValueError, TypeError) as e:  # an unknown preset or BertConfig field, from our code
    raise ConfigError(f"config.model_name={config.model_name}: {e}") from e


# ----------------------------------------------------------------------------------------------
# State: resume > init_checkpoint > fresh init.
# ----------------------------------------------------------------------------------------------
def restore_or_init(manager, t, config, model_config, workdir, latest, teacher=None,
                    position=None):
  """(state, step) from checkpoint `latest` (verified; None: none) in workdir, else a fresh (or
  pre-trained; a DistilBERT student: from its teacher's layers) start. `position`: the data
  stream's input position at `latest` (None: the checkpoint's; a restarted stream's is 0)."""
  if latest is not None:   # of this model and vocab: checked before the input (check_same_run)
    trainer_lib.check_resume_fp8(manager, latest, t.abstract_state, workdir)
    state, meta = ckpt_lib.restore(manager, latest, t.abstract_state)
    print(f"resuming from step {latest} in {workdir} (input position "  # every host says so
          f"{meta['input_position'] if position is None else position})", flush=True)
    return state, int(latest)
  state = t.init_state(jax.random.PRNGKey(config.seed))
  if config.init_checkpoint:
    state = init_from_checkpoint(state, t, config.init_checkpoint, model_config)
  elif teacher:   # DistilBERT: the student starts from its teacher's layers
    state = families.get(model_config.family).init_from_teacher(state, t, config, teacher,
                                                                 model_config.num_layers)
  return state, 0


def check_same_run(manager, latest, model_config, workdir, config, vocab_hash, teacher=None):
  """A workdir's checkpoint `latest` must be of the configured model, vocabulary and (DistilBERT)
  teacher (resuming, or reporting a finished run): else a one-line error naming both sides, the
  manager closed. It reads the checkpoint's meta only, so another preset is refused before the
  input and the model are built (issue 23, fault 8: 131 s in), and another vocab of the same size
  is refused at all (fault 2: it trained on and recorded the new hash)."""
  try:
    _check_same_run(manager, latest, model_config, workdir, config, vocab_hash, teacher)
  except ConfigError:
    manager.close()
    raise


def _check_same_run(manager, latest, model_config, workdir, config, vocab_hash, teacher):
  # checkpoint_fit: the one owner of "does this checkpoint fit this run".
  meta = ckpt_lib.read_meta(manager, latest)
  families.get(model_config.family).check_teacher(meta, teacher, workdir)
  checkpoint_fit.check_same_model(workdir, meta, model_config, error=ConfigError)
  checkpoint_fit.check_resume_vocab(workdir, meta, config, vocab_hash, error=ConfigError)


INIT_SIZES = checkpoint_fit.INIT_SIZES


def model_from_init_checkpoint(config, model_config, vocab_hash=None):
  """The model of a run starting from config.init_checkpoint, read from its config (no array)
  before anything is built: the preset's sizes (ELECTRA's generator too) and the run's
  vocabulary (`vocab_hash`: its sha256; None: read here) must be the checkpoint's
  (checkpoint_fit), every other encoder field (the activation, layer_norm_eps, ...) is the
  checkpoint's, an explicit --config.model.<field> that contradicts it is one line naming both
  values (checkpoint.config_from_checkpoint, as fine-tuning), and the run fields are the
  config's."""
  path = config.init_checkpoint
  described = ckpt_lib.describe(
      inference.from_hf_folder(path) if inference.is_hf_folder(path) else path, verify=False)
  stored = described.config
  checkpoint_fit.check_init_vocab(
      config, path, lambda: inference.checkpoint_vocab(described.kind, described.directory,
                                                       described.meta),
      vocab_hash, error=ConfigError)
  if config.get("tokenizer_json") and stored.vocab_size > model_config.vocab_size:
    # A tokenizer.json's ids in a table padded past them (ModernBERT: 50,280 ids, 50,368
    # rows): the rows are the checkpoint's; no input id reaches the padding.
    print(f"init_checkpoint={path}: {stored.vocab_size} embedding rows for the "
          f"{model_config.vocab_size} ids of {config.tokenizer_json} (padded rows kept)",
          flush=True)
    model_config = dataclasses.replace(model_config, vocab_size=stored.vocab_size)
  checkpoint_fit.check_sizes(f"init_checkpoint={path}", stored, model_config, error=ConfigError,
                             fix="set --config.model_name (and the vocab) to the checkpoint's.")
  checkpoint_fit.check_generator(f"init_checkpoint={path}", stored, model_config, config,
                                 error=ConfigError)
  explicit = {k: v for k, v in config.model.items()
              if v is not None and k in ckpt_lib.ENCODER_FIELDS and k != "vocab_size"}
  # The modern encoder's fields (RoPE, window, norms: what the weights were trained under) are
  # the checkpoint's too, not the preset's; only the global layers' RoPE theta may be set anew
  # (context extension, rope_theta_global below).
  run_fields = {k: v for k, v in model_config.to_dict().items()
                if k not in ckpt_lib.ENCODER_FIELDS and k not in model_lib.MODERN_FIELDS}
  run_fields.update(_extended_theta(config, stored, path))
  return ckpt_lib.config_from_checkpoint(stored, {**run_fields, **explicit},
                                         f"init_checkpoint={path}")


def _extended_theta(config, stored, path):
  """{"rope_theta_global": the config's} when it sets one that differs from the checkpoint's
  (ModernBERT's context extension, the `phase2` variant: 10,000 -> 160,000), said in one line;
  else {} (the checkpoint's stays). Theta is no parameter: the weights load unchanged, the
  global layers' positions turn more slowly."""
  theta = config.model.get("rope_theta_global")
  if theta is None or float(theta) == stored.rope_theta_global:
    return {}
  if stored.position_embedding != "rope":
    raise ConfigError(f"init_checkpoint={path} has no rotary positions ({stored.family}, "
                      f"position_embedding={stored.position_embedding!r}); "
                      "--config.model.rope_theta_global needs a RoPE model.")
  if jax.process_index() == 0:
    why = "context extension" if theta > stored.rope_theta_global else "lowered"
    print(f"RoPE theta of the global layers: {stored.rope_theta_global:g} in the checkpoint -> "
          f"{float(theta):g} now ({why})", flush=True)
  return {"rope_theta_global": float(theta)}


def init_from_checkpoint(state, t, path, model_config):
  """Phase 2 / a converted BERT: parameters from `path` (heads it lacks stay fresh), a fresh
  optimizer state and step 0. A Hugging Face folder is converted once (inference.from_hf_folder)."""
  pre = trainer_lib.read_pretrained(inference.from_hf_folder(path) if inference.is_hf_folder(path)
                                    else path)
  # Its sizes and architecture were read and checked by model_from_init_checkpoint; the
  # parameter shapes are checked again by load_pretrained.
  state = trainer_lib.load_pretrained(state, t, pre, keys=tuple(t.abstract_state["params"]),
                                      required=("bert",))
  if jax.process_index() == 0:
    item = str(pre.item_dir).rstrip("/")
    what = inference.describe("train" if pre.prefix else "params", item.rsplit("/", 1)[0],
                              pre.meta)
    print(f"initialised parameters from {what} ({pre.model_config.num_layers} layers, hidden "
          f"{pre.model_config.hidden_size}); optimizer state is fresh", flush=True)
  return state


# ----------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------
def validate_inputs(config, workdir):
  """Config values, workdir, files, vocab, model size and the records' contract, before compute.

  Returns (train_files, eval_files or None, vocab, model_config, vocab_hash, teacher: DistilBERT's
  distil.Teacher, described and checked, or None).
  """
  preflight.check_config_values(config)
  trainer_lib.check_workdir(workdir)
  sources = input_source.sources_of(config)   # a mixture of named sources (issue 42), or None
  input_source.phases_of(config)   # its schedule (config.phases), checked now, or None
  train_files = ([f for s in sources for f in s.files] if sources else
                 expand_files(config.train_input_files, "train_input_files"))
  eval_files = (expand_files(config.eval_input_files, "eval_input_files")
                if config.eval_input_files else None)
  vocab = load_vocab(config)
  model_config = create_model_config(config, vocab)
  vocab_hash = trainer_lib.check_same_on_all_hosts(config, vocab.path, vocab.size)
  if config.init_checkpoint:
    model_config = model_from_init_checkpoint(config, model_config, vocab_hash)
  check_objectives(config, model_config)
  trainer_lib.check_max_length(config.seq_length, "seq_length", model_config)
  teacher = families.get(model_config.family).load_teacher(config, model_config)
  # The records' dataset_info.json: vocab hash, casing, seq length, masking, record counts.
  note = print if jax.process_index() == 0 else (lambda _: None)
  for field, files in ([(f"train_sources {s.name}", list(s.files)) for s in sources] if sources
                       else [("train_input_files", train_files)]):   # each source: the run's vocab
    preflight.check_data_contract(files, field, config, vocab, note, model_config=model_config)
  if sources:
    note(input_source.planned_line(config))
  if eval_files:
    preflight.check_data_contract(eval_files, "eval_input_files", config, vocab, note,
                                  model_config=model_config)
  return train_files, eval_files, vocab, model_config, vocab_hash, teacher



def first_checked_batch(train_iter, config, vocab, layout, num_files, local_batch, is_main):
  """The training stream with its first batch read and checked (preflight.first_batch), and the
  input's start-up line (packing efficiency over the first batches)."""
  train_iter, real_per_slot = input_source.peek(train_iter)
  train_iter = preflight.first_batch(train_iter, "train_input_files", config, vocab, local_batch)
  if is_main and layout:
    print(input_line(layout, num_files, real_per_slot), flush=True)
  return train_iter


def checkpoint_meta(config, step, vocab_hash, model_config, layout, teacher, ramp, stream=None):
  """What a checkpoint records beside the state: the config, the vocab's hash, the model, where
  the input stream is (stream batches consumed: the step, or more under a batch-size warmup;
  minus those before a restarted stream began), its layout and record files and seed
  (checkpoint_fit.data_stream), the warmup and (DistilBERT) the teacher; resuming checks them."""
  return dict(config=json.loads(config.to_json_best_effort()), vocab_hash=vocab_hash,
              model_config=model_config.to_dict(), step=step,
              input_position=checkpoint_fit.stream_position(ramp, stream, step),
              stream_layout=layout, data_stream=stream, batch_warmup=ramp.record(),
              teacher=teacher.record if teacher else None)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Runs (or resumes) pre-training; returns the last logged and evaluated metrics.

  One run per workdir: a second one is refused at once, naming the first (workdir_lock.py).
  """
  trainer_lib.check_workdir(workdir)
  with workdir_lock.hold(workdir, "bert_jax.train"):
    return _train_and_evaluate(config, workdir)


def _train_and_evaluate(config, workdir):
  clock = metrics_writer.Clock()  # the summary's wall time: set-up, compilation and all
  run = prepare_run(config, workdir)   # every check, before any compute
  if run.latest is not None and run.latest >= run.total_steps:  # finished: say so, do nothing
    run.manager.close()
    return nothing_to_do(config, workdir, run.latest, run.is_main)
  # --- Input: batch i of the stream is the global batch of step i + 1 (a warmup's step s: its
  # k(s) batches from ramp.position(s - 1)). Its first batch is checked before the model exists
  # (bad records: one line in seconds, not after compiling). ---
  unit_rows = run.ramp.unit // jax.process_count()
  train_iter = first_checked_batch(
      input_source.stream(config, run.vocab, run.layout, unit_rows, run.train_files, config.seed,
                          run.position(run.latest or 0),
                          stream_start=(run.stream or {}).get("start_position", 0)),
      config, run.vocab, run.layout, len(run.train_files), unit_rows, run.is_main)
  # --- Model, optimizer, shardings, compiled steps; then the state. ---
  t = build_training(config, run.model_config, run.mesh, run.teacher)  # DistilBERT: its teacher
  with trainer_lib.mesh_rules(run.mesh):
    state, start_step = restore_or_init(run.manager, t, config, run.model_config, workdir,
                                        run.latest, run.teacher, run.position(run.latest or 0))
  out = RunOutputs(run, t.eval_step)
  step = train_loop(run, t, state, start_step, train_iter, out)
  run.manager.wait_until_finished()
  run.manager.close()
  out.writer.close()
  summary = metrics_writer.write_summary(workdir, run_summary(
      config, workdir, seconds=clock.seconds(), start_step=start_step, step=step,
      total_steps=run.total_steps, history=out.history, last_eval=out.last_eval,
      flops_per_step=out.flops_per_step, ramp=run.ramp) | input_source.mixture_summary(
          config, start_step, run.is_main), is_main=run.is_main)
  return dict(history=out.history, final_step=step, last_eval=out.last_eval,
              stopped_early=step < run.total_steps, summary=summary)


@dataclasses.dataclass
class Run:
  """A validated run before its first step: inputs, mesh, batch-size warmup, resume point."""
  config: ml_collections.ConfigDict
  workdir: str
  train_files: list
  eval_files: list
  vocab: object
  model_config: object
  vocab_hash: str
  teacher: object
  mesh: object
  local_batch: int          # rows of a global batch_size on this host
  ramp: object              # batch_warmup.Ramp (off: one stream batch of batch_size per step)
  manager: object           # the checkpoint manager
  latest: object            # the newest verified step, or None
  layout: object            # the stream layout fixed at the first run
  is_main: bool
  total_steps: int
  stream: dict = None       # record files, seed, where the stream began (checkpoint_fit)

  def position(self, step):
    """The data stream's input position after `step` (checkpoint_fit.stream_position)."""
    return checkpoint_fit.stream_position(self.ramp, self.stream, step)


def prepare_run(config, workdir):
  """Set-up and validation: no compute before this passes."""
  train_files, eval_files, vocab, model_config, vocab_hash, teacher = validate_inputs(
      config, workdir)
  is_main = jax.process_index() == 0
  # The global batch of a step, k micro-batches of batch_size / k inside it.
  mesh = trainer_lib.create_mesh(config.mesh_shape, config.batch_size,
                                 grad_accum_steps=int(config.grad_accum_steps))
  local_batch = config.batch_size // jax.process_count()
  print_mesh_line(config, model_config, mesh, local_batch, is_main)
  # A batch-size warmup: step s takes k(s) stream batches of `unit` rows (off: one of batch_size).
  ramp = batch_warmup.from_config(config, mesh)
  if is_main and ramp.on:
    print(ramp.startup_line(), flush=True)
  manager, latest, meta = resume_point(config, workdir, ramp)
  if latest is not None:   # the same model, vocab and teacher, from the checkpoint's meta
    check_same_run(manager, latest, model_config, workdir, config, vocab_hash, teacher)
  try:   # the same data stream (record files, seed, layout), or one started afresh
    layout, stream = stream_at(config, workdir, train_files, ramp, latest, meta)
  except errors.UserError:
    manager.close()
    raise
  return Run(config, workdir, train_files, eval_files, vocab, model_config, vocab_hash, teacher,
             mesh, local_batch, ramp, manager, latest, layout, is_main,
             int(config.num_train_steps), stream)


class RunOutputs:
  """What a run writes besides its state: metrics (event files, history), evaluations, log lines,
  checkpoints."""

  def __init__(self, run, eval_step):
    self.run, self.eval_step = run, eval_step
    self.writer = metrics_writer.MetricsWriter(run.workdir, enabled=run.is_main)
    if run.is_main:
      self.writer.write_text("config", run.config.to_json_best_effort(indent=2))
    self.flops_per_step = step_flops(run.config, run.model_config, run.layout, run.teacher)
    self.history, self.last_eval = dict(train=[], eval=[]), {}

  def evaluate(self, step, params):
    run, config = self.run, self.run.config
    batches = input_source.stream(config, run.vocab, run.layout, run.local_batch, run.eval_files,
                                  config.seed + 1, 0, train=False)
    result = evaluate_params(self.eval_step, params, config.eval_steps, run.mesh, batches)
    self.writer.write_scalars(step, result)
    self.history["eval"].append((step, result))
    self.last_eval = result
    if run.is_main:
      print(f"eval @ step {step}: mlm_accuracy {result['eval/mlm_accuracy']:.4f} mlm_loss "
            f"{result['eval/mlm_loss']:.4f}" + "".join(
                f" {p}_accuracy {result[f'eval/{p}_accuracy']:.4f}" for p in objectives.PARTS
                if p != "mlm" and f"eval/{p}_accuracy" in result), flush=True)

  def log(self, step, pending, timer, skips):
    """The averages of the steps since the last log line: event file, history, log line."""
    run = self.run
    # Fetch first: the clock is read once the steps' device work has finished (dispatch is
    # asynchronous; read before, a window would time its dispatches, not its steps).
    pending = jax.device_get(pending)
    avg = summarize(pending, timer.rate(), run.config, self.flops_per_step)
    avg["skipped_steps"] = skips.flush()
    self.writer.write_scalars(step, metrics_writer.prefixed("train/", avg))
    self.history["train"].append((step, avg))
    if run.is_main:
      print(log_line(step, run.total_steps, avg, remaining_rows=(
          run.ramp.rows_through(run.total_steps) - run.ramp.rows_through(step)
          if run.ramp.on else None)), flush=True)

  def save(self, step, state, force=False):
    run = self.run
    ckpt_lib.save(run.manager, step, state, checkpoint_meta(
        run.config, step, run.vocab_hash, run.model_config, run.layout, run.teacher, run.ramp,
        run.stream),
                  force=force)


def train_loop(run, t, state, start_step, train_iter, out):
  """Steps start_step + 1 .. total_steps (or until SIGTERM or Ctrl-C, saved first); returns the
  last step."""
  config, ramp, total_steps = run.config, run.ramp, run.total_steps
  timer, step, pending = trainer_lib.StepTimer(), start_step, []
  # The compiled step of each size (ramp.sizes of them; off: the one), and the global batches.
  steps_of = functools.cache(lambda k: t.train_step if k == ramp.sizes else
                             t.train_step_for(ramp.passes(k)))
  global_batch, compiled = batch_warmup.GlobalBatches(run.mesh), set()
  # NaN/Inf steps are skipped inside the step and counted one step late (guard.SkipTracker).
  skips = guard.SkipTracker(config.get("max_consecutive_skips", 10))
  with trainer_lib.mesh_rules(run.mesh), distributed.preemption_check() as preempted:
    if start_step == 0 and run.eval_files:
      out.evaluate(0, state["params"])
    for step in range(start_step + 1, total_steps + 1):
      run.manager.check_for_errors()   # a failed asynchronous save stops the run here, named
      profile(config, run.workdir, step, before=True)
      k = ramp.units(step)
      # A warmup's next size compiles (and first runs) here, outside the timed steps.
      fresh = k not in compiled and step > start_step + 1
      compiled.add(k)
      with timer.paused() if fresh else contextlib.nullcontext():
        state, metrics = steps_of(k)(state, global_batch(train_iter, k))
        if fresh:
          jax.block_until_ready(metrics)
      skips.step_done(step, metrics["skipped"])
      timer.step_done(metrics, timed=not fresh)
      pending.append(dict(metrics, batch_size=ramp.rows(step)) if ramp.on else metrics)
      profile(config, run.workdir, step, before=False, state=state)
      if step % config.log_every == 0 or step == total_steps:
        out.log(step, pending, timer, skips)
        pending = []
      if run.eval_files and (step % config.eval_every == 0 or step == total_steps):
        with timer.paused():
          out.evaluate(step, state["params"])
      if step % config.checkpoint_every == 0 or step == total_steps:
        with timer.paused():
          out.save(step, state)
      if step < total_steps and preempted(step):
        if run.is_main:
          print(f"{preempted.signal_name}: saving step {step} and exiting; re-run the same "
                "command to resume", flush=True)
        out.save(step, state, force=True)
        break
  return step


def resume_point(config, workdir, ramp):
  """(checkpoint manager, newest step that verifies against its SHA-256 manifest or None, its
  meta or {}); the batch-size warmup checked against the checkpoint's."""
  manager = ckpt_lib.create_manager(workdir, max_to_keep=config.keep_checkpoints,
                                    keep_period=config.keep_every or None,
                                    async_save=config.async_checkpointing)
  latest = ckpt_lib.latest_verified_step(manager)
  meta = ckpt_lib.read_meta(manager, latest) if latest is not None else {}
  if latest is not None:
    try:
      batch_warmup.check_resume(meta.get("batch_warmup"), ramp, workdir)
    except ConfigError:
      manager.close()
      raise
  return manager, latest, meta


def stream_at(config, workdir, train_files, ramp, latest, meta):
  """(stream layout, stream record) of the training data. The layout (logical shards,
  packing, the stream's batch: ramp.unit rows) is fixed at the first run and kept in the
  checkpoint with the record files and seed; resuming (on any host count) continues the same
  stream, and other files, seed or layout are refused unless --config.restart_data_stream
  starts this run's afresh (checkpoint_fit.resume_stream)."""
  def layout_of(stored):
    return input_source.stream_layout(config, train_files, jax.process_count(), stored=stored,
                                      global_batch=ramp.unit, position=ramp.position)
  stream = checkpoint_fit.data_stream(config, train_files)
  if latest is None:
    return layout_of(None), stream
  stream, layout = checkpoint_fit.resume_stream(
      meta, stream, workdir=workdir, step=latest, position=ramp.position(latest),
      layout_of=layout_of, restart=bool(config.get("restart_data_stream", False)),
      error=ConfigError)
  return layout, stream


def evaluate_params(eval_step, params, num_steps, mesh, batches):
  """Mean eval metrics over the first `num_steps` global batches of the eval stream. The stream
  repeats (input_source.make_batches), so a small eval set is cycled and every evaluation reads
  the same batches, in the same order."""
  sums, n = {}, 0
  for _, batch in zip(range(num_steps), batches):
    m = jax.device_get(eval_step(params, sharding_lib.make_global_batch(batch, mesh)))
    for k, v in m.items():
      sums[k] = sums.get(k, 0.0) + float(v)
    n += 1
  return {f"eval/{k}": v / max(n, 1) for k, v in sums.items()}  # metrics_writer's names



def profile(config, workdir, step, *, before, state=None):
  """A jax.profiler trace of optimizer steps profile_start_step+1 .. +profile_steps."""
  if config.profile_start_step < 0:
    return
  if before and step == config.profile_start_step + 1:
    jax.profiler.start_trace(os.path.join(workdir, "profile"))
  if not before and step == config.profile_start_step + config.profile_steps:
    jax.block_until_ready(state)
    jax.profiler.stop_trace()



FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  config_flags.DEFINE_config_file("config", None, "Config file, e.g. "
                                  "bert_jax/configs/pretrain.py:base[,runlocal].",
                                  lock_config=True)
  flags.DEFINE_string("workdir", None, "Checkpoints, TensorBoard events and logs go here.")


def main(argv):
  if len(argv) > 1:
    raise ConfigError(f"unexpected arguments {argv[1:]}; pass options as --config.FIELD=V.")
  if FLAGS.config is None:
    raise ConfigError("--config is required, e.g. "
                      "--config=bert_jax/configs/pretrain.py:tiny,runlocal")
  trainer_lib.quiet_logging()
  attention.prepare_xla_flags(FLAGS.config.model)  # before JAX starts: cuDNN's dropout
  train_and_evaluate(FLAGS.config, FLAGS.workdir)


if __name__ == "__main__":
  define_flags()
  cli.run(main, init_distributed=True,  # multi-host start-up inside the one-line errors
          help_config="bert_jax/configs/pretrain.py", program="python -m bert_jax.train")
