r"""Mine hard negatives for (anchor, positive) pairs with any embedding checkpoint, on the mesh.

  python -m bert_jax.mine --init_checkpoint=runs/emb/best_epoch3 \
      --input_file=runs/docstring_retrieval/train.jsonl --output_file=runs/mined/train.jsonl \
      --num_negatives=3 --range_min=0 --relative_margin=0.05 [--corpus_file=docs.jsonl] \
      [--output_format=triplet|n-tuple] [--output_scores] [--search=exact|approx]

sentence-transformers' `util.mine_hard_negatives` (6.2), the same rule and the same columns
(bert_jax/inference/mining.py says what is kept step for step), with the corpus encoded in blocks
of --block_size texts over every device of the mesh and the top-k taken on the devices, so memory
is bounded whatever the corpus. --init_checkpoint: one of ours (a pre-training export, a workdir,
an embedding run's export: its recorded pooling, prompts and max_seq_length are used), or a
sentence-transformers / transformers folder. The queries get the checkpoint's query prompt and
the corpus its document prompt, as ST's encode_query / encode_document (--query_prompt /
--corpus_prompt replace them). The written file is what `finetune`'s embedding task and
sentence-transformers read; the last line is the command that trains on it. Under
`launch.local_pod` or on a TPU slice every process runs this program; process 0 writes the file.
Docs: docs/retrieval.md, "Mining hard negatives".
"""

import dataclasses
import json
import os
import time

import numpy as np
from absl import app
from absl import flags
from absl import logging

from bert_jax import cli
from bert_jax.inference import mining

FLAGS = flags.FLAGS
CROSS_ENCODER_TYPES = ("classification", "regression", "reranker")


def define_flags():
  flags.DEFINE_string("init_checkpoint", None, "The embedding model: an export, a workdir, a "
                      "sentence-transformers or transformers folder.")
  flags.DEFINE_string("input_file", None, "(anchor, positive) pairs: .jsonl/.csv/.tsv, columns "
                      "anchor (or query) and positive, else the first two.")
  flags.DEFINE_string("corpus_file", None, "Candidate texts besides the positives (.txt one a "
                      "line, or a column text). Default: the positives alone, as ST.")
  flags.DEFINE_string("output_file", None, "The mined rows (.jsonl; .csv/.tsv without scores).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output_file.")
  flags.DEFINE_integer("num_negatives", 3, "Negatives per query.")
  flags.DEFINE_integer("range_min", 0, "Candidates ranked above this (after the positives and "
                       "filters are out) are skipped.")
  flags.DEFINE_integer("range_max", None, "The lowest rank taken (default as ST: range_min + "
                       "num_negatives (x10 with a margin or max_score) + the most positives of a "
                       "query).")
  flags.DEFINE_float("max_score", None, "Drop candidates scoring above this.")
  flags.DEFINE_float("min_score", None, "Drop candidates scoring below this.")
  flags.DEFINE_float("absolute_margin", None, "Drop candidates within this of the query's lowest "
                     "positive score.")
  flags.DEFINE_float("relative_margin", None, "Drop candidates above (1 - m) x the positive's "
                     "score (NV-Retriever: 0.05).")
  flags.DEFINE_enum("sampling_strategy", "top", list(mining.SAMPLING), "top: the best "
                    "candidates; random: a seeded sample of those left.")
  flags.DEFINE_integer("seed", 0, "--sampling_strategy=random's seed.")
  flags.DEFINE_enum("output_format", "triplet", list(mining.FORMATS), "triplet: one row a "
                    "negative; n-tuple: negative_1..n in one row (rows short of n dropped).")
  flags.DEFINE_bool("output_scores", False, "Add ST's scores column: [positive, negative(s)].")
  flags.DEFINE_enum("search", "exact", list(mining.SEARCHES), "exact: lax.top_k; approx: "
                    "lax.approx_max_k (TPU's fast top-k).")
  flags.DEFINE_float("recall_target", 0.95, "--search=approx's recall target.")
  flags.DEFINE_integer("block_size", 4096, "Corpus texts a block (a multiple of --batch_size): "
                       "one block's vectors and scores are on the devices at a time.")
  flags.DEFINE_integer("batch_size", 64, "Texts an encoding step, over every device (a multiple "
                       "of the device count).")
  flags.DEFINE_integer("max_seq_length", None, "Default: the checkpoint's recorded one, else "
                       "max_position_embeddings.")
  flags.DEFINE_enum("pooling", None, ["mean", "cls", "last"], "Default: the checkpoint's "
                    "recorded pooling, else mean.")
  flags.DEFINE_string("query_prompt", None, "Default: the checkpoint's query prompt.")
  flags.DEFINE_string("corpus_prompt", None, "Default: the checkpoint's document prompt.")
  flags.DEFINE_string("vocab_file", None, "Default: the checkpoint's own.")
  flags.DEFINE_bool("progress", True, "A progress bar on stderr.")
  flags.DEFINE_string("cross_encoder", None, "A reranker (our reranker export, a CrossEncoder "
                      "folder) that rescores every candidate and positive before the filters, as "
                      "ST's cross_encoder=: only with a filter set (ST's rule); the scores (and "
                      "--output_scores) are then its sigmoids.")


