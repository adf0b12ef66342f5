"""A small real-English corpus: the docstrings of Python's own standard library.

Written in google-research/bert's raw format: one sentence per line, a blank line between
documents (one document per module/class/function docstring). Nobody on this project wrote the
text, and it needs no download. It is deterministic for one Python environment; other installed
packages can change a few documents (seen here: a clean `.venv` and the dev `.venv` differ in
concurrent.futures' docstrings), so figures made from it vary slightly between set-ups.

  python -m data_pipelines.stdlib_corpus --output_dir=data/corpus --num_files=4
"""

import contextlib
import inspect
import os
import pkgutil
import re
import sys
import warnings

from absl import flags

from bert_jax_core import errors
from bert_jax_core import files as files_lib

# Modules whose import has side effects (opening windows, printing, starting things).
_SKIP = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "test", "lib2to3",
         "ensurepip", "venv", "pydoc_data", "__main__", "__phello__", "xxsubtype", "_pydecimal"}
_SENT_SPLIT = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


def split_sentences(text):
  """Splits a paragraph into sentences on end punctuation followed by a capital letter."""
  text = " ".join(text.split())
  return [s for s in _SENT_SPLIT.split(text) if s]


def docstring_to_document(doc):
  """One docstring -> list of sentences (code lines, doctest lines and tables dropped)."""
  sentences = []
  for para in re.split(r"\n\s*\n", inspect.cleandoc(doc)):
    lines = [l for l in para.splitlines()
             if not l.lstrip().startswith((">>>", "...", "|", "+-", "--", "=="))]
    para = " ".join(l.strip() for l in lines)
    if len(para.split()) < 4:
      continue
    sentences.extend(split_sentences(para))
  return sentences


def iter_documents(max_modules=None):
  """Yields documents (lists of sentences) in a fixed order: sorted module names."""
  names = sorted(m.name for m in pkgutil.iter_modules()
                 if m.module_finder is not None and "site-packages" not in str(
                     getattr(m.module_finder, "path", "")) and m.name not in _SKIP
                 and not m.name.startswith("_"))
  names = [n for n in names if n in sys.stdlib_module_names]
  # Sub-modules of the stdlib packages (email.*, json.*, asyncio.*, ...) more than double the text.
  expanded = []
  for name in names:
    expanded.append(name)
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      try:
        pkg = __import__(name)
      except Exception:
        continue
    if hasattr(pkg, "__path__"):
      expanded.extend(sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, name + ".",
                                                                    onerror=lambda _: None)
                             if not any(p.startswith("_") or p in _SKIP
                                        for p in m.name.split("."))))
  names = expanded
  seen = set()
  for count, name in enumerate(names):
    if max_modules is not None and count >= max_modules:
      break
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      try:
        __import__(name)
        module = sys.modules[name]
      except Exception:  # some stdlib modules need optional C libraries
        continue
    objs = [module] + [v for _, v in sorted(vars(module).items())
                       if (inspect.isclass(v) or inspect.isfunction(v))
                       and getattr(v, "__module__", None) == name]
    for cls in [o for o in objs if inspect.isclass(o)]:
      objs.extend(v for _, v in sorted(vars(cls).items())
                  if inspect.isfunction(v) and not _.startswith("_"))
    for obj in objs:
      with warnings.catch_warnings():  # reading a deprecated module's attributes (typing.io)
        warnings.simplefilter("ignore", DeprecationWarning)
        doc = getattr(obj, "__doc__", None)
      if not isinstance(doc, str) or id(doc) in seen:
        continue
      seen.add(id(doc))
      sentences = docstring_to_document(doc)
      if len(sentences) >= 1:
        yield sentences


def write_corpus(output_dir, num_files=4, max_modules=None):
  """Writes the corpus as `num_files` text files, documents dealt round-robin. Returns paths."""
  os.makedirs(output_dir, exist_ok=True)
  paths = [os.path.join(output_dir, f"stdlib-{i:02d}-of-{num_files:02d}.txt")
           for i in range(num_files)]
  # Every file under a temporary name until all are complete (files_lib.atomic_path): a crash
  # never leaves a file that looks complete.
  with contextlib.ExitStack() as stack:
    tmps = [stack.enter_context(files_lib.atomic_path(p)) for p in paths]
    outs = [stack.enter_context(open(t, "w", encoding="utf-8")) for t in tmps]
    for i, doc in enumerate(iter_documents(max_modules)):
      outs[i % num_files].write("\n".join(doc) + "\n\n")
  return paths


FLAGS = flags.FLAGS


def define_flags():
  """Flags are defined only when run as a program, so modules import side-effect free."""
  flags.DEFINE_string("output_dir", "data/corpus", "Where to write the text files.")
  flags.DEFINE_integer("num_files", 4, "Number of text files (input shards).")
  flags.DEFINE_integer("max_modules", None, "Only the first N modules (for quick tests).")


def main(argv):
  del argv
  paths = write_corpus(FLAGS.output_dir, FLAGS.num_files, FLAGS.max_modules)
  size = sum(os.path.getsize(p) for p in paths)
  print(f"wrote {len(paths)} files, {size / 1e6:.1f} MB to {FLAGS.output_dir}")


if __name__ == "__main__":
  define_flags()
  errors.run(main)
