"""SHA-256 manifests of checkpoint directories: written once a step is complete, checked on restore.

Orbax keeps no checksum of array data (only the zarr shard index has a CRC), so one flipped byte in
an array file restores silently as garbage. Here every file of a step (or of a params export) is
listed with its size and SHA-256 in `manifest.sha256.process_<i>.json`, one per host, each
listing the files that host wrote:

  files under a path component `ocdbt.process_<j>` or `process_<j>` -> written by host j
  every other file (merged OCDBT root, _METADATA, _sharding, meta/)  -> written by the primary host

The primary host's manifest also records `num_processes`, so a missing per-host manifest is found.
Orbax's own step bookkeeping written after the commit callback (`_CHECKPOINT_METADATA`, gains a
commit timestamp; `commit_success.txt` at the step root) is not listed.

Hashing streams each file in 8 MiB chunks on a thread pool (hashlib releases the GIL), so memory is
bounded and several files hash at once.
"""

import concurrent.futures
import hashlib
import json
import os
import re

from etils import epath

from bert_jax import errors

PREFIX = "manifest.sha256.process_"
# Written by Orbax at the step root after our callback ran: not part of the manifest.
UNLISTED = ("_CHECKPOINT_METADATA", "commit_success.txt")
CHUNK = 8 << 20
_OWNER = re.compile(r"(?:^|/)(?:ocdbt\.)?process_(\d+)(?:/|$)")


class ManifestError(errors.UserError):
  """A file of a checkpoint is missing, truncated or changed, or its manifest is gone."""


def manifest_name(process_index):
  return f"{PREFIX}{process_index}.json"


def owner(relpath):
  """The host that wrote `relpath` (relative to the step directory): see the module docstring."""
  m = _OWNER.search(relpath)
  return int(m.group(1)) if m else 0


def list_files(root):
  """Relative paths (sorted, '/'-separated) of every file under `root`, manifests excluded."""
  root = epath.Path(root)
  out = []
  if "://" not in str(root):
    for dirpath, _, names in os.walk(root):
      for n in names:
        out.append(os.path.relpath(os.path.join(dirpath, n), root).replace(os.sep, "/"))
  else:
    out = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
  return sorted(r for r in out if not r.split("/")[-1].startswith(PREFIX) and r not in UNLISTED)


def sha256_file(path):
  h = hashlib.sha256()
  with epath.Path(path).open("rb") as f:
    while chunk := f.read(CHUNK):
      h.update(chunk)
  return h.hexdigest()


def _hash_many(root, relpaths, threads=8):
  root = epath.Path(root)
  with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(relpaths)))) as pool:
    digests = list(pool.map(lambda r: sha256_file(root / r), relpaths))
  return {r: dict(size=(root / r).stat().length, sha256=d) for r, d in zip(relpaths, digests)}


def write_manifest(root, process_index=0, process_count=1):
  """Hashes the files of `root` that host `process_index` wrote; writes its manifest atomically.

  Returns (number of files, bytes) listed.
  """
  root = epath.Path(root)
  mine = [r for r in list_files(root) if owner(r) == process_index]
  files = _hash_many(root, mine)
  doc = dict(format=1, process_index=process_index, files=files)
  if process_index == 0:
    doc["num_processes"] = process_count
  target = root / manifest_name(process_index)
  tmp = root / (manifest_name(process_index) + ".tmp")
  tmp.write_text(json.dumps(doc, indent=1, sort_keys=True))
  tmp.rename(target)
  return len(files), sum(f["size"] for f in files.values())


def has_manifest(root):
  root = epath.Path(root)
  return root.exists() and any(p.name.startswith(PREFIX) and p.name.endswith(".json")
                               for p in root.iterdir())


def verify(root, threads=8):
  """Checks every file listed by the manifests of `root`; returns (files, bytes) checked.

  Raises ManifestError naming the first missing, resized or changed file (or manifest); a root
  without any manifest is a ManifestError too: callers that accept checkpoints written before
  manifests existed test `has_manifest` first.
  """
  root = epath.Path(root)
  primary = root / manifest_name(0)
  if not primary.exists():
    raise ManifestError(f"{primary}: manifest missing; the checkpoint cannot be verified.")
  try:
    docs = [json.loads(primary.read_text())]
    for i in range(1, int(docs[0].get("num_processes", 1))):
      path = root / manifest_name(i)
      if not path.exists():
        raise ManifestError(f"{path}: manifest of host {i} missing; the checkpoint cannot be "
                            "verified.")
      docs.append(json.loads(path.read_text()))
  except json.JSONDecodeError as e:
    raise ManifestError(f"{root}: a manifest is not valid JSON ({e}).") from None
  listed = {r: f for d in docs for r, f in d["files"].items()}
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
