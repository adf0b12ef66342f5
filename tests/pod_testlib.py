"""Shared by the tests that start a 2-host pod on localhost with `launch.local_pod`."""

import sys


def pod_command(num_processes=2, devices_per_process=4):
  """The launcher's command line up to its `--`.

  The launcher's 10 s heartbeat catches a dead peer fast (tests/local_pod_test.py tests that
  path); here a peer starved of CPU for 10 s on a shared 2-core box must not read as dead.
  """
  return [sys.executable, "-m", "launch.local_pod", f"--num_processes={num_processes}",
          f"--devices_per_process={devices_per_process}", "--heartbeat_timeout_seconds=60"]


def failure(r):
  """What a failed pod printed, without the interpreter's extension-module lists of an abort
  (which fill the tail and hide the cause): the fatal lines first, then the last 60 lines."""
  lines = [l for l in (r.stdout + r.stderr).splitlines() if "Extension modules" not in l]
  fatal = [l for l in lines if any(k in l for k in ("F0000", "Fatal", "Error", "error:",
                                                     "Check failed", "DEADLINE", "UNAVAILABLE"))]
  return "\n".join(fatal[:40] + ["--- last lines ---"] + lines[-60:])
