"""Sentence embeddings (issue 40): contrastive fine-tuning of any family's encoder on pairs or
triplets, task=custom with --config.custom.type=embedding.

  data      rows (anchor, positive, negative...) in sentence-transformers' columns
            (data_pipelines/tasks/pairs.py), prompts from config.embedding; each text its own
            sequence: input_ids [N, S, T], S = 2 + hard negatives
  head      the family's body on [B*S, T], pooled per sequence (mean / cls / last) -> [B, S, H];
            no new parameters (the tree is {"bert"})
  loss      InfoNCE over the global batch (contrastive.matryoshka_info_nce: sentence-transformers'
            MultipleNegativesRankingLoss, Matryoshka sums), padding rows out; opt-in false
            negatives out: mask_duplicates (text_ids: text_numbers), guide_embeddings (GISTEmbed:
            guide_vectors), both carried by the training batches (false_negatives_of);
            distillation (distillation_loss; docs/retrieval.md): + MarginMSE on a teacher's
            margins (the file's scores: teacher_features) and the distance to its vectors
            through the head's learned distill_projection; the teacher's scores, vectors and
            GIST guide also from a bi-encoder frozen in the step (embedding_distillation)
  eval      retrieval on the dev rows: each distinct anchor against every distinct positive and
            negative text of the split (its positives relevant): nDCG@10 (picks the best epoch),
            MRR@10, Recall@1, Recall@10, trec_eval's (bert_jax/evaluation/retrieval_metrics.py); or, for a
            dev file of scored pairs (a score column, STS), Spearman of the cosine
  files     test split: <name>_<split>_embeddings.npy, [N, S, H] float32, L2-normalised
  step      config.embedding.grad_cache_chunks = N > 1: GradCache (grad_cache_step below), the
            step's gradient with one chunk of each device's rows' activations held at a time

Training batches hold no text twice where the rows allow it (pairs.no_duplicate_order: a
duplicate is a false negative). The best export records the pooling and prompts
(export_record: bert_config.json's "sentence_embedding"), which predict embed, extract_features
and the sentence-transformers export read, and a fine-tune from a checkpoint with such a record
takes them where its config leaves them unset (with_recorded_settings). --config.pack=true
packs each training batch's texts into rows (pack_batches: pooling per text, the same loss).
"""

import dataclasses
import functools
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax.objectives import contrastive
from bert_jax import families
from bert_jax.evaluation import retrieval_metrics
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.tasks import common
from bert_jax.tasks import embedding_distillation as distillation
from bert_jax.tasks import registry
from bert_jax.tasks import reranker   # a reranker's checkpoint is refused (its other product)
from data_pipelines.tasks import pairs
from data_pipelines.tasks.common import TaskDataError, pack


@dataclasses.dataclass(frozen=True)
class EmbeddingTask:
  name: str
  files: dict                    # split -> file under data_dir
  file_format: str = ""          # jsonl | csv | tsv; "" = from the extension
  pooling: str = "mean"
  scale: float = 20.0
  symmetric: bool = False
  matryoshka_dims: tuple = ()
  query_prompt: str = ""
  document_prompt: str = ""
  eval_splits: tuple = ("dev",)
  metrics: tuple = ("ndcg@10", "mrr@10", "recall@1", "recall@10")   # STS dev: ("spearman",)
  grad_cache_chunks: int = 0     # > 1: GradCache, each device's rows embedded in this many chunks
  num_negatives: int = -1        # >= 0: the hard negatives every row must hold; -1: any
  # False negatives out of the loss (contrastive.false_negatives; docs/finetuning.md):
  mask_duplicates: bool = False  # candidates with the anchor's positive's input ids
  guide_embeddings: str = ""     # a .npy [N, S, G]: a guide's vectors of the train file's texts
  margin_strategy: str = "absolute"   # GISTEmbedLoss's, with the guide
  margin: float = 0.0
  contrast_anchors: bool = True
  contrast_positives: bool = True
  # Distillation into this bi-encoder (embedding_distillation; docs/retrieval.md): the loss is
  # info_nce_weight x InfoNCE + margin_mse_weight x MarginMSE + embed_distill_weight x distance.
  info_nce_weight: float = 1.0
  margin_mse_weight: float = 0.0      # the teacher's margins: the file's scores, or the teacher's
  margin_mse_similarity: str = "dot"  # the student's similarity (ST MarginMSELoss: dot)
  embed_distill_weight: float = 0.0   # the student's vectors (projected) against the teacher's
  embed_distill_distance: str = "cosine"   # mse | l2 | cosine (ST EmbedDistillLoss)
  embed_distill_projection: bool = True    # a learned H -> G map, trained and not exported
  teacher_embeddings: str = ""        # a .npy [N, S, G]: the teacher's vectors of the train file
  teacher_checkpoint: str = ""        # a bi-encoder teacher run frozen in every step
  teacher_dim: int = 0                # G: the teacher's width (its .npy or its config)
  guide_from_teacher: bool = False    # GISTEmbed's guide: teacher_checkpoint's, in the step
  type: str = "embedding"        # the task type (this module)


