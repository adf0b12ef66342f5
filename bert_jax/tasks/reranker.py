"""Rerankers (issue 48 item 3): a cross-encoder over (query, document) pairs, task=custom with
--config.custom.type=reranker; sentence-transformers' CrossEncoder (v4+) in JAX.

  data      sentence-transformers' CrossEncoder columns (data_pipelines/tasks/pairs.py):
            (query, document, label) scored pairs, label in [0, 1] (pointwise BCE), or rows
            (query, positive, negative...) (every loss: the positive's label 1, each negative's
            0). Each (query, document) is one sequence "[CLS] query [SEP] document [SEP]"
            (segments 0 / 1, the longer side cut first, as transformers' longest_first):
            input_ids [N, S, T], S candidates a row; labels [N, S] float32, candidate_mask
            [N, S] (0.0: a padding slot of a shorter list)
  head      the family's body on the [N*S, T] pairs and its classification head with one output
            on [CLS] -> scores [N, S] (transformers' XxxForSequenceClassification(num_labels=1),
            the tree {"bert", "classifier"}: what CrossEncoder(path) computes)
  loss      config.reranker.loss, each sentence-transformers' CrossEncoder loss of the name
            (tests/bert_jax/tasks/reranker_losses_test.py runs theirs):
              bce       BinaryCrossEntropyLoss: BCE-with-logits of every real (query, document)
              mnrl      MultipleNegativesRankingLoss: softmax cross-entropy of scale x
                        sigmoid(score) over the positive and the row's other candidates
                        (hard negatives + in_batch_negatives drawn from other rows: see
                        in_batch_negatives below for the one difference from theirs)
              listnet   ListNetLoss: cross-entropy of softmax(scores) against softmax(labels)
                        over each query's list (padding slots out)
  eval      each dev query's candidate list (the rows of one query merged: its positives and
            negatives, or its scored documents) reranked: nDCG@10 (picks the best epoch),
            MRR@10, Recall@1, Recall@10 (bert_jax/evaluation/retrieval_metrics.py)
  files     test split: <name>_<split>_scores.npy, [Q, S] float32 (padding slots NaN)
  export    best_epoch{N} records task_type "reranker" and a "cross_encoder" record (the loss,
            max_seq_length, the score's activation); the CrossEncoder folder both ways is
            bert_jax/convert/cross_encoder.py

Packed rows (config.pack) are refused: a pair is one short sequence the loss reads by row and
candidate; packing several into a row would need the embedding type's per-batch packing for a
gain only on very short pairs (docs/retrieval.md).
"""

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bert_jax import families
from bert_jax.evaluation import retrieval_metrics
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import pairs
from data_pipelines.tasks.common import TaskDataError, pack, truncate_seq_pair

LOSSES = ("bce", "mnrl", "listnet")


@dataclasses.dataclass(frozen=True)
class RerankerTask:
  name: str
  files: dict                    # split -> file under data_dir
  file_format: str = ""          # jsonl | csv | tsv; "" = from the extension
  loss: str = "bce"              # bce | mnrl | listnet (LOSSES)
  scale: float = 10.0            # mnrl: logits = scale x sigmoid(score) (theirs: 10)
  in_batch_negatives: int = 4    # mnrl: other rows' documents added to each row (theirs: 4)
  hard_negatives: int = -1       # >= 0: the negatives every training row must hold; -1: any
  seed: int = 0                  # the in-batch negatives' draw
  eval_splits: tuple = ("dev",)
  metrics: tuple = ("ndcg@10", "mrr@10", "recall@1", "recall@10")
  type: str = "reranker"         # the task type (this module)


def custom_task(config, labels):
  """config.custom's files and config.reranker's settings -> a RerankerTask; one line for a loss
  we do not compute or an init checkpoint that is an embedder."""
  del labels
  c, r = config.custom, config.reranker
  if r.loss not in LOSSES:
    raise TaskDataError(f"config.reranker.loss={r.loss!r}; use one of {', '.join(LOSSES)} "
                        "(sentence-transformers' BinaryCrossEntropyLoss, MultipleNegatives"
                        "RankingLoss, ListNetLoss).")
  if int(r.in_batch_negatives) < 0 or float(r.scale) <= 0:
    raise TaskDataError(f"config.reranker.in_batch_negatives={r.in_batch_negatives}, scale="
                        f"{r.scale}: need in_batch_negatives >= 0 and scale > 0 (theirs: 4, 10).")
  check_init_checkpoint(config.get("init_checkpoint"), "reranker")
  files = {"train": c.train_file, "dev": c.dev_file}
  if c.test_file:
    files["test"] = c.test_file
  tsv_default = c.format == "tsv" and not c.train_file.endswith(".tsv")
  return RerankerTask("custom", files, "" if tsv_default else c.format, r.loss, float(r.scale),
                      int(r.in_batch_negatives), int(r.hard_negatives), int(config.seed))


