"""SHA-256 manifests of checkpoint directories: written once a step is complete, checked on restore.

Orbax keeps no checksum of array data (only the zarr shard index has a CRC), so one flipped byte in
an array file restores silently as garbage. Here every file of a step (or of a params export) is
listed with its size and SHA-256 in `manifest.sha256.json` beside it.

Who writes it: Orbax runs its finalize callback (`AsyncOptions.post_finalization_callback`) on
the primary host only, after a barrier that every host's writes have completed, and before the
step directory is committed. So the primary host hashes every file of the step, each host's
`ocdbt.process_<i>/` shards included: they are all on the storage every host shares (multi-host
Orbax needs it). Orbax's own step bookkeeping written after that callback (`_CHECKPOINT_METADATA`,
which gains a commit timestamp; `commit_success.txt` at the step root) is not listed.

Hashing streams each file in 8 MiB chunks on a thread pool (hashlib releases the GIL), so memory is
bounded and several files hash at once.
"""

import concurrent.futures
import json
import os

from etils import epath

from bert_jax_core import errors
from bert_jax_core import files as files_lib

NAME = "manifest.sha256.json"
# Written by Orbax at the step root after our callback ran: not part of the manifest.
UNLISTED = ("_CHECKPOINT_METADATA", "commit_success.txt")
CHUNK = 8 << 20


class ManifestError(errors.UserError):
  """A file of a checkpoint is missing, truncated or changed, or its manifest is gone."""


def list_files(root):
  """Relative paths (sorted, '/'-separated) of every file under `root`, manifests excluded."""
  root = epath.Path(root)
  out = []
  if "://" not in str(root):
    for dirpath, _, names in os.walk(root):
      for n in names:
        out.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
  else:  # epath refuses rglob on gs:// ("could trigger thousands of RPC requests"); walk lists
    # one directory per request, as os.walk does.
    out = [str((d / n).relative_to(root)) for d, _, names in root.walk() for n in names]
  return sorted(r for r in out if not r.startswith(NAME) and r not in UNLISTED)


def sha256_file(path):
  return files_lib.sha256_file(path, CHUNK)


def _hash_many(root, relpaths, threads=8):
  root = epath.Path(root)
  with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(relpaths)))) as pool:
    digests = list(pool.map(lambda r: sha256_file(root / r), relpaths))
  return {r: dict(size=(root / r).stat().length, sha256=d) for r, d in zip(relpaths, digests)}


def write_manifest(root):
  """Hashes every file of `root`; writes its manifest atomically. Returns (files, bytes) listed."""
  root = epath.Path(root)
  files = _hash_many(root, list_files(root))
  # Its temporary name starts with NAME, so list_files never lists it.
  files_lib.write_atomic(root / NAME, json.dumps(dict(format=2, files=files), indent=1,
                                                 sort_keys=True))
  return len(files), sum(f["size"] for f in files.values())


def has_manifest(root):
  return (epath.Path(root) / NAME).exists()


def verify(root, threads=8):
  """Checks every file listed by the manifests of `root`; returns (files, bytes) checked.

  Raises ManifestError naming the first missing, resized or changed file (or manifest); a root
  without any manifest is a ManifestError too: callers that accept checkpoints written before
  manifests existed test `has_manifest` first.
  """
  root = epath.Path(root)
  path = root / NAME
  if not path.exists():
    raise ManifestError(f"{path}: manifest missing; the checkpoint cannot be verified.")
  try:
    listed = json.loads(path.read_text())["files"]
  except (json.JSONDecodeError, KeyError) as e:
    raise ManifestError(f"{path}: not a valid manifest ({e}).") from None
  for r, f in sorted(listed.items()):
    p = root / r
    if not p.exists():
      raise ManifestError(f"{p}: missing (listed in the checkpoint's manifest).")
    size = p.stat().length
    if size != f["size"]:
      raise ManifestError(f"{p}: {size} bytes, the manifest says {f['size']} (truncated or "
                          "rewritten).")
  digests = _hash_many(root, sorted(listed), threads)
  for r, f in sorted(listed.items()):
    if digests[r]["sha256"] != f["sha256"]:
      raise ManifestError(f"{root / r}: SHA-256 {digests[r]['sha256'][:12]}... differs from the "
                          f"manifest's {f['sha256'][:12]}... (corrupted on disk).")
  return len(listed), sum(f["size"] for f in listed.values())
