"""One run per workdir: a lock file naming its holder, taken over when the holder is gone.

  with workdir_lock.hold(workdir, "bert_jax.train"):
    ...   # the run; the lock goes on a normal exit and on an exception alike

Two runs on one workdir would interleave checkpoints, overwrite each other's tmp directories and
leave the workdir holding a mix (issue 23, fault 5). The second run is refused at once with one
line naming the holder (host, pid, start time, command) and the fix.

<workdir>/run.lock is JSON: host, pid, boot_id, proc_start, started, heartbeat, command, token.
A lock is stale (a crash, kill -9, a preempted VM) and is taken over, with a note, when:
  - it was taken on this host (same hostname) and its process is gone: the pid is not running,
    or runs another program (pid reused: /proc start time differs), or the host rebooted since
    (another boot_id);
  - it was taken elsewhere (another host, or a shared / gs:// workdir) and its heartbeat, rewritten
    every HEARTBEAT_S = 60 s by the holder, is older than STALE_AFTER_S = 10 minutes (10 missed
    beats: a GCS write stall of a few minutes does not look like a dead run).

Only the primary process of a multi-host run (process_index 0) takes the lock; every process
learns its outcome, so a refused pod fails on all hosts at once instead of waiting in a
collective. Local workdirs are taken atomically (os.link of a complete file: it fails if the lock
exists). gs:// has no exclusive create through tf.io.gfile: there the lock is written, read back
after a second and kept only if it still holds our token (two starts within that second can both
proceed: a narrow window this does not close).
"""

import contextlib
import datetime
import json
import os
import socket
import sys
import threading
import time
import uuid

import jax

from bert_jax_core import errors

NAME = "run.lock"
HEARTBEAT_S = 60
STALE_AFTER_S = 600


class WorkdirLockError(errors.UserError):
  pass


def _boot_id():
  try:
    with open("/proc/sys/kernel/random/boot_id") as f:
      return f.read().strip()
  except OSError:       # not Linux: same-host staleness rests on the pid alone
    return None


