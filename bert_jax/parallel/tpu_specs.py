"""Cloud TPU slices by the names users type, and what a plan needs to know about each chip.

  spec = tpu_specs.parse_topology("v5p-128")   # -> 64 chips, JAX topology "v5:4x4x4", 16 hosts
  spec = tpu_specs.parse_topology("v5e:4x4")   # JAX's form works too

Cloud TPU names count TensorCores for v4 and v5p (two per chip, fused into one "megacore"
device: v4-32 is 16 chips) and chips for v5e and v6e (one core per chip: v5litepod-16 is 16
chips). JAX's compile-only topologies (jax.experimental.topologies) take "<generation>:<shape>"
with the chip grid, e.g. "v5:4x4x4" for v5p-128. The shape of a power-of-two slice follows the
Cloud TPU catalogue (and MaxText's accelerator_to_spec_map.py): v4/v5p start at 2x2x1 (one host
of 4 chips) and double the last of their smallest axes (2x2x2, 2x2x4, 2x4x4, 4x4x4, 4x4x8 ...);
v5e/v6e grow 1x1, 1x2, 2x2, 2x4, 4x4, 4x8, 8x8, 8x16, 16x16. Other shapes (v5p-384 = 4x4x12)
are given in JAX's form. Pure Python: importable without JAX or libtpu.
"""

import dataclasses
import math
import re

from bert_jax_core import errors


class TopologyError(errors.UserError):
  """A --topology the planner cannot map onto a TPU slice."""


@dataclasses.dataclass(frozen=True)
class Generation:
  name: str                  # what users type: v4, v5p, v5e, v6e
  jax_name: str              # the prefix JAX's topologies take: v4, v5, v5e, v6e
  device_kind: str           # jax Device.device_kind of its chips
  cores_per_chip: int        # TensorCores in a Cloud TPU name's count (megacore chips: 2)
  dims: int                  # 3-D torus (v4, v5p) or 2-D (v5e, v6e)
  chip_config_name: str      # "megacore" (one device per chip) or "default"
  max_chips: int             # the largest single slice
  hbm_gib: float             # HBM per chip (Cloud TPU system architecture pages)
  hbm_gb_per_s: float        # HBM bandwidth per chip, GB/s (same source)
  peak_bf16_tflops: float    # dense bf16 peak per chip (same source)
  price_per_chip_hour: float  # on-demand USD, us-central regions (PRICE_NOTE)


# Vendor figures, from cloud.google.com/tpu/docs/system-architecture-tpu-vm and the per-version
# pages (v4, v5e, v5p, v6e). The planner's FITS verdict uses the compiler's own figure for the
# HBM a program may use (probed at plan time: 30.75 / 15.75 / 95.74 / 31.25 GiB with libtpu
# 0.0.42.1), not these nominal sizes.
GENERATIONS = {
    "v4": Generation("v4", "v4", "TPU v4", 2, 3, "megacore", 4096, 32, 1228, 275, 3.22),
    "v5p": Generation("v5p", "v5", "TPU v5", 2, 3, "megacore", 8960, 95, 2765, 459, 4.20),
    "v5e": Generation("v5e", "v5e", "TPU v5 lite", 1, 2, "default", 256, 16, 819, 197, 1.20),
    "v6e": Generation("v6e", "v6e", "TPU v6 lite", 1, 2, "default", 256, 32, 1640, 918, 2.70),
}
PRICE_NOTE = ("on-demand list prices per chip-hour in us-central regions from "
              "cloud.google.com/tpu/pricing as of 2025 (not re-checked from this offline host on "
              "2026-11-24; regions, spot and committed-use prices differ): pass "
              "--price_per_chip_hour for yours")

_ALIASES = {"v4": "v4", "v5p": "v5p", "v5": "v5p", "v5e": "v5e", "v5litepod": "v5e",
            "v5lite": "v5e", "v6e": "v6e", "v6": "v6e"}


