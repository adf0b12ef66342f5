"""Raw text -> sharded TFRecords of unmasked BERT pre-training instances.

  python -m data_pipelines.create_pretraining_data --input_file='data/corpus/*.txt' \\
      --output_dir=data/records --vocab_file=data/vocab.txt --max_seq_length=128 \\
      --dupe_factor=10 --num_shards=16 --num_workers=8

Flags follow google-research/bert's create_pretraining_data.py. Masking is not done here: the
input pipeline (`pretrain_input.py`) masks on the fly, so each record holds only `input_ids`,
`input_mask`, `segment_ids` (int64 [max_seq_length], padded with 0) and `next_sentence_labels`
(int64 [1]: 0 = IsNext, 1 = NotNext). `dataset_info.json` beside the shards gives the instance
count per shard, max_seq_length, the vocab path and sha256, do_lower_case and the NSP flag.

Inputs (`--input_format`, read by `text_sources.py`): `text` (the original format: one sentence
per line, a blank line between documents), `jsonl` (`--jsonl_text_key`) or `tfds` (a prepared
dataset, never downloaded); JSONL/TFDS text is split into sentences by `text_sources.split_sentences`.
Instances are built by the pure functions of `instances.py`. Optional filters for web corpora
(exact-duplicate documents, minimum length, script; all off by default): `filters.py`.

Where the random "next sentence" comes from (`--nsp_sampling`):
  * `corpus`: from the whole corpus, as the paper and google-research/bert (which holds every
    document in memory). `whole_corpus.py` keeps the token ids of all documents in memory here
    (~3.5 bytes of RAM per byte of English text) and writes the same records as the Apache Beam
    pipeline (`beam_pipeline.py`), which does it at any size with keyed shuffles.
  * `block`: the fallback for corpora larger than memory. Each source (input file or TFDS part)
    is read in blocks of `--document_pool_size` documents; the random-next document comes from
    the same block, and the block's instances (all dupes) are shuffled together. Memory per
    worker is one block whatever the corpus size: 1000 Wikipedia-sized documents (~700 tokens)
    are ~3 MB of token ids and, at dupe_factor=10, ~56k instances (~30 MB serialized). The dupes
    of a document thus lie within one block's instances rather than a corpus apart; the
    training input pipeline's shuffle buffer and shard interleave mix blocks.
  * `auto` (default): `corpus` when the estimated memory fits in half the machine's RAM, else
    `block`; dataset_info.json records which was used.

Other differences from the original:
  * Random streams are seeded from (random_seed, source or document index, dupe index), so the
    output is byte-identical for a seed whatever --num_workers is (and, in corpus mode, whatever
    runner and worker count the Beam pipeline uses).
  * block: shard s holds instances [s*N/S, (s+1)*N/S) of the sources' outputs concatenated in
    input order (balanced to +-1 instance); the original dealt a shuffled list round robin.
    corpus: an instance goes to shard (key mod S) for a 64-bit key hashed from its origin, and
    a shard is sorted by key (a pseudo-random shuffle; shard sizes vary by ~sqrt(N/S)).
"""

import contextlib
import dataclasses
import os
import sys
import time

from absl import flags
import tqdm

from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax_core.tf_setup import tf
from data_pipelines.records import block_sampling
from data_pipelines.records import dataset_info as dataset_info_lib
from data_pipelines.corpus import filters as filters_lib
from data_pipelines.records import instances as instances_lib
from data_pipelines.records import records
from data_pipelines.corpus import text_sources
from data_pipelines.tokenizers import tokenization
from data_pipelines.tokenizers import vocab as vocab_lib
from data_pipelines.records import whole_corpus
from data_pipelines.records import word_boundaries as word_boundaries_lib
# What callers of this program's API use (the run's config and counts, its error, shard names).
from data_pipelines.records.records import (  # noqa: F401
    Config, PretrainingDataError, Stats, open_file, shard_name)

_Error = PretrainingDataError
INFO_FILE = "dataset_info.json"
_TMP_DIR = ".tmp-create_pretraining_data"  # per-source part files, removed at the end


