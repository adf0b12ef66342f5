"""MobileBERT's progressive knowledge transfer (Sun et al. 2020, arXiv 2004.02984, section 3.6) as a
schedule of bert_jax/objectives/layerwise.py's objective by optimizer step.

The transfer is cut into L stages, L the student's layers: in stage l (steps [e_l, e_l+1)) only
student layer l learns, against its teacher layer's feature map and attention (layerwise's
distill_hidden and distill_att / distill_att_kl with a one-hot weight over the layers), and every
other parameter gets a zero update. The embeddings and the heads take no part in the stages: in
the paper they are copied from the IB-BERT teacher (TF Model Garden's MobileBERT distillation:
if_copy_embeddings), so a fresh progressive run copies every embedding and head parameter of the
teacher's that fits the student's (name and shape; `copy_from_teacher`) and keeps them frozen
until the stages end. After the L stages, if the run has steps left (steps_per_stage x L <
num_train_steps), every parameter trains on the whole objective as configured: the paper's
further pre-training distillation phase, with our layer-wise parts' weights (set alpha_pred /
alpha_mlm for its MLM distillation and MLM loss).

  python -m bert_jax.train --config=bert_jax/configs/pretrain.py:mobilebert-tiny \
      --config.teacher_checkpoint=IB_BERT --config.progressive_stages=2 \
      --config.steps_per_stage=100 --config.num_train_steps=300 ...

Frozen means no update at all: the optimizer's updates (and its gradients, so Adam's moments and
the clipping norm see the trained layer only) are multiplied by the stage's mask inside the
jitted step (`Stages.wrap`), so AdamW's weight decay cannot move a frozen parameter either. The
stage is a pure function of the step (the loss reads the step from the batch, the optimizer from
its own count, which the checkpoint keeps with the step), so one compiled step serves every stage
and a resumed run continues exactly where it stopped. Each stage's step runs the whole network
and teacher (the layers above l compute and are not read): simpler than a program per stage, at
the cost of a full step's FLOPs in every stage.
"""

import re
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import traverse_util

from bert_jax.training import trainer_lib

ConfigError = trainer_lib.ConfigError
ALWAYS = -2   # trained in every stage: layerwise's fit_dense projection
OUTSIDE = -1  # outside the layers (embeddings, pooler, heads): frozen until the stages end
_LAYER = re.compile(r"layer_(\d+)")


def fields(c):
  """The schedule's config fields (MobileBERT's recipe adds them; the shared record has none)."""
  # 0: every layer at once (the joint transfer); L = the student's layers: stage l trains layer l
  # alone, the rest frozen (the paper's progressive transfer). One stage a layer: a count that
  # is not the student's depth is an error.
  c.progressive_stages = 0
  # Steps of each stage. 0: equal shares of num_train_steps (stage l: steps l x N // L to
  # (l + 1) x N // L - 1), no final phase; S > 0: L x S steps of stages, then the rest of the run
  # trains every layer on the whole objective (the paper's pre-training distillation phase).
  c.steps_per_stage = 0


