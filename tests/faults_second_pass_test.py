"""Issue 32 ("Trust, second pass"): the faults a new user still hit on the planner, the report,
distillation, and a CPU host with libtpu installed. Each test failed before its fix; the rows of
docs/faults.md name them."""

import importlib.util
import os
import subprocess
import sys

import pytest

from bert_jax_core import platforms

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ----------------------------------------------------------------------------------------------
# Case 10: a CPU host with libtpu installed: the programs are quiet without JAX_PLATFORMS.
# ----------------------------------------------------------------------------------------------
def test_platform_rule_skips_installed_accelerators_whose_chips_are_absent():
  """The one decision (bert_jax_core/platforms.py) on fake hosts: what is installed, what is
  plugged in."""
  def host(installed, devices):
    return platforms.platforms_for_this_host(
        installed=lambda m: m in installed,
        exists=lambda pattern: [d for d in devices if d.startswith(pattern.split("*")[0]
                                                                    .split("[")[0])])
  assert host({"libtpu"}, []) == "cpu"                               # the test venv on a laptop
  assert host({"libtpu"}, ["/dev/accel0"]) is None                   # a TPU v4 VM: JAX's default
  assert host({"libtpu"}, ["/dev/vfio/0"]) is None                   # a TPU v5e/v5p/v6e VM
  assert host({"libtpu", "jax_cuda12_plugin"}, ["/dev/nvidia0"]) == "cuda,cpu"   # GPU + libtpu
  assert host({"jax_cuda12_plugin"}, ["/dev/nvidia0"]) is None
  assert host(set(), []) is None                                     # plain CPU jax
  env = {"JAX_PLATFORMS": ""}             # the user's setting, even empty, is never changed
  assert platforms.choose_jax_platforms(env) is None and env == {"JAX_PLATFORMS": ""}


def _run_bare(*args):
  """`python -m ...` as a user types it: no JAX_PLATFORMS in the environment."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None or
                    platforms.platforms_for_this_host() is None,
                    reason="needs libtpu installed on a host without TPU chips")
def test_programs_are_quiet_on_a_cpu_host_with_libtpu_without_jax_platforms(tmp_path):
  """Before: JAX started libtpu's TPU backend on this CPU host and it printed 4-5 lines of
  errors (host bounds, worker hostnames, a source trace) before the program's one line."""
  helpfull = _run_bare("bert_jax.train", "--helpfull")
  assert helpfull.stderr == ""                  # (absl exits 1 after --helpfull)
  assert "--workdir" in helpfull.stdout
  bad_flag = _run_bare("bert_jax.train", "--no_such_flag=1")
  assert (bad_flag.returncode, bad_flag.stderr) == (
      2, "error: Unknown command line flag 'no_such_flag'\n")
  # A mistake found after JAX has started its backends (the mesh needs the devices).
  mesh = _run_bare("bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny,runlocal",
                   f"--workdir={tmp_path / 'wd'}", "--config.train_input_files=synthetic",
                   "--config.mesh_shape=(3,1,1)")
  assert mesh.returncode == 2, mesh.stderr
  assert mesh.stderr.splitlines() == [mesh.stderr.strip()], mesh.stderr
  assert mesh.stderr.startswith("error: config.mesh_shape=(3, 1, 1) uses 3 devices")
