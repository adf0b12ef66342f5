r"""A TPU pod on one machine: N JAX processes on localhost, each with its own fake CPU devices.

  python -m launch.local_pod --num_processes=2 --devices_per_process=4 -- \
      bert_jax.train --config=bert_jax/configs/pretrain.py:tiny --workdir=/tmp/pod

Each process runs `python -m MODULE ARGS...` with
  XLA_FLAGS=--xla_force_host_platform_device_count=K   (K fake CPU devices per process)
  JAX_PLATFORMS=cpu
  BERT_JAX_COORDINATOR=localhost:PORT, BERT_JAX_NUM_PROCESSES=N, BERT_JAX_PROCESS_ID=i
  BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS=--heartbeat_timeout_seconds
and `bert_jax.parallel.distributed.maybe_initialize_distributed()` turns those into the same
`jax.distributed.initialize` call a multi-host pod makes (with gloo collectives on CPU), so
jax.process_count() == N and jax.devices() lists N*K devices.

Output lines are prefixed `[p0] `, `[p1] `, ..., less gloo's all-peers-connected line, which
no library setting silences (`is_gloo_connected_line`; --show_gloo_lines relays it). When a
process exits non-zero, the launcher names it, waits up to --peer_grace_seconds for the others to
stop on their own (the coordination service's heartbeat check does that on a real pod), then
kills them and exits non-zero. It never hangs: --timeout_seconds bounds the whole run.
"""

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from absl import flags

from bert_jax_core import errors

_NUM_PROCESSES = flags.DEFINE_integer("num_processes", 2, "JAX processes (simulated hosts).")
_DEVICES = flags.DEFINE_integer("devices_per_process", 4, "Fake CPU devices in each process.")
_PORT = flags.DEFINE_integer("coordinator_port", 0,
                             "Coordinator port on localhost; 0 picks a free one.")
_HEARTBEAT = flags.DEFINE_integer(
    "heartbeat_timeout_seconds", 10,
    "A process silent this long is declared dead by the coordination service (JAX: 100).")
_GRACE = flags.DEFINE_float(
    "peer_grace_seconds", 0.0,
    "After a process fails, how long the others may take to stop by themselves before the "
    "launcher kills them. 0 kills at once; tests of the heartbeat path set it above the "
    "heartbeat timeout.")
_TIMEOUT = flags.DEFINE_float(
    "timeout_seconds", 0.0, "Kill everything and fail after this long; 0 means no limit.")