def settings_of(args):
  """mining.Settings of the flags (or any object with their names)."""
  return mining.Settings(**{f.name: getattr(args, f.name)
                            for f in dataclasses.fields(mining.Settings)})


def check_request(args, devices):
  """(settings, problem): everything that can be wrong with the request, each one line, before
  the model is read or anything written: the output file, the input files' columns, the counts
  and rank window against the corpus, the batch and block sizes, a cross-encoder as the model.
  `args`: the flags (or any object with their names)."""
  from bert_jax_core import files as files_lib  # pylint: disable=g-import-not-at-top
  files_lib.check_output_file(args.output_file, "--output_file", overwrite=args.overwrite,
                              make_parents=True)
  settings = settings_of(args)
  mining.check_output(args.output_file, settings)
  problem = mining.problem_of(args.input_file, args.corpus_file)
  settings = mining.resolve(settings, problem)
  if args.batch_size < 1 or args.batch_size % devices:
    raise mining.MiningError(f"--batch_size={args.batch_size}: give a multiple of the {devices} "
                             f"devices (e.g. {devices * max(1, args.batch_size // devices)}).")
  if args.block_size < 1 or args.block_size % args.batch_size:
    raise mining.MiningError(f"--block_size={args.block_size}: give a multiple of --batch_size="
                             f"{args.batch_size} (e.g. "
                             f"{args.batch_size * max(1, args.block_size // args.batch_size)}).")
  check_embedder(args.init_checkpoint)
  check_cross_encoder(getattr(args, "cross_encoder", None))
  return settings, problem


def check_cross_encoder(path):
  """One line, from the checkpoint's metadata alone, for a --cross_encoder that is not a
  reranker (an embedder, a pre-training export, a plain transformers encoder)."""
  if not path:
    return
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import reranker  # pylint: disable=g-import-not-at-top
  try:
    found = reranker.checkpoint_product(path)
  except ckpt_lib.CheckpointError as e:
    raise mining.MiningError(f"--cross_encoder={path}: {e}") from None
  if found != "reranker":
    what = reranker.RETRIEVAL_PRODUCTS.get(found) or (
        f"a {found} model" if found else "an encoder without a reranker's head")
    raise mining.MiningError(f"--cross_encoder={path}: is {what}, not a cross-encoder; give a "
                             "custom.type=reranker run's best_epoch{N} or a sentence-transformers "
                             "CrossEncoder folder.")