# ----------------------------------------------------------------------------------------------
# Validation: every problem is a one-line error before anything is written.
# ----------------------------------------------------------------------------------------------
def validate_config(cfg):
  if cfg.input_format not in ("text", "jsonl", "tfds"):
    raise _Error(f"--input_format={cfg.input_format}: expected text, jsonl or tfds.")
  if not cfg.output_dir:
    raise _Error("--output_dir is empty: pass the directory to write the TFRecord shards to.")
  if cfg.sop and cfg.no_nsp:
    raise _Error("--sop and --no_nsp: pick one (SOP pairs for ALBERT, full sentences for "
                 "RoBERTa/SpanBERT).")
  min_len = 3 if cfg.no_nsp else 5  # [CLS] A [SEP] B [SEP] with len(A), len(B) >= 1
  if cfg.max_seq_length < min_len:
    raise _Error(f"--max_seq_length={cfg.max_seq_length}: must be >= {min_len} "
                 "(BERT uses 128, then 512).")
  if not 0.0 <= cfg.short_seq_prob <= 1.0:
    raise _Error(f"--short_seq_prob={cfg.short_seq_prob}: expected a probability in [0, 1].")
  for name in ("dupe_factor", "num_shards", "num_workers", "tfds_num_parts",
               "document_pool_size"):
    if getattr(cfg, name) < 1:
      raise _Error(f"--{name}={getattr(cfg, name)}: must be >= 1.")
  if cfg.nsp_sampling not in ("auto", "corpus", "block"):
    raise _Error(f"--nsp_sampling={cfg.nsp_sampling}: expected auto, corpus or block.")
  if cfg.word_boundaries not in word_boundaries_lib.MODES:
    raise _Error(f"--word_boundaries={cfg.word_boundaries}: expected auto, none or jieba.")
  filters_lib.validate(cfg.filters)


# Bytes of RAM per byte of input text in corpus mode: the token ids as array('i') sentences in
# lists (~1 token per 4.5 bytes of English text; 4 bytes a token + ~64 bytes an array object)
# plus the per-shard key lists. Measured (docs/beam.md, "Memory"): peak RSS grew by 85 MB for
# 10 MB of text and 189 MB for 40 MB, i.e. 3.5 bytes per byte beyond a fixed ~50 MB; 4 leaves a
# margin.
CORPUS_RAM_PER_INPUT_BYTE = 4


def _input_bytes(cfg, sources):
  if cfg.input_format != "tfds":
    return sum(s.size for s in sources)
  import tensorflow_datasets as tfds
  kwargs = dict(data_dir=cfg.tfds_data_dir) if cfg.tfds_data_dir else {}
  return tfds.builder(cfg.tfds_name, **kwargs).info.splits[cfg.tfds_split].num_bytes


def choose_nsp_sampling(cfg, sources, ram_bytes=None):
  """'corpus' or 'block': --nsp_sampling, or for auto whether the corpus fits in half the RAM."""
  mode = cfg.nsp_sampling
  if mode == "auto":
    if ram_bytes is None:
      ram_bytes = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    fits = CORPUS_RAM_PER_INPUT_BYTE * _input_bytes(cfg, sources) <= ram_bytes / 2
    mode = "corpus" if fits else "block"
  if mode == "block" and cfg.dedup_documents:
    raise _Error("--dedup_documents needs the whole corpus (--nsp_sampling=corpus, or the Beam "
                 "pipeline for corpora larger than memory); with block sampling only duplicates "
                 "within one block could be found.")
  return mode


def _check_output_dir(cfg):
  """Existing output: refused, or with --overwrite removed (dataset_info.json first)."""
  if not tf.io.gfile.isdir(cfg.output_dir):
    return
  old = [os.path.join(cfg.output_dir, f) for f in tf.io.gfile.listdir(cfg.output_dir)
         if f == INFO_FILE or (f.startswith("part-") and ".tfrecord" in f)]
  if old and not cfg.overwrite:
    raise _Error(f"--output_dir={cfg.output_dir}: already holds {len(old)} output file(s); "
                 "pass --overwrite to replace them or choose another directory.")
  for path in sorted(old, key=lambda p: not p.endswith(INFO_FILE)):
    tf.io.gfile.remove(path)


# ----------------------------------------------------------------------------------------------
# The run.
# ----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def output_guard(cfg):
  """Yields (part_dir, shard names list); on any failure nothing that looks complete stays:
  no shard of this run, no temp folder, no output dir this run created."""
  created_output_dir = not tf.io.gfile.isdir(cfg.output_dir)
  part_dir = os.path.join(cfg.output_dir, _TMP_DIR)
  if tf.io.gfile.exists(part_dir):
    tf.io.gfile.rmtree(part_dir)  # left over from a crashed run
  tf.io.gfile.makedirs(part_dir)
  names = []
  try:
    yield part_dir, names
  except BaseException:
    tf.io.gfile.rmtree(part_dir)
    for n in names:  # the shard, and any temporary of it a killed worker left (files_lib.atomic_path)
      path = os.path.join(cfg.output_dir, n)
      for p in [path] * tf.io.gfile.exists(path) + tf.io.gfile.glob(path + ".tmp-*"):
        tf.io.gfile.remove(p)
    if created_output_dir and not tf.io.gfile.listdir(cfg.output_dir):
      tf.io.gfile.rmtree(cfg.output_dir)
    raise
  tf.io.gfile.rmtree(part_dir)


