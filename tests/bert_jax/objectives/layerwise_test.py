"""Layer-wise distillation (bert_jax/objectives/layerwise.py): the encoder's attention scores on request,
the layer map, the loss parts, the start-up checks, and one student step against a teacher."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import linen as nn

from bert_jax.layers import attention as attention_lib
from bert_jax.objectives import layerwise
from bert_jax.models import model as model_lib
from bert_jax.objectives import pretraining as objectives
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.training import trainer_lib
from tests.bert_jax.families.distilbert import distil_test


def _qkv(seed=0, b=2, t=8, n=2, d=4):
  ks = jax.random.split(jax.random.PRNGKey(seed), 3)
  return [jax.random.normal(k, (b, t, n, d), jnp.float32) for k in ks]


@pytest.mark.parametrize("packed", [False, True])
def test_scored_attention_is_the_xla_path_plus_its_scores(packed):
  q, k, v = _qkv()
  ids = (jnp.array([[1, 1, 2, 2, 2, 0, 0, 0], [1, 1, 1, 1, 1, 1, 2, 2]]) if packed else
         jnp.array([[1] * 8, [1] * 5 + [0] * 3]))
  ctx, scores = attention_lib.scored_attention(q, k, v, ids, packed=packed)
  want = attention_lib.xla_attention(q, k, v, ids, packed=packed)
  real = (ids > 0)[:, :, None, None]
  np.testing.assert_allclose(np.where(real, ctx, 0), np.where(real, want, 0), atol=1e-5)
  np.testing.assert_allclose(scores, jnp.einsum("BTND,BSND->BNTS", q, k) / 2.0, atol=1e-5)
  # With dropout: the same probabilities dropped as xla_attention's own dropout path.
  rng = jax.random.PRNGKey(3)
  ctx_d, _ = attention_lib.scored_attention(q, k, v, ids, packed=packed, dropout_rate=0.5,
                                            dropout_rng=rng)
  want_d = attention_lib.xla_attention(q, k, v, ids, packed=packed, dropout_rate=0.5,
                                       dropout_rng=rng)
  np.testing.assert_allclose(ctx_d, want_d, atol=1e-5)


def test_encoder_gives_scores_only_when_asked():
  """Default apply: no scores collection, the same outputs; init never sows them."""
  c = model_lib.get_bert_config("tiny", vocab_size=50)
  m = model_lib.BertModel(c)
  ids = jnp.ones((2, 8), jnp.int32)
  mask = jnp.array([[1] * 8, [1] * 5 + [0] * 3])
  variables = m.init(jax.random.PRNGKey(0), ids, mask, ids * 0)
  assert set(variables) == {"params"}
  plain = m.apply(variables, ids, mask, ids * 0)
  scored, state = m.apply(variables, ids, mask, ids * 0, mutable=["attention_scores"])
  # The same math; XLA compiles the two programs (one sows the scores) separately and may fuse
  # them differently: 4.8e-7 apart on the 2-core CPU box (2026-11-29), bit-equal elsewhere.
  np.testing.assert_allclose(plain["sequence_output"], scored["sequence_output"], rtol=1e-6,
                             atol=1e-6)
  layers = state["attention_scores"]["encoder"]
  assert sorted(layers) == [f"layer_{i}" for i in range(c.num_layers)]
  (s0,) = layers["layer_0"]["attention"]["scores"]
  assert s0.shape == (2, c.num_heads, 8, 8) and s0.dtype == jnp.float32


# ----------------------------------------------------------------------------------------------
# The layer map, the checks, the loss parts.
# ----------------------------------------------------------------------------------------------
VOCAB = distil_test.VOCAB   # 99: the batches below are distil_test's


def ml_dict(**kw):
  """A pretrain-like ConfigDict with the layer-wise fields (TinyBERT's recipe values)."""
  c = ml_collections.ConfigDict(dict(model_name="tinybert-4l-312", teacher_checkpoint="",
                                     seq_length=16, pack=False))
  layerwise.recipe_fields(c, fit_size=128)
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_uniform_layer_map_is_tinybert_g_and_any_map_is_checked():
  c = ml_dict()
  assert layerwise.layer_map(c, 12, 4) == [3, 6, 9, 12]      # g(m) = m x N / M
  assert layerwise.layer_map(c, 12, 6) == [2, 4, 6, 8, 10, 12]
  assert layerwise.layer_map(ml_dict(layer_map="1,2,3,12"), 12, 4) == [1, 2, 3, 12]
  for bad in ("1,2,3,13", "0,2,3,4", "1,2,3", "a,b"):
    with pytest.raises(layerwise.ConfigError, match="config.layer_map"):
      layerwise.layer_map(ml_dict(layer_map=bad), 12, 4)
  with pytest.raises(layerwise.ConfigError, match=r"teacher layers \[0, 1, 1, 2\]"):
    layerwise.layer_map(c, 2, 4)                                # deeper student than teacher


def test_teacher_checks_name_the_map_the_projection_the_vocab_and_the_heads():
  teacher = model_lib.get_bert_config("tiny", vocab_size=VOCAB)            # 2 x 128, 2 heads
  student = model_lib.get_bert_config("tinybert-4l-312", vocab_size=VOCAB, num_layers=2,
                                      hidden_size=64, num_heads=2, intermediate_size=100)
  where = "config.teacher_checkpoint=T"
  layerwise.check_teacher_config(ml_dict(), teacher, student, where)        # fit_size 128: ok
  with pytest.raises(layerwise.ConfigError, match="set --config.fit_size=128"):
    layerwise.check_teacher_config(ml_dict(fit_size=0), teacher, student, where)
  with pytest.raises(layerwise.ConfigError, match="config.fit_size=768.*--config.fit_size=128"):
    layerwise.check_teacher_config(ml_dict(fit_size=768), teacher, student, where)
  with pytest.raises(layerwise.ConfigError, match="layer_map"):
    layerwise.check_teacher_config(ml_dict(layer_map="1,3"), teacher, student, where)
  with pytest.raises(layerwise.ConfigError, match="vocabulary of 100 tokens and the student 99"):
    layerwise.check_teacher_config(ml_dict(), dataclasses.replace(teacher, vocab_size=100),
                                   student, where)
  # A layer-wise student teaches in turn; ELECTRA's discriminator does not.
  layerwise.check_teacher_config(ml_dict(), dataclasses.replace(student, hidden_size=128),
                                 student, where)
  with pytest.raises(layerwise.ConfigError, match="is a electra model"):
    layerwise.check_teacher_config(
        ml_dict(), model_lib.get_bert_config("electra-tiny", vocab_size=VOCAB), student, where)
  four_heads = dataclasses.replace(student, num_heads=4)
  with pytest.raises(layerwise.ConfigError, match="2 heads and the student 4"):
    layerwise.check_teacher_config(ml_dict(), teacher, four_heads, where)
  layerwise.check_teacher_config(ml_dict(alpha_att=0.0), teacher, four_heads, where)
  with pytest.raises(layerwise.ConfigError, match="all 0"):
    layerwise.weights(ml_dict(alpha_emb=0.0, alpha_hidden=0.0, alpha_att=0.0))
  with pytest.raises(layerwise.ConfigError, match="alpha_hidden=-1"):
    layerwise.weights(ml_dict(alpha_hidden=-1.0))


def test_a_fused_kernel_is_named_when_the_scores_are_distilled():
  """cuDNN on a GPU (requested, or auto's pick) cannot give the scores: one line naming it;
  xla passes; without score distillation (alpha_att=0) the fused kernel is fine."""
  gpu = dict(platform_name="gpu")
  student = model_lib.get_bert_config("tiny", vocab_size=VOCAB, dtype="bfloat16",
                                      attention_dropout_prob=0.0)
  for kernel, how in (("cudnn", "requested"), ("auto", "auto's choice on gpu")):
    with pytest.raises(layerwise.ConfigError, match=f"fused cudnn kernel \\({how}\\) never"):
      layerwise.check_kernels(ml_dict(), dataclasses.replace(student, attention=kernel), **gpu)
  layerwise.check_kernels(ml_dict(), dataclasses.replace(student, attention="xla"), **gpu)
  layerwise.check_kernels(ml_dict(alpha_att=0.0), dataclasses.replace(student, attention="cudnn"),
                          **gpu)
  # The attention KL (MobileBERT's) reads the same scores: the same line, naming its field.
  with pytest.raises(layerwise.ConfigError, match=r"config.alpha_att_kl=1.0: .*fused cudnn.*"
                                                  r"--config.alpha_att_kl=0"):
    layerwise.check_kernels(ml_dict(alpha_att=0.0, alpha_att_kl=1.0),
                            dataclasses.replace(student, attention="cudnn"), **gpu)


def test_loss_parts_are_tinybert_mse_and_soft_cross_entropy_over_real_positions():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(3, 2, 4, 5)), rng.normal(size=(3, 2, 4, 5))        # [B, L, T, F]
  mask = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
  loss, _ = layerwise.layer_mse("h", dict(student=s, teacher=t, mask=mask), {})
  want = sum(((s[:, l] - t[:, l]) ** 2)[mask > 0].mean() for l in range(2))
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  # Scores: a masked key or padding query changes nothing.
  sa, ta = rng.normal(size=(3, 2, 2, 4, 4)), rng.normal(size=(3, 2, 2, 4, 4))   # [B, L, N, T, S]
  pairs = np.asarray(attention_lib.attention_mask(jnp.asarray(mask), False)
                     & (mask != 0)[:, None, :, None])                        # [B, 1, T, S]
  loss_a, _ = layerwise.score_mse("a", dict(student=sa, teacher=ta, mask=pairs), {})
  sb = np.where(pairs[:, None], sa, sa + 100.0)
  np.testing.assert_allclose(layerwise.score_mse("a", dict(student=sb, teacher=ta, mask=pairs),
                                                 {})[0], loss_a, rtol=1e-6)
  full = np.broadcast_to(pairs[:, None], sa.shape)
  want_a = sum(((sa[:, l] - ta[:, l]) ** 2)[full[:, l]].mean() for l in range(2))
  np.testing.assert_allclose(loss_a, want_a, rtol=1e-5)
  # Prediction layer: TinyBERT's soft_cross_entropy(z_s / T, z_t / T), no T^2.
  zs, zt = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
  w = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
  loss_p, m = layerwise.soft_cross_entropy(
      "p", dict(student=zs, teacher=zt, temperature=2.0), {"masked_lm_weights": w})
  ce = -(jax.nn.softmax(zt / 2, -1) * jax.nn.log_softmax(zs / 2, -1)).sum(-1)
  np.testing.assert_allclose(loss_p, (ce * w).sum() / w.sum(), rtol=1e-4)
  assert {"p_loss", "p_accuracy"} <= set(m)
  assert objectives.PARTS["distill_att"] is layerwise.score_mse