def custom_task(config, labels):
  """config.custom's files and config.embedding's settings -> an EmbeddingTask."""
  del labels
  reranker.check_init_checkpoint(config.get("init_checkpoint"), "embedding")
  c, e = config.custom, with_recorded_settings(config)
  dims = tuple(int(d) for d in e.matryoshka_dims)
  wrong = contrastive.problem(e.pooling, e.scale, dims, e.get("margin_strategy", "absolute"))
  if wrong:
    raise TaskDataError(f"config.embedding.{wrong}")
  chunks = int(e.get("grad_cache_chunks", 0))
  if chunks < 0:
    raise TaskDataError(f"config.embedding.grad_cache_chunks={chunks}: must be >= 0 (0 or 1: "
                        "off; N > 1: each device's rows embedded in N chunks).")
  files = {"train": c.train_file, "dev": c.dev_file}
  if c.test_file:
    files["test"] = c.test_file
  # custom.format is "tsv" unless set: for .jsonl/.csv files left at it, read by the extension.
  tsv_default = c.format == "tsv" and not c.train_file.endswith(".tsv")
  return dev_metrics(EmbeddingTask("custom", files, "" if tsv_default else c.format, e.pooling,
                                   float(e.scale), bool(e.symmetric), dims, e.query_prompt,
                                   e.document_prompt, grad_cache_chunks=chunks,
                                   num_negatives=int(e.get("num_negatives", -1)),
                                   **false_negative_settings(e),
                                   **distillation.distillation_settings(e, config)), config)


def false_negative_settings(e):
  """config.embedding's false-negative fields -> EmbeddingTask's (missing ones: the defaults)."""
  d = EmbeddingTask("", {})
  return dict(mask_duplicates=bool(e.get("mask_duplicates", d.mask_duplicates)),
              guide_embeddings=str(e.get("guide_embeddings", "") or ""),
              margin_strategy=str(e.get("margin_strategy", d.margin_strategy)),
              margin=float(e.get("margin", d.margin)),
              contrast_anchors=bool(e.get("contrast_anchors", d.contrast_anchors)),
              contrast_positives=bool(e.get("contrast_positives", d.contrast_positives)))


def dev_metrics(task, config):
  """The task with the metrics its dev file's own columns call for: scored pairs (STS) ->
  ("spearman",), which then picks the best epoch; else retrieval's. (A dev file not there yet
  keeps retrieval's: reading it says it is missing.)"""
  dev = os.path.join(config.data_dir, task.files.get("dev") or "")
  if task.files.get("dev") and ("://" in dev or os.path.isfile(dev)) and pairs.is_scored(
      dev, task.file_format or None):
    return dataclasses.replace(task, metrics=("spearman",))
  return task


def load_split(task, split, tokenizer, config, is_training):
  common.check_files_only(task, config)
  path = os.path.join(config.data_dir, task.files[split])
  every = pairs.read_pairs(path, task.file_format or None, task.query_prompt,
                           task.document_prompt)
  rows = common.limit(every, config, is_training)
  if is_training and rows[0].score is not None:
    raise TaskDataError(f"{path}: scored pairs (a score/label column) are an evaluation set; "
                        "contrastive training reads pairs or triplets (anchor, positive, "
                        "negative...) with no score column.")
  width = len(rows[0].texts)
  if is_training and task.num_negatives >= 0 and width != 2 + task.num_negatives:
    raise TaskDataError(f"{path}: rows with {width - 2} hard negatives, but "
                        f"config.embedding.num_negatives={task.num_negatives}; give each row "
                        f"{task.num_negatives} negative columns or set num_negatives=-1 (any).")
  texts = [t for r in rows for t in r.texts]
  ids = tokenizer.encode(texts)
  cut = sum(len(x) > config.max_seq_length - 2 for x in ids)
  packed = [pack(x[:config.max_seq_length - 2], None, tokenizer.vocab, config.max_seq_length)
            for x in ids]
  features = {k: np.stack([p[i] for p in packed]).reshape(len(rows), width, -1)
              for i, k in enumerate(("input_ids", "input_mask", "segment_ids"))}
  if is_training and task.mask_duplicates:
    features["text_ids"] = text_numbers(features["input_ids"])
  if is_training and task.guide_embeddings:
    features["guide_embeddings"] = guide_vectors(task, config, path, len(every), width)[
        :len(rows)]
  if is_training:
    features.update(distillation.teacher_features(task, config, path, every, rows, width))
  return common.Split(split, rows, features, notes=common.note(cut, "texts truncated"))


