"""Which JAX backends a program starts: those whose chips this host has, decided before JAX does.

requirements-test.txt installs libtpu (bert_jax.plan's TPU compiler). On a host without TPU chips
JAX still tries to start a TPU backend with it, and libtpu prints 4-5 lines of errors (no TPU
found, worker hostnames, ...) before the program says anything; a one-line `error:` became six.
JAX only skips a backend it is told to skip (JAX_PLATFORMS), so every bert_jax and data_pipelines
program makes this one decision as its package is imported, before JAX is (bert_jax/__init__.py,
data_pipelines/__init__.py; tests/conftest.py asks the same function):

  an accelerator library installed (libtpu, JAX's CUDA plugin) whose chips this host lacks
    -> JAX_PLATFORMS = the platforms whose chips are here, then cpu ("cpu" on a laptop or CI box
       with the test requirements; "cuda,cpu" on a GPU host that also has libtpu);
  otherwise (no such library, or every installed one has its chips) -> JAX's own default.

A JAX_PLATFORMS the user set (even empty) is never changed. bert_jax.plan needs no TPU backend:
it compiles for a TPU topology through jax.experimental.topologies, which loads libtpu itself.
"""

import glob
import importlib.util
import os

# JAX platform -> (the packages that bring its backend, the device files of its chips). TPU VMs
# expose chips as /dev/accel* (v2-v4) or VFIO groups /dev/vfio/<n> (v5e, v5p, v6e); NVIDIA GPUs
# as /dev/nvidia<n> (not /dev/nvidiactl, which a driver without a GPU also creates).
ACCELERATORS = {
    "tpu": (("libtpu",), ("/dev/accel*", "/dev/vfio/[0-9]*")),
    "cuda": (("jax_cuda12_plugin", "jax_cuda13_plugin"), ("/dev/nvidia[0-9]*",)),
}


def _installed(module):
  try:
    return importlib.util.find_spec(module) is not None
  except (ImportError, ValueError):   # a broken or half-removed package: not usable either
    return False


def platforms_for_this_host(accelerators=None, installed=_installed, exists=glob.glob):
  """JAX_PLATFORMS for this host, or None for JAX's default (see the module docstring)."""
  with_library = [p for p, (packages, _) in (accelerators or ACCELERATORS).items()
                  if any(installed(m) for m in packages)]
  here = [p for p in with_library
          if any(exists(g) for g in (accelerators or ACCELERATORS)[p][1])]
  if here == with_library:          # nothing installed for chips this host lacks
    return None
  return ",".join(here + ["cpu"])


def choose_jax_platforms(environ=None):
  """Sets JAX_PLATFORMS in `environ` (os.environ) when platforms_for_this_host says so and the
  user has not set it; returns the value it set, or None. Effective only before `import jax`
  (JAX reads JAX_PLATFORMS once, when it is imported)."""
  environ = os.environ if environ is None else environ
  if "JAX_PLATFORMS" in environ:
    return None
  value = platforms_for_this_host()
  if value is not None:
    environ["JAX_PLATFORMS"] = value
  return value
