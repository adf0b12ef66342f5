"""Import TensorFlow for input pipelines only, with every accelerator hidden from it, quietly.

TF must never take a GPU or TPU: on a TPU VM the chips belong to JAX, and on a GPU host TF would
otherwise reserve most of the GPU memory at start-up. Every module in data_pipelines imports TF
through here (`from bert_jax_core.tf_setup import tf`).

Importing TF prints C++ log lines no user can act on, before TF_CPP_MIN_LOG_LEVEL applies (they
are logged before absl::InitializeLog): oneDNN's numerics notice, "Could not find cuda drivers"
and, when a CUDA library is present, `E0000 ... failed call to cuInit: UNKNOWN ERROR (303)` (TF
probing for a GPU we hide from it anyway). The import runs with stderr captured; those known
lines (NOISE) are dropped and every other line is written back to stderr. BERT_JAX_TF_LOGS=1
shows them all.
"""
import importlib.abc
import os
import sys
import tempfile

# TF's C++ log lines at INFO and WARNING are noise to a user of an input pipeline: its start-up
# banner, and at run time e.g. `W0000 ... root_dataset.cc:364] Optimization loop failed:
# CANCELLED` when tf.data's autotuner is stopped with a dropped iterator (the quick start printed
# it once during its first-batch check, 2026-11-26). Level 2 keeps ERROR and FATAL. `import jax`
# sets TF_CPP_MIN_LOG_LEVEL=1 with setdefault (jax/__init__.py) and every program here imports
# jax first, so a setdefault here never applied: "1" counts as unset. A user's 0 (everything) is
# kept, as is BERT_JAX_TF_LOGS=1 (show everything, below). jaxlib reads the same variable, so its
# C++ warnings on CPU are hidden too, as in the test suite (tests/conftest.py sets 2).
if (os.environ.get("BERT_JAX_TF_LOGS") != "1"
    and os.environ.get("TF_CPP_MIN_LOG_LEVEL", "1") == "1"):
  os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
# TF's oneDNN kernels (matmul/conv-style float ops) are of no use to an input pipeline of string,
# integer and random ops, and on CPUs without AVX-512 they print `E0000 ... oneDNN supports
# DT_INT64 only on platforms with AVX-512` at run time (where no filter can reach). Off, TF's
# default Eigen kernels run on every machine alike. Set TF_ENABLE_ONEDNN_OPTS=1 to override.
os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")

# Substrings of TF start-up lines that carry nothing a user can act on (see the docstring).
NOISE = (
    "All log messages before absl::InitializeLog() is called are written to STDERR",
    "port.cc:153] oneDNN custom operations are on",  # (when TF_ENABLE_ONEDNN_OPTS=1)
    "cudart_stub.cc:31] Could not find cuda drivers on your machine",
    "cuda_platform.cc:52] failed call to cuInit",
    "Unable to register cuDNN factory", "Unable to register cuFFT factory",
    "Unable to register cuBLAS factory", "computation placer already registered",
    "TF-TRT Warning: Could not find TensorRT",
    "This TensorFlow binary is optimized to use available CPU instructions",
    "To enable the following instructions",
)


# `import tensorflow` imports keras (tf.keras), and keras imports scikit-learn (its sklearn
# wrappers) and matplotlib (its image-gallery plot) for features an input pipeline never uses:
# 2.3 of the 9 CPU seconds TF's import took on the 2-core box (2026-11-26: 8.8-9.1 s -> 6.6 s,
# `import tensorflow, tensorflow_text` and one tf.data map), in every process that reads data
# (each CLI, each create_pretraining_data worker). keras imports both inside try/except
# ImportError (keras/src/wrappers/fixes.py, keras/src/visualization/plot_image_gallery.py), so
# during TF's import only they are reported missing; afterwards they import as usual (the
# report's matplotlib, the tests' sklearn). Only keras' own sklearn wrappers and image gallery
# lose them, in this process.
SKIPPED_DURING_TF_IMPORT = ("sklearn", "matplotlib")


class _SkipDuringImport(importlib.abc.MetaPathFinder):
  """Reports SKIPPED_DURING_TF_IMPORT as not installed while installed on sys.meta_path."""

  def find_spec(self, fullname, path=None, target=None):
    del path, target
    if fullname.split(".")[0] in SKIPPED_DURING_TF_IMPORT:
      raise ModuleNotFoundError(f"No module named {fullname!r} (skipped while importing "
                                "tensorflow: bert_jax_core.tf_setup)", name=fullname)
    return None


def _import_tensorflow():
  """tensorflow, imported (and hidden from accelerators) with its start-up noise filtered."""
  def load():
    skip = _SkipDuringImport()
    if "tensorflow" not in sys.modules:
      sys.meta_path.insert(0, skip)
    try:
      import tensorflow as tf  # pylint: disable=g-import-not-at-top
    finally:
      if skip in sys.meta_path:
        sys.meta_path.remove(skip)
    try:
      tf.config.set_visible_devices([], "GPU")
      tf.config.set_visible_devices([], "TPU")
    except (RuntimeError, ValueError):
      # Already initialised (devices fixed) or no such device type: check nothing leaked.
      pass
    return tf

  if os.environ.get("BERT_JAX_TF_LOGS") == "1" or "tensorflow" in sys.modules:
    return load()
  try:
    stderr_fd = sys.stderr.fileno()
  except (AttributeError, ValueError, OSError):  # stderr replaced by an object without a fd
    return load()
  sys.stderr.flush()
  saved = os.dup(stderr_fd)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), stderr_fd)
    try:
      return load()
    finally:
      sys.stderr.flush()
      os.dup2(saved, stderr_fd)
      os.close(saved)
      captured.seek(0)
      kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(True)
              if not any(n in line for n in NOISE)]
      if kept:
        sys.stderr.write("".join(kept))
        sys.stderr.flush()


tf = _import_tensorflow()

__all__ = ["tf"]
