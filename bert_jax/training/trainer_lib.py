"""The plumbing that pre-training (train.py) and fine-tuning (finetune.py) share; not the loops.

  steps = trainer_lib.build_steps(model=model, forward=forward, loss_fn=loss_fn, eval_fn=eval_fn,
                                  dummy_batch=dummy, tx=tx, schedule=schedule, mesh=mesh,
                                  grad_accum_steps=k)
  with trainer_lib.mesh_rules(mesh):
    state = steps.init_state(jax.random.PRNGKey(seed))       # dict(step, params, opt_state, rng)
    state = trainer_lib.load_pretrained(state, steps, trainer_lib.read_pretrained(path), ...)
    state, metrics = steps.train_step(state, global_batch)  # ONE optimizer step, state donated

Here lives, once: the jitted and explicitly sharded train/eval steps built from a `forward` and a
loss (gradient accumulation as a `lax.scan` inside the step, one dropout-key rule, optionally a
frozen network evaluated inside them: DistilBERT's teacher, build_steps(frozen=)), loading
pre-trained parameters straight into their target shardings (no host copy, so it works when
parameters are sharded across hosts), the config-error class, the start-up checks every run
makes, and the throughput timer.
"""

import contextlib
import functools
import os
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.parallel import distributed
from bert_jax.layers import fp8 as fp8_lib
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax.training import guard
from bert_jax.models import model as model_lib
from bert_jax.parallel import sharding as sharding_lib


class ConfigError(errors.UserError):
  """A --config field, flag or input that the user must change; one line, names the field."""


# ----------------------------------------------------------------------------------------------
# Steps: one optimizer step = k micro-batches scanned inside the jitted function.
# ----------------------------------------------------------------------------------------------
def dropout_key(rng, step, micro_step):
  """THE dropout-key rule of both loops: a function of (run key, optimizer step, micro-batch).

  `rng` is the state's own key (split from the seed at init, never the parameter-init key).
  """
  return jax.random.fold_in(jax.random.fold_in(rng, step), micro_step)


def split_micro_batches(x, k, mesh):
  """[k*b, ...] -> [k, b, ...]; micro-batch j holds rows j, j+k, j+2k, ...

  Strided rather than contiguous: each device's slice of rows splits locally into k equal
  parts (b is a multiple of the data-parallel size), so no row moves between devices.
  """
  x = x.reshape(x.shape[0] // k, k, *x.shape[1:]).swapaxes(0, 1)           # [k, b, ...]
  return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, P(None, ("data", "fsdp"))))


def apply_gradients(state, grads, tx, fp8_scales=None):
  """One optax update of dict(step, params, opt_state, rng[, fp8]); the step counts optimizer
  steps. fp8_scales: the FP8 scales' next values (their "gradient"), which overwrite
  state["fp8"] and never reach the optimizer (bert_jax/layers/fp8.py; flax's OWG semantics)."""
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  new = dict(state, step=state["step"] + 1, opt_state=opt_state,
             params=optax.apply_updates(state["params"], updates))
  if fp8_scales is not None:
    new["fp8"] = fp8_scales
  return new


def with_frozen(batch, frozen_params, frozen_apply):
  """batch plus a frozen network's outputs on it (DistilBERT's teacher: bert_jax/families/distilbert/distil.py), or
  batch itself when the step has none. No gradient reaches them (stop_gradient in the apply, and
  the frozen parameters are an argument of the step, not in the state the gradient is of)."""
  if frozen_apply is None:
    return batch
  return {**batch, **frozen_apply(frozen_params, batch)}


