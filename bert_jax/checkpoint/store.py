"""Orbax checkpoints: the training CheckpointManager and params-only exports, both checksummed.

Two layouts, both written by Orbax only:

  workdir/checkpoints/<step>/state/   params, opt_state, step, rng   (StandardSave, sharded)
  workdir/checkpoints/<step>/meta/    JSON: config, model config, input position, vocab hash
  workdir/checkpoints/<step>/manifest.sha256.json   size + SHA-256 of every file (manifest.py)

  PATH/params/                        params only (StandardSave)     <- `save_params`
  PATH/bert_config.json               the BertConfig and provenance (converter, casing, ...)
  PATH/manifest.sha256.json

The manifest of a step is written inside Orbax's temporary step directory, after every array is
on disk and before Orbax commits (renames) it (`AsyncOptions.post_finalization_callback`), so a
committed step always carries its manifest: a step whose meta says it has one but has none was
tampered with. On resume, `latest_verified_step` checks the newest step and falls back, saying
so, to the newest that verifies; a step written before manifests existed restores with a warning.

`describe(path)` says what is at any accepted path (a params export, a workdir, one step
directory, a finished fine-tuning workdir's best_epoch{N} export): its kind, step, BertConfig,
meta (vocab, casing, provenance) and where its parameters are; it reads no array. Every reader of
checkpoints goes through it (load_params here, trainer_lib.read_pretrained, inference, convert),
so `--config.init_checkpoint` can point at a converted Google/HF checkpoint or at any run.

  python -m bert_jax.checkpoint verify DIR     # a workdir, its checkpoints/, a step, or an export
"""

import dataclasses
import errno
import json
import logging as logging_std
import os
import re
import shutil
import sys
import time
import warnings

from absl import logging
import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from bert_jax_core import errors
from bert_jax.checkpoint import manifest as manifest_lib
from bert_jax.models import model as model_lib


class CheckpointError(errors.UserError):
  pass


ManifestError = manifest_lib.ManifestError
# Tests only: seconds each asynchronous save stays open (uncommitted) before its manifest is
# written, so that tests/end_to_end/kill_test.py can SIGKILL a run inside a checkpoint write.
SLOW_SAVE_ENV = "BERT_JAX_TEST_SLOW_CHECKPOINT_S"
MANIFEST_KEY = "manifest"      # in a step's meta: "sha256" when the step was saved with one
# Errors of a write that ran out of room or permission: reported as one line, earlier steps kept.
_WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EROFS, errno.EPERM)


# ----------------------------------------------------------------------------------------------
# Training checkpoints.
# ----------------------------------------------------------------------------------------------
def _one_writer_per_array_on_one_host():
  """Orbax's replica-parallel save (its default on CPU and TPU; off on GPU) splits a replicated
  array into one slice per replica so that several HOSTS share its writing. On one process
  there is no other host: each slice is a jitted slice compiled for each (shape, device), 160
  compiles at the first save of an 8-device electra-tiny run on CPU, 9 of its 65 CPU s
  (2026-11-26). One process writes each array from one replica; a pod keeps replica-parallel.
  Which replica writes changes no byte of the restored state."""
  parallel = jax.process_count() > 1
  if _ARRAY_HANDLER_REPLICA_PARALLEL == [parallel]:
    return
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)   # Orbax warns that it overrides its default
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=parallel), override=True)
  finally:
    logging.set_verbosity(verbosity)
  _ARRAY_HANDLER_REPLICA_PARALLEL[:] = [parallel]


_ARRAY_HANDLER_REPLICA_PARALLEL = []   # what _one_writer_per_array_on_one_host registered


