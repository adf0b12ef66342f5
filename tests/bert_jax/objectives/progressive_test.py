"""MobileBERT's knowledge transfer (bert_jax/objectives/progressive.py, layerwise.py's distill_att_kl): the
attention KL against scipy, the progressive schedule and its one-line errors, a stage's step that
moves its layer alone (AdamW's weight decay included), and a resumed progressive run equal to an
uninterrupted one."""

import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from flax import linen as nn
from scipy import special

from bert_jax.layers import attention as attention_lib
from bert_jax.objectives import teacher as teacher_lib
from bert_jax.objectives import layerwise
from bert_jax.models import model as model_lib
from bert_jax.objectives import pretraining as objectives
from bert_jax.training import optimizer as optimizer_lib
from bert_jax.objectives import progressive
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.training import trainer_lib
from bert_jax.families.mobilebert import layers as mobilebert_layers
from tests.bert_jax.families.distilbert import distil_test
from tests.testlib import sigterm_testlib

VOCAB = distil_test.VOCAB


def test_attention_kl_is_scipy_s_kl_of_the_distributions_over_real_queries_and_keys():
  """KL(teacher || student) per head and real query row, over the real keys (scipy's rel_entr
  of the two softmaxes), the mean over real rows and heads, summed over layers; a masked key or
  a padding query changes nothing."""
  rng = np.random.default_rng(0)
  b, l, n, t = 3, 2, 2, 5
  s, tt = rng.normal(size=(b, l, n, t, t)) * 2, rng.normal(size=(b, l, n, t, t)) * 2
  mask = np.array([[1] * 5, [1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
  pairs = np.asarray(attention_lib.attention_mask(jnp.asarray(mask), False)
                     & (mask != 0)[:, None, :, None])                       # [B, 1, T, S]
  loss, m = layerwise.attention_kl("a", dict(student=s, teacher=tt, mask=pairs), {})
  want = 0.0
  for layer in range(l):
    kls = []
    for i in range(b):
      real = int(mask[i].sum())
      for h in range(n):
        for q in range(real):
          p_t = special.softmax(tt[i, layer, h, q, :real])
          p_s = special.softmax(s[i, layer, h, q, :real])
          kls.append(special.rel_entr(p_t, p_s).sum())
    want += np.mean(kls)                    # 1/(T A) sum_t sum_a KL, T pooled over the batch
  np.testing.assert_allclose(loss, want, rtol=1e-5)
  np.testing.assert_allclose(m["a_loss"], want, rtol=1e-5)
  moved = np.where(pairs[:, None], s, s - 50.0)      # masked keys and padding rows only
  np.testing.assert_allclose(
      layerwise.attention_kl("a", dict(student=moved, teacher=tt, mask=pairs), {})[0], loss,
      rtol=1e-6)
  same = layerwise.attention_kl("a", dict(student=s + 3.0, teacher=s, mask=pairs), {})[0]
  assert abs(float(same)) < 1e-6            # a shift of the scores: the same distributions
  # A stage's layer weights pick one layer's term.
  one, _ = layerwise.attention_kl("a", dict(student=s, teacher=tt, mask=pairs,
                                            layer_weights=jnp.array([0.0, 1.0])), {})
  loss1, _ = layerwise.attention_kl("a", dict(student=s[:, 1:], teacher=tt[:, 1:], mask=pairs),
                                    {})
  np.testing.assert_allclose(one, loss1, rtol=1e-6)
  assert objectives.PARTS["distill_att_kl"] is layerwise.attention_kl


def _config(**kw):
  c = ml_collections.ConfigDict(dict(num_train_steps=10, teacher_checkpoint="T"))
  layerwise.recipe_fields(c, fit_size=0)
  c.alpha_att, c.alpha_att_kl = 0.0, 1.0   # MobileBERT's recipe
  progressive.fields(c)
  for k, v in kw.items():
    setattr(c, k, v)
  return c


def test_the_schedule_is_equal_shares_or_steps_per_stage_and_bad_input_is_one_line():
  cfg = model_lib.get_bert_config("mobilebert-tiny", vocab_size=VOCAB)   # 2 layers
  assert progressive.bounds(_config(), 2) is None
  assert progressive.bounds(_config(progressive_stages=2), 2) == (0, 5, 10)
  assert progressive.bounds(_config(progressive_stages=2, num_train_steps=7), 2) == (0, 3, 7)
  assert progressive.bounds(_config(progressive_stages=2, steps_per_stage=3), 2) == (0, 3, 6)
  s = progressive.Stages((0, 3, 6), 2)
  assert [int(s.stage(jnp.int32(i))) for i in range(8)] == [0, 0, 0, 1, 1, 1, 2, 2]
  w, every = s.weights(jnp.int32(4))
  np.testing.assert_array_equal(w, [0.0, 1.0])
  assert float(every) == 0.0
  w, every = s.weights(jnp.int32(6))
  np.testing.assert_array_equal(w, [1.0, 1.0])
  assert float(every) == 1.0
  lines = progressive.describe(s, [2, 4], 10)
  assert "stage 1: steps 0-2: student layer 1 (layer_0) against teacher layer 2" in lines[1]
  assert "stage 2: steps 3-5" in lines[2] and "then steps 6-9: every layer" in lines[3]
  for kw, match in (
      (dict(progressive_stages=3), r"progressive_stages=3 but the student has 2 layers.*"
                                   r"--config.progressive_stages=2"),
      (dict(progressive_stages=2, steps_per_stage=6), r"steps_per_stage=6 x 2 stages = 12 "
                                                      r"steps.*num_train_steps=10"),
      (dict(progressive_stages=2, num_train_steps=1), r"leaves a stage no step"),
      (dict(progressive_stages=2, steps_per_stage=-1), r"config.steps_per_stage=-1"),
      (dict(progressive_stages=2, alpha_hidden=0.0, alpha_att_kl=0.0), r"alpha_hidden, alpha_att"
                                                                       r" and alpha_att_kl")):
    with pytest.raises(progressive.ConfigError, match=match):
      progressive.check(_config(**kw), cfg)
  with pytest.raises(progressive.ConfigError, match="give --config.teacher_checkpoint"):
    progressive.check(_config(progressive_stages=2), cfg, teacher_given=False)
  progressive.check(_config(), cfg, teacher_given=False)            # off: no teacher needed
  assert [progressive.layer_of(p) for p in (("bert", "layer_1", "x"), ("bert", "encoder",
                                            "layer_0", "y"), ("bert", "embeddings", "z"),
                                            ("mlm_head", "b"), ("fit_dense", "kernel"))] == [
      1, 0, progressive.OUTSIDE, progressive.OUTSIDE, progressive.ALWAYS]


def _tiny(name, **kw):
  return model_lib.get_bert_config(name, vocab_size=VOCAB, hidden_dropout_prob=0.0,
                                   attention_dropout_prob=0.0, **kw)


def _mobilebert_params(config, seed, batch):
  return nn.meta.unbox(mobilebert_layers.MobileBertForPreTraining(config).init(
      jax.random.PRNGKey(seed), batch["input_ids"], batch["input_mask"], batch["segment_ids"],
      batch["masked_lm_positions"])["params"])


def test_a_stage_moves_its_layer_alone_under_adamw_weight_decay(tmp_path):
  """mobilebert-tiny (2 layers) from an ib-bert-tiny teacher, 1 step a stage: after the stage-0
  step only layer_0 changed (embeddings, layer_1, heads bit-equal, though AdamW decays every
  matrix); after the stage-1 step only layer_1; the final-phase step moves everything. The
  embeddings are the teacher's (copied at init)."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  student, teacher_cfg = _tiny("mobilebert-tiny"), _tiny("ib-bert-tiny")
  batch = distil_test._batch(rows=8)  # pylint: disable=protected-access
  batch = dict(batch, next_sentence_labels=np.zeros((8,), np.int32))
  teacher_params = _mobilebert_params(teacher_cfg, 1, batch)
  ckpt_lib.save_params(str(tmp_path / "teacher"), teacher_params, teacher_cfg)
  config = _config(teacher_checkpoint=str(tmp_path / "teacher"), progressive_stages=2,
                   steps_per_stage=1, num_train_steps=3, seq_length=batch["input_ids"].shape[1],
                   pack=False)
  teacher = layerwise.load_teacher(config, student)
  mesh = sharding_lib.create_mesh((4, 2, 1))
  dummy = jax.tree.map(lambda x: x[:1], batch)
  fwd, w, frozen = layerwise.step_parts(config, student, teacher, dummy, mesh,
                                        sharding_lib.LOGICAL_AXIS_RULES)
  assert fwd.stages == progressive.Stages((0, 1, 2), 2)
  loss_fn = lambda out, b: objectives.pretraining_loss(out, b, w)  # noqa: E731
  tx, schedule = optimizer_lib.create_optimizer(learning_rate=1e-2, warmup_steps=0,
                                                num_train_steps=3, weight_decay=0.1)
  steps = trainer_lib.build_steps(
      model=mobilebert_layers.MobileBertForPreTraining(student), forward=fwd, loss_fn=loss_fn,
      eval_fn=lambda out, b: loss_fn(out, b)[1], dummy_batch=dummy, tx=tx, schedule=schedule,
      mesh=mesh, frozen=frozen)
  flat = lambda s: _flatten(jax.device_get(s["params"]))  # noqa: E731
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(0))
    state = layerwise.init_from_teacher(state, steps, config, teacher, student.num_layers)
    snaps = [flat(state)]
    history = []
    for _ in range(3):
      state, metrics = steps.train_step(state, batch)
      snaps.append(flat(state))
      history.append(jax.device_get(metrics))
  # The teacher's embeddings (from the frozen step argument) and heads (from its checkpoint).
  t_flat = _flatten({"bert": {"embeddings": teacher_params["bert"]["embeddings"]},
                     "mlm_head": teacher_params["mlm_head"],
                     "nsp_head": teacher_params["nsp_head"]})
  assert len(t_flat) == 15
  for k, v in t_flat.items():
    np.testing.assert_array_equal(snaps[0][k], v)
  def changed(a, b):
    return sorted({_group(k) for k in a if not np.array_equal(a[k], b[k])})
  assert changed(snaps[0], snaps[1]) == ["bert/layer_0"]
  assert changed(snaps[1], snaps[2]) == ["bert/layer_1"]
  assert set(changed(snaps[2], snaps[3])) >= {"bert/embeddings", "bert/layer_0", "bert/layer_1",
                                              "mlm_head"}
  # Stage losses are the stage's layer's: the embeddings' part weighs 0 until the final phase.
  assert history[0]["distill_emb_loss"] == 0.0 and history[2]["distill_emb_loss"] > 0.0
  assert history[0]["distill_att_kl_loss"] > 0 and history[0]["distill_hidden_loss"] > 0


def _flatten(tree):
  from flax import traverse_util  # pylint: disable=g-import-not-at-top
  return {"/".join(k): np.asarray(v) for k, v in traverse_util.flatten_dict(tree).items()}


def _group(key):
  parts = key.split("/")
  return "/".join(parts[:2]) if parts[0] == "bert" else parts[0]


@pytest.mark.slow
def test_a_progressive_run_preempted_mid_stage_resumes_exactly(tmp_path, monkeypatch):
  """python -m bert_jax.train's loop: mobilebert-tiny from an ib-bert-tiny teacher, 2 stages of 3
  steps then 2 of every layer; SIGTERMed in stage 2 (after 5 steps) and resumed, it logs the
  losses of an uninterrupted run."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  teacher_cfg = model_lib.get_bert_config("ib-bert-tiny", vocab_size=128)
  dummy = distil_test._batch(rows=1)  # pylint: disable=protected-access
  teacher = ckpt_lib.save_params(str(tmp_path / "teacher"),
                                 _mobilebert_params(teacher_cfg, 1, dummy), teacher_cfg)
  c = distil_test._train_config(  # pylint: disable=protected-access
      "mobilebert-tiny", teacher_checkpoint=teacher, num_train_steps=8, progressive_stages=2,
      steps_per_stage=3, checkpoint_every=2)
  full = train.train_and_evaluate(c, str(tmp_path / "full"))
  # Batch 4 is the fifth step's (train.py peeks at batches 0-3 first: distil_test's resume test):
  # the run stops after steps 0-4, stage 2 being steps 3-5.
  first, second = sigterm_testlib.preempted_and_resumed(
      monkeypatch, 4, lambda: train.train_and_evaluate(c, str(tmp_path / "resumed")))
  assert len(first["history"]["train"]) == 5          # steps 0-4: stopped inside stage 2
  sigterm_testlib.assert_same_losses([first, second], full)
  kl = [m["distill_att_kl_loss"] for _, m in full["history"]["train"]]
  assert len(kl) == 8 and all(np.isfinite(kl))


def test_train_refuses_a_progressive_schedule_that_cannot_run_before_compute(tmp_path):
  """train.validate_inputs (before the input and the model): a progressive run without a teacher,
  or with a stage count that is not the student's depth, is one line naming the field."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  teacher_cfg = model_lib.get_bert_config("ib-bert-tiny", vocab_size=128)
  dummy = distil_test._batch(rows=1)  # pylint: disable=protected-access
  teacher = ckpt_lib.save_params(str(tmp_path / "teacher"),
                                 _mobilebert_params(teacher_cfg, 1, dummy), teacher_cfg)
  config = functools.partial(distil_test._train_config,  # pylint: disable=protected-access
                             "mobilebert-tiny")
  with pytest.raises(train.ConfigError, match=r"^config.progressive_stages=2: .*give --config."
                                              r"teacher_checkpoint=TEACHER"):
    train.validate_inputs(config(progressive_stages=2), str(tmp_path / "a"))
  with pytest.raises(train.ConfigError, match=r"progressive_stages=4 but the student has 2"):
    train.validate_inputs(config(progressive_stages=4, teacher_checkpoint=teacher),
                          str(tmp_path / "b"))
  with pytest.raises(train.ConfigError, match=r"steps_per_stage=3 x 2 stages = 6 steps"):
    train.validate_inputs(config(progressive_stages=2, steps_per_stage=3, teacher_checkpoint=
                                 teacher), str(tmp_path / "c"))


def test_a_resume_keeps_its_stages_or_is_one_line_naming_both():
  """The stages are recorded with the teacher; equal shares move with num_train_steps, so a
  resume that would move them is refused, naming steps_per_stage as the fix."""
  cfg = model_lib.get_bert_config("mobilebert-tiny", vocab_size=VOCAB)
  teacher = lambda c: teacher_lib.Teacher(  # noqa: E731
      "T", None, None, progressive.with_stages({"path": "T", "sha256": "0" * 64}, c, cfg))
  was = teacher(_config(progressive_stages=2, num_train_steps=60))
  assert was.record["progressive_bounds"] == [0, 30, 60]
  meta = {"teacher": was.record}
  progressive.check_resume(meta, was, "wd")
  progressive.check_resume(meta, teacher(_config(progressive_stages=2, steps_per_stage=30,
                                                 num_train_steps=120)), "wd")   # the same stages
  with pytest.raises(progressive.ConfigError, match=r"--workdir=wd was trained with stages "
                     r"starting at steps 0, 30 \(every layer from step 60\) but this run gives "
                     r"stages starting at steps 0, 60 .*--config.steps_per_stage=30 keeps them"):
    progressive.check_resume(meta, teacher(_config(progressive_stages=2, num_train_steps=120)),
                             "wd")
  with pytest.raises(progressive.ConfigError, match="gives no progressive stages"):
    progressive.check_resume(meta, teacher(_config()), "wd")
  assert "progressive_bounds" not in teacher(_config()).record


def test_a_teacher_s_flops_are_its_own_family_s_count():
  """A BERT teacher of a MobileBERT student: the step's FLOPs add the teacher's forward as BERT
  counts it (was: MobileBERT's count of a BertConfig, an AttributeError on true_hidden_size in
  train.step_flops, after the first error's advice --config.fit_size was followed)."""
  from bert_jax import families  # pylint: disable=g-import-not-at-top
  student, teacher = _tiny("mobilebert-tiny"), _tiny("tiny")
  mobilebert, bert = families.get("mobilebert"), families.get("bert")
  got = mobilebert.flops_per_sequence(student, 32, 5, 1, teacher)
  assert got == (mobilebert.flops_per_sequence(student, 32, 5, 0)
                 + bert.flops_per_sequence(teacher, 32, 5, 0) // 3)
  ib = _tiny("ib-bert-tiny")   # an IB-BERT teacher: MobileBERT's own count, as before
  assert mobilebert.flops_per_sequence(student, 32, 5, 1, ib) == (
      mobilebert.flops_per_sequence(student, 32, 5, 0)
      + mobilebert.flops_per_sequence(ib, 32, 5, 0) // 3)


@pytest.mark.slow
def test_a_progressive_run_from_a_plain_bert_teacher_follows_each_error_s_advice_and_trains(
    tmp_path, capsys):
  """mobilebert-tiny (64 wide) progressively from a BERT-tiny teacher (128 wide, not an IB-BERT):
  the first run's one line names --config.fit_size=128; the run with it trains both stages (was:
  a 44-line AttributeError in mobilebert.network_flops on the teacher's BertConfig)."""
  import re  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  teacher_cfg = model_lib.get_bert_config("tiny", vocab_size=128)
  teacher = ckpt_lib.save_params(str(tmp_path / "teacher"), nn.meta.unbox(
      pretraining_heads.init_params(teacher_cfg, jax.random.PRNGKey(1))), teacher_cfg)
  c = distil_test._train_config(  # pylint: disable=protected-access
      "mobilebert-tiny", teacher_checkpoint=teacher, progressive_stages=2, num_train_steps=4)
  runs = 0
  while True:   # each error's advice, applied, until the run trains
    runs += 1
    assert runs <= 3
    try:
      result = train.train_and_evaluate(c, str(tmp_path / f"run{runs}"))
      break
    except train.ConfigError as e:
      assert "\n" not in str(e)
      fix = re.findall(r"--config\.(\w+)=(\d+)", str(e))
      assert fix, str(e)
      for field, value in fix[:1]:
        setattr(c, field, int(value))
  assert runs == 2 and c.fit_size == 128
  history = result["history"]["train"]
  assert [s for s, _ in history] == [1, 2, 3, 4]
  assert all(np.isfinite(m["distill_hidden_loss"]) and np.isfinite(m["distill_att_kl_loss"])
             for _, m in history)
  # Nothing of a BERT's embeddings or heads fits MobileBERT's: with equal shares (no steps after
  # the stages) they would never train, and the start-up says so with the field that fixes it.
  out = capsys.readouterr().out
  assert "progressive transfer: 0 embedding and head parameters copied from the teacher" in out
  note = next(l for l in out.splitlines() if l.startswith("note: those "))
  assert "the 2 stages take all 4 steps; give --config.steps_per_stage=S with 2 x S < 4" in note
  # ... and with it, the steps after the stages train every parameter: the embeddings move.
  c.steps_per_stage = 1
  train.train_and_evaluate(c, str(tmp_path / "run3"))
  out = capsys.readouterr().out
  assert "then steps 2-3: every layer, the whole objective" in out and "note: those" not in out
  first, last = (ckpt_lib.load_params(str(tmp_path / "run3" / "checkpoints" / str(s)))[0]
                 for s in (2, 4))
  moved = lambda t: np.abs(np.asarray(last["bert"]["embeddings"][t]["embedding"])  # noqa: E731
                           - np.asarray(first["bert"]["embeddings"][t]["embedding"])).max()
  assert moved("word_embeddings") > 0
