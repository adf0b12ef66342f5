"""Multi-host start-up: one call that joins the JAX distributed system, and a cross-host check.

`maybe_initialize_distributed()` is the first thing the trainer calls, before any other JAX call
(jax.distributed.initialize must run before the backend starts). It picks one of three paths:

  1. `BERT_JAX_COORDINATOR` is set (the local pod simulation `python -m launch.local_pod`, or a
     hand-launched multi-node GPU job): explicit `jax.distributed.initialize(coordinator, N, id)`
     from `BERT_JAX_COORDINATOR` (host:port), `BERT_JAX_NUM_PROCESSES`, `BERT_JAX_PROCESS_ID`,
     with gloo for cross-process collectives on CPU. Wins over everything else: the launcher
     asked for it.
  2. `distributed=True`: `jax.distributed.initialize()` with no arguments; JAX detects Cloud
     TPU, Slurm, Open MPI and Kubernetes JobSets by itself (use it for a cluster that path 3
     does not recognise, e.g. a Kubernetes JobSet of GPU nodes).
  3. `distributed=None` (the default): the same no-argument call when the environment says
     "multi-host": a Cloud TPU VM (a Google TPU chip on the PCI bus; on a one-host VM this makes
     a 1-process system, which costs a metadata query and nothing else), a TPU
     GKE pod (`TPU_WORKER_HOSTNAMES` / `MEGASCALE_COORDINATOR_ADDRESS`), Slurm with
     `SLURM_NTASKS` > 1 or Open MPI with `OMPI_COMM_WORLD_SIZE` > 1. Otherwise nothing: a laptop
     or a single GPU box runs as one process.
  `distributed=False` never initializes (except path 1).

Dead peers: the coordination service drops a process that has not sent a heartbeat for
`heartbeat_timeout_seconds`, and then terminates every other process with an error naming the
service, so a crashed or preempted host stops the whole job instead of leaving the rest blocked
in a collective forever. `BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS` overrides the value (the local
launcher uses 10 s so tests fail fast; pods keep JAX's 100 s, which rides over short network
blips).

Meeting before a first collective (`meet`, `TogetherOnFirstCall`): on CPU (gloo) a program's
cross-process collectives build their gloo communicator when the program first runs (one per
device group: in bert_jax.train the workdir lock's broadcast builds those of the process pairs,
the train step the all-device one), and each process waits only 30 s for the others' addresses (hard-coded in jaxlib 0.10.2: `Gloo context
initialization failed: DEADLINE_EXCEEDED: GetKeyValue() timed out ... 30s`); once built, a
collective waits 30 minutes. A host that compiles the step 40 s later than another (a loaded
machine, a cold compilation cache) killed the whole pod. So every process meets at a
coordination-service barrier, which waits `BERT_JAX_BARRIER_TIMEOUT_SECONDS` (default 30 min),
after compiling and before the first run of each cross-process step.
"""

import contextlib
import glob
import hashlib
import itertools
import logging
import os
import signal

import jax
import numpy as np

from bert_jax_core import errors

ENV_COORDINATOR = "BERT_JAX_COORDINATOR"
ENV_NUM_PROCESSES = "BERT_JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "BERT_JAX_PROCESS_ID"
ENV_HEARTBEAT = "BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS"
ENV_BARRIER_TIMEOUT = "BERT_JAX_BARRIER_TIMEOUT_SECONDS"

# JAX's own defaults (jax 0.10.2): 100 s heartbeat, 300 s to connect, 300 s shutdown barrier.
DEFAULT_HEARTBEAT_TIMEOUT_SECONDS = 100
DEFAULT_INITIALIZATION_TIMEOUT_SECONDS = 300
DEFAULT_SHUTDOWN_TIMEOUT_SECONDS = 300
# How long `meet` waits for the other processes: XLA's own wait inside a CPU collective
# (DefaultCollectiveTimeout, 30 min), long enough for a slow host to compile BERT-large. A dead
# peer does not make it wait that long: the heartbeat check above stops the job first.
DEFAULT_BARRIER_TIMEOUT_SECONDS = 1800


class DistributedSetupError(errors.UserError):
  """The BERT_JAX_* environment is malformed, or hosts disagree on a value."""


