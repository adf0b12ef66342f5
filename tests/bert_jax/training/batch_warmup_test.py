"""Batch-size warmup (bert_jax/training/batch_warmup.py): k(s), input positions, refusals, and a tiny
ModernBERT run that ramps, is killed mid-ramp and resumes to the uninterrupted losses."""

import signal

import numpy as np
import pytest

from bert_jax.training import batch_warmup
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.training import input_source
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import train
from bert_jax.configs import pretrain as pretrain_config
from tests.testlib import sigterm_testlib


def ramp_config(preset="modernbert-tiny", **overrides):
  c = pretrain_config.get_config(preset)
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def test_modernbert_base_ramp_is_the_papers_and_each_size_runs_the_same_steps():
  """768 -> 4,608 rows over 50B tokens at 1,024 a row: 6 sizes, ~4,239 steps each (the
  thresholds of ModernBERT's BatchSizeWarmupScheduler), 50B tokens before the full batch."""
  c = ramp_config("modernbert-base", seq_length=1024)
  assert (c.batch_size, c.batch_size_warmup_min_size, c.batch_size_warmup_tokens) == (
      4608, 768, 50e9)
  r = batch_warmup.from_config(c)
  assert (r.unit, r.sizes) == (768, 6)
  assert r.first_steps == (1, 4240, 8479, 12718, 16956, 21195)
  per_size = np.diff(r.first_steps)
  assert per_size.max() - per_size.min() <= 1, per_size
  last = r.first_steps[-1] - 1
  tokens = r.rows_through(last) * 1024
  assert 50e9 <= tokens < 50e9 + 4608 * 1024, tokens          # ends at the first step past W
  assert r.rows_through(last - 1) * 1024 < 50e9
  assert [r.rows(s) for s in (1, 4239, 4240, 21194, 21195, 10**6)] == [
      768, 768, 1536, 3840, 4608, 4608]
  large = batch_warmup.from_config(ramp_config("modernbert-large", seq_length=1024))
  assert (large.unit, large.sizes, large.tokens) == (448, 11, int(10e9))


@pytest.mark.parametrize("variant", ["modernbert-tiny", "modernbert-mini", "neobert",
                                     "modernbert-base,runlocal", "modernbert-base,phase2", "base"])
def test_ramp_off_for_bert_cpu_presets_runlocal_and_phase2(variant):
  r = batch_warmup.from_config(pretrain_config.get_config(variant))
  assert not r.on and r.record() is None
  assert [r.position(s) for s in range(5)] == [0, 1, 2, 3, 4]   # input position = step


def test_position_is_the_sum_of_the_steps_units_and_resume_reads_the_same_rows():
  c = ramp_config(batch_size=12, batch_size_warmup_min_size=3, batch_size_warmup_tokens=1000,
                  seq_length=16)
  r = batch_warmup.from_config(c)
  assert r.sizes == 4
  units = [r.units(s) for s in range(1, 30)]
  assert units == sorted(units) and set(units) == {1, 2, 3, 4}
  assert [r.position(s) for s in range(30)] == list(np.cumsum([0] + units))
  assert r.rows_through(29) == 3 * sum(units)
  # The synthetic stream of 3-row batches: step s's rows are the same whether the run started
  # at step 1 or resumed from a checkpoint of any earlier step (start_batch = position).
  stream = lambda start: input_source.synthetic_batches(  # noqa: E731
      batch_size=3, seq_length=16, max_predictions_per_seq=4, vocab_size=64, seed=7,
      start_batch=start)
  full = stream(0)
  rows = [batch_warmup.take(full, r.units(s))["input_ids"] for s in range(1, 12)]
  for resume in (0, 3, 5, 8):
    it = stream(r.position(resume))
    for s in range(resume + 1, 12):
      np.testing.assert_array_equal(batch_warmup.take(it, r.units(s))["input_ids"], rows[s - 1])
  assert [len(x) for x in rows] == [r.rows(s) for s in range(1, 12)]


def test_passes_keep_the_micro_batch_of_grad_accum_steps():
  c = ramp_config(batch_size=48, batch_size_warmup_min_size=8, batch_size_warmup_tokens=1e6,
                  grad_accum_steps=12)            # 6 sizes; micro-batches of 4 rows
  r = batch_warmup.from_config(c)
  assert [r.passes(k) for k in range(1, 7)] == [2, 4, 6, 8, 10, 12]
  one = batch_warmup.from_config(ramp_config(batch_size=48, batch_size_warmup_min_size=8,
                                             batch_size_warmup_tokens=1e6))
  assert [one.passes(k) for k in range(1, 7)] == [1] * 6   # k x 8 rows in one pass


@pytest.mark.parametrize("overrides,message", [
    (dict(batch_size=4600, batch_size_warmup_min_size=768, batch_size_warmup_tokens=1e9),
     "batch_size=4600 is not a multiple of config.batch_size_warmup_min_size=768"),
    (dict(batch_size=48, batch_size_warmup_min_size=8, batch_size_warmup_tokens=0.0),
     "batch_size_warmup_tokens=0"),
    (dict(batch_size=48, batch_size_warmup_min_size=-8, batch_size_warmup_tokens=1e6),
     "expected >= 0"),
    (dict(batch_size=48, batch_size_warmup_min_size=8, batch_size_warmup_tokens=1e6,
          grad_accum_steps=4), "grad_accum_steps=4 with a batch-size warmup of 6 sizes"),
    (dict(batch_size=48, batch_size_warmup_min_size=4, batch_size_warmup_tokens=1e6),
     "do not split over the data-parallel size 8"),
])
def test_refusals_name_the_field_and_the_fix(overrides, message):
  mesh = sharding_lib.create_mesh((-1, 1, 1))   # conftest: 8 CPU devices -> data 8
  with pytest.raises(train.ConfigError, match=message):
    batch_warmup.from_config(ramp_config(**overrides), mesh)


