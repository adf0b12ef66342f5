"""Pre-training records with Apache Beam: any corpus size, random next from the whole corpus.

  # One machine, 8 processes:
  python -m data_pipelines.beam_pipeline --input_file='data/corpus/*.txt' \\
      --output_dir=data/records --vocab_file=data/vocab.txt --max_seq_length=128 \\
      --dupe_factor=10 --num_shards=256 \\
      -- --runner=DirectRunner --direct_running_mode=multi_processing --direct_num_workers=8
  # Google Cloud Dataflow (docs/beam.md):
  python -m data_pipelines.beam_pipeline --input_file='gs://BUCKET/wiki/*.txt' \\
      --output_dir=gs://BUCKET/records --vocab_file=gs://BUCKET/vocab.txt ... \\
      -- --runner=DataflowRunner --project=PROJECT --region=us-central1 \\
         --temp_location=gs://BUCKET/tmp --setup_file=./setup.py --max_num_workers=50

The flags are create_pretraining_data's (same inputs: text/JSONL globs, gs:// paths, TFDS; same
records and dataset_info.json, written by the same functions); Beam's own options go after `--`.
The output is that of `create_pretraining_data --nsp_sampling=corpus` byte for byte (the rules
are in `whole_corpus.py`), whatever the runner and its number of workers.

The graph (k = document index in input order, N = number of documents):
  sources --Reshuffle--> ReadSource (read, filter, tokenize) --> ((source, position), doc)
    [--dedup_documents: GroupByKey(digest) keeps the first copy; GroupByKey(source) re-ranks]
  CombinePerKey(count per source) --> offsets side input --> (k, doc), N
  NSP:    plan pairs of (k, dupe) --> IsNext: records
                                  \\-> NotNext: (random document, pair) --CoGroupByKey with
                                      (k, doc)--> B cut from that document --> records
  no-NSP: (dupe, group) --GroupByKey--> packed records
  records --(key mod S)--> CoGroupByKey with range(S) (empty shards too) --> sorted, written
  stats --CombineGlobally--> dataset_info.json
The shuffle volume is about the size of the records (NotNext pairs travel to their B's document
once); no step holds more than one document's requests or one shard (~N x dupe / S records).
"""

import dataclasses
import json
import logging
import os
import shlex
import sys
import time

from absl import flags


class _DropBigQueryNotice(logging.Filter):
  """apache_beam logs "apitools not found, and bigquery client libraries are not available" on
  the root logger when imported without its GCP extras; this pipeline uses no BigQuery, and the
  line would precede every CLI message (one-line errors included)."""

  def filter(self, record):
    return "bigquery client libraries are not available" not in record.getMessage()


_root_logger = logging.getLogger()
_root_handlers = list(_root_logger.handlers)  # logging.warning() would add one (basicConfig)
_root_logger.addFilter(_bq_filter := _DropBigQueryNotice())
try:
  import apache_beam as beam
  from apache_beam.options.pipeline_options import PipelineOptions
finally:
  _root_logger.removeFilter(_bq_filter)
  _root_logger.handlers[:] = _root_handlers

from bert_jax_core import errors
from bert_jax_core import files as files_lib
from data_pipelines import create_pretraining_data as cpd
from data_pipelines.records import instances as instances_lib
from data_pipelines.records import records as records_lib
from data_pipelines.tokenizers import tokenization
from data_pipelines.records import whole_corpus
from bert_jax_core.tf_setup import tf


class BeamPipelineError(errors.UserError):
  """A flag the Beam pipeline cannot honour."""


# ----------------------------------------------------------------------------------------------
# Transforms.
# ----------------------------------------------------------------------------------------------
class ReadSource(beam.DoFn):
  """Source -> ((source index, position), doc) and one Stats (tagged "stats"); with dedup also
  (digest, (source index, position)) tagged "digest"."""

  def __init__(self, cfg):
    self._cfg = cfg

  def setup(self):  # per worker: TF tokenizers do not pickle
    cfg = self._cfg
    self._encode = tokenization.get_tokenizer(vocab_file=cfg.vocab_file or None,
                                              spm_model_file=cfg.spm_model_file or None,
                                              do_lower_case=cfg.do_lower_case,
                                              tokenizer_json=cfg.tokenizer_json or None).encode

  def process(self, source):
    stats = records_lib.Stats()
    for r, (digest, doc) in enumerate(
        whole_corpus.read_source(source, self._cfg, self._encode, stats)):
      yield (source.index, r), doc
      if digest is not None:
        yield beam.pvalue.TaggedOutput("digest", (digest, (source.index, r)))
    yield beam.pvalue.TaggedOutput("stats", stats)


def _sum_stats(stats_list):
  total = records_lib.Stats()
  for s in stats_list:
    total.add(s)
  return total


