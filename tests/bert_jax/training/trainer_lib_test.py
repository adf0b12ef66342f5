"""trainer_lib: accumulation inside the step, pre-trained loading into shardings, the timer."""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.training import input_source
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import train
from bert_jax.training import trainer_lib
from tests.bert_jax.train_test import tiny_config


def _sgd_steps(config, mesh, accum):
  """Pre-training steps with plain SGD(lr=1): one update is exactly -(the applied gradient)."""
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_dropout_prob = 0.0
  mc = train.create_model_config(config, train.load_vocab(config))
  return trainer_lib.build_steps(
      model=pretraining_heads.BertForPreTraining(mc), forward=train.forward,
      loss_fn=train.pretraining_loss, eval_fn=train.eval_metrics,
      dummy_batch=train.dummy_batch(config), tx=optax.sgd(1.0),
      schedule=optax.constant_schedule(1.0), mesh=mesh, grad_accum_steps=accum)


def test_accumulation_k_micro_batches_equals_one_batch_of_k_times_b():
  """4 micro-batches of 4 (scanned in the step, sharded over 4 devices) = one batch of 16."""
  config = tiny_config(batch_size=16)
  batch = next(input_source.synthetic_batches(batch_size=16, seq_length=32,
                                              max_predictions_per_seq=6, vocab_size=512, seed=5))
  # Equal MLM weight sums per micro-batch, so the mean of micro-batch means is the batch mean.
  batch["masked_lm_weights"][:] = 1.0
  mesh = sharding_lib.create_mesh((4, 1, 1), devices=jax.devices()[:4])
  results = []
  for accum in (1, 4):
    t = _sgd_steps(config, mesh, accum)
    with trainer_lib.mesh_rules(mesh):
      state = t.init_state(jax.random.PRNGKey(0))
      before = jax.device_get(state["params"])
      state, m = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
    grads = jax.tree.map(lambda a, b: a - b, before, jax.device_get(state["params"]))
    results.append((grads, jax.device_get(m), int(state["step"])))
  (g1, m1, s1), (g4, m4, s4) = results
  assert s1 == s4 == 1  # one optimizer step either way
  np.testing.assert_allclose(m4["loss"], m1["loss"], rtol=1e-6)
  np.testing.assert_allclose(m4["grad_norm"], m1["grad_norm"], rtol=1e-5)
  assert float(m1["grad_norm"]) > 0
  for path, a in jax.tree_util.tree_leaves_with_path(g1):
    b = g4
    for k in path:
      b = b[k.key]
    np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))


def test_dropout_key_depends_on_step_and_micro_batch():
  rng = jax.random.PRNGKey(3)
  keys = {(s, j): tuple(np.asarray(jax.random.key_data(trainer_lib.dropout_key(rng, s, j)))
                        .ravel()) for s in range(3) for j in range(2)}
  assert len(set(keys.values())) == 6


def _export(tmp_path, mc, seed=7):
  params = nn.unbox(pretraining_heads.init_params(mc, jax.random.PRNGKey(seed)))
  return ckpt_lib.save_params(str(tmp_path / "export"), params, mc), params


def test_load_pretrained_restores_into_the_target_shardings(tmp_path):
  config = tiny_config()
  mesh = sharding_lib.create_mesh((2, 4, 1))       # fsdp: parameters sharded over 4 devices
  t = train.build_training(config, train.create_model_config(config, train.load_vocab(config)),
                           mesh)
  mc = train.create_model_config(config, train.load_vocab(config))
  path, params = _export(tmp_path, mc)
  pre = trainer_lib.read_pretrained(path)
  assert pre.model_config.hidden_size == mc.hidden_size
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    fresh_nsp = jax.device_get(state["params"]["nsp_head"])
    loaded = trainer_lib.load_pretrained(state, t, pre, keys=("bert",), required=("bert",))
  # `bert` comes from the export, in the target's shardings; the other heads stay fresh.
  for (p, got), want, sh in zip(jax.tree_util.tree_leaves_with_path(loaded["params"]["bert"]),
                                jax.tree.leaves(params["bert"]),
                                jax.tree.leaves(t.param_shardings["bert"])):
    np.testing.assert_array_equal(np.asarray(got), want, err_msg=jax.tree_util.keystr(p))
    assert got.sharding == sh, jax.tree_util.keystr(p)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(loaded["params"]["nsp_head"]),
               fresh_nsp)
  assert any("fsdp" in str(x.sharding.spec) for x in jax.tree.leaves(loaded["params"]))


