"""bert_jax_core/files.py: the one file hash and the one atomic write (gs:// is covered by
gcs_test, which writes vocabularies, summaries and manifests through them)."""

import hashlib
import os

import pytest

from bert_jax_core import files


def test_sha256_is_the_full_digest_and_old_prefixes_still_match(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_bytes(b"[PAD]\n[UNK]\n" * 100_000)  # 1.2 MB: more than one read chunk
  full = hashlib.sha256(path.read_bytes()).hexdigest()
  assert files.sha256_file(path) == files.sha256_file(str(path), chunk_bytes=7) == full
  assert files.same_sha256(full, full)
  assert files.same_sha256(full[:16], full)  # what checkpoints before 2026-11-25 recorded
  assert files.same_sha256(full[:16].upper(), full)
  other = hashlib.sha256(b"another vocab").hexdigest()
  assert not files.same_sha256(other, full) and not files.same_sha256(other[:16], full)
  assert not files.same_sha256(full[:8], full)  # too short to name a file: no record
  assert not files.same_sha256("", full) and not files.same_sha256(None, full)


def test_write_atomic_replaces_whole_files_and_leaves_nothing_on_failure(tmp_path):
  path = tmp_path / "new" / "dir" / "summary.json"  # parents are created
  assert files.write_atomic(path, "first\n") == str(path)
  files.write_atomic(str(path), b"second\n")
  assert path.read_bytes() == b"second\n"
  with pytest.raises(ZeroDivisionError):
    with files.atomic_path(path) as tmp:
      with open(tmp, "w") as f:
        f.write("half")
      raise ZeroDivisionError  # the writer fails half way
  assert path.read_bytes() == b"second\n"  # the old file is intact
  assert os.listdir(path.parent) == ["summary.json"]  # and no temporary is left


def test_an_existing_output_file_is_refused_unless_overwrite(tmp_path):
  """Issue 49: one rule for every program's output file: an existing one is refused in one
  line naming the flag and --overwrite, before any work; with overwrite it passes."""
  existing = tmp_path / "f.npz"
  existing.write_bytes(b"old")
  with pytest.raises(files.OutputPathError) as e:
    files.check_output_file(existing, "--output_file")
  assert str(e.value) == (f"--output_file={existing}: already exists; pass --overwrite to "
                          "replace it, or choose another path.")
  assert files.check_output_file(existing, "--output_file", overwrite=True) == str(existing)
  assert existing.read_bytes() == b"old"
  # A directory stays its own refusal, --overwrite or not (a file name is needed).
  with pytest.raises(files.OutputPathError, match="is a directory"):
    files.check_output_file(tmp_path, "--output_file", overwrite=True)