def _proc_start(pid):
  """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return int(f.read().rsplit(")", 1)[1].split()[19])
  except (OSError, IndexError, ValueError):
    return None


def _pid_running(pid):
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's live process
    return True
  return True


def _now():
  return time.time()


def _fmt(t):
  return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def why_stale(holder, now=None, stale_after_s=STALE_AFTER_S):
  """Why `holder` (a lock's JSON) no longer holds the workdir, or None while it is live."""
  now = _now() if now is None else now
  if holder.get("host") == socket.gethostname():
    boot = _boot_id()
    if boot and holder.get("boot_id") and holder["boot_id"] != boot:
      return "the host has rebooted since"
    pid = int(holder.get("pid", -1))
    if pid <= 0 or not _pid_running(pid):
      return f"pid {pid} is no longer running"
    start = _proc_start(pid)
    if start is not None and holder.get("proc_start") not in (None, start):
      return f"pid {pid} is now another process"
    return None
  age = now - float(holder.get("heartbeat", 0))
  if age > stale_after_s:
    return f"its last heartbeat was {age / 60:.0f} min ago (over {stale_after_s / 60:.0f} min)"
  return None


def describe(holder, path):
  return (f"host {holder.get('host')}, pid {holder.get('pid')}, started "
          f"{_fmt(float(holder.get('started', 0)))}, command: {holder.get('command')!r}; "
          f"lock {path}")


class _Lock:
  """The lock file of one workdir: acquire, heartbeat, release."""

  def __init__(self, workdir, program, stale_after_s=STALE_AFTER_S, heartbeat_s=HEARTBEAT_S):
    self.workdir, self.program = str(workdir), program
    self.remote = "://" in self.workdir
    self.path = (self.workdir.rstrip("/") + "/" + NAME if self.remote
                 else os.path.join(self.workdir, NAME))
    self.stale_after_s, self.heartbeat_s = stale_after_s, heartbeat_s
    self.token = uuid.uuid4().hex
    self.record = dict(host=socket.gethostname(), pid=os.getpid(), boot_id=_boot_id(),
                       proc_start=_proc_start(os.getpid()), started=_now(), heartbeat=_now(),
                       command=" ".join([os.path.basename(sys.argv[0])] + sys.argv[1:]) or program,
                       program=program, token=self.token)
    self._stop = threading.Event()
    self._thread = None

  # --- file access (local: os; gs://: tf.io.gfile) ---
  def _read(self):
    """The holder's JSON, {} for an unreadable one, None when there is no lock."""
    try:
      if self.remote:
        from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
        if not tf.io.gfile.exists(self.path):
          return None
        with tf.io.gfile.GFile(self.path) as f:
          text = f.read()
      else:
        with open(self.path) as f:
          text = f.read()
    except FileNotFoundError:
      return None
    try:
      return json.loads(text)
    except json.JSONDecodeError:
      return {}   # a torn write (local writes are atomic, so a gs:// one): judged by its age

  def _write(self, exclusive):
    """Writes our record; exclusive: only if no lock exists (False: lost the race)."""
    text = json.dumps(dict(self.record, heartbeat=_now()), indent=1)
    if self.remote:
      from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
      with tf.io.gfile.GFile(self.path, "w") as f:
        f.write(text)
      return True
    tmp = f"{self.path}.{self.token}"
    with open(tmp, "w") as f:
      f.write(text)
    try:
      if exclusive:
        os.link(tmp, self.path)         # atomic, and fails if a lock exists
      else:
        os.replace(tmp, self.path)
      return True
    except FileExistsError:
      return False
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)

  def _remove(self):
    if self.remote:
      from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
      tf.io.gfile.remove(self.path)
    else:
      os.remove(self.path)

  # --- the protocol ---
  def _try_take(self):
    """True if we now hold the lock (there was none)."""
    if not self.remote:
      return self._write(exclusive=True)
    if self._read() is not None:
      return False
    self._write(exclusive=False)
    time.sleep(1.0)                      # a concurrent starter's write lands in this second
    return (self._read() or {}).get("token") == self.token

  def acquire(self):
    if not self.remote:
      os.makedirs(self.workdir, exist_ok=True)
    for _ in range(3):     # a stale lock removed, then raced by another starter: look again
      if self._try_take():
        break
      holder = self._read()
      if holder is None:
        continue
      if holder.get("token") == self.token:
        break
      reason = why_stale(holder, stale_after_s=self.stale_after_s) if holder else (
          "its lock file is unreadable")
      if reason is None:
        raise WorkdirLockError(
            f"--workdir={self.workdir} is in use by another run ({describe(holder, self.path)}); "
            "wait for it to finish or stop it, or use another --workdir. If that run is gone, "
            f"delete {self.path}.")
      print(f"note: taking over the lock of {self.workdir} from a run that ended without "
            f"releasing it ({reason}; {describe(holder, self.path)})", flush=True)
      if self._read() == holder:   # nobody took it over in between
        with contextlib.suppress(FileNotFoundError):
          self._remove()
    else:
      raise WorkdirLockError(f"--workdir={self.workdir}: could not take {self.path} (other runs "
                             "keep taking it); start one run per workdir.")
    self._thread = threading.Thread(target=self._beat, name="workdir-lock-heartbeat",
                                    daemon=True)
    self._thread.start()

  def _beat(self):
    while not self._stop.wait(self.heartbeat_s):
      if (self._read() or {}).get("token") != self.token:
        print(f"warning: {self.path} no longer holds this run's lock (removed or taken by "
              "another run); this workdir may now be written by two runs", file=sys.stderr,
              flush=True)
        return
      try:
        self._write(exclusive=False)
      except OSError as e:   # a full disk: the next beat tries again; the run goes on
        print(f"warning: cannot refresh {self.path} ({e}); another host may take the lock "
              f"after {self.stale_after_s / 60:.0f} min", file=sys.stderr, flush=True)

  def release(self):
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    if (self._read() or {}).get("token") == self.token:
      self._remove()


def _agree(ok):
  """Every process learns whether process 0 took the lock (one broadcast; nothing on one host)."""
  if jax.process_count() == 1:
    return ok
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.meet("the workdir lock")   # the run's first collective: no host may be 30 s late
  return bool(multihost_utils.broadcast_one_to_all(np.int32(1 if ok else 0)))


@contextlib.contextmanager
def hold(workdir, program, *, stale_after_s=STALE_AFTER_S, heartbeat_s=HEARTBEAT_S):
  """Holds `workdir`'s lock for the block (process 0 of a pod takes it for all processes).

  Raises WorkdirLockError (one line naming the holder and the fix) if another live run holds it.
  """
  lock = None
  if jax.process_index() == 0:
    lock = _Lock(workdir, program, stale_after_s, heartbeat_s)
    try:
      lock.acquire()
    except WorkdirLockError:
      _agree(False)
      raise
    _agree(True)
  elif not _agree(False):
    raise WorkdirLockError(f"--workdir={workdir} is in use by another run (process 0 could not "
                           f"take its lock; its error names the holder).")
  try:
    yield
  finally:
    if lock is not None:
      lock.release()
