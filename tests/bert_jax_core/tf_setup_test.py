"""bert_jax_core/tf_setup.py and errors.quiet_third_party_logs: start-up noise a user cannot act
on is dropped, everything else is kept."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import logging
import os
import subprocess
import sys

from bert_jax_core import errors

ROOT = tests.ROOT

# Writes a real warning to fd 2 while TF is being imported (inside the capture), then imports TF.
_SCRIPT = """
import os, sys
os.write(2, b"my own warning: keep me\\n")
from bert_jax_core.tf_setup import tf
print(tf.config.get_visible_devices("GPU"))
print(sorted(m for m in ("sklearn", "matplotlib") if m in sys.modules))  # skipped in TF's import
import sklearn.metrics, matplotlib  # ...and importable afterwards
print(sklearn.metrics.accuracy_score([1, 0], [1, 1]))
"""


def _run(extra_env=None):
  env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
  env.update(PYTHONPATH=ROOT, **(extra_env or {}))
  return subprocess.run([sys.executable, "-c", _SCRIPT], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300)


def test_tf_import_drops_known_noise_and_keeps_other_stderr_lines():
  r = _run()
  assert r.returncode == 0, r.stderr
  # No GPU for TF, ever; keras' sklearn and matplotlib imports skipped during TF's import only.
  assert r.stdout.split() == ["[]", "[]", "0.5"], r.stdout
  assert "my own warning: keep me" in r.stderr
  from bert_jax_core import tf_setup
  assert not any(n in r.stderr for n in tf_setup.NOISE), r.stderr
  assert "I0000" not in r.stderr and "E0000" not in r.stderr, r.stderr


def test_bert_jax_tf_logs_shows_everything():
  r = _run({"BERT_JAX_TF_LOGS": "1"})
  assert r.returncode == 0 and "my own warning: keep me" in r.stderr
  # (whether TF prints its banner depends on the machine; the filter is off either way)


def test_orbax_notices_are_filtered_and_real_warnings_kept(caplog):
  errors.quiet_third_party_logs()
  errors.quiet_third_party_logs()  # idempotent
  logger = logging.getLogger("absl")
  assert sum(isinstance(f, errors._QuietFilter) for f in logger.filters) == 1
  with caplog.at_level(logging.WARNING, logger="absl"):
    logger.warning("Metadata file does not exist: %s", "/x/_CHECKPOINT_METADATA")
    logger.warning("Waiting for previous save to complete took %f seconds. If this number is "
                   "high, consider checkpointing less frequently.", 3.0)
    logger.warning("Checkpoint %s is damaged", "/x")
  assert [r.getMessage() for r in caplog.records] == ["Checkpoint /x is damaged"]


# A tf.data warning at run time (W level), after `import jax` set TF_CPP_MIN_LOG_LEVEL=1 as it
# does (jax/__init__.py): the quick start's "Optimization loop failed: CANCELLED" came this way.
_RUNTIME_WARNING = """
import jax
from bert_jax_core.tf_setup import tf
for _ in tf.data.Dataset.range(100).cache().take(2):  # a partly read cache: TF warns
  pass
print("done")
"""


def test_tf_runtime_warnings_are_quiet_after_jax_set_its_default_level():
  def run(**env_extra):
    env = {k: v for k, v in os.environ.items() if k not in ("TF_CPP_MIN_LOG_LEVEL",
                                                          "BERT_JAX_TF_LOGS")}
    env.update(PYTHONPATH=ROOT, JAX_PLATFORMS="cpu", **env_extra)
    return subprocess.run([sys.executable, "-c", _RUNTIME_WARNING], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
  quiet = run()
  assert quiet.returncode == 0 and quiet.stdout.strip() == "done", quiet.stderr
  assert quiet.stderr == "", quiet.stderr
  # The warning is real (so the check above can fail): a user's level 0, or BERT_JAX_TF_LOGS=1,
  # shows it.
  for shown in (run(TF_CPP_MIN_LOG_LEVEL="0"), run(BERT_JAX_TF_LOGS="1")):
    assert "did not fully read the dataset being cached" in shown.stderr, shown.stderr
