"""NeoBERT's pre-training recipe (issue 30): the [MASK] / random / unchanged split as config fields
(mask_replace_prob, random_replace_prob; data_pipelines/input/masking.py) and the neobert preset's
values from chandar-lab/NeoBERT's conf/ (families/modernbert/ NEOBERT_RECIPE)."""
import numpy as np
import pytest

from bert_jax_core import errors
from bert_jax_core.tf_setup import tf
from data_pipelines.input import masking
from tests.data_pipelines.input.masking_test import make_sequences, write_vocab

SEQ = 128


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  return write_vocab(tmp_path_factory.mktemp("vocab") / "vocab.txt")


def _mask(vocab, ids, mask, key=(3, 4), preds=64, **split):
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.5, max_predictions_per_seq=preds,
                                       whole_word_masking=False, **split)
  out = masking.mask_batch(tf.constant(ids), tf.constant(mask), tf.constant(key, tf.int64), cfg)
  masked, pos, _, weights = [t.numpy() for t in out]
  rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], pos.shape)
  valid = weights > 0
  selected = np.zeros(ids.shape, bool)
  selected[rows[valid], pos[valid]] = True
  return masked, selected


@pytest.fixture(scope="module")
def sample(vocab):
  # 2,048 rows of 2-125 tokens at 50%: ~64k selected tokens, enough for 5-sigma bounds below.
  return make_sequences(vocab, 2_048, SEQ, np.random.default_rng(7))


def test_all_mask_writes_mask_at_every_selected_position(vocab, sample):
  ids, mask = sample
  masked, selected = _mask(vocab, ids, mask, mask_replace_prob=1.0, random_replace_prob=0.0)
  assert selected.sum() > 50_000
  assert np.all(masked[selected] == vocab.mask_id)          # NeoBERT's "100% MASK"
  np.testing.assert_array_equal(masked[~selected], ids[~selected])
  # The same positions as the default split: only what a selected token becomes changed.
  _, default_selected = _mask(vocab, ids, mask)
  np.testing.assert_array_equal(selected, default_selected)
  # The other two corners: all kept (the input unchanged), all random (no [MASK] written).
  kept, _ = _mask(vocab, ids, mask, mask_replace_prob=0.0, random_replace_prob=0.0)
  np.testing.assert_array_equal(kept, ids)
  rand, _ = _mask(vocab, ids, mask, mask_replace_prob=0.0, random_replace_prob=1.0)
  assert not np.any(rand == vocab.mask_id)
  assert not vocab.is_special[rand[selected]].any()
  assert np.mean(rand[selected] != ids[selected]) > 0.99   # 1/990 equal by chance


def test_default_split_stays_80_10_10(vocab, sample):
  ids, mask = sample
  masked, selected = _mask(vocab, ids, mask)
  new, old = masked[selected], ids[selected]
  n = new.size
  assert n > 50_000
  to_mask = np.mean(new == vocab.mask_id)
  unchanged = np.mean(new == old)   # a random draw equals the original 1/990 of its 10%
  # Binomial std at n = 50k: 0.0018 for 80%, 0.0013 for 10%; bounds >= 5 sigma, and the seed is
  # fixed, so the result is the same on every run.
  assert abs(to_mask - 0.8) < 0.009, to_mask
  assert abs(unchanged - 0.1) < 0.0067, unchanged
  assert abs((1 - to_mask - unchanged) - 0.1) < 0.0067