class Manager:
  """An Orbax CheckpointManager whose every step carries a SHA-256 manifest (see module doc).

  Other attributes (latest_step, all_steps, directory, ...) are the Orbax manager's.
  """

  def __init__(self, directory, *, max_to_keep, keep_period, async_save, log_every_save=True):
    self.async_save = async_save
    self.log_every_save = log_every_save
    self._saving = None            # (step, label) of the save in flight
    # Always an AsyncCheckpointer: the manifest callback exists only there. A synchronous save
    # waits for it in `save`.
    options = ocp.CheckpointManagerOptions(
        max_to_keep=max_to_keep, keep_period=keep_period, create=True,
        enable_async_checkpointing=True, cleanup_tmp_directories=True,
        async_options=ocp.AsyncOptions(post_finalization_callback=self._write_manifest))
    _one_writer_per_array_on_one_host()
    self._manager = ocp.CheckpointManager(directory, options=options,
                                          item_names=("state", "meta"))
    _QUIET.add()

  def __getattr__(self, name):
    return getattr(self._manager, name)

  def _write_manifest(self):
    """Runs in Orbax's finalize thread on the primary host, once every host's files of the step
    are written and before the step is committed (see manifest.py)."""
    step, label = self._saving
    if os.environ.get(SLOW_SAVE_ENV):  # fault injection (tests/end_to_end/kill_test.py) only
      time.sleep(float(os.environ[SLOW_SAVE_ENV]))
    tmp = self._manager.directory / f"{step}{ocp.utils.TMP_DIR_SUFFIX}"
    step_dir = tmp if tmp.exists() else self._manager.directory / str(step)  # gs: no rename
    n, size = manifest_lib.write_manifest(step_dir)
    if self.log_every_save:
      print(f"checkpoint {label} saved (verified: sha256 manifest of {n} files, "
            f"{size / 1e6:.1f} MB)", flush=True)

  def save(self, step, state, meta, *, force=False, label=None):
    meta = dict(meta, **{MANIFEST_KEY: "sha256"})
    # The previous save first, under its own step: a failure there names that step (it used to
    # name this one), and nothing new starts after it.
    self.wait_until_finished()
    try:
      self._saving = (step, step if label is None else label)
      saved = self._manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=force)
      if not self.async_save:
        self.wait_until_finished()
    except (OSError, ValueError) as e:  # ValueError: tensorstore's I/O errors (re-raised if not)
      self._raise_write_error(step, e)
    return saved

  def check_for_errors(self):
    """Raises the save in flight's CheckpointError once it has failed; never blocks on a save
    still writing. The loop calls it every step, so a failed asynchronous save stops training at
    the next step, not at the next save (issue 23: two more steps trained, the wrong one named)."""
    if self._saving and not self._manager.is_saving_in_progress():
      self.wait_until_finished()   # finished: returns at once, or raises the failed save's error

  def wait_until_finished(self):
    step = self._saving[0] if self._saving else "?"
    try:
      self._manager.wait_until_finished()
    except (OSError, ValueError) as e:
      self._raise_write_error(step, e)

  def close(self):
    self.wait_until_finished()
    self._manager.close()
    _QUIET.remove()

  def _raise_write_error(self, step, e):
    """A CheckpointError for a full disk / read-only / permission error; `e` itself otherwise."""
    code = write_errno(e)
    if code not in _WRITE_ERRNOS:
      raise e
    _QUIET.reported = True
    # The failed save leaves Orbax's per-fragment write coroutines unawaited; Python warns of each
    # when it collects them at exit (2 stderr lines each, same cause as the line below).
    warnings.filterwarnings("ignore", message="coroutine .* was never awaited",
                            category=RuntimeWarning)
    kept = sorted(int(p.name) for p in self._manager.directory.iterdir()
                  if p.name.isdigit() and int(p.name) != step)   # committed steps only
    raise CheckpointError(
        f"checkpoint {step}: cannot write to {self._manager.directory} ({os.strerror(code)}); "
        "training stopped; free space or fix permissions and re-run the same command: "
        + (f"it resumes from checkpoint {kept[-1]} (checkpoints {kept} are intact)." if kept
           else "no earlier checkpoint exists, so it starts over.")) from e


def write_errno(e):
  """The errno of an OSError or of tensorstore's ValueError("... [os_error_code='28']")."""
  code = e.errno if isinstance(e, OSError) else None
  if code is None:
    m = re.search(r"os_error_code='?(\d+)", str(e))
    code = int(m.group(1)) if m else None
  return code


