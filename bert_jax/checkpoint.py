"""Orbax checkpoints: the training CheckpointManager and params-only exports.

Two layouts, both written by Orbax only:

  workdir/checkpoints/<step>/state/   params, opt_state, step, rng   (StandardSave, sharded)
  workdir/checkpoints/<step>/meta/    JSON: config, model config, input position, vocab hash

  PATH/params/                        params only (StandardSave)     <- `save_params`
  PATH/bert_config.json               the BertConfig and provenance (converter, casing, ...)

`load_params(path)` accepts either layout (a params export, a workdir, or one step directory) so
`--config.init_checkpoint` can point at a converted Google/HF checkpoint or at a pre-training run.
"""

import json
import os
import shutil
import uuid

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax import model as model_lib
from bert_jax import errors


class CheckpointError(errors.UserError):
  pass


# ----------------------------------------------------------------------------------------------
# Training checkpoints.
# ----------------------------------------------------------------------------------------------
def create_manager(workdir, *, max_to_keep=3, keep_period=None, async_save=True):
  """Keeps the last `max_to_keep` checkpoints plus every step that is a multiple of keep_period.

  Saves are asynchronous: the train loop goes on while arrays are written, and a checkpoint
  only becomes visible (committed) once all of it is on disk.
  """
  # Orbax (tensorstore) wants absolute paths; a relative local workdir is made absolute here.
  if "://" not in str(workdir):
    workdir = os.path.abspath(workdir)
  directory = epath.Path(workdir) / "checkpoints"
  options = ocp.CheckpointManagerOptions(
      max_to_keep=max_to_keep, keep_period=keep_period, create=True,
      enable_async_checkpointing=async_save, cleanup_tmp_directories=True)
  return ocp.CheckpointManager(directory, options=options, item_names=("state", "meta"))


def save(manager, step, state, meta, force=False):
  return manager.save(step, args=ocp.args.Composite(
      state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)


def restore(manager, step, abstract_state):
  """Restores `state` into the shardings of `abstract_state` (ShapeDtypeStructs with sharding)."""
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
  return restored["state"], restored["meta"]


def read_meta(manager, step):
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


# ----------------------------------------------------------------------------------------------
# Params-only exports (conversion output, init_checkpoint input).
# ----------------------------------------------------------------------------------------------
CONFIG_NAME = "bert_config.json"


def save_params(path, params, model_config, meta=None):
  """Writes params + bert_config.json to `path` atomically (a temp dir renamed at the end).

  On object stores (gs://) a rename is not atomic: there the config is written first and the
  params last, and Orbax commits the params directory only when it is complete, so a crashed
  export has no `params/` and `load_params` refuses it.
  """
  path = str(path)
  if epath.Path(path).exists():
    raise CheckpointError(f"{path}: output already exists; choose a new path or delete it.")
  local = "://" not in path
  target = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if local else path
  epath.Path(target).mkdir(parents=True)
  info = {"bert_config": model_config.to_dict(), **(meta or {})}
  (epath.Path(target) / CONFIG_NAME).write_text(json.dumps(info, indent=2, sort_keys=True))
  params = jax.tree.map(np.asarray, params)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(epath.Path(target).absolute() / "params", params)
    ckptr.wait_until_finished()
  if local:
    os.rename(target, path)
  return path


def _latest_step_dir(ckpt_dir):
  steps = sorted(int(p.name) for p in epath.Path(ckpt_dir).iterdir()
                 if p.name.isdigit() and (p / "state").exists())
  return epath.Path(ckpt_dir) / str(steps[-1]) if steps else None


def resolve_checkpoint(path):
  """Returns ("params", dir) or ("train", step_dir) for any accepted layout of `path`."""
  p = epath.Path(path)
  if not p.exists():
    raise CheckpointError(f"init_checkpoint={path}: no such directory; give a params export "
                          "(python -m bert_jax.convert output), a workdir or a step directory.")
  if (p / CONFIG_NAME).exists():
    if not (p / "params").exists():
      raise CheckpointError(f"{path}: has {CONFIG_NAME} but no params/ (an interrupted export?); "
                            "re-run the conversion.")
    return "params", p
  if (p / "state").exists() and (p / "meta").exists():
    return "train", p
  if (p / "checkpoints").exists():
    p = p / "checkpoints"
  step_dir = _latest_step_dir(p) if p.exists() else None
  if step_dir is None:
    raise CheckpointError(f"init_checkpoint={path}: holds no committed checkpoint (expected "
                          f"{CONFIG_NAME}+params/, or checkpoints/<step>/state).")
  return "train", step_dir


def load_params(path):
  """Loads (params as numpy, BertConfig, meta dict) from any accepted layout."""
  kind, p = resolve_checkpoint(path)
  if kind == "params":
    info = json.loads((p / CONFIG_NAME).read_text())
    with ocp.StandardCheckpointer() as ckptr:
      params = _restore_numpy(ckptr, p.absolute() / "params")
    model_config = model_lib.BertConfig.from_dict(info.pop("bert_config"))
    return params, model_config, info
  meta = json.loads((p / "meta" / "metadata").read_text()) if (p / "meta" / "metadata").exists() \
      else ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(p / "meta")
  with ocp.StandardCheckpointer() as ckptr:
    state = _restore_numpy(ckptr, p.absolute() / "state", only="params")
  model_config = model_lib.BertConfig.from_dict(meta["model_config"])
  return state["params"], model_config, meta


def _restore_numpy(ckptr, path, only=None):
  """Restores to host numpy arrays (no device placement); `only` restores one top-level key."""
  metadata = ckptr.metadata(path)
  tree = getattr(metadata, "item_metadata", metadata)
  tree = getattr(tree, "tree", tree)
  if only is not None:
    tree = {only: tree[only]}
  target = jax.tree.map(lambda m: np.empty(m.shape, m.dtype), tree,
                        is_leaf=lambda m: hasattr(m, "shape") and hasattr(m, "dtype"))
  args = ocp.args.PyTreeRestore(
      item=target, restore_args=jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray),
                                             target), partial_restore=only is not None)
  with ocp.PyTreeCheckpointer() as ptc:
    return ptc.restore(path, args=args)


def check_params_match(loaded, expected, what):
  """Same tree and shapes, or a one-line error naming the first mismatching parameter."""
  flat_l = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(loaded)}
  flat_e = {jax.tree_util.keystr(k): v for k, v in jax.tree_util.tree_leaves_with_path(expected)}
  missing = sorted(set(flat_e) - set(flat_l))
  if missing:
    raise CheckpointError(f"{what}: parameter {missing[0]} missing in the checkpoint "
                          f"({len(missing)} missing); is it a checkpoint of this model?")
  for k, e in flat_e.items():
    if tuple(flat_l[k].shape) != tuple(e.shape):
      raise CheckpointError(f"{what}: parameter {k} has shape {tuple(flat_l[k].shape)} in the "
                            f"checkpoint but the config gives {tuple(e.shape)}; set the model "
                            "config (size, vocab_size) to the checkpoint's.")


def remove_dir(path):
  if epath.Path(path).exists():
    shutil.rmtree(path) if "://" not in str(path) else epath.Path(path).rmtree()
