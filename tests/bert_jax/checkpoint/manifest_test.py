"""manifest.py on plain directories: what is listed, streaming hashes, each kind of damage named."""

import hashlib
import json
import os

import pytest

from bert_jax.checkpoint import manifest


def _tree(root):
  (root / "state" / "ocdbt.process_1" / "d").mkdir(parents=True)
  (root / "state" / "ocdbt.process_1" / "d" / "abc").write_bytes(os.urandom(3 * manifest.CHUNK
                                                                            + 17))
  (root / "state" / "_METADATA").write_text("{}")
  (root / "_CHECKPOINT_METADATA").write_text("rewritten by Orbax after the commit")
  (root / "commit_success.txt").write_text("also written after")
  return root


def test_every_file_but_orbax_bookkeeping_is_listed_with_a_streamed_hash(tmp_path):
  root = _tree(tmp_path)
  n, size = manifest.write_manifest(root)
  doc = json.loads((root / manifest.NAME).read_text())["files"]
  assert sorted(doc) == ["state/_METADATA", "state/ocdbt.process_1/d/abc"] and n == 2
  big = root / "state" / "ocdbt.process_1" / "d" / "abc"
  assert doc["state/ocdbt.process_1/d/abc"]["sha256"] == hashlib.sha256(
      big.read_bytes()).hexdigest()                     # chunked == one-shot
  assert size == big.stat().st_size + 2
  assert manifest.verify(root) == (2, size)
  # Orbax's own files may change after the commit without failing verification.
  (root / "_CHECKPOINT_METADATA").write_text("commit timestamp added")
  assert manifest.verify(root)[0] == 2


@pytest.mark.parametrize("damage,needle", [
    (lambda p: p.write_bytes(p.read_bytes()[:-1] + b"\0"), "SHA-256"),
    (lambda p: p.write_bytes(p.read_bytes()[:-5]), "truncated or rewritten"),
    (os.remove, "missing"),
])
def test_damage_names_the_file(tmp_path, damage, needle):
  root = _tree(tmp_path)
  manifest.write_manifest(root)
  damage(root / "state" / "ocdbt.process_1" / "d" / "abc")
  with pytest.raises(manifest.ManifestError, match=f"ocdbt.process_1/d/abc.*{needle}|"
                                                   f"abc: {needle}"):
    manifest.verify(root)


def test_missing_or_garbled_manifest(tmp_path):
  root = _tree(tmp_path)
  assert not manifest.has_manifest(root)
  with pytest.raises(manifest.ManifestError, match="manifest missing"):
    manifest.verify(root)
  (root / manifest.NAME).write_text("{not json")
  with pytest.raises(manifest.ManifestError, match="not a valid manifest"):
    manifest.verify(root)
