"""A host of a 2-process local pod that comes late to a first collective (slow, real processes).

On CPU, gloo builds a program's cross-process communicator when the program first runs and waits
30 s there for the other process (jaxlib 0.10.2); CI's stream_test died so, one host 30 s ahead
of the other at its first train step. Every process now meets at a coordination-service barrier
after compiling and before a step's first run (distributed.TogetherOnFirstCall, distributed.meet),
which waits 30 minutes, and a host that never comes is one line naming it.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import subprocess
import sys

import pytest

from tests.testlib import pod_testlib
from tests.testlib import xla_test_flags

ROOT = tests.ROOT

# One step: the cheapest run with a train step and a checkpoint.
TRAIN_ARGS = [*pod_testlib.TINY_SYNTHETIC_TRAIN, "--config.warmup_steps=1",
              "--config.num_train_steps=1"]


def _pod(late, workdir, env=(), timeout_seconds=300):
  """The finished launcher (its stdout holds both processes' `[pN] `-prefixed lines); `late` is
  tests/testlib/late_host.py's P:SECONDS:FUNCTION. A failed process's peers get 60 s to stop on their
  own (the launcher would kill them at once), so every host's last line is in the output."""
  env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu", **dict(env))
  env["XLA_FLAGS"] = xla_test_flags.SUBPROCESS   # local_pod adds each host's devices
  r = subprocess.run([*pod_testlib.pod_command(), "--peer_grace_seconds=60",
                      f"--timeout_seconds={timeout_seconds}", "--",
                      "tests.testlib.late_host", late, *TRAIN_ARGS, f"--workdir={workdir}"],
                     cwd=ROOT, env=env, capture_output=True, text=True,
                     timeout=timeout_seconds + 60)
  return r


@pytest.mark.slow
def test_a_host_40_s_late_to_the_first_step_trains_with_the_other(tmp_path):
  # Process 1 sleeps 40 s after building its steps: process 0 compiles the state init and the
  # train step and waits for it at their first runs. Without the meeting, process 0 died 30 s
  # into the train step: `Gloo context initialization failed: DEADLINE_EXCEEDED: GetKeyValue()
  # timed out with key: cpu:gloo/0,1,2,3,2048,2049,2050,2051/4`.
  r = _pod("1:40:build_steps", tmp_path / "run")
  out = r.stdout + r.stderr
  assert r.returncode == 0, pod_testlib.failure(r)
  assert "[p1] late_host: process 1 sleeps 40 s after build_steps" in out
  assert "[p0] step 1/1 | loss" in out and "[p0] checkpoint 1 saved" in out, out[-3000:]
  # Waiting says nothing: no line of ours or JAX's about the barrier, the wait or a timeout.
  assert not [l for l in out.splitlines()
              if any(w in l.lower() for w in ("barrier", "waited", "deadline", "timed out"))], out


@pytest.mark.slow
def test_a_host_that_does_not_come_in_time_is_one_line_naming_it(tmp_path):
  # A 3 s limit and a host 15 s late to the run's first collective (the workdir lock): process
  # 0 stops with one line naming process 1 and the fix; process 1, coming after process 0 gave
  # up, says it is the slow one. Both exit 2 (a user error), before any model is built.
  r = _pod("1:15:check_workdir", tmp_path / "run",
           env={"BERT_JAX_BARRIER_TIMEOUT_SECONDS": "3"}, timeout_seconds=200)
  lines = (r.stdout + r.stderr).splitlines()
  assert r.returncode == 1, pod_testlib.failure(r)
  errors_ = [l for l in lines if "error" in l.lower() or "Traceback" in l]
  assert errors_ == [
      "[p0] error: process 0 waited 3 s at the workdir lock for process 1 (of 2), which never "
      "came: see process 1's output for why (a slower compilation, a stalled input, an error); "
      "if it is only slow, set BERT_JAX_BARRIER_TIMEOUT_SECONDS higher than 3 (seconds) on "
      "every host.",
      "[p1] error: process 1 came to the workdir lock after the other processes had stopped "
      "waiting for it (3 s): this host is the slow one, see the others' errors; if it is only "
      "slow, set BERT_JAX_BARRIER_TIMEOUT_SECONDS higher than 3 (seconds) on every host."
  ], pod_testlib.failure(r)
  # (process 0's exit waits for process 1's at JAX's shutdown barrier: either may end first)
  assert lines[-1].startswith("[local_pod] FAILED: process ") and lines[-1].endswith(
      "(p0: exited with code 2, p1: exited with code 2)"), pod_testlib.failure(r)
