"""Distillation into the embedding task's bi-encoder (issue 48 item 4; docs/retrieval.md): its
settings, the training split's teacher arrays, the distillation terms of the loss
(objectives/embedding_distill.py: sentence-transformers' MarginMSELoss, EmbedDistillLoss), and
the bi-encoder teacher run frozen inside the training step.

  distillation_settings  config.embedding's fields -> EmbeddingTask's, checked before compute
  teacher_features       the train split's teacher_margins [N, k] and teacher_embeddings [N, S, G]
  distill_terms          MarginMSE and the distance to the teacher's vectors (projected)
  load                   --config.embedding.teacher_checkpoint, frozen in the step

The teacher in the step: --config.embedding.teacher_checkpoint=DIR, an embedding run's export
(best_epoch{N}/, or one converted from a sentence-transformers folder) or a sentence-transformers
folder itself.

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

import numpy as np

from bert_jax import families
from bert_jax.objectives import embedding_distill
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


def teacher_width(path):
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


# ----------------------------------------------------------------------------------------------
# Settings, the training split's arrays, the loss's terms, the export's record.
# ----------------------------------------------------------------------------------------------
# The per-example arrays the training batches carry for distillation: [B, k], [B, S, G].
DISTILL_KEYS = ("teacher_margins", "teacher_embeddings")


def distillation_settings(e, config):
  """config.embedding's distillation fields -> EmbeddingTask's, checked before any compute (one
  line naming the field and the fix); teacher_dim read from the teacher's .npy header or its
  checkpoint's config (no array read)."""
  out = dict(info_nce_weight=float(e.get("info_nce_weight", 1.0)),
             margin_mse_weight=float(e.get("margin_mse_weight", 0.0)),
             margin_mse_similarity=str(e.get("margin_mse_similarity", "dot")),
             embed_distill_weight=float(e.get("embed_distill_weight", 0.0)),
             embed_distill_distance=str(e.get("embed_distill_distance", "cosine")),
             embed_distill_projection=bool(e.get("embed_distill_projection", True)),
             teacher_embeddings=str(e.get("teacher_embeddings", "") or ""),
             teacher_checkpoint=str(e.get("teacher_checkpoint", "") or ""),
             guide_from_teacher=bool(e.get("guide_from_teacher", False)))
  weights = {k: out[k] for k in ("info_nce_weight", "margin_mse_weight", "embed_distill_weight")}
  wrong = (
      next((f"{k}={v}: a loss weight must be >= 0." for k, v in weights.items() if v < 0), None)
      or (None if any(weights.values()) else
          "info_nce_weight, margin_mse_weight and embed_distill_weight are all 0: no loss to "
          "train; set one above 0 (info_nce_weight=1 is plain contrastive training).")
      or (None if out["margin_mse_similarity"] in embedding_distill.SIMILARITIES else
          f"margin_mse_similarity={out['margin_mse_similarity']!r}; use one of "
          f"{', '.join(embedding_distill.SIMILARITIES)} (sentence-transformers' MarginMSELoss: "
          "dot).")
      or (None if out["embed_distill_distance"] in embedding_distill.DISTANCES else
          f"embed_distill_distance={out['embed_distill_distance']!r}; use one of "
          f"{', '.join(embedding_distill.DISTANCES)} (sentence-transformers' EmbedDistillLoss).")
      or ("guide_from_teacher=True needs --config.embedding.teacher_checkpoint=DIR (the "
          "frozen model whose vectors guide), and no guide_embeddings file beside it."
          if out["guide_from_teacher"] and (not out["teacher_checkpoint"]
                                            or e.get("guide_embeddings")) else None)
      or (f"{'teacher_checkpoint' if out['teacher_checkpoint'] else 'teacher_embeddings'} "
          "is given but margin_mse_weight and embed_distill_weight are 0 (and no "
          "guide_from_teacher): the teacher would teach nothing; set a distillation weight "
          "above 0, or drop the teacher."
          if (out["teacher_checkpoint"] or out["teacher_embeddings"]) and not (
              out["margin_mse_weight"] or out["embed_distill_weight"]
              or (out["guide_from_teacher"] and out["teacher_checkpoint"])) else None)
      or ("embed_distill_weight > 0 needs the teacher's vectors: set "
          "--config.embedding.teacher_embeddings=FILE.npy (precomputed, [rows, texts a row, G]) "
          "or --config.embedding.teacher_checkpoint=DIR (run frozen in the step)."
          if out["embed_distill_weight"] and not (out["teacher_embeddings"]
                                                  or out["teacher_checkpoint"]) else None))
  if wrong:
    raise TaskDataError(f"config.embedding.{wrong}")
  if out["embed_distill_weight"] and out["teacher_embeddings"]:
    out["teacher_dim"] = int(text_vectors("teacher_embeddings", out["teacher_embeddings"],
                                          config, config.custom.train_file).shape[-1])
  elif out["teacher_checkpoint"]:
    out["teacher_dim"] = teacher_width(out["teacher_checkpoint"])
  return out