# ----------------------------------------------------------------------------------------------
# The model: any checkpoint but a cross-encoder.
# ----------------------------------------------------------------------------------------------
def check_embedder(path):
  """One line, before any array is read, for a checkpoint that scores pairs instead of embedding
  texts: a transformers *ForSequenceClassification folder (a sentence-transformers CrossEncoder
  saves one) or one of our fine-tuning exports of another task type."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  flag = f"--init_checkpoint={path}"
  config_json = os.path.join(str(path), "config.json")
  if "://" not in str(path) and os.path.isfile(config_json):
    with open(config_json, encoding="utf-8") as f:
      archs = json.load(f).get("architectures") or []
    heads = [a for a in archs if a.endswith("ForSequenceClassification")]
    if heads:
      raise mining.MiningError(f"{flag}: a {heads[0]} folder is a cross-encoder (a reranker: it "
                               "scores a (query, document) pair, it embeds no text); mine with "
                               "a bi-encoder (an embedding run's export, a sentence-transformers "
                               "SentenceTransformer folder, or a pre-trained encoder).")
    return
  try:
    meta = ckpt_lib.describe(path, verify=False).meta
  except ckpt_lib.CheckpointError:
    return   # not ours: load_for_inference says what is wrong with it
  kind = meta.get("task_type")
  if kind and kind != "embedding":
    what = ("a cross-encoder (a reranker: its head scores a text pair, it embeds no text)"
            if kind in CROSS_ENCODER_TYPES else f"a {kind} model")
    raise mining.MiningError(f"{flag}: a fine-tuning export of task type {kind} "
                             f"({meta.get('task', '?')}) is {what}; mine with a bi-encoder (an "
                             "embedding run's export, its base pre-training export, or a "
                             "sentence-transformers folder).")


def embed_fn(config, pooling):
  """(params, ids, mask, segments) -> [B, H] L2-normalised: the embedding task's model, as
  `predict embed` computes it."""
  from bert_jax.objectives import contrastive  # pylint: disable=g-import-not-at-top
  from bert_jax.tasks import embedding  # pylint: disable=g-import-not-at-top
  model = embedding.EmbeddingModel(config, pooling)

  def fn(params, ids, mask, segments):
    out = model.apply({"params": params}, ids[:, None], mask[:, None], segments[:, None])
    return contrastive.normalise(out[:, 0])                               # [B, H]
  return fn


def tokenizer_fn(m, max_seq_length):
  """texts -> (ids, mask, segments) [N, T] int32, [CLS] pieces [SEP] cut to max_seq_length as
  `predict embed`; T the batch's longest rounded up to 32 (few shapes, few compiles)."""
  from data_pipelines.tasks.common import pack  # pylint: disable=g-import-not-at-top
  vocab = m.tokenizer.vocab

  def fn(texts):
    pieces = [p[:max_seq_length - 2] for p in m.tokenizer.encode(list(texts))]
    width = min(max_seq_length, -(-(max(len(p) for p in pieces) + 2) // 32) * 32)
    packed = [pack(p, None, vocab, width) for p in pieces]
    return tuple(np.stack([x[i] for x in packed]) for i in range(3))
  return fn


def mine(m, problem, settings, *, pooling, query_prompt, corpus_prompt, max_seq_length,
         batch_size, block_size, mesh=None, progress=False, reranker=None):
  """(mining.Mined, rows) of `problem` with the embedder `m` (predict.load_embedder), searched
  over `mesh` (default: every device, one data axis); where mining.rescores(settings), the
  candidates rescored by `reranker` (predict.load_reranker; every pair in batches of
  batch_size, replicated on each process)."""
  from bert_jax.parallel import sharding  # pylint: disable=g-import-not-at-top
  mesh = mesh or sharding.create_mesh((-1, 1, 1))
  search = mining.BlockSearch(
      mesh, embed_fn(m.config, pooling), m.params, tokenizer_fn(m, max_seq_length),
      batch_size=batch_size, block_size=block_size, k=mining.candidates_k(settings, problem),
      positives=mining.positives_matrix(problem, len(problem.queries)), search=settings.search,
      recall_target=settings.recall_target)
  scores, indices, pos_scores = mining.search(problem, search, query_prompt=query_prompt,
                                              corpus_prompt=corpus_prompt, progress=progress)
  if mining.rescores(settings):
    from bert_jax import predict  # pylint: disable=g-import-not-at-top
    scores, pos_scores = mining.rescore(
        problem, indices, pos_scores,
        lambda pairs: predict.apply_rerank_activation(
            reranker, predict.rerank_pair_scores(reranker, pairs, batch_size=batch_size)))
  mined = mining.select(problem, settings, scores, indices, pos_scores)
  return mined, mining.rows_of(problem, settings, mined)


def _size(n):
  return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


def next_command(output_file, init_checkpoint, settings, max_seq_length, input_file):
  """The fine-tuning command that trains the embedding task on the mined file: its dev split a
  dev.jsonl beside the input file where there is one (benchmarks/docstring_retrieval.py writes
  it), else no evaluation."""
  data_dir, name = os.path.split(os.path.abspath(output_file))
  dev = os.path.join(os.path.dirname(os.path.abspath(input_file)), "dev.jsonl")
  evaluation = (f"--config.custom.dev_file={dev}" if os.path.isfile(dev)
                else "--config.do_eval=false --config.do_predict=false")
  return ("python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:custom "
          f"--config.custom.type=embedding --config.data_dir={data_dir} "
          f"--config.custom.train_file={name} {evaluation} "
          f"--config.init_checkpoint={init_checkpoint} --config.max_seq_length={max_seq_length} "
          f"--workdir=runs/embed_mined{'_ntuple' if settings.output_format == 'n-tuple' else ''}")


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments {argv[1:]}; everything is a flag.")
  import jax  # pylint: disable=g-import-not-at-top
  from bert_jax import predict  # pylint: disable=g-import-not-at-top
  from bert_jax.inference import loading as inference  # pylint: disable=g-import-not-at-top
  for name in ("init_checkpoint", "input_file", "output_file"):
    if not getattr(FLAGS, name):
      raise app.UsageError(f"--{name} is required.")
  lead = jax.process_index() == 0
  say = print if lead else (lambda *a, **k: None)
  settings, problem = check_request(FLAGS, jax.device_count())
  devices = jax.device_count()
  logging.set_verbosity(logging.WARNING)
  inference.enable_compilation_cache()
  m = predict.load_embedder(FLAGS.init_checkpoint, FLAGS.vocab_file)
  pooling, query_prompt, length = predict.embedding_settings(m, FLAGS.pooling, "query",
                                                             FLAGS.max_seq_length)
  _, corpus_prompt, _ = predict.embedding_settings(m, FLAGS.pooling, "document", length)
  query_prompt = query_prompt if FLAGS.query_prompt is None else FLAGS.query_prompt
  corpus_prompt = corpus_prompt if FLAGS.corpus_prompt is None else FLAGS.corpus_prompt
  say(f"loaded {m.description}; pooling {pooling}, query prompt {query_prompt!r}, corpus prompt "
      f"{corpus_prompt!r}, max_seq_length {length}")
  reranker = None
  if settings.cross_encoder:
    reranker = predict.load_reranker(settings.cross_encoder)
    say(f"loaded the cross-encoder {reranker.description}; it rescores each query's "
        f"{mining.candidates_k(settings, problem)} candidates and its positives before the "
        f"filters (scores: its {predict.rerank_activation(reranker)})")
  say(f"read {FLAGS.input_file}: {problem.num_rows:,} rows, {len(problem.queries):,} distinct "
      f"queries; corpus {len(problem.corpus):,} distinct texts ("
      + (f"{problem.corpus_given:,} from {FLAGS.corpus_file} + the positives"
         if FLAGS.corpus_file else "the positives") + ")")
  k = mining.candidates_k(settings, problem)
  rows_pad = -(-len(problem.queries) // FLAGS.batch_size) * FLAGS.batch_size
  state = mining.device_bytes(rows_pad, m.config.hidden_size, k,
                              max(len(p) for p in problem.positives), FLAGS.block_size, devices)
  say(f"searching: {devices} devices ({jax.process_count()} processes), blocks of "
      f"{FLAGS.block_size} texts, batches of {FLAGS.batch_size}, top {k} a query "
      f"({settings.search}); {_size(state)} of search state a device, whatever the corpus size")
  t0 = time.time()
  mined, rows = mine(m, problem, settings, pooling=pooling, query_prompt=query_prompt,
                     corpus_prompt=corpus_prompt, max_seq_length=length,
                     batch_size=FLAGS.batch_size, block_size=FLAGS.block_size,
                     progress=FLAGS.progress and lead, reranker=reranker)
  seconds = time.time() - t0
  for line in mining.summary(problem, settings, mined, rows):
    say(line)
  if lead:
    columns = mining.columns_of(problem, settings)
    mining.write_rows(FLAGS.output_file, rows, columns)
    texts = len(problem.queries) + len(problem.corpus)
    say(f"wrote {FLAGS.output_file}: {len(rows):,} rows, columns {', '.join(columns)} "
        f"(search {seconds:.1f} s: {texts / seconds:.0f} texts/s encoded and searched, compiles "
        "included)")
    say("next: " + next_command(FLAGS.output_file, FLAGS.init_checkpoint, settings, length,
                                  FLAGS.input_file))


if __name__ == "__main__":
  define_flags()
  cli.run(main, init_distributed=True)
