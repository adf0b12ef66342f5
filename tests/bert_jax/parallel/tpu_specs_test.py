"""TPU slice names -> chip grids, hosts and JAX topologies (no JAX or libtpu needed)."""

import tests  # tests.ROOT: the repository
import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys

import pytest

from bert_jax.parallel import tpu_specs


# Expected values from the Cloud TPU catalogue as MaxText's accelerator_to_spec_map.py lists it
# (topology name, devices per slice, wrap-around).
@pytest.mark.parametrize("name, jax_topology, chips, hosts, wrap", [
    ("v4-8", "v4:2x2x1", 4, 1, (False, False, False)),
    ("v4-32", "v4:2x2x4", 16, 4, (False, False, False)),
    ("v4-128", "v4:4x4x4", 64, 16, (True, True, True)),
    ("v4-4096", "v4:8x16x16", 2048, 512, (True, True, True)),
    ("v5p-8", "v5:2x2x1", 4, 1, (False, False, False)),
    ("v5p-128", "v5:4x4x4", 64, 16, (True, True, True)),
    ("v5p-256", "v5:4x4x8", 128, 32, (True, True, True)),
    ("v5litepod-1", "v5e:1x1", 1, 1, (False, False, False)),
    ("v5litepod-8", "v5e:2x4", 8, 1, (False, False, False)),
    ("v5litepod-16", "v5e:4x4", 16, 4, (False, False, False)),
    ("v5e-256", "v5e:16x16", 256, 64, (True, True, False)),
    ("v6e-64", "v6e:8x8", 64, 16, (False, False, False)),
    ("v6e-128", "v6e:8x16", 128, 32, (False, True, False)),
    ("v6e-256", "v6e:16x16", 256, 64, (True, True, False)),
])
def test_cloud_names(name, jax_topology, chips, hosts, wrap):
  spec = tpu_specs.parse_topology(name)
  assert (spec.jax_topology, spec.chips, spec.hosts, spec.wrap) == (jax_topology, chips, hosts,
                                                                   wrap)


@pytest.mark.parametrize("name, cloud_name, chips", [
    ("v5e:4x4", "v5litepod-16", 16), ("v4:2x2x1", "v4-8", 4), ("v5p:4x4x12", "v5p-384", 192),
    ("v5:2x2x1", "v5p-8", 4), ("V6E-4", "v6e-4", 4), ("v5litepod:2x2", "v5litepod-4", 4)])
def test_jax_form_and_cloud_name(name, cloud_name, chips):
  spec = tpu_specs.parse_topology(name)
  assert (spec.cloud_name, spec.chips) == (cloud_name, chips)


def test_megacore_names_count_tensorcores():
  # v4-32 is 16 chips of 2 TensorCores; one JAX device (megacore) per chip.
  spec = tpu_specs.parse_topology("v4-32")
  assert spec.generation.cores_per_chip == 2 and spec.generation.chip_config_name == "megacore"
  assert tpu_specs.parse_topology("v6e-32").chips == 32


@pytest.mark.parametrize("name, message", [
    ("v3-8", r"not a TPU slice name of v4, v5e, v5p, v6e"),
    ("", r"not a TPU slice name"),
    ("v5p-7", r"count TensorCores, 2 per chip, so the number must be even"),
    ("v5p-384", r"192 chips have no single catalogue shape; give the chip grid in JAX's form"),
    ("v5e:4x4x4", r"v5e slices are 2-D chip grids"),
    ("v4:4x4", r"v4 slices are 3-D chip grids"),
    ("v5litepod-512", r"512 chips; the largest v5e slice has 256"),
    ("v4-2", r"v4-2: 1 chips have no single catalogue shape"),
    ("v5e-9", r"9 chips have no single catalogue shape; take a catalogue slice: v5litepod-8 or "
              r"v5litepod-16\.$"),
    ("v5e:3x3", r"does not split into hosts of 2x2 chips \(libtpu refuses it\)"),
    ("v5e:1x8", r"hosts of 4x2 chips .*take the catalogue's v5litepod-8 \(v5e:2x4\)"),
])
def test_bad_names_are_one_line_errors(name, message):
  with pytest.raises(tpu_specs.TopologyError, match=message):
    tpu_specs.parse_topology(name)