def train_step(state, batch, frozen_params=None, *, model, forward, loss_fn, tx, schedule,
               grad_accum_steps, mesh, frozen_apply=None, grads_fn=None):
  """Forward + backward over k micro-batches, their mean gradient, one optimizer update.

  batch: the global batch of the step ([k*b, ...] leaves). loss_fn(outputs, batch) ->
  (scalar loss, metrics dict); metrics are averaged over the micro-batches. frozen_params /
  frozen_apply: a frozen network evaluated on each micro-batch first (with_frozen).
  grads_fn(apply, loss_fn, params, batch, rng) -> ((loss, metrics), grads): how a micro-batch's
  gradient is taken, apply(params, rows, rng) -> outputs being the model in training mode on
  any rows of it (the embedding task's GradCache: bert_jax/tasks/embedding.py); None: one
  jax.value_and_grad over the whole micro-batch. Not with FP8 scales (build_steps refuses).
  """
  k = grad_accum_steps

  # FP8 (bert_jax/layers/fp8.py): the scales go in beside the params and their gradient is their next
  # value (None when the model has no FP8 matmuls).
  scales = state.get("fp8")

  def grads_and_metrics(params, micro, j):
    if getattr(forward, "stages", None) is not None:
      # A staged objective (MobileBERT's progressive transfer: bert_jax/objectives/layerwise.py) reads the
      # optimizer step this update makes, a traced scalar: one compiled step for every stage.
      micro = dict(micro, step=state["step"])
    micro = with_frozen(micro, frozen_params, frozen_apply)
    rng = dropout_key(state["rng"], state["step"], j)

    if grads_fn is not None:
      def apply(p, rows, r):
        return model.apply({"params": p}, rows, False, method=forward, rngs={"dropout": r})
      (_, metrics), grads = grads_fn(apply, loss_fn, params, micro, rng)
      return grads, metrics, None

    def loss(p, f):
      outputs = model.apply(fp8_lib.variables(p, f), micro, False, method=forward,
                            rngs={"dropout": rng})
      return loss_fn(outputs, micro)
    (_, metrics), (grads, new_scales) = jax.value_and_grad(loss, argnums=(0, 1), has_aux=True)(
        params, scales)
    return grads, metrics, (None if scales is None else fp8_lib.from_max_grad(new_scales))

  if k == 1:
    grads, metrics, new_scales = grads_and_metrics(state["params"], batch, 0)
  else:
    micro = jax.tree.map(lambda x: split_micro_batches(x, k, mesh), batch)

    def body(carry, xs):
      total, prev_scales = carry
      j, mb = xs
      grads, metrics, next_scales = grads_and_metrics(state["params"], mb, j)
      # Gradients and metrics add up; the scales take the larger amax (fp8.combine).
      return (jax.tree.map(jnp.add, total, (grads, metrics)),
              fp8_lib.combine(prev_scales, next_scales)), None

    shapes = jax.eval_shape(lambda p, mb: grads_and_metrics(p, mb, 0)[:2], state["params"],
                            jax.tree.map(lambda x: x[0], micro))
    zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), shapes)
    lowest = None if scales is None else jax.tree.map(jnp.zeros_like, scales)   # amax >= 0
    (total, new_scales), _ = jax.lax.scan(body, (zeros, lowest), (jnp.arange(k), micro))
    grads, metrics = jax.tree.map(lambda t, s: (t / k).astype(s.dtype), total, shapes)
  metrics = dict(metrics, grad_norm=optax.tree.norm(grads),   # of the applied mean gradient
                 learning_rate=schedule(state["step"]))
  # The non-finite guard: a NaN/Inf loss, gradient or update leaves params and optimizer state
  # as they were, bit for bit, and metrics["skipped"] = 1 (guard.py; the loops count it).
  return guard.select(state, apply_gradients(state, grads, tx, new_scales), metrics)


def eval_step(params, batch, frozen_params=None, *, model, forward, eval_fn, frozen_apply=None):
  batch = with_frozen(batch, frozen_params, frozen_apply)
  return eval_fn(model.apply({"params": params}, batch, True, method=forward), batch)


class Frozen(NamedTuple):
  """A network evaluated inside the steps but never trained (DistilBERT's teacher): its
  parameters are loaded once (load_frozen), sharded by the logical-axis rules, and passed to the
  jitted steps as an argument: not in the state, the optimizer or the checkpoints."""
  apply: Callable            # (params, batch) -> {key: array} added to the batch
  params: Any                # sharded jax arrays
  shardings: Any