def vocab_metadata(cfg, vocab):
  """The vocab fields of dataset_info.json (computed once, before any worker starts)."""
  path = cfg.vocab_file or cfg.spm_model_file or cfg.tokenizer_json
  # Casing and pre-tokenizer as the tokenizer resolved them from the vocab's settings (a
  # contradicting --do_lower_case has already failed in get_tokenizer).
  settings = vocab_lib.resolve_settings(cfg.vocab_file or None, cfg.spm_model_file or None,
                                        cfg.do_lower_case,
                                        tokenizer_json=cfg.tokenizer_json or None)
  # The ids the records' [CLS]/[SEP] carry and masking must use, as the tokenizer gave them
  # (a tokenizer.json has them anywhere: ModernBERT's [CLS] is 50281).
  return {"vocab_file": path, "vocab_kind": vocab.kind, "vocab_size": vocab.size,
          "special_ids": vocab.special_ids,
          "vocab_sha256": files_lib.sha256_file(path), "do_lower_case": settings["do_lower_case"],
          "casing_source": settings["casing_source"], "pretokenizer": settings["pretokenizer"],
          "word_boundaries": cfg.word_boundaries,
          "sentence_splitter": cfg.sentence_splitter if cfg.input_format != "text" else None}


def dataset_info(cfg, vocab_meta, source_names, stats, shards, nsp_sampling):
  """The dataset_info.json dict, for the local path and the Beam pipeline alike."""
  return {
      "num_instances": stats.instances,
      "shards": [{"file": n, "num_instances": c} for n, c in shards],
      "max_seq_length": cfg.max_seq_length,
      "nsp": not (cfg.no_nsp or cfg.sop),
      # What next_sentence_labels mean: nsp | sop | none; training checks it against the model's
      # objectives (dataset_info.check_records).
      "sentence_objective": "none" if cfg.no_nsp else "sop" if cfg.sop else "nsp",
      **vocab_meta,
      "dupe_factor": cfg.dupe_factor,
      "short_seq_prob": cfg.short_seq_prob,
      "random_seed": cfg.random_seed,
      "nsp_sampling": nsp_sampling,
      "document_pool_size": cfg.document_pool_size,
      "input_format": cfg.input_format,
      "sources": list(source_names),
      "documents": stats.documents,
      "sentences": stats.sentences,
      "input_tokens": stats.input_tokens,
      "not_next_instances": stats.random_next,
      "dropped_documents": stats.dropped,
      "replaced_characters": stats.replaced,
      "filters": dataclasses.asdict(cfg.filters),
      "filtered_duplicate_documents": stats.filtered_duplicate,
      "filtered_short_documents": stats.filtered_short,
      "filtered_script_documents": stats.filtered_script,
      "tokens": stats.tokens,
      "word_boundary_fallbacks": stats.word_boundary_fallbacks,
  }


def write_dataset_info(output_dir, info, command=None):
  # The contract's writer adds masking (dynamic), the command line and a version. The Beam
  # pipeline writes from a worker, so it passes its launcher's command line.
  dataset_info_lib.write(output_dir, info, command)


def resolve_word_boundaries(cfg):
  """cfg with word_boundaries auto resolved from the vocab's pre-tokenizer (call before prepare)."""
  validate_config(cfg)
  return dataclasses.replace(cfg, word_boundaries=word_boundaries_lib.resolve(
      cfg.word_boundaries, cfg.vocab_file, cfg.spm_model_file, cfg.do_lower_case,
      cfg.tokenizer_json))


def prepare(cfg, nsp_sampling=None):
  """Every check before any output: config, vocab, inputs, output dir, sampling mode.

  Returns (tokenizer, InstanceParams, sources, nsp_sampling); `nsp_sampling` given (the Beam
  pipeline: always "corpus") skips choosing one. `cfg.word_boundaries` must be resolved
  (resolve_word_boundaries).
  """
  validate_config(cfg)
  if cfg.word_boundaries == "auto":
    raise ValueError("prepare() needs resolve_word_boundaries(cfg) first (a bug in the caller).")
  tok = tokenization.get_tokenizer(vocab_file=cfg.vocab_file or None,
                                   spm_model_file=cfg.spm_model_file or None,
                                   do_lower_case=cfg.do_lower_case,
                                   tokenizer_json=cfg.tokenizer_json or None)
  params = instances_lib.InstanceParams(cfg.max_seq_length, cfg.short_seq_prob, tok.vocab.cls_id,
                                        tok.vocab.sep_id)
  sources = text_sources.resolve_sources(cfg)
  mode = nsp_sampling or choose_nsp_sampling(cfg, sources)
  _check_output_dir(cfg)
  return tok, params, sources, mode