class PeerTimeoutError(errors.UserError):
  """Another process of the pod did not reach a meeting point in time."""


_ENV_FIX = (f"because {ENV_COORDINATOR} is set; launch with `python -m launch.local_pod` or "
            "set all three BERT_JAX_* variables")


def _env_int(name: str, lo: int, hi: int | None = None, fix: str = _ENV_FIX) -> int:
  raw = os.environ.get(name, "")
  try:
    value = int(raw)
  except ValueError:
    value = None
  if value is None or value < lo or (hi is not None and value > hi):
    bound = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
    raise DistributedSetupError(f"env {name}={raw!r}: expected {bound} {fix}.")
  return value


# Google's PCI vendor id; TPU chips are PCI class 0x12 ("processing accelerators"), which tells
# them from the same vendor's gVNIC network cards (class 0x02) on any GCE VM. jax's own check
# (a private module, jax._src.hardware_utils) reads the same sysfs files with a table of TPU
# device ids; the class test needs no table to keep up with new TPU generations.
_GOOGLE_PCI_VENDOR = "0x1ae0"
_PCI_CLASS_ACCELERATOR = "0x12"


def tpu_chips_present(pci_devices: str = "/sys/bus/pci/devices") -> bool:
  """True when this machine has a Google TPU chip (Linux sysfs; False elsewhere)."""
  for vendor_file in glob.glob(os.path.join(pci_devices, "*", "vendor")):
    device = os.path.dirname(vendor_file)
    try:
      with open(vendor_file) as f:
        vendor = f.read().strip()
      with open(os.path.join(device, "class")) as f:
        device_class = f.read().strip()
    except OSError:  # a device that went away, or a restricted sysfs entry
      continue
    if vendor == _GOOGLE_PCI_VENDOR and device_class.startswith(_PCI_CLASS_ACCELERATOR):
      return True
  return False


def _multihost_env_detected() -> bool:
  """True where a no-argument jax.distributed.initialize() finds a cluster (see docstring)."""
  if tpu_chips_present():
    return True
  if os.environ.get("TPU_WORKER_HOSTNAMES") or os.environ.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return True
  for name in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE"):
    try:
      if int(os.environ.get(name, "1")) > 1:
        return True
    except ValueError:
      pass
  return False


# jax.distributed.initialize logs at INFO through this logger (jax 0.10.2): "Starting JAX
# distributed service on [::]:PORT" (process 0) and "Connecting to JAX distributed service on
# HOST:PORT" (every process). absl turns the root logger to INFO once flags are parsed, before a
# program's main() can lower it (trainer_lib.quiet_logging), so a 2-process pod printed 3 such
# lines (`I1126 03:22:29.129541 ... distributed.py:172] Connecting to ...`), nothing a user acts on.
_JAX_DISTRIBUTED_LOGGER = "jax._src.distributed"