def test_defaults_are_the_old_thresholds_bit_for_bit(vocab, sample):
  """The split's defaults give the masks the hard-coded `action < 0.8` / `action < 0.9` gave:
  the draws are mask_batch's own (its key split), the rule is the old literal one."""
  ids, mask = sample
  key = tf.constant((3, 4), tf.int64)
  cfg = masking.mask_config_from_vocab(vocab, masked_lm_prob=0.5, max_predictions_per_seq=64,
                                       whole_word_masking=False)
  masked, pos, lm_ids, weights = [t.numpy() for t in masking.mask_batch(
      tf.constant(ids), tf.constant(mask), key, cfg)]
  _, action_key, token_key = tf.unstack(tf.random.experimental.stateless_split(key, num=3))
  action = tf.random.stateless_uniform(pos.shape, seed=action_key).numpy()
  vocab_ids = cfg.random_token_ids
  random_ids = vocab_ids[tf.random.stateless_uniform(
      pos.shape, seed=token_key, minval=0, maxval=len(vocab_ids), dtype=tf.int32).numpy()]
  old = np.where(action < np.float32(0.8), vocab.mask_id,
                 np.where(action < np.float32(0.9), lm_ids, random_ids))
  valid = weights > 0
  rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], pos.shape)
  np.testing.assert_array_equal(masked[rows[valid], pos[valid]], old[valid])
  # Every branch taken, so the comparison covers the three.
  assert {vocab.mask_id} < set(old[valid]) and np.any(old[valid] == lm_ids[valid])


@pytest.mark.parametrize("split,message", [
    ((1.2, 0.0), r"mask_replace_prob=1.2: expected a probability in \[0, 1\]"),
    ((0.8, -0.1), r"random_replace_prob=-0.1: expected a probability in \[0, 1\]"),
    ((0.9, 0.2), r"mask_replace_prob=0.9 \+ random_replace_prob=0.2 = 1.1 > 1: .*lower one"),
    ((float("nan"), 0.0), r"mask_replace_prob=nan: expected a probability")])
def test_impossible_splits_are_refused(vocab, split, message):
  with pytest.raises(ValueError, match=message):
    masking.mask_config_from_vocab(vocab, masked_lm_prob=0.15, max_predictions_per_seq=20,
                                   whole_word_masking=False, mask_replace_prob=split[0],
                                   random_replace_prob=split[1])


def test_premasked_records_refuse_a_split_they_cannot_take(tmp_path, vocab):
  """google-research/bert records carry their masks: a split would change nothing, so say so."""
  from data_pipelines.input import pretrain_input as pi  # pylint: disable=g-import-not-at-top
  from tests.data_pipelines.input import pretrain_input_test as pit  # pylint: disable=g-import-not-at-top
  inst = pit.make_instances(vocab, 1, np.random.default_rng(0))[0]
  feats = {k: pit.int_feature(v) for k, v in inst.items()}
  feats["masked_lm_positions"] = pit.int_feature([1] + [0] * (pit.PREDS - 1))
  feats["masked_lm_ids"] = pit.int_feature([inst["input_ids"][1]] + [0] * (pit.PREDS - 1))
  feats["masked_lm_weights"] = tf.train.Feature(float_list=tf.train.FloatList(
      value=[1.0] + [0.0] * (pit.PREDS - 1)))
  with tf.io.TFRecordWriter(str(tmp_path / "google.tfrecord")) as w:
    w.write(tf.train.Example(features=tf.train.Features(feature=feats)).SerializeToString())
  with pytest.raises(pi.InputPipelineError, match=r"pre-masked .* so --config.mask_replace_prob"
                     r", --config.random_replace_prob would be ignored"):
    pit.dataset(str(tmp_path / "google.tfrecord"), vocab, mask_replace_prob=1.0,
                random_replace_prob=0.0)


