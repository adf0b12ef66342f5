"""Checksummed checkpoints: damage is detected, named, and training falls back to a good step."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax_core import errors
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib

REPO = tests.ROOT


def _w(value):
  # Random values: Orbax compresses (zstd), so constant arrays would be a few bytes on disk.
  return np.random.default_rng(value).normal(size=(64, 32)).astype(np.float32)


def _state(value):
  return dict(step=jnp.asarray(value, jnp.int32),
              params={"w": jnp.asarray(_w(value)), "b": jnp.arange(8.0) + value})


def _saved_workdir(tmp_path, steps=(1, 2, 3), async_save=True):
  manager = ckpt_lib.create_manager(tmp_path / "wd", max_to_keep=5, async_save=async_save)
  for s in steps:
    ckpt_lib.save(manager, s, _state(s), dict(input_position=s))
  manager.wait_until_finished()
  return manager


def _biggest_array_file(step_dir):
  files = [f for f in manifest_lib.list_files(step_dir) if "/d/" in f]
  return str(max(files, key=lambda f: os.path.getsize(os.path.join(step_dir, f))))


def _damage(step_dir, how):
  """Damages one step; returns the file that must be named in the error."""
  target = os.path.join(step_dir, _biggest_array_file(step_dir))
  if how == "flipped_byte":
    with open(target, "r+b") as f:
      f.seek(os.path.getsize(target) // 2)
      b = f.read(1)
      f.seek(-1, os.SEEK_CUR)
      f.write(bytes([b[0] ^ 0x01]))
  elif how == "truncated":
    with open(target, "r+b") as f:
      f.truncate(os.path.getsize(target) - 7)
  elif how == "deleted_file":
    os.remove(target)
  elif how == "deleted_manifest":
    target = os.path.join(step_dir, manifest_lib.NAME)
    os.remove(target)
  return target


def test_every_saved_step_has_a_manifest_and_verifies(tmp_path, capsys):
  manager = _saved_workdir(tmp_path)
  assert "checkpoint 3 saved (verified" in capsys.readouterr().out
  for s in (1, 2, 3):
    status, n, size = ckpt_lib.verify_dir(manager.directory / str(s))
    assert status == "verified" and n > 5 and size > 64 * 32 * 4
  # Orbax's own step metadata (rewritten at commit) is not listed; our meta is.
  listed = json.loads((manager.directory / "3" / manifest_lib.NAME).read_text())
  assert "meta/metadata" in listed["files"] and "_CHECKPOINT_METADATA" not in listed["files"]
  assert ckpt_lib.latest_verified_step(manager) == 3
  manager.close()


@pytest.mark.parametrize("how", ["flipped_byte", "truncated", "deleted_file", "deleted_manifest"])
def test_damage_is_named_and_resume_falls_back(tmp_path, capsys, how):
  manager = _saved_workdir(tmp_path)
  step_dir = str(manager.directory / "3")
  target = _damage(step_dir, how)
  with pytest.raises(manifest_lib.ManifestError, match=os.path.basename(target)):
    ckpt_lib.verify_dir(step_dir)
  capsys.readouterr()
  assert ckpt_lib.latest_verified_step(manager) == 2
  err = capsys.readouterr().err
  assert "checkpoint 3 is damaged" in err and "falling back to step 2" in err
  assert os.path.basename(target) in err
  # The damaged step moved aside: training can save step 3 again, and step 2 restores as saved.
  assert manager.all_steps() == [1, 2]
  assert len(os.listdir(tmp_path / "wd" / "checkpoints.corrupt")) == 1
  abstract = jax.eval_shape(lambda: _state(0))
  state, meta = ckpt_lib.restore(manager, 2, abstract)
  np.testing.assert_array_equal(state["params"]["w"], _w(2))
  assert meta["input_position"] == 2
  ckpt_lib.save(manager, 3, _state(3), dict(input_position=3))
  manager.wait_until_finished()
  assert ckpt_lib.latest_verified_step(manager) == 3
  manager.close()


def test_step_from_before_manifests_restores_with_a_warning(tmp_path, capsys):
  manager = _saved_workdir(tmp_path, steps=(1,))
  step_dir = manager.directory / "1"
  os.remove(step_dir / manifest_lib.NAME)
  meta_file = step_dir / "meta" / "metadata"
  meta = json.loads(meta_file.read_text())
  del meta[ckpt_lib.MANIFEST_KEY]   # what a step saved by the earlier code looks like
  meta_file.write_text(json.dumps(meta))
  capsys.readouterr()
  assert ckpt_lib.latest_verified_step(manager) == 1
  assert "checkpoint 1 has no manifest" in capsys.readouterr().err
  manager.close()


def test_no_step_verifies_is_one_error_and_nothing_moves(tmp_path):
  manager = _saved_workdir(tmp_path, steps=(1, 2))
  for s in (1, 2):
    _damage(str(manager.directory / str(s)), "flipped_byte")
  with pytest.raises(ckpt_lib.CheckpointError, match="no checkpoint .* verifies: step 2: .*step 1"):
    ckpt_lib.latest_verified_step(manager)
  assert manager.all_steps() == [1, 2]
  manager.close()


def test_synchronous_saves_carry_manifests_too(tmp_path):
  manager = _saved_workdir(tmp_path, steps=(5,), async_save=False)
  assert ckpt_lib.verify_dir(manager.directory / "5")[0] == "verified"
  manager.close()


def test_cli_verify_workdir_and_export(tmp_path, capsys):
  manager = _saved_workdir(tmp_path, steps=(1, 2))
  manager.close()
  ckpt_lib.verify_main(["checkpoint", "verify", str(tmp_path / "wd")])
  out = capsys.readouterr().out
  assert "step 1: ok" in out and "step 2: ok" in out
  _damage(str(tmp_path / "wd" / "checkpoints" / "2"), "truncated")
  with pytest.raises(SystemExit) as e:
    errors.run_main(ckpt_lib.verify_main, ["checkpoint", "verify", str(tmp_path / "wd")])
  assert e.value.code == errors.EXIT_USER_ERROR
  captured = capsys.readouterr()
  assert "step 2: DAMAGED" in captured.out and "step 1: ok" in captured.out
  assert captured.err.count("\n") == 1 and "1 damaged: step 2" in captured.err


@pytest.mark.parametrize("argv", [["verify", "--help"], ["--help"], ["verify", "-h"],
                                  ["verify", "DIR", "--help"]])
def test_verify_help_prints_its_usage_not_a_missing_directory(argv, capsys, monkeypatch):
  """Was: `error: --help: no such directory.` (verify_main took --help for DIR), exit 2."""
  ckpt_lib.verify_main(["checkpoint", *argv])
  out = capsys.readouterr().out
  assert out.startswith("usage: python -m bert_jax.checkpoint verify DIR"), out
  assert "a workdir (every kept step)" in out
  # bert-jax-verify --help: the console script (cli.verify) passes its arguments after "verify".
  from bert_jax import cli  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(sys, "argv", ["bert-jax-verify", *argv[1:]] if argv[0] == "verify" else
                      ["bert-jax-verify", *argv])
  cli.verify()
  assert capsys.readouterr().out.startswith("usage: python -m bert_jax.checkpoint verify DIR")


def test_python_m_bert_jax_checkpoint_verify_help_exits_0_with_its_usage():
  r = subprocess.run([sys.executable, "-m", "bert_jax.checkpoint", "verify", "--help"], cwd=REPO,
                     capture_output=True, text=True, timeout=300,
                     env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0 and not r.stderr.strip(), r.stderr[-2000:]
  assert r.stdout.startswith("usage: python -m bert_jax.checkpoint verify DIR"), r.stdout


def test_export_is_verified_by_load_params(tmp_path):
  cfg = model_lib.get_bert_config("tiny", vocab_size=40)
  params = {"w": np.ones((16, 8), np.float32)}
  path = ckpt_lib.save_params(str(tmp_path / "export"), params, cfg, meta=dict(do_lower_case=True))
  ckpt_lib.verify_main(["checkpoint", "verify", path])
  assert ckpt_lib.load_params(path)[0]["w"].shape == (16, 8)
  target = _damage(path, "flipped_byte")
  with pytest.raises(ckpt_lib.CheckpointError, match=os.path.basename(target)):
    ckpt_lib.load_params(path)


def test_pretraining_step_reports_its_casing_for_finetuning(tmp_path):
  """A pre-training meta nests do_lower_case under "config"; load_params lifts it."""
  cfg = model_lib.get_bert_config("tiny", vocab_size=40)
  manager = ckpt_lib.create_manager(tmp_path / "wd", async_save=False)
  state = dict(step=jnp.zeros((), jnp.int32), params={"w": jnp.ones((4,))})
  ckpt_lib.save(manager, 1, state, dict(config=dict(do_lower_case=False),
                                        model_config=cfg.to_dict()))
  manager.close()
  assert ckpt_lib.load_params(str(tmp_path / "wd"))[2]["do_lower_case"] is False


_FULL_DISK = textwrap.dedent("""
    import resource, signal, sys, time
    import jax.numpy as jnp
    import numpy as np
    from bert_jax.checkpoint import store as ckpt_lib
    from bert_jax_core import errors
    def main(argv):
      m = ckpt_lib.create_manager(argv[1], max_to_keep=5)
      ckpt_lib.save(m, 1, dict(w=jnp.ones((64,))), dict(input_position=1))
      m.wait_until_finished()
      # The "disk" is full from here: any file may grow to 64 KiB at most (EFBIG).
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
      resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
      w = np.random.default_rng(0).normal(size=(1 << 16,)).astype(np.float32)  # 256 KiB
      ckpt_lib.save(m, 2, dict(w=jnp.asarray(w)), dict(input_position=2))  # asynchronous
      while m.is_saving_in_progress():                 # it fails in the background
        time.sleep(0.05)
      if argv[2] == "check":
        m.check_for_errors()                           # what the loop calls every step
      else:
        ckpt_lib.save(m, 3, dict(w=jnp.ones((64,))), dict(input_position=3))
      print("not stopped", flush=True)
    errors.run_main(main, sys.argv)
