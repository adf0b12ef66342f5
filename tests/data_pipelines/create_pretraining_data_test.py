"""create_pretraining_data end to end on stdlib docstrings: records, determinism, inputs, errors."""

import glob
import json
import os
import shutil

from absl import flags
import numpy as np
import pytest

from bert_jax_core import errors
from data_pipelines import build_vocab, stdlib_corpus
from data_pipelines.records import block_sampling
from data_pipelines import create_pretraining_data as cpd
from data_pipelines.tokenizers import vocab as vocab_lib
from bert_jax_core.tf_setup import tf
from tests.testlib import not_text
from tests.testlib import tfds_testlib

SEQ = 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """3 text files of stdlib docstrings (~75 KB, ~120 documents a file) and a 1,500-token
  WordPiece vocab built on them. 30 modules, not 80: a run's CPU time is mostly fixed (tracing
  the tokenizer, ~2 s; a worker process's TF import, ~10 s), and every claim here holds on
  ~6 blocks a file (document_pool_size=20) as it did on ~6 blocks of 50."""
  root = tmp_path_factory.mktemp("corpus")
  stdlib_corpus.write_corpus(str(root / "text"), num_files=3, max_modules=30)
  vocab = str(root / "vocab.txt")
  build_vocab.build(str(root / "text" / "*.txt"), 1500, vocab, lower_case=True)
  return dict(glob=str(root / "text" / "*.txt"), vocab=vocab, root=root)


def _config(corpus, output_dir, **kwargs):
  kw = dict(input_file=corpus["glob"], output_dir=str(output_dir), vocab_file=corpus["vocab"],
            max_seq_length=SEQ, dupe_factor=2, num_shards=3, num_workers=1,
            document_pool_size=20, nsp_sampling="block")  # ~120 documents a file: ~6 blocks
  kw.update(kwargs)
  return cpd.Config(**kw)


def _run(corpus, output_dir, **kwargs):
  return cpd.run(_config(corpus, output_dir, **kwargs), show_progress=False)


def _read(output_dir):
  """dataset_info.json and {shard file: [feature dict of numpy arrays]}."""
  with open(os.path.join(output_dir, "dataset_info.json")) as f:
    info = json.load(f)
  shards = {}
  for name in sorted(os.listdir(output_dir)):
    if name.endswith(".json"):
      continue
    assert name.endswith(".tfrecord"), name  # no temp file or folder left behind
    examples = []
    for raw in tf.data.TFRecordDataset(os.path.join(output_dir, name)).as_numpy_iterator():
      feats = tf.train.Example.FromString(raw).features.feature
      examples.append({k: np.array(v.int64_list.value) for k, v in feats.items()})
    shards[name] = examples
  return info, shards


def _bytes(output_dir):
  """Every file's bytes; dataset_info.json without the fields of the run (command, time)."""
  out = {n: open(os.path.join(output_dir, n), "rb").read() for n in sorted(os.listdir(output_dir))}
  info = json.loads(out.pop("dataset_info.json"))
  out["dataset_info.json"] = {k: v for k, v in info.items() if k not in ("command", "created")}
  return out


@pytest.fixture(scope="module")
def nsp_run(corpus, tmp_path_factory):
  out = tmp_path_factory.mktemp("nsp")
  return out, _run(corpus, out)


