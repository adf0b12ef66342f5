"""Mesh construction: topology-aware device order, explicit errors, the start-up description."""

import dataclasses

import jax
import numpy as np
import pytest

from bert_jax_core import errors
from bert_jax.parallel import sharding


@dataclasses.dataclass(frozen=True)
class FakeTpu:
  """The attributes mesh_utils reads from a TPU device."""
  id: int
  coords: tuple
  device_kind: str = "TPU v4"
  platform: str = "tpu"
  core_on_chip: int = 0
  slice_index: int = 0
  process_index: int = 0


def _v4_slice(dims=(2, 2, 2), **kw):
  cells = [(x, y, z) for z in range(dims[2]) for y in range(dims[1]) for x in range(dims[0])]
  return [FakeTpu(i, c, **kw) for i, c in enumerate(cells)]


def test_cpu_mesh_keeps_device_order_and_says_so():
  mesh = sharding.create_mesh((-1, 2, 1))
  assert dict(mesh.shape) == {"data": 4, "fsdp": 2, "tensor": 1}
  assert list(mesh.devices.flat) == jax.devices()
  assert "jax.devices() order (cpu" in sharding.device_order_source(mesh)


def test_tpu_order_comes_from_the_physical_torus():
  devices = _v4_slice()
  # Shuffle the list: the order must come from the coordinates, not from the list.
  shuffled = [devices[i] for i in (5, 2, 7, 0, 3, 6, 1, 4)]
  array = sharding.device_mesh_array((2, 2, 2), shuffled)
  assert array.shape == (2, 2, 2)
  # Neighbours along the last (tensor) axis are neighbours on the torus: coords differ by one hop.
  for pair in array.reshape(-1, 2):
    assert sum(abs(a - b) for a, b in zip(pair[0].coords, pair[1].coords)) == 1
  np.testing.assert_array_equal(array, sharding.device_mesh_array((2, 2, 2), devices))


def test_tpu_shape_that_splits_a_physical_axis_is_still_topology_aware():
  # (2, 8, 1) on a 4x4x1 slice: no mesh axis of size 2 is a product of whole physical axes
  # (4, 4), so a physical axis is split; neighbours along the fsdp axis stay one hop apart.
  devices = _v4_slice((4, 4, 1))
  shuffled = [devices[i] for i in np.random.default_rng(0).permutation(16)]
  array = sharding.device_mesh_array((2, 8, 1), shuffled)
  assert array.shape == (2, 8, 1)
  assert {d.id for d in array.flat} == set(range(16))
  # Each fsdp group is a contiguous 4x2 half of the torus, whatever the list order.
  for row in array[:, :, 0]:
    assert len({d.coords[1] // 2 for d in row}) == 1, [d.coords for d in row]


def test_tpu_order_that_cannot_be_built_is_an_explicit_error():
  # A hole in the slice (chip (1, 1, 1) missing, another chip outside the cuboid) cannot be laid
  # onto a torus: the old code silently fell back to list order; now it is a one-line user error.
  devices = _v4_slice()[:-1] + [FakeTpu(7, (3, 3, 3))]
  with pytest.raises(sharding.DeviceOrderError, match="no topology-aware device order") as e:
    sharding.device_mesh_array((2, 2, 2), devices)
  assert isinstance(e.value, errors.UserError)
  assert "\n" not in str(e.value)
  assert "TPU v4" in str(e.value)


def test_multislice_is_refused_with_the_reason():
  devices = _v4_slice((2, 2, 1)) + [dataclasses.replace(d, id=d.id + 4, slice_index=1)
                                    for d in _v4_slice((2, 2, 1))]
  with pytest.raises(sharding.DeviceOrderError, match="2 slices"):
    sharding.device_mesh_array((8, 1, 1), devices)


@pytest.mark.parametrize("shape,match", [
    ((-1, -1, 1), "at most one -1"),
    ((3, 1, 1), "uses 3 devices but 8"),
    ((-1, 3, 1), "not divisible by 3"),
    ((8, 1), "needs 3 entries"),
])
def test_bad_mesh_shapes_are_user_errors(shape, match):
  with pytest.raises(sharding.ShardingError, match=match) as e:
    sharding.create_mesh(shape)
  assert isinstance(e.value, errors.UserError)


def test_batch_that_does_not_split_over_the_mesh():
  mesh = sharding.create_mesh((4, 2, 1))
  sharding.check_batch_size(16, mesh)
  with pytest.raises(sharding.ShardingError, match="data-parallel size 8"):
    sharding.check_batch_size(12, mesh)


def test_no_broad_exception_fallback_in_the_mesh_code():
  import inspect
  source = inspect.getsource(sharding)
  assert "except Exception" not in source and "except:" not in source
