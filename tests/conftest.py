"""Shared test set-up: 8 fake CPU devices for mesh tests, and TF kept off accelerators."""
import os
import sys
import tempfile

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
  sys.path.insert(0, ROOT)
from tests.testlib import xla_test_flags  # noqa: E402  pylint: disable=g-import-not-at-top

# Must be set before jax is imported anywhere in the test process. The optimisation level is
# the one for the programs a test starts (tests/testlib/xla_test_flags.py: why, with the figures).
os.environ.setdefault("XLA_FLAGS", xla_test_flags.with_devices(8))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One persistent JAX compilation cache for the whole run, shared by both xdist workers and every
# subprocess a test starts (they inherit the environment): the suite compiles the same tiny-preset
# programs in many tests and in every resumed run. Measured on this 2-core box: electra_test's
# pretrain-and-resume test took 50.7 s without it, 36.7 s with an empty cache, 21.1 s warm.
# JAX keys entries by program, flags and version, so a stale entry is never used.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"bert_jax_tests_jax_cache_{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# No LRU eviction (-1): with eviction on, every write scans every entry's "-atime" file, and a
# process writing an entry while another lists the directory warned "Error writing persistent
# compilation cache entry ... FileNotFoundError ...-atime" on stderr (seen 2026-11-26 with helpers'
# runs beside a CI run), which fails the tests that check a run's stderr is empty. A whole run's
# cache is ~200 MB (187 MB, 9,596 files after a day of runs here).
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", "-1")
# requirements-test.txt installs libtpu (bert_jax.plan's TPU compiler). On a host without TPU
# chips JAX would still try to start a TPU backend with it and print libtpu's errors: the
# programs' own start-up rule (bert_jax_core/platforms.py), applied here before any test imports
# jax; the plan tests compile for TPU topologies, which needs no backend.
from bert_jax_core import platforms  # noqa: E402  pylint: disable=g-import-not-at-top

platforms.choose_jax_platforms()
import jax  # noqa: E402  pylint: disable=g-import-not-at-top,g-bad-import-order

# This process's own compiles: XLA level 0 (tests/testlib/xla_test_flags.py).
jax.config.update("jax_disable_most_optimizations",
                  xla_test_flags.IN_PROCESS_DISABLE_MOST_OPTIMIZATIONS)


# The two xdist workers take the fast tests first, then the slow ones, the longest units of each
# first (tests/xdist_order.py says why and how).
def pytest_configure(config):
  from tests import xdist_order  # pylint: disable=g-import-not-at-top
  # getoption(..., None): under `-p no:xdist` the option does not exist.
  if not xdist_order.under_xdist_worker() and config.getoption("dist", None) == "loadfile":
    # Set before the workers start, so they inherit it (one file per run).
    os.environ[xdist_order.TIERS_ENV] = os.path.join(
        tempfile.mkdtemp(prefix="bert_jax_tiers_"), "slow_ids.json")


# tryfirst: the tier marks (tests/tiers.py) must be on the items before pytest's own hook
# deselects by -m, and before the xdist order reads them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
  del config
  from tests import tiers  # pylint: disable=g-import-not-at-top
  from tests import xdist_order  # pylint: disable=g-import-not-at-top
  tiers.apply(items)
  if xdist_order.under_xdist_worker():
    xdist_order.longest_first(items)


@pytest.hookimpl(optionalhook=True)   # a hook of pytest-xdist's, absent under -p no:xdist
def pytest_xdist_make_scheduler(config, log):
  from tests import xdist_order  # pylint: disable=g-import-not-at-top
  if config.getoption("dist", None) == "loadfile":
    return xdist_order.make_scheduler(config, log)
  return None
