r"""A small classification task from real text: which standard-library package a docstring
sentence comes from (asyncio, email, logging, typing, unittest, xml).

  .venv/bin/python -m benchmarks.docstring_task --output_dir=runs/docstring_task

Writes train.csv and dev.csv (columns text,label) for bert_jax.finetune's custom task:

  python -m bert_jax.finetune --config=bert_jax/configs/finetune.py:custom \
      --config.data_dir=runs/docstring_task --config.custom.format=csv \
      --config.custom.text_a=text --config.custom.label=label \
      --config.custom.labels=asyncio,email,logging,typing,unittest,xml \
      --config.custom.train_file=train.csv --config.custom.dev_file=dev.csv ...

Sentences are cut from the docstrings of each package and its sub-modules (their own classes,
functions and methods) exactly as data_pipelines.stdlib_corpus cuts them. The split is by
docstring (one docstring's sentences all go to train or all to dev: sentences of one docstring
share words a model could match instead of learning the package), chosen by a hash of the
object's qualified name, so it is the same in every run. The sentences are also in the
pre-training corpus (all of the standard library's docstrings are): the task measures what
pre-training put in the encoder, as GLUE's text is also web text. Sizes in this Python 3.11: 2,413
train and 539 dev sentences, 6 classes; the majority class (asyncio) is 30% of dev.
"""

import argparse
import csv
import hashlib
import inspect
import os
import pkgutil
import sys
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The six packages with the most docstring sentences after asyncio/email that are not near
# duplicates of each other (http and urllib share most of their vocabulary; dropped).
PACKAGES = ("asyncio", "email", "logging", "typing", "unittest", "xml")
DEV_PERCENT = 20


def _modules(package):
  """The package and its public sub-modules, sorted (stdlib_corpus's walk)."""
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    pkg = __import__(package)
  names = [package]
  if hasattr(pkg, "__path__"):
    names += sorted(m.name for m in pkgutil.walk_packages(pkg.__path__, package + ".",
                                                          onerror=lambda _: None)
                    if not any(p.startswith("_") for p in m.name.split(".")))
  for name in names:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      try:
        __import__(name)
      except Exception:  # pylint: disable=broad-except  (optional C libraries, as stdlib_corpus)
        continue
    yield name, sys.modules[name]


def docstrings(package):
  """[(qualified name, docstring)] of the package's modules, classes, functions and methods."""
  out, seen = [], set()
  for name, module in _modules(package):
    objs = [(name, module)] + [(f"{name}.{k}", v) for k, v in sorted(vars(module).items())
                               if (inspect.isclass(v) or inspect.isfunction(v))
                               and getattr(v, "__module__", None) == name]
    for qual, cls in [o for o in objs if inspect.isclass(o[1])]:
      objs.extend((f"{qual}.{k}", v) for k, v in sorted(vars(cls).items())
                  if inspect.isfunction(v) and not k.startswith("_"))
    for qual, obj in objs:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        doc = getattr(obj, "__doc__", None)
      if isinstance(doc, str) and id(doc) not in seen:
        seen.add(id(doc))
        out.append((qual, doc))
  return out


def build(output_dir, packages=PACKAGES):
  """Writes train.csv and dev.csv; returns {split: {label: count}}."""
  sys.path.insert(0, ROOT)
  from data_pipelines import stdlib_corpus  # pylint: disable=g-import-not-at-top
  rows = {"train": [], "dev": []}
  for package in packages:
    for qual, doc in docstrings(package):
      h = int(hashlib.sha256(qual.encode()).hexdigest()[:8], 16)
      split = "dev" if h % 100 < DEV_PERCENT else "train"
      rows[split] += [(s, package) for s in stdlib_corpus.docstring_to_document(doc)
                      if len(s.split()) >= 4]
  os.makedirs(output_dir, exist_ok=True)
  counts = {}
  for split, items in rows.items():
    with open(os.path.join(output_dir, f"{split}.csv"), "w", newline="", encoding="utf-8") as f:
      w = csv.writer(f)
      w.writerow(["text", "label"])
      w.writerows(items)
    counts[split] = {p: sum(1 for _, l in items if l == p) for p in packages}
  return counts


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--output_dir", default="runs/docstring_task")
  args = p.parse_args()
  counts = build(args.output_dir)
  for split, c in counts.items():
    print(f"{split}: {sum(c.values())} sentences {c}")


if __name__ == "__main__":
  main()
