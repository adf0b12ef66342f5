"""The Beam pipeline on the DirectRunner: the local whole-corpus records, byte for byte."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from data_pipelines import beam_pipeline, build_vocab, stdlib_corpus
from data_pipelines import create_pretraining_data as cpd
from bert_jax_core.tf_setup import tf
from tests.testlib import not_text
from tests.testlib import tfds_testlib

ROOT = tests.ROOT
# Fields of dataset_info.json that describe the run rather than the records.
_RUN_FIELDS = ("command", "created")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """3 text files of stdlib docstrings (~50 KB) and a WordPiece vocab built on them."""
  root = tmp_path_factory.mktemp("corpus")
  stdlib_corpus.write_corpus(str(root / "text"), num_files=3, max_modules=30)
  vocab = str(root / "vocab.txt")
  build_vocab.build(str(root / "text" / "*.txt"), 1200, vocab, lower_case=True)
  return dict(glob=str(root / "text" / "*.txt"), vocab=vocab)


def _config(corpus, output_dir, **kwargs):
  kw = dict(input_file=corpus["glob"], output_dir=str(output_dir), vocab_file=corpus["vocab"],
            max_seq_length=48, dupe_factor=2, num_shards=3, document_pool_size=40)
  kw.update(kwargs)
  return cpd.Config(**kw)


def _files(output_dir):
  """{file: bytes} with dataset_info.json parsed, without the run's own fields."""
  out = {}
  for name in sorted(os.listdir(output_dir)):
    data = open(os.path.join(output_dir, name), "rb").read()
    if name == cpd.INFO_FILE:
      data = {k: v for k, v in json.loads(data).items() if k not in _RUN_FIELDS}
    out[name] = data
  return out


def _records(output_dir):
  return [raw for name in sorted(os.listdir(output_dir)) if name.endswith(".tfrecord")
          for raw in tf.data.TFRecordDataset(os.path.join(output_dir, name)).as_numpy_iterator()]