def test_records_round_trip_with_nsp_layout(corpus, nsp_run):
  out, summary = nsp_run
  info, shards = _read(out)
  vocab = vocab_lib.wordpiece_info(corpus["vocab"])
  assert [s["file"] for s in info["shards"]] == list(shards) == [
      f"part-0000{i}-of-00003.tfrecord" for i in range(3)]
  assert [s["num_instances"] for s in info["shards"]] == [len(v) for v in shards.values()]
  assert info["num_instances"] == summary["instances"] == sum(map(len, shards.values()))
  assert max(map(len, shards.values())) - min(map(len, shards.values())) <= 1
  assert info["max_seq_length"] == SEQ and info["nsp"] and info["do_lower_case"]
  assert info["vocab_size"] == vocab.size and len(info["vocab_sha256"]) == 64
  labels, lengths = [], []
  for ex in (e for v in shards.values() for e in v):
    assert set(ex) == {"input_ids", "input_mask", "segment_ids", "next_sentence_labels"}
    ids, mask, seg = ex["input_ids"], ex["input_mask"], ex["segment_ids"]
    assert ids.shape == mask.shape == seg.shape == (SEQ,) and ex["next_sentence_labels"].shape == (1,)
    n = int(mask.sum())
    lengths.append(n)
    assert (mask[:n] == 1).all() and (mask[n:] == 0).all()
    assert (ids[n:] == 0).all() and (seg[n:] == 0).all()  # padding is 0 everywhere
    seps = np.flatnonzero(ids[:n] == vocab.sep_id)
    assert ids[0] == vocab.cls_id and len(seps) == 2 and seps[1] == n - 1
    assert (seg[:seps[0] + 1] == 0).all() and (seg[seps[0] + 1:n] == 1).all()
    assert ((ids[:n] >= 0) & (ids[:n] < vocab.size)).all()
    labels.append(int(ex["next_sentence_labels"][0]))
  assert set(labels) == {0, 1}
  # Docstrings are short (2-3 sentences a document): one-sentence chunks always take a random
  # next, so NotNext is well above 50% on this corpus (the original behaves the same).
  assert summary["not_next_fraction"] == pytest.approx(np.mean(labels))
  assert summary["tokens"] == sum(lengths)
  assert summary["padding_fraction"] == pytest.approx(1 - sum(lengths) / (len(lengths) * SEQ))
  assert summary["dropped"] == 0 and summary["replaced"] == 0
  assert summary["documents"] > 3 * 4 * 20  # more than 4 blocks a file


def test_records_feed_the_pretraining_input_pipeline(corpus, nsp_run):
  from data_pipelines.input import pretrain_input
  out, summary = nsp_run
  files = pretrain_input.expand_file_pattern(str(out / "*"))  # dataset_info.json is skipped
  assert pretrain_input.count_records(files) == summary["instances"]
  ds = pretrain_input.make_pretrain_dataset(
      files, batch_size=4, seq_length=SEQ, max_predictions_per_seq=10,
      vocab=vocab_lib.wordpiece_info(corpus["vocab"]), shuffle=False, repeat=False)
  batch = next(pretrain_input.as_numpy_batches(ds))
  assert batch["input_ids"].shape == (4, SEQ) and batch["masked_lm_ids"].shape == (4, 10)
  assert batch["next_sentence_labels"].shape == (4,)


def test_same_seed_is_byte_identical_across_worker_counts(corpus, nsp_run, tmp_path):
  out1, summary1 = nsp_run
  summary2 = _run(corpus, tmp_path / "w2", num_workers=2)
  assert _bytes(out1) == _bytes(tmp_path / "w2")
  assert summary2["instances"] == summary1["instances"]
  _run(corpus, tmp_path / "seed", random_seed=7)
  other = _bytes(tmp_path / "seed")
  assert other.keys() == _bytes(out1).keys()
  assert all(other[k] != v for k, v in _bytes(out1).items())
  # Whole-corpus sampling: the same for 1 and 2 workers too, and not the blocks' output.
  _run(corpus, tmp_path / "c1", nsp_sampling="corpus")
  _run(corpus, tmp_path / "c2", nsp_sampling="corpus", num_workers=2)
  assert _bytes(tmp_path / "c1") == _bytes(tmp_path / "c2")
  assert _bytes(tmp_path / "c1")["part-00000-of-00003.tfrecord"] != _bytes(out1)[
      "part-00000-of-00003.tfrecord"]


def test_no_nsp_full_sentence_packing(corpus, nsp_run, tmp_path):
  summary = _run(corpus, tmp_path, no_nsp=True)
  info, shards = _read(tmp_path)
  vocab = vocab_lib.wordpiece_info(corpus["vocab"])
  assert not info["nsp"] and summary["not_next_fraction"] == 0
  for ex in (e for v in shards.values() for e in v):
    n = int(ex["input_mask"].sum())
    assert ex["input_ids"][0] == vocab.cls_id and ex["input_ids"][n - 1] == vocab.sep_id
    assert (ex["segment_ids"] == 0).all() and ex["next_sentence_labels"][0] == 0
  # Packing across documents pads less than NSP pairs of short docstrings (0.19 vs 0.29 here;
  # what remains is about half a sentence per sequence).
  assert summary["padding_fraction"] < nsp_run[1]["padding_fraction"] - 0.05


