"""DistilBERT (Sanh et al. 2019): a student BERT trained to match a frozen teacher; the teacher,
its checks and record, and the student's initialisation from its layers. The step is the shared
distillation objective's (bert_jax/objectives/layerwise.py), DistilBERT a weight setting of its parts.

The student is BertForPreTraining with family "distilbert" (model.py: no token-type table, no
pooler, MLM head). Pre-training (python -m bert_jax.train with a distilbert-* preset and
--config.teacher_checkpoint) runs both networks in one jitted, mesh-sharded step
(layerwise.step_parts):

  1. teacher: its MLM logits at the masked positions [B, P, V] and last hidden states [B, T, H],
     deterministic, in the run's compute dtype (bf16 on accelerators), under stop_gradient; its
     parameters are an argument of the step (loaded once, sharded by the same logical-axis rules),
     never in the TrainState, the optimizer or a checkpoint (trainer_lib.build_steps(frozen=))
  2. student: the same outputs, with dropout
  3. loss (layerwise.py's parts, weights from the config; HF's distillation recipe by default):
       alpha_ce   5.0 x distill_ce   KL(teacher/T || student/T) x T^2 over the masked positions
       alpha_mlm  2.0 x mlm          cross-entropy against the original tokens
       alpha_cos  1.0 x distill_cos  1 - cos(student, teacher) last hidden states, real tokens
     at temperature T = 2.0 (transformers examples/research_projects/distillation, train.py
     --alpha_ce 5.0 --alpha_mlm 2.0 --alpha_cos 1.0 --temperature 2.0); the layer-wise parts
     (alpha_emb, alpha_hidden, alpha_att, alpha_pred) 0 unless set, over the copy map below.

Student init (a fresh run; `init_student`): teacher layers `layer_map(...)` (default every other
one, 0, 2, 4, ..., "taking one layer out of two" as the paper; HF's scripts/extract_distilbert.py
takes 0, 2, 4, 7, 9, 11 of BERT-base: --config.teacher_layers=0,2,4,7,9,11), the word and position
embeddings and their LayerNorm (the token-type table is dropped) and the MLM head.

The checkpoint meta records the teacher (`teacher_record`: path, resolved directory and the sha256
of its manifest, or of its weight files for a Hugging Face folder); resuming with another or a
missing teacher is a one-line error naming both (`check_teacher`).
"""

import hashlib
import importlib
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.checkpoint import checkpoint_fit
from bert_jax.inference import loading as inference
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib
from bert_jax.training import trainer_lib

ConfigError = trainer_lib.ConfigError
TEACHER_FAMILIES = ("bert", "spanbert", "distilbert")   # a plain post-LN encoder + MLM head


class Teacher(NamedTuple):
  path: str                        # --config.teacher_checkpoint as given
  pretrained: trainer_lib.Pretrained   # None: shapes only, for bert_jax.plan (planning_teacher)
  model_config: model_lib.BertConfig   # the checkpoint's encoder, run dtype, MLM only
  record: dict                     # what the checkpoint meta stores (teacher_record)


# ----------------------------------------------------------------------------------------------
# The teacher: found, checked and recorded before compute.
# ----------------------------------------------------------------------------------------------
def _hf_weights_sha256(folder):
  """sha256 over a Hugging Face folder's config.json and weight files (names and contents)."""
  h = hashlib.sha256()
  for name in sorted(os.listdir(folder)):
    if name == "config.json" or name in inference.HF_WEIGHTS or name.endswith(".safetensors"):
      h.update(f"{name}:{manifest_lib.sha256_file(os.path.join(folder, name))};".encode())
  return h.hexdigest()


def teacher_record(path, described):
  """{path, directory, sha256}: the teacher a run distils from, as its checkpoints record it."""
  if inference.is_hf_folder(path):
    return dict(path=path, directory=os.path.abspath(path), sha256=_hf_weights_sha256(path))
  directory = str(described.directory)
  if not manifest_lib.has_manifest(directory):
    raise ConfigError(f"config.teacher_checkpoint={path}: {directory} has no "
                      f"{manifest_lib.NAME} (written before manifests existed); re-export it "
                      "(python -m bert_jax.convert) so the run can record and verify its teacher.")
  return dict(path=path, directory=directory,
              sha256=manifest_lib.sha256_file(os.path.join(directory, manifest_lib.NAME)))