@dataclasses.dataclass(frozen=True)
class SliceSpec:
  """One TPU slice, ready for jax.experimental.topologies.get_topology_desc."""
  name: str                  # as the user typed it
  generation: Generation
  shape: tuple               # chip grid, e.g. (4, 4, 4) or (4, 4)
  chips_per_host: tuple      # chips_per_host_bounds (x, y, z)
  wrap: tuple                # torus wrap-around per axis (3 entries)

  @property
  def chips(self):
    return math.prod(self.shape)

  @property
  def hosts(self):
    return self.chips // math.prod(self.chips_per_host)

  @property
  def jax_topology(self):
    return f"{self.generation.jax_name}:{'x'.join(map(str, self.shape))}"

  @property
  def cloud_name(self):
    """The Cloud TPU accelerator type (v5p-128, v5litepod-16, ...)."""
    return _cloud_name(self.generation, self.chips)

  def topology_kwargs(self):
    return dict(topology_name=self.jax_topology, chip_config_name=self.generation.chip_config_name,
                chips_per_host_bounds=self.chips_per_host, wrap=self.wrap)


def _cloud_name(gen, chips):
  prefix = "v5litepod" if gen.name == "v5e" else gen.name
  return f"{prefix}-{chips * gen.cores_per_chip}"


def _grid(chips, dims):
  """The catalogue's chip grid of a power-of-two slice (module docstring)."""
  shape = [2, 2, 1] if dims == 3 else [1, 1]
  if dims == 3 and chips < 4:
    return None
  while math.prod(shape) < chips:
    smallest = min(shape)
    i = len(shape) - 1 - shape[::-1].index(smallest)   # the last of the smallest axes
    shape[i] *= 2
  return tuple(shape) if math.prod(shape) == chips else None


def _host_bounds(shape, dims):
  """Chips per host: 4 (2x2) on multi-host slices, as Cloud TPU VMs; one host below that."""
  chips = math.prod(shape)
  if dims == 2 and chips == 8:
    return (2, 4, 1) if shape == (2, 4) else (4, 2, 1)   # v5litepod-8 / v6e-8: one 8-chip VM
  if chips < 4:
    return tuple(shape) + (1,) * (3 - len(shape))
  return (2, 2, 1)


def _wrap(shape, dims):
  """Torus wrap-around: v4/v5p cubes of >= 4 per side; v5e/v6e axes of 16 (full pod rows)."""
  if dims == 3:
    full = min(shape) >= 4
    return (full,) * 3
  return tuple(s == 16 for s in shape) + (False,)


def _splits_into_hosts(shape, dims):
  """libtpu's rule: each side a multiple of a host's (v5e:3x3 on 2x2-chip hosts is refused)."""
  return all(side % b == 0 for side, b in zip(shape, _host_bounds(shape, dims)))