class _QuietFailedWrites:
  """While a Manager is open: Orbax's ERROR logs of a write that failed for want of space or
  permission (4 tracebacks, ~300 lines, for one full disk), asyncio's 'exception was never
  retrieved' for the same errors (~280 more when the arrays are sharded over 8 devices) and
  asyncio's 'Event loop is closed' that tensorstore's late callbacks raise after Orbax closed its
  loop (~100 unraisable tracebacks) are dropped: `Manager._raise_write_error` reports that failure in one line, with
  the original exception chained; once it is raised, Orbax's further errors (its threads failing
  on while the process exits) are dropped too. Any other error or unraisable exception passes
  through."""

  def __init__(self):
    self._users, self._previous_hook = 0, None
    self.reported = False      # a write failure was raised as a CheckpointError

  def filter(self, record):
    if record.levelno < logging_std.ERROR or not (
        "orbax" in record.pathname or record.name == "asyncio"):
      return True
    if self.reported:   # the run is stopping: Orbax's threads fail on in the shutdown
      return False        # ('cannot schedule new futures after shutdown'), all one cause
    e = record.exc_info[1] if record.exc_info else None
    code = write_errno(e) if e is not None else write_errno(ValueError(record.getMessage()))
    return code not in _WRITE_ERRNOS

  def _unraisable(self, u):
    if isinstance(u.exc_value, RuntimeError) and str(u.exc_value) == "Event loop is closed":
      return
    self._previous_hook(u)

  def add(self):
    if self._users == 0:
      logging_std.getLogger("absl").addFilter(self)
      logging_std.getLogger("asyncio").addFilter(self)
      self._previous_hook, sys.unraisablehook = sys.unraisablehook, self._unraisable
    self._users += 1

  def remove(self):
    if self._users == 1:
      logging_std.getLogger("absl").removeFilter(self)
      logging_std.getLogger("asyncio").removeFilter(self)
      sys.unraisablehook = self._previous_hook
    self._users = max(0, self._users - 1)


_QUIET = _QuietFailedWrites()


def create_manager(workdir, *, max_to_keep=3, keep_period=None, async_save=True):
  """Keeps the last `max_to_keep` checkpoints plus every step that is a multiple of keep_period.

  Saves are asynchronous: the train loop goes on while arrays are written, and a checkpoint
  only becomes visible (committed) once all of it, manifest included, is on disk.
  """
  # Orbax (tensorstore) wants absolute paths; a relative local workdir is made absolute here.
  if "://" not in str(workdir):
    workdir = os.path.abspath(workdir)
  return Manager(epath.Path(workdir) / "checkpoints", max_to_keep=max_to_keep,
                 keep_period=keep_period, async_save=async_save)


def save(manager, step, state, meta, force=False, label=None):
  """Saves step `step`; `label` is the number printed ("checkpoint <label> saved (verified)")."""
  return manager.save(step, state, meta, force=force, label=label)


def restore(manager, step, abstract_state):
  """Restores `state` into the shardings of `abstract_state` (ShapeDtypeStructs with sharding)."""
  restored = manager.restore(step, args=ocp.args.Composite(
      state=ocp.args.StandardRestore(abstract_state), meta=ocp.args.JsonRestore()))
  return restored["state"], restored["meta"]


def read_meta(manager, step):
  return manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]


# ----------------------------------------------------------------------------------------------
# Verification and fallback.
# ----------------------------------------------------------------------------------------------
def _claims_manifest(step_dir):
  """Whether the step's meta says it was saved with a manifest (False: an older step)."""
  try:
    return json.loads(step_meta_file(step_dir).read_text()).get(MANIFEST_KEY) is not None
  except (FileNotFoundError, json.JSONDecodeError):
    return True  # meta gone or garbled: not an old step, a damaged one


def verify_dir(path, claims_manifest=True):
  """Verifies a step or export directory.

  Returns ("verified", files, bytes), or ("unverified", 0, 0) for a directory written before
  manifests existed. Raises ManifestError naming the file for a damaged one.
  """
  if not manifest_lib.has_manifest(path):
    if claims_manifest:
      raise ManifestError(f"{epath.Path(path) / manifest_lib.NAME}: manifest "
                          "missing, but the checkpoint was saved with one (deleted?).")
    return "unverified", 0, 0
  n, size = manifest_lib.verify(path)
  return "verified", n, size


def latest_verified_step(manager):
  """The newest step that verifies (or has no manifest: warned), or None for an empty workdir.

  Newer damaged steps are moved to `<workdir>/checkpoints.corrupt/` (by the primary host) so that
  training can save those step numbers again; each is reported on one line. If no step
  verifies, a CheckpointError lists them and nothing is moved.
  """
  directory = manager.directory
  steps = sorted(manager.all_steps(), reverse=True)
  damaged = []
  for step in steps:
    step_dir = directory / str(step)
    t0 = time.time()
    try:
      status, n, size = verify_dir(step_dir, _claims_manifest(step_dir))
    except ManifestError as e:
      damaged.append((step, str(e)))
      continue
    if status == "unverified":
      logging.warning("checkpoint %s has no manifest (saved before manifests existed): "
                      "restoring it unverified", step)
      print(f"warning: checkpoint {step} has no manifest (saved before manifests existed); "
            "restoring it unverified", file=sys.stderr, flush=True)
    elif jax.process_index() == 0:
      dt = time.time() - t0
      print(f"checkpoint {step} verified ({n} files, {size / 1e6:.1f} MB in {dt:.1f} s)",
            flush=True)
    if damaged:
      _move_aside(manager, damaged, step)
    return step
  if damaged:
    raise CheckpointError(f"no checkpoint in {directory} verifies: "
                          + "; ".join(f"step {s}: {msg}" for s, msg in damaged)
                          + ". Restore them from a copy, or move them away to start afresh.")
  return None


