"""Tests for DistilBERT (bert_jax/families/distilbert/distil.py, model.py's family "distilbert", objectives.py's
distill_ce / distill_cos parts and trainer_lib's frozen network) on tiny configs (CPU)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests.testlib import sigterm_testlib
from tests.testlib import xla_test_flags
from flax import linen as nn

from bert_jax.families.distilbert import distil
from bert_jax.objectives import teacher as teacher_lib
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads
from bert_jax.objectives import pretraining as objectives
from bert_jax.parallel import sharding as sharding_lib
from bert_jax.training import trainer_lib

VOCAB = 99


def ml_dict(**kw):
  """A pretrain-like ConfigDict with the distillation fields (distil.py reads them)."""
  import ml_collections  # pylint: disable=g-import-not-at-top
  return ml_collections.ConfigDict(dict(dict(
      model_name="distilbert-tiny", teacher_checkpoint="", teacher_layers="", alpha_ce=5.0,
      alpha_mlm=2.0, alpha_cos=1.0, temperature=2.0), **kw))


# ----------------------------------------------------------------------------------------------
# The model.
# ----------------------------------------------------------------------------------------------
# transformers 5.23 DistilBertModel / DistilBertForMaskedLM of DistilBertConfig() (30,522 vocab,
# 6 x 768, 12 heads, 3072 FFN), rebuilt by the test below.
BASE_COUNTS = (66_362_880, 66_985_530)


@pytest.mark.parametrize("name", ["distilbert-tiny", "distilbert-mini", "distilbert-base"])
def test_param_counts_equal_transformers_distilbert(name):
  torch = pytest.importorskip("torch")
  transformers = pytest.importorskip("transformers")
  c = model_lib.get_bert_config(name)
  abstract = jax.eval_shape(lambda r: pretraining_heads.init_params(c, r), jax.random.PRNGKey(0))
  ours = (model_lib.count_params(abstract["bert"]), model_lib.count_params(abstract))
  with torch.device("meta"):   # shapes only
    hc = transformers.DistilBertConfig(vocab_size=c.vocab_size, dim=c.hidden_size,
                                       n_layers=c.num_layers, n_heads=c.num_heads,
                                       hidden_dim=c.intermediate_size,
                                       max_position_embeddings=c.max_position_embeddings)
    hf = tuple(sum(p.numel() for p in cls(hc).parameters())   # the tied decoder counted once
               for cls in (transformers.DistilBertModel, transformers.DistilBertForMaskedLM))
  assert ours == hf
  if name == "distilbert-base":
    assert ours == BASE_COUNTS
    assert (c.num_layers, c.hidden_size, c.num_heads, c.vocab_size) == (6, 768, 12, 30522)


def test_distilbert_has_no_token_types_and_no_pooler():
  c = model_lib.get_bert_config("distilbert-tiny", vocab_size=VOCAB, max_position_embeddings=32)
  params = nn.meta.unbox(pretraining_heads.init_params(c, jax.random.PRNGKey(0)))
  assert set(params) == {"bert", "mlm_head"} and set(params["bert"]) == {"embeddings", "encoder"}
  assert set(params["bert"]["embeddings"]) == {"word_embeddings", "position_embeddings",
                                               "layer_norm"}
  assert c.to_dict()["family"] == "distilbert" and c.to_dict()["type_vocab_size"] == 0
  assert model_lib.BertConfig.from_dict(c.to_dict()) == c
  ids = jnp.arange(5, 13)[None]
  model = pretraining_heads.BertForPreTraining(c)
  a = model.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids),
                  jnp.array([[1, 2]]))
  b = model.apply({"params": params}, ids, jnp.ones_like(ids), jnp.ones_like(ids),
                  jnp.array([[1, 2]]))
  np.testing.assert_array_equal(a[0], b[0])   # segment ids are ignored
  assert a[1] is None
  out = model_lib.BertModel(c).apply({"params": params["bert"]}, ids, jnp.ones_like(ids),
                                     jnp.zeros_like(ids))
  assert out["pooled_output"] is None    # the [CLS] state a classifier head reads instead:
  np.testing.assert_array_equal(out["cls_output"], out["sequence_output"][:, 0])
  with pytest.raises(ValueError, match="DistilBERT has no token types"):
    model_lib.get_bert_config("distilbert-tiny", type_vocab_size=2)
  with pytest.raises(ValueError, match="BERT has token types.*DistilBERT.* has no token types"):
    model_lib.get_bert_config("tiny", type_vocab_size=0)
  with pytest.raises(ValueError, match="DistilBERT is exactly 'mlm'"):
    model_lib.get_bert_config("distilbert-tiny", objectives="mlm,nsp")


# ----------------------------------------------------------------------------------------------
# The student's init from a teacher.
# ----------------------------------------------------------------------------------------------
TEACHER = model_lib.get_bert_config("tiny", vocab_size=VOCAB, max_position_embeddings=32,
                                    num_layers=4, hidden_dropout_prob=0.0,
                                    attention_dropout_prob=0.0)
STUDENT = model_lib.get_bert_config("distilbert-tiny", vocab_size=VOCAB,
                                    max_position_embeddings=32, num_layers=2,
                                    hidden_dropout_prob=0.0, attention_dropout_prob=0.0)


@functools.lru_cache(maxsize=None)
def _params(config, seed):
  return jax.jit(lambda k: nn.meta.unbox(pretraining_heads.init_params(config, k)))(
      jax.random.PRNGKey(seed))


def test_student_takes_every_other_teacher_layer_embeddings_and_mlm_head():
  teacher, student = _params(TEACHER, 1), _params(STUDENT, 2)
  layers = teacher_lib.layer_map(ml_dict(), 4, 2)
  assert layers == [0, 2]
  got = teacher_lib.student_from_teacher(teacher, student, layers)
  assert jax.tree.structure(got) == jax.tree.structure(student)
  for i, l in enumerate(layers):
    for a, b in zip(jax.tree.leaves(got["bert"]["encoder"][f"layer_{i}"]),
                    jax.tree.leaves(teacher["bert"]["encoder"][f"layer_{l}"])):
      np.testing.assert_array_equal(a, b)
  for k in ("word_embeddings", "position_embeddings", "layer_norm"):
    for a, b in zip(jax.tree.leaves(got["bert"]["embeddings"][k]),
                    jax.tree.leaves(teacher["bert"]["embeddings"][k])):
      np.testing.assert_array_equal(a, b)
  for a, b in zip(jax.tree.leaves(got["mlm_head"]), jax.tree.leaves(teacher["mlm_head"])):
    np.testing.assert_array_equal(a, b)
  assert teacher_lib.layer_map(ml_dict(teacher_layers="0,2,4,7,9,11"), 12, 6) == [0, 2, 4, 7, 9, 11]
  with pytest.raises(distil.ConfigError, match="give 3 numbers below 4"):
    teacher_lib.layer_map(ml_dict(), 4, 3)        # 0, 2, 4: no layer 4 in a 4-layer teacher
  with pytest.raises(distil.ConfigError, match="comma-separated layer numbers"):
    teacher_lib.layer_map(ml_dict(teacher_layers="0,x"), 4, 2)


# ----------------------------------------------------------------------------------------------
# The loss.
# ----------------------------------------------------------------------------------------------
def test_distill_ce_is_hf_kl_times_t_squared_and_cos_is_one_minus_cosine():
  rng = np.random.default_rng(0)
  s, t = rng.normal(size=(2, 3, 7)).astype(np.float32), rng.normal(size=(2, 3, 7)).astype(
      np.float32)
  w = np.array([[1, 1, 0], [1, 0, 0]], np.float32)
  loss, m = objectives.soft_cross_entropy(
      "distill_ce", dict(student=s, teacher=t, temperature=2.0), dict(masked_lm_weights=w))
  # HF distiller.py: KLDivLoss(batchmean)(log_softmax(s/T), softmax(t/T)) * T^2 on the selection.
  sel = w > 0
  ls = jax.nn.log_softmax(s[sel] / 2.0)
  pt = jax.nn.softmax(t[sel] / 2.0)
  expected = float(np.sum(pt * (np.log(pt) - ls)) / sel.sum() * 4.0)
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  same, _ = objectives.soft_cross_entropy(
      "distill_ce", dict(student=t, teacher=t, temperature=2.0), dict(masked_lm_weights=w))
  assert abs(float(same)) < 1e-6
  h_s, h_t = rng.normal(size=(2, 4, 5)), rng.normal(size=(2, 4, 5))
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
  loss, m = objectives.cosine_embedding("distill_cos", dict(student=h_s, teacher=h_t),
                                        dict(input_mask=mask))
  cos = np.sum(h_s * h_t, -1) / np.linalg.norm(h_s, axis=-1) / np.linalg.norm(h_t, axis=-1)
  np.testing.assert_allclose(loss, np.mean(1 - cos[mask > 0]), rtol=1e-5)
  # The weighted sum, HF's recipe: 5 x ce + 2 x mlm + 1 x cos.
  batch = dict(masked_lm_weights=w, masked_lm_ids=np.zeros((2, 3), np.int32), input_mask=mask)
  out = {"mlm": s, "distill_ce": dict(student=s, teacher=t, temperature=2.0),
         "distill_cos": dict(student=h_s, teacher=h_t)}
  total, parts = objectives.pretraining_loss(out, batch, distil.loss_weights(ml_dict()))
  np.testing.assert_allclose(total, 5 * parts["distill_ce_loss"] + 2 * parts["mlm_loss"]
                             + parts["distill_cos_loss"], rtol=1e-6)


def _batch(rows=8, seq=16, preds=3, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (rows, seq)).astype(np.int32)
  mask = (np.arange(seq)[None] < rng.integers(seq // 2, seq + 1, rows)[:, None]).astype(np.int32)
  positions = np.tile(np.arange(1, preds + 1), (rows, 1)).astype(np.int32)
  return dict(input_ids=ids * mask, input_mask=mask, segment_ids=np.zeros_like(mask),
              masked_lm_positions=positions,
              masked_lm_ids=rng.integers(5, VOCAB, (rows, preds)).astype(np.int32),
              masked_lm_weights=np.ones((rows, preds), np.float32))


def test_the_step_runs_the_frozen_teacher_on_the_mesh_and_trains_only_the_student(tmp_path):
  """trainer_lib.build_steps(frozen=): the teacher's parameters are an argument of the jitted
  step, sharded by the rules; the state holds the student alone; the teacher stays bit-equal."""
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  # 2 teacher layers, 1 student layer: two networks compile on a shared 2-core CPU.
  teacher_config = dataclasses.replace(TEACHER, num_layers=2)
  student_config = dataclasses.replace(STUDENT, num_layers=1)
  ckpt_lib.save_params(str(tmp_path / "teacher"), _params(teacher_config, 1), teacher_config)
  pre = trainer_lib.read_pretrained(str(tmp_path / "teacher"))
  config = ml_dict()
  tc = dataclasses.replace(teacher_config, objectives="mlm")
  teacher = teacher_lib.Teacher(str(tmp_path / "teacher"), pre, tc, {})
  mesh = sharding_lib.create_mesh((4, 2, 1))   # data 4 x fsdp 2: parameters sharded too
  batch = _batch()
  dummy = jax.tree.map(lambda x: x[:1], batch)
  frozen = distil.frozen_teacher(teacher, dummy, mesh, sharding_lib.LOGICAL_AXIS_RULES)
  weights = distil.loss_weights(config)
  loss_fn = lambda out, b: objectives.pretraining_loss(out, b, weights)  # noqa: E731
  steps = trainer_lib.build_steps(
      model=pretraining_heads.BertForPreTraining(student_config),
      forward=distil.student_forward(config),
      loss_fn=loss_fn, eval_fn=lambda out, b: loss_fn(out, b)[1], dummy_batch=dummy,
      tx=optax.adam(3e-3), schedule=optax.constant_schedule(3e-3), mesh=mesh, frozen=frozen)
  word = frozen.params["bert"]["embeddings"]["word_embeddings"]["embedding"]
  assert word.sharding.spec == steps.param_shardings["bert"]["embeddings"]["word_embeddings"][
      "embedding"].spec
  before = jax.device_get(frozen.params)
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(0))
    state = teacher_lib.init_student(state, steps, config, teacher, student_config.num_layers)
    history = []
    for _ in range(4):
      state, metrics = steps.train_step(state, batch)
      history.append(jax.device_get(metrics))
    ev = jax.device_get(steps.eval_step(state["params"], batch))
  assert set(state["params"]) == {"bert", "mlm_head"}
  assert "token_type_embeddings" not in state["params"]["bert"]["embeddings"]
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(jax.device_get(frozen.params))):
    np.testing.assert_array_equal(a, b)
  first, last = history[0], history[-1]
  assert {"distill_ce_loss", "distill_ce_accuracy", "mlm_loss", "distill_cos_loss",
          "distill_cos_similarity"} <= set(first)
  # Initialised from the teacher: its hidden states start close to the teacher's.
  assert first["distill_cos_similarity"] > 0.5
  assert last["loss"] < first["loss"] and last["mlm_loss"] < first["mlm_loss"]
  assert "distill_ce_loss" in ev
  # The gradient of the loss has no path into the teacher (stop_gradient in its apply).
  def loss_of_teacher(tp):
    b = trainer_lib.with_frozen(batch, tp, frozen.apply)
    out = steps.model.apply({"params": state["params"]}, b, True,
                            method=distil.student_forward(config))
    return loss_fn(out, b)[0]
  g = jax.jit(jax.grad(loss_of_teacher))(before)
  assert float(sum(jnp.abs(x).sum() for x in jax.tree.leaves(g))) == 0


# ----------------------------------------------------------------------------------------------
# python -m bert_jax.train: the teacher checked, recorded, and resume exact.
# ----------------------------------------------------------------------------------------------
def _train_config(preset, **kw):
  from bert_jax.configs import pretrain as pretrain_config  # pylint: disable=g-import-not-at-top
  c = pretrain_config.get_config(f"{preset},runlocal")
  c.train_input_files, c.model.vocab_size = "synthetic", 128
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 5, 8
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 4, 1, 1, 2
  c.async_checkpointing = False
  c.model.hidden_dropout_prob = c.model.attention_dropout_prob = 0.0
  for k, v in kw.items():
    setattr(c, k, v)
  return c


@pytest.fixture(scope="module")
def teacher_workdir(tmp_path_factory):
  """A BERT-tiny (2 layers, 128) pre-trained 4 steps on synthetic rows: the teacher."""
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  d = str(tmp_path_factory.mktemp("teacher") / "workdir")
  train.train_and_evaluate(_train_config("tiny"), d)
  return d


def test_train_refuses_a_missing_or_unfit_teacher_in_one_line(tmp_path):
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  tiny = model_lib.get_bert_config("tiny", vocab_size=128)   # an export: no training needed
  teacher_workdir = ckpt_lib.save_params(str(tmp_path / "teacher"), _params(tiny, 0), tiny)
  with pytest.raises(train.ConfigError, match="pass --config.teacher_checkpoint"):
    train.validate_inputs(_train_config("distilbert-tiny"), str(tmp_path / "a"))
  with pytest.raises(train.ConfigError, match="no such directory"):
    train.validate_inputs(_train_config("distilbert-tiny", teacher_checkpoint=str(
        tmp_path / "nope")), str(tmp_path / "a"))
  with pytest.raises(train.ConfigError, match=r"'hidden_size': \(128, 256\)"):
    train.validate_inputs(_train_config("distilbert-mini", teacher_checkpoint=teacher_workdir),
                          str(tmp_path / "a"))
  with pytest.raises(train.ConfigError, match=r"\(bert\) distils from no teacher; drop the teacher"):
    train.validate_inputs(_train_config("tiny", teacher_checkpoint=teacher_workdir),
                          str(tmp_path / "a"))


def test_a_hugging_face_bert_folder_is_a_teacher_recorded_by_its_weights(tmp_path, monkeypatch):
  """An HF BertForPreTraining folder as --config.teacher_checkpoint: converted once (the
  init_checkpoint cache), recorded by the sha256 of its config and weights; other weights in the
  same folder are another teacher (one line naming both)."""
  pytest.importorskip("torch")
  from tests.testlib import hf_testlib  # pylint: disable=g-import-not-at-top
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  hf_dir = str(tmp_path / "hf")
  hf_testlib.save_hf(hf_testlib.random_hf_model(hf_testlib.hf_config()), hf_dir)
  student = model_lib.get_bert_config("distilbert-tiny", vocab_size=64, hidden_size=64,
                                      num_heads=4, intermediate_size=100,
                                      max_position_embeddings=40)
  config = ml_dict(teacher_checkpoint=hf_dir)
  teacher = distil.load_teacher(config, student)
  assert teacher.model_config.family == "bert" and teacher.model_config.num_layers == 2
  assert teacher.model_config.objectives == "mlm" and teacher.record["path"] == hf_dir
  assert len(teacher.record["sha256"]) == 64
  teacher_lib.check_teacher({"teacher": teacher.record}, teacher, "wd")    # the same: accepted
  hf_testlib.save_hf(hf_testlib.random_hf_model(hf_testlib.hf_config(), seed=1), hf_dir)
  other = distil.load_teacher(config, student)
  with pytest.raises(distil.ConfigError, match=r"was distilled from teacher .*hf \(sha256 .* "
                     r"but this run has --config.teacher_checkpoint=.*hf \(sha256"):
    teacher_lib.check_teacher({"teacher": teacher.record}, other, "wd")
  with pytest.raises(distil.ConfigError, match="teacher_checkpoint=none"):
    teacher_lib.check_teacher({"teacher": teacher.record}, None, "wd")


@pytest.mark.slow
def test_python_m_bert_jax_train_distils_resumes_exactly_and_checks_its_teacher(
    teacher_workdir, tmp_path, monkeypatch):
  """distilbert-tiny from the BERT-tiny teacher: the student starts from the teacher's layer 0,
  the teacher is recorded (not saved) in the checkpoints, a SIGTERMed and resumed run logs the
  losses of an uninterrupted one, and a resume with another teacher is one line naming both."""
  import shutil  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax import train  # pylint: disable=g-import-not-at-top
  c = _train_config("distilbert-tiny", teacher_checkpoint=teacher_workdir, num_train_steps=6)
  full = train.train_and_evaluate(c, str(tmp_path / "full"))
  # Batch 4: train.py peeks at batches 0-3 before the loop installs its SIGTERM handler
  # (synthetic rows: no input watchdog reading ahead); batch 4 is step 5's, so 5 of 6 steps.
  first, second = sigterm_testlib.preempted_and_resumed(
      monkeypatch, 4, lambda: train.train_and_evaluate(c, str(tmp_path / "resumed")))
  sigterm_testlib.assert_same_losses([first, second], full)
  last = full["history"]["train"][-1][1]
  assert {"distill_ce_loss", "mlm_loss", "distill_cos_loss"} <= set(last)
  assert "python -m bert_jax.convert --input=" in " ".join(full["summary"]["next"])
  # The checkpoint: the student alone, the teacher by path and manifest hash.
  d = ckpt_lib.describe(str(tmp_path / "full"))
  assert d.config.family == "distilbert"
  assert d.meta["teacher"]["path"] == teacher_workdir and len(d.meta["teacher"]["sha256"]) == 64
  params = ckpt_lib.read_params(d)
  assert set(params) == {"bert", "mlm_head"}
  # Another teacher (the same weights copied elsewhere are the same teacher; a trained-further
  # one is not): one line naming both.
  other = str(tmp_path / "other_teacher")
  shutil.copytree(teacher_workdir, other)
  c.teacher_checkpoint, c.num_train_steps = other, 8
  train.train_and_evaluate(c, str(tmp_path / "full"))     # same manifest: accepted
  more = _train_config("tiny", num_train_steps=6)
  train.train_and_evaluate(more, other)                    # the teacher trains on: changed
  c.num_train_steps = 10
  with pytest.raises(train.ConfigError, match="was distilled from teacher .* but this run has"):
    train.train_and_evaluate(c, str(tmp_path / "full"))


@pytest.mark.slow
def test_two_host_pod_distils_like_one_host_with_the_teacher_sharded_across_hosts(tmp_path):
  """distilbert-tiny on a 2-process pod (localhost, gloo; tests/end_to_end/multihost_train_test.py's
  harness) logs the losses of 1 process; FSDP over all 8 devices, so the teacher's parameters
  are sharded across the two hosts and each reads only its shards."""
  import subprocess  # pylint: disable=g-import-not-at-top
  import sys  # pylint: disable=g-import-not-at-top
  from tests.end_to_end import multihost_train_test as mh  # pylint: disable=g-import-not-at-top
  from tests.testlib import pod_testlib  # pylint: disable=g-import-not-at-top
  root = mh.ROOT
  common = ["--config.train_input_files=synthetic", "--config.model.vocab_size=512",
            "--config.seq_length=32", "--config.max_predictions_per_seq=6",
            "--config.batch_size=16", "--config.warmup_steps=2", "--config.log_every=1",
            "--config.checkpoint_every=4", "--config.async_checkpointing=False",
            "--config.num_train_steps=4", "--config.mesh_shape=(1,8,1)"]
  single_env = dict(mh._env(), XLA_FLAGS=xla_test_flags.with_devices(8))  # pylint: disable=protected-access

  def single(preset, workdir, *extra):
    r = subprocess.run([sys.executable, "-m", "bert_jax.train",
                        f"--config=bert_jax/configs/pretrain.py:{preset},runlocal",
                        f"--workdir={workdir}", *common, *extra],
                       cwd=root, env=single_env, capture_output=True, text=True, timeout=500)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return r.stdout

  teacher = str(tmp_path / "teacher")
  single("tiny", teacher)
  distil_args = ["--config=bert_jax/configs/pretrain.py:distilbert-tiny,runlocal",
                 f"--config.teacher_checkpoint={teacher}"]
  r = subprocess.run([*pod_testlib.pod_command(), "--timeout_seconds=500", "--",
                      "bert_jax.train", *distil_args, f"--workdir={tmp_path / 'pod'}", *common],
                     cwd=root, env=mh._env(), capture_output=True, text=True, timeout=560)  # pylint: disable=protected-access
  assert r.returncode == 0, pod_testlib.failure(r)
  out = r.stdout + r.stderr
  assert "2 host(s)" in out and "[p0] step 4/4" in out, out[-3000:]
  single("distilbert-tiny", str(tmp_path / "one"), f"--config.teacher_checkpoint={teacher}")
  pod, one = mh._losses(str(tmp_path / "pod")), mh._losses(str(tmp_path / "one"))  # pylint: disable=protected-access
  assert len(pod[0]) == 4
  np.testing.assert_allclose(pod[0], one[0], rtol=1e-5)
  # The parts too; atol for the KL, ~0.01 here, whose last digits follow the reduction order
  # (1e-7 apart at step 4 when this was written).
  for part in ("distill_ce_loss", "distill_cos_loss", "mlm_loss"):
    np.testing.assert_allclose([v for _, v in sorted(pod[1][f"train/{part}"])],
                               [v for _, v in sorted(one[1][f"train/{part}"])], rtol=1e-5,
                               atol=1e-6)