def text_numbers(input_ids):
  """[N, S, T] token ids (0 after a text's end) -> [N, S] int32, one number per distinct token
  sequence (its rank among them): the mask_duplicates test in the step compares these numbers,
  which is comparing the texts' input ids (after prompts and truncation: what the encoder sees)."""
  n, s, t = input_ids.shape
  _, numbers = np.unique(input_ids.reshape(n * s, t), axis=0, return_inverse=True)
  return numbers.reshape(n, s).astype(np.int32)


def guide_vectors(task, config, train_path, num_rows=None, width=None):
  """config.embedding.guide_embeddings: the guide's vectors (text_vectors)."""
  return distillation.text_vectors("guide_embeddings", task.guide_embeddings, config,
                                   train_path, num_rows, width)


class EmbeddingModel(nn.Module):
  """[B, S, T] sequences -> [B, S, H] pooled float32 vectors (not normalised: the loss and the
  evaluation normalise, as sentence-transformers' cosine does).

  projection_dim G > 0 (embedding distillation through a learned projection): a Dense H -> G,
  "distill_projection", whose output training steps (deterministic=False) get after the pooled
  vectors, [B, S, H + G]; evaluation and prediction get [B, S, H] alone. The projection is
  trained with the student and is no part of the embedding (export_record)."""
  config: object
  pooling: str = "mean"
  projection_dim: int = 0

  def _with_projection(self, pooled, deterministic):
    if not self.projection_dim:
      return pooled
    projected = nn.Dense(self.projection_dim, name="distill_projection")(pooled)   # [.., G]
    return pooled if deterministic else jnp.concatenate([pooled, projected], axis=-1)

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, instance_ids=None,
               position_ids=None, cls_positions=None, deterministic=True):
    if instance_ids is not None:
      # Packed rows (config.pack, pack_batches below): [R, T], several texts a row, attention
      # and positions (learned or RoPE) per text -> [R, K, H], each text pooled on its own.
      out = families.get(self.config.family).encode(
          self.config, input_ids, input_mask, segment_ids, instance_ids=instance_ids,
          position_ids=position_ids, cls_positions=cls_positions, deterministic=deterministic)
      return self._with_projection(contrastive.pool_packed(
          out["sequence_output"], instance_ids, cls_positions.shape[1], self.pooling),
                                   deterministic)                       # [R, K, H (+ G)]
    b, s, t = input_ids.shape
    flat = lambda x: x.reshape(b * s, t)  # noqa: E731 - [B, S, T] -> [B*S, T]
    out = families.get(self.config.family).encode(self.config, flat(input_ids),
                                                  flat(input_mask), flat(segment_ids),
                                                  deterministic=deterministic)
    pooled = contrastive.pool(out["sequence_output"], flat(input_mask), self.pooling)
    return self._with_projection(pooled.reshape(b, s, -1), deterministic)   # [B, S, H (+ G)]


def _bind(task):
  """This record with the head and loss closed over the task's pooling, scale and widths."""
  def create_head(model_config, num_labels=0, num_choices=0):
    del num_labels, num_choices
    wrong = contrastive.check_width(task.matryoshka_dims, model_config.hidden_size)
    if wrong:
      raise TaskDataError(f"config.embedding.{wrong}")
    return EmbeddingModel(model_config, task.pooling,
                          distillation.projection_dim(task, model_config.hidden_size))

  def loss(outputs, batch):
    if "text_slots" in batch:   # packed rows' [R, K, H] -> the rows' texts [B, S, H]
      outputs = contrastive.texts_of_rows(outputs, batch["text_slots"])
      if "teacher_vectors" in batch:   # a teacher in the step embeds the same packed rows
        batch = dict(batch, teacher_vectors=contrastive.texts_of_rows(
            batch["teacher_vectors"], batch["text_slots"]))
    return distillation_loss(task, outputs, batch)

  return dataclasses.replace(TYPE, create_head=create_head, loss=loss, bind=None,
                             label_keys=false_negative_keys(task) + distillation.distill_keys(task),
                             train_grads=functools.partial(grad_cache_step, task),
                             pack_batches=functools.partial(pack_batches, task))


