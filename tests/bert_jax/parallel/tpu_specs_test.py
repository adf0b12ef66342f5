"""TPU slice names -> chip grids, hosts and JAX topologies (no JAX or libtpu needed)."""

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
])
def test_bad_names_are_one_line_errors(name, message):
  with pytest.raises(tpu_specs.TopologyError, match=message):
    tpu_specs.parse_topology(name)


def test_topology_kwargs_for_jax():
  kw = tpu_specs.parse_topology("v5p-128").topology_kwargs()
  assert kw == dict(topology_name="v5:4x4x4", chip_config_name="megacore",
                    chips_per_host_bounds=(2, 2, 1), wrap=(True, True, True))
