"""bert_jax.parallel.distributed in one process: env validation and the single-host paths.

The multi-process paths (initialize from BERT_JAX_*, the cross-host hash check, dead peers)
run in real processes in tests/launch/local_pod_test.py.
"""

import hashlib

import pytest

from bert_jax.parallel import distributed


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
  for name in (distributed.ENV_COORDINATOR, distributed.ENV_NUM_PROCESSES,
               distributed.ENV_PROCESS_ID, distributed.ENV_HEARTBEAT,
               distributed.ENV_BARRIER_TIMEOUT, "TPU_WORKER_HOSTNAMES",
               "MEGASCALE_COORDINATOR_ADDRESS", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    monkeypatch.delenv(name, raising=False)


def test_single_host_does_nothing():
  assert distributed.maybe_initialize_distributed() == "single"
  assert distributed.maybe_initialize_distributed(distributed=False) == "single"


@pytest.mark.parametrize("name,value,needle", [
    ("SLURM_NTASKS", "4", True), ("SLURM_NTASKS", "1", False),
    ("OMPI_COMM_WORLD_SIZE", "2", True), ("TPU_WORKER_HOSTNAMES", "h0,h1", True),
    ("SLURM_NTASKS", "junk", False)])
def test_multihost_detection_from_env(monkeypatch, name, value, needle):
  monkeypatch.setenv(name, value)
  assert distributed._multihost_env_detected() is needle


@pytest.mark.parametrize("env,needle", [
    (dict(BERT_JAX_COORDINATOR="localhost"), "expected host:port"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="two",
          BERT_JAX_PROCESS_ID="0"), "env BERT_JAX_NUM_PROCESSES='two': expected an integer"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="2",
          BERT_JAX_PROCESS_ID="2"), "env BERT_JAX_PROCESS_ID='2': expected an integer in [0, 1]"),
    (dict(BERT_JAX_COORDINATOR="localhost:1", BERT_JAX_NUM_PROCESSES="2"),
     "env BERT_JAX_PROCESS_ID=''"),
    (dict(BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS="0"), "BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS='0'"),
    (dict(BERT_JAX_BARRIER_TIMEOUT_SECONDS="30m"),
     "env BERT_JAX_BARRIER_TIMEOUT_SECONDS='30m': expected an integer >= 1 (seconds)"),
])
def test_bad_env_is_a_clear_error_before_initialize(monkeypatch, env, needle):
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  with pytest.raises(distributed.DistributedSetupError) as e:
    distributed.maybe_initialize_distributed()
  assert needle in str(e.value)
  assert "\n" not in str(e.value)


def test_hash_check_on_one_host_returns_sha256():
  assert distributed.assert_same_on_all_hosts("vocab", "a\nb\n") == hashlib.sha256(
      b"a\nb\n").hexdigest()
  assert distributed.assert_same_on_all_hosts("cfg", b"\x00\xff") == hashlib.sha256(
      b"\x00\xff").hexdigest()


def test_tpu_detection_reads_pci_vendor_and_class(tmp_path):
  def device(name, vendor, cls):
    (tmp_path / name).mkdir()
    (tmp_path / name / "vendor").write_text(vendor + "\n")
    (tmp_path / name / "class").write_text(cls + "\n")
  device("0000:00:04.0", "0x1ae0", "0x020000")  # gVNIC: Google, but a network card
  device("0000:00:05.0", "0x8086", "0x120000")  # another vendor's accelerator
  assert distributed.tpu_chips_present(str(tmp_path)) is False
  device("0000:00:06.0", "0x1ae0", "0x120000")  # a TPU chip
  assert distributed.tpu_chips_present(str(tmp_path)) is True
  assert distributed.tpu_chips_present(str(tmp_path / "missing")) is False


def test_preemption_check_restores_the_previous_sigterm_handler():
  import os
  import signal
  seen = []
  previous = signal.signal(signal.SIGTERM, lambda *a: seen.append("mine"))
  try:
    mine = signal.getsignal(signal.SIGTERM)
    with distributed.preemption_check() as preempted:
      assert signal.getsignal(signal.SIGTERM) is not mine
      assert not preempted(1)
      os.kill(os.getpid(), signal.SIGTERM)
      assert preempted(2) and seen == []  # the check took the signal, not the old handler
    assert signal.getsignal(signal.SIGTERM) is mine  # left as it was found
    check = distributed.preemption_check()
    check.close()
    check.close()  # idempotent
    assert signal.getsignal(signal.SIGTERM) is mine
  finally:
    signal.signal(signal.SIGTERM, previous)


