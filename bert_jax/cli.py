"""Console scripts (`pip install .` puts them on PATH): each runs a program exactly as
`python -m <module>` does (its flags, then errors.run with one-line user errors, exit code 2).

  bert-jax-train --config=bert_jax/configs/pretrain.py:tiny,runlocal --workdir=runs/tiny ...
  bert-jax-predict --init_checkpoint=runs/tiny fill-mask "The man went to the [MASK] ."

A `--config=bert_jax/configs/<file>.py[:arg]` that does not exist under the current directory
(outside a clone of the repository) is read from the installed package (errors.parse_flags).
"""

import importlib
import sys

# console-script name -> (module, init_distributed). The modules import nothing heavy at the top
# beyond what their program needs; `--help` is answered before any model or data work.
PROGRAMS = {
    "bert-jax-train": ("bert_jax.train", True),
    "bert-jax-finetune": ("bert_jax.finetune", True),
    "bert-jax-predict": ("bert_jax.predict", False),
    "bert-jax-extract-features": ("bert_jax.extract_features", False),
    "bert-jax-convert": ("bert_jax.convert.__main__", False),
    "bert-jax-report": ("bert_jax.report", False),
    "bert-jax-build-vocab": ("data_pipelines.build_vocab", False),
    "bert-jax-create-pretraining-data": ("data_pipelines.create_pretraining_data", False),
    "bert-jax-stdlib-corpus": ("data_pipelines.stdlib_corpus", False),
}


def run_program(name):
  from bert_jax import errors  # pylint: disable=g-import-not-at-top
  module_name, init_distributed = PROGRAMS[name]
  module = importlib.import_module(module_name)
  if hasattr(module, "define_flags"):
    module.define_flags()
  errors.run(module.main, init_distributed=init_distributed)


def _entry(name):
  def entry():
    return run_program(name)
  entry.__name__ = name.replace("-", "_")
  return entry


train = _entry("bert-jax-train")
finetune = _entry("bert-jax-finetune")
predict = _entry("bert-jax-predict")
extract_features = _entry("bert-jax-extract-features")
convert = _entry("bert-jax-convert")
report = _entry("bert-jax-report")
build_vocab = _entry("bert-jax-build-vocab")
create_pretraining_data = _entry("bert-jax-create-pretraining-data")
stdlib_corpus = _entry("bert-jax-stdlib-corpus")


def verify():
  """bert-jax-verify DIR: `python -m bert_jax.checkpoint verify DIR`."""
  from bert_jax import checkpoint, errors  # pylint: disable=g-import-not-at-top
  errors.run_main(checkpoint.verify_main, [sys.argv[0], "verify", *sys.argv[1:]])
