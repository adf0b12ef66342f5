"""Layer-wise distillation (TinyBERT, Jiao et al. 2019, arXiv 1909.10351): a student matches a
frozen teacher layer by layer, the teacher run in the same sharded step
(trainer_lib.build_steps(frozen=)). The one distillation objective of pre-training: a family
plugs in this module's hooks (load_teacher, step_parts, ...) and sets the weights; TinyBERT
(bert_jax/families/tinybert/__init__.py) and MobileBERT's transfer take its layer parts, DistilBERT
(families/distilbert/distil.py; the teacher's checks and the student's init are
bert_jax/objectives/teacher.py's) the
prediction layer's KL, the last hidden states' cosine and MLM.

Student layer m (1..M) learns from teacher layer g(m) (1..N); g is TinyBERT's uniform map
g(m) = m x N / M (their code: layers_per_block = N // M) unless --config.layer_map=g(1),...,g(M)
gives any other. Hidden state 0 (the embedding output) is matched to the teacher's 0.

  part            what                                               config weight (TinyBERT)
  distill_emb     MSE(E_s W_h, E_t), the embedding outputs           alpha_emb   1
  distill_hidden  sum over m of MSE(H_s^m W_h, H_t^g(m))             alpha_hidden 1
  distill_att     sum over m of MSE(A_s^m, A_t^g(m)), the pre-softmax alpha_att   1
                  scores [B, N, T, S] of every head; masked keys and padding queries excluded
  distill_att_kl  sum over m of KL(softmax A_t^g(m) || softmax A_s^m)  alpha_att_kl 0
                  per head and real query over its real keys, the mean over the real queries
                  and heads (MobileBERT's attention transfer, L_AT: `attention_kl`)
  distill_pred    soft cross-entropy -sum softmax(z_t/T) log softmax(z_s/T) over the masked
                  positions' MLM logits, temperature T (config.temperature)   alpha_pred  0
  distill_ce      KL(softmax(z_t/T) || softmax(z_s/T)) x T^2, the same  alpha_ce    0 (DistilBERT 5)
                  logits (Hinton et al.'s form, HF's DistilBERT; objectives.soft_cross_entropy:
                  KL = distill_pred's cross-entropy - the teacher's entropy, times T^2)
  distill_cos     1 - cos(student, teacher) of the last hidden states  alpha_cos   0 (DistilBERT 1)
                  (the student's through W_h), mean over real tokens
  mlm             the student's own MLM cross-entropy                 alpha_mlm   0 (DistilBERT 2)

DistilBERT (Sanh et al. 2019) is the weight setting alpha_ce 5, alpha_mlm 2, alpha_cos 1 at T = 2
(HF's research_projects/distillation train.py), the layer parts 0; its student starts from every
other teacher layer (teacher.init_student; --config.teacher_layers, 0-based), and that copy map,
1-based, is its layer map unless --config.layer_map gives one.

TinyBERT's general distillation is the first three (their general_distill.py); the prediction
layer is task distillation's. W_h (`fit_dense`, TinyBERT's name) is a learned [H_s, F] dense,
F = config.fit_size = the teacher's width, trained with the student; 0 = none (same widths).
MSE is a mean over the real tokens' (or real query-key pairs') elements, not TinyBERT's mean over
the padded tensor, so the padding of a batch does not dilute it; TinyBERT zeroes the masked
scores (-10000 after its additive mask) in both, which excludes them from the sum only.

Attention scores: the model is applied with the `attention_scores` collection mutable (model.py's
SelfAttention then runs the xla path and sows them); a fused kernel never makes them, so with
alpha_att or alpha_att_kl > 0 a step that would run one (requested, or auto's choice on this
chip) is refused at start-up, naming it (`check_kernels`). With both 0 nothing is asked and any
kernel runs.

MobileBERT's progressive transfer (bert_jax/objectives/progressive.py) is a schedule of these parts by step:
stage l weighs layer l's hidden and attention parts alone and trains layer l alone.

Bad input, one line and exit 2 before compute: a layer map outside the teacher's depth, a student
whose width differs from the teacher's without --config.fit_size (or with another), a teacher of
another vocabulary (size, or content as teacher.check_teacher_vocab), heads that differ with
alpha_att or alpha_att_kl > 0, a progressive schedule that cannot run (progressive.check).
"""