def distillation_loss(task, outputs, batch):
  """(loss, metrics) of a training batch's [B, S, H (+ G)] outputs: info_nce_weight x InfoNCE
  (+ margin_mse_weight x MarginMSE) (+ embed_distill_weight x the distance to the teacher's
  vectors: embedding_distillation.distill_terms), each term also a metric when distillation
  is on."""
  student, projected = distillation.split_outputs(task, outputs)
  terms = {}
  if task.info_nce_weight:
    terms["info_nce"] = contrastive.matryoshka_info_nce(
        student[:, 0], student[:, 1:], task.matryoshka_dims, task.scale, task.symmetric,
        batch["example_weights"], **false_negatives_of(task, batch))
  terms.update(distillation.distill_terms(task, student, projected, batch))
  weights = dict(info_nce=task.info_nce_weight, margin_mse=task.margin_mse_weight,
                 embed_distill=task.embed_distill_weight)
  value = sum(weights[k] * v for k, v in terms.items())
  return value, ({"loss": value, **terms} if set(terms) != {"info_nce"} else {"loss": value})


# The training batch's arrays the false-negative masks read ([B, S] text numbers, [B, S, G] guide
# vectors; load_split adds them to the training split when asked for).
FALSE_NEGATIVE_KEYS = ("text_ids", "guide_embeddings")


def false_negative_keys(task):
  """The arrays of FALSE_NEGATIVE_KEYS this task's loss reads (its batches carry them)."""
  return (("text_ids",) if task.mask_duplicates else ()) + (
      ("guide_embeddings",) if task.guide_embeddings else ())


def false_negatives_of(task, batch):
  """info_nce's false-negative options for a training batch (none for one without the arrays)."""
  kw = {}
  if task.mask_duplicates and "text_ids" in batch:
    kw["text_ids"] = batch["text_ids"]
  guide_key = ("teacher_vectors" if task.guide_from_teacher else
               "guide_embeddings" if task.guide_embeddings else None)
  if guide_key and guide_key in batch:   # [B, S, G]: a .npy's rows or the teacher's in the step
    g = batch[guide_key]
    kw.update(guide=(g[:, 0], g[:, 1:]), margin=task.margin, margin_strategy=task.margin_strategy,
              contrast_anchors=task.contrast_anchors, contrast_positives=task.contrast_positives)
  return kw


# ----------------------------------------------------------------------------------------------
# What cannot be learned, checked before compute (TaskType.cannot_learn; issue 49).
# ----------------------------------------------------------------------------------------------
TEMPERATURE_SCALE = 1.0   # scale below this: a temperature given as the scale (refused)
LOW_SCALE = 5.0           # scale below this: a warning (sentence-transformers' default is 20)


