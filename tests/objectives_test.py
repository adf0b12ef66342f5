"""Tests for bert_jax/objectives.py: the pre-training loss composed from its parts."""

import jax
import numpy as np
import optax
import pytest

from bert_jax import objectives


def _batch(rng, b=3, p=4, v=11):
  w = (rng.random((b, p)) < 0.7).astype(np.float32)
  return dict(masked_lm_ids=rng.integers(0, v, (b, p)).astype(np.int32), masked_lm_weights=w,
              next_sentence_labels=rng.integers(0, 2, b).astype(np.int32))


def test_bert_loss_is_google_research_berts_mlm_plus_nsp():
  rng = np.random.default_rng(0)
  batch = _batch(rng)
  mlm, nsp = rng.normal(size=(3, 4, 11)), rng.normal(size=(3, 2))
  loss, m = objectives.pretraining_loss({"mlm": mlm, "nsp": nsp}, batch)
  w = batch["masked_lm_weights"]
  ce = optax.softmax_cross_entropy_with_integer_labels(mlm, batch["masked_lm_ids"])
  mlm_loss = np.sum(ce * w) / (np.sum(w) + 1e-5)
  nsp_loss = np.mean(-jax.nn.log_softmax(nsp)[np.arange(3), batch["next_sentence_labels"]])
  np.testing.assert_allclose(loss, mlm_loss + nsp_loss, rtol=1e-6)
  np.testing.assert_allclose(m["mlm_loss"], mlm_loss, rtol=1e-6)
  np.testing.assert_allclose(m["nsp_accuracy"], np.mean(
      np.argmax(nsp, -1) == batch["next_sentence_labels"]))
  assert set(m) == {"loss", "mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy"}


def test_parts_are_named_by_objective_and_weighted():
  rng = np.random.default_rng(1)
  batch = _batch(rng)
  out = {"mlm": rng.normal(size=(3, 4, 11)), "sop": rng.normal(size=(3, 2)),
         "sbo": rng.normal(size=(3, 4, 11))}
  loss, m = objectives.pretraining_loss(out, batch)
  assert {"sop_loss", "sop_accuracy", "sbo_loss", "sbo_accuracy"} <= set(m)
  assert "nsp_loss" not in m
  np.testing.assert_allclose(loss, m["mlm_loss"] + m["sop_loss"] + m["sbo_loss"], rtol=1e-6)
  weighted, _ = objectives.pretraining_loss(out, batch, weights={"sbo": 0.5})
  np.testing.assert_allclose(weighted, m["mlm_loss"] + m["sop_loss"] + 0.5 * m["sbo_loss"],
                             rtol=1e-6)
  with pytest.raises(ValueError, match="no part for outputs \\['dae'\\]"):
    objectives.pretraining_loss({"dae": out["mlm"]}, batch)


def test_packed_sentence_loss_is_a_mean_over_instances():
  rng = np.random.default_rng(2)
  logits = rng.normal(size=(2, 3, 2))
  labels = rng.integers(0, 2, (2, 3)).astype(np.int32)
  w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  _, m = objectives.sentence("sop", logits, dict(next_sentence_labels=labels, nsp_weights=w))
  ce = -jax.nn.log_softmax(logits)[np.arange(2)[:, None], np.arange(3)[None], labels]
  np.testing.assert_allclose(m["sop_loss"], np.sum(ce * w) / 3, rtol=1e-6)