# ----------------------------------------------------------------------------------------------
# A reranker's checkpoint is not an embedder's (embedding.py calls this too).
# ----------------------------------------------------------------------------------------------
def checkpoint_product(path):
  """What retrieval product a checkpoint is, from its metadata alone (no array is read):
  "reranker" (a sentence-transformers CrossEncoder folder; our export of task_type reranker),
  "embedding" (a SentenceTransformer folder; our export of task_type embedding or with a
  "sentence_embedding" record, e.g. a converted SentenceTransformer), else its recorded task
  type, or None (a pre-training export, a plain transformers folder, no path)."""
  # pylint: disable=g-import-not-at-top  (the converters and the store: only when asked)
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.convert import cross_encoder
  from bert_jax.convert import sentence_transformers
  if not path:
    return None
  if cross_encoder.is_cross_encoder_folder(path):
    return "reranker"
  if sentence_transformers.is_st_folder(path):
    return "embedding"
  if families.is_hf_folder(path):
    return None
  meta = ckpt_lib.describe(path, verify=False).meta
  return registry.recorded_type(meta) or ("embedding" if meta.get("sentence_embedding")
                                          else None)


# A reranker's checkpoint and an embedder's are both an encoder plus (or minus) a head: a run of
# one type from the other's export would train on the wrong product without a word.
RETRIEVAL_PRODUCTS = {"embedding": "a bi-encoder (sentence embeddings)",
                      "reranker": "a cross-encoder (reranker)"}


def check_init_checkpoint(path, run_type):
  """One line when `path` is the other retrieval product than a `run_type` run trains: a
  reranker (our export's task_type, a CrossEncoder folder) for an embedding run, an embedder (our
  export's task_type or "sentence_embedding" record, a SentenceTransformer folder) for a reranker
  run. Reads the checkpoint's metadata only."""
  found = checkpoint_product(path)
  if found is None or found == run_type or found not in RETRIEVAL_PRODUCTS:
    return
  fix = ("a pre-trained encoder (a pre-training export, a transformers folder) or the export "
         f"of a custom.type={run_type} run")
  raise TaskDataError(f"config.init_checkpoint={path} is {RETRIEVAL_PRODUCTS[found]} (task_type "
                      f"{found!r}), but this run trains {RETRIEVAL_PRODUCTS[run_type]} "
                      f"(custom.type={run_type}); start from {fix}, or set "
                      f"--config.custom.type={found}.")


# ----------------------------------------------------------------------------------------------
# Data: rows of candidates (host, numpy).
# ----------------------------------------------------------------------------------------------
def rows_of(task, path, rows, is_training):
  """[(query, [documents], [labels])] of a split's Pairs, one line for what the loss cannot read.

  Training: scored pairs are one candidate a row for bce, grouped by query for listnet (its
  lists), refused for mnrl (it needs each query's positive and negatives in one row); rows
  (query, positive, negative...) are one row each. Evaluation: grouped by query
  (pairs.candidate_lists)."""
  scored = rows[0].score is not None
  if not is_training:
    return pairs.candidate_lists(rows)
  if scored and task.loss == "mnrl":
    raise TaskDataError(f"{path}: scored pairs (a label column), but config.reranker.loss=mnrl "
                        "reads rows (query, positive, negative...); use loss=bce or listnet, or "
                        "give rows of a positive and its negatives.")
  if not scored and task.loss == "bce" and not rows[0].negatives:
    raise TaskDataError(f"{path}: (query, document) pairs without a label column: every label "
                        "would be 1 and BCE learns nothing; add a label column (1 relevant, 0 "
                        "not; sentence-transformers' (query, document, label)), or negative "
                        "columns (query, positive, negative...).")
  if scored and task.loss == "listnet":
    return pairs.candidate_lists(rows)
  if scored:
    return [(r.anchor, [r.positive], [r.score]) for r in rows]
  return [(r.anchor, list(r.texts[1:]), [1.0] + [0.0] * len(r.negatives)) for r in rows]