def _move_aside(manager, damaged, good_step):
  corrupt_dir = manager.directory.parent / "checkpoints.corrupt"
  for step, msg in damaged:
    target = corrupt_dir / f"{step}-{int(time.time())}"
    print(f"checkpoint {step} is damaged ({msg}); moved to {target}; falling back to step "
          f"{good_step}", file=sys.stderr, flush=True)
    if jax.process_index() == 0:
      corrupt_dir.mkdir(parents=True, exist_ok=True)
      (manager.directory / str(step)).rename(target)
  sync_hosts("move_aside")
  manager.reload()


def sync_hosts(tag):
  """A barrier across the hosts of a pod (nothing on one host); every host must call it.

  The coordination service's barrier (distributed.meet), not a device collective
  (multihost_utils.sync_global_devices): a host 30 s late to a collective's first run kills a
  CPU pod, and a barrier waits 30 min and names a host that never comes.
  """
  from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top
  distributed.meet(f"checkpoint {tag}")


# ----------------------------------------------------------------------------------------------
# Params-only exports (conversion output, init_checkpoint input).
# ----------------------------------------------------------------------------------------------
CONFIG_NAME = "bert_config.json"


def save_params(path, params, model_config, meta=None):
  """Writes params + bert_config.json + manifest to `path` atomically (a temp dir renamed).

  On object stores (gs://) a rename is not atomic: there the config is written first, the params
  next and the manifest last, and Orbax commits the params directory only when it is complete,
  so a crashed export has no `params/` and `load_params` refuses it.

  On a pod every host calls it with the same (possibly sharded) params: Orbax writes each host's
  shards, process 0 alone writes the config and the manifest and renames. The params are never
  gathered on one host (an FSDP-sharded jax.Array cannot be: np.asarray raises), and
  `load_params` reads them back as numpy whatever the sharding they were saved with.
  """
  path = str(path)
  sync_hosts("save_params.begin")  # a caller's clean-up on process 0 is done everywhere
  exists = epath.Path(path).exists()
  sync_hosts("save_params.checked")  # every host has looked before process 0 writes
  if exists:
    raise CheckpointError(f"{path}: output already exists; choose a new path or delete it.")
  local = "://" not in path
  # The same temp name on every host (a random one would differ per host); a leftover of a
  # crashed export is removed first.
  target = f"{path}.tmp-export" if local else path
  if jax.process_index() == 0:
    if local and os.path.exists(target):
      shutil.rmtree(target)
    epath.Path(target).mkdir(parents=True)
    info = {"bert_config": model_config.to_dict(), **(meta or {})}
    (epath.Path(target) / CONFIG_NAME).write_text(json.dumps(info, indent=2, sort_keys=True))
  sync_hosts("save_params.started")
  _one_writer_per_array_on_one_host()
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(absolute(target) / "params", params)
    ckptr.wait_until_finished()
  sync_hosts("save_params.written")
  if jax.process_index() == 0:
    manifest_lib.write_manifest(target)
    if local:
      os.rename(target, path)
  sync_hosts("save_params.done")
  return path


def absolute(path):
  """`path` as an absolute epath for Orbax. A gs:// path is already absolute: epath's own
  absolute() would prepend the working directory to it ('/cwd/gs:/bucket/...', a local path)."""
  p = epath.Path(path)
  return p if "://" in str(path) else p.absolute()


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
  if not p.is_dir():   # was a NotADirectoryError traceback from listing it (issue 49 item 7)
    raise CheckpointError(f"init_checkpoint={path}: is a file, not a checkpoint directory; give "
                          "a params export (python -m bert_jax.convert output), a workdir or a "
                          "step directory.")
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


# A training step's meta: the JSON file Orbax's JsonSave writes inside the step's "meta" item
# (the one place that knows the path).
META_ITEM, META_FILE = "meta", "metadata"


