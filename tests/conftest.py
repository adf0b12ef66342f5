"""Shared test set-up: 8 fake CPU devices for mesh tests, and TF kept off accelerators."""
import glob
import importlib.util
import os
import sys

# Must be set before jax is imported anywhere in the test process.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# requirements-test.txt installs libtpu (bert_jax.plan's TPU compiler). On a host without TPU
# chips JAX would still try to start a TPU backend with it and print libtpu's errors; the tests
# run on CPU devices (the plan tests compile for TPU topologies, which needs no backend).
if (importlib.util.find_spec("libtpu") is not None and not glob.glob("/dev/accel*")
    and not glob.glob("/dev/vfio/[0-9]*") and not glob.glob("/dev/nvidia[0-9]*")):
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