def bounds(config, num_layers):
  """(e_0 = 0, e_1, ..., e_L): stage l is steps [e_l, e_l+1), every layer from e_L; or None when
  progressive_stages is 0. One-line ConfigError naming the field for a schedule that cannot run."""
  n = config.get("progressive_stages", 0)
  if not isinstance(n, int) or isinstance(n, bool) or n < 0:
    raise ConfigError(f"config.progressive_stages={n!r}: expected 0 (every layer at once) or the "
                      f"student's {num_layers} layers (one stage a layer).")
  if n == 0:
    return None
  if n != num_layers:
    raise ConfigError(f"config.progressive_stages={n} but the student has {num_layers} layers: "
                      f"the progressive transfer trains one layer a stage; set "
                      f"--config.progressive_stages={num_layers} (or 0: every layer at once).")
  total, per = int(config.num_train_steps), config.get("steps_per_stage", 0)
  if not isinstance(per, int) or isinstance(per, bool) or per < 0:
    raise ConfigError(f"config.steps_per_stage={per!r}: expected the steps of each stage (> 0), "
                      "or 0 for equal shares of config.num_train_steps.")
  if per == 0:
    if total < n:
      raise ConfigError(f"config.num_train_steps={total} in equal shares over {n} stages (config."
                        f"steps_per_stage=0) leaves a stage no step; set --config.num_train_steps"
                        f"={n} or more.")
    return tuple(l * total // n for l in range(n + 1))
  if per * n > total:
    raise ConfigError(f"config.steps_per_stage={per} x {n} stages = {per * n} steps but config."
                      f"num_train_steps={total}: the last stages would never run; set --config."
                      f"steps_per_stage={max(total // n, 1)} or less, or --config.num_train_steps="
                      f"{per * n} or more.")
  return tuple(l * per for l in range(n + 1))


def check(config, model_config, teacher_given=True):
  """The schedule against the student and the objective, before compute (a one-line ConfigError):
  a teacher, the stage count and steps, a part the stages train."""
  b = bounds(config, model_config.num_layers)
  if b is None:
    return
  if not teacher_given:
    raise ConfigError(f"config.progressive_stages={config.progressive_stages}: the progressive "
                      "transfer trains each layer against a teacher's; give --config."
                      "teacher_checkpoint=TEACHER, or --config.progressive_stages=0.")
  if not any(config.get(k, 0.0) for k in ("alpha_hidden", "alpha_att", "alpha_att_kl")):
    raise ConfigError(f"config.progressive_stages={config.progressive_stages} with config."
                      "alpha_hidden, alpha_att and alpha_att_kl all 0: a stage trains its layer "
                      "on those parts only; give one a positive weight.")


def with_stages(record, config, model_config):
  """The teacher's checkpoint record plus the run's stage bounds ("progressive_bounds"), when
  progressive: what check_resume compares."""
  b = bounds(config, model_config.num_layers)
  return record if b is None else dict(record, progressive_bounds=list(b))


def check_resume(meta, teacher, workdir):
  """A resumed run keeps its stages: the bounds its checkpoint recorded with the teacher and
  this run's (equal shares move with num_train_steps; steps_per_stage keeps them), else a
  one-line ConfigError naming both."""
  was = (meta.get("teacher") or {}).get("progressive_bounds")
  now = (teacher.record if teacher else {}).get("progressive_bounds")
  if was == now:
    return
  def side(b):
    return (f"stages starting at steps {', '.join(map(str, b[:-1]))} (every layer from step "
            f"{b[-1]})" if b else "no progressive stages")
  fix = ""
  if was and len({b - a for a, b in zip(was, was[1:])}) == 1:
    fix = f" (--config.steps_per_stage={was[1]} keeps them when num_train_steps grows)"
  raise ConfigError(f"--workdir={workdir} was trained with {side(was)} but this run gives "
                    f"{side(now)}; resume with the same --config.progressive_stages, "
                    f"steps_per_stage and num_train_steps{fix}, or use a new --workdir.")


def layer_of(path):
  """The stage that trains the parameter at `path` (names): i for bert/.../layer_i/..., ALWAYS for
  fit_dense, OUTSIDE for the rest."""
  names = [str(getattr(k, "key", k)) for k in path]
  if names and names[0] == "fit_dense":
    return ALWAYS
  if names and names[0] == "bert":
    for n in names[1:]:
      m = _LAYER.fullmatch(n)
      if m:
        return int(m.group(1))
  return OUTSIDE


class ProgressiveState(NamedTuple):
  count: jax.Array          # optimizer steps taken: the step the next update makes
  inner: optax.OptState


class Stages(NamedTuple):
  """The schedule: bounds[l] the first step of stage l, bounds[L] the first of the final phase."""
  bounds: tuple
  num_layers: int

  def stage(self, step):
    """Stage l (0..L-1) of `step`, a traced integer; L after the stages."""
    return jnp.sum(step >= jnp.asarray(self.bounds[1:], jnp.int32))

  def weights(self, step):
    """(weights [L] of the layers' parts, 1 in the final phase else 0): one-hot at the stage's
    layer in a stage, all ones after."""
    stage = self.stage(step)
    every = (stage == self.num_layers).astype(jnp.float32)
    layers = jnp.arange(self.num_layers) == stage
    return jnp.maximum(layers.astype(jnp.float32), every), every

  def keep(self, step, tree):
    """Per leaf of `tree` (params-shaped): True when the stage of `step` trains it."""
    stage = self.stage(step)
    final = stage == self.num_layers

    def one(path, _):
      layer = layer_of(path)
      return final | (layer == ALWAYS) | (stage == layer)
    return jax.tree_util.tree_map_with_path(one, tree)

  def wrap(self, tx):
    """tx whose gradients and updates are zero for the parameters the current stage freezes."""
    def init(params):
      return ProgressiveState(jnp.zeros([], jnp.int32), tx.init(params))

    def update(updates, state, params=None):
      keep = self.keep(state.count, updates)
      mask = lambda u, k: jnp.where(k, u, jnp.zeros_like(u))  # noqa: E731
      new, inner = tx.update(jax.tree.map(mask, updates, keep), state.inner, params)
      return jax.tree.map(mask, new, keep), ProgressiveState(state.count + 1, inner)
    return optax.GradientTransformation(init, update)


def describe(stages, teacher_layers, num_train_steps):
  """The start-up lines: stage by stage, its steps and layer, then the final phase."""
  b, n = stages.bounds, stages.num_layers
  out = [f"progressive knowledge transfer (Sun et al. 2020): {n} stages, one layer each (the "
         "rest frozen, the embeddings and heads as copied from the teacher)"]
  for l in range(n):
    out.append(f"  stage {l + 1}: steps {b[l]}-{b[l + 1] - 1}: student layer {l + 1} (layer_{l}) "
               f"against teacher layer {teacher_layers[l]}")
  if b[n] < num_train_steps:
    out.append(f"  then steps {b[n]}-{num_train_steps - 1}: every layer, the whole objective "
               "(pre-training distillation)")
  return out


def stages(config, model_config, teacher_layers):
  """The run's Stages (its schedule printed on the first host), or None: every layer at once."""
  check(config, model_config)
  b = bounds(config, model_config.num_layers)
  if b is None:
    return None
  s = Stages(b, model_config.num_layers)
  if jax.process_index() == 0:
    print("\n".join(describe(s, teacher_layers, int(config.num_train_steps))), flush=True)
  return s


def copy_from_teacher(state, steps, teacher, bounds=None, num_train_steps=None):
  """state with every parameter outside the layers (embeddings, pooler, heads) set to the
  teacher's of the same name and shape (the paper copies the embeddings and the classifier from
  its IB-BERT teacher); the rest keeps its initialisation. The teacher's body comes from the
  step's frozen parameters, its heads from its checkpoint. bounds, num_train_steps: the
  schedule; steps after the stages train what they freeze, and without them a parameter that
  kept its initialisation (a teacher that is not an IB-BERT: a BERT's embeddings have other
  names and widths) is never trained, which a note says with the field that gives it steps."""
  params = traverse_util.flatten_dict(state["params"])
  teacher_params = dict(steps.frozen)
  for key in ("mlm_head", "nsp_head"):   # not in the frozen teacher: read when they fit
    stored = trainer_lib.stored_subtree(teacher.pretrained, key)
    if key in teacher_params or key not in state["params"] or stored is None:
      continue
    if _shapes(stored) == _shapes(steps.abstract_state["params"][key]):
      teacher_params[key] = trainer_lib.load_pretrained(
          state, steps, teacher.pretrained, (key,))["params"][key]
  source = traverse_util.flatten_dict(teacher_params)
  copied, kept = [], []
  for path, leaf in params.items():
    if layer_of(path) != OUTSIDE:
      continue
    src = source.get(path)
    if src is not None and src.shape == leaf.shape:
      # A copy (never the teacher's own buffer: the state is donated to the step).
      params[path] = jax.jit(jnp.copy, out_shardings=leaf.sharding)(src.astype(leaf.dtype))
      copied.append("/".join(path))
    else:
      kept.append("/".join(path))
  if jax.process_index() == 0:
    named = ", ".join(kept[:4]) + (", ..." if len(kept) > 4 else "")
    print(f"progressive transfer: {len(copied)} embedding and head parameters copied from the "
          f"teacher; {len(kept)} kept their initialisation{f' ({named})' if kept else ''}",
          flush=True)
    if kept and bounds is not None and bounds[-1] >= num_train_steps:
      n = len(bounds) - 1
      print(f"note: those {len(kept)} stay frozen at their initialisation for the whole run: "
            f"the {n} stages take all {num_train_steps} steps; give --config.steps_per_stage=S "
            f"with {n} x S < {num_train_steps} for a final phase that trains them (or a teacher "
            "they fit: an IB-BERT).", flush=True)
  return dict(state, params=traverse_util.unflatten_dict(params))


def _shapes(tree):
  return {jax.tree_util.keystr(k): tuple(v.shape)
          for k, v in jax.tree_util.tree_leaves_with_path(tree)}