def check_labels(task, path, lists, is_training):
  """Labels in [0, 1] for bce (BCE's targets are probabilities); a dev query with no relevant
  document (label > 0) among its candidates has no nDCG: one line each, with the count."""
  labels = [x for _, _, ls in lists for x in ls]
  if is_training and task.loss == "bce":
    bad = [x for x in labels if not 0.0 <= x <= 1.0]
    if bad:
      raise TaskDataError(f"{path}: {len(bad)} labels outside [0, 1] (e.g. {bad[0]:g}); "
                          "config.reranker.loss=bce reads a probability of relevance: rescale "
                          "the label column to [0, 1] (e.g. a 0-3 grade / 3), or use "
                          "loss=listnet, which reads graded labels.")
  if not is_training:
    none = [q for q, _, ls in lists if not any(x > 0 for x in ls)]
    if none:
      raise TaskDataError(f"{path}: {len(none)} of {len(lists)} queries have no relevant "
                          f"document (label > 0) among their candidates (e.g. {none[0][:60]!r})"
                          ": nDCG and MRR are undefined for them; drop those queries or add "
                          "their positive.")


def in_batch_negatives(task, lists, rng):
  """mnrl: each training row gets task.in_batch_negatives documents drawn at random from the
  other rows' candidates (texts the row does not hold), label 0.

  sentence-transformers' MultipleNegativesRankingLoss (cross_encoder, num_negatives=4) draws
  them from the other rows of the same batch, anew at each step (torch.multinomial); a batch
  being a random sample of rows, a random candidate of another row of the batch is a random
  candidate of another row of the split, which is what is drawn here: once, when the split is
  read (seed config.seed), so each row keeps its drawn negatives over the epochs. That, and the
  draw's random numbers, are the only differences (the loss on given candidates is theirs, to
  1e-5: tests/bert_jax/tasks/reranker_losses_test.py)."""
  k = task.in_batch_negatives
  if k == 0 or len(lists) < 2:
    return lists
  docs = [d for _, ds, _ in lists for d in ds]
  owner = np.repeat(np.arange(len(lists)), [len(ds) for _, ds, _ in lists])
  out = []
  for i, (query, ds, labels) in enumerate(lists):
    own = set(ds)
    pool = [j for j in np.flatnonzero(owner != i) if docs[j] not in own]
    drawn = rng.choice(len(pool), size=min(k, len(pool)), replace=False) if pool else []
    extra = [docs[pool[j]] for j in drawn]
    extra += extra[:1] * (k - len(extra))   # too few other documents: repeat one (same width)
    out.append((query, list(ds) + extra, list(labels) + [0.0] * k))
  return out


def encode_lists(lists, tokenizer, max_seq_length):
  """[(query, docs, labels)] -> features: input_ids / input_mask / segment_ids [N, S, T] of
  "[CLS] query [SEP] doc [SEP]" (S = the longest list; shorter ones padded with empty slots),
  labels [N, S] float32, candidate_mask [N, S] float32; and the number of pairs cut to T."""
  width = max(len(ds) for _, ds, _ in lists)
  queries = tokenizer.encode([q for q, _, _ in lists])
  docs = tokenizer.encode([d for _, ds, _ in lists for d in ds])
  n, t = len(lists), max_seq_length
  ids, mask, segments = (np.zeros((n, width, t), np.int32) for _ in range(3))
  ids[:] = tokenizer.vocab.pad_id
  labels, present = np.zeros((n, width), np.float32), np.zeros((n, width), np.float32)
  cut, d = 0, 0
  for i, (_, ds, ls) in enumerate(lists):
    for j in range(len(ds)):
      a, b = list(queries[i]), list(docs[d])
      cut += truncate_seq_pair(a, b, t - 3) > 0
      ids[i, j], mask[i, j], segments[i, j] = pack(a, b, tokenizer.vocab, t)
      labels[i, j], present[i, j] = ls[j], 1.0
      d += 1
  return dict(input_ids=ids, input_mask=mask, segment_ids=segments, labels=labels,
              candidate_mask=present), cut