def _layerwise():
  """bert_jax/objectives/layerwise.py (it imports this module: imported when first called)."""
  return importlib.import_module("bert_jax.objectives.layerwise")


def check_loss_settings(config):
  """The loss weights and the temperature in range (layerwise.weights), as task distillation
  checks its own (finetune.load_distill_teacher): T = 0 divided the logits by zero (every step
  NaN, skipped, and a run that ended with exit 0 and an untrained student); a negative weight
  rewards the student for moving away from its teacher."""
  _layerwise().weights(config)


def read_teacher(config, path, how):
  """(read_pretrained of --config.teacher_checkpoint, the path it read (an HF folder's
  conversion), how errors name it), for DistilBERT's and the layer-wise (TinyBERT) teachers. A
  missing flag or path is one line (`how`: what the student does, "distils from a teacher")."""
  if not path:
    raise ConfigError(f"config.model_name={config.model_name} {how}: pass "
                      "--config.teacher_checkpoint=WORKDIR, export or Hugging Face BERT folder.")
  if not (inference.is_hf_folder(path) or os.path.exists(path) or "://" in path):
    raise ConfigError(f"config.teacher_checkpoint={path}: no such directory; give a BERT "
                      "workdir, a params export or a Hugging Face folder.")
  source = inference.from_hf_folder(path) if inference.is_hf_folder(path) else path
  return (trainer_lib.read_pretrained(source), source, f"config.teacher_checkpoint={path}")


def load_teacher(config, model_config) -> Teacher:
  """The teacher of a distilbert-* run: described and verified (no array read), checked against
  the student (vocab, width, depth), recorded. One-line ConfigError before any compute."""
  path = config.get("teacher_checkpoint", "")
  if model_config.family != "distilbert":
    if path:
      raise ConfigError(f"config.teacher_checkpoint={path} is set but config.model_name="
                        f"{config.model_name} is not a distilbert-* preset; drop the teacher or "
                        "pick --config=bert_jax/configs/pretrain.py:distilbert-base.")
    return None
  check_loss_settings(config)
  pre, source, where = read_teacher(config, path, "distils from a teacher")
  t, s = pre.model_config, model_config
  if t.family not in TEACHER_FAMILIES or t.factorised or t.share_layers != "none":
    raise ConfigError(f"{where} is a {t.family} model; the teacher must be a BERT-style encoder "
                      f"({', '.join(TEACHER_FAMILIES)}) without factorised or shared layers.")
  missing = [k for k in ("bert", "mlm_head") if trainer_lib.stored_subtree(pre, k) is None]
  fresh = [p for p in pre.meta.get("initialized_randomly", []) if p.startswith("mlm_head/")]
  if missing or fresh:
    why = f"no {missing} parameters" if missing else f"{fresh[0]} was initialised randomly"
    raise ConfigError(f"{where} has no trained MLM head ({why}); "
                      "distillation matches the teacher's MLM logits: use a BertForPreTraining "
                      "or BertForMaskedLM checkpoint.")
  diff = checkpoint_fit.differences(t, s, ("vocab_size", "hidden_size"))
  if diff:
    raise ConfigError(f"{where} does not fit the student {config.model_name} (teacher vs "
                      f"student: {diff}); the logits and hidden states are compared one to one: "
                      "use the teacher's vocab and a student of its width.")
  layer_map(config, t.num_layers, s.num_layers)   # the init's layers exist (checked now)
  _layerwise().layer_map(config, t.num_layers, s.num_layers)   # and the loss's map
  _layerwise().check_fit(config, t, s, where)      # fit_size, heads for alpha_att
  _layerwise().check_kernels(config, s)            # scores for alpha_att: the xla kernel
  if s.max_position_embeddings > t.max_position_embeddings:
    raise ConfigError(f"{where} has max_position_embeddings={t.max_position_embeddings} but the "
                      f"student {s.max_position_embeddings}; set --config.model."
                      f"max_position_embeddings={t.max_position_embeddings}.")
  described = ckpt_lib.describe(source, verify=False)
  check_teacher_vocab(config, pre, described, where)
  return Teacher(path, pre, _as_teacher(t, s), teacher_record(path, described))