class Steps(NamedTuple):
  model: nn.Module
  tx: optax.GradientTransformation
  schedule: optax.Schedule
  abstract_state: dict       # ShapeDtypeStructs carrying their NamedShardings
  state_shardings: dict
  param_shardings: dict
  init_state: Callable       # rng -> sharded dict(step, params, opt_state, rng) (jitted)
  train_step: Callable       # (state, global batch) -> (state, metrics); state donated
  eval_step: Callable        # (params, global batch) -> eval_fn's outputs, replicated
  frozen: Any = None         # the Frozen network's parameters (bound into both steps) or None
  # accum -> a train step like train_step that scans `accum` micro-batches (a batch-size warmup:
  # one per step size, batch_warmup.py); each compiles on its first call.
  train_step_for: Callable = None


def build_steps(*, model, forward, loss_fn, eval_fn, dummy_batch, tx, schedule, mesh,
                grad_accum_steps=1, rules=sharding_lib.LOGICAL_AXIS_RULES,
                frozen: Frozen = None, grads_fn=None) -> Steps:
  """Jitted init/train/eval functions with explicit shardings from the parameters' logical axes.

  forward(module, batch, deterministic) -> outputs: the one place a loop calls its model, with
  the whole batch dict (so new batch features reach the model without touching this file).
  dummy_batch: a batch dict of the right shapes (batch 1) for model.init.
  frozen: a Frozen network; its parameters are the third argument of both jitted steps, which
  Steps binds (train_step(state, batch) as without one).
  grads_fn: train_step's way of taking a micro-batch's gradient (None: jax.value_and_grad).
  A forward with a `stages` attribute (not None) has a step-dependent objective: its batch
  carries the optimizer step as "step", and stages.wrap(tx) is the optimizer (it masks the
  updates of the parameters a stage does not train: bert_jax/objectives/layerwise.py's Stages).
  """
  stages = getattr(forward, "stages", None)
  if stages is not None:
    tx = stages.wrap(tx)
  def init_variables(rng):
    # Without rules, boxed initialisers skip their sharding constraint: flax's DenseGeneral
    # builds a [H, N*D] kernel and reshapes it to [H, N, D] only after the box applies its 3-axis
    # constraint. Placement comes from the jit out_shardings below instead.
    with nn.logical_axis_rules(()):
      return model.init({"params": rng, "dropout": rng}, dummy_batch, True, method=forward)

  def init_state(rng):
    params_rng, dropout_rng = jax.random.split(rng)
    with nn.logical_axis_rules(()):
      variables = init_variables(params_rng)
    params = nn.unbox(variables["params"])
    state = dict(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                 rng=dropout_rng)
    if fp8_lib.COLLECTION in variables:   # config.fp8: the FP8 scales (bert_jax/layers/fp8.py)
      state["fp8"] = variables[fp8_lib.COLLECTION]
    return state

  # Shapes only: an abstract key, so nothing runs on (or needs) a live device. The mesh may be a
  # compile-only TPU topology on a CPU host (bert_jax/plan.py).
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)   # the shape and dtype of jax.random.PRNGKey(0)
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    abstract_vars = jax.eval_shape(init_variables, key)
    param_shardings = sharding_lib.logical_to_sharding(
        nn.get_partition_spec(abstract_vars)["params"], mesh, rules)
    abstract_state = jax.eval_shape(init_state, key)
  state_shardings = sharding_lib.train_state_shardings(tx, abstract_state["opt_state"],
                                                       param_shardings, mesh)
  if "fp8" in abstract_state and grads_fn is not None:
    # GradCache's chunks would each give an amax "gradient", summed where fp8 takes the max.
    raise ConfigError("a task's own gradient function (GradCache: config.embedding."
                      "grad_cache_chunks) with FP8 matmuls (the model config's fp8=True): set "
                      "one of them off.")
  if "fp8" in abstract_state:   # scalars and 1024-step histories: replicated
    state_shardings["fp8"] = jax.tree.map(lambda _: sharding_lib.replicated(mesh),
                                          abstract_state["fp8"])
  abstract_state = jax.tree.map(
      lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract_state,
      state_shardings)
  batch_sharding, repl = sharding_lib.batch_sharding(mesh), sharding_lib.replicated(mesh)
  apply = dict(frozen_apply=frozen.apply) if frozen else {}
  extra = (frozen.shardings,) if frozen else ()
  def train_for(accum):
    step_fn = functools.partial(train_step, model=model, forward=forward, loss_fn=loss_fn, tx=tx,
                                schedule=schedule, grad_accum_steps=int(accum), mesh=mesh,
                                grads_fn=grads_fn, **apply)
    return jax.jit(step_fn, in_shardings=(state_shardings, batch_sharding, *extra),
                   out_shardings=(state_shardings, repl), donate_argnums=(0,))

  train = train_for(grad_accum_steps)
  evaluate = jax.jit(functools.partial(eval_step, model=model, forward=forward, eval_fn=eval_fn,
                                       **apply),
                     in_shardings=(param_shardings, batch_sharding, *extra), out_shardings=repl)
  return Steps(
      model=model, tx=tx, schedule=schedule, abstract_state=abstract_state,
      state_shardings=state_shardings, param_shardings=param_shardings,
      # On a pod, each step's first call compiles it and waits there for the other hosts: a
      # host that compiles slower must not leave the others in the step's first collective,
      # which waits only 30 s for it on CPU (distributed.TogetherOnFirstCall).
      init_state=distributed.TogetherOnFirstCall(
          jax.jit(init_state, out_shardings=state_shardings), "state init"),
      train_step=distributed.TogetherOnFirstCall(_bind(train, frozen), "train step"),
      eval_step=distributed.TogetherOnFirstCall(_bind(evaluate, frozen), "eval step"),
      frozen=frozen.params if frozen else None,
      train_step_for=lambda accum: distributed.TogetherOnFirstCall(
          _bind(train_for(accum), frozen), f"train step of {accum} micro-batches"))


