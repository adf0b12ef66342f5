"""The frozen teacher that distillation reads, whatever the student: found, checked against the
student (vocab by content, width, depth) and recorded before compute, compared on resume, and the
student's initialisation from its layers. DistilBERT's run (families/distilbert/distil.py) and
the layer-wise students (layerwise.py: TinyBERT, MobileBERT) both use it.

  Teacher            path, the read checkpoint (None: shapes only, for bert_jax.plan), its
                     encoder's BertConfig as the step runs it, the record its meta stores
  read_teacher       --config.teacher_checkpoint read (a workdir, an export or a transformers
                     folder, converted on the fly)
  teacher_record     {path, directory, sha256}: what a run's checkpoints record of its teacher
  check_teacher      a resume keeps its teacher (the recorded sha256 against this run's)
  layer_map / init_student
                     the teacher layer of each student layer (every other one by default, as
                     the DistilBERT paper, or --config.teacher_layers) and a fresh run's student
                     from them: embeddings, those layers, the MLM head
  no_teacher         the default of every family that does not distil: a --config.teacher_checkpoint
                     given to it is one line

Which families may teach is each family's `plain_teacher` field (a post-LN BERT encoder with an
MLM head: BERT, SpanBERT, DistilBERT); a layer-wise student may also learn from a family whose
own network gives layer-wise outputs (layerwise.py).
"""

import hashlib
import os
from typing import NamedTuple

import jax
import jax.numpy as jnp

from bert_jax import families
from bert_jax.checkpoint import checkpoint_fit
from bert_jax.inference import loading as inference
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib
from bert_jax.training import trainer_lib

ConfigError = trainer_lib.ConfigError


def plain_teachers():
  """The families a BERT-shaped student may learn from as it learns from BERT (their record's
  plain_teacher: a post-LN encoder + MLM head), in the table's order."""
  return tuple(n for n in families.names() if families.get(n).plain_teacher)


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


def as_teacher(t, s):
  """The teacher's encoder `t` as the step runs it: MLM only, in the student's (`s`) compute
  dtype and attention kernel, without remat or dropout."""
  return model_lib.BertConfig.from_dict({   # the teacher family's record (MobileBERT's own)
      **t.to_dict(), "objectives": "mlm", "dtype": s.dtype, "attention": s.attention,
      "remat": False, "hidden_dropout_prob": 0.0, "attention_dropout_prob": 0.0})


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


def no_teacher(config, model_config):
  """Every family's teacher hook unless it distils (BERT's record holds it): None, and a
  --config.teacher_checkpoint given to a model that learns from no teacher is one line."""
  path = config.get("teacher_checkpoint", "")
  if path:
    raise ConfigError(f"config.teacher_checkpoint={path} is set but config.model_name="
                      f"{config.model_name} ({model_config.family}) distils from no teacher; drop "
                      "the teacher or pick a student preset (distilbert-*, tinybert-*, "
                      "mobilebert-*: docs/models.md).")
  return None


# ----------------------------------------------------------------------------------------------
# FLOPs of a step with a teacher.
# ----------------------------------------------------------------------------------------------
def flops_per_sequence(model_config, teacher_config, seq_length, num_predictions, flops_fn):
  """Training FLOPs per sequence: the student's (forward + backward, flops_fn: its family's
  network count) plus the teacher's forward, a third of its training FLOPs as its own family
  counts them (a BERT teacher of a MobileBERT student has no bottleneck for MobileBERT's count:
  that was an AttributeError)."""
  teacher_flops = families.get(teacher_config.family).flops_per_sequence
  return (flops_fn(model_config, seq_length, num_predictions, 0)
          + teacher_flops(teacher_config, seq_length, num_predictions, 0) // 3)