def test_jsonl_input_counts_empty_documents(corpus, tmp_path):
  docs = [" ".join(open(p).read().split("\n\n")[i] for i in range(3)).replace("\n", " ")
          for p in sorted(glob.glob(corpus["glob"]))]
  rows = [{"text": d, "id": i} for i, d in enumerate(docs)] + [{"text": ""}, {"text": " \n\t "}]
  path = tmp_path / "docs.jsonl"
  path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
  summary = _run(corpus, tmp_path / "out", input_file=str(path), input_format="jsonl")
  assert summary["documents"] == 3 and summary["dropped"] == 2 and summary["instances"] > 3
  assert summary["sentences"] >= 9  # each row holds three docstrings' sentences, split again
  _read(tmp_path / "out")

  path.write_text(json.dumps({"body": "x"}) + "\n")
  with pytest.raises(cpd.PretrainingDataError, match=r"docs.jsonl:1: no string field 'text'"):
    _run(corpus, tmp_path / "bad", input_file=str(path), input_format="jsonl")
  assert not os.path.exists(tmp_path / "bad")


def test_tfds_input_from_a_locally_built_dataset(corpus, tmp_path):
  texts = []
  for p in sorted(glob.glob(corpus["glob"])):
    texts.extend(d.replace("\n", " ") for d in open(p).read().split("\n\n")[:20])
  texts.append("  ")  # blank-only: dropped
  tfds_testlib.build_text_dataset("tiny_docs", texts, tmp_path / "tfds")
  kw = dict(input_file="", input_format="tfds", tfds_name="tiny_docs",
            tfds_data_dir=str(tmp_path / "tfds"), tfds_num_parts=2)
  summary = _run(corpus, tmp_path / "out", nsp_sampling="auto", **kw)  # size from TFDS's info
  assert summary["nsp_sampling"] == "corpus"
  assert summary["sources"] == 2 and summary["dropped"] == 1
  assert summary["documents"] == len([t for t in texts if t.strip()])
  info, _ = _read(tmp_path / "out")
  assert info["sources"][0] == "tfds:tiny_docs/train part 0 of 2"
  with pytest.raises(cpd.PretrainingDataError, match=r"--tfds_split=test: tiny_docs has splits"):
    _run(corpus, tmp_path / "bad", **dict(kw, tfds_split="test"))
  with pytest.raises(cpd.PretrainingDataError, match=r"--tfds_name=nope: not found.*never down"):
    _run(corpus, tmp_path / "bad", **dict(kw, tfds_name="nope"))
  assert not os.path.exists(tmp_path / "bad")


def test_sentencepiece_vocab(corpus, tmp_path):
  spm = str(tmp_path / "spm.model")
  build_vocab.build(corpus["glob"], 800, spm, model_type="unigram")
  summary = _run(corpus, tmp_path / "out", vocab_file="", spm_model_file=spm, dupe_factor=1)
  info, shards = _read(tmp_path / "out")
  vocab = vocab_lib.sentencepiece_info(spm)
  assert info["vocab_kind"] == "sentencepiece" and info["vocab_file"] == spm
  ex = next(iter(shards.values()))[0]
  n = int(ex["input_mask"].sum())
  assert ex["input_ids"][0] == vocab.cls_id and ex["input_ids"][n - 1] == vocab.sep_id
  assert summary["instances"] == info["num_instances"] > 0


def test_blank_documents_and_invalid_utf8_are_counted(corpus, tmp_path):
  path = tmp_path / "mixed.txt"
  path.write_bytes(b"The first document has words.\nIt has two sentences.\n\n"
                   b"\xe2\x80\x8b\n\x07 \xe2\x80\x8b\n\n\n\n"  # zero-width space, BEL: no token
                   b"Bad \xff\xfe bytes in the third document.\nAnd more text.\n")
  summary = _run(corpus, tmp_path / "out", input_file=str(path), num_shards=1)
  assert summary["documents"] == 2 and summary["dropped"] == 1 and summary["replaced"] == 2
  info, _ = _read(tmp_path / "out")
  assert info["dropped_documents"] == 1 and info["replaced_characters"] == 2


