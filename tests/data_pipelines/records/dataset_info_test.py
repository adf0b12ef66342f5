"""The records' contract (dataset_info.json): written with every field, each mismatch one error."""

import json
import os
import random

import pytest

from data_pipelines.records import dataset_info
from bert_jax_core.tf_setup import tf

SEQ = 128
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(195)]


def _write_vocab(path, words):
  path.write_text("\n".join(words) + "\n")
  return str(path)


def _write_records(directory, shards=(3, 2), seq=SEQ):
  directory.mkdir(parents=True, exist_ok=True)
  names = []
  for s, n in enumerate(shards):
    name = f"part-{s:05d}-of-{len(shards):05d}.tfrecord"
    with tf.io.TFRecordWriter(str(directory / name)) as w:
      for _ in range(n):
        feats = {k: tf.train.Feature(int64_list=tf.train.Int64List(value=[5] * seq))
                 for k in ("input_ids", "input_mask", "segment_ids")}
        feats["next_sentence_labels"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[0]))
        w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
    names.append(name)
  return names


@pytest.fixture
def data(tmp_path):
  vocab = _write_vocab(tmp_path / "vocab.txt", WORDS)
  names = _write_records(tmp_path / "records")
  info = dict(shards=[dict(file=n, num_instances=c) for n, c in zip(names, (3, 2))],
              max_seq_length=SEQ, nsp=True, vocab_file=vocab, vocab_size=len(WORDS),
              vocab_sha256=dataset_info.sha256_file(vocab), do_lower_case=True)
  dataset_info.write(str(tmp_path / "records"), info, command="create_pretraining_data --x")
  files = [str(tmp_path / "records" / n) for n in names]
  return dict(vocab=vocab, files=files, dir=tmp_path / "records", tmp=tmp_path)


def _check(files, vocab, **overrides):
  kw = dict(field="config.train_input_files", vocab_path=vocab, vocab_size=len(WORDS),
            vocab_sha256=dataset_info.sha256_file(vocab), do_lower_case=True, seq_length=SEQ,
            max_predictions_per_seq=20)
  kw.update(overrides)
  return dataset_info.check_records(files, **kw)


def test_written_fields_and_counts_from_the_contract(data):
  info = json.loads((data["dir"] / dataset_info.INFO_FILE).read_text())
  assert info["masking"] == "dynamic" and info["max_predictions_per_seq"] is None
  assert info["command"] == "create_pretraining_data --x" and info["contract_version"] == 1
  counts, without = _check(data["files"], data["vocab"])
  assert without == [] and list(counts.values()) == [3, 2]

  def must_not_count(files):
    raise AssertionError(f"counted {files} although dataset_info.json has the counts")
  assert dataset_info.record_counts(data["files"], must_not_count, counts) == [3, 2]


def test_shuffled_vocab_of_the_same_size_is_refused(data):
  shuffled = WORDS[:5] + random.Random(0).sample(WORDS[5:], len(WORDS) - 5)
  other = _write_vocab(data["tmp"] / "shuffled.txt", shuffled)
  with pytest.raises(dataset_info.DataContractError) as e:
    _check(data["files"], other)
  msg = str(e.value)
  assert "vocab" in msg and data["vocab"] in msg and other in msg and "\n" not in msg


def test_too_small_vocab_is_refused_naming_both_sizes(data):
  small = _write_vocab(data["tmp"] / "small.txt", WORDS[:100])
  with pytest.raises(dataset_info.DataContractError, match=r"200 tokens.*100 tokens"):
    _check(data["files"], small, vocab_size=100)


def test_casing_mismatch(data):
  with pytest.raises(dataset_info.DataContractError,
                     match=r"do_lower_case = True .*config.do_lower_case=False; set "
                           r"--config.do_lower_case=True"):
    _check(data["files"], data["vocab"], do_lower_case=False)


def test_seq_length_64_against_records_of_128(data):
  with pytest.raises(dataset_info.DataContractError,
                     match="max_seq_length = 128 .*config.seq_length=64; set --config.seq_length=128"):
    _check(data["files"], data["vocab"], seq_length=64)


def test_premasked_records_fix_max_predictions(data):
  info = json.loads((data["dir"] / dataset_info.INFO_FILE).read_text())
  info["max_predictions_per_seq"] = 20
  del info["masking"]
  dataset_info.write(str(data["dir"]), info)
  assert json.loads((data["dir"] / dataset_info.INFO_FILE).read_text())["masking"] == "in_records"
  _check(data["files"], data["vocab"], max_predictions_per_seq=20)
  with pytest.raises(dataset_info.DataContractError, match="max_predictions_per_seq=80"):
    _check(data["files"], data["vocab"], max_predictions_per_seq=80)