def test_load_pretrained_refuses_other_shapes_and_missing_keys(tmp_path):
  config = tiny_config()
  mesh = sharding_lib.create_mesh((8, 1, 1))
  mc = train.create_model_config(config, train.load_vocab(config))
  t = train.build_training(config, mc, mesh)
  other = model_lib.BertConfig(**{**mc.to_dict(), "intermediate_size": 64})
  path, _ = _export(tmp_path, other)
  pre = trainer_lib.read_pretrained(path)
  with trainer_lib.mesh_rules(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    with pytest.raises(ckpt_lib.CheckpointError, match=r"intermediate.*shape"):
      trainer_lib.load_pretrained(state, t, pre, keys=("bert",))
    with pytest.raises(trainer_lib.ConfigError, match="no 'classifier' parameters"):
      trainer_lib.load_pretrained(state, t, pre._replace(params_meta={"bert": {}}),
                                  keys=("classifier",), required=("classifier",))


def test_step_timer_excludes_the_first_step_and_paused_time(monkeypatch):
  # A clock the test moves by hand (trainer_lib reads time.perf_counter): the rate is exact,
  # whatever else the machine is doing (it once slept for real and asserted 25 < rate < 55).
  now = [100.0]
  monkeypatch.setattr(trainer_lib, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
  timer = trainer_lib.StepTimer()
  assert timer.rate() is None
  now[0] += 7.0                             # compiling
  timer.step_done(jnp.zeros(()))           # the compiling step: starts the clock
  for _ in range(4):
    now[0] += 0.02
    timer.step_done(jnp.zeros(()))
  with timer.paused():
    now[0] += 0.3                           # evaluation, a checkpoint save
  assert timer.rate() == pytest.approx(50.0)   # 4 steps in 0.08 s, not 4 in 0.38 s or 7.38 s
  assert timer.rate() is None               # reset: nothing timed since
  now[0] += 0.5
  timer.step_done(jnp.zeros(()))
  assert timer.rate() == pytest.approx(2.0)    # from the last report on: 1 step in 0.5 s


def test_both_loops_count_skips_one_step_late_and_average_the_applied_steps():
  """The loop rules train.py and finetune.py share (issue 23, point 13): guard.SkipTracker reads
  a step's skipped flag when the next step is issued (never stalling the one in flight) and at
  each log; trainer_lib.mean_of_applied leaves the skipped steps out of the logged means."""
  from bert_jax.training import guard  # pylint: disable=g-import-not-at-top
  tracker = guard.SkipTracker(max_consecutive_skips=3)
  tracker.step_done(1, 0)
  tracker.step_done(2, 1)
  assert tracker.total == 0          # step 2's flag is held while step 2 may still run
  tracker.step_done(3, 0)
  assert tracker.total == 1
  assert tracker.flush() == 1 and tracker.flush() == 1  # a log counts the held step once
  tracker.step_done(4, 1)
  tracker.step_done(5, 1)
  tracker.step_done(6, 1)            # counts step 5: two in a row
  with pytest.raises(guard.NonFiniteError, match=r"first at step 4 \(input position 3\)"):
    tracker.flush()                  # step 6: the third in a row
  host = [dict(loss=1.0, skipped=0), dict(loss=float("nan"), skipped=1), dict(loss=3.0, skipped=0)]
  assert trainer_lib.mean_of_applied(host) == {"loss": 2.0}
  assert trainer_lib.mean_of_applied([dict(loss=5.0, skipped=1), dict(loss=7.0, skipped=1)]) == {
      "loss": 6.0}                   # every step skipped: the mean of all, still logged