def _error(corpus, tmp_path, **kwargs):
  out = tmp_path / "out"
  with pytest.raises(errors.UserError) as e:
    _run(corpus, out, **kwargs)
  assert not os.path.exists(out)  # nothing written on any error
  msg = str(e.value)
  assert "\n" not in msg
  return msg


def test_bad_inputs_are_one_line_errors_before_any_output(corpus, tmp_path):
  missing = str(tmp_path / "missing.txt")
  assert "no such file" in _error(corpus, tmp_path, input_file=missing)
  assert "no file matches" in _error(corpus, tmp_path, input_file=f"{corpus['glob']},/nope/*.txt")
  assert "is a directory" in _error(corpus, tmp_path, input_file=str(tmp_path))
  assert "--max_seq_length=4" in _error(corpus, tmp_path, max_seq_length=4)
  assert "--num_workers=0" in _error(corpus, tmp_path, num_workers=0)
  # A vocab without [MASK].
  tokens = [t for t in vocab_lib.load_wordpiece_vocab(corpus["vocab"]) if t != "[MASK]"]
  bad_vocab = tmp_path / "vocab.txt"
  bad_vocab.write_text("\n".join(tokens) + "\n")
  assert "missing special token(s) [MASK]" in _error(corpus, tmp_path, vocab_file=str(bad_vocab))
  empty = tmp_path / "empty.txt"
  empty.write_text("\n \n\t\n")
  assert "no instance made from 0 document(s)" in _error(corpus, tmp_path, input_file=str(empty))


def test_a_file_that_is_not_text_is_refused_and_nothing_is_replaced(corpus, nsp_run, tmp_path):
  # Seen on main (issue 49): a PNG named .txt and a .gz in the glob were written into records,
  # exit 0 (48,241 bytes replaced); a UTF-16 file's documents ran together ("\n\0" is no blank
  # line); Korean in CP949 became U+FFFD. Now one line naming the file, before the output dir
  # is looked at.
  out = tmp_path / "kept"
  shutil.copytree(nsp_run[0], out)
  before = _bytes(out)
  for kind, found in [("png", "a PNG image"), ("gzip", "gzip-compressed"),
                      ("utf16", "UTF-16LE"), ("utf16_no_bom", "a NUL byte at byte 1"),
                      ("cp949", "characters are invalid UTF-8")]:
    folder = tmp_path / kind
    folder.mkdir()
    bad = not_text.write(folder, kind, "corpus.txt" if kind != "gzip" else "corpus.txt.gz")
    pattern = f"{corpus['glob']},{folder}/*"
    for overwrite in (False, True):
      with pytest.raises(cpd.PretrainingDataError) as e:
        _run(corpus, out, input_file=pattern, overwrite=overwrite)
      msg = str(e.value)
      assert msg.startswith(f"--input_file={pattern}: {bad} is not UTF-8 text: ") and found in msg
      assert "\n" not in msg
      assert _bytes(out) == before   # --overwrite too: the old shards are still there
    assert "is not UTF-8 text" in _error(corpus, tmp_path, input_file=bad)   # and no new dir


def test_failure_midway_leaves_no_complete_looking_output(corpus, tmp_path):
  good = tmp_path / "a.jsonl"
  good.write_text(json.dumps({"text": "A sentence here. And another one."}) + "\n")
  bad = tmp_path / "b.jsonl"
  bad.write_text(json.dumps({"text": "Fine."}) + "\n{not json\n")
  out = tmp_path / "out"
  with pytest.raises(cpd.PretrainingDataError, match=r"b.jsonl:2: not JSON"):  # from a worker
    _run(corpus, out, input_file=str(tmp_path / "*.jsonl"), input_format="jsonl", num_workers=2)
  assert not os.path.exists(out)
  # An existing output dir is refused without --overwrite, and replaced with it.
  _run(corpus, out, input_file=str(good), input_format="jsonl", num_shards=1)
  with pytest.raises(cpd.PretrainingDataError, match="--overwrite"):
    _run(corpus, out, input_file=str(good), input_format="jsonl")
  _run(corpus, out, input_file=str(good), input_format="jsonl", num_shards=2, overwrite=True)
  info, shards = _read(out)
  assert len(shards) == len(info["shards"]) == 2  # the old single shard is gone