def _bind(jitted, frozen):
  """jitted(a, b, frozen.params) called as f(a, b) (and f.lower(a, b)): the frozen parameters
  stay an argument of the compiled step, never a constant folded into it."""
  if frozen is None:
    return jitted
  bound = lambda *args: jitted(*args, frozen.params)  # noqa: E731
  bound.lower = lambda *args: jitted.lower(*args, frozen.params)
  return bound


@contextlib.contextmanager
def mesh_rules(mesh, rules=sharding_lib.LOGICAL_AXIS_RULES):
  """The context every step runs (and is traced) in: the mesh and the logical-axis rules."""
  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    yield


def create_mesh(mesh_shape, *batch_sizes, grad_accum_steps=1, devices=None):
  """The device mesh, after checking that every global batch size splits over it and the hosts.

  devices: default jax.devices(); a compile-only TPU topology's devices for bert_jax/plan.py.
  """
  mesh = sharding_lib.create_mesh(mesh_shape, devices)
  for b in batch_sizes:
    sharding_lib.check_batch_size(b, mesh, grad_accum_steps)
  return mesh


# ----------------------------------------------------------------------------------------------
# Pre-trained parameters: read shapes first, then restore straight into the target shardings.
# ----------------------------------------------------------------------------------------------
class Pretrained(NamedTuple):
  path: str                  # as the user gave it (for messages)
  model_config: model_lib.BertConfig
  meta: dict                 # bert_config.json's provenance or the training checkpoint's meta
  params_meta: Any           # the stored params tree: leaves have .shape and .dtype, no data
  item_dir: Any              # epath of the Orbax item that holds the params
  prefix: tuple              # where params sit in that item: () export, ("params",) train state


def check_resume_fp8(manager, step, abstract_state, workdir):
  """Resuming with config.model.fp8 switched: a one-line ConfigError naming both ways on, not
  Orbax's tree diff. The FP8 scales are part of the train state (bert_jax/layers/fp8.py)."""
  stored = "fp8" in _tree_metadata(manager.directory / str(step) / "state")
  wanted = "fp8" in abstract_state
  if stored != wanted:
    raise ConfigError(
        f"config.model.fp8={wanted}: the checkpoint of step {step} in {workdir} was written "
        f"{'without' if wanted else 'with'} FP8 scales; resume it with --config.model.fp8="
        f"{not wanted}, or start a new workdir from it with --config.init_checkpoint={workdir} "
        "(the parameters carry over; FP8 scales start fresh).")