def cannot_learn(task, train, tokenizer, config):
  """One line where InfoNCE cannot move by construction, else [warning sentences].

  The loss of an anchor is logsumexp(scale x cos(anchor, every candidate of the batch)) minus
  its positive's term (contrastive.info_nce). It is constant, with gradient 0, when
    one candidate   a batch is one row with no hard negative: the positive alone, loss 0 (a
                    one-row train file, config.batch_size=1);
    one text        every candidate (positives, negatives) is the same sequence: every logit
                    equal, loss log(candidates). Every anchor the same sequence is refused too
                    (no query can be told from another). Compared as token ids, so a prompt
                    that leaves no room for the text at max_seq_length (every anchor cut to the
                    prompt alone: dev nDCG@10 0.34 -> 0.08 in issue 49) is found as well;
    a temperature   scale < 1: logits within +-scale, loss ~log(candidates) whatever the
                    model does (scale = 1 / temperature; 0.05 means 20).
  Warnings (a user may mean it): a scale below 5; an epoch's last batch of one row (that step's
  loss is 0); fewer distinct positives than a batch's rows (a false negative in every batch);
  rows whose negative repeats their positive. With info_nce_weight=0 (a teacher's terms alone)
  none of this is the loss: nothing to say."""
  if not task.info_nce_weight:
    return []
  ids = train.features["input_ids"]                                     # [N, S, T]
  n, s, _ = ids.shape
  k, b = s - 2, min(n, int(config.batch_size))   # hard negatives a row, rows a batch
  where = common.train_source(task, config, train)
  if task.scale < TEMPERATURE_SCALE:
    raise TaskDataError(
        f"config.embedding.scale={task.scale:g} is a temperature: InfoNCE's logits are scale x "
        f"cosine, within +-{task.scale:g}, so the loss stays near log(candidates) and cannot "
        f"learn; scale = 1 / temperature: pass --config.embedding.scale="
        f"{1 / max(task.scale, 1e-9):g} (sentence-transformers' 20 = temperature 0.05).")
  if k == 0 and b == 1:
    size = (f"{where}: 1 row" if n == 1 else
            f"config.batch_size={config.batch_size} on {where}'s rows")
    raise TaskDataError(
        f"{size} with no hard negatives: each batch is one pair, whose positive is InfoNCE's "
        "only candidate (loss 0, gradient 0 at every step); give each batch 2 or more rows "
        "(more rows, --config.batch_size >= 2) or add hard-negative columns.")
  texts = train.examples
  candidates = [x for r in texts for x in r.texts[1:]]
  if all(_rows_equal(ids[:, j], ids[0, 1]) for j in range(1, s)):
    why, fix = _why_the_same("positive and negative" if k else "positive", candidates,
                             task.document_prompt, "document_prompt", tokenizer, config)
    raise TaskDataError(f"{where}: {why}: every in-batch negative is the positive, every logit "
                        f"equal, so the loss is log(candidates) and its gradient 0; {fix}.")
  if _rows_equal(ids[:, 0], ids[0, 0]):
    why, fix = _why_the_same("anchor", [r.anchor for r in texts], task.query_prompt,
                             "query_prompt", tokenizer, config)
    raise TaskDataError(f"{where}: {why}: no query can be told from another, so the loss cannot "
                        f"learn which document goes with which; {fix}.")
  warnings = []
  if task.scale < LOW_SCALE:
    warnings.append(f"config.embedding.scale={task.scale:g}: the logits (scale x cosine) span "
                    f"only +-{task.scale:g}, so the loss moves little (scale = 1 / temperature; "
                    "sentence-transformers' 20)")
  if k == 0 and n > b and n % b == 1:
    warnings.append(f"{where}: {n} rows in batches of {b} leave each epoch a last batch of one "
                    "pair and no hard negative, whose loss and gradient are 0; drop a row or "
                    "change --config.batch_size")
  positives = set()
  for r in texts:   # up to b distinct positives: enough to fill a batch without a repeat
    positives.add(r.positive)
    if len(positives) >= b:
      break
  if len(positives) < b:
    warnings.append(f"{where}: {len(positives)} distinct positives for batches of {b} rows: "
                    "every batch holds a positive twice, one row's positive another's in-batch "
                    f"negative (a false negative); --config.batch_size={len(positives)} or "
                    "fewer avoids it")
  repeats = sum(len(set(r.texts[1:])) < len(r.texts) - 1 for r in texts)
  if repeats:
    warnings.append(f"{where}: {repeats} rows hold a hard negative equal to their positive (or "
                    "another negative): each is a false negative, a text pushed away from "
                    "itself")
  return warnings


def _rows_equal(x, row, chunk=4096):
  """Whether every row of x [N, T] equals `row` [T] (in chunks: a large split stops at the
  first chunk that differs, without an [N, T] comparison)."""
  return all((x[i:i + chunk] == row).all() for i in range(0, len(x), chunk))


def _why_the_same(side, texts, prompt, prompt_field, tokenizer, config):
  """(why every `side` sequence of the train split is the same, the fix): the same text, a
  prompt that leaves no room for the text, or texts alike for their first max_seq_length - 2
  tokens."""
  t = int(config.max_seq_length)
  if all(x == texts[0] for x in texts):
    return (f"every {side} text is {texts[0][:80]!r}",
            f"check the file's {side} column{'s' if ' and ' in side else ''}")
  room, used = t - 2, len(tokenizer.encode([prompt])[0]) if prompt else 0
  if prompt and used >= room:
    return (f"config.embedding.{prompt_field}={prompt!r} is {used} tokens and max_seq_length={t} "
            f"leaves {room} for a text, so every {side} is cut to the prompt alone",
            f"raise --config.max_seq_length above {used + 2} or shorten the prompt")
  return (f"every {side} text begins with the same {room} tokens, all that max_seq_length={t} "
          "keeps of it", "raise --config.max_seq_length")