def summarize(stats, num_sources, num_shards, max_seq_length, seconds, nsp_sampling, sop=False):
  slots = stats.instances * max_seq_length
  return dict(sop=sop,
      sources=num_sources, documents=stats.documents, dropped=stats.dropped,
      replaced=stats.replaced, sentences=stats.sentences, input_tokens=stats.input_tokens,
      instances=stats.instances, not_next_fraction=stats.random_next / stats.instances,
      tokens=stats.tokens, padding_fraction=1.0 - stats.tokens / slots, shards=num_shards,
      filtered_duplicate=stats.filtered_duplicate, filtered_short=stats.filtered_short,
      filtered_script=stats.filtered_script, nsp_sampling=nsp_sampling, seconds=seconds,
      word_boundary_fallbacks=stats.word_boundary_fallbacks)


def run(cfg, show_progress=True):
  """Validates everything, writes the shards and dataset_info.json; returns the summary dict."""
  start = time.time()
  cfg = resolve_word_boundaries(cfg)
  tok, params, sources, mode = prepare(cfg)
  num_workers = min(cfg.num_workers, len(sources))
  bar = tqdm.tqdm(total=sum(s.size for s in sources), disable=not show_progress,
                  unit="B" if cfg.input_format != "tfds" else "doc", unit_scale=True,
                  desc=f"{len(sources)} source(s), {num_workers} worker(s), {mode} sampling")
  try:
    with output_guard(cfg) as (part_dir, names), \
         records.worker_pool(cfg, num_workers, params, part_dir) as (pool, queue):
      run_fn = whole_corpus.run_local if mode == "corpus" else block_sampling.run_blocks
      stats, shards = run_fn(cfg, tok, params, sources, part_dir, names,
                             records.Progress(bar, pool, queue))
      info = dataset_info(cfg, vocab_metadata(cfg, tok.vocab), [s.name for s in sources], stats,
                          shards, mode)
      write_dataset_info(cfg.output_dir, info)
  finally:
    bar.close()
  return summarize(stats, len(sources), len(shards), cfg.max_seq_length, time.time() - start,
                   mode, cfg.sop)


def format_summary(s, output_dir):
  return "\n".join([
      f"wrote {s['instances']:,} instances in {s['shards']} shard(s) to {output_dir} in "
      f"{s['seconds']:.1f} s",
      f"  documents {s['documents']:,} from {s['sources']} source(s); dropped (empty or "
      f"blank-only) {s['dropped']:,}; replaced (invalid UTF-8) {s['replaced']:,}",
      f"  filtered: duplicate {s['filtered_duplicate']:,}, short {s['filtered_short']:,}, "
      f"script {s['filtered_script']:,}; NSP sampling: {s['nsp_sampling']}",
      f"  sentences {s['sentences']:,}, input tokens {s['input_tokens']:,}"
      + (f"; jieba word boundaries fell back to tokens in {s['word_boundary_fallbacks']:,} "
         "sentence(s)" if s.get("word_boundary_fallbacks") else ""),
      f"  instance tokens {s['tokens']:,}, padding fraction {s['padding_fraction']:.3f}, "
      f"{'SOP swapped' if s.get('sop') else 'NotNext'} fraction {s['not_next_fraction']:.3f}",
  ])


# ----------------------------------------------------------------------------------------------
# CLI.
# ----------------------------------------------------------------------------------------------
FLAGS = flags.FLAGS


