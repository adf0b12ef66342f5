"""What every way of writing pre-training records shares: the run's Config and Stats, the random
seeds, tokenisation of documents, serialisation of an instance, shard names and the worker pool.

Imported by the samplers (`whole_corpus.py`, `block_sampling.py`), the Beam pipeline and the CLI
(`create_pretraining_data.py`), so none of them reaches into another's private names. The output
is byte-identical for a seed whatever the runner and worker count (`seed` below).
"""

import array
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import multiprocessing
import queue as queue_lib
import time

import tqdm

from bert_jax_core.tf_setup import tf
from data_pipelines.corpus import filters as filters_lib
from data_pipelines.corpus import text_sources
from data_pipelines.tokenizers import tokenization
from data_pipelines.records import word_boundaries as word_boundaries_lib


@dataclasses.dataclass(frozen=True)
class Config:
  input_file: str = ""  # glob, or comma-separated globs (text / jsonl)
  output_dir: str = ""
  vocab_file: str = ""
  spm_model_file: str = ""
  tokenizer_json: str = ""  # a Hugging Face tokenizer.json (data_pipelines/tokenizers/tokenizer_json.py)
  do_lower_case: bool | None = None  # None: the vocab's casing (<vocab>.meta.json; vocab.py)
  sentence_splitter: str = "auto"  # JSONL/TFDS text: auto | regex | kss | pysbd (text_sources)
  max_seq_length: int = 128
  short_seq_prob: float = 0.1
  random_seed: int = 12345
  dupe_factor: int = 10
  no_nsp: bool = False
  sop: bool = False  # ALBERT sentence-order pairs instead of NSP (instances.create_sop_instances)
  num_shards: int = 16
  num_workers: int = 1
  input_format: str = "text"  # text | jsonl | tfds
  jsonl_text_key: str = "text"
  tfds_name: str = ""
  tfds_split: str = "train"
  tfds_text_key: str = "text"
  tfds_data_dir: str = ""
  tfds_num_parts: int = 16
  document_pool_size: int = 1000
  nsp_sampling: str = "auto"  # auto | corpus | block (module docstring)
  dedup_documents: bool = False  # filters.py: all four off by default (the paper's recipe)
  min_document_tokens: int = 0
  keep_scripts: str = ""
  min_script_fraction: float = 0.5
  # Word boundaries for whole-word masking of Chinese (`word_continues` feature): auto | none |
  # jieba; auto = jieba when the vocab's pre-tokenizer is jieba (its .meta.json), else none.
  word_boundaries: str = "auto"
  overwrite: bool = False

  @property
  def filters(self):
    return filters_lib.FilterConfig(self.dedup_documents, self.min_document_tokens,
                                    self.keep_scripts, self.min_script_fraction)


@dataclasses.dataclass
class Stats:
  documents: int = 0  # kept (at least one token)
  dropped: int = 0  # empty or blank-only documents
  replaced: int = 0  # U+FFFD introduced for invalid UTF-8
  sentences: int = 0
  input_tokens: int = 0  # tokens of the kept sentences (counted once, not per dupe)
  instances: int = 0
  random_next: int = 0
  tokens: int = 0  # non-padding tokens written, [CLS]/[SEP] included
  filtered_duplicate: int = 0  # filters.py counts (0 unless a filter is on)
  filtered_short: int = 0
  filtered_script: int = 0
  word_boundary_fallbacks: int = 0  # sentences whose jieba words did not tokenize like the whole

  def add(self, other):
    for f in dataclasses.fields(self):
      setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))



PretrainingDataError = text_sources.PretrainingDataError
open_file = text_sources.open_file


def seed(*parts):
  """A 64-bit seed named by where its random stream is used (run seed, source, document, dupe)."""
  # Python's hash() of a str changes per process; sha256 is the same everywhere.
  return int.from_bytes(hashlib.sha256("/".join(map(str, parts)).encode()).digest()[:8], "little")


def shard_name(s, num_shards):
  return f"part-{s:05d}-of-{num_shards:05d}.tfrecord"


def no_instance_error(cfg, stats):
  return PretrainingDataError(
      f"--input_file={cfg.input_file or cfg.tfds_name}: no instance made from "
      f"{stats.documents} document(s) ({stats.dropped} empty or blank-only dropped); check the "
      "input format.")


# ----------------------------------------------------------------------------------------------
# Documents -> token ids -> serialized tf.train.Examples.
# ----------------------------------------------------------------------------------------------
def _int_feature(values):
  return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def serialize_instance(instance, max_seq_length, word_boundaries=False):
  n = len(instance.tokens)
  pad = [0] * (max_seq_length - n)
  ids = list(instance.tokens)
  feature = {}
  if word_boundaries:  # [seq] 1 where the token continues the word of the token before it
    cont, ids = word_boundaries_lib.split_flags(ids)
    feature["word_continues"] = _int_feature(cont + pad)
  feature.update({
      "input_ids": _int_feature(ids + pad),
      "input_mask": _int_feature([1] * n + pad),
      "segment_ids": _int_feature(list(instance.segment_ids) + pad),
      "next_sentence_labels": _int_feature([int(instance.is_random_next)]),
  })
  example = tf.train.Example(features=tf.train.Features(feature=feature))
  return example.SerializeToString(deterministic=True)  # map order fixed: byte-identical output


