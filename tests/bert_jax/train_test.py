"""Train loop: sharded step equivalence, checkpoint/resume, SIGTERM, bad-input errors."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax_core import errors
from bert_jax.training import input_source
from bert_jax.parallel import sharding as sharding_lib
from bert_jax import train
from bert_jax.configs import pretrain as pretrain_config
from tests.testlib import sigterm_testlib

ROOT = tests.ROOT


def tiny_config(**overrides):
  c = pretrain_config.get_config("tiny,runlocal")
  c.train_input_files = "synthetic"
  c.model.vocab_size = 512
  c.seq_length = 32
  c.max_predictions_per_seq = 6
  c.batch_size = 8
  c.num_train_steps = 6
  c.warmup_steps = 2
  c.log_every = 1
  c.checkpoint_every = 3
  c.eval_every = 1000
  c.async_checkpointing = False
  for k, v in overrides.items():
    setattr(c, k, v)
  return c


def _one_step(config, mesh_shape, devices):
  mesh = sharding_lib.create_mesh(mesh_shape, devices=devices)
  vocab = train.load_vocab(config)
  model_config = train.create_model_config(config, vocab)
  t = train.build_training(config, model_config, mesh)
  batch = next(input_source.synthetic_batches(
      batch_size=config.batch_size, seq_length=config.seq_length,
      max_predictions_per_seq=config.max_predictions_per_seq, vocab_size=vocab.size, seed=1))
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    state, m1 = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
    state, m2 = t.train_step(state, sharding_lib.make_global_batch(batch, mesh))
  return (float(m1["loss"]), float(m2["loss"]),
          jax.device_get(state["params"]["bert"]), state)


def test_same_loss_on_1_device_data8_and_fsdp4_data2():
  config = tiny_config()
  devices = jax.devices()
  assert len(devices) == 8, "conftest sets 8 fake CPU devices"
  ref = _one_step(config, (1, 1, 1), devices[:1])
  for shape in [(8, 1, 1), (2, 4, 1), (2, 2, 2)]:
    got = _one_step(config, shape, devices)
    # First loss: same init, same batch -> same forward pass up to reduction order.
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-5, err_msg=str(shape))
    # Second loss: after one sharded AdamW update.
    np.testing.assert_allclose(got[1], ref[1], rtol=1e-4, err_msg=str(shape))
    flat_ref = jax.tree.leaves(ref[2])
    flat_got = jax.tree.leaves(got[2])
    for a, b in zip(flat_ref, flat_got):
      np.testing.assert_allclose(a, b, atol=2e-5)


def test_fsdp_actually_shards_parameters():
  config = tiny_config()
  *_, state = _one_step(config, (2, 4, 1), jax.devices())
  emb = state["params"]["bert"]
  leaves = jax.tree_util.tree_leaves_with_path(state["params"])
  sharded = [jax.tree_util.keystr(p) for p, x in leaves
             if x.ndim == 2 and "fsdp" in str(x.sharding.spec)]
  assert sharded, "no parameter is sharded over fsdp"
  mu_specs = [str(x.sharding.spec) for x in jax.tree.leaves(state["opt_state"]) if x.ndim == 2]
  assert any("fsdp" in s for s in mu_specs), "Adam moments should follow their parameters"
  del emb


def test_loss_decreases_and_resume_matches_uninterrupted_with_accumulation(tmp_path,
                                                                           monkeypatch):
  """2 micro-batches per step: steps, checkpoints and resume all count optimizer steps."""
  config = tiny_config(num_train_steps=8, checkpoint_every=4, batch_size=16, grad_accum_steps=2)
  full = train.train_and_evaluate(config, str(tmp_path / "full"))
  losses_full = [m["loss"] for _, m in full["history"]["train"]]
  assert [s for s, _ in full["history"]["train"]] == list(range(1, 9))
  assert np.mean(losses_full[-2:]) < losses_full[0] - 0.05, losses_full

  # Interrupt: SIGTERM arrives while batch 5 is read -> the loop saves step 5 and exits.
  sigterm_testlib.sigterm_at_batch(monkeypatch, 4)
  first = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert first["stopped_early"] and first["final_step"] == 5
  manager = ckpt_lib.create_manager(str(tmp_path / "resumed"), async_save=False)
  assert manager.all_steps() == [4, 5]  # checkpoint_every=4 optimizer steps, then SIGTERM's
  manager.close()
  second = train.train_and_evaluate(config, str(tmp_path / "resumed"))
  assert not second["stopped_early"]
  losses_resumed = [m["loss"] for _, m in first["history"]["train"] + second["history"]["train"]]
  np.testing.assert_allclose(losses_resumed, losses_full, rtol=1e-5)
  signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_overfits_one_batch():
  """The step really learns: 15 steps on one fixed batch lower the loss well below its start."""
  config = tiny_config(num_train_steps=15, warmup_steps=1)
  config.model.hidden_dropout_prob = 0.0
  config.model.attention_dropout_prob = 0.0
  mesh = sharding_lib.create_mesh((8, 1, 1))
  t = train.build_training(config, train.create_model_config(config, train.load_vocab(config)),
                           mesh)
  batch = sharding_lib.make_global_batch(next(input_source.synthetic_batches(
      batch_size=8, seq_length=32, max_predictions_per_seq=6, vocab_size=512, seed=9)), mesh)
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    losses = []
    for _ in range(15):
      state, m = t.train_step(state, batch)
      losses.append(float(m["mlm_loss"]))
  assert losses[-1] < 0.75 * losses[0], losses


def test_save_restore_gives_identical_next_step_loss(tmp_path):
  config = tiny_config()
  mesh = sharding_lib.create_mesh((2, 4, 1))
  vocab = train.load_vocab(config)
  model_config = train.create_model_config(config, vocab)
  t = train.build_training(config, model_config, mesh)
  batches = input_source.synthetic_batches(
      batch_size=8, seq_length=32, max_predictions_per_seq=6, vocab_size=512, seed=3)
  b1, b2 = [sharding_lib.make_global_batch(next(batches), mesh) for _ in range(2)]
  manager = ckpt_lib.create_manager(str(tmp_path), async_save=False)
  with jax.set_mesh(mesh):
    state = t.init_state(jax.random.PRNGKey(0))
    state, _ = t.train_step(state, b1)
    ckpt_lib.save(manager, 1, state, {"model_config": model_config.to_dict(),
                                      "input_position": 1})
    manager.wait_until_finished()
    restored, meta = ckpt_lib.restore(manager, 1, t.abstract_state)
    _, m_orig = t.train_step(state, b2)
    _, m_rest = t.train_step(restored, b2)
  assert meta["input_position"] == 1
  assert float(m_orig["loss"]) == float(m_rest["loss"])
  manager.close()


# ---- Bad input: one-line errors before any compute. ----
def _run_cli(tmp_path, *args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.run(
      [sys.executable, "-m", "bert_jax.train",
       "--config=bert_jax/configs/pretrain.py:tiny,runlocal", *args],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_cli_unknown_config_field(tmp_path):
  r = _run_cli(tmp_path, f"--workdir={tmp_path}", "--config.no_such_field=3")
  assert r.returncode != 0
  assert "no_such_field" in r.stderr


def test_cli_user_error_is_one_line_and_exit_code_2(tmp_path):
  r = _run_cli(tmp_path, f"--workdir={tmp_path}", "--config.train_input_files=synthetic",
               "--config.batch_size=12")
  assert r.returncode == 2, r.stderr[-2000:]
  lines = r.stderr.strip().splitlines()
  assert lines[-1].startswith("error: config.batch_size=12") and "Traceback" not in r.stderr


def test_errors_before_compute(tmp_path):
  with pytest.raises(errors.UserError, match="not divisible by the data-parallel size 8"):
    train.train_and_evaluate(tiny_config(batch_size=12), str(tmp_path / "a"))
  with pytest.raises(errors.UserError, match="config.train_input_files=.*no file matches"):
    train.train_and_evaluate(tiny_config(train_input_files=str(tmp_path / "nope-*")),
                             str(tmp_path / "b"))
  ro = tmp_path / "ro"
  ro.mkdir()
  os.chmod(ro, 0o500)
  if os.access(ro, os.W_OK):  # root ignores permissions: use a path under a file instead
    (tmp_path / "file").write_text("x")
    ro = tmp_path / "file" / "sub"
  with pytest.raises(train.ConfigError, match="workdir"):
    train.train_and_evaluate(tiny_config(), str(ro))
  assert not os.listdir(tmp_path / "a") if (tmp_path / "a").exists() else True


def test_a_directory_of_records_is_one_line_before_compute(tmp_path):
  # Issue 49: a TensorFlow ReduceDataset error advising to regenerate the records, before.
  for field in ("train_input_files", "eval_input_files"):
    with pytest.raises(errors.UserError) as e:
      train.train_and_evaluate(tiny_config(**{field: str(tmp_path)}), str(tmp_path / field))
    assert str(e.value).startswith(f"config.{field}='{tmp_path}': {tmp_path} is a directory; "
                                   f"pass the record files in it, e.g. config.{field}="
                                   f"'{tmp_path}/part-*'")
    assert not os.path.exists(tmp_path / field / "checkpoints")


def test_vocab_size_mismatch(tmp_path):
  vocab = tmp_path / "vocab.txt"
  vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] +
                             [f"w{i}" for i in range(95)]) + "\n")
  c = tiny_config(vocab_file=str(vocab))
  c.model.vocab_size = 512
  with pytest.raises(train.ConfigError, match="vocab_size=512 but the vocab file .* has 100"):
    train.train_and_evaluate(c, str(tmp_path / "w"))


def test_resume_with_other_model_size_is_refused(tmp_path):
  train.train_and_evaluate(tiny_config(num_train_steps=3), str(tmp_path))
  other = tiny_config(num_train_steps=3, model_name="mini")
  with pytest.raises(train.ConfigError, match="another model"):
    train.train_and_evaluate(other, str(tmp_path))
  # Nothing already saved was lost.
  manager = ckpt_lib.create_manager(str(tmp_path), async_save=False)
  assert manager.latest_step() == 3
  manager.close()


def test_init_checkpoint_loads_params_with_fresh_optimizer(tmp_path, capsys):
  train.train_and_evaluate(tiny_config(num_train_steps=3), str(tmp_path / "p1"))
  params, mc, meta = ckpt_lib.load_params(str(tmp_path / "p1"))
  assert mc.num_layers == 2 and "bert" in params
  c2 = tiny_config(num_train_steps=2, init_checkpoint=str(tmp_path / "p1"))
  capsys.readouterr()
  out = train.train_and_evaluate(c2, str(tmp_path / "p2"))
  assert out["final_step"] == 2
  p1 = tmp_path / "p1"  # the line names the step it loaded and where
  assert f"initialised parameters from step 3 of {p1} ({p1}/checkpoints/3)" in capsys.readouterr().out
  # A checkpoint of another size is refused with the parameter named.
  c3 = tiny_config(num_train_steps=2, init_checkpoint=str(tmp_path / "p1"), model_name="mini")
  with pytest.raises(train.ConfigError, match=r"another model size .*num_layers.: \(2, 4\)"):
    train.train_and_evaluate(c3, str(tmp_path / "p3"))


def test_tensorboard_events_written(tmp_path):
  from bert_jax.evaluation import metrics_writer
  from tensorboard.backend.event_processing import event_accumulator
  train.train_and_evaluate(tiny_config(num_train_steps=2), str(tmp_path))
  scalars = metrics_writer.read_scalars(str(tmp_path / "tensorboard"))
  for tag in ["mlm_loss", "mlm_accuracy", "nsp_loss", "nsp_accuracy", "learning_rate",
              "grad_norm", "sequences_per_sec", "tokens_per_sec", "tflops"]:
    assert f"train/{tag}" in scalars, tag
  assert [s for s, _ in scalars["train/mlm_loss"]] == [1, 2]
  # TensorBoard's own Python API lists them as scalars (not only as tensors).
  acc = event_accumulator.EventAccumulator(str(tmp_path / "tensorboard"))
  acc.Reload()
  assert "train/mlm_loss" in acc.Tags()["scalars"]
  assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]


def test_summary_json_and_a_finished_workdir_is_a_no_op(tmp_path, capsys):
  workdir = str(tmp_path / "run")
  c = tiny_config(num_train_steps=3, eval_input_files="synthetic", eval_steps=1)
  out = train.train_and_evaluate(c, workdir)
  printed = capsys.readouterr().out
  summary = json.load(open(os.path.join(workdir, "summary.json")))
  assert summary["program"] == "train" and summary["status"] == "finished"
  assert (summary["start_step"], summary["final_step"], summary["total_steps"]) == (0, 3, 3)
  assert summary["wall_time_sec"] > 0 and summary["final_eval_step"] == 3
  assert summary["final_eval"] == pytest.approx(out["last_eval"])
  assert set(summary["final_eval"]) >= {"eval/mlm_accuracy", "eval/mlm_loss", "eval/nsp_loss"}
  assert summary["model"] == f"{workdir} (checkpoint 3)"
  # The run's analytic compute: what families are compared at (docs/models.md, issue 21).
  flops = train.step_flops(c, train.create_model_config(c, train.load_vocab(c)), None)
  assert summary["pretrain_tflop"] == pytest.approx(3 * flops / 1e12)
  assert f"compute: 3 steps x {flops / 1e9:.3g} GFLOP" in printed
  assert any(cmd.startswith("python -m bert_jax.predict") for cmd in summary["next"])
  assert "summary (train): finished: steps 0 -> 3 of 3" in printed
  assert f"this summary: {workdir}/summary.json" in printed
  # Run again: nothing is trained or compiled, and the run says so and how to train further.
  again = train.train_and_evaluate(c, workdir)
  printed = capsys.readouterr().out
  assert again["nothing_to_do"] and again["final_step"] == 3
  assert (f"nothing to do: {workdir} already holds checkpoint 3 and "
          "--config.num_train_steps=3; to train further pass --config.num_train_steps=6") in printed
  assert "resuming" not in printed and "step 1/" not in printed
  assert json.load(open(os.path.join(workdir, "summary.json"))) == summary  # untouched


def test_flops_formula_is_6_params_per_token_plus_attention_and_heads():
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("base")
  per_seq = train.model_flops_per_sequence(cfg, 128, 20)
  # 6 * 85M non-embedding params * 128 tokens = 65 GFLOP; attention + MLM head add ~10%.
  assert 6.5e10 < per_seq < 8.0e10


def test_packed_step_flops_count_the_packed_prediction_and_nsp_slots():
  from bert_jax.models import model as model_lib
  cfg = model_lib.get_bert_config("base")
  config = tiny_config(batch_size=2, seq_length=128, max_predictions_per_seq=20)
  unpacked = train.step_flops(config, cfg, None)
  assert unpacked == 2 * train.model_flops_per_sequence(cfg, 128, 20)
  packed = train.step_flops(config, cfg, dict(pack=True, max_instances_per_pack=8))
  # Q = floor(0.15 * 128) + 8 = 27 prediction slots and 8 NSP slots per row.
  assert packed == 2 * train.model_flops_per_sequence(cfg, 128, 27, num_nsp=8)
  h, v = cfg.hidden_size, cfg.vocab_size
  assert packed - unpacked == 2 * 6 * (7 * (h * h + h * v) + 7 * (h * h + 2 * h))


def test_init_checkpoint_from_a_hugging_face_folder(tmp_path, monkeypatch, capsys):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  from tests.testlib import hf_testlib
  hf = hf_testlib.random_hf_model(hf_testlib.hf_config(
      vocab_size=512, hidden_size=128, num_attention_heads=2, intermediate_size=512,
      max_position_embeddings=512))
  hf_dir = hf_testlib.save_hf(hf, str(tmp_path / "hf"), do_lower_case=True)
  monkeypatch.setenv("BERT_JAX_CACHE", str(tmp_path / "cache"))
  out = train.train_and_evaluate(tiny_config(num_train_steps=2, init_checkpoint=hf_dir),
                                 str(tmp_path / "run"))
  printed = capsys.readouterr().out
  assert out["final_step"] == 2
  assert f"{hf_dir}: a Hugging Face folder; converted to Orbax in {tmp_path}/cache/hf/" in printed
  assert f"(converted from hf {hf_dir}) (2 layers, hidden 128)" in printed


# One converter for every family (bert_jax/families/: it finds the family in the checkpoint).
@pytest.mark.parametrize("preset,converter", [("tiny", "bert_jax.convert "),
                                              ("electra-tiny", "bert_jax.convert "),
                                              ("distilbert-tiny", "bert_jax.convert ")])
def test_next_commands_name_each_familys_converter_and_fine_tuning(preset, converter):
  """A finished run's next commands (summary.json's `next`): fill-mask, the family's converter,
  fine-tuning (ELECTRA's discriminator, DistilBERT's student) and how to train further."""
  config = pretrain_config.get_config(f"{preset},runlocal")
  out = train.next_commands(config, "runs/x/workdir", 10, stopped=False)
  assert out[0].startswith("python -m bert_jax.predict --init_checkpoint=runs/x/workdir fill-mask")
  assert out[1] == f"python -m {converter}--input=runs/x/workdir --output=hf/x"
  assert out[2].startswith("python -m bert_jax.finetune ") and "--workdir=runs/x-ft" in out[2]
  assert "--config.num_train_steps=20" in out[3]
  assert ("teacher_checkpoint" in out[3]) == preset.startswith("distilbert")
  assert train.next_commands(config, "w", 10, stopped=True) == [
      "re-run the same command to resume from checkpoint 10"]


def test_a_log_window_reads_its_clock_after_its_steps_finished(monkeypatch):
  """Steps are dispatched asynchronously: the step rate is read after the window's metrics were
  fetched (the device work done), or a window times its dispatches. (Reading it first showed a
  BERT-mini step on this CPU at 45 rows/s and 6 TFLOP/s, 2026-11-26.)"""
  calls = []

  class Timer:
    def rate(self):
      calls.append("clock")
      return 2.0

  class Skips:
    def flush(self):
      calls.append("skips")
      return 0

  def device_get(tree):
    calls.append("fetch")
    return tree

  monkeypatch.setattr(train.jax, "device_get", device_get)
  monkeypatch.setattr(train, "summarize", lambda pending, rate, *_: {"loss": 1.0, "rate": rate})
  monkeypatch.setattr(train, "log_line", lambda *a, **k: "")
  out = object.__new__(train.RunOutputs)
  out.run = type("R", (), dict(config=None, is_main=False, total_steps=4,
                               ramp=type("Off", (), dict(on=False))()))()
  out.flops_per_step, out.history = 1.0, dict(train=[], eval=[])
  out.writer = type("W", (), dict(write_scalars=lambda *a: None))()
  out.log(2, [{"loss": 1.0}], Timer(), Skips())
  assert calls == ["fetch", "clock", "skips"]
  assert out.history["train"] == [(2, {"loss": 1.0, "rate": 2.0, "skipped_steps": 0})]