def test_plan_shards_is_contiguous_and_balanced():
  counts = [5, 0, 7, 1]
  plan = block_sampling.plan_shards(counts, 4)
  flat = [(i, k) for ranges in plan for i, a, b in ranges for k in range(a, b)]
  assert flat == [(i, k) for i, n in enumerate(counts) for k in range(n)]
  assert [sum(b - a for _, a, b in r) for r in plan] == [3, 3, 3, 4]


def test_cli_prints_summary_and_one_line_errors(corpus, tmp_path, monkeypatch, capsys):
  # In-process: main() on flags parsed from the command line's own strings, inside the
  # errors.run_main wrapper. The program as a real process (`python -m`, exit code 2, one
  # stderr line) is cli_errors_test's; --help as a process is cli_test's.
  out = tmp_path / "out"
  flag_values = flags.FlagValues()  # not the global FLAGS: other modules may define these names
  cpd.define_flags(flag_values)
  flag_values(["cpd", f"--input_file={corpus['glob']}", f"--output_dir={out}",
               f"--vocab_file={corpus['vocab']}", "--max_seq_length=32", "--dupe_factor=1",
               "--num_shards=2", "--random_seed=0"])
  monkeypatch.setattr(cpd, "FLAGS", flag_values)
  errors.run_main(cpd.main, [])  # a user error would raise SystemExit(2)
  stdout = capsys.readouterr().out
  assert stdout.startswith("wrote ") and "padding fraction" in stdout
  info, _ = _read(out)
  assert info["max_seq_length"] == 32 and info["random_seed"] == 0

  flag_values = flags.FlagValues()  # not the global FLAGS: other modules may define these names
  cpd.define_flags(flag_values)
  flag_values(["cpd", f"--input_file={tmp_path}/none-*.txt", f"--output_dir={tmp_path}/o",
               f"--vocab_file={corpus['vocab']}"])
  monkeypatch.setattr(cpd, "FLAGS", flag_values)
  with pytest.raises(SystemExit) as e:
    errors.run_main(cpd.main, [])  # what errors.run does around main
  assert e.value.code == errors.EXIT_USER_ERROR
  err = capsys.readouterr().err
  assert err.startswith("error: --input_file=") and err.count("\n") == 1


def _crossing_fraction(out, vocab, topics):
  """Fraction of NotNext instances whose A and B come from different files."""
  _, shards = _read(out)
  sep = vocab_lib.wordpiece_info(vocab).sep_id
  crossing = not_next = 0
  for ex in (e for v in shards.values() for e in v):
    if ex["next_sentence_labels"][0] != 1:
      continue
    n = int(ex["input_mask"].sum())
    first_sep = int(np.flatnonzero(ex["input_ids"][:n] == sep)[0])
    a = set(ex["input_ids"][1:first_sep].tolist())
    b = set(ex["input_ids"][first_sep + 1:n - 1].tolist())
    side = lambda ids: [bool(ids & t) for t in topics]
    crossing += side(a) != side(b)
    not_next += 1
  return crossing / not_next


def test_whole_corpus_sampling_draws_random_next_from_other_files(corpus, tmp_path):
  tokens = vocab_lib.load_wordpiece_vocab(corpus["vocab"])
  words = [w for w in tokens if w.isalpha() and len(w) > 2][:40]
  topics = [set(tokens.index(w) for w in words[:20]), set(tokens.index(w) for w in words[20:])]
  for f, topic in enumerate((words[:20], words[20:])):
    docs = ["\n".join(" ".join(topic[(d + s + k) % 20] for k in range(6)) for s in range(4))
            for d in range(30)]
    (tmp_path / f"topic{f}.txt").write_text("\n\n".join(docs) + "\n")
  kw = dict(input_file=str(tmp_path / "topic*.txt"), num_shards=1, dupe_factor=3)
  block = _run(corpus, tmp_path / "block", nsp_sampling="block", **kw)
  whole = _run(corpus, tmp_path / "corpus", nsp_sampling="auto", **kw)  # 6 KB fit in memory
  assert block["nsp_sampling"] == "block" and whole["nsp_sampling"] == "corpus"
  assert _read(tmp_path / "corpus")[0]["nsp_sampling"] == "corpus"
  # Blocks: a file's own documents only. Whole corpus: half the other documents are elsewhere.
  assert _crossing_fraction(tmp_path / "block", corpus["vocab"], topics) == 0
  assert 0.35 < _crossing_fraction(tmp_path / "corpus", corpus["vocab"], topics) < 0.65


