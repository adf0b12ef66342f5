"""The local pod simulation: 2 processes x 4 fake CPU devices joined by jax.distributed.

Each test starts real processes through `python -m launch.local_pod` running the
`launch.pod_check` demo (about 3 s a run on 2 cores), so the path under test is the one a TPU
pod takes: BERT_JAX_* env -> maybe_initialize_distributed -> jax.distributed.initialize.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import io
import json
import os
import re
import subprocess
import sys
import threading
import time

from launch import local_pod
from tests.testlib import pod_testlib

ROOT = tests.ROOT


def _pod(*args, pod_flags=(), timeout=120):
  """Runs the launcher with pod_check; returns (returncode, output lines, seconds)."""
  cmd = [sys.executable, "-m", "launch.local_pod", "--timeout_seconds=90", *pod_flags, "--",
         "launch.pod_check", *args]
  start = time.monotonic()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
  return proc.returncode, (proc.stdout + proc.stderr).splitlines(), time.monotonic() - start


def _result(lines):
  results = [json.loads(l.split("RESULT ", 1)[1]) for l in lines if "RESULT " in l]
  assert len(results) == 1, "\n".join(lines[-40:])
  return results[0]


def test_child_env_sets_distributed_vars_and_device_count():
  base = {"XLA_FLAGS": "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x",
          "PATH": "/bin"}
  env = local_pod.child_env(base, process_id=1, num_processes=2, devices_per_process=4,
                            port=1234, heartbeat_timeout_seconds=7)
  assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x",
                                      "--xla_force_host_platform_device_count=4"]
  assert env["BERT_JAX_COORDINATOR"] == "localhost:1234"
  assert (env["BERT_JAX_NUM_PROCESSES"], env["BERT_JAX_PROCESS_ID"]) == ("2", "1")
  assert env["BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS"] == "7"
  assert env["JAX_PLATFORMS"] == "cpu" and env["PATH"] == "/bin"
  assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
  assert base["XLA_FLAGS"].startswith("--xla_force_host_platform_device_count=8")  # untouched


def test_two_hosts_equal_one_host_on_disjoint_shards():
  rc, lines, _ = _pod(pod_flags=["--num_processes=2", "--devices_per_process=4"])
  assert rc == 0, "\n".join(lines[-40:])
  two = _result(lines)
  assert any(l.startswith("[p0] process 0/2 (env): 4 local devices, 8 global") for l in lines)
  assert any(l.startswith("[p1] process 1/2 (env): 4 local devices, 8 global") for l in lines)
  assert (two["process_count"], two["device_count"]) == (2, 8)
  # Only what the program and the launcher say (issue 32): before, each run also printed 16
  # `[Gloo] Rank R is connected to N peer ranks` lines (8 a process) and 3 INFO lines from
  # jax.distributed.initialize (`I1126 ... distributed.py:172] Connecting to JAX distributed
  # service on localhost:PORT`, p0 2, p1 1).
  assert pod_testlib.library_lines("\n".join(lines)) == [], "\n".join(lines)
  assert all(re.match(r"\[(p[01]|local_pod)\] ", l) for l in lines), "\n".join(lines)
  # The global batch stays 16 rows; host 0 fed rows [0, 8) and host 1 rows [8, 16).
  assert two["global_shape"] == [16, 8]
  assert two["host_rows"] == [[0, 8], [8, 16]]

  rc, lines, _ = _pod(pod_flags=["--num_processes=1", "--devices_per_process=8"])
  assert rc == 0, "\n".join(lines[-40:])
  one = _result(lines)
  assert one["process_count"] == 1 and one["host_rows"] == [[0, 16]]
  assert two["sum"] == one["sum"] and two["mean"] == one["mean"]
  assert two["config_sha256"] == one["config_sha256"]


_CONNECTED = ("[Gloo] Rank 5 is connected to 7 peer ranks. Expected number of connected peer "
              "ranks is : 7\n")


def test_relay_drops_only_gloos_all_connected_line():
  assert local_pod.is_gloo_connected_line(_CONNECTED)
  assert local_pod.is_gloo_connected_line(_CONNECTED.replace("7", "1"))
  # Fewer peers than expected, the list of missing ones, or the line inside another: relayed.
  assert not local_pod.is_gloo_connected_line(_CONNECTED.replace("to 7", "to 6"))
  assert not local_pod.is_gloo_connected_line("[Gloo] Rank 5 is NOT connected to: [1, 2]\n")
  assert not local_pod.is_gloo_connected_line("error: " + _CONNECTED)
  assert not local_pod.is_gloo_connected_line("step 1/2 | loss 6.9270\n")
  # Two threads' copies interleaved piece by piece (the CI of 2026-11-26, verbatim): dropped.
  assert local_pod.is_gloo_connected_line(
      "[Gloo] Rank [Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer "
      "ranks is : 7\n")
  assert local_pod.is_gloo_connected_line(
      "2 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n")
  # The tail alone (the CI of stop 36, verbatim), and with its number split off.
  assert local_pod.is_gloo_connected_line("Expected number of connected peer ranks is : 7\n")
  assert local_pod.is_gloo_connected_line("Expected number of connected peer ranks is : \n")
  # ...but not a bare number, nor a NOT-connected line caught in the interleaving.
  assert not local_pod.is_gloo_connected_line("7\n")
  assert not local_pod.is_gloo_connected_line("[Gloo] Rank [Gloo] Rank 3 is NOT connected to: [1]\n")

  def relay(show):
    out = io.StringIO()
    stream = io.StringIO(f"step 1/2\n{_CONNECTED}[Gloo] Rank 5 is NOT connected to: [1]\nend")
    local_pod._pump("[p1] ", stream, out, threading.Lock(), show)  # pylint: disable=protected-access
    return out.getvalue().splitlines()
  assert relay(False) == ["[p1] step 1/2", "[p1] [Gloo] Rank 5 is NOT connected to: [1]",
                          "[p1] end"]
  assert relay(True)[1] == "[p1] " + _CONNECTED.strip()


def test_gloo_filter_drops_a_bare_number_only_while_gloo_owes_one():
  def kept(lines):
    f = local_pod.GlooFilter()
    return [l for l in lines if not f.drop(l)]
  # A program's bare number, with no gloo words before it: relayed.
  assert kept(["7\n", "step 1\n"]) == ["7\n", "step 1\n"]
  # A copy cut after `is : ` by another copy written whole, then its own number on a line.
  assert kept(["[Gloo] Rank 3 is connected to 7 peer ranks. Expected number of connected peer "
               "ranks is : " + _CONNECTED, "7\n", "7\n"]) == ["7\n"]
  # Two heads and one tail on one line owe the second copy's numbers to the next line, which pays.
  assert kept(["[Gloo] Rank [Gloo] Rank 3 is connected to 7 peer ranks. Expected number of "
               "connected peer ranks is : 7\n",
               "2 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7\n",
               "3\n"]) == ["3\n"]
  # A NOT-connected line is relayed whatever is owed.
  assert kept(["[Gloo] Rank 3 is connected to 6 peer ranks. Expected number of connected peer "
               "ranks is : \n", "[Gloo] Rank 3 is NOT connected to: [1]\n", "7\n"]) == [
                   "[Gloo] Rank 3 is NOT connected to: [1]\n"]


def test_config_mismatch_is_an_error_on_every_host():
  # Grace so that both hosts get to print their own error before the launcher steps in.
  rc, lines, _ = _pod("--mismatch_process=1", pod_flags=["--peer_grace_seconds=30"])
  assert rc == 1
  for pid in (0, 1):
    errors = [l for l in lines if l.startswith(f"[p{pid}] error: ")]
    assert len(errors) == 1, "\n".join(lines[-40:])  # one line per host, no traceback
    assert f"config differs across hosts (this is process {pid})" in errors[0]
    assert "processes [0] have sha256" in errors[0]
    assert "processes [1] have sha256" in errors[0]
  assert not any("Traceback" in l for l in lines)
  # Both hosts stopped by themselves with the user-error code; the launcher killed nobody.
  assert any(l.startswith("[local_pod] FAILED: process") and "p0: exited with code 2" in l
             and "p1: exited with code 2" in l for l in lines), "\n".join(lines[-10:])


def test_dead_peer_stops_the_others_within_heartbeat_timeout():
  # Process 1 SIGKILLs itself after step 0; process 0 keeps running collectives. The launcher
  # waits (grace 60 s) so only JAX's heartbeat check (3 s) can stop process 0.
  rc, lines, _ = _pod("--crash_process=1", "--steps=100000", "--step_sleep_seconds=0.05",
                      pod_flags=["--heartbeat_timeout_seconds=3", "--peer_grace_seconds=60"])
  text = "\n".join(lines)
  assert rc == 1
  assert "[local_pod] process 1 " in text and "was killed by SIGKILL; waiting up to 60s" in text
  assert any(l.startswith("[p0] ") and "JAX distributed service detected fatal errors" in l
             for l in lines), text[-3000:]
  assert "p0: was killed by SIGABRT" in text  # JAX aborted it, not the launcher
  assert "[local_pod] stopped p0" not in text  # the 60 s grace never ran out


def test_launcher_stops_survivors_at_once_without_grace():
  rc, lines, _ = _pod("--crash_process=1", "--steps=100000", "--step_sleep_seconds=0.05",
                      pod_flags=["--heartbeat_timeout_seconds=100"])
  text = "\n".join(lines)
  assert rc == 1
  assert "was killed by SIGKILL; stopping p0" in text
  assert "[local_pod] FAILED: process 1 was killed by SIGKILL first" in text
  # The launcher stopped p0 (SIGTERM, then SIGKILL if JAX's notifier held it), not JAX's
  # 100 s heartbeat check, and not the 90 s --timeout_seconds.
  assert "[local_pod] stopped p0 (still running when process 1 failed)" in text
  assert re.search(r"p0: was killed by SIG(TERM|KILL)", text), text[-2000:]
  assert "detected fatal errors" not in text and "timed out" not in text


def test_missing_module_is_a_usage_error():
  proc = subprocess.run([sys.executable, "-m", "launch.local_pod", "--num_processes=2"],
                        cwd=ROOT, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 2
  assert proc.stderr.strip().splitlines()[-1].startswith("error: no module to run: pass it after")