# ----------------------------------------------------------------------------------------------
# The student and the frozen teacher in one step.
# ----------------------------------------------------------------------------------------------
_batch = distil_test._batch   # a padded MLM batch of ids below VOCAB


def _init(config, seed, batch, **kw):
  return nn.meta.unbox(layerwise.LayerwiseModel(config).init(
      jax.random.PRNGKey(seed), batch, True, method=functools.partial(
          layerwise._run, scores=False, **kw))["params"])


def test_a_student_equal_to_its_teacher_has_zero_distillation_loss():
  """The same network and parameters on both sides, the identity map, no projection: every
  layer-wise part is 0 (and not 0 once the student's parameters move)."""
  c = model_lib.get_bert_config("tiny", vocab_size=VOCAB, objectives="mlm",
                                hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  batch = _batch(rows=4)
  params = _init(c, 0, batch)
  config = ml_dict(fit_size=0, alpha_pred=1.0)
  w = layerwise.weights(config)
  parts = tuple(p for p, v in w.items() if v > 0)
  model = layerwise.LayerwiseModel(c)
  fwd = functools.partial(layerwise.forward, fit_size=0, parts=parts, temperature=1.0)

  def losses(student_params):
    b = dict(batch, **layerwise.teacher_outputs(model, params, batch, layers=[1, 2], scores=True))
    out = model.apply({"params": student_params}, b, True, method=fwd)
    return objectives.pretraining_loss(out, b, w)[1]

  same = losses(params)
  for part in ("distill_emb", "distill_hidden", "distill_att"):
    assert float(same[f"{part}_loss"]) < 1e-10, (part, same)
  assert float(same["distill_pred_accuracy"]) > 0.99
  moved = losses(jax.tree.map(lambda x: x * 1.1, params))
  for part in ("distill_emb", "distill_hidden", "distill_att"):
    assert float(moved[f"{part}_loss"]) > 1e-4, (part, moved)


@pytest.mark.slow
def test_the_step_trains_student_and_projection_with_the_teacher_frozen(tmp_path):
  """trainer_lib.build_steps with layerwise.step_parts: the teacher's parameters are an argument
  of the jitted step (sharded as the student's), the state holds the student and fit_dense, the
  teacher stays bit-equal, every part's loss falls."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  teacher_config = model_lib.get_bert_config("tiny", vocab_size=VOCAB, objectives="mlm")
  student_config = model_lib.get_bert_config(
      "tinybert-4l-312", vocab_size=VOCAB, num_layers=1, hidden_size=64, num_heads=2,
      intermediate_size=100, hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  batch = _batch(rows=8)
  ckpt_lib.save_params(str(tmp_path / "teacher"), _init(teacher_config, 1, batch),
                       teacher_config)
  config = ml_dict(teacher_checkpoint=str(tmp_path / "teacher"), alpha_pred=1.0)
  teacher = layerwise.load_teacher(config, student_config)
  mesh = sharding_lib.create_mesh((4, 2, 1))
  dummy = jax.tree.map(lambda x: x[:1], batch)
  fwd, w, frozen = layerwise.step_parts(config, student_config, teacher, dummy, mesh,
                                        sharding_lib.LOGICAL_AXIS_RULES)
  loss_fn = lambda out, b: objectives.pretraining_loss(out, b, w)  # noqa: E731
  steps = trainer_lib.build_steps(
      model=layerwise.LayerwiseModel(student_config), forward=fwd, loss_fn=loss_fn,
      eval_fn=lambda out, b: loss_fn(out, b)[1], dummy_batch=dummy, tx=optax.adam(3e-3),
      schedule=optax.constant_schedule(3e-3), mesh=mesh, frozen=frozen)
  before = jax.device_get(frozen.params)
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(0))
    history = []
    for _ in range(6):
      state, metrics = steps.train_step(state, batch)
      history.append(jax.device_get(metrics))
  assert set(state["params"]) == {"bert", "mlm_head", "fit_dense"}
  assert state["params"]["fit_dense"]["kernel"].shape == (64, 128)   # W_h [H_s, H_t]
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(frozen.params))):
    np.testing.assert_array_equal(a, b)
  first, last = history[0], history[-1]
  for part in ("distill_emb", "distill_hidden", "distill_pred"):
    assert last[f"{part}_loss"] < first[f"{part}_loss"], (part, first, last)
  assert last["loss"] < first["loss"] and last["distill_att_loss"] > 0


# ----------------------------------------------------------------------------------------------
# DistilBERT: a weight setting of the same parts (issue 41 item 1).
# ----------------------------------------------------------------------------------------------
def _distilbert_config(**kw):
  from bert_jax.configs import pretrain  # pylint: disable=g-import-not-at-top
  c = pretrain.get_config("distilbert-tiny")
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_distilbert_recipe_is_weights_of_the_shared_parts_over_its_copy_map():
  c = _distilbert_config()
  assert {k: v for k, v in layerwise.weights(c).items() if v} == {
      "distill_ce": 5.0, "distill_cos": 1.0, "mlm": 2.0}
  assert (c.temperature, c.fit_size, c.layer_map) == (2.0, 0, "")
  # Student layer m against the output of the teacher layer it was copied from (0-based + 1).
  assert layerwise.layer_map(c, 4, 2) == [1, 3]
  assert layerwise.layer_map(_distilbert_config(teacher_layers="0,3"), 4, 2) == [1, 4]
  assert layerwise.layer_map(_distilbert_config(layer_map="2,4"), 4, 2) == [2, 4]
  with pytest.raises(layerwise.ConfigError, match="give 2 numbers below 4"):
    layerwise.layer_map(_distilbert_config(teacher_layers="0,4"), 4, 2)
  # MLM alone distils nothing: the teacher would run for nothing (one line, as every 0).
  with pytest.raises(layerwise.ConfigError, match="all 0: the student would learn nothing"):
    layerwise.weights(_distilbert_config(alpha_ce=0.0, alpha_cos=0.0))
  # TinyBERT's fields now carry the DistilBERT parts, off.
  assert (ml_dict().alpha_ce, ml_dict().alpha_cos) == (0.0, 0.0)


def test_a_distilbert_student_takes_the_layer_parts_and_a_narrow_student_the_cosine():
  """A distilbert-* student (BertForPreTraining) equal to its teacher, identity map: every part,
  the layer-wise ones added, is 0 (and not once it moves); a TinyBERT student 64 wide against a
  128-wide teacher gets distill_cos through fit_dense."""
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  c = model_lib.get_bert_config("distilbert-tiny", vocab_size=VOCAB, num_layers=2,
                                hidden_dropout_prob=0.0, attention_dropout_prob=0.0)
  batch = _batch(rows=4)
  params = _init(c, 0, batch)      # LayerwiseModel's tree: bert + mlm_head, as the student's
  config = _distilbert_config(layer_map="1,2", alpha_emb=1.0, alpha_hidden=1.0, alpha_att=1.0,
                              alpha_pred=1.0)
  w = layerwise.weights(config)
  teacher, student = layerwise.LayerwiseModel(c), pretraining_heads.BertForPreTraining(c)
  fwd = layerwise.student_forward(config)

  def losses(student_params):
    b = dict(batch, **layerwise.teacher_outputs(teacher, params, batch, layers=[1, 2],
                                                scores=True))
    out = student.apply({"params": student_params}, b, True, method=fwd)
    return objectives.pretraining_loss(out, b, w)[1]

  same = losses(params)
  for part in ("distill_emb", "distill_hidden", "distill_att", "distill_ce", "distill_cos"):
    assert abs(float(same[f"{part}_loss"])) < 1e-6, (part, same)
  assert float(same["distill_pred_accuracy"]) > 0.99
  moved = losses(jax.tree.map(lambda x: x * 1.1, params))
  for part in ("distill_emb", "distill_hidden", "distill_att", "distill_ce", "distill_cos"):
    assert float(moved[f"{part}_loss"]) > 1e-5, (part, moved)   # cos: 9.3e-5 (x 1.1 keeps
  # the directions nearly: LayerNorm)
  # A narrow student: its last hidden states through W_h [64, 128] against the teacher's.
  narrow = model_lib.get_bert_config("tinybert-tiny", vocab_size=VOCAB)        # 1 x 64
  config = ml_dict(alpha_cos=1.0)                                                # fit_size 128
  sp = _init(narrow, 1, batch, fit_size=128)
  b = dict(batch, **layerwise.teacher_outputs(teacher, params, batch, layers=[2], scores=True))
  out = layerwise.LayerwiseModel(narrow).apply({"params": sp}, b, True,
                                               method=layerwise.student_forward(config))
  assert out["distill_cos"]["student"].shape == b["teacher_last"].shape == (4, 16, 128)
  metrics = objectives.pretraining_loss(out, b, layerwise.weights(config))[1]
  assert 0 < float(metrics["distill_cos_loss"]) < 2


def test_distilbert_loads_the_teacher_head_its_student_starts_from_even_without_the_kl():
  """alpha_ce = 0 reads no teacher logits, but teacher.init_student copies the teacher's MLM
  head: the distilbert family's step loads it (teacher_head), the shared step alone does not."""
  from bert_jax.families.distilbert import distil  # pylint: disable=g-import-not-at-top
  from bert_jax.objectives import teacher as teacher_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  c = _distilbert_config(alpha_ce=0.0)
  mc = model_lib.get_bert_config("distilbert-tiny", vocab_size=VOCAB)
  teacher = distil.planning_teacher(c, mc)           # the tiny preset's shapes, nothing read
  mesh = sharding_lib.create_mesh((8, 1, 1))
  dummy = jax.tree.map(lambda x: x[:1], _batch())
  rules = sharding_lib.LOGICAL_AXIS_RULES
  _, w, frozen = families.get("distilbert").step_parts(c, mc, teacher, dummy, mesh, rules)
  assert w["distill_ce"] == 0 and set(frozen.params) == {"bert", "mlm_head"}
  _, _, frozen = layerwise.step_parts(c, mc, teacher, dummy, mesh, rules)
  assert set(frozen.params) == {"bert"}
