"""File hashing and atomic writes, for local paths and gs:// alike (the one copy of each).

  sha256_file(path)            the full hex SHA-256 (64 characters) of a file
  same_sha256(recorded, hex)   True when a recorded hash names that file: checkpoints before
                               2026-11-25 recorded a 16-character prefix, which still matches
  write_atomic(path, data)     data (bytes or str) to a temporary name beside path, then renamed:
                               a crash never leaves a complete-looking file under the final name
  atomic_path(path)            the same as a context manager, for writers that want a file name
                               (a TFRecordWriter, np.savez)
  open_file(path, mode)        a file object; makedirs(path): a directory and its parents
  check_output_file(path, flag, overwrite=False)  the one check every program makes of a file
                               it will write, before any work: a one-line OutputPathError; an
                               existing file only with the program's --overwrite

Local paths go through os (no TensorFlow import); a path with a scheme (gs://, ...) goes through
tf.io.gfile, imported by tf_setup so TF never takes an accelerator.
"""

import contextlib
import hashlib
import os
import tempfile

from bert_jax_core import errors

CHUNK = 1 << 20  # 1 MiB reads: a 1 GB file hashes in constant memory
# The shortest recorded hash accepted: the 16-character prefixes older checkpoints stored
# (64 bits: a wrong vocab matching by chance is out of the question); shorter is no record.
MIN_PREFIX = 16


def is_remote(path) -> bool:
  return "://" in str(path)


def _gfile():
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  return tf.io.gfile


def open_file(path, mode):
  """A file object for a local path (open) or a gs:// one (tf.io.gfile.GFile)."""
  return _gfile().GFile(str(path), mode) if is_remote(path) else open(path, mode)


def makedirs(path):
  """Creates a local or gs:// directory and its parents; an existing one is fine."""
  if is_remote(path):
    _gfile().makedirs(str(path))
  else:
    os.makedirs(path, exist_ok=True)


def sha256_file(path, chunk_bytes=CHUNK) -> str:
  """The hex SHA-256 of a (local or gs://) file's bytes, read in chunks of chunk_bytes."""
  h = hashlib.sha256()
  with open_file(path, "rb") as f:
    while chunk := f.read(chunk_bytes):
      h.update(chunk)
  return h.hexdigest()


def same_sha256(recorded, actual: str) -> bool:
  """Whether `recorded` (a full hex digest, or an older record's 16+ character prefix) names the
  file whose full digest is `actual`."""
  recorded = str(recorded or "").lower()
  return len(recorded) >= MIN_PREFIX and actual.lower().startswith(recorded)


@contextlib.contextmanager
def atomic_path(path):
  """Yields a temporary name beside `path`; renamed onto `path` when the block ends without an
  exception, removed when it raises. The name holds the process id: two writers of one path
  never share a temporary file. The parent directory is created when missing."""
  path = str(path)
  tmp = f"{path}.tmp-{os.getpid()}"
  parent = os.path.dirname(path)
  if parent:
    makedirs(parent)
  try:
    yield tmp
    if is_remote(path):
      _gfile().rename(tmp, path, overwrite=True)
    else:
      os.replace(tmp, path)
  except BaseException:
    # Remove the partial file, then re-raise the original error (a failed removal, e.g. on a
    # full or read-only disk, must not replace it).
    with contextlib.suppress(Exception):
      if is_remote(path):
        if _gfile().exists(tmp):
          _gfile().remove(tmp)
      elif os.path.lexists(tmp):
        os.remove(tmp)
    raise


def write_atomic(path, data) -> str:
  """Writes `data` (bytes, or str as UTF-8) to `path` atomically (atomic_path); returns path."""
  if isinstance(data, str):
    data = data.encode("utf-8")
  with atomic_path(path) as tmp:
    with open_file(tmp, "wb") as f:
      f.write(data)
  return str(path)


def unwritable_reason(path):
  """Why a new local file or directory `path` could not be created, or None if it can: its nearest
  existing ancestor must be a directory this process can create a file in. Probed with a real
  file, so a read-only filesystem or a file in the way shows here, before any work (os.access
  says yes to root on a read-only bind mount). Remote (gs://) paths are not probed: None."""
  if is_remote(path):
    return None
  parent = os.path.dirname(os.path.abspath(str(path)))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent):
    return f"{parent} is not a directory"
  try:
    fd, probe = tempfile.mkstemp(dir=parent, prefix=".write_probe_")
    os.close(fd)
    os.remove(probe)
  except OSError as e:
    return f"{parent}: {e.strerror}"
  return None


class OutputPathError(errors.UserError):
  """A file a program was asked to write cannot be written there."""


def _is_file(path):
  if is_remote(path):
    return _gfile().exists(path) and not _gfile().isdir(path)
  return os.path.isfile(path)


def check_output_file(path, flag, *, overwrite=False, make_parents=False):
  """The one check of an output file (extract_features --output_file, export_serving --output,
  predict embed --output_file, report --output, plan --json, build_vocab --output), made before
  any work so a mistake is one line, not a traceback after the compute (issue 32:
  extract_features' model ran first; report wrote `<dir>.png` for a directory and raised 47
  lines for a missing one). Returns path.

  Refused: an empty path; an existing directory, or a path ending in '/' (a directory name:
  the writer needs a file name); an existing file unless `overwrite` (the program's
  --overwrite: issue 49, extract_features and export_serving replaced one without a word while
  convert refused its); a missing parent directory, unless `make_parents` (the writer creates
  it, as write_atomic does: then its nearest existing ancestor is probed); a parent where no file
  can be created (unwritable_reason). Remote (gs://) paths are checked for an existing file
  only; the rest is left to the write.
  """
  path = str(path or "")
  if not path:
    raise OutputPathError(f"{flag} is empty: pass the file to write.")
  if not overwrite and _is_file(path):
    raise OutputPathError(f"{flag}={path}: already exists; pass --overwrite to replace it, or "
                          "choose another path.")
  if is_remote(path):
    return path
  if path.endswith(("/", os.sep)) or os.path.isdir(path):
    what = "is a directory" if os.path.isdir(path) else "names a directory (it ends in '/')"
    raise OutputPathError(f"{flag}={path}: {what}; name the file to write (e.g. "
                          f"{flag}={os.path.join(path, 'NAME')}).")
  parent = os.path.dirname(os.path.abspath(path))
  if not make_parents and not os.path.exists(parent):
    raise OutputPathError(f"{flag}={path}: the directory {parent} does not exist; create it or "
                          "choose another path.")
  why = unwritable_reason(path)
  if why:
    raise OutputPathError(f"{flag}={path}: cannot be written ({why}); choose a writable path.")
  return path