def test_a_file_the_contract_does_not_list_is_refused(data):
  stray = _write_records(data["tmp"] / "stray", shards=(1,))[0]
  os.rename(data["tmp"] / "stray" / stray, data["dir"] / "part-extra.tfrecord")
  with pytest.raises(dataset_info.DataContractError, match="part-extra.tfrecord is not listed"):
    _check(data["files"] + [str(data["dir"] / "part-extra.tfrecord")], data["vocab"])


def test_records_without_a_contract_are_counted_with_a_note(data, tmp_path):
  names = _write_records(tmp_path / "google", shards=(4,))
  files = [str(tmp_path / "google" / n) for n in names]
  counts, without = _check(files, data["vocab"])
  assert counts == {} and without == [str(tmp_path / "google")]
  notes = []
  from data_pipelines.input import pretrain_input
  assert dataset_info.record_counts(files, pretrain_input.count_records, counts,
                                    log=notes.append) == [4]
  assert len(notes) == 1 and "counted 4 records in 1 file(s) by reading them" in notes[0]


def test_truncated_shard_is_named_before_reading_it(data):
  with open(data["files"][1], "r+b") as f:
    f.truncate(os.path.getsize(data["files"][1]) - 10)
  with pytest.raises(dataset_info.DataContractError,
                     match=os.path.basename(data["files"][1]) + r": \d+ bytes, but .* says"):
    _check(data["files"], data["vocab"])


def test_corrupt_contract_is_one_error(data):
  (data["dir"] / dataset_info.INFO_FILE).write_text("{not json")
  with pytest.raises(dataset_info.DataContractError, match="not valid JSON"):
    _check(data["files"], data["vocab"])


def test_pipeline_counts_come_from_the_contract(data, monkeypatch):
  from data_pipelines.input import pretrain_input
  assert dataset_info.known_count(data["files"]) == 5
  monkeypatch.setattr(pretrain_input.tf.data, "TFRecordDataset",
                      lambda *a, **k: pytest.fail("records were read to count them"))
  assert pretrain_input.count_records(data["files"]) == 5
  monkeypatch.undo()
  with open(data["files"][0], "ab") as f:      # a size the contract does not know: count them
    f.write(b"")
  os.truncate(data["files"][0], os.path.getsize(data["files"][0]) - 1)
  assert dataset_info.known_count(data["files"]) is None


def test_sentence_objective_of_records_against_the_model(data):
  # Records written before the field: nsp=True means NSP pairs.
  _check(data["files"], data["vocab"], sentence_objective="nsp")
  with pytest.raises(dataset_info.DataContractError,
                     match=r"made for sentence objective 'nsp' .* but the model trains 'sop' "
                     r"\(config.model.objectives\); remake the records with "
                     r"create_pretraining_data --sop") as e:
    _check(data["files"], data["vocab"], sentence_objective="sop")
  assert "\n" not in str(e.value)
  with pytest.raises(dataset_info.DataContractError, match="'nsp' .* trains 'none'"):
    _check(data["files"], data["vocab"], sentence_objective="none")   # SpanBERT on NSP pairs
  info_path = data["dir"] / dataset_info.INFO_FILE
  info = json.loads(info_path.read_text())
  info.update(nsp=False, sentence_objective="sop")
  info_path.write_text(json.dumps(info))
  _check(data["files"], data["vocab"], sentence_objective="sop")
  with pytest.raises(dataset_info.DataContractError, match="'sop' .* trains 'nsp'"):
    _check(data["files"], data["vocab"], sentence_objective="nsp")
  # Full-sentence records under an NSP head: what training BERT on them always did, with a note.
  info.update(sentence_objective="none")
  info_path.write_text(json.dumps(info))
  notes = []
  _check(data["files"], data["vocab"], sentence_objective="nsp", log=notes.append)
  assert len(notes) == 1 and "NSP head sees label 0 only" in notes[0]
  _check(data["files"], data["vocab"], sentence_objective="none")
  with pytest.raises(dataset_info.DataContractError, match="'none' .* trains 'sop'"):
    _check(data["files"], data["vocab"], sentence_objective="sop")