def test_topology_kwargs_for_jax():
  kw = tpu_specs.parse_topology("v5p-128").topology_kwargs()
  assert kw == dict(topology_name="v5:4x4x4", chip_config_name="megacore",
                    chips_per_host_bounds=(2, 2, 1), wrap=(True, True, True))


def _bad_topologies():
  """Every kind of refusal parse_topology has, over every generation: Cloud names of each count
  up to 600 and past each generation's largest, JAX grids of the wrong rank, of sides that are
  not whole hosts, and too large."""
  names = ["v3-8", "", "tpu-4"]
  for g in tpu_specs.GENERATIONS.values():
    prefix = "v5litepod" if g.name == "v5e" else g.name
    names += [f"{prefix}-{n}" for n in range(1, 600)]
    names += [f"{prefix}-{n}" for n in range(g.max_chips * g.cores_per_chip - 3,
                                              g.max_chips * g.cores_per_chip + 5)]
    names += [f"{g.jax_name}:{a}x{b}" for a, b in itertools.product(range(0, 20), repeat=2)]
    names += [f"{g.jax_name}:{a}x{b}x{c}" for a, b, c in itertools.product(range(0, 9), repeat=3)]
    names += [f"{g.jax_name}:{a}x{b}x{c}" for a, b, c in [(4, 4, 12), (16, 16, 64), (3, 4, 100)]]
  refused = {}
  for name in names:
    try:
      tpu_specs.parse_topology(name)
    except tpu_specs.TopologyError as e:
      refused[name] = str(e)
  return refused


_NAME = re.compile(r"\bv\d[a-z]*(?:-\d+|:\d+(?:x\d+)+)")


def _suggestions(refused):
  """{suggested topology: the bad name whose error suggested it}: every topology an error names
  besides the one it refuses."""
  out = {}
  for name, message in refused.items():
    advice = message.split(":", 1)[1] if name else message
    found = [s for s in _NAME.findall(advice) if s != name.lower()]
    assert found, f"{name}: {message} (suggests no topology)"
    for s in found:
      out.setdefault(s, name)
  return out


def test_every_topology_an_error_suggests_is_accepted():
  """Was: `--topology=v5e-9: ... e.g. v5e:4x4x12.`, which the next run refused (v5e is 2-D)."""
  refused = _bad_topologies()
  assert len(refused) > 1000 and "v5litepod-9" in refused and "v5e:3x3" in refused
  suggestions = _suggestions(refused)
  for suggested, bad in suggestions.items():
    try:
      tpu_specs.parse_topology(suggested)
    except tpu_specs.TopologyError as e:
      pytest.fail(f"--topology={bad} suggests {suggested}, which is refused: {e}")


@pytest.mark.slow
def test_libtpu_lays_out_every_topology_an_error_suggests():
  """The next run past parse_topology: libtpu's compile-only topology for each suggestion (its
  refusal of v5e:3x3, 'not divisible by chips_per_host_bounds', is parse_topology's now). A
  subprocess: plan_test's in-process libtpu must not be loaded twice at once."""
  if importlib.util.find_spec("libtpu") is None:
    pytest.skip("libtpu not installed (pip install -r requirements-test.txt)")
  names = sorted(_suggestions(_bad_topologies()))
  code = ("import json, sys\nimport jax\n"
          "from bert_jax.parallel import tpu_specs\n"
          "from bert_jax.planning import plan_compile\n"
          "bad = {}\n"
          "for n in json.loads(sys.argv[1]):\n"
          "  spec = tpu_specs.parse_topology(n)\n"
          "  try:\n"
          "    assert len(plan_compile.topology_devices(spec)) == spec.chips\n"
          "  except jax.errors.JaxRuntimeError as e:\n"
          "    bad[n] = str(e)[:300]\n"
          "print(json.dumps(bad))\n")
  r = subprocess.run([sys.executable, "-c", code, json.dumps(names)], cwd=tests.ROOT,
                     capture_output=True, text=True, timeout=600,
                     env=dict(os.environ, PYTHONPATH=tests.ROOT, JAX_PLATFORMS="cpu"))
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.loads(r.stdout.strip().splitlines()[-1]) == {}
