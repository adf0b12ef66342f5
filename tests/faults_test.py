"""The non-finite guard: a NaN/Inf step leaves parameters and optimizer state unchanged bit for bit,
is counted, and too many in a row stop the run with one line naming the step and input position."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bert_jax import guard


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
  from data_pipelines import build_vocab
  (tmp_path / "corpus.txt").write_text("some words here\n" * 10)
  (tmp_path / "file").write_text("x")        # a path under a file: unwritable even for root

  def must_not_run(*args, **kwargs):
    raise AssertionError("the corpus was read before the output was checked")
  monkeypatch.setattr(build_vocab, "corpus_paths", must_not_run)
  with pytest.raises(build_vocab.BuildVocabError, match="--output=.*cannot be written"):
    build_vocab.build(str(tmp_path / "corpus.txt"), 100, str(tmp_path / "file" / "vocab.txt"))