""")


@pytest.mark.parametrize("then", ["check", "next_save"])
def test_full_disk_during_a_save_is_one_line_and_keeps_earlier_steps(tmp_path, then):
  """The failed save is named (not the next one), in one line: no Orbax tracebacks (issue 23
  fault 6: 325 stderr lines, 4 tracebacks, and checkpoint 6 named for a failed 4)."""
  wd = str(tmp_path / "wd")
  p = subprocess.run([sys.executable, "-c", _FULL_DISK, wd, then], capture_output=True,
                     text=True, cwd=REPO, timeout=120)
  assert p.returncode == errors.EXIT_USER_ERROR, p.stderr[-2000:]
  assert "not stopped" not in p.stdout
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1, p.stderr[-3000:]
  assert lines[0].startswith("error: checkpoint 2: cannot write") and (
      "resumes from checkpoint 1" in lines[0]), lines[0]
  manager = ckpt_lib.create_manager(wd)
  assert ckpt_lib.latest_verified_step(manager) == 1
  manager.close()


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flipped_byte", "deleted_manifest"])
def test_training_resumes_from_the_previous_good_step(tmp_path, capfd, how):
  from bert_jax import train
  from bert_jax.configs import pretrain as pretrain_config
  c = pretrain_config.get_config("tiny,runlocal")
  c.train_input_files, c.model.vocab_size = "synthetic", 512
  c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 6, 8
  c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 4, 2, 1, 2
  c.eval_every, c.async_checkpointing = 1000, False
  wd = str(tmp_path / "wd")
  train.train_and_evaluate(c, wd)
  _damage(os.path.join(wd, "checkpoints", "4"), how)
  capfd.readouterr()
  c.num_train_steps = 6
  result = train.train_and_evaluate(c, wd)
  out, err = capfd.readouterr()
  assert "checkpoint 4 is damaged" in err and "falling back to step 2" in err
  assert "resuming from step 2" in out
  assert [s for s, _ in result["history"]["train"]] == [3, 4, 5, 6]


_FULL_DISK_TRAIN = textwrap.dedent("""
    import resource, signal, sys, time
    from bert_jax import train
    from bert_jax.checkpoint import store as ckpt_lib
    from bert_jax.configs import pretrain as pretrain_config
    from bert_jax_core import errors
    real_save = ckpt_lib.save
    def save(manager, step, *args, **kwargs):
      if step == 4:              # checkpoint 2 is committed; the disk is full from here on
        manager.wait_until_finished()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, resource.RLIM_INFINITY))
      saved = real_save(manager, step, *args, **kwargs)
      while step == 4 and manager.is_saving_in_progress():  # it fails before step 5 starts
        time.sleep(0.05)
      return saved
    ckpt_lib.save = save
    def main(argv):
      c = pretrain_config.get_config("tiny,runlocal")
      c.train_input_files, c.model.vocab_size = "synthetic", 512
      c.seq_length, c.max_predictions_per_seq, c.batch_size = 32, 6, 8
      c.num_train_steps, c.warmup_steps, c.log_every, c.checkpoint_every = 8, 2, 1, 2
      c.eval_every, c.async_checkpointing = 1000, True
      train.train_and_evaluate(c, argv[1])
    errors.run_main(main, sys.argv)