def test_auto_sampling_uses_the_corpus_only_when_it_fits(corpus):
  cfg = _config(corpus, "/unused", nsp_sampling="auto")
  sources = cpd.text_sources.resolve_sources(cfg)
  size = sum(s.size for s in sources)
  need = cpd.CORPUS_RAM_PER_INPUT_BYTE * size
  assert cpd.choose_nsp_sampling(cfg, sources, ram_bytes=2 * need) == "corpus"
  assert cpd.choose_nsp_sampling(cfg, sources, ram_bytes=2 * need - 1) == "block"
  dedup = _config(corpus, "/unused", nsp_sampling="auto", dedup_documents=True)
  with pytest.raises(cpd.PretrainingDataError, match="--dedup_documents needs the whole corpus"):
    cpd.choose_nsp_sampling(dedup, sources, ram_bytes=need)


def test_filters_are_off_by_default_and_counted(corpus, tmp_path):
  docs = ["First document here.\nIt has two sentences.", "Ok.",  # 3 tokens at most
          "First document here.\nIt has two sentences.",  # exact duplicate of the first
          "Это русский текст.\nВторое предложение.", "Another English document.\nWith more."]
  path = tmp_path / "docs.txt"
  path.write_text("\n\n".join(docs) + "\n")
  kw = dict(input_file=str(path), num_shards=1, nsp_sampling="corpus")
  plain = _run(corpus, tmp_path / "plain", **kw)
  assert plain["documents"] == 5 and plain["filtered_duplicate"] == 0
  filtered = _run(corpus, tmp_path / "filtered", dedup_documents=True, min_document_tokens=5,
                  keep_scripts="Latin", **kw)
  info, _ = _read(tmp_path / "filtered")
  assert (info["filtered_duplicate_documents"], info["filtered_short_documents"],
          info["filtered_script_documents"], info["documents"]) == (1, 1, 1, 2)
  assert info["filters"] == dict(dedup_documents=True, min_document_tokens=5,
                                 keep_scripts="Latin", min_script_fraction=0.5)
  assert filtered["documents"] == 2 and filtered["sentences"] == 4
  assert "unknown script 'Klingon'" in _error(corpus, tmp_path, keep_scripts="Latin,Klingon")


def test_sop_records_name_their_objective(corpus, tmp_path):
  summary = _run(corpus, tmp_path, sop=True)
  info, shards = _read(tmp_path)
  assert info["sentence_objective"] == "sop" and not info["nsp"]
  vocab = vocab_lib.wordpiece_info(corpus["vocab"])
  labels = []
  for ex in (e for v in shards.values() for e in v):
    n = int(ex["input_mask"].sum())
    seps = np.flatnonzero(ex["input_ids"][:n] == vocab.sep_id)
    assert ex["input_ids"][0] == vocab.cls_id and len(seps) == 2 and seps[1] == n - 1
    labels.append(int(ex["next_sentence_labels"][0]))
  # Swapped half the time (no random-next documents: short documents do not push it up).
  assert summary["not_next_fraction"] == pytest.approx(np.mean(labels))
  assert abs(np.mean(labels) - 0.5) < 4 * np.sqrt(0.25 / len(labels))
  assert "SOP swapped fraction" in cpd.format_summary(summary, str(tmp_path))
  with pytest.raises(cpd.PretrainingDataError, match="--sop and --no_nsp: pick one"):
    _run(corpus, tmp_path / "both", sop=True, no_nsp=True)
  # Block and whole-corpus sampling and the worker count: same kind of records, the corpus
  # mode independent of the worker count.
  _run(corpus, tmp_path / "c1", sop=True, nsp_sampling="corpus")
  _run(corpus, tmp_path / "c2", sop=True, nsp_sampling="corpus", num_workers=2)
  assert _bytes(tmp_path / "c1") == _bytes(tmp_path / "c2")
  assert _read(tmp_path / "c1")[0]["sentence_objective"] == "sop"