def check_teacher_vocab(config, pre, described, where):
  """The teacher's logits index its own vocabulary, so the student (and the records, which the
  data contract ties to the student's vocab) must use the same one, identified by content
  (issue 32: a teacher with another vocab of the same size trained, silently wrong;
  checkpoint_fit owns the comparison). A teacher that identifies no vocabulary is said so in a
  note; synthetic runs have no vocab file."""
  flag, student = checkpoint_fit.run_vocab_flag(config)
  if not student:
    return
  recorded, how = inference.checkpoint_vocab(described.kind, described.directory, pre.meta)
  if recorded is None:
    print(f"note: {where} records no vocabulary and bundles none: the student's {student} "
          "cannot be compared with the teacher's (only their sizes match).", flush=True)
    return
  checkpoint_fit.check_vocab(
      where, recorded, how, f"the student's {flag}={student}", student, error=ConfigError,
      fix="the teacher's logits index its own vocabulary: train the student with the "
          "teacher's vocab, on records made with it.")


def _as_teacher(t, s):
  """The teacher's encoder `t` as the step runs it: MLM only, in the student's (`s`) compute
  dtype and attention kernel, without remat or dropout."""
  return model_lib.BertConfig.from_dict({   # the teacher family's record (MobileBERT's own)
      **t.to_dict(), "objectives": "mlm", "dtype": s.dtype, "attention": s.attention,
      "remat": False, "hidden_dropout_prob": 0.0, "attention_dropout_prob": 0.0})


def planning_teacher(config, model_config):
  """The teacher bert_jax.plan compiles a distilbert-* step with, as shapes only (Teacher with
  pretrained=None: frozen_teacher reads no array; the plan's devices are compile-only): the
  --config.teacher_checkpoint's encoder, checked as load_teacher checks it for train; without
  one, the BERT preset the student preset halves (distilbert-base -> base: bert_jax/models/model.py's
  presets). None for other families."""
  if model_config.family != "distilbert" or config.get("teacher_checkpoint", ""):
    teacher = load_teacher(config, model_config)
    return teacher._replace(pretrained=None) if teacher else None
  check_loss_settings(config)
  preset = str(config.model_name).removeprefix("distilbert-")
  if preset == config.model_name or preset not in model_lib.PRESETS or \
      model_lib.PRESETS[preset].get("family", "bert") not in TEACHER_FAMILIES:
    raise ConfigError(f"config.model_name={config.model_name} distils from a teacher, and no "
                      "BERT preset of its size is known to plan with: pass "
                      "--config.teacher_checkpoint=WORKDIR, export or Hugging Face BERT folder.")
  t = model_lib.get_bert_config(preset, vocab_size=model_config.vocab_size,
                                max_position_embeddings=model_config.max_position_embeddings)
  layer_map(config, t.num_layers, model_config.num_layers)
  _layerwise().check_teacher_config(config, t, model_config, f"the {preset} preset")
  _layerwise().check_kernels(config, model_config)
  return Teacher(f"the {preset} preset (shapes only: no --config.teacher_checkpoint)", None,
                 _as_teacher(t, model_config), None)


def check_teacher(meta, teacher, workdir):
  """A resumed distillation must keep its teacher: the recorded one (checkpoint meta) and this
  run's, by path and sha256; a one-line ConfigError naming both sides."""
  was = meta.get("teacher")
  now = teacher.record if teacher else None
  if not was and not now:
    return
  if not was or not now or was["sha256"] != now["sha256"]:
    side = lambda r: f"{r['path']} (sha256 {r['sha256'][:16]})" if r else "none"  # noqa: E731
    raise ConfigError(f"--workdir={workdir} was distilled from teacher {side(was)} but this run "
                      f"has --config.teacher_checkpoint={side(now)}; resume with the same "
                      "teacher, or use a new --workdir.")


