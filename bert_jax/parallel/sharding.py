"""Device mesh, logical-axis rules and global-batch assembly.

Every parameter and activation in `model.py` carries logical axis names ("embed", "mlp",
"activation_batch", ...). The single table `LOGICAL_AXIS_RULES` maps them onto the three mesh
axes:
  data   - pure data parallelism: parameters replicated, batch split.
  fsdp   - data parallelism with parameters (and optimizer state) sharded along "embed"
           (ZeRO-3 style); the batch is split over data x fsdp.
  tensor - Megatron-style tensor parallelism over heads / MLP / vocab.
`mesh_shape=(-1, 1, 1)` (the default) is plain data parallelism over every device; -1 takes
what is left. A TPU v4-32 pod slice (16 chips) running BERT-large could use (4, 4, 1).
"""

import math

import jax
import numpy as np
import optax
from flax import linen as nn
from jax.experimental import mesh_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from bert_jax_core import errors

MESH_AXES = ("data", "fsdp", "tensor")

# One table for parameters and activations. Activation names are distinct from parameter names
# so that "embed" can be FSDP-sharded in weights while activations keep the hidden axis whole.
LOGICAL_AXIS_RULES = (
    # Parameters.
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("embed2", "tensor"),   # second axis of the HxH pooler / MLM-transform kernels
    ("mlp", "tensor"),
    ("heads", "tensor"),
    ("kv", None),
    ("pos", None),
    ("type", None),
    ("norm", None),
    ("classes", None),
    # Activations.
    ("activation_batch", ("data", "fsdp")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)


class ShardingError(errors.UserError):
  """A mesh shape or batch size that does not fit the devices."""


class DeviceOrderError(ShardingError):
  """A TPU slice whose topology-aware device order cannot be built for the requested mesh."""


def resolve_mesh_shape(mesh_shape, num_devices):
  """(-1, 1, 1) on 8 devices -> (8, 1, 1). Exactly one -1 is allowed."""
  shape = [int(s) for s in mesh_shape]
  if len(shape) != len(MESH_AXES):
    raise ShardingError(f"config.mesh_shape={tuple(mesh_shape)}: needs 3 entries for the axes "
                        f"{MESH_AXES}, e.g. (-1, 1, 1).")
  if shape.count(-1) > 1 or any(s == 0 or s < -1 for s in shape):
    raise ShardingError(f"config.mesh_shape={tuple(mesh_shape)}: use positive sizes and at "
                        "most one -1.")
  known = math.prod(s for s in shape if s != -1)
  if -1 in shape:
    if num_devices % known:
      raise ShardingError(f"config.mesh_shape={tuple(mesh_shape)}: {num_devices} devices are "
                          f"not divisible by {known}.")
    shape[shape.index(-1)] = num_devices // known
  if math.prod(shape) != num_devices:
    raise ShardingError(f"config.mesh_shape={tuple(mesh_shape)} uses {math.prod(shape)} "
                        f"devices but {num_devices} are present; use -1 for one axis.")
  return tuple(shape)


def create_mesh(mesh_shape=(-1, 1, 1), devices=None):
  devices = jax.devices() if devices is None else devices
  shape = resolve_mesh_shape(mesh_shape, len(devices))
  return Mesh(device_mesh_array(shape, devices), MESH_AXES)


def device_mesh_array(shape, devices):
  """The devices as an array of `shape`, in the order collectives run fastest.

  mesh_utils.create_device_mesh lays the mesh onto a TPU slice's physical torus, so the last
  (most communicating) axis, `tensor`, stays on direct ICI links; on GPU it sorts by device id,
  on CPU it keeps jax.devices() order. On TPU a shape it cannot lay out is a DeviceOrderError,
  never a silent fall-back to jax.devices() order (which can put a ring across the torus).
  """
  devices = list(devices)
  if devices[0].platform != "tpu":
    return mesh_utils.create_device_mesh(shape, devices)
  slices = {getattr(d, "slice_index", 0) for d in devices}
  if len(slices) > 1:
    raise DeviceOrderError(f"config.mesh_shape={shape}: the {len(devices)} TPU devices span "
                           f"{len(slices)} slices (multi-slice over DCN), which needs "
                           "mesh_utils.create_hybrid_device_mesh; this trainer builds one-slice "
                           "meshes only: run on one slice.")
  try:
    try:
      return mesh_utils.create_device_mesh(shape, devices)
    except NotImplementedError:
      # No mesh axis maps onto whole physical axes (e.g. (2, 8, 1) on a 4x4 slice): split a
      # physical axis, still following the torus.
      return mesh_utils.create_device_mesh(shape, devices, allow_split_physical_axes=True)
  except (NotImplementedError, ValueError, AssertionError) as e:
    # mesh_utils raises these three for shapes and slices it cannot map; its message is multi-line.
    reason = " ".join(str(e).split())
    raise DeviceOrderError(f"config.mesh_shape={shape}: no topology-aware device order on this "
                           f"{devices[0].device_kind} slice (physical {_tpu_topology(devices)}): "
                           f"{reason} Pick mesh axis sizes that are products of the physical "
                           "axis sizes.") from e


def _tpu_topology(devices):
  """"4x4x2" from the chips' coordinates (TPU devices carry `coords`)."""
  coords = np.asarray([d.coords for d in devices])
  return "x".join(str(int(n)) for n in coords.max(0) - coords.min(0) + 1)


def device_order_source(mesh):
  """How `mesh`'s devices were ordered, for the start-up line."""
  devices = list(mesh.devices.flat)
  platform = devices[0].platform
  if platform == "tpu":
    return (f"mesh_utils.create_device_mesh: topology-aware over the {_tpu_topology(devices)} "
            f"{devices[0].device_kind} torus")
  if platform == "gpu":
    return "mesh_utils.create_device_mesh: GPUs in device-id order"
  return f"mesh_utils.create_device_mesh: jax.devices() order ({platform}: no topology)"


def data_parallel_size(mesh):
  return mesh.shape["data"] * mesh.shape["fsdp"]


def check_batch_size(global_batch, mesh, micro_steps=1):
  """The global (micro-)batch must split evenly over data x fsdp and over hosts."""
  per_step = global_batch // micro_steps
  if global_batch % micro_steps:
    raise ShardingError(f"config.batch_size={global_batch} is not divisible by "
                        f"config.grad_accum_steps={micro_steps}.")
  dp = data_parallel_size(mesh)
  if per_step % dp:
    raise ShardingError(f"config.batch_size={global_batch} (micro-batch {per_step}) is not "
                        f"divisible by the data-parallel size {dp} (mesh {dict(mesh.shape)}); "
                        f"use a multiple of {dp}.")
  hosts = num_hosts(mesh)
  if per_step % hosts:
    raise ShardingError(f"config.batch_size={global_batch}: micro-batch {per_step} is not "
                        f"divisible by the {hosts} hosts.")


def num_hosts(mesh):
  """Hosts (processes) holding the mesh's devices: jax.process_count() for a mesh over every
  device, and the slice's host count for a compile-only topology (bert_jax/plan.py)."""
  return len({d.process_index for d in mesh.devices.flat})


def logical_to_sharding(logical_tree, mesh, rules=LOGICAL_AXIS_RULES):
  """A tree of logical PartitionSpecs (or boxed params) -> tree of NamedShardings."""
  return nn.logical_to_mesh_sharding(logical_tree, mesh, rules)


def train_state_shardings(tx, abstract_opt_state, param_shardings, mesh):
  """Shardings of dict(step, params, opt_state, rng) for the jitted train steps.

  Optimizer moments mirror their parameter's sharding (so FSDP shards Adam's state too);
  counters, the step and the RNG are replicated.
  """
  repl = replicated(mesh)
  return dict(step=repl, params=param_shardings, rng=repl,
              opt_state=optax.tree_map_params(tx, lambda _, s: s, abstract_opt_state,
                                              param_shardings,
                                              transform_non_params=lambda _: repl))


def batch_sharding(mesh):
  """Leading (batch) axis split over data x fsdp, the rest replicated."""
  return NamedSharding(mesh, P(("data", "fsdp")))


def replicated(mesh):
  return NamedSharding(mesh, P())


def make_global_batch(local_batch, mesh):
  """Host-local numpy batch (this host's rows) -> global jax.Arrays sharded over data x fsdp.

  Each host passes only its own rows ([global_batch / process_count, ...]); the global shape is
  inferred, so the global batch is the configured one whatever the host count.
  """
  sharding = batch_sharding(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), local_batch)