""")


@pytest.mark.slow
def test_a_failed_asynchronous_save_stops_training_at_the_next_step(tmp_path):
  """Issue 23 fault 6 in the loop: steps 5-6 trained after checkpoint 4 failed, and checkpoint 6
  was named; now the loop stops before step 5 with one line naming checkpoint 4."""
  wd = str(tmp_path / "wd")
  p = subprocess.run([sys.executable, "-c", _FULL_DISK_TRAIN, wd], capture_output=True,
                     text=True, cwd=REPO, timeout=600)
  assert p.returncode == errors.EXIT_USER_ERROR, p.stderr[-3000:]
  lines = p.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: checkpoint 4: cannot write") and (
      "resumes from checkpoint 2" in lines[0]), p.stderr[-3000:]
  assert "step 4/8" in p.stdout and "step 5/8" not in p.stdout, p.stdout
  manager = ckpt_lib.create_manager(wd)
  assert ckpt_lib.latest_verified_step(manager) == 2
  manager.close()


def test_a_file_given_as_the_checkpoint_is_one_line(tmp_path):
  """Issue 49 item 7: --config.teacher_checkpoint (or init_checkpoint) naming a file, e.g. a
  vocab.txt, was a NotADirectoryError traceback from listing it."""
  f = tmp_path / "vocab.txt"
  f.write_text("[PAD]\n")
  with pytest.raises(ckpt_lib.CheckpointError) as e:
    ckpt_lib.resolve_checkpoint(str(f))
  assert str(e.value) == (f"init_checkpoint={f}: is a file, not a checkpoint directory; give a "
                          "params export (python -m bert_jax.convert output), a workdir or a "
                          "step directory.")
  assert isinstance(e.value, errors.UserError)