@contextlib.contextmanager
def _without_jax_info_lines():
  """jax.distributed's INFO lines off for the call; its warnings (proxy variables) still print.

  Left as it is when the user asked for logs: `--verbosity` given, or a level set on the `jax`
  loggers (JAX_LOGGING_LEVEL, JAX_DEBUG_LOG_MODULES). The level is put back afterwards.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  logger = logging.getLogger(_JAX_DISTRIBUTED_LOGGER)
  asked = (("verbosity" in flags.FLAGS and flags.FLAGS["verbosity"].present) or
           any(logging.getLogger(name).level != logging.NOTSET
               for name in ("jax", "jax._src", _JAX_DISTRIBUTED_LOGGER)))
  if not asked:
    logger.setLevel(logging.WARNING)
  try:
    yield
  finally:
    if not asked:
      logger.setLevel(logging.NOTSET)


def maybe_initialize_distributed(
    distributed: bool | None = None,
    *,
    heartbeat_timeout_seconds: int | None = None,
    initialization_timeout: int = DEFAULT_INITIALIZATION_TIMEOUT_SECONDS,
    shutdown_timeout_seconds: int = DEFAULT_SHUTDOWN_TIMEOUT_SECONDS,
) -> str:
  """Joins the JAX distributed system when the environment calls for it; see module docstring.

  Args:
    distributed: True forces `jax.distributed.initialize()`, False never calls it, None detects.
    heartbeat_timeout_seconds: a peer silent this long is declared dead and the job stops;
      None reads `BERT_JAX_HEARTBEAT_TIMEOUT_SECONDS`, else 100.
    initialization_timeout: seconds to wait for every process to connect.
    shutdown_timeout_seconds: seconds the exit barrier waits for the other processes.

  Returns:
    How it started: "env" (BERT_JAX_* variables), "auto" (no-argument initialize),
    "already" (initialized before this call) or "single" (one process, nothing done).
  """
  if jax.distributed.is_initialized():
    return "already"
  if heartbeat_timeout_seconds is None:
    heartbeat_timeout_seconds = (_env_int(ENV_HEARTBEAT, 1, fix="(seconds); unset it for 100")
                                 if os.environ.get(ENV_HEARTBEAT)
                                 else DEFAULT_HEARTBEAT_TIMEOUT_SECONDS)
  barrier_timeout_seconds()   # a bad BERT_JAX_BARRIER_TIMEOUT_SECONDS: one line now, not later
  timeouts = dict(initialization_timeout=initialization_timeout,
                  heartbeat_timeout_seconds=heartbeat_timeout_seconds,
                  shutdown_timeout_seconds=shutdown_timeout_seconds)
  coordinator = os.environ.get(ENV_COORDINATOR, "")
  if coordinator:
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
      raise DistributedSetupError(
          f"env {ENV_COORDINATOR}={coordinator!r}: expected host:port such as "
          "localhost:12345 (the address of process 0).")
    num_processes = _env_int(ENV_NUM_PROCESSES, 1)
    process_id = _env_int(ENV_PROCESS_ID, 0, num_processes - 1)
    # Cross-process collectives between CPU devices (the local simulation) go through gloo
    # over TCP; jax 0.10.2 defaults to it already, set here so the choice is explicit.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    with _without_jax_info_lines():
      jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                 process_id=process_id, **timeouts)
    if os.environ.get("JAX_PLATFORMS") == "cpu":
      persistent_cache_on_every_process()
    return "env"
  if distributed is False:
    return "single"
  if distributed or _multihost_env_detected():
    with _without_jax_info_lines():
      jax.distributed.initialize(**timeouts)
    return "auto"
  return "single"


def persistent_cache_on_every_process() -> bool:
  """Lets every process of a CPU pod on one machine (path 1 with JAX_PLATFORMS=cpu: the local
  pod) write its compiled programs to the persistent compilation cache, not only process 0.

  JAX writes the cache from process 0 only (jax/_src/compiler.py `_cache_write`: "problems with
  contention for writes on some filesystems, e.g., GCS"), and on CPU each process's programs have
  keys of their own (measured: with JAX_EXPLAIN_CACHE_MISSES=1, process 1's keys were never among
  the entries process 0 had written, for the same programs), so processes 1..N-1 of a local pod
  found nothing and compiled every program on every run, while process 0 waited for them at the
  first step's meeting. Here all processes share one local disk and write disjoint keys. Measured
  on the 2-core box (2026-11-26, BERT-tiny, 2 x 4 pod, 3 steps, warm cache, second run):
  process 1 took 16.0 CPU s before and 8.0 after, the pod 16 s wall before and 9 s after.
  Only the process check is lifted: host callbacks and the minimum compile time are JAX's rules
  as before (JAX's own function runs for them), as is its warning when a write fails. Returns
  False (JAX's behaviour kept) when this JAX has no such function.
  """
  try:
    from jax._src import compilation_cache  # pylint: disable=g-import-not-at-top
    from jax._src import compiler  # pylint: disable=g-import-not-at-top
    from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
    jax_write = compiler._cache_write  # pylint: disable=protected-access
    put = compilation_cache.put_executable_and_time
  except (ImportError, AttributeError):
    return False
  if getattr(jax_write, "every_process", False):
    return True

  def cache_write(cache_key, compile_time_secs, module_name, backend, executable,
                  host_callbacks):
    if (jax_distributed.global_state.process_id == 0 or host_callbacks
        or compile_time_secs < jax.config.jax_persistent_cache_min_compile_time_secs):
      return jax_write(cache_key, compile_time_secs, module_name, backend, executable,
                       host_callbacks)
    try:
      put(cache_key, module_name, executable, backend, int(compile_time_secs))
    except Exception as ex:  # pylint: disable=broad-except  # JAX's own handling of a failed write
      import warnings  # pylint: disable=g-import-not-at-top
      warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}': "
                    f"{type(ex).__name__}: {ex}")
    return None

  cache_write.every_process = True
  compiler._cache_write = cache_write  # pylint: disable=protected-access
  return True


# ----------------------------------------------------------------------------------------------
# Meeting points: every process waits for the others before a first collective (module docstring).
# ----------------------------------------------------------------------------------------------
_meetings: dict[str, itertools.count] = {}   # what -> how many times this process met there


def barrier_timeout_seconds() -> int:
  """`BERT_JAX_BARRIER_TIMEOUT_SECONDS`, else 1800."""
  if os.environ.get(ENV_BARRIER_TIMEOUT):
    return _env_int(ENV_BARRIER_TIMEOUT, 1, fix="(seconds); unset it for 1800")
  return DEFAULT_BARRIER_TIMEOUT_SECONDS


def meet(what: str, timeout_seconds: int | None = None) -> None:
  """Returns once every process of the pod has called meet(what) as often; nothing on one.

  A barrier of JAX's coordination service, not a device collective, so it waits
  `timeout_seconds` (None: `barrier_timeout_seconds()`) and says nothing while it waits. The
  n-th meeting at `what` is one barrier on every process (the same program makes the same
  calls). Raises PeerTimeoutError, one line naming the processes that did not come.
  """
  if jax.process_count() == 1:
    return
  timeout = timeout_seconds or barrier_timeout_seconds()
  # jax 0.10.2 has no public barrier: this is the client orbax's barriers and jax's own
  # multi-process tests (jax/_src/test_multiprocess.py) wait on.
  from jax._src import distributed as jax_distributed  # pylint: disable=g-import-not-at-top
  state = jax_distributed.global_state
  me, num = state.process_id, state.num_processes
  key = f"bert_jax/meet/{what}/{next(_meetings.setdefault(what, itertools.count()))}"
  state.client.key_value_set(f"{key}/{me}", "here")   # who came, for the error below
  try:
    state.client.wait_at_barrier(key, timeout * 1000)
  except jax.errors.JaxRuntimeError as e:
    if not str(e).startswith("DEADLINE_EXCEEDED"):
      raise   # not a timeout (the service stopped: a peer died); JAX's own error says which
    came = {int(k.rsplit("/", 1)[-1]) for k, _ in state.client.key_value_dir_get(key + "/")}
    missing = [p for p in range(num) if p not in came]
    fix = (f"if {'they are' if len(missing) > 1 else 'it is'} only slow, set "
           f"{ENV_BARRIER_TIMEOUT} higher than {timeout} (seconds) on every host")
    if missing:
      who = (f"processes {', '.join(map(str, missing))}" if len(missing) > 1
             else f"process {missing[0]}")
      raise PeerTimeoutError(
          f"process {me} waited {timeout} s at {what} for {who} (of {num}), which never came: "
          f"see {who}'s output for why (a slower compilation, a stalled input, an error); "
          f"{fix}.") from None
    raise PeerTimeoutError(
        f"process {me} came to {what} after the other processes had stopped waiting for it "
        f"({timeout} s): this host is the slow one, see the others' errors; {fix}.") from None


class TogetherOnFirstCall:
  """A jitted step whose first call compiles it, meets the other processes, then runs it.

  Compiling before meeting is the point: compilation is where hosts differ most (minutes for a
  large model, a compilation-cache hit on one host and a miss on another), and the step's gloo
  communicators are built only when it first runs (module docstring). Later calls are the
  jitted function's own: jax keeps the executable compiled here (no second compilation).
  One process: the jitted function, no meeting. `lower` and other attributes are the function's.
  """

  def __init__(self, fn, what: str):
    self._fn, self._what, self._first = fn, what, True

  def __call__(self, *args):
    if self._first:
      if jax.process_count() > 1:
        self._fn.lower(*args).compile()
        meet(f"the first {self._what}")
      self._first = False
    return self._fn(*args)

  def __getattr__(self, name):   # lower, eval_shape, ...: the jitted function's
    if name.startswith("_"):     # _fn itself (not set yet while copying): no recursion
      raise AttributeError(name)
    return getattr(self._fn, name)


def _as_bytes(value: bytes | str) -> bytes:
  return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def assert_same_on_all_hosts(name: str, value: bytes | str) -> str:
  """Raises on every host unless all processes passed the same `value`; returns its sha256.

  Each host hashes its value and all hosts exchange the 32-byte digests with one allgather, so
  every host sees the whole table and raises the same error: no host is left waiting.
  Use it at start-up for the config, the vocab file and anything else that must match.
  """
  digest = hashlib.sha256(_as_bytes(value)).digest()
  if jax.process_count() == 1:
    return digest.hex()
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  meet(f"the {name} check")   # often a program's first collective: see `meet`
  local = np.frombuffer(digest, dtype=np.uint8)  # [32]
  table = np.asarray(multihost_utils.process_allgather(local))  # [num_processes, 32]
  hexes = [bytes(row.astype(np.uint8)).hex() for row in table]
  if len(set(hexes)) != 1:
    groups = {}
    for pid, h in enumerate(hexes):
      groups.setdefault(h, []).append(pid)
    found = "; ".join(f"processes {pids} have sha256 {h[:12]}" for h, pids in groups.items())
    raise DistributedSetupError(
        f"{name} differs across hosts (this is process {jax.process_index()}): {found}. "
        f"Every host must run the same code, config and files: re-run launch/setup.sh so all "
        f"workers get the same checkout, and pass identical flags to all of them.")
  return digest.hex()


class PreemptionCheck:
  """`check(step) -> bool`: True once the job has been told to stop (SIGTERM, or Ctrl-C).

  One process: SIGTERM and SIGINT (Ctrl-C) handlers set a flag, so the loop saves at its next
  step and exits; `signal_name` says which one came, for the loop's one line. A second Ctrl-C
  while the step finishes or saves is the previous SIGINT handler's again (Python's: a
  KeyboardInterrupt), so a user can still quit at once. The handlers that were there before are
  put back by `close()` (or on leaving a `with` block), so the process is left as it was found.
  Several processes: JAX's preemption sync point (registered by jax.distributed.initialize)
  answers True on every host at the same step, so all hosts save the same checkpoint; nothing is
  installed here (a pod is stopped by SIGTERM from its launcher, not by a terminal's Ctrl-C).

    with distributed.preemption_check() as preempted:
      for step in ...:
        if preempted(step): save(step); break
  """

  SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C (SIGINT)"}

  def __init__(self):
    self._stop = False
    self.signal_name = "SIGTERM"   # what the multi-host sync point answers for
    self._previous = {}            # signal -> the handler found there (None: not from Python)
    self._multihost = jax.process_count() > 1
    if not self._multihost:
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._on_signal)

  def _on_signal(self, signum, frame):
    del frame
    self._stop = True
    self.signal_name = self.SIGNALS[signum]
    if signum == signal.SIGINT:   # the next Ctrl-C interrupts, as it would have without us
      signal.signal(signal.SIGINT, self._handler_before(signal.SIGINT))

  def _handler_before(self, sig):
    previous = self._previous.get(sig)
    return signal.SIG_DFL if previous is None else previous

  def __call__(self, step: int) -> bool:
    if self._multihost:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
      return multihost_utils.reached_preemption_sync_point(step)
    return self._stop

  def close(self):
    """Puts the previous SIGTERM and SIGINT handlers back (SIG_DFL where one was not set from
    Python)."""
    for sig in list(self._previous):
      signal.signal(sig, self._handler_before(sig))
    self._previous = {}

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def preemption_check() -> PreemptionCheck:
  """A PreemptionCheck; use it in a `with` block (or call close()) to restore SIGTERM and
  SIGINT."""
  return PreemptionCheck()