def _rerank(source_and_positions):
  """(source, kept positions) -> ((source, position), rank among the kept)."""
  source, positions = source_and_positions
  for rank, r in enumerate(sorted(positions)):
    yield (source, r), rank


def _keep_first_copies(joined):
  """((source, position), {doc: [doc], rank: [rank] or []}) -> ((source, rank), doc), or a
  Stats correction for a dropped duplicate (tagged "stats")."""
  (source, _), groups = joined
  doc, = groups["doc"]
  rank = list(groups["rank"])
  if rank:
    yield (source, rank[0]), doc
  else:
    yield beam.pvalue.TaggedOutput("stats", records_lib.Stats(
        documents=-1, filtered_duplicate=1, sentences=-len(doc),
        input_tokens=-sum(map(len, doc))))


def _dedup(docs, digests):
  firsts = (digests | "ByDigest" >> beam.GroupByKey()
            | "FirstCopy" >> beam.Map(lambda kv: min(kv[1])))
  ranks = (firsts | "BySource" >> beam.GroupByKey()
           | "Rerank" >> beam.FlatMap(_rerank))
  kept = ({"doc": docs, "rank": ranks} | "JoinRanks" >> beam.CoGroupByKey()
          | "KeepFirst" >> beam.FlatMap(_keep_first_copies).with_outputs("stats", main="docs"))
  return kept.docs, kept.stats


def _offsets(counts):
  """[(source, count)] -> ({source: first document index}, N)."""
  offsets, total = {}, 0
  for source, count in sorted(counts):
    offsets[source] = total
    total += count
  return offsets, total


class PlanPairs(beam.DoFn):
  """(k, doc) -> IsNext records; NotNext pairs keyed by their random document (tagged)."""

  def __init__(self, cfg, params):
    self._cfg, self._params = cfg, params

  def process(self, indexed, corpus):
    k, doc = indexed
    for pair in whole_corpus.nsp_pairs(doc, k, corpus[1], self._cfg, self._params):
      if pair.random_document >= 0:
        yield beam.pvalue.TaggedOutput("wanted", (pair.random_document, pair))
      else:
        yield whole_corpus.finish_pair(pair, pair.tokens_b, self._cfg, self._params)


def _resolve(joined, cfg, params):
  _, groups = joined
  doc, = groups["doc"]
  for pair in groups["pair"]:
    tokens_b = instances_lib.random_next_tokens(doc, pair)
    yield whole_corpus.finish_pair(pair, tokens_b, cfg, params)


def _nsp_records(indexed, corpus, cfg, params):
  planned = indexed | "PlanPairs" >> beam.ParDo(PlanPairs(cfg, params), corpus).with_outputs(
      "wanted", main="done")
  resolved = ({"doc": indexed, "pair": planned.wanted} | "JoinRandomNext" >> beam.CoGroupByKey()
              | "CutRandomNext" >> beam.FlatMap(_resolve, cfg, params))
  return (planned.done, resolved) | "AllRecords" >> beam.Flatten()


def _packed_records(indexed, corpus, cfg, params):
  def to_groups(kv, corpus):
    k, doc = kv
    for dupe in range(cfg.dupe_factor):
      yield (dupe, whole_corpus.packing_group(k, dupe, cfg, corpus[1])), (k, doc)

  return (indexed | "ToGroups" >> beam.FlatMap(to_groups, corpus)
          | "ByGroup" >> beam.GroupByKey()
          | "Pack" >> beam.FlatMap(
              lambda kv: whole_corpus.pack_group(list(kv[1]), kv[0][0], kv[0][1], cfg, params)))


def _write_shard(joined, cfg):
  """(shard, {records: [(key, record, tokens, not_next)]}) -> (file, instances, tokens, nn)."""
  shard, groups = joined
  records = list(groups["records"])
  name = records_lib.shard_name(shard, cfg.num_shards)
  path = os.path.join(cfg.output_dir, name)
  with files_lib.atomic_path(path) as tmp, tf.io.TFRecordWriter(tmp) as writer:
    for record in whole_corpus.sorted_records([(r[0], r[1]) for r in records]):
      writer.write(record)
  return name, len(records), sum(r[2] for r in records), sum(r[3] for r in records)


def _write_info(_, stats, shards, cfg, vocab_meta, source_names, command):
  stats = dataclasses.replace(stats)  # a side input: not ours to change
  shards = sorted(shards)
  stats.instances = sum(s[1] for s in shards)
  stats.tokens = sum(s[2] for s in shards)
  stats.random_next = sum(s[3] for s in shards)
  info = cpd.dataset_info(cfg, vocab_meta, source_names, stats, [s[:2] for s in shards],
                          "corpus")
  cpd.write_dataset_info(cfg.output_dir, info, command)