def load_split(task, split, tokenizer, config, is_training):
  common.check_files_only(task, config)
  path = os.path.join(config.data_dir, task.files[split])
  rows = pairs.read_pairs(path, task.file_format or None)
  if is_training and task.hard_negatives >= 0 and rows[0].score is None and (
      len(rows[0].negatives) != task.hard_negatives):
    raise TaskDataError(f"{path}: rows with {len(rows[0].negatives)} negatives, but "
                        f"config.reranker.hard_negatives={task.hard_negatives}; give each row "
                        f"{task.hard_negatives} negative columns or set hard_negatives=-1 (any).")
  lists = common.limit(rows_of(task, path, rows, is_training), config, is_training)
  check_labels(task, path, lists, is_training)
  if is_training and task.loss == "mnrl":
    lists = in_batch_negatives(task, lists, np.random.default_rng(task.seed))
  features, cut = encode_lists(lists, tokenizer, config.max_seq_length)
  return common.Split(split, lists, features, notes=common.note(cut, "pairs truncated"))


def cannot_learn(task, train, tokenizer, config):
  """One line when every training label is the same where the loss reads labels as targets
  (bce: one constant to predict; listnet: every list's target uniform): nothing of the text moves
  the loss then."""
  del tokenizer
  if task.loss == "mnrl":
    return []
  f = train.features
  real = f["labels"][f["candidate_mask"] > 0]
  label = common.one_value(real)
  if label is None:
    return []
  raise TaskDataError(f"{common.train_source(task, config, train)}: all {len(real)} training "
                      f"labels are {float(label):g}: config.reranker.loss={task.loss} then "
                      "learns a constant, nothing of the text; check the label column, or give "
                      "rows (query, positive, negative...).")


# ----------------------------------------------------------------------------------------------
# Model and losses (pure jnp inside the jitted steps).
# ----------------------------------------------------------------------------------------------
class RerankerModel(nn.Module):
  """[B, S, T] pairs -> [B, S] float32 scores: the family's body and its classification head
  with one output on [CLS] (heads.BertForSequenceClassification(num_labels=1) on each pair; the
  same submodule names, so the tree is {"bert", "classifier"} as theirs)."""
  config: object

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    b, s, t = input_ids.shape
    flat = lambda x: x.reshape(b * s, t)  # noqa: E731 - [B, S, T] -> [B*S, T]
    family = families.get(self.config.family)
    out = family.encode(self.config, flat(input_ids), flat(input_mask), flat(segment_ids),
                        deterministic=deterministic)
    return family.cls_logits(self.config, out, 1, deterministic).reshape(b, s)   # [B, S]


def bce_loss(scores, labels, present):
  """BinaryCrossEntropyLoss: mean over real pairs of BCE-with-logits. scores, labels, present
  [B, S] (present: 1.0 a real pair, 0.0 padding)."""
  value = optax.sigmoid_binary_cross_entropy(scores, labels)                   # [B, S]
  return common.weighted_mean(value, present)


def mnrl_loss(scores, present, weights, scale=10.0):
  """MultipleNegativesRankingLoss (cross_encoder's): cross-entropy with the positive (slot 0) as
  the class over scale x sigmoid(score) of the row's candidates. scores, present [B, S];
  weights [B] (0.0: a padding row)."""
  logits = jnp.where(present > 0, scale * jax.nn.sigmoid(scores), -jnp.inf)    # [B, S]
  ce = -jax.nn.log_softmax(logits, axis=-1)[:, 0]                              # [B]
  return common.weighted_mean(ce, weights)


def listnet_loss(scores, labels, present, weights):
  """ListNetLoss: -sum softmax(labels) x log_softmax(scores) over each list's real slots, mean
  over lists (theirs pads logits with -1e16 and labels with -inf: the same sums)."""
  real = present > 0
  target = jax.nn.softmax(jnp.where(real, labels, -jnp.inf), axis=-1)           # [B, S]
  logp = jax.nn.log_softmax(jnp.where(real, scores, -1e16), axis=-1)
  ce = -jnp.sum(jnp.where(real, target * logp, 0.0), axis=-1)                   # [B]
  return common.weighted_mean(ce, weights)


def loss_of(task):
  """(outputs [B, S], batch) -> (loss, metrics) for task.loss."""
  def loss(outputs, batch):
    scores = outputs.astype(jnp.float32)
    # Padding rows (weight 0) are copies of a real row: their slots stay real for the softmax
    # losses (no all -inf row), their weight takes them out of every mean.
    mask, weights = batch["candidate_mask"], batch["example_weights"]             # [B, S], [B]
    if task.loss == "bce":
      value = bce_loss(scores, batch["labels"], mask * weights[:, None])
    elif task.loss == "mnrl":
      value = mnrl_loss(scores, mask, weights, task.scale)
    else:
      value = listnet_loss(scores, batch["labels"], mask, weights)
    return value, {"loss": value}
  return loss


