"""A bi-encoder teacher run frozen inside the embedding task's training step (issue 48 item 4):
--config.embedding.teacher_checkpoint=DIR, an embedding run's export (best_epoch{N}/, or one
converted from a sentence-transformers folder) or a sentence-transformers folder itself.

Each step, the teacher embeds the batch's own texts (the student's token ids: its tokenizer must
be the student's, checked by content before compute) with its recorded pooling, deterministic and
under stop_gradient, into "teacher_vectors" [B, S, G] (packed rows: [R, K, G], mapped back by the
loss as the student's). MarginMSE reads its cosines (embedding_distill.teacher_scores: what its
sentence-transformers model.similarity gives, which mine --output_scores writes), embedding
distillation its vectors. The machinery is the classification teacher's (finetune.py
teacher_frozen, trainer_lib.load_frozen): parameters read once into their shardings, the third
argument of the jitted step, recorded by content for a resume.

What a teacher is not, refused in one line before compute: a cross-encoder (a transformers
SequenceClassification folder, a classification/regression export: one score per pair, no
vectors; precompute its scores into the file's scores column instead), a checkpoint that records
no sentence embedding (a plain pre-trained encoder), a tokenizer that is not the student's.
"""

import json
import os
from typing import Any, NamedTuple

from bert_jax import families
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.convert import sentence_transformers
from bert_jax.inference import loading as inference
from bert_jax.training import trainer_lib
from bert_jax_core import files as files_lib
from data_pipelines.tasks.common import TaskDataError


def checkpoint_record(path):
  """The "sentence_embedding" record of a checkpoint: a sentence-transformers folder's settings
  (read from its files), an export's bert_config.json "sentence_embedding" (an embedding run's
  best export, a converted sentence-transformers folder), else {}."""
  if not path:
    return {}
  if sentence_transformers.is_st_folder(path):
    return sentence_transformers.read_folder(path)
  if families.is_hf_folder(path):   # a plain transformers folder records nothing
    return {}
  return ckpt_lib.describe(path, verify=False).meta.get("sentence_embedding") or {}


class StepTeacher(NamedTuple):
  """finetune.DistillTeacher's fields (its teacher_frozen and resume record read them)."""
  model: Any                     # embedding.EmbeddingModel of the teacher's config and pooling
  pretrained: trainer_lib.Pretrained
  line: str                      # the start-up line
  record: dict = None            # {path, directory, sha256}
  output_key: str = "teacher_vectors"


def _where(path):
  return f"config.embedding.teacher_checkpoint={path}"


def _refuse_cross_encoder(path):
  """A transformers folder of a SequenceClassification model (sentence-transformers'
  CrossEncoder saves one) is a cross-encoder: one line."""
  config = os.path.join(path, "config.json")
  if "://" in path or not os.path.isfile(config):
    return
  with open(config, encoding="utf-8") as f:
    arch = (json.load(f).get("architectures") or [""])[0]
  if arch.endswith(("ForSequenceClassification", "ForTokenClassification")):
    raise TaskDataError(f"{_where(path)}: a {arch} folder is a cross-encoder (one score per "
                        "(query, document) pair, no sentence vectors); a teacher in the step is a "
                        "bi-encoder (an embedding export or a sentence-transformers folder). "
                        "Precompute a cross-encoder's scores into the train file's 'scores' "
                        "column (1 + k per row) and drop teacher_checkpoint.")


def found(path):
  """The teacher's InferenceModel (no arrays) after the bi-encoder checks: not a cross-encoder,
  a "sentence_embedding" record (its pooling)."""
  _refuse_cross_encoder(path)
  model = inference.load_for_inference(path, with_params=False)
  meta = model.meta
  if meta.get("task_type") not in (None, "embedding"):
    raise TaskDataError(f"{_where(path)}: {model.description} is a {meta.get('task_type')} "
                        f"export (task {meta.get('task')!r}: a cross-encoder or classifier, no "
                        "sentence vectors); a teacher in the step is a bi-encoder: an embedding "
                        "run's best_epoch{N}/ or a sentence-transformers folder. Precompute its "
                        "scores into the train file's 'scores' column instead.")
  if not checkpoint_record(path):
    raise TaskDataError(f"{_where(path)}: {model.description} records no sentence embedding "
                        "(no pooling: a pre-trained encoder, not a trained bi-encoder); pass an "
                        "embedding run's best_epoch{N}/ or a sentence-transformers folder.")
  return model