_SHOW_GLOO = flags.DEFINE_bool(
    "show_gloo_lines", False,
    "Relay gloo's '[Gloo] Rank R is connected to N peer ranks' line (one per communicator a "
    "process builds, all saying it connected to every peer); dropped by default.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# SIGTERM, then SIGKILL after this long (JAX's preemption notifier catches SIGTERM, so a
# process blocked in a collective may ignore it).
_TERM_WAIT_SECONDS = 3.0


class LocalPodError(errors.UserError):
  """A bad launcher flag or command."""


def free_port() -> int:
  """A TCP port that was free a moment ago (bind to 0, read it back, release)."""
  with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def child_env(base: dict[str, str], *, process_id: int, num_processes: int,
              devices_per_process: int, port: int, heartbeat_timeout_seconds: int
              ) -> dict[str, str]:
  """The environment of simulated host `process_id` (see module docstring)."""
  env = dict(base)
  # Drop an inherited device count (tests/conftest.py sets 8) and keep any other XLA flag.
  xla = [f for f in env.get("XLA_FLAGS", "").split()
         if not f.startswith("--xla_force_host_platform_device_count")]
  xla.append(f"--xla_force_host_platform_device_count={devices_per_process}")
  env["XLA_FLAGS"] = " ".join(xla)
  env["JAX_PLATFORMS"] = "cpu"
  env["BERT_JAX_COORDINATOR"] = f"localhost:{port}"
  env["BERT_JAX_NUM_PROCESSES"] = str(num_processes)
  env["BERT_JAX_PROCESS_ID"] = str(process_id)
  env["BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS"] = str(heartbeat_timeout_seconds)
  env["PYTHONUNBUFFERED"] = "1"  # lines appear as they are printed, not at exit
  env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
  return env


def describe_exit(code: int) -> str:
  if code < 0:
    try:
      return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
      return f"was killed by signal {-code}"
  return f"exited with code {code}"


# gloo, built into jaxlib 0.10.2 for CPU collectives, writes this line to stdout with std::cout,
# with no log level or environment variable to turn it off (gloo/transport/tcp/context.cc,
# Context::printConnectivityInfo, in the gloo version XLA pins), whenever a process builds a
# communicator: in a 2 x 4 pod bert_jax.train and bert_jax.finetune build 4 pair communicators
# and 1 all-device one per process, 8 lines a process, 16 of a 36-line pre-training run's output.
# It cannot be silenced at the source (it is the first run of an XLA collective, on XLA's
# threads), so the relay drops it, matching the whole line and only when all peers connected
# (N == M); anything else from gloo, such as `[Gloo] Rank R is NOT connected to: [...]` or a
# count short of the expected one, is relayed.
_GLOO_CONNECTED = re.compile(r"\[Gloo\] Rank \d+ is connected to (\d+) peer ranks\. "
                             r"Expected number of connected peer ranks is : (\d+)")
# gloo writes that line in 7 `<<` pieces from each communicator's thread, and a process builds its
# communicators on several threads at once, so copies interleave piece by piece and the newlines
# fall anywhere among them (CIs of 2026-11-26: `[Gloo] Rank [Gloo] Rank 3 is connected to 7 peer
# ranks. Expected number of connected peer ranks is : 7` then `2 is connected to 7 peer ranks.
# Expected ... : 7`; another run: `Expected number of connected peer ranks is : 7` alone). A line
# made only of those pieces, with at least one of the words, is dropped. Its counts cannot be
# paired any more, but nothing is lost: gloo follows a short count with its own `is NOT connected
# to: [...]` line (Context::printConnectivityInfo), which is not made of these pieces and is always
# relayed. A split can also leave a number alone on a line; GlooFilter drops such a line only
# while the stream's gloo words still owe a number (each of `Rank `, ` is connected to ` and
# `is : ` is followed by one), so a program's own bare number is relayed.
_GLOO_WORDS = ("[Gloo] Rank ", " is connected to ", " peer ranks. ",
               "Expected number of connected peer ranks is : ")
_GLOO_PIECES = re.compile("(?:" + "|".join(re.escape(w) for w in _GLOO_WORDS) + r"|\d+)+")
# The words after which gloo writes a number: the rank, the count connected, the count expected.
_GLOO_NUMBER_BEFORE = ("Rank ", " is connected to ", "ranks is : ")


def is_gloo_connected_line(line: str) -> bool:
  """True for gloo's all-peers-connected line (see _GLOO_CONNECTED), whole or interleaved with
  another thread's copy (_GLOO_PIECES), and nothing else; a bare number is GlooFilter's call."""
  line = line.rstrip("\n")
  m = _GLOO_CONNECTED.fullmatch(line)
  if m:
    return m[1] == m[2]
  return any(w in line for w in _GLOO_WORDS) and _GLOO_PIECES.fullmatch(line) is not None


class GlooFilter:
  """One process's stdout: drops gloo's connected lines, and a bare number while gloo owes one."""

  def __init__(self):
    self.numbers_owed = 0

  def drop(self, line: str) -> bool:
    text = line.rstrip("\n")
    if is_gloo_connected_line(text):
      owed = sum(text.count(w) for w in _GLOO_NUMBER_BEFORE) - len(re.findall(r"\d+", text))
      self.numbers_owed = max(0, self.numbers_owed + owed)
      return True
    if text.isdigit() and self.numbers_owed > 0:
      self.numbers_owed -= 1
      return True
    return False


def _pump(prefix: str, stream, out, lock: threading.Lock, show_gloo_lines: bool = False):
  gloo = GlooFilter()
  for line in iter(stream.readline, ""):
    if not show_gloo_lines and gloo.drop(line):
      continue
    with lock:
      out.write(prefix + line if line.endswith("\n") else prefix + line + "\n")
      out.flush()
  stream.close()


def _stop(procs: list[subprocess.Popen]):
  for p in procs:
    if p.poll() is None:
      p.terminate()
  deadline = time.monotonic() + _TERM_WAIT_SECONDS
  for p in procs:
    if p.poll() is None:
      try:
        p.wait(timeout=max(0.0, deadline - time.monotonic()))
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def run_pod(command: list[str], *, num_processes: int, devices_per_process: int, port: int = 0,
            heartbeat_timeout_seconds: int = 10, peer_grace_seconds: float = 0.0,
            timeout_seconds: float = 0.0, show_gloo_lines: bool = False, out=None) -> int:
  """Runs `python -m command...` as `num_processes` hosts; returns 0 only if all exited 0."""
  out = out or sys.stdout
  if num_processes < 1 or devices_per_process < 1:
    raise LocalPodError(f"--num_processes={num_processes} --devices_per_process="
                     f"{devices_per_process}: both must be >= 1.")
  if not command:
    raise LocalPodError("no module to run: pass it after `--`, e.g. "
                     "`python -m launch.local_pod -- launch.pod_check`.")
  port = port or free_port()
  lock = threading.Lock()

  def say(msg):
    with lock:
      out.write(f"[local_pod] {msg}\n")
      out.flush()

  say(f"{num_processes} processes x {devices_per_process} CPU devices, coordinator "
      f"localhost:{port}: python -m {' '.join(command)}")
  procs, pumps = [], []
  try:
    for i in range(num_processes):
      env = child_env(os.environ, process_id=i, num_processes=num_processes,
                      devices_per_process=devices_per_process, port=port,
                      heartbeat_timeout_seconds=heartbeat_timeout_seconds)
      p = subprocess.Popen([sys.executable, "-u", "-m", *command], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           errors="replace", start_new_session=True)
      procs.append(p)
      t = threading.Thread(target=_pump, args=(f"[p{i}] ", p.stdout, out, lock, show_gloo_lines),
                           daemon=True)
      t.start()
      pumps.append(t)

    start = time.monotonic()
    failed = None  # (index, code) of the first process that exited non-zero
    failed_at = 0.0
    while any(p.poll() is None for p in procs):
      now = time.monotonic()
      if failed is None:
        for i, p in enumerate(procs):
          if p.poll() not in (None, 0):
            failed, failed_at = (i, p.returncode), now
            alive = [f"p{j}" for j, q in enumerate(procs) if q.poll() is None]
            say(f"process {i} (pid {p.pid}) {describe_exit(p.returncode)}; "
                f"{'waiting up to %gs for ' % peer_grace_seconds if peer_grace_seconds else 'stopping '}"
                f"{', '.join(alive) or 'no other process'}")
            break
      if failed is not None and now - failed_at >= peer_grace_seconds:
        break
      if timeout_seconds and now - start > timeout_seconds:
        say(f"timed out after {timeout_seconds:g}s with "
            f"{', '.join(f'p{j}' for j, q in enumerate(procs) if q.poll() is None)} still "
            "running; killing them")
        _stop(procs)
        for t in pumps:
          t.join(timeout=5)
        return 124
      time.sleep(0.05)
  except KeyboardInterrupt:
    say("interrupted; stopping all processes")
    _stop(procs)
    return 130
  finally:
    still = [i for i, p in enumerate(procs) if p.poll() is None]
    _stop(procs)
    for t in pumps:
      t.join(timeout=5)

  codes = [p.returncode for p in procs]
  if failed is None and all(c == 0 for c in codes):
    say(f"all {num_processes} processes exited 0")
    return 0
  if failed is None:  # failure found only after the loop ended
    failed = next((i, c) for i, c in enumerate(codes) if c != 0)
  if still:
    say(f"stopped p{', p'.join(map(str, still))} (still running when process {failed[0]} "
        "failed)")
  summary = ", ".join(f"p{i}: {describe_exit(c)}" for i, c in enumerate(codes))
  say(f"FAILED: process {failed[0]} {describe_exit(failed[1])} first ({summary})")
  return 1


def main(argv):
  code = run_pod(argv[1:], num_processes=_NUM_PROCESSES.value,
                 devices_per_process=_DEVICES.value, port=_PORT.value,
                 heartbeat_timeout_seconds=_HEARTBEAT.value,
                 peer_grace_seconds=_GRACE.value, timeout_seconds=_TIMEOUT.value,
                 show_gloo_lines=_SHOW_GLOO.value)
  sys.exit(code)


if __name__ == "__main__":
  errors.run(main)
