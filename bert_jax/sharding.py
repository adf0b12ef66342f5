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
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bert_jax import errors

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
  pass


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
  try:
    # Topology-aware device order on TPU (keeps the tensor axis on fast ICI links).
    device_array = jax.experimental.mesh_utils.create_device_mesh(shape, devices)
  except Exception:  # CPU fake devices or odd shapes: plain order is fine
    device_array = np.asarray(devices).reshape(shape)
  return Mesh(device_array, MESH_AXES)


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
  if per_step % jax.process_count():
    raise ShardingError(f"config.batch_size={global_batch}: micro-batch {per_step} is not "
                        f"divisible by the {jax.process_count()} hosts.")


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