def width(path):
  """G: the teacher's vector width (its encoder's hidden size), from its config (no arrays)."""
  return int(found(path).config.hidden_size)


def _tokenizer_file(model):
  return model.tokenizer_json or model.vocab_file or model.spm_model_file


def check_same_tokenizer(path, teacher, tokenizer):
  """The teacher reads the student's token ids in the step: its tokenizer file (by content) and
  casing must be the student's; one line naming both and the fix."""
  mine, theirs = str(tokenizer.vocab.path), str(_tokenizer_file(teacher))
  same_file = files_lib.sha256_file(mine) == files_lib.sha256_file(theirs)
  same_case = bool(teacher.do_lower_case) == bool(tokenizer.do_lower_case)
  if same_file and same_case:
    return
  side = lambda f, lower, size: (f"{f} ({size} tokens, "  # noqa: E731
                                 f"{'lower-cased' if lower else 'cased'})")
  theirs = side(theirs, teacher.do_lower_case, teacher.tokenizer.vocab.size)
  raise TaskDataError(
      f"{_where(path)}: its tokenizer {theirs} is not the student's "
      f"{side(mine, tokenizer.do_lower_case, tokenizer.vocab.size)}: in "
      "the step it would read the student's token ids as its own; use a teacher of the "
      "student's vocabulary, or precompute with the teacher's own tokenizer: its scores "
      "(python -m bert_jax.mine --output_scores -> the 'scores' column) or its vectors "
      "(--config.embedding.teacher_embeddings=FILE.npy).")


def load(task, config, tokenizer, make_model):
  """The StepTeacher of task.teacher_checkpoint, or None; checked before compute, reads the
  parameters' metadata only (load_frozen reads the arrays into their shardings).
  make_model(model_config, pooling): the embedding task's model (embedding.EmbeddingModel)."""
  path = task.teacher_checkpoint
  if not path or not (task.margin_mse_weight or task.embed_distill_weight
                      or task.guide_from_teacher):
    return None
  teacher = found(path)
  check_same_tokenizer(path, teacher, tokenizer)
  c = ckpt_lib.config_from_checkpoint(teacher.config, {"dtype": config.model.dtype},
                                      _where(path))
  trainer_lib.check_max_length(config.max_seq_length, "max_seq_length", c)
  pooling = checkpoint_record(path).get("pooling") or "mean"
  uses = " and ".join(use for use, on in (
      ("MarginMSE's scores (its cosines; a train file's own scores column comes first)",
       task.margin_mse_weight),
      ("the vectors embedding distillation targets",
       task.embed_distill_weight and not task.teacher_embeddings),
      ("the GIST guide's vectors", task.guide_from_teacher)) if on)
  line = (f"teacher_checkpoint: {teacher.description} ({c.family}, {c.num_layers} layers of "
          f"width {c.hidden_size}, {pooling} pooling), frozen in every step: {uses}")
  return StepTeacher(make_model(c, pooling),
                     trainer_lib.read_pretrained(teacher.checkpoint), line,
                     _record(path, teacher.path))


def _record(path, directory):
  """{path, directory, sha256}: the teacher by content, as finetune's distill teacher record."""
  directory = str(directory)
  manifest = os.path.join(directory, manifest_lib.NAME)
  return dict(path=path, directory=directory,
              sha256=manifest_lib.sha256_file(manifest) if manifest_lib.has_manifest(directory)
              else None)