def tokenize_documents(documents, encode, stats, filter_cfg=None, digests=None,
                       word_boundaries="none"):
  """list of lists of sentence strings -> documents of array('i') sentences, empties dropped.

  With `filter_cfg`, the script and length filters drop documents (counted in stats); with a
  `digests` list, the dedup digest of each kept document is appended to it; with
  word_boundaries="jieba", ids carry word_boundaries.WORD_CONT (see serialize_instance).
  """
  if filter_cfg is not None and filter_cfg.keep_scripts:
    scripts = filters_lib.parse_scripts(filter_cfg.keep_scripts)
    documents = [d for d in documents if filters_lib.keep_text(d, filter_cfg, scripts, stats)]
  flat = [s for doc in documents for s in doc]
  if not flat:
    ids = []
  elif word_boundaries == "jieba":
    ids = word_boundaries_lib.encode(flat, encode, stats)
  else:
    ids = encode(flat)
  out, k = [], 0
  for doc in documents:
    sentences = [array.array("i", t) for t in ids[k:k + len(doc)] if len(t)]
    k += len(doc)
    if not sentences:
      stats.dropped += 1  # e.g. only control characters: no token at all
    elif filter_cfg is None or filters_lib.keep_tokens(sentences, filter_cfg, stats):
      out.append(sentences)
      stats.sentences += len(sentences)
      stats.input_tokens += sum(map(len, sentences))
      if digests is not None:
        digests.append(filters_lib.document_digest(doc))
  stats.documents += len(out)
  return out


# ----------------------------------------------------------------------------------------------
# The worker pool: processes that each build their own tokenizer (TF objects do not pickle).
# ----------------------------------------------------------------------------------------------
_WORKER = {}


def worker():
  """In a pool worker: {cfg, encode, params, part_dir, queue}, set by the pool's initializer."""
  return _WORKER


def init_worker(cfg, params, part_dir, progress_queue):
  tok = tokenization.get_tokenizer(vocab_file=cfg.vocab_file or None,
                                   spm_model_file=cfg.spm_model_file or None,
                                   do_lower_case=cfg.do_lower_case,
                                   tokenizer_json=cfg.tokenizer_json or None)
  _WORKER.update(cfg=cfg, encode=tok.encode, params=params, part_dir=part_dir,
                 queue=progress_queue)


def _drain(queue, bar, timeout):
  """Moves queued progress counts to the bar, waiting up to `timeout` s for the first one."""
  if queue is None:
    time.sleep(timeout)
    return
  try:
    bar.update(queue.get(timeout=timeout) if timeout else queue.get_nowait())
    while True:
      bar.update(queue.get_nowait())
  except queue_lib.Empty:
    pass


def run_pool(executor, fn, tasks, queue=None, bar=None):
  """Runs tasks on the executor, results in task order, feeding the bar; raises the first failure.

  A ProcessPoolExecutor, not multiprocessing.Pool: a worker killed by the OS (out of memory)
  raises BrokenProcessPool here instead of hanging the run forever.
  """
  futures = [executor.submit(fn, t) for t in tasks]
  while not all(f.done() for f in futures):
    for f in futures:
      if f.done() and f.exception() is not None:
        raise f.exception()
    _drain(queue, bar, 0.1)
  _drain(queue, bar, 0)
  return [f.result() for f in futures]


@contextlib.contextmanager
def worker_pool(cfg, num_workers, params, part_dir):
  """Yields (ProcessPoolExecutor, progress queue), or (None, None) for one worker."""
  if num_workers == 1:
    yield None, None
    return
  ctx = multiprocessing.get_context("spawn")  # TF is not fork-safe
  queue = ctx.Queue()
  before = {p.pid for p in multiprocessing.active_children()}
  pool = concurrent.futures.ProcessPoolExecutor(
      num_workers, mp_context=ctx, initializer=init_worker,
      initargs=(cfg, params, part_dir, queue))
  try:
    yield pool, queue
  except BaseException:
    # Stop the other workers now rather than after their current file (Python 3.14 has
    # terminate_workers()): on 3.11 they are the multiprocessing children started since the
    # pool was made (public multiprocessing.active_children(), not the pool's private dict).
    processes = [p for p in multiprocessing.active_children() if p.pid not in before]
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
      process.terminate()
      process.join()
    raise
  pool.shutdown()


@dataclasses.dataclass
class Progress:
  bar: tqdm.tqdm
  pool: concurrent.futures.ProcessPoolExecutor = None
  queue: object = None