def test_the_trainers_stream_takes_the_split_from_the_config(tmp_path, vocab):
  """input_source.make_batches (the trainer's reader) passes the preset's split to masking."""
  from bert_jax.training import input_source  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  from tests.data_pipelines.input import pretrain_input_test as pit  # pylint: disable=g-import-not-at-top
  pit.write_records(tmp_path / "part-0.tfrecord",
                    pit.make_instances(vocab, 64, np.random.default_rng(2)))
  c = pretrain.get_config("neobert,runlocal")
  c.seq_length, c.max_predictions_per_seq = pit.SEQ, 8

  def masked_inputs(config):
    batches = input_source.make_batches(
        config, vocab, files=[str(tmp_path / "part-0.tfrecord")], local_batch_size=64, seed=0,
        start_batch=0, process_index=0, process_count=1, train=False)
    b = next(batches)
    rows = np.broadcast_to(np.arange(64)[:, None], b["masked_lm_positions"].shape)
    valid = b["masked_lm_weights"] > 0
    return b["input_ids"][rows[valid], b["masked_lm_positions"][valid]]

  got = masked_inputs(c)
  assert got.size > 200 and np.all(got == vocab.mask_id)
  c.mask_replace_prob, c.random_replace_prob = 0.8, 0.1   # BERT's split: some are not [MASK]
  assert np.any(masked_inputs(c) != vocab.mask_id)


def _synthetic(**overrides):
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("neobert,runlocal")
  c.train_input_files, c.model.vocab_size = "synthetic", 512
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 6, 8
  c.num_train_steps, c.warmup_steps = 4, 2
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


@pytest.mark.parametrize("overrides,message", [
    (dict(mask_replace_prob=0.9, random_replace_prob=0.2),
     "error: config.mask_replace_prob=0.9 + config.random_replace_prob=0.2 = 1.1 > 1"),
    (dict(mask_replace_prob=1.0, random_replace_prob=1.5),
     "error: config.random_replace_prob=1.5: expected a probability in [0, 1]"),
    # The cosine schedule's fields (optimizer.create_cosine_schedule), checked at preflight.
    (dict(final_lr_fraction=1.5), "error: config.final_lr_fraction=1.5"),
    (dict(decay_steps=5),
     "error: config.warmup_steps=2, config.decay_steps=5, config.num_train_steps=4"),
    (dict(schedule="polynomial"), "error: config.schedule='polynomial': unknown")])
def test_train_refuses_a_bad_split_in_one_line_before_compute(tmp_path, monkeypatch, capsys,
                                                              overrides, message):
  from bert_jax import train  # pylint: disable=g-import-not-at-top

  def model_built(*args, **kwargs):
    raise AssertionError("the model was built before the bad value was found")
  monkeypatch.setattr(train, "build_training", model_built)
  c = _synthetic(**overrides)
  with pytest.raises(SystemExit) as exit_info:
    errors.run_main(lambda argv: train.train_and_evaluate(c, str(tmp_path / "wd")), ["train"])
  assert exit_info.value.code == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith(message), err
  assert not (tmp_path / "wd").exists() or not any((tmp_path / "wd").iterdir())


def test_neobert_preset_is_the_reference_recipe():
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("neobert")
  # conf/datacollator/mlm_20.yaml + collator.py's CustomCollatorForMLM: 20%, all [MASK].
  assert (c.masked_lm_prob, c.mask_replace_prob, c.random_replace_prob) == (0.2, 1.0, 0.0)
  assert c.seq_length == 1_024 and c.max_predictions_per_seq == 209 == int(0.205 * 1_024)
  assert c.batch_size * c.seq_length == 2_097_152          # 2,048 rows: 8 x 64 x accum 4
  assert (c.num_train_steps, c.warmup_steps) == (1_000_000, 2_000)
  assert (c.optimizer, c.learning_rate, c.b1, c.b2, c.eps, c.weight_decay, c.clip_norm) == (
      "adamw", 1e-4, 0.9, 0.95, 1e-8, 0.01, 1.0)
  assert c.batch_size_warmup_min_size == 0                 # none in NeoBERT's recipe
  # conf/scheduler/cosine_decay.yaml + scheduler.py's final_ratio=0.1; AdamW over every tensor.
  assert (c.schedule, c.decay_steps, c.final_lr_fraction) == ("cosine", 900_000, 0.1)
  assert c.weight_decay_all_tensors is True
  # A CPU run keeps the split (runlocal shrinks sizes, not the objective); the cosine ends at
  # 90% of its steps, as the reference's at 900,000 of 1M.
  local = pretrain.get_config("neobert,runlocal")
  assert (local.masked_lm_prob, local.mask_replace_prob, local.random_replace_prob) == (
      0.2, 1.0, 0.0)
  assert (local.schedule, local.num_train_steps, local.decay_steps) == ("cosine", 1_500, 1_350)


