"""DistilBERT's own distillation (Sanh et al. 2019): the teacher of a distilbert-* run, checked
and recorded before compute (objectives/teacher.py's checks), the one bert_jax.plan compiles its
step with, and the step's parts under DistilBERT's names: the shared layer-wise objective
(objectives/layerwise.py) at HF's weights, 5 x distill_ce + 2 x mlm + 1 x distill_cos at T = 2,
with the teacher's MLM head, which the student starts from (teacher.init_student).
"""

from bert_jax.checkpoint import checkpoint_fit
from bert_jax.checkpoint import store as ckpt_lib
from bert_jax.models import model as model_lib
from bert_jax.objectives import layerwise
from bert_jax.objectives import teacher as teacher_lib
from bert_jax.training import trainer_lib

ConfigError = trainer_lib.ConfigError


def check_loss_settings(config):
  """The loss weights and the temperature in range (layerwise.weights), as task distillation
  checks its own (finetune.load_distill_teacher): T = 0 divided the logits by zero (every step
  NaN, skipped, and a run that ended with exit 0 and an untrained student); a negative weight
  rewards the student for moving away from its teacher."""
  layerwise.weights(config)


def load_teacher(config, model_config) -> teacher_lib.Teacher:
  """The teacher of a distilbert-* run: described and verified (no array read), checked against
  the student (vocab, width, depth), recorded. One-line ConfigError before any compute."""
  path = config.get("teacher_checkpoint", "")
  check_loss_settings(config)
  pre, source, where = teacher_lib.read_teacher(config, path, "distils from a teacher")
  t, s = pre.model_config, model_config
  if t.family not in teacher_lib.plain_teachers() or t.factorised or t.share_layers != "none":
    raise ConfigError(f"{where} is a {t.family} model; the teacher must be a BERT-style encoder "
                      f"({', '.join(teacher_lib.plain_teachers())}) without factorised or "
                      "shared layers.")
  missing = [k for k in ("bert", "mlm_head") if trainer_lib.stored_subtree(pre, k) is None]
  fresh = [p for p in pre.meta.get("initialized_randomly", []) if p.startswith("mlm_head/")]
  if missing or fresh:
    why = f"no {missing} parameters" if missing else f"{fresh[0]} was initialised randomly"
    raise ConfigError(f"{where} has no trained MLM head ({why}); "
                      "distillation matches the teacher's MLM logits: use a BertForPreTraining "
                      "or BertForMaskedLM checkpoint.")
  diff = checkpoint_fit.differences(t, s, ("vocab_size", "hidden_size"))
  if diff:
    raise ConfigError(f"{where} does not fit the student {config.model_name} (teacher vs "
                      f"student: {diff}); the logits and hidden states are compared one to one: "
                      "use the teacher's vocab and a student of its width.")
  teacher_lib.layer_map(config, t.num_layers, s.num_layers)   # the init's layers exist
  layerwise.layer_map(config, t.num_layers, s.num_layers)   # and the loss's map
  layerwise.check_fit(config, t, s, where)      # fit_size, heads for alpha_att
  layerwise.check_kernels(config, s)            # scores for alpha_att: the xla kernel
  if s.max_position_embeddings > t.max_position_embeddings:
    raise ConfigError(f"{where} has max_position_embeddings={t.max_position_embeddings} but the "
                      f"student {s.max_position_embeddings}; set --config.model."
                      f"max_position_embeddings={t.max_position_embeddings}.")
  described = ckpt_lib.describe(source, verify=False)
  teacher_lib.check_teacher_vocab(config, pre, described, where)
  return teacher_lib.Teacher(path, pre, teacher_lib.as_teacher(t, s),
                             teacher_lib.teacher_record(path, described))


def planning_teacher(config, model_config):
  """The teacher bert_jax.plan compiles a distilbert-* step with, as shapes only (Teacher with
  pretrained=None: frozen_teacher reads no array; the plan's devices are compile-only): the
  --config.teacher_checkpoint's encoder, checked as load_teacher checks it for train; without
  one, the BERT preset the student preset halves (distilbert-base -> base: the presets of
  bert_jax/models/model.py)."""
  if config.get("teacher_checkpoint", ""):
    return load_teacher(config, model_config)._replace(pretrained=None)
  check_loss_settings(config)
  preset = str(config.model_name).removeprefix("distilbert-")
  if preset == config.model_name or preset not in model_lib.PRESETS or \
      model_lib.PRESETS[preset].get("family", "bert") not in teacher_lib.plain_teachers():
    raise ConfigError(f"config.model_name={config.model_name} distils from a teacher, and no "
                      "BERT preset of its size is known to plan with: pass "
                      "--config.teacher_checkpoint=WORKDIR, export or Hugging Face BERT folder.")
  t = model_lib.get_bert_config(preset, vocab_size=model_config.vocab_size,
                                max_position_embeddings=model_config.max_position_embeddings)
  teacher_lib.layer_map(config, t.num_layers, model_config.num_layers)
  layerwise.check_teacher_config(config, t, model_config, f"the {preset} preset")
  layerwise.check_kernels(config, model_config)
  return teacher_lib.Teacher(f"the {preset} preset (shapes only: no --config.teacher_checkpoint)",
                             None, teacher_lib.as_teacher(t, model_config), None)


def loss_weights(config):
  """{part: weight} from the config's alpha_* fields (HF's recipe by default): layerwise.weights."""
  return layerwise.weights(config)


def student_forward(config):
  """The student's forward at the config's parts and temperature: layerwise.student_forward."""
  return layerwise.student_forward(config)


def frozen_teacher(teacher: teacher_lib.Teacher, dummy_batch, mesh, rules) -> trainer_lib.Frozen:
  """The teacher's bert + mlm_head parameters read once into their shardings and its outputs
  for the recipe's parts (MLM logits, last hidden states): layerwise.frozen_teacher."""
  return layerwise.frozen_teacher(teacher, dummy_batch, mesh, rules, head=True)