def _tree_metadata(item_dir):
  with ocp.StandardCheckpointer() as ckptr:
    metadata = ckptr.metadata(item_dir)
  tree = getattr(metadata, "item_metadata", metadata)
  return getattr(tree, "tree", tree)


def read_pretrained(path) -> Pretrained:
  """Config, provenance and parameter shapes of any accepted checkpoint layout, verified against its
  manifest; reads no array. `path` may be what checkpoint.describe already found (not read twice).
  """
  d = path if isinstance(path, ckpt_lib.Described) else ckpt_lib.describe(path)
  if not d.verified:
    ckpt_lib.verify_for_load(d.kind, d.directory)
  tree = _tree_metadata(d.params_item)
  for key in d.params_prefix:
    tree = tree[key]
  return Pretrained(d.path, d.config, d.meta, dict(tree), d.params_item, d.params_prefix)


def stored_subtree(pre: Pretrained, key):
  """The stored parameters for target top-level `key`, or None. A bare BertModel export (top-level
  'embeddings') serves as 'bert'."""
  if key in pre.params_meta:
    return pre.params_meta[key]
  if key == "bert" and "embeddings" in pre.params_meta:
    return pre.params_meta
  return None


def load_pretrained(state, steps: Steps, pre: Pretrained, keys, *, required=()):
  """state with params[k] (k in keys) restored from `pre` into their shardings; the rest (other
  heads, optimizer state, step, rng) untouched. A key missing from the checkpoint keeps its
  fresh initialisation unless it is `required` (ConfigError). Shapes are checked first (one
  line naming the parameter) and arrays go from storage to their devices: no host copy."""
  abstract = steps.abstract_state["params"]
  found = {}
  for k in keys:
    stored = stored_subtree(pre, k)
    if stored is None:
      if k in required:
        raise ConfigError(f"init_checkpoint={pre.path} has no '{k}' parameters (top-level keys "
                          f"{sorted(pre.params_meta)}); point it at a checkpoint of this model.")
      continue
    ckpt_lib.check_params_match(stored, abstract[k], f"init_checkpoint={pre.path}")
    found[k] = stored
  if not found:
    return state
  bare = "bert" in found and found["bert"] is pre.params_meta
  restored = _restore(pre, abstract["bert"] if bare else {k: abstract[k] for k in found})
  restored = {"bert": restored} if bare else restored
  return dict(state, params={**state["params"], **restored})


def _restore(pre: Pretrained, item):
  """The arrays of `pre` at the abstract tree `item` (ShapeDtypeStructs with shardings), each
  restored straight into its sharding; keys of the checkpoint not in `item` are not read."""
  for key in reversed(pre.prefix):
    item = {key: item}
  with ocp.PyTreeCheckpointer() as ckptr:
    restored = ckptr.restore(pre.item_dir, args=ocp.args.PyTreeRestore(
        item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
        partial_restore=True))
  for key in pre.prefix:
    restored = restored[key]
  return restored


def load_frozen(pre: Pretrained, model, forward, dummy_batch, keys, mesh, apply,
                rules=sharding_lib.LOGICAL_AXIS_RULES) -> Frozen:
  """A Frozen network: `model`'s parameters `keys` read from `pre` once, each straight into the
  sharding its logical axes give under `rules` (as the trained model's), shapes checked first.
  pre=None: shapes only (ShapeDtypeStructs with those shardings), nothing read: bert_jax.plan
  compiles the step for a TPU slice's compile-only devices, where no array can live."""
  key = jax.ShapeDtypeStruct((2,), jnp.uint32)

  def init(rng):
    with nn.logical_axis_rules(()):   # as build_steps' init_variables
      return model.init({"params": rng}, dummy_batch, True, method=forward)["params"]

  with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
    boxed = jax.eval_shape(init, key)
    shardings = sharding_lib.logical_to_sharding(nn.get_partition_spec(boxed), mesh, rules)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          nn.unbox(boxed), shardings)
  abstract, shardings = ({k: abstract[k] for k in keys}, {k: shardings[k] for k in keys})
  if pre is None:
    return Frozen(apply, abstract, shardings)
  for k in keys:
    stored = stored_subtree(pre, k)
    if stored is None:
      raise ConfigError(f"{pre.path} has no '{k}' parameters (top-level keys "
                        f"{sorted(pre.params_meta)}); point it at a checkpoint of this model.")
    ckpt_lib.check_params_match(stored, abstract[k], str(pre.path))
  return Frozen(apply, _restore(pre, abstract), shardings)