def test_neobert_preset_trains_on_the_cosine_and_decays_every_tensor():
  from bert_jax.training import optimizer as opt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("neobert")
  _, schedule = opt_lib.from_config(c, num_train_steps=c.num_train_steps,
                                    warmup_steps=c.warmup_steps)
  # Warmup from 1e-4 x lr, the peak at 2,000, half-way (0.55) at 452,000, 10% from 900,000.
  np.testing.assert_allclose([schedule(t) for t in (0, 2_000, 452_000, 900_000, 1_000_000)],
                             [1e-8, 1e-4, 5.5e-5, 1e-5, 1e-5], rtol=1e-3)
  # Zero gradients at step 0 of a no-warmup copy: each update is -lr x wd x param, the RMSNorm
  # scale and a bias included (BERT's presets leave both at 0).
  params = {"dense": {"kernel": np.ones((2, 2), np.float32), "bias": np.ones(2, np.float32)},
            "final_norm": {"scale": np.ones(2, np.float32)}}
  zeros = {k: {n: np.zeros_like(v) for n, v in d.items()} for k, d in params.items()}
  for preset, decays_all in (("neobert", True), ("base", False)):
    p = pretrain.get_config(preset)
    tx, _ = opt_lib.from_config(p, num_train_steps=p.num_train_steps, warmup_steps=0)
    updates, _ = tx.update(zeros, tx.init(params), params)
    for mod, leaf in (("dense", "kernel"), ("dense", "bias"), ("final_norm", "scale")):
      decays = decays_all or leaf == "kernel"
      np.testing.assert_allclose(updates[mod][leaf],
                                 -p.learning_rate * p.weight_decay if decays else 0.0,
                                 rtol=1e-4, err_msg=f"{preset} {mod}/{leaf}")


@pytest.mark.parametrize("preset,prob", [("modernbert-base", 0.3), ("modernbert-large", 0.3),
                                         ("modernbert-tiny", 0.3), ("modernbert-mini", 0.3),
                                         ("base", 0.15), ("albert-base", None)])
def test_other_presets_keep_80_10_10_and_their_values(preset, prob):
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config(preset)
  assert (c.mask_replace_prob, c.random_replace_prob) == (0.8, 0.1)
  if prob is not None:
    assert c.masked_lm_prob == prob
  # The neobert values did not leak into ModernBERT's: tiny and mini keep BERT's loop, base and
  # large ModernBERT's first phase (families/modernbert/ PHASE1).
  if preset in ("modernbert-tiny", "modernbert-mini"):
    assert (c.seq_length, c.b2, c.eps, c.warmup_steps, c.num_train_steps) == (
        128, 0.999, 1e-6, 10_000, 900_000)
  elif preset.startswith("modernbert"):
    assert (c.seq_length, c.b2, c.eps, c.schedule, c.optimizer) == (
        1_024, 0.98, 1e-6, "wsd", "stable_adamw")


def test_runlocal_predictions_follow_the_masking_rate():
  # runlocal's 128-token rows: google's int((p + 0.005) x 128), at least BERT's 20. A fixed 20
  # capped ModernBERT's 30% at 20 of its 39 predictions a row and NeoBERT's 20% at 20 of 26.
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  want = {"tiny": 20, "albert-tiny": 20, "modernbert-tiny": 39, "neobert": 26}
  got = {p: pretrain.get_config(f"{p},runlocal").max_predictions_per_seq for p in want}
  assert got == want
