"""The one rule for "is this file UTF-8 text?", for every reader of a corpus or a task file.

  not_text(head, path)    why the first bytes of a file are not UTF-8 text, as one sentence that
                          names the file and the fix; None when they pass
  check(path)             the same for a local or gs:// file, reading its first SNIFF_BYTES
  strip_bom(text)         the text without a leading UTF-8 byte-order mark (which is fine)

The rule looks at the first block only (64 KiB), so a reader checks every file of a glob before
it writes anything, at the cost of one small read a file:
  1. a UTF-16 or UTF-32 byte-order mark: text in another encoding (a UTF-16 file's blank lines are
     "\\n\\0", not blank, so its documents would run together);
  2. the magic bytes of a compressed file or an image (gzip, bzip2, xz, zstd, zip, PNG, JPEG,
     GIF, PDF): named, since a .gz or a .png in a corpus glob is the common slip. Compressed input
     is not read here: decompress it first;
  3. a NUL byte: no text has one; a binary file (TFRecords, .npy, images) or UTF-16/32 text
     without a byte-order mark has many (random bytes: one in 256);
  4. invalid UTF-8 in more than MAX_INVALID_SHARE of the block's characters. Measured on the
     first 64 KiB of random bytes, of gzip, and of tests/data's texts re-encoded: random or
     gzip-compressed bytes 44%, Korean in CP949 71%, Chinese in GBK 78% and Big5 54%, Chinese
     in UTF-16 without a BOM 27%; Western text in Latin-1 3% (French) and 1% (German). Above the line is not text in UTF-8; below it is UTF-8 text with
     stray bytes, which each reader treats as it did: create_pretraining_data replaces them with
     U+FFFD and counts them, build_vocab and the task readers refuse any (they need every byte).

A UTF-8 byte-order mark (EF BB BF) is allowed and stripped by the readers (GLUE's MRPC files
start with one; json.loads refuses a line that starts with it).
"""

import codecs

from bert_jax_core import files

SNIFF_BYTES = 1 << 16
MAX_INVALID_SHARE = 0.10
UTF8_BOM = "\ufeff"

# Longest first: a UTF-32-LE mark starts with the UTF-16-LE one.
_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32BE"), (b"\xff\xfe\x00\x00", "UTF-32LE"),
         (b"\xfe\xff", "UTF-16BE"), (b"\xff\xfe", "UTF-16LE"))

_DECOMPRESS = "decompress it first ({tool} {path}) or leave it out"
_NOT_INPUT = "leave it out of the input"
# (magic bytes, what the file is, the fix).
_MAGIC = (
    (b"\x1f\x8b", "gzip-compressed", _DECOMPRESS.replace("{tool}", "gunzip -k")),
    (b"BZh", "bzip2-compressed", _DECOMPRESS.replace("{tool}", "bunzip2 -k")),
    (b"\xfd7zXZ\x00", "xz-compressed", _DECOMPRESS.replace("{tool}", "unxz -k")),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed", _DECOMPRESS.replace("{tool}", "unzstd")),
    (b"PK\x03\x04", "a zip archive", "unzip it first or leave it out"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image", _NOT_INPUT),
    (b"\xff\xd8\xff", "a JPEG image", _NOT_INPUT),
    (b"GIF8", "a GIF image", _NOT_INPUT),
    (b"%PDF-", "a PDF document", _NOT_INPUT),
)


def _line_of(head, offset):
  return head[:offset].count(b"\n") + 1


def _invalid_utf8(head):
  """(invalid sequences, characters, byte offset of the first invalid one or -1) of a block."""
  # Incremental, not final: a character cut at the block's end is not an invalid sequence.
  text = codecs.getincrementaldecoder("utf-8")("replace").decode(head, final=False)
  # A U+FFFD the text holds as valid UTF-8 (EF BF BD) is a character, not an invalid byte.
  invalid = text.count("\ufffd") - head.count(b"\xef\xbf\xbd")
  first = -1
  if invalid:
    try:
      head.decode("utf-8")
    except UnicodeDecodeError as e:
      first = e.start
  return invalid, len(text), first


def not_text(head, path):
  """Why `head` (a file's first bytes) is not UTF-8 text, or None when it is.

  One sentence: "<path> is not UTF-8 text: <what it is>; <the fix>." A caller puts its flag in
  front (`--input_file=GLOB: ...`) and raises its own UserError.
  """
  for bom, encoding in _BOMS:
    if head.startswith(bom):
      return (f"{path} is not UTF-8 text: it is {encoding} (it starts with that byte-order "
              f"mark); convert it to UTF-8 (iconv -f {encoding} -t UTF-8).")
  for magic, what, fix in _MAGIC:
    if head.startswith(magic) and (magic != b"BZh" or head[4:10] == b"1AY&SY"):
      return (f"{path} is not UTF-8 text: it is {what} (it starts with "
              f"{head[:len(magic)].hex(' ')}); {fix.format(path=path)}.")
  nul = head.find(b"\x00")
  if nul >= 0:
    return (f"{path} is not UTF-8 text: a NUL byte at byte {nul} (line {_line_of(head, nul)}), "
            "so a binary file or UTF-16/32 text without a byte-order mark; leave it out, or "
            "convert it to UTF-8 (iconv -f UTF-16LE -t UTF-8).")
  invalid, chars, first = _invalid_utf8(head)
  if invalid > MAX_INVALID_SHARE * chars:
    return (f"{path} is not UTF-8 text: {invalid:,} of its first {chars:,} characters are "
            f"invalid UTF-8 (the first at byte {first}, line {_line_of(head, first)}; more than "
            f"{MAX_INVALID_SHARE:.0%} is another encoding or a binary file); convert it, e.g. "
            "iconv -f cp949 -t UTF-8 for Korean, or leave it out.")
  return None


def check(path):
  """not_text of the first SNIFF_BYTES of a local or gs:// file (None: text)."""
  with files.open_file(path, "rb") as f:
    return not_text(f.read(SNIFF_BYTES), path)


def strip_bom(text):
  """`text` without a leading UTF-8 byte-order mark (U+FEFF as the first character)."""
  return text[1:] if text.startswith(UTF8_BOM) else text