def step_meta_file(step_dir):
  return epath.Path(step_dir) / META_ITEM / META_FILE


def read_step_meta(step_dir):
  """A training step's meta dict, read without a CheckpointManager."""
  f = step_meta_file(step_dir)
  if f.exists():
    return json.loads(f.read_text())
  return ocp.Checkpointer(ocp.JsonCheckpointHandler()).restore(epath.Path(step_dir) / META_ITEM)


@dataclasses.dataclass(frozen=True)
class Described:
  """What is at a checkpoint path (describe); no array read."""
  path: str                    # as the caller gave it (for messages)
  kind: str                    # "params" (an export) or "train" (one training step)
  directory: epath.Path        # the export or step directory itself
  config: model_lib.BertConfig
  meta: dict                   # export: bert_config.json less bert_config; step: its meta, with
                               # the top-level do_lower_case of its training config (with_casing)
  verified: bool = False       # its files were checked against the manifest (describe(verify=))

  @property
  def step(self):
    """The training step of a "train" directory; an export's recorded step, if any."""
    if self.kind == "train":
      return int(self.directory.name)
    return self.meta.get("step")

  @property
  def params_item(self):
    """The Orbax item that holds the parameters (absolute: Orbax needs it)."""
    return absolute(self.directory) / ("params" if self.kind == "params" else "state")

  @property
  def params_prefix(self):
    """Where the parameters sit in that item: () in an export, ("params",) in a train state."""
    return () if self.kind == "params" else ("params",)


def _best_epoch_export(path):
  """A finished fine-tuning workdir keeps only its best_epoch{N}/ export (resume state removed):
  that export, or None."""
  p = epath.Path(path)
  exports = sorted((d for d in p.glob("best_epoch*") if (d / CONFIG_NAME).exists()), key=str)
  if len(exports) == 1:
    return exports[0]
  if len(exports) > 1 and (p / "eval_results.json").exists():
    best = json.loads((p / "eval_results.json").read_text()).get("best_epoch")
    named = [d for d in exports if d.name == f"best_epoch{best}"]
    if named:
      return named[0]
  return None


def describe(path, *, verify=True) -> Described:
  """Kind, directory, BertConfig and meta of any accepted checkpoint path (resolve_checkpoint, or a
  finished fine-tuning workdir's best export); reads bert_config.json or the step's meta, no array.

  verify: check every file against the manifest first (verify_for_load), so a damaged file is one
  line naming it before anything is read; False for a caller that will not read the arrays.
  """
  try:
    kind, p = resolve_checkpoint(path)
  except CheckpointError:
    best = _best_epoch_export(path) if epath.Path(path).exists() else None
    if best is None:
      raise
    kind, p = "params", best
  if verify:
    verify_for_load(kind, p)
  if kind == "params":
    meta = json.loads((p / CONFIG_NAME).read_text())
    config = model_lib.BertConfig.from_dict(meta.pop("bert_config"))
  else:
    meta = with_casing(read_step_meta(p))
    config = model_lib.BertConfig.from_dict(meta["model_config"])
  return Described(str(path), kind, p, config, meta, verified=verify)


# The encoder's architecture: what a checkpoint's parameters were trained as. A run that starts
# from a checkpoint takes all of these from it (the activation too: a converted google checkpoint
# is gelu_tanh, and the erf default silently changed its function, issue 23 point 9).
ENCODER_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "hidden_act", "layer_norm_eps",
                  "embedding_size", "share_layers")


def config_from_checkpoint(stored, overrides, what):
  """The BertConfig of a run starting from a checkpoint whose config is `stored`: the encoder
  (ENCODER_FIELDS) is the checkpoint's, `overrides` set the rest (dropout, dtype, remat,
  attention kernel, heads). An override of an encoder field that differs from the checkpoint's
  is a one-line CheckpointError naming both values; fine-tuning and pre-training both call it."""
  stored_d = stored.to_dict()
  clash = {k: (stored_d.get(k), v) for k, v in overrides.items()
           if k in ENCODER_FIELDS and v != stored_d.get(k)}
  if clash:
    raise CheckpointError(
        f"{what} was trained with " + ", ".join(f"{k}={a!r}" for k, (a, _) in clash.items())
        + " but the config sets " + ", ".join(f"{k}={b!r}" for k, (_, b) in clash.items())
        + "; drop the override (the architecture comes from the checkpoint) or start from "
        "another checkpoint.")
  return model_lib.BertConfig.from_dict({**stored_d, **overrides})   # the family's record