# ----------------------------------------------------------------------------------------------
# Packed training batches (config.pack=true; issue 40 item 2).
# ----------------------------------------------------------------------------------------------
def pack_batches(task, train, config, batches, mesh):
  """config.pack=true: each training batch's B x S texts packed into R rows of T tokens (<= K
  texts a row) -> (host_batch(idx): this host's part of the packed batch of rows idx, the
  start-up line). Called before compute, with every batch of the run (its epochs' orders).

  The loss is unchanged: a batch is still B rows (anchor, positive, negatives), every text of
  them in its rows (packing.pack_texts), pooled per text (EmbeddingModel: pool_packed) and put
  back in the [B, S, H] layout by text_slots [B, S] (contrastive.texts_of_rows), so the step's
  InfoNCE over the global batch is the unpacked one's. Shapes are static: R is the most rows any
  batch of this run needs (packing.text_rows over every batch), rounded up to a multiple of the
  data-parallel devices x GradCache chunks (and hosts); a batch that needs fewer gets empty
  rows. So no text is ever dropped or moved to another batch: each batch's examples are the
  unpacked run's. Texts are cut to T as unpacked (load_split); K = config.max_instances_per_pack
  (0: T // 16, as fine-tuning's classification packs). Evaluation stays unpacked (predict
  embed, extract_features too)."""
  from data_pipelines.records import packing  # pylint: disable=g-import-not-at-top
  f = train.features                                                    # [N, S, T]
  n, s, t = f["input_ids"].shape
  k = int(config.get("max_instances_per_pack", 0) or packing.default_max_instances(t))
  if k < 1:
    raise TaskDataError(f"config.max_instances_per_pack={k}: the texts a packed row holds must "
                        f"be >= 1 (0: the default, max(2, max_seq_length // 16) = "
                        f"{packing.default_max_instances(t)}).")
  lengths = f["input_mask"].sum(-1)                                     # [N, S]
  need = max(packing.text_rows(lengths[idx], seq_length=t, max_instances=k) for idx in batches)
  hosts = jax.process_count()
  dp, chunks = sharding_lib.data_parallel_size(mesh), task.grad_cache_chunks
  multiple = math.lcm(dp * max(1, chunks), hosts)   # every device's rows in chunks; each host's
  rows = -(-need // multiple) * multiple                                # R
  b = int(config.batch_size)
  keys = ("input_ids", "input_mask", "segment_ids")

  def host_batch(idx):
    texts = {key: f[key][idx].reshape(len(idx) * s, t) for key in keys}   # [b * S, T]
    p = packing.pack_texts(texts, max_instances=k, num_rows_out=rows)
    slots = np.zeros((b, s), np.int32)               # weight-0 padding rows read slot 0
    slots[:len(idx)] = p.pop("text_slots").reshape(len(idx), s)
    weights = (np.arange(b) < len(idx)).astype(np.float32)
    h = jax.process_index()
    row_part, example_part = slice(h * rows // hosts, (h + 1) * rows // hosts), slice(
        h * b // hosts, (h + 1) * b // hosts)
    out = {key: v[row_part] for key, v in p.items()}                    # [R / hosts, ...]
    out.update(text_slots=slots[example_part], example_weights=weights[example_part])
    for key in FALSE_NEGATIVE_KEYS + distillation.DISTILL_KEYS:   # per example [b, S, ...]
      if key in f:
        v = np.zeros((b,) + f[key].shape[1:], f[key].dtype)
        v[:len(idx)] = f[key][idx]
        out[key] = v[example_part]
    return out

  real = sum(int(lengths[idx].sum()) for idx in batches)   # the run's tokens, every epoch
  line = (f"{task.name}/train: packing each batch's {b} x {s} texts into {rows} rows of {t} "
          f"tokens (<= {k} texts a row; {need} rows: the most any of the run's {len(batches)} "
          f"batches needs): real tokens per slot {real / (len(batches) * b * s * t):.3f} "
          f"unpacked -> {real / (len(batches) * rows * t):.3f} packed"
          + (f"; GradCache embeds each device's {rows // dp} rows in {chunks} chunks of "
             f"{rows // dp // chunks}" if chunks > 1 else ""))
  return host_batch, line


# ----------------------------------------------------------------------------------------------
# GradCache in the training step (issue 40 item 4).
# ----------------------------------------------------------------------------------------------
def grad_cache_step(task, mesh, batch_size):
  """trainer_lib's grads_fn for task.grad_cache_chunks = N > 1 (None for 0 or 1: the plain
  value_and_grad), after checking that N divides each device's rows; called before compute.

  The global batch's [B, S, T] rows are embedded N chunks at a time, chunk i holding rows
  i, i + N, ... (contrastive.chunk_rows: on a data-sharded batch each device's B/D rows split
  into N local chunks of B/(D N), and every device works on its own chunk at once), without
  gradients; the InfoNCE loss and its gradient with respect to all B x S embeddings, over the
  whole global batch; then each chunk's vjp under the same dropout key as its first pass
  (contrastive.grad_cache). Activations: one chunk's, [B/(D N), S, T] a device, instead of
  [B/D, S, T]; compute: one more forward (the first pass), ~ 4/3 of the plain step's FLOPs."""
  n = task.grad_cache_chunks
  if n <= 1:
    return None
  dp = sharding_lib.data_parallel_size(mesh)
  per_device = batch_size // dp
  if per_device % n:
    divisors = [d for d in range(2, per_device + 1) if per_device % d == 0]
    raise TaskDataError(
        f"config.embedding.grad_cache_chunks={n} does not divide the {per_device} rows each "
        f"device holds (config.batch_size={batch_size} over {dp} data-parallel devices); use "
        f"one of {divisors[:8]}{' ...' if len(divisors) > 8 else ''} (0 or 1: off).")
  # [N, B/N, ...]: the rows axis sharded as the batch's, the chunk axis not.
  rows = NamedSharding(mesh, P(None, *sharding_lib.batch_sharding(mesh).spec))
  constrain = functools.partial(jax.lax.with_sharding_constraint, shardings=rows)
  if jax.process_index() == 0:
    print(f"GradCache: each device's {per_device} rows embedded in {n} chunks of "
          f"{per_device // n} (activations of one chunk at a time; the loss over the whole "
          f"global batch of {batch_size}; dropout the same in both passes)", flush=True)

  def grads_fn(apply, loss_fn, params, batch, rng):
    return contrastive.grad_cache(apply, params, batch, lambda e: loss_fn(e, batch), n, rng,
                                  has_aux=True, constrain=constrain)
  return grads_fn


def train_batch(task, config):
  """{key: (shape, dtype)} of one global training batch: B rows of S = 2 + k texts of T tokens
  (k = config.embedding.num_negatives, pairs when it is -1: any number, which the data decides)
  and the rows' weights (0.0: a padding row). What bert_jax.plan and
  benchmarks/grad_cache_memory.py compile the step for, with no data."""
  b, t = int(config.batch_size), int(config.max_seq_length)
  shape = (b, 2 + max(task.num_negatives, 0), t)                        # [B, S, T]
  out = dict(input_ids=(shape, "int32"), input_mask=(shape, "int32"),
             segment_ids=(shape, "int32"), example_weights=((b,), "float32"))
  if task.mask_duplicates:
    out["text_ids"] = (shape[:2], "int32")
  if task.guide_embeddings:   # the guide's width G from the file's header (not its data)
    g = guide_vectors(task, config, task.files["train"], None, None)
    out["guide_embeddings"] = (shape[:2] + g.shape[2:], "float32")
  if "teacher_margins" in distillation.distill_keys(task):
    out["teacher_margins"] = ((b, shape[1] - 2), "float32")
  if "teacher_embeddings" in distillation.distill_keys(task):
    out["teacher_embeddings"] = (shape[:2] + (task.teacher_dim,), "float32")
  return out


def input_shape(seq_length, num_choices=0):
  del num_choices
  return (1, 2, seq_length)   # an anchor and its positive


def predict_outputs(outputs):
  return {"embeddings": contrastive.normalise(outputs)}


def corpus_of(examples):
  """The retrieval set of a split's rows: (query rows [Q], documents [N, 2], relevant [Q] sets).

  Each distinct anchor is a query (the index of its first row), each distinct positive or
  negative text a document ((row, position) of its first place); an anchor's relevant documents
  are the positives of every row it anchors (qrels with several relevant documents), the rest of
  the split's documents are not relevant."""
  queries, docs = {}, {}   # text -> its first row (query), (row, position) (document)
  for i, row in enumerate(examples):
    queries.setdefault(row.anchor, i)
    for j, text in enumerate(row.texts[1:], start=1):   # positives and negatives: the corpus
      docs.setdefault(text, (i, j))
  q_index, d_index = {a: n for n, a in enumerate(queries)}, {t: n for n, t in enumerate(docs)}
  relevant = [set() for _ in queries]
  for row in examples:
    relevant[q_index[row.anchor]].add(d_index[row.positive])
  return np.array(list(queries.values())), np.array(list(docs.values())), relevant


# Queries scored at a time: [512, N] float64 scores, their sort and qrels (N = 100k: ~1 GB).
_QUERY_CHUNK = 512


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  """Scored pairs (a score column, STS): Spearman of cos(anchor, positive) with the gold score.
  Else retrieval (corpus_of): every query against every document of the split, nDCG@10 (picks
  the best epoch), MRR@10, Recall@1, Recall@10 (bert_jax/evaluation/retrieval_metrics.py: trec_eval's)."""
  del task, tokenizer, config, output_dir
  e = np.asarray(outputs["embeddings"], np.float32)                     # [R, S, H] normalised
  if split.examples[0].score is not None:
    cosine = np.einsum("rh,rh->r", e[:, 0], e[:, 1])                    # [R]
    return {"spearman": retrieval_metrics.spearman(cosine, [r.score for r in split.examples])}
  rows, docs, relevant = corpus_of(split.examples)
  queries, corpus = e[rows, 0], e[docs[:, 0], docs[:, 1]]               # [Q, H], [N, H]
  totals = {}
  for start in range(0, len(rows), _QUERY_CHUNK):
    end = min(start + _QUERY_CHUNK, len(rows))
    relevance = np.zeros((end - start, len(docs)), np.float32)           # [q, N] qrels
    for n, found in enumerate(relevant[start:end]):
      relevance[n, list(found)] = 1.0
    part = retrieval_metrics.retrieval_metrics(queries[start:end] @ corpus.T, relevance,
                                               k=10, recall_at=(1, 10))
    for k, v in part.items():   # every metric is a mean over queries: weight by the chunk's
      totals[k] = totals.get(k, 0.0) + v * (end - start)
  return {k: v / len(rows) for k, v in totals.items()}


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, f"{task.name}_{split.name}_embeddings.npy")
  np.save(path, np.asarray(outputs["embeddings"], np.float32))
  return [path]


# ----------------------------------------------------------------------------------------------
# What the model was trained with, kept with it (sentence-transformers both ways, issue 40 item 6).
# ----------------------------------------------------------------------------------------------
def export_record(task, config):
  """best_epoch{N}'s "sentence_embedding": what predict embed, extract_features and the
  sentence-transformers export (bert_jax/convert/sentence_transformers.py) read back."""
  record = {"sentence_embedding": {
      "pooling": task.pooling, "normalize": True, "query_prompt": task.query_prompt,
      "document_prompt": task.document_prompt, "max_seq_length": int(config.max_seq_length),
      "matryoshka_dims": [int(d) for d in task.matryoshka_dims], "scale": float(task.scale)}}
  record.update(distillation.export_record(task))
  return record


def next_commands(best_dir):
  """What a finished embedding run prints next: its vectors and its sentence-transformers folder."""
  return [f"python -m bert_jax.predict --init_checkpoint={best_dir} embed \"a query\" "
          "\"a document\" --prompt_name=query     # vectors and their cosines",
          f"python -m bert_jax.convert --input={best_dir} --output=ST_DIR "
          "--to=sentence_transformers     # SentenceTransformer(ST_DIR)"]


# The "sentence_embedding" record of an init checkpoint (a sentence-transformers folder's
# settings, an embedding export's record, else {}).
checkpoint_record = distillation.checkpoint_record


def load_teacher(task, config, tokenizer):
  """TaskType.load_teacher: the bi-encoder teacher run frozen in the step
  (config.embedding.teacher_checkpoint; embedding_distillation.load), or None."""
  return distillation.load(task, config, tokenizer, EmbeddingModel)


def with_recorded_settings(config):
  """config.embedding with what it leaves unset (pooling "", a prompt None) taken from the init
  checkpoint's record, else mean and no prompt: continuing a sentence-transformers model or an
  embedding run keeps the pooling and prompts its vectors were trained with."""
  import jax  # pylint: disable=g-import-not-at-top,redefined-outer-name,reimported
  import ml_collections  # pylint: disable=g-import-not-at-top
  e = config.embedding
  unset = [k for k in ("pooling", "query_prompt", "document_prompt") if not e.get(k)
           and (k == "pooling" or e.get(k) is None)]
  if not unset:
    return e
  recorded = checkpoint_record(config.get("init_checkpoint"))
  filled = {k: recorded.get(k) or ("mean" if k == "pooling" else "") for k in unset}
  taken = {k: v for k, v in filled.items() if recorded.get(k)}
  if taken and jax.process_index() == 0:
    print(f"embedding: {', '.join(f'{k}={v!r}' for k, v in taken.items())} from "
          f"init_checkpoint's record ({config.init_checkpoint})", flush=True)
  return ml_collections.ConfigDict({**e.to_dict(), **filled})


TYPE = registry.register(registry.TaskType(
    name="embedding",
    summary="pooled sentence vectors, InfoNCE over the global batch; pairs and triplets",
    named_tasks={}, label_keys=(),
    load_split=load_split, custom_task=custom_task, bind=_bind,
    create_head=lambda model_config, num_labels=0, num_choices=0: EmbeddingModel(model_config),
    input_shape=input_shape, train_batch=train_batch,
    loss=lambda outputs, batch: _bind(EmbeddingTask("", {})).loss(outputs, batch),
    predict_outputs=predict_outputs, evaluate=evaluate, write_test=write_test,
    cannot_learn=cannot_learn, packable=True,
    epoch_order=lambda split, batch_size, rng: pairs.no_duplicate_order(split.examples,
                                                                          batch_size, rng),
    export_record=export_record, next_commands=next_commands, load_teacher=load_teacher))
