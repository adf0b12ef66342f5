"""Import TensorFlow for input pipelines only, with every accelerator hidden from it.

TF must never take a GPU or TPU: on a TPU VM the chips belong to JAX, and on a GPU host TF would
otherwise reserve most of the GPU memory at start-up. Every module in data_pipelines imports TF
through here (`from data_pipelines.tf_setup import tf`).
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # silence TF's C++ start-up banner

import tensorflow as tf  # noqa: E402

try:
  tf.config.set_visible_devices([], "GPU")
  tf.config.set_visible_devices([], "TPU")
except (RuntimeError, ValueError):
  # Already initialised (devices fixed) or no such device type: check nothing leaked.
  pass

__all__ = ["tf"]