def text_vectors(field, value, config, train_path, num_rows=None, width=None):
  """config.embedding.<field> (guide_embeddings, teacher_embeddings; under data_dir unless
  absolute): a model's vectors of the train file's texts, [N, S, G] in its rows' order, any G
  (the model's width). Local, memory-mapped when float32 (each batch reads its rows). Checked
  against the train file (num_rows, width) before any compute."""
  who = "guide" if field.startswith("guide") else "teacher"
  path = os.path.join(config.data_dir, value)
  if files_lib.is_remote(path) or not os.path.isfile(path):
    raise TaskDataError(f"config.embedding.{field}={value!r}: no local file {path}; write the "
                        f"{who}'s vectors of {train_path}'s texts there ([rows, texts a row, G] "
                        f"float32 .npy) or set it to ''.")
  vectors = np.load(path, mmap_mode="r")
  if vectors.ndim != 3 or (num_rows is not None and vectors.shape[:2] != (num_rows, width)):
    has = (f"{train_path} has {num_rows} rows of {width} texts; expected [{num_rows}, {width}, "
           "G]" if num_rows is not None else "expected [rows of the train file, texts a row, G]")
    raise TaskDataError(f"{path}: {who} embeddings of shape {vectors.shape}, but {has} (one "
                        "vector per text, in the file's row and column order).")
  return vectors if vectors.dtype == np.float32 else vectors.astype(np.float32)


def teacher_features(task, config, path, every, rows, width):
  """The training split's distillation arrays: teacher_margins [N, k] (the file's scores, for
  MarginMSE) and teacher_embeddings [N, S, G] (the .npy, for embedding distillation); {} when
  distillation is off. One line before compute when MarginMSE has nothing to learn from."""
  out = {}
  if task.margin_mse_weight:
    if width < 3:
      raise TaskDataError(f"{path}: rows with no hard negatives, but config.embedding."
                          f"margin_mse_weight={task.margin_mse_weight:g}: MarginMSE learns the "
                          "margin between the positive and each hard negative; add negatives "
                          "(python -m bert_jax.mine --output_scores) or set the weight to 0.")
    if rows[0].teacher_margins is not None:
      out["teacher_margins"] = np.array([r.teacher_margins for r in rows], np.float32)  # [N, k]
    elif not task.teacher_checkpoint:
      raise TaskDataError(f"{path}: no teacher scores (a 'scores' column of 1 + k numbers, or a "
                          f"'label' of k margins) and no config.embedding.teacher_checkpoint, but"
                          f" config.embedding.margin_mse_weight={task.margin_mse_weight:g}; mine "
                          "the file with python -m bert_jax.mine --output_scores, or set "
                          "--config.embedding.teacher_checkpoint=DIR (scores in the step).")
  if task.embed_distill_weight and task.teacher_embeddings:
    out["teacher_embeddings"] = text_vectors("teacher_embeddings", task.teacher_embeddings,
                                             config, path, len(every), width)[:len(rows)]
  return out


def projection_dim(task, hidden_size):
  """G of the learned projection (embedding distillation with embed_distill_projection), else 0;
  without a projection the teacher's width must be the student's (one line, before compute)."""
  if not task.embed_distill_weight:
    return 0
  if task.embed_distill_projection:
    return task.teacher_dim
  if task.teacher_dim != hidden_size:
    teacher = task.teacher_embeddings or task.teacher_checkpoint
    raise TaskDataError(f"config.embedding.embed_distill_projection=False, but the teacher's "
                        f"vectors ({teacher}) are {task.teacher_dim} wide and the student's "
                        f"{hidden_size}: set embed_distill_projection=True (a learned "
                        f"{hidden_size} -> {task.teacher_dim} map) or use a teacher of width "
                        f"{hidden_size}.")
  return 0


def distill_keys(task):
  """The distillation arrays this task's training batches carry (teacher_features)."""
  return (("teacher_margins",) if task.margin_mse_weight else ()) + (
      ("teacher_embeddings",) if task.embed_distill_weight and task.teacher_embeddings else ())


def split_outputs(task, outputs):
  """A training step's [B, S, H (+ G)] outputs -> (the student's [B, S, H] vectors, their
  [B, S, G] projection; the vectors again when there is no projection)."""
  g = task.teacher_dim if task.embed_distill_weight and task.embed_distill_projection else 0
  return (outputs[..., :-g], outputs[..., -g:]) if g else (outputs, outputs)


def distill_terms(task, student, projected, batch):
  """{margin_mse, embed_distill}: the distillation terms this task asks for (unweighted).
  The teacher's margins are the file's (teacher_margins [B, k]) or those of a teacher in the
  step (teacher_vectors [B, S, G]: cosines, as its sentence-transformers model.similarity
  scores); its vectors the .npy's (teacher_embeddings) or the step's."""
  w, terms = batch["example_weights"], {}
  if task.margin_mse_weight:
    margins = batch.get("teacher_margins")
    if margins is None:
      margins = embedding_distill.margins_of_scores(
          embedding_distill.teacher_scores(batch["teacher_vectors"]))
    terms["margin_mse"] = embedding_distill.margin_mse(
        student[:, 0], student[:, 1:], margins, task.margin_mse_similarity, w)
  if task.embed_distill_weight:
    target = batch.get("teacher_embeddings")
    target = batch["teacher_vectors"] if target is None else target
    terms["embed_distill"] = embedding_distill.embed_distill(
        projected, target, task.embed_distill_distance, w)
  return terms


def export_record(task):
  """best_epoch{N}'s "distillation" record ({} without distillation)."""
  if not (task.margin_mse_weight or task.embed_distill_weight):
    return {}
  g = task.teacher_dim if task.embed_distill_weight and task.embed_distill_projection else 0
  return {"distillation": {
      "info_nce_weight": task.info_nce_weight, "margin_mse_weight": task.margin_mse_weight,
      "margin_mse_similarity": task.margin_mse_similarity,
      "embed_distill_weight": task.embed_distill_weight,
      "embed_distill_distance": task.embed_distill_distance,
      "teacher": task.teacher_checkpoint or task.teacher_embeddings or "the train file's scores",
      "distill_projection": (f"a {g}-wide Dense kept beside 'bert' for a resume and this "
                             "run's predictions; no part of the embedding: predict embed, "
                             "extract_features and the sentence-transformers export read "
                             "'bert' alone" if g else None)}}