# ----------------------------------------------------------------------------------------------
# The student's initialisation from the teacher.
# ----------------------------------------------------------------------------------------------
def layer_map(config, teacher_layers, student_layers):
  """Teacher layer of each student layer: --config.teacher_layers (comma-separated) or every
  other one (0, 2, 4, ...)."""
  spec = config.get("teacher_layers", "") or ""
  try:
    layers = ([int(x) for x in spec.split(",") if x.strip()] if spec
              else [2 * i for i in range(student_layers)])
  except ValueError:
    raise ConfigError(f"config.teacher_layers={spec!r}: expected comma-separated layer numbers, "
                      "e.g. 0,2,4,7,9,11.") from None
  if len(layers) != student_layers or not all(0 <= l < teacher_layers for l in layers):
    raise ConfigError(f"config.teacher_layers={spec or 'every other'} gives teacher layers "
                      f"{layers} for a {student_layers}-layer student of a {teacher_layers}-layer "
                      f"teacher; give {student_layers} numbers below {teacher_layers} "
                      "(--config.teacher_layers=...).")
  return layers


def student_from_teacher(teacher_params, student_params, layers):
  """student_params with its embeddings (word, position, LayerNorm), layer_i = the teacher's
  layer layers[i] and the MLM head taken from the teacher (HF extract_distilbert); the
  teacher's token-type table and pooler are left out. Works on numpy or (sharded) jax arrays."""
  tb, sb = teacher_params["bert"], student_params["bert"]
  embeddings = {k: tb["embeddings"][k] for k in sb["embeddings"]}
  n = sb["embeddings"]["position_embeddings"]["embedding"].shape[0]
  embeddings["position_embeddings"] = {
      "embedding": tb["embeddings"]["position_embeddings"]["embedding"][:n]}
  encoder = {f"layer_{i}": tb["encoder"][f"layer_{l}"] for i, l in enumerate(layers)}
  return dict(student_params, bert=dict(sb, embeddings=embeddings, encoder=encoder),
              mlm_head=teacher_params["mlm_head"])


def init_student(state, t, config, teacher: Teacher, student_layers):
  """A fresh run's state with the student's parameters from the loaded teacher (t.frozen), put
  on the student's shardings; optimizer state fresh."""
  layers = layer_map(config, teacher.model_config.num_layers, student_layers)
  # In one jit (the arrays may span hosts: no slicing outside it) and as copies on the
  # student's shardings: the train step donates the state's buffers, and one shared with the
  # teacher's (an argument of the same step) would be freed under it.
  shardings = jax.tree.map(lambda s: s.sharding, t.abstract_state["params"])
  params = jax.jit(lambda tp, sp: jax.tree.map(jnp.copy, student_from_teacher(tp, sp, layers)),
                   out_shardings=shardings)(t.frozen, state["params"])
  if jax.process_index() == 0:
    print(f"initialised the student from teacher {teacher.path}: layers {layers} of "
          f"{teacher.model_config.num_layers}, embeddings and MLM head", flush=True)
  return dict(state, params=params)


# ----------------------------------------------------------------------------------------------
# The step: layerwise.py's (families/distilbert.py's step_parts), under DistilBERT's names.
# ----------------------------------------------------------------------------------------------
def loss_weights(config):
  """{part: weight} from the config's alpha_* fields (HF's recipe by default): layerwise.weights."""
  return _layerwise().weights(config)


def student_forward(config):
  """The student's forward at the config's parts and temperature: layerwise.student_forward."""
  return _layerwise().student_forward(config)


def frozen_teacher(teacher: Teacher, dummy_batch, mesh, rules) -> trainer_lib.Frozen:
  """The teacher's bert + mlm_head parameters read once into their shardings and its outputs
  for the recipe's parts (MLM logits, last hidden states): layerwise.frozen_teacher."""
  return _layerwise().frozen_teacher(teacher, dummy_batch, mesh, rules, head=True)


def flops_per_sequence(model_config, teacher_config, seq_length, num_predictions, flops_fn):
  """Training FLOPs per sequence: the student's (forward + backward, flops_fn: its family's
  network count) plus the teacher's forward, a third of its training FLOPs as its own family
  counts them (a BERT teacher of a MobileBERT student has no bottleneck for MobileBERT's count:
  that was an AttributeError)."""
  teacher_flops = families.get(teacher_config.family).flops_per_sequence
  return (flops_fn(model_config, seq_length, num_predictions, 0)
          + teacher_flops(teacher_config, seq_length, num_predictions, 0) // 3)