def build(p, cfg, sources, params, vocab_meta, command):
  """Adds the whole pipeline to `p` (a beam.Pipeline)."""
  read = (p | "Sources" >> beam.Create(sources) | "SpreadSources" >> beam.Reshuffle()
          | "ReadSource" >> beam.ParDo(ReadSource(cfg)).with_outputs("stats", "digest",
                                                                      main="docs"))
  docs, stats = read.docs, [read.stats]
  if cfg.dedup_documents:
    docs, dedup_stats = _dedup(docs, read.digest)
    stats.append(dedup_stats)
  counts = (docs | "SourceOf" >> beam.Map(lambda kv: (kv[0][0], 1))
            | "CountPerSource" >> beam.CombinePerKey(sum))
  corpus = beam.pvalue.AsSingleton(counts | "Offsets" >> beam.combiners.ToList()
                                   | "ToOffsets" >> beam.Map(_offsets))
  indexed = docs | "Index" >> beam.Map(
      lambda kv, corpus: (corpus[0][kv[0][0]] + kv[0][1], kv[1]), corpus)
  records_fn = _packed_records if cfg.no_nsp else _nsp_records
  records = records_fn(indexed, corpus, cfg, params)
  by_shard = records | "ToShard" >> beam.Map(
      lambda r: (whole_corpus.shard_of(r[0], cfg.num_shards), r))
  all_shards = p | "ShardIds" >> beam.Create([(s, None) for s in range(cfg.num_shards)])
  shards = ({"records": by_shard, "id": all_shards} | "ByShard" >> beam.CoGroupByKey()
            | "WriteShard" >> beam.Map(_write_shard, cfg))
  total = (tuple(stats) | "AllStats" >> beam.Flatten()
           | "SumStats" >> beam.CombineGlobally(_sum_stats))
  _ = (p | "Info" >> beam.Create([None])
       | "WriteInfo" >> beam.Map(_write_info, beam.pvalue.AsSingleton(total),
                                 beam.pvalue.AsList(shards), cfg, vocab_meta,
                                 [s.name for s in sources], command))


# ----------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------
def run(cfg, beam_args=()):
  """Checks everything, runs the pipeline (waits for it), returns the summary dict."""
  start = time.time()
  if cfg.nsp_sampling == "block":
    raise BeamPipelineError("--nsp_sampling=block: the Beam pipeline always draws the random "
                            "next from the whole corpus; drop the flag (or use "
                            "create_pretraining_data for block sampling).")
  cfg = cpd.resolve_word_boundaries(cfg)
  tok, params, sources, _ = cpd.prepare(cfg, nsp_sampling="corpus")
  vocab_meta = cpd.vocab_metadata(cfg, tok.vocab)
  options = PipelineOptions(list(beam_args))
  command = shlex.join([os.path.basename(sys.executable), "-m", "data_pipelines.beam_pipeline",
                        *sys.argv[1:]])
  with cpd.output_guard(cfg) as (_, names):
    names.extend(records_lib.shard_name(s, cfg.num_shards) for s in range(cfg.num_shards))
    names.append(cpd.INFO_FILE)
    with beam.Pipeline(options=options) as p:
      build(p, cfg, sources, params, vocab_meta, command)
    with records_lib.open_file(os.path.join(cfg.output_dir, cpd.INFO_FILE), "r") as f:
      info = json.load(f)
    stats = records_lib.Stats(
        documents=info["documents"], dropped=info["dropped_documents"],
        replaced=info["replaced_characters"], sentences=info["sentences"],
        input_tokens=info["input_tokens"], instances=info["num_instances"],
        random_next=info["not_next_instances"], tokens=info["tokens"],
        filtered_duplicate=info["filtered_duplicate_documents"],
        filtered_short=info["filtered_short_documents"],
        filtered_script=info["filtered_script_documents"],
        word_boundary_fallbacks=info["word_boundary_fallbacks"])
    if stats.instances == 0:
      raise records_lib.no_instance_error(cfg, stats)
  return cpd.summarize(stats, len(sources), cfg.num_shards, cfg.max_seq_length,
                       time.time() - start, "corpus", cfg.sop)


FLAGS = flags.FLAGS


def main(argv):
  if FLAGS["num_workers"].present:
    raise BeamPipelineError("--num_workers is create_pretraining_data's; pass the runner's "
                            "options after --, e.g. -- --direct_num_workers=8 or, on Dataflow, "
                            "-- --max_num_workers=50.")
  try:
    summary = run(cpd.config_from_flags(FLAGS), argv[1:])
  except tf.errors.OpError as e:  # e.g. a gs:// bucket without access: not a bug of ours
    raise records_lib.PretrainingDataError(str(e).splitlines()[0]) from None
  print(cpd.format_summary(summary, FLAGS.output_dir))


if __name__ == "__main__":
  from data_pipelines import beam_pipeline as _module  # picklable by name, not as __main__
  cpd.define_flags()
  # Flags absl does not know (Beam's, after `--` or not) go to Beam's PipelineOptions.
  errors.run(_module.main, flags_parser=lambda argv: FLAGS(argv, known_only=True))
