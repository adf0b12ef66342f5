"""One run per workdir: a second is refused naming the first; a dead holder's lock is taken over."""

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from bert_jax.checkpoint import workdir_lock


def _lock_file(wd):
  return os.path.join(wd, workdir_lock.NAME)


def _plant(wd, **fields):
  """A lock file as another run would have left it (defaults: this host, a live pid, now)."""
  os.makedirs(wd, exist_ok=True)
  holder = dict(host=socket.gethostname(), pid=os.getpid(), boot_id=workdir_lock._boot_id(),
                proc_start=workdir_lock._proc_start(os.getpid()), started=time.time(),
                heartbeat=time.time(), command="python -m bert_jax.train --workdir=wd",
                token="other")
  holder.update(fields)
  with open(_lock_file(wd), "w") as f:
    json.dump(holder, f)


def test_second_run_is_refused_naming_the_holder_and_the_lock_goes_on_exit(tmp_path):
  wd = str(tmp_path / "wd")
  with workdir_lock.hold(wd, "bert_jax.train"):
    with pytest.raises(workdir_lock.WorkdirLockError) as e:
      with workdir_lock.hold(wd, "bert_jax.train"):
        pass
    msg = str(e.value)
    assert "\n" not in msg and f"--workdir={wd} is in use by another run" in msg
    for part in (f"host {socket.gethostname()}", f"pid {os.getpid()}", "started 20",
                 "command: ", "use another --workdir", "delete"):
      assert part in msg, (part, msg)
    assert os.path.exists(_lock_file(wd))      # the refused run left the holder's lock alone
  assert not os.path.exists(_lock_file(wd))


def test_released_when_the_run_raises(tmp_path):
  wd = str(tmp_path / "wd")
  with pytest.raises(RuntimeError):
    with workdir_lock.hold(wd, "bert_jax.train"):
      raise RuntimeError("the run failed")
  assert not os.path.exists(_lock_file(wd))
  with workdir_lock.hold(wd, "bert_jax.train"):  # the next run starts
    pass


def test_a_killed_holder_on_this_host_is_taken_over(tmp_path, capsys):
  """kill -9 leaves the lock behind: the restart takes it over (tests/end_to_end/kill_test.py restarts so)."""
  wd = str(tmp_path / "wd")
  p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
  p.kill()
  p.wait()
  _plant(wd, pid=p.pid, proc_start=None)
  with workdir_lock.hold(wd, "bert_jax.train"):
    assert json.load(open(_lock_file(wd)))["pid"] == os.getpid()
  assert f"pid {p.pid} is no longer running" in capsys.readouterr().out


@pytest.mark.parametrize("fields,reason", [
    (dict(proc_start=1), "is now another process"),            # pid reused by another program
    (dict(boot_id="another-boot"), "the host has rebooted"),   # a preempted VM came back
    # (heartbeat_ago: made a time when the test runs, not when it is collected minutes earlier)
    (dict(host="other-host", heartbeat_ago=11 * 60), "last heartbeat was 11 min ago"),
])
def test_stale_locks_are_taken_over(tmp_path, capsys, fields, reason):
  if "boot_id" in fields and workdir_lock._boot_id() is None:
    pytest.skip("no /proc boot_id here")
  fields = dict(fields)
  if "heartbeat_ago" in fields:
    fields["heartbeat"] = time.time() - fields.pop("heartbeat_ago")
  wd = str(tmp_path / "wd")
  _plant(wd, **fields)
  with workdir_lock.hold(wd, "bert_jax.train"):
    pass
  assert reason in capsys.readouterr().out


def test_a_live_holder_on_another_host_is_refused(tmp_path):
  wd = str(tmp_path / "wd")
  _plant(wd, host="other-host", pid=1, heartbeat=time.time() - 5 * 60)
  with pytest.raises(workdir_lock.WorkdirLockError, match="host other-host, pid 1"):
    with workdir_lock.hold(wd, "bert_jax.train"):
      pass


def test_the_heartbeat_is_refreshed(tmp_path):
  wd = str(tmp_path / "wd")
  with workdir_lock.hold(wd, "bert_jax.train", heartbeat_s=0.05):
    first = json.load(open(_lock_file(wd)))["heartbeat"]
    for _ in range(1200):                      # up to 60 s: a loaded box may starve the thread
      time.sleep(0.05)
      if json.load(open(_lock_file(wd)))["heartbeat"] > first:
        break
    assert json.load(open(_lock_file(wd)))["heartbeat"] > first


def test_train_and_finetune_refuse_a_held_workdir_before_anything_else(tmp_path):
  from bert_jax import finetune, train
  from bert_jax.configs import finetune as finetune_config
  from bert_jax.configs import pretrain as pretrain_config
  wd = str(tmp_path / "wd")
  _plant(wd)                                   # a live run (this process) holds it
  with pytest.raises(workdir_lock.WorkdirLockError, match="in use by another run"):
    train.train_and_evaluate(pretrain_config.get_config("tiny,runlocal"), wd)
  with pytest.raises(workdir_lock.WorkdirLockError, match="in use by another run"):
    finetune.finetune(finetune_config.get_config("glue_mrpc"), wd)
  assert json.load(open(_lock_file(wd)))["token"] == "other"
