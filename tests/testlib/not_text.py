"""Files that are not UTF-8 text, as they end up in a corpus glob or a task folder (issue 49).

Made here, byte for byte, so no binary fixture is committed: a real PNG (its pixels deflated),
gzip-compressed text, UTF-16 text with and without its byte-order mark, Korean in CP949.
"""

import tests  # tests.DATA: tests/data
import gzip
import os
import random
import struct
import zlib

TEXT = ("The cat sat on the mat.\nIt was a sunny day.\n\n"
        "A second document starts here.\nIt has two lines too.\n")


def png(width=64, height=64, seed=0):
  """An RGB PNG of noise (~12 KB): pixels that do not compress, as a photo's."""
  rng = random.Random(seed)
  rows = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * width))
                  for _ in range(height))   # filter byte 0, then [width, 3] bytes a row

  def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
  header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)   # 8-bit RGB
  return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
          + chunk(b"IEND", b""))


def gzipped(text=TEXT * 20):
  return gzip.compress(text.encode("utf-8"), mtime=0)


def utf16(text=TEXT, bom=True):
  """UTF-16-LE text; with its byte-order mark (FF FE) or without (then NUL bytes, ASCII's high
  halves, are the only sign)."""
  return text.encode("utf-16" if bom else "utf-16-le")


def cp949():
  """Korean text in CP949 (EUC-KR's superset), as older Korean corpora come: 71% of its
  characters are invalid UTF-8."""
  with open(os.path.join(tests.DATA, "korean", "constitution.txt"), encoding="utf-8") as f:
    return f.read()[:5000].encode("cp949")


KINDS = ("png", "gzip", "utf16", "utf16_no_bom", "cp949")


def write(folder, kind, name=None):
  """The path of a file of `kind` (KINDS) in `folder` (a pathlib.Path), named like text
  (KIND.txt) unless `name` is given."""
  data = {"png": png, "gzip": gzipped, "utf16": utf16,
          "utf16_no_bom": lambda: utf16(bom=False), "cp949": cp949}[kind]()
  path = folder / (name or f"{kind}.txt")
  path.write_bytes(data)
  return str(path)