# ----------------------------------------------------------------------------------------------
# Start-up checks every run makes.
# ----------------------------------------------------------------------------------------------
def check_workdir(workdir):
  """A usable --workdir: local ones are created and probed for writing (gs:// on first save)."""
  if not workdir:
    raise ConfigError("--workdir is empty: pass a directory for checkpoints and logs.")
  if "://" in workdir:
    return
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_probe_{os.getpid()}")
    with open(probe, "w") as f:
      f.write("ok")
    os.remove(probe)
  except OSError as e:
    raise ConfigError(f"--workdir={workdir}: not writable ({e.strerror}); choose a directory "
                      "you can write to.") from e


def quiet_logging():
  """Orbax and TF log every save at INFO: keep the console to our progress lines unless the user
  asked for more with --verbosity."""
  from absl import flags, logging  # pylint: disable=g-import-not-at-top
  if "verbosity" in flags.FLAGS and not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)


def file_hash(path):
  """The full sha256 of a (local or gs://) file; '' for none (compare with files_lib.same_sha256: a
  checkpoint before 2026-11-25 recorded a 16-character prefix)."""
  if not path or path == "synthetic":
    return ""
  return files_lib.sha256_file(path)


def check_same_on_all_hosts(config, vocab_path, vocab_size):
  """Every host must run the same config on the same vocabulary: a mismatch is an error on all
  hosts at start-up, not a hang in the first collective. Returns the vocab file's hash."""
  distributed.assert_same_on_all_hosts("config", config.to_json_best_effort(sort_keys=True))
  vocab_hash = file_hash(vocab_path)
  distributed.assert_same_on_all_hosts("vocab", vocab_hash or str(vocab_size))
  return vocab_hash


def check_max_length(seq_length, field, model_config):
  if seq_length > model_config.max_position_embeddings:
    raise ConfigError(f"config.{field}={seq_length} exceeds the model's "
                      f"max_position_embeddings={model_config.max_position_embeddings}.")


# ----------------------------------------------------------------------------------------------
# What both loops log, computed the same way: the metrics' means and the throughput.
# ----------------------------------------------------------------------------------------------
def mean_of_applied(host_metrics):
  """{metric: mean} over the steps since the last log ([{metric: host value}], one per step):
  steps skipped for NaN/Inf (guard.py) are left out, or all kept when every step was skipped;
  the `skipped` flag itself is dropped (guard.SkipTracker counts it)."""
  applied = [m for m in host_metrics if not m["skipped"]] or host_metrics
  return {k: float(np.mean([m[k] for m in applied])) for k in host_metrics[0] if k != "skipped"}


class StepTimer:
  """Optimizer steps per second between reports, excluding compilation and paused time.

  The first step of every run (a fresh start or a resume alike) compiles: the clock starts
  when it has finished, so it is never counted. `with timer.paused():` excludes evaluation and
  checkpoint saves. Call `step_done(metrics)` after each step, `rate()` when logging (after the
  metrics were fetched, so the device work is finished).
  """

  def __init__(self):
    self._t0, self._steps, self._paused = None, 0, 0.0

  def step_done(self, metrics, timed=True):
    """timed=False: a step whose time was excluded (a batch-size warmup's new size, compiled
    and run under paused()): not counted either."""
    if self._t0 is None:
      jax.block_until_ready(metrics)
      self._t0 = time.perf_counter()
    elif timed:
      self._steps += 1

  @contextlib.contextmanager
  def paused(self):
    t = time.perf_counter()
    try:
      yield
    finally:
      self._paused += time.perf_counter() - t

  def rate(self):
    """Steps per second since the last call (None when no step was timed yet); resets."""
    if self._t0 is None:
      return None
    now = time.perf_counter()
    dt, steps = now - self._t0 - self._paused, self._steps
    self._t0, self._steps, self._paused = now, 0, 0.0
    return steps / dt if steps and dt > 0 else None
