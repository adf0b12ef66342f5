"""Sentence embeddings (issue 40): contrastive fine-tuning of any family's encoder on pairs or
triplets, task=custom with --config.custom.type=embedding.

  data      rows (anchor, positive, negative...) in sentence-transformers' columns
            (data_pipelines/tasks/pairs.py), prompts from config.embedding; each text its own
            sequence: input_ids [N, S, T], S = 2 + hard negatives
  head      the family's body on [B*S, T], pooled per sequence (mean / cls / last) -> [B, S, H];
            no new parameters (the tree is {"bert"})
  loss      InfoNCE over the global batch (contrastive.matryoshka_info_nce: sentence-transformers'
            MultipleNegativesRankingLoss, Matryoshka sums), padding rows out
  eval      retrieval on the dev rows: each anchor against every distinct positive and negative
            text of the split: nDCG@10 (picks the best epoch), MRR@10, Recall@1, Recall@10
  files     test split: <name>_<split>_embeddings.npy, [N, S, H] float32, L2-normalised

Training batches hold no text twice where the rows allow it (pairs.no_duplicate_order: a
duplicate is a false negative). Not yet (issue 40): GradCache in the step (contrastive.grad_cache
exists), packed rows, export to sentence-transformers.
"""

import dataclasses
import os

import numpy as np
from flax import linen as nn

from bert_jax import contrastive
from bert_jax import families
from bert_jax.tasks import common
from bert_jax.tasks import registry
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
  metrics: tuple = ("ndcg@10", "mrr@10", "recall@1", "recall@10")
  type: str = "embedding"        # the task type (this module)


def custom_task(config, labels):
  """config.custom's files and config.embedding's settings -> an EmbeddingTask."""
  del labels
  c, e = config.custom, config.embedding
  dims = tuple(int(d) for d in e.matryoshka_dims)
  wrong = contrastive.problem(e.pooling, e.scale, dims)
  if wrong:
    raise TaskDataError(f"config.embedding.{wrong}")
  files = {"train": c.train_file, "dev": c.dev_file}
  if c.test_file:
    files["test"] = c.test_file
  # custom.format is "tsv" unless set: for .jsonl/.csv files left at it, read by the extension.
  tsv_default = c.format == "tsv" and not c.train_file.endswith(".tsv")
  return EmbeddingTask("custom", files, "" if tsv_default else c.format, e.pooling,
                       float(e.scale), bool(e.symmetric), dims, e.query_prompt,
                       e.document_prompt)


def load_split(task, split, tokenizer, config, is_training):
  common.check_files_only(task, config)
  path = os.path.join(config.data_dir, task.files[split])
  rows = common.limit(pairs.read_pairs(path, task.file_format or None, task.query_prompt,
                                       task.document_prompt), config, is_training)
  width = len(rows[0].texts)
  texts = [t for r in rows for t in r.texts]
  ids = tokenizer.encode(texts)
  cut = sum(len(x) > config.max_seq_length - 2 for x in ids)
  packed = [pack(x[:config.max_seq_length - 2], None, tokenizer.vocab, config.max_seq_length)
            for x in ids]
  features = {k: np.stack([p[i] for p in packed]).reshape(len(rows), width, -1)
              for i, k in enumerate(("input_ids", "input_mask", "segment_ids"))}
  return common.Split(split, rows, features, notes=common.note(cut, "texts truncated"))


class EmbeddingModel(nn.Module):
  """[B, S, T] sequences -> [B, S, H] pooled float32 vectors (not normalised: the loss and the
  evaluation normalise, as sentence-transformers' cosine does)."""
  config: object
  pooling: str = "mean"

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, *, deterministic=True):
    b, s, t = input_ids.shape
    flat = lambda x: x.reshape(b * s, t)  # noqa: E731 - [B, S, T] -> [B*S, T]
    out = families.get(self.config.family).encode(self.config, flat(input_ids),
                                                  flat(input_mask), flat(segment_ids),
                                                  deterministic=deterministic)
    pooled = contrastive.pool(out["sequence_output"], flat(input_mask), self.pooling)
    return pooled.reshape(b, s, -1)                                     # [B, S, H]


def _bind(task):
  """This record with the head and loss closed over the task's pooling, scale and widths."""
  def create_head(model_config, num_labels=0, num_choices=0):
    del num_labels, num_choices
    wrong = contrastive.check_width(task.matryoshka_dims, model_config.hidden_size)
    if wrong:
      raise TaskDataError(f"config.embedding.{wrong}")
    return EmbeddingModel(model_config, task.pooling)

  def loss(outputs, batch):
    value = contrastive.matryoshka_info_nce(
        outputs[:, 0], outputs[:, 1:], task.matryoshka_dims, task.scale, task.symmetric,
        batch["example_weights"])
    return value, {"loss": value}

  return dataclasses.replace(TYPE, create_head=create_head, loss=loss, bind=None)


def input_shape(seq_length, num_choices=0):
  del num_choices
  return (1, 2, seq_length)   # an anchor and its positive


def predict_outputs(outputs):
  return {"embeddings": contrastive.normalise(outputs)}


def retrieval_metrics(queries, docs, relevant, k=10):
  """queries [Q, D], docs [N, D] (normalised), relevant [Q] the index of each query's one
  relevant doc -> nDCG@k, MRR@k, Recall@1, Recall@k (one relevant doc: nDCG = 1/log2(1 + rank))."""
  scores = queries @ docs.T                                             # [Q, N]
  own = scores[np.arange(len(queries)), relevant]
  rank = 1 + np.sum(scores > own[:, None], axis=1)                      # ties count in our favour
  hit = rank <= k
  return {f"ndcg@{k}": float(np.mean(np.where(hit, 1 / np.log2(1 + rank), 0.0))),
          f"mrr@{k}": float(np.mean(np.where(hit, 1 / rank, 0.0))),
          "recall@1": float(np.mean(rank == 1)), f"recall@{k}": float(np.mean(hit))}


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  del tokenizer, config, output_dir
  e = np.asarray(outputs["embeddings"], np.float32)                     # [N, S, H]
  corpus, vectors = {}, []
  for row, vecs in zip(split.examples, e):
    for text, v in zip(row.texts[1:], vecs[1:]):   # positives and negatives: the corpus
      if text not in corpus:
        corpus[text] = len(vectors)
        vectors.append(v)
  relevant = np.array([corpus[r.positive] for r in split.examples])
  return retrieval_metrics(e[:, 0], np.stack(vectors), relevant)


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  os.makedirs(output_dir, exist_ok=True)
  path = os.path.join(output_dir, f"{task.name}_{split.name}_embeddings.npy")
  np.save(path, np.asarray(outputs["embeddings"], np.float32))
  return [path]


TYPE = registry.register(registry.TaskType(
    name="embedding",
    summary="pooled sentence vectors, InfoNCE over the global batch; pairs and triplets",
    named_tasks={}, label_keys=(),
    load_split=load_split, custom_task=custom_task, bind=_bind,
    create_head=lambda model_config, num_labels=0, num_choices=0: EmbeddingModel(model_config),
    input_shape=input_shape,
    loss=lambda outputs, batch: _bind(EmbeddingTask("", {})).loss(outputs, batch),
    predict_outputs=predict_outputs, evaluate=evaluate, write_test=write_test,
    epoch_order=lambda split, batch_size, rng: pairs.no_duplicate_order(split.examples,
                                                                          batch_size, rng)))