def _bind(task):
  return dataclasses.replace(TYPE, loss=loss_of(task), bind=None)


def create_head(model_config, num_labels=1, num_choices=0):
  del num_labels, num_choices
  return RerankerModel(model_config)


def input_shape(seq_length, num_choices=0):
  del num_choices
  return (1, 2, seq_length)   # one query, two candidates


def predict_outputs(outputs):
  return {"scores": outputs.astype(jnp.float32)}


def train_batch(task, config):
  """{key: (shape, dtype)} of one global training batch: B rows of S = 1 + hard_negatives
  (+ in_batch_negatives for mnrl) pairs of T tokens (hard_negatives -1: pairs, S = 1); what
  bert_jax.plan compiles the reranker's step for, with no data."""
  b, t = int(config.batch_size), int(config.max_seq_length)
  s = 1 + max(task.hard_negatives, 0) + (task.in_batch_negatives if task.loss == "mnrl" else 0)
  shape = (b, s, t)
  return dict(input_ids=(shape, "int32"), input_mask=(shape, "int32"),
              segment_ids=(shape, "int32"), labels=((b, s), "float32"),
              candidate_mask=((b, s), "float32"), example_weights=((b,), "float32"))


# ----------------------------------------------------------------------------------------------
# Evaluation and files (host, numpy).
# ----------------------------------------------------------------------------------------------
def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  """Each query's candidates ranked by score (padding slots last): nDCG@10, MRR@10, Recall@1,
  Recall@10 over the split's queries (labels are the gains)."""
  del task, tokenizer, config, output_dir
  f = split.features
  present = f["candidate_mask"] > 0
  scores = np.where(present, np.asarray(outputs["scores"], np.float64), -np.inf)   # [Q, S]
  return retrieval_metrics.retrieval_metrics(scores, np.where(present, f["labels"], 0.0), k=10,
                                             recall_at=(1, 10))


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, f"{task.name}_{split.name}_scores.npy")
  scores = np.asarray(outputs["scores"], np.float32)
  np.save(path, np.where(split.features["candidate_mask"] > 0, scores, np.nan))
  return [path]


def not_a_reranker(meta, params):
  """Why an export's meta and parameter tree are no reranker (predict rerank reads one), or
  None: its recorded task type and a one-output classifier on [CLS]."""
  kind = registry.recorded_type(meta)
  head = (params.get("classifier") or {}).get("kernel")
  if kind == TYPE.name and head is not None and np.shape(head)[-1] == 1:
    return None
  return (f"task_type {kind!r} with parameters {sorted(params)}; rerank needs a reranker (a "
          "custom.type=reranker run's best_epoch{N}, or a sentence-transformers CrossEncoder "
          "folder)" + ("; for a bi-encoder use `embed`" if kind == "embedding" else "") + ".")


def export_record(task, config):
  """best_epoch{N}'s "cross_encoder" record: what the CrossEncoder export and predict rerank read
  back (sentence-transformers' CrossEncoder applies a sigmoid to its one output by default)."""
  return {"cross_encoder": {"loss": task.loss, "max_seq_length": int(config.max_seq_length),
                            "activation_fn": "sigmoid"}}


def next_commands(best_dir):
  return [f"python -m bert_jax.predict --init_checkpoint={best_dir} rerank \"a query\" "
          "\"a document\" \"another document\"     # documents ranked by score",
          f"python -m bert_jax.convert --input={best_dir} --output=CE_DIR --to=cross_encoder"
          "     # sentence-transformers' CrossEncoder(CE_DIR)"]


TYPE = registry.register(registry.TaskType(
    name="reranker",
    summary="cross-encoder: dense(1) on [CLS] of each (query, document) -> [B, S] scores; "
            "BCE, MNRL, ListNet",
    named_tasks={}, label_keys=("labels", "candidate_mask"),
    load_split=load_split, custom_task=custom_task, bind=_bind,
    create_head=create_head, input_shape=input_shape, train_batch=train_batch,
    loss=loss_of(RerankerTask("", {})), predict_outputs=predict_outputs, evaluate=evaluate,
    write_test=write_test, cannot_learn=cannot_learn, hf_head="SequenceClassification",
    hf_num_labels=1, export_record=export_record, next_commands=next_commands))
