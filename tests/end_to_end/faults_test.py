"""The non-finite guard: a NaN/Inf step leaves parameters and optimizer state unchanged bit for bit,
is counted, and too many in a row stop the run with one line naming the step and input position."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax.training import guard


def _toy_state():
  params = {"w": jnp.array([-0.0, 1.0, -2.5], jnp.float32), "b": jnp.array([0.0, -0.0])}
  tx = optax.adamw(1e-2)
  return dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
              rng=jax.random.PRNGKey(0)), tx


def _step(state, x, tx):
  """A toy jitted step with the guard, as trainer_lib.train_step applies it."""
  def loss_fn(p):
    return jnp.sum((p["w"] * x) ** 2) + jnp.sum(p["b"] * x[:2])
  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  new_state = dict(state, step=state["step"] + 1, opt_state=opt_state,
                   params=optax.apply_updates(state["params"], updates))
  return guard.select(state, new_state, dict(loss=loss, grad_norm=optax.tree.norm(grads)))


def _bits(tree):
  return [np.asarray(x).tobytes() for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_bad_step_leaves_params_and_opt_state_bit_identical(bad):
  state, tx = _toy_state()
  step = jax.jit(lambda s, x: _step(s, x, tx))
  state, m = step(state, jnp.array([1.0, 2.0, 3.0]))       # one good step: Adam moments non-zero
  assert int(m["skipped"]) == 0
  before = jax.device_get(state)
  after, m = step(state, jnp.array([bad, 2.0, 3.0]))
  assert int(m["skipped"]) == 1
  assert _bits(after["params"]) == _bits(before["params"])
  assert _bits(after["opt_state"]) == _bits(before["opt_state"])
  assert int(after["step"]) == int(before["step"]) + 1      # the batch was consumed


def test_negative_zero_survives_a_skipped_step_unlike_apply_if_finite():
  """Why not optax.apply_if_finite: its zero update turns -0.0 into +0.0."""
  state, tx = _toy_state()
  after, m = jax.jit(lambda s, x: _step(s, x, tx))(state, jnp.array([np.nan, 1.0, 1.0]))
  assert int(m["skipped"]) == 1
  assert np.signbit(np.asarray(after["params"]["w"])[0])          # still -0.0
  safe = optax.apply_if_finite(tx, max_consecutive_errors=10)
  grads = {"w": jnp.array([np.nan, 1.0, 1.0]), "b": jnp.zeros(2)}
  updates, _ = safe.update(grads, safe.init(state["params"]), state["params"])
  assert not np.signbit(np.asarray(optax.apply_updates(state["params"], updates)["w"])[0])


def test_skip_tracker_counts_and_stops_after_max_consecutive():
  tracker = guard.SkipTracker(max_consecutive_skips=3)
  for step, skipped in enumerate([0, 1, 0, 1, 1], start=1):
    tracker.update(step, input_position=step - 1, skipped=skipped)
  assert tracker.total == 3 and tracker.consecutive == 2
  with pytest.raises(guard.NonFiniteError) as e:
    tracker.update(6, input_position=5, skipped=1)
  msg = str(e.value)
  assert "step 6" in msg and "first at step 4 (input position 3)" in msg and "\n" not in msg


def test_build_vocab_refuses_an_unwritable_output_before_reading_the_corpus(tmp_path,
                                                                            monkeypatch):
  from bert_jax_core import files as files_lib
  from data_pipelines import build_vocab
  (tmp_path / "corpus.txt").write_text("some words here\n" * 10)
  (tmp_path / "file").write_text("x")        # a path under a file: unwritable even for root

  def must_not_run(*args, **kwargs):
    raise AssertionError("the corpus was read before the output was checked")
  monkeypatch.setattr(build_vocab, "corpus_paths", must_not_run)
  with pytest.raises(files_lib.OutputPathError, match="--output=.*cannot be written"):
    build_vocab.build(str(tmp_path / "corpus.txt"), 100, str(tmp_path / "file" / "vocab.txt"))


def test_finite_loss_with_nan_gradient_is_skipped():
  """sqrt at 0: the loss is 0, its gradient is Inf/NaN."""
  state, tx = _toy_state()

  def step(s):
    loss, grads = jax.value_and_grad(lambda p: jnp.sum(jnp.sqrt(jnp.abs(p["w"]))))(s["params"])
    updates, opt_state = tx.update(grads, s["opt_state"], s["params"])
    new = dict(s, step=s["step"] + 1, opt_state=opt_state,
               params=optax.apply_updates(s["params"], updates))
    return guard.select(s, new, dict(loss=loss, grad_norm=optax.tree.norm(grads)))
  after, m = jax.jit(step)(state)
  assert np.isfinite(float(m["loss"])) and int(m["skipped"]) == 1
  assert _bits(after["params"]) == _bits(state["params"])
  assert _bits(after["opt_state"]) == _bits(state["opt_state"])


# ----------------------------------------------------------------------------------------------
# The guard inside pre-training (trainer_lib.train_step -> guard.select, train.py counts).
# ----------------------------------------------------------------------------------------------
def _tiny(**overrides):
  from bert_jax.configs import pretrain as pretrain_config
  c = pretrain_config.get_config("tiny,runlocal")
  c.train_input_files = "synthetic"
  c.model.vocab_size = 512
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 6, 8
  c.num_train_steps, c.warmup_steps, c.log_every = 4, 2, 1
  c.checkpoint_every, c.keep_checkpoints, c.eval_every = 1, 20, 1000
  c.async_checkpointing = False
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _poison(monkeypatch, bad_batches):
  """Batches at these stream positions get NaN masked_lm_weights (a NaN loss and gradient)."""
  from bert_jax.training import input_source
  real = input_source.make_batches

  def poisoned(*args, **kwargs):
    for i, b in enumerate(real(*args, **kwargs), start=kwargs["start_batch"]):
      if i in bad_batches:
        b = dict(b, masked_lm_weights=np.full_like(b["masked_lm_weights"], np.nan))
      yield b
  monkeypatch.setattr(input_source, "make_batches", poisoned)


def _saved_state(workdir, step):
  from orbax import checkpoint as ocp
  from bert_jax.checkpoint import store as ckpt_lib
  with ocp.StandardCheckpointer() as ckptr:
    return ckpt_lib._restore_numpy(ckptr, os.path.join(workdir, "checkpoints", str(step),
                                                       "state"))


@pytest.mark.slow
def test_nan_batch_in_pretraining_is_skipped_and_counted(tmp_path, monkeypatch):
  from bert_jax import train
  _poison(monkeypatch, bad_batches={2})          # the batch of step 3
  wd = str(tmp_path / "wd")
  result = train.train_and_evaluate(_tiny(), wd)
  skipped = {s: m["skipped_steps"] for s, m in result["history"]["train"]}
  assert skipped == {1: 0, 2: 0, 3: 1, 4: 1}
  # Step 3's log line shows its NaN loss (every step of that window was skipped); the others
  # are finite.
  assert [bool(np.isfinite(m["loss"])) for _, m in result["history"]["train"]] == [
      True, True, False, True]
  s2, s3, s4 = (_saved_state(wd, s) for s in (2, 3, 4))
  assert _bits(s3["params"]) == _bits(s2["params"])
  assert _bits(s3["opt_state"]) == _bits(s2["opt_state"])
  assert int(s3["step"]) == 3 and _bits(s4["params"]) != _bits(s3["params"])


@pytest.mark.slow
def test_consecutive_nan_steps_stop_the_run_with_one_line(tmp_path, monkeypatch):
  from bert_jax import train
  _poison(monkeypatch, bad_batches=set(range(2, 100)))
  wd = str(tmp_path / "wd")
  with pytest.raises(guard.NonFiniteError,
                     match=r"stopped at step 4: .* 2 consecutive steps .* first at step 3 "
                           r"\(input position 2\)"):
    train.train_and_evaluate(_tiny(num_train_steps=8, max_consecutive_skips=2), wd)
  steps = sorted(int(d) for d in os.listdir(os.path.join(wd, "checkpoints")) if d.isdigit())
  assert steps == [1, 2, 3]                      # no checkpoint after the stop
  for s in steps:
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(_saved_state(wd, s)["params"]))
  assert _bits(_saved_state(wd, 3)["params"]) == _bits(_saved_state(wd, 2)["params"])


# ----------------------------------------------------------------------------------------------
# Bad input to pre-training: one error before the model is built.
# ----------------------------------------------------------------------------------------------
WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(195)]


def _records(directory, *, seq=128, max_id=150, shards=2, per_shard=16, info_vocab=None,
             lower=True):
  """Unmasked records (ids < max_id), with a dataset_info.json when info_vocab is given."""
  from data_pipelines.records import dataset_info
  from bert_jax_core.tf_setup import tf
  directory.mkdir(parents=True)
  rng = np.random.default_rng(0)
  names = []
  for s in range(shards):
    name = f"part-{s:05d}-of-{shards:05d}.tfrecord"
    with tf.io.TFRecordWriter(str(directory / name)) as w:
      for _ in range(per_shard):
        ids = [2] + list(rng.integers(5, max_id, seq - 2)) + [3]
        f = {"input_ids": ids, "input_mask": [1] * seq, "segment_ids": [0] * seq,
             "next_sentence_labels": [0]}
        w.write(tf.train.Example(features=tf.train.Features(feature={
            k: tf.train.Feature(int64_list=tf.train.Int64List(value=v))
            for k, v in f.items()})).SerializeToString())
    names.append(name)
  if info_vocab:
    dataset_info.write(str(directory), dict(
        shards=[dict(file=n, num_instances=per_shard) for n in names], max_seq_length=seq,
        nsp=True, vocab_file=info_vocab, vocab_size=len(WORDS), do_lower_case=lower,
        vocab_sha256=dataset_info.sha256_file(info_vocab)))
  return str(directory / "part-*")


@pytest.fixture
def no_model(monkeypatch):
  """Any error raised with this fixture came before the model was built."""
  from bert_jax import train

  def model_built(*args, **kwargs):
    raise AssertionError("the model was built before the bad input was found")
  monkeypatch.setattr(train, "build_training", model_built)
  return train


def _vocab(tmp_path, words=WORDS, name="vocab.txt"):
  (tmp_path / name).write_text("\n".join(words) + "\n")
  return str(tmp_path / name)


def _real(tmp_path, files, vocab, **overrides):
  kw = dict(train_input_files=files, vocab_file=vocab, seq_length=128,
            max_predictions_per_seq=20)
  kw.update(overrides)
  c = _tiny(**kw)
  c.model.vocab_size = None
  return c


@pytest.mark.parametrize("field,value", [("batch_size", -32), ("seq_length", 0),
                                         ("max_predictions_per_seq", 0),
                                         ("num_train_steps", -1)])
def test_non_positive_sizes_are_refused_first(tmp_path, no_model, field, value):
  from bert_jax_core import errors
  with pytest.raises(errors.UserError, match=f"config.{field}={value}: expected a positive"):
    no_model.train_and_evaluate(_tiny(**{field: value}), str(tmp_path / "wd"))


@pytest.mark.parametrize("prob", [0.0, 1.5, -0.1])
def test_masked_lm_prob_outside_0_1_is_refused_first(tmp_path, no_model, prob):
  # Was: a ValueError traceback from masking.py (our records) or silently ignored (google's).
  from bert_jax_core import errors
  with pytest.raises(errors.UserError, match=rf"config.masked_lm_prob={prob}: expected a "
                     "fraction of the tokens between 0 and 1"):
    no_model.train_and_evaluate(_tiny(masked_lm_prob=prob), str(tmp_path / "wd"))


def test_warmup_longer_than_training_is_refused_before_any_input(tmp_path, no_model,
                                                                 monkeypatch):
  from bert_jax.training import input_source
  from bert_jax_core import errors

  def read(*args, **kwargs):
    raise AssertionError("the input was read before the bad schedule was found")
  monkeypatch.setattr(input_source, "make_batches", read)
  with pytest.raises(errors.UserError, match="warmup_steps=50, num_train_steps=10"):
    no_model.train_and_evaluate(_tiny(num_train_steps=10, warmup_steps=50),
                                str(tmp_path / "wd"))


def test_records_contract_mismatches_before_the_model(tmp_path, no_model):
  from data_pipelines.records import dataset_info
  vocab = _vocab(tmp_path)
  files = _records(tmp_path / "rec", info_vocab=vocab)
  wd = str(tmp_path / "wd")
  with pytest.raises(dataset_info.DataContractError,
                     match="max_seq_length = 128 .*config.seq_length=64"):
    no_model.train_and_evaluate(_real(tmp_path, files, vocab, seq_length=64), wd)
  shuffled = _vocab(tmp_path, WORDS[:5] + WORDS[5:][::-1], "shuffled.txt")
  with pytest.raises(dataset_info.DataContractError, match="shuffled.txt"):
    no_model.train_and_evaluate(_real(tmp_path, files, shuffled), wd)
  # A cased vocab (its casing is taken from it) for records that say they were lower-cased.
  cased = _vocab(tmp_path, WORDS[:5] + ["Paris", "London"] + WORDS[7:], "cased.txt")
  lowered = _records(tmp_path / "lowered", info_vocab=cased, lower=True)
  with pytest.raises(dataset_info.DataContractError, match="config.do_lower_case=False"):
    no_model.train_and_evaluate(_real(tmp_path, lowered, cased, do_lower_case=False), wd)
  shard = files.replace("*", "00001-of-00002.tfrecord")
  with open(shard, "r+b") as f:
    f.truncate(os.path.getsize(shard) - 100)
  with pytest.raises(dataset_info.DataContractError, match="00001-of-00002.tfrecord: .* bytes"):
    no_model.train_and_evaluate(_real(tmp_path, files, vocab), wd)


def test_records_without_contract_checked_by_their_first_batch(tmp_path, no_model):
  from bert_jax_core import errors
  small = _vocab(tmp_path, WORDS[:100], "small.txt")      # records hold ids up to 149
  files = _records(tmp_path / "google", max_id=150)       # no dataset_info.json
  with pytest.raises(errors.UserError, match=r"1\d\d"):
    no_model.train_and_evaluate(_real(tmp_path, files, small), str(tmp_path / "wd"))
  vocab = _vocab(tmp_path)
  with pytest.raises(errors.UserError, match="part-00000-of-00002.tfrecord.*length 128"):
    no_model.train_and_evaluate(_real(tmp_path, files, vocab, seq_length=64),
                                str(tmp_path / "wd"))


def test_unwritable_workdir_before_the_model(tmp_path, no_model):
  from bert_jax_core import errors
  (tmp_path / "file").write_text("x")     # a path under a file: unwritable even for root
  with pytest.raises(errors.UserError, match="workdir"):
    no_model.train_and_evaluate(_tiny(), str(tmp_path / "file" / "wd"))


def test_bad_crc_in_a_shard_is_named_before_the_model(tmp_path, no_model):
  from bert_jax_core import errors
  vocab = _vocab(tmp_path)
  files = _records(tmp_path / "google")                  # no dataset_info.json: no size check
  shard = files.replace("*", "00001-of-00002.tfrecord")
  with open(shard, "r+b") as f:                           # a byte inside the first record's data
    f.seek(40)
    b = f.read(1)
    f.seek(40)
    f.write(bytes([b[0] ^ 0xFF]))
  with pytest.raises(errors.UserError, match="00001-of-00002.tfrecord"):
    no_model.train_and_evaluate(_real(tmp_path, files, vocab), str(tmp_path / "wd"))


def test_empty_shards_are_skipped_with_a_note_not_a_hang(tmp_path, no_model, capsys):
  """create_pretraining_data writes 0-byte shards when it has too little text (a 4-line corpus:
  4 of 16); a logical shard of only those made the stream spin forever (issue 23, fault 1)."""
  vocab = _vocab(tmp_path)
  files = _records(tmp_path / "rec", shards=2)                  # 2 shards with records ...
  for s in (2, 3):                                              # ... and 2 empty ones
    (tmp_path / "rec" / f"part-{s:05d}-of-00004.tfrecord").write_bytes(b"")
  c = _real(tmp_path, files, vocab, input_stall_minutes=1.0)   # 4 files, 4 logical shards
  with pytest.raises(AssertionError, match="the model was built"):  # a first batch was read
    no_model.train_and_evaluate(c, str(tmp_path / "wd"))
  assert "skipping 2 empty file(s) of 4" in capsys.readouterr().out


def _checkpoint_of(tmp_path, c, **meta):
  """A workdir holding checkpoint 2 of config `c` (its model and vocab hash unless overridden)."""
  import jax.numpy as jnp
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax import train
  vocab = train.load_vocab(c)
  meta = dict(dict(model_config=train.create_model_config(c, vocab).to_dict(),
                   vocab_hash=train.trainer_lib.file_hash(c.vocab_file),
                   config=json.loads(c.to_json_best_effort())), **meta)
  wd = str(tmp_path / "wd")
  m = ckpt_lib.create_manager(wd, async_save=False)
  ckpt_lib.save(m, 2, dict(w=jnp.ones((4,))), meta)
  m.close()
  return wd


def test_resume_with_another_vocab_or_preset_is_refused_before_input_and_model(
    tmp_path, no_model, monkeypatch):
  """Issue 23 faults 2 (a same-size vocab trained on, rc 0) and 8 (another preset refused only
  after the model and input were built, 131 s in)."""
  from bert_jax import train
  from bert_jax.training import input_source

  def read(*args, **kwargs):
    raise AssertionError("the input was read before the mismatch was found")
  monkeypatch.setattr(input_source, "make_batches", read)
  vocab = _vocab(tmp_path)
  files = _records(tmp_path / "rec")
  wd = _checkpoint_of(tmp_path, _real(tmp_path, files, vocab))
  shuffled = _vocab(tmp_path, WORDS[:5] + WORDS[5:][::-1], "shuffled.txt")   # same size
  with pytest.raises(train.ConfigError, match=r"trained with another vocabulary \(sha256 "
                     r"[0-9a-f]{16}, its .*vocab.txt\) than this run's --config.vocab_file=.*"
                     r"shuffled.txt \(sha256 [0-9a-f]{16}\); resume with the run's own vocab"):
    no_model.train_and_evaluate(_real(tmp_path, files, shuffled), wd)
  other = _real(tmp_path, files, vocab)
  other.model_name = "mini"                                    # another preset
  with pytest.raises(train.ConfigError, match="holds a checkpoint of another model .*hidden_size"):
    no_model.train_and_evaluate(other, wd)


def test_a_finetuned_export_records_its_vocab_and_refuses_another(tmp_path):
  """best_epochN carries its vocab file and sha256 (issue 23, fault 3: it recorded neither)."""
  import types
  import jax.numpy as jnp
  from bert_jax import finetune
  from bert_jax.inference import loading as inference
  from bert_jax.models import model as model_lib
  from data_pipelines.tokenizers import tokenization
  vocab = _vocab(tmp_path)
  run = types.SimpleNamespace(
      workdir=str(tmp_path), is_main=True,
      task=types.SimpleNamespace(name="t", type="classification", labels=[0, 1]),
      model_config=model_lib.get_bert_config("tiny", vocab_size=len(WORDS)),
      tokenizer=tokenization.get_tokenizer(vocab_file=vocab, do_lower_case=True))
  path = finetune._save_best(run, {"w": jnp.ones((4,))}, 1, None, {})
  meta = json.load(open(os.path.join(path, "bert_config.json")))
  assert meta["vocab_file"] == vocab and len(meta["vocab_hash"]) == 64
  shuffled = _vocab(tmp_path, WORDS[:5] + WORDS[5:][::-1], "shuffled.txt")
  with pytest.raises(inference.InferenceLoadError, match="another vocabulary .* than the "
                     "vocabulary .*shuffled.txt"):
    inference.check_vocab_hash(meta, shuffled, path)
  assert inference.find_tokenizer_files("params", path, meta)[0] == vocab
  os.remove(vocab)
  with pytest.raises(inference.InferenceLoadError, match=r"the file its config records \(.*"
                     r"vocab.txt\) is gone"):
    inference.find_tokenizer_files("params", path, meta)
  with pytest.raises(inference.InferenceLoadError, match="it records no vocab file"):
    inference.find_tokenizer_files("params", path, {})


def test_a_vocab_listing_a_token_twice_is_one_line_naming_it(tmp_path):
  """Was a tensorflow_text RuntimeError traceback from create_pretraining_data (fault 7)."""
  from data_pipelines.tokenizers import tokenization
  from data_pipelines.tokenizers import vocab as vocab_lib
  dup = _vocab(tmp_path, WORDS[:9] + ["w3"] + WORDS[10:], "dup.txt")   # w3 on lines 9 and 10
  with pytest.raises(vocab_lib.VocabError, match=r"dup.txt: token 'w3' is listed twice "
                     r"\(lines 9 and 10\)"):
    tokenization.get_tokenizer(vocab_file=dup, do_lower_case=True)


def test_unwritable_outputs_are_refused_before_any_work(tmp_path, monkeypatch):
  """extract_features --output_file in a missing or read-only directory and convert --output on
  a read-only filesystem: one line before the model runs or the checkpoint is read (fault 7:
  tracebacks after 64-86 s). main() calls files.check_output_file before load_for_inference."""
  import errno
  import tempfile
  from bert_jax import convert
  from bert_jax_core import files as files_lib
  check = lambda p: files_lib.check_output_file(p, "--output_file")  # noqa: E731  (main's call)
  with pytest.raises(files_lib.OutputPathError, match=r"--output_file=.*missing/f.npz: the "
                     r"directory .*missing does not exist"):
    check(str(tmp_path / "missing" / "f.npz"))
  check(str(tmp_path / "f.npz"))      # a writable one passes

  def read_only(*args, **kwargs):          # root writes through chmod; a read-only mount it can't
    raise OSError(errno.EROFS, "Read-only file system")
  monkeypatch.setattr(tempfile, "mkstemp", read_only)
  with pytest.raises(files_lib.OutputPathError, match=r"cannot be written \(.*: Read-only "
                     "file system\\); choose a writable path"):
    check(str(tmp_path / "f.npz"))

  def must_not_read(*args, **kwargs):
    raise AssertionError("the checkpoint was read before the output was checked")
  monkeypatch.setattr(convert, "import_checkpoint", must_not_read)
  with pytest.raises(convert.ConversionError, match=r"--output=.*out: cannot be written \(.*"
                     "Read-only file system"):
    convert.convert_to_orbax("ckpt", str(tmp_path / "out"))


def test_pretraining_from_a_checkpoint_takes_its_activation_and_refuses_a_contradiction(
    tmp_path):
  """Point 9: a converted google checkpoint (gelu_tanh) silently trained with the config's erf
  GELU; now every encoder field comes from the checkpoint, read before the model is built."""
  import jax.numpy as jnp
  from bert_jax.checkpoint import store as ckpt_lib
  from bert_jax.models import model as model_lib
  from bert_jax import train
  stored = model_lib.get_bert_config("tiny", vocab_size=512, hidden_act="gelu_tanh",
                                     layer_norm_eps=1e-6)
  export = ckpt_lib.save_params(str(tmp_path / "google"), {"w": jnp.ones((4,))}, stored)
  c = _tiny(init_checkpoint=export)
  c.model.hidden_dropout_prob = 0.0                             # a run field: the config's
  mc = train.validate_inputs(c, str(tmp_path / "wd"))[3]
  assert (mc.hidden_act, mc.layer_norm_eps, mc.hidden_dropout_prob) == ("gelu_tanh", 1e-6, 0.0)
  c.model.hidden_act = "gelu"
  with pytest.raises(ckpt_lib.CheckpointError, match=r"google was trained with "
                     r"hidden_act='gelu_tanh' but the config sets hidden_act='gelu'"):
    train.validate_inputs(c, str(tmp_path / "wd"))