@pytest.fixture(scope="module")
def local_corpus_run(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("local")
  summary = cpd.run(_config(corpus, out, nsp_sampling="corpus"), show_progress=False)
  return out, summary


def test_beam_writes_the_local_whole_corpus_records_byte_for_byte(corpus, local_corpus_run,
                                                                  tmp_path):
  local_out, local_summary = local_corpus_run
  summary = beam_pipeline.run(_config(corpus, tmp_path), ["--runner=DirectRunner"])
  assert _files(tmp_path) == _files(local_out)
  for key in ("documents", "sentences", "instances", "tokens", "not_next_fraction"):
    assert summary[key] == local_summary[key], key
  info = _files(tmp_path)[cpd.INFO_FILE]
  assert info["nsp_sampling"] == "corpus" and info["num_instances"] == summary["instances"]
  # Hash sharding: every shard is used, sizes within a few sqrt(N / S) of the mean.
  counts = [s["num_instances"] for s in info["shards"]]
  assert min(counts) > 0 and np.ptp(counts) < 4 * np.sqrt(sum(counts) / 3) + 3
  # Same multiset as the local path (implied by equal bytes; said explicitly since the docs
  # promise the multiset), and a different seed changes it.
  assert sorted(_records(tmp_path)) == sorted(_records(local_out))
  beam_pipeline.run(_config(corpus, tmp_path / "seed", random_seed=1), ["--runner=DirectRunner"])
  assert sorted(_records(tmp_path / "seed")) != sorted(_records(local_out))


def test_beam_no_nsp_and_filters_match_the_local_path(corpus, tmp_path):
  path = tmp_path / "dupes.txt"
  text = open(sorted(glob.glob(corpus["glob"]))[0]).read()
  path.write_text(text + "\n" + text)  # every document twice
  kw = dict(input_file=f"{corpus['glob']},{path}", no_nsp=True, dedup_documents=True,
            min_document_tokens=8)
  local = cpd.run(_config(corpus, tmp_path / "local", nsp_sampling="corpus", **kw),
                  show_progress=False)
  beam_pipeline.run(_config(corpus, tmp_path / "beam", **kw), ["--runner=DirectRunner"])
  assert _files(tmp_path / "beam") == _files(tmp_path / "local")
  info = _files(tmp_path / "local")[cpd.INFO_FILE]
  # dupes.txt repeats the first file twice: all of its documents are duplicates.
  assert info["filtered_duplicate_documents"] > 0 and info["filtered_short_documents"] > 0
  assert local["not_next_fraction"] == 0


def test_beam_refuses_block_sampling(corpus, tmp_path):
  with pytest.raises(beam_pipeline.BeamPipelineError, match="--nsp_sampling=block"):
    beam_pipeline.run(_config(corpus, tmp_path, nsp_sampling="block"))
  assert not os.path.exists(tmp_path / "part-00000-of-00003.tfrecord")


def test_beam_refuses_a_file_that_is_not_text_before_the_pipeline(corpus, tmp_path):
  # Issue 49: the rule create_pretraining_data applies (its prepare), before a worker starts;
  # an output dir that holds shards is not touched, --overwrite or not.
  out = tmp_path / "out"
  out.mkdir()
  (out / "part-00000-of-00001.tfrecord").write_bytes(b"old shard")
  (out / cpd.INFO_FILE).write_text("{}")
  for kind in ("png", "gzip"):
    bad = not_text.write(tmp_path, kind, f"{kind}.txt")
    pattern = f"{corpus['glob']},{bad}"
    with pytest.raises(cpd.PretrainingDataError) as e:
      beam_pipeline.run(_config(corpus, out, input_file=pattern, num_shards=1, overwrite=True))
    assert str(e.value).startswith(f"--input_file={pattern}: {bad} is not UTF-8 text: it is ")
  assert sorted(os.listdir(out)) == [cpd.INFO_FILE, "part-00000-of-00001.tfrecord"]
  assert (out / "part-00000-of-00001.tfrecord").read_bytes() == b"old shard"


@pytest.mark.slow
def test_multi_process_direct_runner_cli(corpus, local_corpus_run, tmp_path):
  """The CLI on 2 worker processes writes the local records (~1-2 min on a loaded 2-core box)."""
  local_out, _ = local_corpus_run
  result = subprocess.run(
      [sys.executable, "-m", "data_pipelines.beam_pipeline", f"--input_file={corpus['glob']}",
       f"--output_dir={tmp_path}", f"--vocab_file={corpus['vocab']}", "--max_seq_length=48",
       "--dupe_factor=2", "--num_shards=3", "--document_pool_size=40", "--",
       "--runner=DirectRunner", "--direct_running_mode=multi_processing",
       "--direct_num_workers=2"],
      capture_output=True, text=True, cwd=ROOT, timeout=600,
      env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"))
  assert result.returncode == 0, result.stderr[-3000:]
  assert result.stdout.startswith("wrote ") and "NSP sampling: corpus" in result.stdout
  assert _files(tmp_path) == _files(local_out)
  info = json.load(open(tmp_path / cpd.INFO_FILE))
  assert info["command"].startswith("python") and "data_pipelines.beam_pipeline" in info["command"]


def test_beam_jsonl_and_tfds_inputs_match_the_local_path(corpus, tmp_path):
  texts = [d.replace("\n", " ") for p in sorted(glob.glob(corpus["glob"]))
           for d in open(p).read().split("\n\n")[:15]] + ["  "]  # blank-only: dropped
  jsonl = tmp_path / "docs.jsonl"
  jsonl.write_text("\n".join(json.dumps({"body": t}) for t in texts) + "\n")
  tfds_testlib.build_text_dataset("beam_docs", texts, tmp_path / "tfds")
  inputs = {"jsonl": dict(input_file=str(jsonl), input_format="jsonl", jsonl_text_key="body"),
            "tfds": dict(input_file="", input_format="tfds", tfds_name="beam_docs",
                         tfds_data_dir=str(tmp_path / "tfds"), tfds_num_parts=2)}
  for name, kw in inputs.items():
    local = cpd.run(_config(corpus, tmp_path / f"{name}-local", nsp_sampling="corpus", **kw),
                    show_progress=False)
    beam_pipeline.run(_config(corpus, tmp_path / f"{name}-beam", **kw), ["--runner=DirectRunner"])
    assert _files(tmp_path / f"{name}-beam") == _files(tmp_path / f"{name}-local"), name
    assert local["documents"] == len(texts) - 1 and local["dropped"] == 1, name


def test_beam_sop_records_match_the_local_path(corpus, tmp_path):
  local = cpd.run(_config(corpus, tmp_path / "local", nsp_sampling="corpus", sop=True),
                  show_progress=False)
  summary = beam_pipeline.run(_config(corpus, tmp_path / "beam", sop=True),
                              ["--runner=DirectRunner"])
  assert _files(tmp_path / "beam") == _files(tmp_path / "local")
  assert _files(tmp_path / "local")[cpd.INFO_FILE]["sentence_objective"] == "sop"
  assert summary["not_next_fraction"] == local["not_next_fraction"]
  assert 0.35 < local["not_next_fraction"] < 0.65