def _grid_of(chips, gen):
  """A chip grid of exactly `chips` that the next run accepts, or None: the catalogue's, else
  sides made of whole hosts (3-D: 4x4xN as v5p-384's 4x4x12, or 2x2xN; 2-D: the squarest even
  sides up to a pod row's 16; below one host, one row)."""
  if not 1 <= chips <= gen.max_chips or chips != int(chips):
    return None
  chips = int(chips)
  shape = _grid(chips, gen.dims)
  if shape is None and chips < 4:
    shape = (1,) * (gen.dims - 1) + (chips,)
  elif shape is None and gen.dims == 3 and chips % 16 == 0:
    shape = (4, 4, chips // 16)
  elif shape is None and gen.dims == 3 and chips % 4 == 0:
    shape = (2, 2, chips // 4)
  elif shape is None and gen.dims == 2:
    sides = [(a, chips // a) for a in range(2, 17, 2) if chips % a == 0 and a <= chips // a <= 16
             and chips // a % 2 == 0]
    shape = sides[-1] if sides else None
  return shape if shape is not None and _splits_into_hosts(shape, gen.dims) else None


def _nearest_slices(chips, gen):
  """The catalogue slices just below and just above `chips` (Cloud TPU names), e.g.
  9 v5e chips -> v5litepod-8 and v5litepod-16."""
  sizes = [c for c in (2 ** k for k in range(14)) if c <= gen.max_chips and _grid(c, gen.dims)]
  below = [c for c in sizes if c < chips][-1:]
  above = [c for c in sizes if c > chips][:1]
  return " or ".join(_cloud_name(gen, c) for c in below + above)


def _jax_form(gen, shape):
  return f"{gen.jax_name}:{'x'.join(map(str, shape))}"


def _advice(chips, gen):
  """What to run instead of a slice of `chips` chips: this count's grid in JAX's form where
  one splits into hosts, and the catalogue's neighbours. Every name parse_topology accepts
  (tpu_specs_test checks each, and libtpu's topology for each)."""
  grid = _grid_of(chips, gen)
  nearest = _nearest_slices(chips, gen)
  if grid is not None and grid == _grid(chips, gen.dims):
    return f"take the catalogue's {_cloud_name(gen, chips)} ({_jax_form(gen, grid)})"
  if grid is None:
    return f"take a catalogue slice: {nearest}"
  return f"give the chip grid in JAX's form, e.g. {_jax_form(gen, grid)}, or take {nearest}"


def parse_topology(name) -> SliceSpec:
  """"v5p-128" / "v5litepod-16" / "v4-32" / "v6e-64" / "v5e:4x4" / "v4:2x2x1" -> SliceSpec.

  Every refusal's advice names topologies this function accepts and libtpu lays out."""
  text = (name or "").strip().lower()
  examples = "e.g. v5p-128, v5litepod-16, v4-32, v6e-64 or JAX's form v5e:4x4, v4:2x2x1"
  m = re.fullmatch(r"([a-z0-9]+?)(?:-(\d+)|:(\d+(?:x\d+){1,2}))", text)
  gen = GENERATIONS.get(_ALIASES.get(m.group(1), "")) if m else None
  if gen is None:
    known = ", ".join(sorted(GENERATIONS))
    raise TopologyError(f"--topology={name!r}: not a TPU slice name of {known} ({examples}).")
  if m.group(2):                                    # Cloud TPU name: cores or chips
    count = int(m.group(2))
    if count % gen.cores_per_chip:
      raise TopologyError(f"--topology={name}: {gen.name} names count TensorCores, "
                          f"{gen.cores_per_chip} per chip, so the number must be even: "
                          f"{_nearest_slices(count / gen.cores_per_chip, gen)}.")
    chips = count // gen.cores_per_chip
    shape = _grid(chips, gen.dims)
    if shape is None and chips <= gen.max_chips:
      raise TopologyError(f"--topology={name}: {chips} chips have no single catalogue shape; "
                          f"{_advice(chips, gen)}.")
  else:
    shape = tuple(int(s) for s in m.group(3).split("x"))
    if len(shape) != gen.dims or min(shape) < 1:
      chips = math.prod(shape)
      grid = _grid_of(chips, gen) or _grid(4, gen.dims)
      raise TopologyError(f"--topology={name}: {gen.name} slices are {gen.dims}-D chip grids, "
                          f"e.g. {_jax_form(gen, grid)} ({math.prod(grid)} chips).")
  chips = math.prod(shape) if shape else chips
  if chips > gen.max_chips:
    raise TopologyError(f"--topology={name}: {chips} chips; the largest {gen.name} "
                        f"slice has {gen.max_chips} ({_nearest_slices(gen.max_chips + 1, gen)}).")
  if not _splits_into_hosts(shape, gen.dims):
    bounds = "x".join(map(str, _host_bounds(shape, gen.dims)[:gen.dims]))
    raise TopologyError(f"--topology={name}: the chip grid does not split into hosts of {bounds} "
                        f"chips (libtpu refuses it); {_advice(chips, gen)}.")
  return SliceSpec(name=name, generation=gen, shape=shape,
                   chips_per_host=_host_bounds(shape, gen.dims), wrap=_wrap(shape, gen.dims))