def define_flags(flag_values=flags.FLAGS):
  """CLI flags; defined only when run as a program, so importing this module defines none."""
  fv = dict(flag_values=flag_values)
  d = Config()
  flags.DEFINE_string("input_file", None, "Input glob(s), comma-separated (text or jsonl).", **fv)
  flags.DEFINE_string("output_dir", None, "Directory for the TFRecord shards.", **fv)
  flags.DEFINE_string("vocab_file", None, "WordPiece vocab.txt.", **fv)
  flags.DEFINE_string("spm_model_file", None, "SentencePiece .model (instead of --vocab_file).",
                      **fv)
  flags.DEFINE_string("tokenizer_json", None, "Hugging Face tokenizer.json, e.g. ModernBERT's "
                      "byte-level BPE (instead of --vocab_file).", **fv)
  flags.DEFINE_bool("do_lower_case", d.do_lower_case, "Default: the vocab's casing (its "
                    ".meta.json, or inferred for google/HF vocabs); a contradiction is an error.",
                    **fv)
  flags.DEFINE_enum("sentence_splitter", d.sentence_splitter, ["auto", "regex", "kss", "pysbd"],
                    "JSONL/TFDS text -> sentences: kss (Korean), pysbd, the regex, or auto "
                    "(from each document's script).", **fv)
  flags.DEFINE_integer("max_seq_length", d.max_seq_length, "Maximum sequence length.", **fv)
  flags.DEFINE_float("short_seq_prob", d.short_seq_prob,
                     "Probability of aiming a document's instances at a shorter length.", **fv)
  flags.DEFINE_integer("random_seed", d.random_seed, "Random seed for data generation.", **fv)
  flags.DEFINE_integer("dupe_factor", d.dupe_factor,
                       "Passes over the input (different pairs and splits each time).", **fv)
  flags.DEFINE_bool("no_nsp", d.no_nsp, "RoBERTa FULL-SENTENCES packing, no NSP pairs.", **fv)
  flags.DEFINE_bool("sop", d.sop, "ALBERT sentence-order pairs (label 1 = swapped), no NSP.",
                    **fv)
  flags.DEFINE_integer("num_shards", d.num_shards, "Output TFRecord shards.", **fv)
  flags.DEFINE_integer("num_workers", d.num_workers, "Processes (output does not depend on it).",
                       **fv)
  flags.DEFINE_enum("input_format", d.input_format, ["text", "jsonl", "tfds"], "Input kind.",
                    **fv)
  flags.DEFINE_string("jsonl_text_key", d.jsonl_text_key, "JSONL field with the text.", **fv)
  flags.DEFINE_string("tfds_name", None, "TFDS dataset (prepared; never downloaded).", **fv)
  flags.DEFINE_string("tfds_split", d.tfds_split, "TFDS split.", **fv)
  flags.DEFINE_string("tfds_text_key", d.tfds_text_key, "TFDS feature with the text.", **fv)
  flags.DEFINE_string("tfds_data_dir", None, "TFDS data_dir.", **fv)
  flags.DEFINE_integer("tfds_num_parts", d.tfds_num_parts,
                       "TFDS split is read as this many parallel parts (fixes the output).", **fv)
  flags.DEFINE_integer("document_pool_size", d.document_pool_size,
                       "Documents per block: random-next pool and instance shuffle.", **fv)
  flags.DEFINE_enum("nsp_sampling", d.nsp_sampling, ["auto", "corpus", "block"],
                    "Random-next pool: the whole corpus (in memory), blocks of "
                    "--document_pool_size, or auto (corpus when it fits in half the RAM).", **fv)
  flags.DEFINE_bool("dedup_documents", d.dedup_documents,
                    "Drop exact-duplicate documents (the first in input order is kept).", **fv)
  flags.DEFINE_integer("min_document_tokens", d.min_document_tokens,
                       "Drop documents with fewer tokens (0: keep all).", **fv)
  flags.DEFINE_string("keep_scripts", d.keep_scripts,
                      "Comma-separated Unicode scripts (e.g. Latin,Han): drop documents with "
                      "fewer than --min_script_fraction of their letters in them.", **fv)
  flags.DEFINE_float("min_script_fraction", d.min_script_fraction,
                     "See --keep_scripts.", **fv)
  flags.DEFINE_enum("word_boundaries", d.word_boundaries, list(word_boundaries_lib.MODES),
                    "Chinese whole-word masking: write jieba word boundaries (feature "
                    "word_continues); auto = jieba when the vocab's pre-tokenizer is jieba.", **fv)
  flags.DEFINE_bool("overwrite", d.overwrite, "Replace shards already in --output_dir.", **fv)


def config_from_flags(fv):
  values = {f.name: getattr(fv, f.name) for f in dataclasses.fields(Config)}
  return Config(**{k: v for k, v in values.items() if v is not None})  # None: unset string


def main(argv):
  del argv
  try:
    summary = run(config_from_flags(FLAGS), show_progress=sys.stderr.isatty())
  except tf.errors.OpError as e:  # e.g. a gs:// bucket without access: not a bug of ours
    raise PretrainingDataError(str(e).splitlines()[0]) from None
  print(format_summary(summary, FLAGS.output_dir))


if __name__ == "__main__":
  # Run the imported module, not __main__: whole_corpus.py and the workers import
  # data_pipelines.create_pretraining_data, and one copy of its classes and globals is simpler.
  from data_pipelines import create_pretraining_data as _module
  _module.define_flags()
  errors.run(_module.main)
