r"""Smoke test of a multi-host setup: mesh, global batch from per-host shards, a jitted reduction.

Locally (2 simulated hosts x 4 CPU devices):
  python -m launch.local_pod --num_processes=2 --devices_per_process=4 -- launch.pod_check
On a TPU VM or pod slice, before a long run (every worker, like the trainer):
  MODULE=launch.pod_check launch/run.sh

Every process builds the same [global_batch, width] array in numpy, keeps only its own
contiguous rows (a disjoint shard, as a per-host input pipeline would read), and
`jax.make_array_from_process_local_data` assembles the global array over a 1-D "data" mesh of
all devices. The jitted sum and mean must equal numpy's on the whole array (the one-process
value) on every host. Process 0 prints one `RESULT {json}` line.

Fault-injection flags for tests: --mismatch_process makes one host hash a different "config";
--crash_process makes one host die (SIGKILL) after the first step while the others keep
running collectives, which must then stop within the heartbeat timeout.
"""

import json
import os
import signal
import time

from absl import flags

from bert_jax.parallel import distributed
from bert_jax_core import errors

_GLOBAL_BATCH = flags.DEFINE_integer("global_batch", 16, "Rows in the global batch.")
_WIDTH = flags.DEFINE_integer("width", 8, "Columns per row.")
_STEPS = flags.DEFINE_integer("steps", 3, "Reductions to run (each one is a collective).")
_STEP_SLEEP = flags.DEFINE_float("step_sleep_seconds", 0.0, "Pause between steps.")
_MISMATCH = flags.DEFINE_integer("mismatch_process", -1,
                                 "This process hashes a different config (test of the check).")
_CRASH = flags.DEFINE_integer("crash_process", -1, "This process SIGKILLs itself after step 0.")


def main(argv):
  del argv
  mode = distributed.maybe_initialize_distributed()

  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  pid, nproc = jax.process_index(), jax.process_count()
  print(f"process {pid}/{nproc} ({mode}): {jax.local_device_count()} local devices, "
        f"{jax.device_count()} global", flush=True)

  config = json.dumps(dict(global_batch=_GLOBAL_BATCH.value, width=_WIDTH.value,
                           salt=pid if pid == _MISMATCH.value else None), sort_keys=True)
  config_hash = distributed.assert_same_on_all_hosts("config", config)

  mesh = jax.make_mesh((jax.device_count(),), ("data",))
  sharding = NamedSharding(mesh, P("data"))
  global_batch, width = _GLOBAL_BATCH.value, _WIDTH.value
  if global_batch % nproc or global_batch % jax.device_count():
    raise errors.UserError(f"--global_batch={global_batch}: must divide by {nproc} processes and "
                     f"{jax.device_count()} devices.")
  full = np.arange(global_batch * width, dtype=np.float32).reshape(global_batch, width) / 7.0
  rows = global_batch // nproc  # the global batch is fixed; each host reads batch/hosts rows
  local = full[pid * rows:(pid + 1) * rows]  # [rows, width], this host's disjoint shard
  batch = jax.make_array_from_process_local_data(sharding, local, (global_batch, width))

  # Replicated outputs: every host can read them (a sharded output spans other hosts' devices).
  @jax.jit(out_shardings=NamedSharding(mesh, P()))
  def reduce(x):  # x: [global_batch, width]
    return jnp.sum(x), jnp.mean(x), jnp.sum(x, axis=1)  # [], [], [global_batch]

  for step in range(_STEPS.value):
    total, mean, row_sums = reduce(batch + step)
    # The row sums are replicated onto every host; each row identifies which host fed it.
    row_sums = np.asarray(row_sums)
    expected = full + step
    if not (np.isclose(float(total), expected.sum(), rtol=1e-6)
            and np.isclose(float(mean), expected.mean(), rtol=1e-6)
            and np.allclose(row_sums, expected.sum(axis=1), rtol=1e-6)):
      raise AssertionError(f"process {pid} step {step}: sum {float(total)} mean {float(mean)} "
                           f"!= one-process {expected.sum()} {expected.mean()}")
    print(f"step {step}: sum {float(total):.4f} mean {float(mean):.6f}", flush=True)
    if step == 0 and pid == _CRASH.value:
      print(f"process {pid}: crashing on purpose (--crash_process)", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(_STEP_SLEEP.value)

  # [nproc, 2]: the [start, end) rows each host fed, gathered so process 0 can report them.
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top
  shards = np.asarray(multihost_utils.process_allgather(
      np.array([pid * rows, (pid + 1) * rows], np.int32))).reshape(nproc, 2)
  if pid == 0:
    print("RESULT " + json.dumps(dict(
        process_count=nproc, device_count=jax.device_count(), global_shape=list(batch.shape),
        host_rows=shards.tolist(), sum=float(total), mean=float(mean),
        config_sha256=config_hash)), flush=True)


if __name__ == "__main__":
  errors.run(main)