# ----------------------------------------------------------------------------------------------
# Meeting before a first collective (distributed.meet, TogetherOnFirstCall). The real barrier of
# a 2-process pod, a host 40 s late and one that never comes: tests/end_to_end/late_host_test.py (slow).
# ----------------------------------------------------------------------------------------------
def test_one_process_meets_nobody_and_runs_the_jitted_step():
  import jax
  import jax.numpy as jnp
  distributed.meet("anything")   # returns at once: nobody to wait for
  step = distributed.TogetherOnFirstCall(jax.jit(lambda x: x * 2), "double")
  x = jnp.arange(4.0)
  assert step(x).tolist() == [0.0, 2.0, 4.0, 6.0] and step(x).tolist() == [0.0, 2.0, 4.0, 6.0]
  assert step.lower(x).compile()(x).tolist() == [0.0, 2.0, 4.0, 6.0]   # the jitted fn's own


def test_first_call_on_a_pod_compiles_then_meets_then_runs_without_compiling_again(monkeypatch):
  import jax
  import jax.numpy as jnp
  events = []
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  monkeypatch.setattr(distributed, "meet", lambda what: events.append(f"meet {what}"))

  def on_event(name, secs, **kw):   # recorded for each executable made (a cache hit too)
    del secs, kw
    if name == "/jax/core/compile/backend_compile_duration":
      events.append("compile")

  step = distributed.TogetherOnFirstCall(jax.jit(lambda x: jnp.sin(x) + 41.5), "train step")
  x = jnp.ones((3,))
  jax.monitoring.register_event_duration_secs_listener(on_event)
  try:
    step(x)
    step(x)
  finally:
    jax.monitoring.unregister_event_duration_listener(on_event)
  # Compiled before the meeting (compilation is where hosts differ), met once, and the call
  # ran the executable compiled there: one compilation in all.
  assert events == ["compile", "meet the first train step"]


class _Client:
  """The coordination-service client's calls that meet makes: processes `came` are at the
  barrier, which fails with `error`."""

  def __init__(self, came, error):
    self.kv, self.came, self.error = {}, came, error

  def key_value_set(self, key, value):
    self.kv[key] = value

  def wait_at_barrier(self, key, timeout_ms):
    self.waited = (key, timeout_ms)
    raise self.error

  def key_value_dir_get(self, prefix):
    others = {f"{prefix}{p}": "here" for p in self.came}
    return sorted({**others, **{k: v for k, v in self.kv.items() if k.startswith(prefix)}}.items())


def _fake_pod(monkeypatch, client, process_id=0, num_processes=3):
  import types
  import jax
  from jax._src import distributed as jax_distributed
  monkeypatch.setattr(jax, "process_count", lambda: num_processes)
  monkeypatch.setattr(jax_distributed, "global_state", types.SimpleNamespace(
      process_id=process_id, num_processes=num_processes, client=client))


def test_a_meeting_that_times_out_names_who_did_not_come(monkeypatch):
  import jax
  timeout = jax.errors.JaxRuntimeError("DEADLINE_EXCEEDED: Barrier timed out. Id: x")
  client = _Client(came=[], error=timeout)
  _fake_pod(monkeypatch, client)
  monkeypatch.setenv(distributed.ENV_BARRIER_TIMEOUT, "7")
  with pytest.raises(distributed.PeerTimeoutError) as e:
    distributed.meet("the first train step")
  assert str(e.value) == (
      "process 0 waited 7 s at the first train step for processes 1, 2 (of 3), which never "
      "came: see processes 1, 2's output for why (a slower compilation, a stalled input, an "
      "error); if they are only slow, set BERT_JAX_BARRIER_TIMEOUT_SECONDS higher than 7 "
      "(seconds) on every host.")
  assert client.waited == ("bert_jax/meet/the first train step/0", 7000)
  assert client.kv == {"bert_jax/meet/the first train step/0/0": "here"}

  # The host that comes after the others gave up is told it is the slow one.
  _fake_pod(monkeypatch, _Client(came=[0, 1], error=timeout), process_id=2)
  with pytest.raises(distributed.PeerTimeoutError,
                     match=r"^process 2 came to the first train step after the other processes "
                           r"had stopped waiting for it \(7 s\): this host is the slow one"):
    distributed.meet("the first train step")

  # Any other failure of the barrier (the service saw a peer die) is JAX's own error.
  _fake_pod(monkeypatch, _Client(came=[], error=jax.errors.JaxRuntimeError("UNAVAILABLE: x")))
  with pytest.raises(jax.errors.JaxRuntimeError, match="UNAVAILABLE"):
    distributed.meet("the first train step")


