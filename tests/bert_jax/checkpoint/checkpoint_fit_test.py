"""checkpoint_fit: a run that continues from state checks that the state still fits (issue 39).

Pre-training from --config.init_checkpoint with another vocabulary or tokenizer.json, an ELECTRA
pair whose generator is not the preset's, and a resume on other record files, another data seed
or a data stream whose layout cannot go on: each one line naming both sides, before the input is
read or the model built; --config.restart_data_stream=True starts a new stream and says so.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import shutil

import numpy as np
import pytest

from tests.end_to_end.faults_test import WORDS, _records, _tiny, _vocab, no_model  # noqa: F401  (fixture)


def _export(tmp_path, name, *, vocab_size=len(WORDS), meta=None, bundle=None, preset="tiny",
            **fields):
  """A params export of `preset` (no real weights: validation reads no array), recording `meta`,
  with `bundle` copied in as its vocab.txt (or tokenizer.json)."""
  import jax.numpy as jnp
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config(preset, vocab_size=vocab_size, **fields)
  path = ckpt_lib.save_params(str(tmp_path / name), {"w": jnp.ones((4,))}, cfg, meta=meta or {})
  if bundle:
    shutil.copyfile(bundle, os.path.join(path, os.path.basename(bundle)
                                         if bundle.endswith(".json") else "vocab.txt"))
  return path


def _run(vocab, **overrides):
  c = _tiny(vocab_file=vocab, **overrides)
  c.model.vocab_size = None        # from the vocab
  return c


# ----------------------------------------------------------------------------------------------
# init_checkpoint: the checkpoint's vocabulary, by content.
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["recorded", "bundled"])
def test_init_checkpoint_with_another_vocabulary_is_refused_before_compute(tmp_path, how):
  """Before: pre-training from a checkpoint trained on another vocabulary of the same size
  trained on, silently (BERT's step-1 MLM loss 11.0, worse than a uniform guess)."""
  from bert_jax import train
  from bert_jax_core import files as files_lib
  vocab = _vocab(tmp_path)
  shuffled = _vocab(tmp_path, WORDS[:5] + WORDS[5:][::-1], "shuffled.txt")   # same size
  export = _export(tmp_path, "ckpt", meta={"vocab_hash": files_lib.sha256_file(vocab)}
                   if how == "recorded" else None, bundle=vocab if how == "bundled" else None)
  source = "recorded in the checkpoint" if how == "recorded" else r".*ckpt/vocab.txt, bundled in"
  with pytest.raises(train.ConfigError, match=(
      rf"init_checkpoint=.*ckpt was trained with another vocabulary \(sha256 [0-9a-f]{{16}}, "
      rf"{source}.*\) than this run's --config.vocab_file=.*shuffled.txt \(sha256 [0-9a-f]{{16}}"
      r"\); pre-train with the checkpoint's own vocabulary")):
    train.validate_inputs(_run(shuffled, init_checkpoint=export), str(tmp_path / "wd"))
  copy = str(tmp_path / "copy.txt")
  shutil.copyfile(vocab, copy)       # the same content under another name: accepted
  mc = train.validate_inputs(_run(copy, init_checkpoint=export), str(tmp_path / "wd"))[3]
  assert mc.vocab_size == len(WORDS)


def test_init_checkpoint_that_identifies_no_vocabulary_is_said_in_a_note(tmp_path, capsys):
  from bert_jax import train
  export = _export(tmp_path, "old")
  vocab = _vocab(tmp_path)
  train.validate_inputs(_run(vocab, init_checkpoint=export), str(tmp_path / "wd"))
  assert (f"note: init_checkpoint={export} records no vocabulary and bundles none: this run's "
          f"{vocab} is taken on its size alone.") in capsys.readouterr().out


def test_init_checkpoint_with_another_tokenizer_json_is_refused(tmp_path):
  """docs/models.md promised it; pre-training from a converted ModernBERT (its tokenizer.json
  bundled and recorded) with another tokenizer.json of the same size trained on."""
  pytest.importorskip("tokenizers")
  from bert_jax import train
  from bert_jax_core import files as files_lib
  from data_pipelines.tokenizers import vocab as vocab_lib
  from tests.data_pipelines.tokenizers.bpe_tokenizer_test import _modernbert_like
  path, _ = _modernbert_like(str(tmp_path / "tok"))
  other = json.load(open(path))
  vocab = other["model"]["vocab"]
  a, b = [t for t in vocab if len(t) > 1][:2]
  vocab[a], vocab[b] = vocab[b], vocab[a]                   # two learned ids swapped: same size
  os.makedirs(tmp_path / "swapped")
  swapped = str(tmp_path / "swapped" / "tokenizer.json")
  json.dump(other, open(swapped, "w"))
  size = vocab_lib.load_vocab_info(tokenizer_json=path).size
  assert vocab_lib.load_vocab_info(tokenizer_json=swapped).size == size
  export = _export(tmp_path, "mb", vocab_size=size, bundle=path,
                   meta={"tokenizer_json": "tokenizer.json",
                         "vocab_hash": files_lib.sha256_file(path)})
  c = _tiny(tokenizer_json=swapped, init_checkpoint=export)
  c.model.vocab_size = None
  with pytest.raises(train.ConfigError, match=r"mb was trained with another vocabulary .* than "
                     r"this run's --config.tokenizer_json=.*swapped/tokenizer.json"):
    train.validate_inputs(c, str(tmp_path / "wd"))
  c.tokenizer_json = path
  assert train.validate_inputs(c, str(tmp_path / "wd"))[3].vocab_size == size


# ----------------------------------------------------------------------------------------------
# ELECTRA: the generator's size.
# ----------------------------------------------------------------------------------------------
def test_electra_pair_with_a_wider_generator_names_the_generator_and_its_flags(tmp_path):
  """Before: a key-bias shape mismatch after the model was built, and no flag for the generator's
  size. Now one line naming the generator and the --config.model.generator_* that set it."""
  from bert_jax import train
  from bert_jax.configs import pretrain
  export = _export(tmp_path, "pair", vocab_size=512, preset="electra-tiny",
                   generator_hidden_size=64, generator_num_heads=1,
                   generator_intermediate_size=256)       # electra-tiny's generator: 32 wide
  c = pretrain.get_config("electra-tiny,runlocal")
  c.train_input_files, c.model.vocab_size, c.init_checkpoint = "synthetic", 512, export
  with pytest.raises(train.ConfigError, match=(
      r"init_checkpoint=.*pair has a generator of 2 layers of width 64, 1 heads, FFN 256 but "
      r"this run's generator \(config.model_name=electra-tiny's, unless --config.model."
      r"generator_\* set it\) has 2 layers of width 32, .*; the generator's size is set by "
      r"--config.model.generator_hidden_size=64 --config.model.generator_num_layers=2 "
      r"--config.model.generator_num_heads=1 --config.model.generator_intermediate_size=256\.")):
    train.validate_inputs(c, str(tmp_path / "wd"))
  c.model.generator_hidden_size, c.model.generator_num_heads = 64, 1   # the flags it names
  c.model.generator_intermediate_size = 256
  mc = train.validate_inputs(c, str(tmp_path / "wd"))[3]
  assert (mc.generator_hidden_size, mc.generator_intermediate_size) == (64, 256)
  # A BERT of the discriminator's sizes has no generator to start one from: said so.
  c = pretrain.get_config("electra-tiny,runlocal")
  bert = _export(tmp_path, "bert", vocab_size=512, hidden_size=128, num_layers=2, num_heads=2,
                 intermediate_size=512)
  c.train_input_files, c.model.vocab_size, c.init_checkpoint = "synthetic", 512, bert
  with pytest.raises(train.ConfigError, match=r"init_checkpoint=.*bert is a bert model without a "
                     r"generator, but config.model_name=electra-tiny trains an ELECTRA pair"):
    train.validate_inputs(c, str(tmp_path / "wd"))


# ----------------------------------------------------------------------------------------------
# Resume: the data stream (record files, seed, layout).
# ----------------------------------------------------------------------------------------------
def _checkpoint(tmp_path, c, *, stream=True, latest=2, name="wd"):
  """A workdir holding checkpoint `latest` of config `c` as train writes it (model, vocab hash,
  layout and, unless stream=False (a checkpoint from before the record), the data stream)."""
  import jax
  import jax.numpy as jnp
  from bert_jax.training import batch_warmup
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax import train
  vocab = train.load_vocab(c)
  files = train.expand_files(c.train_input_files, "train_input_files")
  ramp = batch_warmup.from_config(c)
  layout, record = train.stream_at(c, "wd", files, ramp, None, {})
  meta = train.checkpoint_meta(c, latest, train.trainer_lib.file_hash(c.vocab_file),
                               train.create_model_config(c, vocab), layout, None, ramp,
                               record if stream else None)
  if not stream:
    meta.pop("data_stream")
  wd = str(tmp_path / name)
  m = ckpt_lib.create_manager(wd, async_save=False)
  ckpt_lib.save(m, latest, dict(w=jnp.ones((4,))), meta)
  m.close()
  del jax
  return wd


@pytest.fixture
def no_input(monkeypatch):
  from bert_jax.training import input_source

  def read(*args, **kwargs):
    raise AssertionError("the input was read before the mismatch was found")
  monkeypatch.setattr(input_source, "make_batches", read)


def _real(tmp_path, files, vocab, **overrides):
  return _run(vocab, train_input_files=files, seq_length=128, max_predictions_per_seq=20,
              **overrides)


def test_resume_on_other_record_files_or_seed_is_refused_naming_both(tmp_path, no_model,
                                                                     no_input):
  """Before: it continued at "input position 2" of the other data, without a word."""
  vocab = _vocab(tmp_path)
  a = _records(tmp_path / "a", shards=4, info_vocab=vocab)
  b = _records(tmp_path / "b", shards=2, info_vocab=vocab, per_shard=20)
  wd = _checkpoint(tmp_path, _real(tmp_path, a, vocab))
  with pytest.raises(no_model.ConfigError, match=(
      r"--workdir=.*wd: checkpoint 2 read its data stream from 4 file\(s\) of .*a/part-\* "
      r"\(sha256 [0-9a-f]{16}\), seed 0, this run from 2 file\(s\) of .*b/part-\* \(sha256 "
      r"[0-9a-f]{16}\), seed 0; resuming would continue at input position 2 of other data: "
      r"resume with the checkpoint's --config.train_input_files and --config.seed, pass "
      r"--config.restart_data_stream=True to start this run's stream afresh from step 2, or use "
      r"a new --workdir\.")):
    no_model.train_and_evaluate(_real(tmp_path, b, vocab), wd)
  with pytest.raises(no_model.ConfigError, match=r"seed 0, this run from 4 file\(s\) of "
                     r".*a/part-\* \(sha256 [0-9a-f]{16}\), seed 7; resuming"):
    no_model.train_and_evaluate(_real(tmp_path, a, vocab, seed=7), wd)
  # The same records moved elsewhere (names and sizes kept) are the same stream.
  shutil.copytree(tmp_path / "a", tmp_path / "moved")
  run = no_model.prepare_run(_real(tmp_path, str(tmp_path / "moved" / "part-*"), vocab), wd)
  run.manager.close()
  assert run.latest == 2 and run.position(2) == 2 and run.layout["num_logical_shards"] == 4


def test_restart_data_stream_starts_a_new_stream_at_the_resumed_step_and_says_so(
    tmp_path, capsys):
  from bert_jax import train
  vocab = _vocab(tmp_path)
  a = _records(tmp_path / "a", shards=4, info_vocab=vocab)
  b = _records(tmp_path / "b", shards=2, info_vocab=vocab, per_shard=20)
  wd = _checkpoint(tmp_path, _real(tmp_path, a, vocab))
  run = train.prepare_run(_real(tmp_path, b, vocab, restart_data_stream=True), wd)
  run.manager.close()
  out = capsys.readouterr().out
  assert "restart_data_stream: the checkpoint's stream (4 file(s) of " in out
  assert "this run's stream starts afresh at step 2 (its batch 0" in out
  assert run.position(2) == 0 and run.position(5) == 3           # the new stream's batches
  assert run.layout["num_logical_shards"] == 2                   # gcd(2 files, batch 8), anew
  assert (run.stream["start_step"], run.stream["start_position"]) == (2, 2)
  meta = train.checkpoint_meta(run.config, 5, run.vocab_hash, run.model_config, run.layout,
                               None, run.ramp, run.stream)
  assert meta["input_position"] == 3 and meta["data_stream"]["num_files"] == 2
  # The same stream with the flag: continued, not restarted (a launch script that keeps the
  # flag does not re-read the stream's first batches after every preemption).
  wd_a = _checkpoint(tmp_path, _real(tmp_path, a, vocab), name="wd_a")
  run = train.prepare_run(_real(tmp_path, a, vocab, restart_data_stream=True), wd_a)
  run.manager.close()
  assert run.position(2) == 2
  assert "the checkpoint's data stream is this run's" in capsys.readouterr().out


def test_advice_after_a_changed_shard_count_does_not_loop(tmp_path, no_model, no_input):
  """Before: 4 files -> 2 said "set --config.num_logical_shards <= 2", which the next run refused
  ("the checkpoint's data stream differs ... num_logical_shards 4 vs 2"). A checkpoint from
  before the data-stream record (files unknown): the stored layout's error names the way out;
  with it, a new stream in a layout of its own."""
  vocab = _vocab(tmp_path)
  a = _records(tmp_path / "a", shards=4, info_vocab=vocab)
  wd = _checkpoint(tmp_path, _real(tmp_path, a, vocab), stream=False)
  two = ",".join(str(tmp_path / "a" / f"part-0000{i}-of-00004.tfrecord") for i in (0, 1))
  with pytest.raises(no_model.errors.UserError) as e:
    no_model.train_and_evaluate(_real(tmp_path, two, vocab), wd)
  assert "num_logical_shards <=" not in str(e.value)
  assert ("the checkpoint's data stream has num_logical_shards=4 but the pattern matches 2 "
          "file(s) now; resume with the checkpoint's record files, pass "
          "--config.restart_data_stream=True") in str(e.value)
  run = no_model.prepare_run(_real(tmp_path, two, vocab, restart_data_stream=True), wd)
  run.manager.close()
  assert run.layout["num_logical_shards"] == 2 and run.position(2) == 0
  # Another explicit shard count on the same files: the flag is offered there too.
  with pytest.raises(no_model.errors.UserError, match=r"num_logical_shards 4 vs 2\).*pass "
                     r"--config.restart_data_stream=True"):
    no_model.train_and_evaluate(_real(tmp_path, a, vocab, num_logical_shards=2), wd)


@pytest.mark.slow
def test_a_restarted_stream_trains_on_and_a_later_resume_continues_it(tmp_path, capsys,
                                                                     monkeypatch):
  """Real runs: 3 steps on 4 files, resumed to 6 on 2 other files with the flag (the new stream
  from its batch 0), then to 8 without it: the new stream goes on at its own position."""
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax import train
  from bert_jax.training import input_source
  vocab = _vocab(tmp_path)
  a = _records(tmp_path / "a", shards=4, info_vocab=vocab)
  b = _records(tmp_path / "b", shards=2, info_vocab=vocab, per_shard=20)
  starts = []
  real = input_source.make_batches

  def recorded(*args, **kwargs):
    if kwargs.get("train", True):
      starts.append(kwargs["start_batch"])
    return real(*args, **kwargs)
  monkeypatch.setattr(input_source, "make_batches", recorded)
  wd, kw = str(tmp_path / "wd"), dict(checkpoint_every=3, keep_checkpoints=5)
  train.train_and_evaluate(_real(tmp_path, a, vocab, num_train_steps=3, **kw), wd)
  with pytest.raises(train.ConfigError, match="read its data stream from 4 file"):
    train.train_and_evaluate(_real(tmp_path, b, vocab, num_train_steps=6, **kw), wd)
  out = train.train_and_evaluate(_real(tmp_path, b, vocab, num_train_steps=6,
                                       restart_data_stream=True, **kw), wd)
  printed = capsys.readouterr().out
  assert out["final_step"] == 6 and np.isfinite(out["history"]["train"][-1][1]["loss"])
  assert "this run's stream starts afresh at step 3" in printed
  assert f"resuming from step 3 in {wd} (input position 0)" in printed
  out = train.train_and_evaluate(_real(tmp_path, b, vocab, num_train_steps=8, **kw), wd)
  assert out["final_step"] == 8
  assert f"resuming from step 6 in {wd} (input position 3)" in capsys.readouterr().out
  assert starts == [0, 0, 3]
  manager = ckpt_lib.create_manager(wd, async_save=False)
  meta = ckpt_lib.read_meta(manager, 8)
  manager.close()
  assert meta["input_position"] == 5 and meta["data_stream"]["start_step"] == 3


@pytest.mark.slow
def test_electra_from_a_pair_with_a_wider_generator_trains_with_the_flags_the_error_names(
    tmp_path, capsys):
  """End to end: a pair pre-trained with a 64-wide generator (electra-tiny's is 32); training
  from it without the flags is the one line, with them it loads both networks and trains."""
  from bert_jax import train
  from bert_jax.configs import pretrain

  def config(steps, **generator):
    c = pretrain.get_config("electra-tiny,runlocal")
    c.train_input_files, c.model.vocab_size, c.seq_length = "synthetic", 512, 32
    c.max_predictions_per_seq, c.batch_size, c.num_train_steps = 6, 8, steps
    c.warmup_steps, c.log_every, c.checkpoint_every, c.async_checkpointing = 1, 1, steps, False
    for k, v in generator.items():
      c.model[k] = v
    return c
  wide = dict(generator_hidden_size=64, generator_num_heads=1, generator_intermediate_size=256)
  pair = str(tmp_path / "pair")
  train.train_and_evaluate(config(1, **wide), pair)
  c = config(1)
  c.init_checkpoint = pair
  with pytest.raises(train.ConfigError, match=r"has a generator of 2 layers of width 64"):
    train.train_and_evaluate(c, str(tmp_path / "refused"))
  c = config(1, **wide)
  c.init_checkpoint = pair
  capsys.readouterr()
  out = train.train_and_evaluate(c, str(tmp_path / "continued"))
  assert out["final_step"] == 1 and np.isfinite(out["history"]["train"][-1][1]["mlm_loss"])
  assert f"initialised parameters from step 1 of {pair}" in capsys.readouterr().out


@pytest.mark.slow
def test_the_cli_says_each_refusal_in_one_line_with_exit_code_2(tmp_path):
  """python -m bert_jax.train: the init_checkpoint vocabulary and the resumed data stream are
  one `error:` line on stderr and exit code 2, before compute."""
  import subprocess
  import sys
  from bert_jax_core import files as files_lib
  root = tests.ROOT
  vocab = _vocab(tmp_path)
  shuffled = _vocab(tmp_path, WORDS[:5] + WORDS[5:][::-1], "shuffled.txt")
  a = _records(tmp_path / "a", shards=4, info_vocab=vocab)
  b = _records(tmp_path / "b", shards=2, info_vocab=vocab, per_shard=20)
  export = _export(tmp_path, "ckpt", meta={"vocab_hash": files_lib.sha256_file(vocab)})
  wd = _checkpoint(tmp_path, _real(tmp_path, a, vocab))
  common = ["--config=bert_jax/configs/pretrain.py:tiny,runlocal", "--config.seq_length=128",
            "--config.max_predictions_per_seq=20", "--config.batch_size=8"]
  env = dict(os.environ, JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3")
  for args, want in (
      ([f"--workdir={tmp_path / 'init'}", "--config.train_input_files=synthetic",
        f"--config.vocab_file={shuffled}", f"--config.init_checkpoint={export}"],
       f"error: init_checkpoint={export} was trained with another vocabulary"),
      ([f"--workdir={wd}", f"--config.train_input_files={b}", f"--config.vocab_file={vocab}"],
       f"error: --workdir={wd}: checkpoint 2 read its data stream from 4 file(s)")):
    r = subprocess.run([sys.executable, "-m", "bert_jax.train", *common, *args], cwd=root,
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [l for l in r.stderr.splitlines() if l.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(want), r.stderr[-3000:]
    assert "Traceback" not in r.stderr


# ---- Fine-tuning's training rows and seed on resume (issue 49). ----
def _rows(labels):
  return dict(input_ids=np.arange(12, dtype=np.int32).reshape(3, 4),
              label_ids=np.asarray(labels, np.int32))


def test_a_fine_tuning_resume_checks_the_rows_by_content_and_the_seed(capsys):
  from bert_jax.checkpoint import checkpoint_fit
  rows = lambda labels, seed=0: checkpoint_fit.task_data(  # noqa: E731
      "sst2", "SST-2/train.tsv", _rows(labels), seed)
  was = rows([0, 1, 1])
  # The same rows (a copy of the arrays) and seed: one fingerprint, resumed without a word.
  assert rows([0, 1, 1]) == was and was["rows"] == 3
  checkpoint_fit.check_task_data({"task_data": was}, rows([0, 1, 1]), workdir="W", step=110,
                                 restart=False)
  assert capsys.readouterr().out == ""
  # Every label flipped (the same bytes count), or another seed: refused in one line.
  for now in (rows([1, 0, 0]), rows([0, 1, 1], seed=1)):
    assert now["rows_sha256"] != was["rows_sha256"] or now["seed"] != was["seed"]
    with pytest.raises(checkpoint_fit.CheckpointFitError) as e:
      checkpoint_fit.check_task_data({"task_data": was}, now, workdir="W", step=110,
                                     restart=False)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("--workdir=W: checkpoint 110 was trained on 3 sst2 "
                                              f"training rows of SST-2/train.tsv (sha256 "
                                              f"{was['rows_sha256'][:16]}), seed 0, this run "
                                              "reads 3 sst2 training rows")
    assert "pass --config.restart_data_stream=True to go on from step 110" in msg
  # The escape: goes on over this run's rows, said in one line.
  checkpoint_fit.check_task_data({"task_data": was}, rows([1, 0, 0]), workdir="W", step=110,
                                 restart=True)
  assert "restart_data_stream: the checkpoint's training rows (3 sst2" in capsys.readouterr().out
  # A checkpoint from before the record: resumed, with a note.
  for meta in ({}, {"task_data": None}):
    checkpoint_fit.check_task_data(meta, was, workdir="W", step=110, restart=False)
    assert ("note: --workdir=W: checkpoint 110 was saved before fine-tuning recorded its "
            "training rows and seed") in capsys.readouterr().out