import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from flax import traverse_util

from bert_jax.layers import attention as attention_lib
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.objectives import teacher as teacher_lib
from bert_jax import families
from bert_jax.models import model as model_lib
from bert_jax.objectives import pretraining as objectives
from bert_jax.objectives import progressive
from bert_jax.training import trainer_lib
from bert_jax.models.pretraining_heads import MaskedLMHead

ConfigError = trainer_lib.ConfigError
WEIGHTS = ("alpha_emb", "alpha_hidden", "alpha_att", "alpha_att_kl", "alpha_pred", "alpha_ce",
           "alpha_cos", "alpha_mlm")
DISTILLED = WEIGHTS[:-1]   # the parts that read the teacher: one must be > 0
# What the frozen teacher adds to each micro-batch (trainer_lib.with_frozen).
TEACHER_KEYS = ("teacher_mlm", "teacher_last", "teacher_hidden", "teacher_scores")


def recipe_fields(c, *, fit_size=768):
  """TinyBERT's general-distillation weights (their general_distill.py: rep_loss + att_loss, no
  prediction layer) as config fields: what a family's recipe calls."""
  c.alpha_emb = 1.0                # embedding-output MSE (through fit_dense when widths differ)
  c.alpha_hidden = 1.0             # hidden-state MSE, summed over the mapped layers
  c.alpha_att = 1.0                # attention-score MSE (needs the xla kernel: module docstring)
  c.alpha_att_kl = 0.0             # attention-distribution KL (MobileBERT's; the xla kernel too)
  c.alpha_pred = 0.0               # soft cross-entropy of the MLM logits (task distillation's)
  c.alpha_ce = 0.0                 # KL x T^2 of the MLM logits (DistilBERT's 5)
  c.alpha_cos = 0.0                # 1 - cos of the last hidden states (DistilBERT's 1)
  c.alpha_mlm = 0.0                # the student's own MLM loss
  c.temperature = 1.0              # T of distill_pred (TinyBERT's default 1)
  # Teacher layer g(m) of student layer m = 1..M, comma-separated, 1-based; "" = uniform
  # g(m) = m x N / M (a 12-layer teacher, 4-layer student: 3,6,9,12), or with a teacher_layers
  # field (DistilBERT's student init) the layers it copied, + 1.
  c.layer_map = ""
  # Width F of the learned projection W_h [H_s, F] of the student's hidden states: the teacher's
  # hidden size (TinyBERT's fit_size, 768 for BERT-base); 0 = none (student as wide as teacher).
  c.fit_size = fit_size


