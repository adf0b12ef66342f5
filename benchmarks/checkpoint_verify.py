r"""What checksummed checkpoints cost: manifest writing and verification for BERT-base/-large states.

  nice -n 10 .venv/bin/python -m benchmarks.checkpoint_verify [--sizes=base,large] [--state=train]

For each size, a train state of that model's shapes (random float32 params, plus Adam's two
moments with --state=train: 3x the params) is saved once with `checkpoint.Manager` (Orbax, as
the trainer saves it; the SHA-256 manifest is written inside the save), then:

  verify            checkpoint.verify_dir: size + SHA-256 of every file against the manifest
  peer: read only   the same files read in the same 8 MiB chunks on the same threads, no hashing
  peer: restore     Orbax restoring the state to host numpy (what a resume reads anyway)

The files were just written, so they are read from the page cache: these are the hashing costs,
not the disk's (a cold read from a disk or GCS adds its own bandwidth, for both verify and
restore). Rows print MB/s and seconds, and verify's time as a ratio of each peer's, measured in
this run one after the other.
"""

import argparse
import concurrent.futures
import os
import shutil
import tempfile
import time

import jax
import numpy as np

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib
from bert_jax.models import pretraining_heads


def random_state(size, with_moments):
  """{params, mu, nu}: random float32 numpy arrays of BertForPreTraining's shapes."""
  cfg = model_lib.get_bert_config(size)
  model = pretraining_heads.BertForPreTraining(cfg)
  ids = np.zeros((1, 8), np.int32)
  shapes = jax.eval_shape(lambda: model.init(
      {"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(0)}, ids, ids, ids,
      np.zeros((1, 2), np.int32), deterministic=True))["params"]
  rng = np.random.default_rng(0)

  def fill(s):
    return rng.standard_normal(s.shape, dtype=np.float32) * 0.02

  params = jax.tree.map(fill, shapes)
  state = dict(params=params)
  if with_moments:
    state.update(mu=jax.tree.map(fill, shapes), nu=jax.tree.map(fill, shapes))
  return state


def read_only(root, threads=8):
  files = manifest_lib.list_files(root)

  def read(rel):
    n = 0
    with open(os.path.join(root, rel), "rb") as f:
      while chunk := f.read(manifest_lib.CHUNK):
        n += len(chunk)
    return n

  with concurrent.futures.ThreadPoolExecutor(min(threads, len(files))) as pool:
    return sum(pool.map(read, files))


def bench(size, with_moments, workdir, repeats):
  state = random_state(size, with_moments)
  n_params = sum(x.size for x in jax.tree.leaves(state["params"]))
  manager = ckpt_lib.create_manager(workdir, async_save=False)
  manager.log_every_save = False
  t0 = time.perf_counter()
  ckpt_lib.save(manager, 1, state, dict(size=size))
  save_s = time.perf_counter() - t0
  step_dir = os.path.join(workdir, "checkpoints", "1")
  t_verify, t_read, t_restore = [], [], []
  for _ in range(repeats):
    t0 = time.perf_counter()
    _, files, nbytes = ckpt_lib.verify_dir(step_dir)
    t_verify.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    read_only(step_dir)
    t_read.append(time.perf_counter() - t0)
  del state
  from orbax import checkpoint as ocp
  t0 = time.perf_counter()
  with ocp.StandardCheckpointer() as ckptr:
    restored = ckpt_lib._restore_numpy(ckptr, os.path.join(step_dir, "state"))
  t_restore.append(time.perf_counter() - t0)
  del restored
  manager.close()
  v, r, rs = min(t_verify), min(t_read), min(t_restore)
  mb = nbytes / 1e6
  what = "params+Adam mu,nu" if with_moments else "params"
  print(f"BERT-{size}: {n_params / 1e6:.0f}M params, state = {what}: {files} files, {mb:.0f} MB "
        f"on disk (save incl. manifest {save_s:.1f} s)")
  print(f"  verify            {v:7.2f} s  {mb / v:7.0f} MB/s")
  print(f"  peer: read only   {r:7.2f} s  {mb / r:7.0f} MB/s   verify / read    = {v / r:.2f}x")
  print(f"  peer: restore     {rs:7.2f} s  {mb / rs:7.0f} MB/s   verify / restore = {v / rs:.2f}x",
        flush=True)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--sizes", default="base,large")
  parser.add_argument("--state", choices=["train", "params"], default="train")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()
  print(f"{os.cpu_count()} CPUs visible, {len(os.sched_getaffinity(0))} usable; sha256 on "
        "8 threads; files in the page cache (just written)")
  for size in args.sizes.split(","):
    workdir = tempfile.mkdtemp(prefix=f"ckpt_verify_{size}_")
    try:
      bench(size, args.state == "train", workdir, args.repeats)
    finally:
      shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
  main()