def verify_for_load(kind, p):
  """Verifies what load_params is about to read: one-line error if damaged, warning if old."""
  claims = _claims_manifest(p) if kind == "train" else False
  try:
    status, _, _ = verify_dir(p, claims)
  except ManifestError as e:
    raise CheckpointError(str(e)) from None
  if status == "unverified":
    logging.warning("%s has no manifest (written before manifests existed): loaded unverified",
                    p)


def with_casing(meta):
  """A step's meta with the top-level do_lower_case of its (nested) training config."""
  if meta.get("do_lower_case") is None and isinstance(meta.get("config"), dict):
    meta = dict(meta, do_lower_case=meta["config"].get("do_lower_case"))
  return meta


def load_params(path):
  """Loads (params as numpy, BertConfig, meta dict) from any accepted layout (describe).

  The files are checked against the manifest first. For a pre-training step, meta gains the
  top-level `do_lower_case` of its config (a pre-training meta nests it under "config"), so
  callers check casing in one place for every layout.
  """
  d = describe(path)
  return read_params(d), d.config, d.meta


def read_params(d: Described):
  """The parameters of a described checkpoint as numpy (verified first if describe did not)."""
  if not d.verified:
    verify_for_load(d.kind, d.directory)
  with ocp.StandardCheckpointer() as ckptr:
    tree = _restore_numpy(ckptr, d.params_item, only=d.params_prefix[0] if d.params_prefix
                          else None)
  for key in d.params_prefix:
    tree = tree[key]
  return tree


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


# ----------------------------------------------------------------------------------------------
# CLI: python -m bert_jax.checkpoint verify DIR (checkpoint/__main__.py runs verify_main)
# ----------------------------------------------------------------------------------------------
def _dirs_to_verify(path):
  """[(label, dir, claims_manifest)] for a workdir, its checkpoints/, one step, or an export."""
  p = epath.Path(path)
  if not p.exists():
    raise CheckpointError(f"{path}: no such directory.")
  if (p / CONFIG_NAME).exists() or ((p / "state").exists() and (p / "meta").exists()):
    return [(str(p), p, _claims_manifest(p) if (p / "state").exists() else False)]
  root = p / "checkpoints" if (p / "checkpoints").exists() else p
  steps = sorted(int(q.name) for q in root.iterdir() if q.name.isdigit())
  if not steps:
    raise CheckpointError(f"{path}: neither a workdir with checkpoints/<step>, a step directory, "
                          f"nor an export ({CONFIG_NAME} + params/).")
  return [(f"step {s}", root / str(s), _claims_manifest(root / str(s))) for s in steps]


VERIFY_USAGE = """\
usage: python -m bert_jax.checkpoint verify DIR   (or: bert-jax-verify DIR)

Checks every file of DIR against its manifest.sha256.json (size and SHA-256):
  DIR  a workdir (every kept step), its checkpoints/, one step directory, or a params export

Prints one line a step (ok, DAMAGED, or no manifest); exit code 2 when one is damaged."""

# What asks for the usage instead of naming a directory (absl's spellings).
HELP_ARGS = ("-h", "--help", "-help", "--helpfull", "--helpshort")


def verify_main(argv):
  if any(a in HELP_ARGS for a in argv[1:]):
    print(VERIFY_USAGE, flush=True)
    return
  if len(argv) != 3 or argv[1] != "verify":
    raise CheckpointError("usage: python -m bert_jax.checkpoint verify DIR (a workdir, its "
                          "checkpoints/, one step directory, or a params export).")
  bad = []
  for label, d, claims in _dirs_to_verify(argv[2]):
    t0 = time.time()
    try:
      status, n, size = verify_dir(d, claims)
    except ManifestError as e:
      bad.append(label)
      print(f"{label}: DAMAGED: {e}", flush=True)
      continue
    dt = time.time() - t0
    if status == "unverified":
      print(f"{label}: no manifest (written before manifests existed): not verified", flush=True)
    else:
      print(f"{label}: ok ({n} files, {size / 1e6:.1f} MB, {dt:.2f} s, "
            f"{size / 1e6 / max(dt, 1e-9):.0f} MB/s)", flush=True)
  if bad:
    raise CheckpointError(f"{len(bad)} damaged: {', '.join(bad)}; training falls back to the "
                          "newest step that verifies.")