# ----------------------------------------------------------------------------------------------
# The layer map and the start-up checks.
# ----------------------------------------------------------------------------------------------
def layer_map(config, teacher_layers, student_layers):
  """[g(1), ..., g(M)], teacher layers 1..N: --config.layer_map, or TinyBERT's uniform m x N / M;
  a student initialised from teacher layers (config.teacher_layers: DistilBERT's, 0-based) is
  matched to them by default, student layer m to the output of the layer it copied."""
  spec = str(config.get("layer_map", "") or "")
  if not spec and "teacher_layers" in config:
    return [l + 1 for l in teacher_lib.layer_map(config, teacher_layers, student_layers)]
  try:
    layers = ([int(x) for x in spec.split(",") if x.strip()] if spec else
              [m * teacher_layers // student_layers for m in range(1, student_layers + 1)])
  except ValueError:
    raise ConfigError(f"config.layer_map={spec!r}: expected comma-separated teacher layers "
                      "1..N, e.g. 3,6,9,12.") from None
  if len(layers) != student_layers or not all(1 <= g <= teacher_layers for g in layers):
    raise ConfigError(f"config.layer_map={spec or 'uniform m x N / M'} gives teacher layers "
                      f"{layers} for a {student_layers}-layer student of a {teacher_layers}-layer "
                      f"teacher; give {student_layers} layer numbers from 1 to {teacher_layers} "
                      "(--config.layer_map=...).")
  return layers


def weights(config):
  """{part: weight} of the parts in the loss; a weight must be finite and >= 0, one > 0."""
  w = {k: config.get(k, 0.0) for k in WEIGHTS}
  for k, v in w.items():
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and v >= 0):
      raise ConfigError(f"config.{k}={v!r}: expected a loss weight >= 0.")
  if not any(w[k] for k in DISTILLED):
    raise ConfigError(f"config.{', '.join(DISTILLED)} are all 0: the student would learn nothing "
                      "from its teacher; give at least one a positive weight (TinyBERT's general "
                      "distillation: emb, hidden and att 1; DistilBERT's: ce 5, cos 1).")
  t = config.get("temperature", 1.0)
  if not (isinstance(t, (int, float)) and math.isfinite(t) and t > 0):
    raise ConfigError(f"config.temperature={t!r}: expected a temperature > 0 for the soft "
                      "targets (TinyBERT's 1, DistilBERT's 2).")
  return {"distill_emb": float(w["alpha_emb"]), "distill_hidden": float(w["alpha_hidden"]),
          "distill_att": float(w["alpha_att"]), "distill_att_kl": float(w["alpha_att_kl"]),
          "distill_pred": float(w["alpha_pred"]), "distill_ce": float(w["alpha_ce"]),
          "distill_cos": float(w["alpha_cos"]), "mlm": float(w["alpha_mlm"])}


def _score_weight(config):
  """(field, weight) of the first attention part the config distils, or (None, 0): either
  reads every layer's scores."""
  for k in ("alpha_att", "alpha_att_kl"):
    if config.get(k, 0.0):
      return k, config.get(k)
  return None, 0.0


def check_kernels(config, model_config, platform_name=None):
  """With alpha_att > 0 the step reads every layer's attention scores, which only the xla path
  makes: a step that would run a fused kernel (requested, or auto's choice on this platform, in
  training or evaluation) is a one-line error naming it. Explicit kernels that cannot run at all
  are attention.py's own AttentionError."""
  field, weight = _score_weight(config)
  if not weight:
    return
  choices = attention_lib.step_choices(
      model_config, packed=bool(config.get("pack")), seq_len=int(config.seq_length),
      platform_name=platform_name, window=attention_lib.local_window(model_config))
  fused = sorted({c.backend for pair in choices.values() for c in pair if c.backend != "xla"})
  if fused:
    how = ("requested" if model_config.attention != "auto" else
           f"auto's choice on {platform_name or attention_lib.platform()}")
    raise ConfigError(f"config.{field}={weight}: attention distillation reads "
                      f"each layer's pre-softmax scores [B, N, T, T], which the fused "
                      f"{'/'.join(fused)} kernel ({how}) never makes; set "
                      f"--config.model.attention=xla, or --config.{field}=0.")


def check_fit(config, t, s, where):
  """The student's widths against the teacher's: a projection to the teacher's width is needed
  when they differ (config.fit_size = H_t), and scores need as many heads."""
  fit = int(config.get("fit_size", 0) or 0)
  if fit and fit != t.hidden_size:
    raise ConfigError(f"{where} is {t.hidden_size} wide but config.fit_size={fit}: the projection "
                      f"W_h maps the student's hidden states to the teacher's width; set "
                      f"--config.fit_size={t.hidden_size}.")
  if not fit and s.hidden_size != t.hidden_size:
    raise ConfigError(f"{where} is {t.hidden_size} wide and the student {s.hidden_size}: their "
                      "hidden states are compared through a learned projection it is not given; "
                      f"set --config.fit_size={t.hidden_size}.")
  field, weight = _score_weight(config)
  if weight and t.num_heads != s.num_heads:
    raise ConfigError(f"{where} has {t.num_heads} heads and the student {s.num_heads}: attention "
                      "scores are compared head by head; use a student of as many heads, or "
                      f"--config.{field}=0.")


def load_teacher(config, model_config) -> teacher_lib.Teacher:
  """The teacher of a layer-wise run: described (no array read), checked against the student
  (vocab, widths, depth and layer map, heads, kernels), recorded. One-line ConfigError before
  any compute."""
  path = config.get("teacher_checkpoint", "")
  weights(config)
  pre, source, where = teacher_lib.read_teacher(config, path,
                                                "is distilled layer by layer from a teacher")
  t, s = pre.model_config, model_config
  check_teacher_config(config, t, s, where)
  field = next((k for k in ("alpha_pred", "alpha_ce") if config.get(k, 0.0)), None)
  if field:
    fresh = [p for p in pre.meta.get("initialized_randomly", []) if p.startswith("mlm_head/")]
    if trainer_lib.stored_subtree(pre, "mlm_head") is None or fresh:
      raise ConfigError(f"{where} has no trained MLM head; config.{field} > 0 matches its MLM "
                        "logits: use a BertForPreTraining or BertForMaskedLM checkpoint, or "
                        f"--config.{field}=0.")
  described = ckpt_lib.describe(source, verify=False)
  teacher_lib.check_teacher_vocab(config, pre, described, where)
  check_kernels(config, s)
  progressive.check(config, s)
  # A progressive run's checkpoints record its stages with the teacher: a resume must keep them
  # (progressive.check_resume).
  record = progressive.with_stages(teacher_lib.teacher_record(path, described), config, s)
  return teacher_lib.Teacher(path, pre, teacher_lib.as_teacher(t, s),
                        record)


def check_teacher_config(config, t, s, where):
  """The teacher's encoder `t` against the student `s` (no file read): family, vocab, depth and
  layer map, widths, positions."""
  # DistilBERT's teachers, or a student of this objective (its network is LayerwiseModel, a
  # BertModel: TinyBERT) in its turn, or a family whose own network gives the layer-wise
  # outputs (MobileBERT's, and so an IB-BERT-shaped teacher of its architecture).
  own = _own_network(t)
  ok = (t.family in teacher_lib.plain_teachers() or own is not None
        or families.get(t.family).pretraining_model.__name__ == LayerwiseModel.__name__)
  if not ok or (own is None and (t.factorised or t.share_layers != "none")):
    raise ConfigError(f"{where} is a {t.family} model; the teacher must be a BERT-style encoder "
                      f"({', '.join(teacher_lib.plain_teachers())}, or a layer-wise student) "
                      "without "
                      "factorised or shared layers.")
  if t.vocab_size != s.vocab_size:
    raise ConfigError(f"{where} has a vocabulary of {t.vocab_size} tokens and the student "
                      f"{s.vocab_size}: the teacher's logits and embeddings index its own "
                      "vocabulary; train the student with the teacher's vocab.")
  layer_map(config, t.num_layers, s.num_layers)
  check_fit(config, t, s, where)
  if s.max_position_embeddings > t.max_position_embeddings:
    raise ConfigError(f"{where} has max_position_embeddings={t.max_position_embeddings} but the "
                      f"student {s.max_position_embeddings}; set --config.model."
                      f"max_position_embeddings={t.max_position_embeddings}.")


def planning_teacher(config, model_config):
  """The teacher bert_jax.plan compiles with, as shapes: the --config.teacher_checkpoint's, else
  BERT-base of the student's vocab (TinyBERT's teacher)."""
  if config.get("teacher_checkpoint", ""):
    return load_teacher(config, model_config)._replace(pretrained=None)
  weights(config)
  t = model_lib.get_bert_config("base", vocab_size=model_config.vocab_size,
                                max_position_embeddings=model_config.max_position_embeddings)
  check_teacher_config(config, t, model_config, "the base preset (planning teacher)")
  check_kernels(config, model_config)
  progressive.check(config, model_config)
  return teacher_lib.Teacher("the base preset (shapes only: no --config.teacher_checkpoint)", None,
                             teacher_lib.as_teacher(t, model_config), None)


def init_from_teacher(state, steps, config, teacher, num_layers):
  """TinyBERT's general distillation starts the student from random weights (its widths differ
  from the teacher's): the state as it is. A progressive transfer (MobileBERT's) copies the
  teacher's embeddings and heads where they fit (progressive.copy_from_teacher)."""
  bounds = progressive.bounds(config, num_layers)
  staged = bounds is not None
  who = "the student's layers start from their" if staged else "the student starts from its"
  if jax.process_index() == 0:
    print(f"layer-wise distillation from teacher {teacher.path} "
          f"({teacher.model_config.num_layers} layers, hidden {teacher.model_config.hidden_size}"
          f"); {who} random initialisation", flush=True)
  if not staged:
    return state
  return progressive.copy_from_teacher(state, steps, teacher, bounds=bounds,
                                       num_train_steps=int(config.num_train_steps))


# ----------------------------------------------------------------------------------------------
# The network: BertModel + MLM head (+ fit_dense), the student's and the teacher's.
# ----------------------------------------------------------------------------------------------
class LayerwiseModel(nn.Module):
  """BertModel ("bert") and its MLM head ("mlm_head"), BertForPreTraining's names for an
  MLM-only model, plus TinyBERT's `fit_dense` [H, F] when called with fit_size=F > 0 (the
  training forward creates it; fill-mask, which never passes it, leaves it unread). mlm=False
  (a teacher whose MLM logits are not distilled, alpha_pred = 0): no MLM head, "mlm" None, so
  a body without one (a fine-tuned task model's, a BertModel folder) can teach.

  Called as BertForPreTraining: (mlm logits [B, P, V], None), or with return_dict=True
  {"mlm", "sequence_output"[, "hidden_states": [B, L+1, T, F or H]]} (batch first, as the
  data-parallel sharding splits it).
  """
  config: model_lib.BertConfig

  @nn.compact
  def __call__(self, input_ids, input_mask, segment_ids, masked_lm_positions, *,
               instance_ids=None, position_ids=None, cls_positions=None, deterministic=True,
               return_dict=False, output_hidden_states=False, fit_size=0, mlm=True, **unused):
    del unused   # span boundaries etc.: an MLM-only model reads none
    c = self.config
    bert = model_lib.BertModel(c, name="bert")
    out = bert(input_ids, input_mask, segment_ids, instance_ids=instance_ids,
               position_ids=position_ids, cls_positions=cls_positions,
               deterministic=deterministic, output_hidden_states=output_hidden_states)
    logits = None
    if mlm:
      masked = model_lib.gather_positions(out["sequence_output"], masked_lm_positions)
      logits = MaskedLMHead(c, name="mlm_head")(
          masked, bert.embeddings.word_embeddings.embedding)              # [B, P, V] float32
    if not return_dict:
      return logits, None
    res = {"mlm": logits, "sequence_output": out["sequence_output"]}
    if output_hidden_states:
      hidden = jnp.stack(out["hidden_states"], axis=1)                   # [B, L+1, T, H]
      if fit_size:   # W_h: one dense for every layer and the embeddings (TinyBERT's fit_dense)
        hidden = model_lib._dense(c, fit_size, ("embed", "embed2"),  # pylint: disable=protected-access
                                  "fit_dense")(hidden)                   # [B, L+1, T, F]
      res["hidden_states"] = hidden
    return res


def _args(batch):
  extra = {k: batch[k] for k in model_lib.PACKED_ROW_KEYS if k in batch}
  return (batch["input_ids"], batch["input_mask"], batch["segment_ids"],
          batch["masked_lm_positions"]), extra


def plain_forward(module, batch, deterministic):
  """The model without a teacher: {"mlm": logits} (Family.forward)."""
  args, extra = _args(batch)
  return {"mlm": module(*args, deterministic=deterministic, return_dict=True, **extra)["mlm"]}


def _run(module, batch, deterministic, *, scores, fit_size=0, mlm=True):
  """(outputs dict, scores [B, L, N, T, S] or None) of a bound `module` on `batch`. Scores: the
  same parameters applied again as a fresh apply with the `attention_scores` collection mutable
  (the step's apply is not; the nested one is a function of the same traced parameters, so the
  gradient reaches them), dropout keys drawn from the step's."""
  args, extra = _args(batch)
  # output_sequence: BertForPreTraining's (a distilbert-* student) last hidden states; mlm only
  # when False (a teacher's body alone), which the networks of a teacher take.
  kw = dict(deterministic=deterministic, return_dict=True, output_hidden_states=True,
            output_sequence=True, fit_size=fit_size, **({} if mlm else {"mlm": False}), **extra)
  if not scores or module.is_initializing():
    return module(*args, **kw), None
  rngs = {} if deterministic else {"dropout": module.make_rng("dropout")}
  out, state = module.clone(parent=None).apply(
      module.variables, *args, mutable=["attention_scores"], rngs=rngs, **kw)
  # One [B, N, T, S] per layer, in layer order (sow keeps a tuple per call: one call each),
  # wherever the network sows it under layer_{i} (BertModel: bert/encoder/layer_{i}/attention;
  # MobileBERT: bert/layer_{i}/attention/self).
  found = {}
  for path, value in traverse_util.flatten_dict(state["attention_scores"]).items():
    layer = next((int(p[6:]) for p in path if p.startswith("layer_") and p[6:].isdigit()), None)
    if layer is not None:
      found[layer] = value[0]
  return out, jnp.stack([found[i] for i in range(module.config.num_layers)], axis=1)


def teacher_outputs(model, params, batch, *, layers, scores, mlm=True):
  """The frozen teacher's {teacher_last [B, T, H_t] (its last hidden states), teacher_hidden
  [B, M+1, T, H_t] (its hidden states 0, g(1), ..., g(M); layers () = none), teacher_scores
  [B, M, N, T, S] (layers g(m), when distilled), teacher_mlm [B, P, V] (when distilled)}. What
  no part reads, XLA drops from the step."""
  fn = functools.partial(_run, scores=scores, mlm=mlm)
  out, att = model.apply({"params": params}, batch, True, method=fn)
  res = {"teacher_last": out["sequence_output"]}
  if layers:
    res["teacher_hidden"] = out["hidden_states"][:, jnp.array([0, *layers])]
  if mlm:
    res["teacher_mlm"] = out["mlm"]
  if att is not None:
    res["teacher_scores"] = att[:, jnp.array([g - 1 for g in layers])]
  return jax.lax.stop_gradient(res)


def forward(module, batch, deterministic, *, fit_size, parts, temperature, stages=None):
  """The student on a batch carrying the teacher's outputs -> objectives parts (`parts`: those
  with weight > 0, and mlm). Without them (model.init) the parts are not built.

  stages (a progressive.Stages; the batch then carries the optimizer "step"): in stage l only
  layer l's feature map and attention count (`layer_weights` one-hot over the layers), the
  embeddings' and prediction parts weigh 0 and the MLM logits pass no gradient; after the
  stages, and in evaluation (no "step"), every part as configured."""
  out, att = _run(module, batch, deterministic,
                  scores=bool({"distill_att", "distill_att_kl"} & set(parts)), fit_size=fit_size)
  res = {"mlm": out["mlm"]}
  if "teacher_last" not in batch:   # init: the parameters are made, the loss is not
    return res
  hidden, t_hidden = out["hidden_states"], batch.get("teacher_hidden")    # [B, M+1, T, F]
  layers, every = jnp.ones((hidden.shape[1] - 1,), jnp.float32), jnp.ones((), jnp.float32)
  if stages is not None and "step" in batch:
    layers, every = stages.weights(batch["step"])                         # [M], scalar
    # The MLM loss is objectives' own part: its value stays logged, its gradient waits for the
    # final phase (d/dx where(c, x, sg(x)) = c).
    res["mlm"] = jnp.where(every > 0, out["mlm"], jax.lax.stop_gradient(out["mlm"]))
  real = batch["input_mask"]
  if "distill_emb" in parts:
    res["distill_emb"] = {"student": hidden[:, :1], "teacher": t_hidden[:, :1], "mask": real,
                          "layer_weights": every[None]}
  if "distill_hidden" in parts:
    res["distill_hidden"] = {"student": hidden[:, 1:], "teacher": t_hidden[:, 1:], "mask": real,
                             "layer_weights": layers}
  if {"distill_att", "distill_att_kl"} & set(parts):
    packed = "instance_ids" in batch
    ids = batch["instance_ids"] if packed else real
    pairs = attention_lib.attention_mask(ids, packed) & (ids != 0)[:, None, :, None]
    # A fixed order (not a set's, which follows PYTHONHASHSEED): every host traces one program.
    for part in [p for p in ("distill_att", "distill_att_kl") if p in parts]:
      res[part] = {"student": att, "teacher": batch["teacher_scores"], "mask": pairs,  # [B,1,T,S]
                   "layer_weights": layers}
  # The prediction layer's soft targets (two forms of one pair) and the last hidden states'
  # cosine: 0 in a progressive stage (`every`), as the embeddings'.
  for part in [p for p in ("distill_pred", "distill_ce") if p in parts]:
    res[part] = {"student": out["mlm"], "teacher": batch["teacher_mlm"],
                 "temperature": temperature, "weight": every}
  if "distill_cos" in parts:   # DistilBERT's: last hidden states (the student's through W_h)
    last = hidden[:, -1] if fit_size else out["sequence_output"]          # [B, T, H_t]
    res["distill_cos"] = {"student": last, "teacher": batch["teacher_last"], "weight": every}
  return res


# ----------------------------------------------------------------------------------------------
# The loss parts (objectives.PARTS): each (name, outputs, batch) -> (loss, metrics).
# ----------------------------------------------------------------------------------------------
def layer_mse(name, outputs, batch):
  """sum over layers of the mean squared error over the real tokens' elements: student and
  teacher [B, L, T, F], mask [B, T] (TinyBERT's MSELoss per layer, summed)."""
  del batch
  s, t = (outputs[k].astype(jnp.float32) for k in ("student", "teacher"))
  w = (outputs["mask"] > 0).astype(jnp.float32)                           # [B, T]
  denom = jnp.sum(w) * s.shape[-1] + 1e-6
  per_layer = jnp.sum(jnp.sum((s - t) ** 2, -1) * w[:, None], axis=(0, 2)) / denom   # [L]
  return _over_layers(name, per_layer, outputs)


def _over_layers(name, per_layer, outputs):
  """sum over layers of per_layer [L] x the layers' weights (1 each, or a progressive stage's:
  forward's `layer_weights`)."""
  loss = jnp.sum(per_layer * outputs.get("layer_weights", 1.0))
  return loss, {f"{name}_loss": loss}


def score_mse(name, outputs, batch):
  """sum over layers of the MSE of the pre-softmax scores over the real query-key pairs:
  student and teacher [B, L, N, T, S], mask [B, 1, T, S] (TinyBERT zeroes the masked ones)."""
  del batch
  s, t = (outputs[k].astype(jnp.float32) for k in ("student", "teacher"))
  w = outputs["mask"].astype(jnp.float32)[:, None]                       # [B, 1, 1, T, S]
  denom = jnp.sum(w) * s.shape[2] + 1e-6
  per_layer = jnp.sum((s - t) ** 2 * w, axis=(0, 2, 3, 4)) / denom        # [L]
  return _over_layers(name, per_layer, outputs)


def attention_kl(name, outputs, batch):
  """MobileBERT's attention transfer (Sun et al. 2020, section 3.5, L_AT): per layer,
  1/(T A) sum_t sum_a KL(a^t_tr || a^t_st) of the teacher's and the student's attention
  distributions, softmax of the scores [B, L, N, T, S] over the real keys of each query
  (mask [B, 1, T, S]); the mean over the batch's real query rows (T, pooled over the batch) and
  the heads (A); summed over layers as the other parts. Padding queries and masked keys count
  nowhere (TF Model Garden's MobileBERT takes the cross-entropy, KL plus the teacher's entropy:
  the same gradient, over every query row of the padded tensor)."""
  del batch
  s, t = (outputs[k].astype(jnp.float32) for k in ("student", "teacher"))
  m = outputs["mask"][:, None]                                           # [B, 1, 1, T, S]
  log_s = jax.nn.log_softmax(jnp.where(m, s, -1e30), -1)                 # [B, L, N, T, S]
  log_t = jax.nn.log_softmax(jnp.where(m, t, -1e30), -1)
  kl = jnp.sum(jnp.where(m, jnp.exp(log_t) * (log_t - log_s), 0.0), -1)  # [B, L, N, T]
  rows = jnp.any(m, -1).astype(jnp.float32)                              # [B, 1, 1, T]
  denom = jnp.sum(rows) * s.shape[2] + 1e-6                              # real queries x A
  per_layer = jnp.sum(kl * rows, axis=(0, 2, 3)) / denom                 # [L]
  return _over_layers(name, per_layer, outputs)


# TinyBERT's prediction-layer loss: the soft cross-entropy per masked position, no T^2 (their
# soft_cross_entropy). distill_ce (KL x T^2) and distill_cos are objectives.py's own parts.
soft_cross_entropy = functools.partial(objectives.soft_cross_entropy, kl_t2=False)

PARTS = {"distill_emb": layer_mse, "distill_hidden": layer_mse, "distill_att": score_mse,
         "distill_att_kl": attention_kl, "distill_pred": soft_cross_entropy}
objectives.PARTS.update(PARTS)   # objectives are an open table; these are this module's


# ----------------------------------------------------------------------------------------------
# The family hooks' step (Family.step_parts) and FLOPs.
# ----------------------------------------------------------------------------------------------
def step_parts(config, model_config, teacher, dummy_batch, mesh, rules, *, teacher_head=False):
  """(student forward, loss weights, the frozen teacher) for trainer_lib.build_steps.
  teacher_head: load the teacher's MLM head even when its logits are not distilled (DistilBERT's
  student starts from it: teacher_lib.init_student reads it from the frozen parameters)."""
  teacher = teacher or load_teacher(config, model_config)
  layers = layer_map(config, teacher.model_config.num_layers, model_config.num_layers)
  # MobileBERT's progressive transfer (bert_jax/objectives/progressive.py): a schedule of layers by step,
  # or None (every layer at once).
  stages = progressive.stages(config, model_config, layers)
  return (student_forward(config, stages), weights(config),
          frozen_teacher(teacher, dummy_batch, mesh, rules, layers=layers,
                         parts=_parts(config), head=teacher_head))


def _parts(config):
  """The parts of the loss: those of weight > 0."""
  return tuple(p for p, v in weights(config).items() if v > 0)


def student_forward(config, stages=None):
  """`forward` of the student at the config's parts, projection and temperature; `stages` (a
  progressive.Stages) rides along as its attribute for trainer_lib.build_steps (the step in the
  batch, the masked optimizer)."""
  fwd = functools.partial(forward, fit_size=int(config.get("fit_size", 0) or 0),
                          parts=_parts(config), temperature=float(config.get("temperature", 1.0)),
                          stages=stages)
  fwd.stages = stages
  return fwd


def frozen_teacher(teacher, dummy_batch, mesh, rules, *, layers=(),
                   parts=("distill_ce", "distill_cos"), head=False) -> trainer_lib.Frozen:
  """The teacher's parameters read once into their shardings (the student's logical-axis rules)
  and its outputs function (teacher_outputs at `layers` for `parts`; by default DistilBERT's
  recipe's: MLM logits and last hidden states): trainer_lib.build_steps(frozen=). A planning
  teacher (pretrained=None) gives their shapes, nothing read."""
  model = network(teacher.model_config)
  # The teacher's MLM head only when its logits are distilled (or `head`): any BERT body teaches
  # the layers.
  mlm = bool({"distill_pred", "distill_ce"} & set(parts))
  apply = functools.partial(teacher_outputs, model, layers=layers,
                            scores=bool({"distill_att", "distill_att_kl"} & set(parts)), mlm=mlm)
  keys = ("bert", "mlm_head") if mlm or head else ("bert",)
  init = functools.partial(_teacher_init, mlm=mlm or head)
  return trainer_lib.load_frozen(teacher.pretrained, model, init, dummy_batch, keys, mesh,
                                 apply, rules)


def _own_network(config):
  """The family's network when it gives layer-wise outputs itself (a class attribute
  layerwise_outputs: MobileBERT's), else None."""
  net = families.get(config.family).pretraining_model
  return net if getattr(net, "layerwise_outputs", False) else None


def network(config):
  """The network a teacher (or student) of `config` runs here: its family's own when that gives
  layer-wise outputs, else LayerwiseModel (BertModel + MLM head)."""
  return (_own_network(config) or LayerwiseModel)(config)


def _teacher_init(module, batch, deterministic, *, mlm):
  return _run(module, batch, deterministic, scores=False, mlm=mlm)[0]


def flops_per_sequence(cfg, seq_length, num_predictions, num_nsp=1, teacher_config=None):
  """The student's training FLOPs plus, with a teacher, the teacher's forward (distil's count)."""
  bert_flops = families.get("bert").flops_per_sequence   # the table's, not the folder's
  if teacher_config is None:
    return bert_flops(cfg, seq_length, num_predictions, num_nsp)
  return teacher_lib.flops_per_sequence(cfg, teacher_config, seq_length, num_predictions, bert_flops)