def test_resume_with_another_ramp_is_refused_and_old_checkpoints_resume_without_one():
  on = batch_warmup.from_config(ramp_config(batch_size=48, batch_size_warmup_min_size=8,
                                            batch_size_warmup_tokens=1e6))
  off = batch_warmup.from_config(ramp_config(batch_size=48))
  batch_warmup.check_resume(None, off, "w")               # a checkpoint from before the ramp
  batch_warmup.check_resume(on.record(), on, "w")
  with pytest.raises(train.ConfigError, match="was trained with batch-size warmup None"):
    batch_warmup.check_resume(None, on, "w")
  with pytest.raises(train.ConfigError, match="min_size/_tokens"):
    batch_warmup.check_resume(dict(on.record(), tokens=2_000_000), on, "w")


def test_stream_order_makes_every_host_count_see_one_hosts_global_batch():
  """Two hosts each hold their half of k=3 stream batches, host-major; the permutation gives
  the rows one host has: stream batch after stream batch."""
  k, hosts, unit = 3, 2, 4
  stream = np.arange(k * unit * 5).reshape(k, unit, 5)              # [k, unit rows, ...]
  host_major = np.concatenate([stream[:, h * 2:(h + 1) * 2].reshape(-1, 5)
                               for h in range(hosts)])            # what make_global_batch lays
  got = batch_warmup.stream_order({"x": host_major}, hosts, k)["x"]
  np.testing.assert_array_equal(np.asarray(got), stream.reshape(-1, 5))
  np.testing.assert_array_equal(np.asarray(batch_warmup.stream_order({"x": host_major}, 1, k)["x"]),
                                host_major)


# --------------------------------------------------------------------------------------------
# End to end: modernbert-tiny on synthetic rows, a 8 -> 24-row ramp over the first 6 steps.
# --------------------------------------------------------------------------------------------
def tiny_ramp(**overrides):
  c = pretrain_config.get_config("modernbert-tiny,runlocal")
  c.train_input_files = "synthetic"
  c.model.vocab_size, c.model.num_layers = 256, 1     # one (global) layer: a quicker compile
  c.seq_length, c.max_predictions_per_seq = 32, 8
  # 3 sizes of 8 rows (8 = the 8 CPU devices' data axis): 8 x 32 = 256 tokens a unit; 2,304
  # tokens = 3 steps at each of the two smaller sizes (3 x 256 + 3 x 512), then 24 rows.
  c.batch_size, c.batch_size_warmup_min_size, c.batch_size_warmup_tokens = 24, 8, 2304.0
  c.num_train_steps, c.warmup_steps, c.log_every = 8, 2, 1
  c.checkpoint_every, c.eval_every, c.async_checkpointing = 100, 1000, False
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


@pytest.mark.slow
def test_tiny_run_ramps_and_resumes_mid_ramp_to_the_same_losses(tmp_path, monkeypatch, capsys):
  config = tiny_ramp()
  full = train.train_and_evaluate(config, str(tmp_path / "full"))
  assert "batch-size warmup: 8 -> 24 rows, +8 every ~3 steps" in capsys.readouterr().out
  logged = full["history"]["train"]
  assert [s for s, _ in logged] == list(range(1, 9))
  assert [m["batch_size"] for _, m in logged] == [8, 8, 8, 16, 16, 16, 24, 24]
  assert full["summary"]["trained_tokens"] == (3 * 8 + 3 * 16 + 2 * 24) * 32

  # SIGTERM while stream batch 4 is read: step 4 (batches 3 and 4) -> checkpoint 4, exit.
  sigterm_testlib.sigterm_at_batch(monkeypatch, 4)
  first = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert first["stopped_early"] and first["final_step"] == 4
  manager = ckpt_lib.create_manager(str(tmp_path / "resumed"), async_save=False)
  meta = ckpt_lib.read_meta(manager, 4)
  manager.close()
  assert meta["input_position"] == 1 + 1 + 1 + 2                 # stream batches, not steps
  assert meta["batch_warmup"] == dict(min_size=8, batch_size=24, tokens=2304, seq_length=32)

  second = train.train_and_evaluate(config, str(tmp_path / "resumed"))   # from step 5, k = 2
  assert "resuming from step 4" in capsys.readouterr().out
  both = first["history"]["train"] + second["history"]["train"]
  assert [m["batch_size"] for _, m in both] == [8, 8, 8, 16, 16, 16, 24, 24]
  np.testing.assert_allclose([m["loss"] for _, m in both], [m["loss"] for _, m in logged],
                             rtol=1e-5)

  # Resuming the finished workdir with another ramp: one line, before any compute.
  with pytest.raises(train.ConfigError, match="batch-size warmup"):
    train.train_and_evaluate(tiny_ramp(num_train_steps=10, batch_size_warmup_tokens=4608.0),
                             str(tmp_path / "resumed"))