def test_each_meeting_is_its_own_barrier(monkeypatch):
  ids = []

  class Recording(_Client):
    def wait_at_barrier(self, key, timeout_ms):
      ids.append(key)

  _fake_pod(monkeypatch, Recording(came=[], error=None))
  for what in ("checkpoint move_aside", "checkpoint move_aside", "the workdir lock"):
    distributed.meet(what, timeout_seconds=5)
  # The n-th meeting at a place is one id on every process (all make the same calls in order).
  assert ids[0] != ids[1] and ids[0].startswith("bert_jax/meet/checkpoint move_aside/")
  assert ids[1].rsplit("/", 1)[1] == str(int(ids[0].rsplit("/", 1)[1]) + 1)
  assert ids[2].startswith("bert_jax/meet/the workdir lock/")


def test_initialize_runs_without_jax_info_lines_unless_logs_were_asked_for(monkeypatch):
  """jax.distributed.initialize's INFO lines (3 in a 2-process pod, issue 32) are off for the
  call; its warnings are not, and the level is put back. The real pod: local_pod_test."""
  import logging
  from absl import flags
  from absl import logging as absl_logging  # pylint: disable=unused-import  (defines --verbosity)
  logger = logging.getLogger("jax._src.distributed")
  assert logger.level == logging.NOTSET
  with distributed._without_jax_info_lines():  # pylint: disable=protected-access
    assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
  assert logger.level == logging.NOTSET
  # Asked for: --verbosity on the command line, or a level on JAX's loggers (JAX_LOGGING_LEVEL).
  monkeypatch.setattr(flags.FLAGS["verbosity"], "present", 1)
  with distributed._without_jax_info_lines():  # pylint: disable=protected-access
    assert logger.level == logging.NOTSET
  monkeypatch.setattr(flags.FLAGS["verbosity"], "present", 0)
  jax_logger = logging.getLogger("jax")
  previous = jax_logger.level
  jax_logger.setLevel(logging.INFO)
  try:
    with distributed._without_jax_info_lines():  # pylint: disable=protected-access
      assert logger.level == logging.NOTSET and logger.isEnabledFor(logging.INFO)
  finally:
    jax_logger.setLevel(previous)


def test_every_process_of_a_cpu_pod_writes_the_persistent_cache(tmp_path, monkeypatch):
  """JAX writes the persistent cache from process 0 only, and on CPU each process's programs have
  keys of their own, so a local pod's process 1 compiled every program on every run. After
  persistent_cache_on_every_process, a process other than 0 writes its programs too; host
  callbacks still are not written (JAX's rule)."""
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax._src import compiler  # pylint: disable=g-import-not-at-top
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  from jax.experimental.compilation_cache import compilation_cache  # pylint: disable=g-import-not-at-top
  keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
  was = {k: getattr(jax.config, k) for k in keys}
  monkeypatch.setattr(compiler, "_cache_write", compiler._cache_write)  # put back afterwards
  monkeypatch.setattr(jax_distributed.global_state, "process_id", 1)

  def entries():
    return sorted(p.name.split("-")[0] for p in tmp_path.glob("*-cache"))

  def three(x):
    return x * 3 + 1

  def five(x):
    return x * 5 - 2

  def seven(x):
    jax.debug.callback(print, x)
    return x * 7

  try:
    jax.config.update("jax_compilation_cache_dir", str(tmp_path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    compilation_cache.reset_cache()
    jax.jit(three)(np.ones(7, np.float32))
    assert entries() == []                       # JAX's rule: process 1 writes nothing
    assert distributed.persistent_cache_on_every_process()
    assert distributed.persistent_cache_on_every_process()   # twice: wrapped once
    jax.jit(five)(np.ones(9, np.float32))
    assert entries() == ["jit_five"]
    jax.jit(seven)(np.ones(3, np.float32))
    assert entries() == ["jit_five"]             # a host callback: never written
  finally:
    for k, v in was.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()
