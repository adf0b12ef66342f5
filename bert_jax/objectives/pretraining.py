"""Pre-training objectives as parts: each maps (its logits, the batch) to (loss, metrics), and
`pretraining_loss` sums the parts a model produced, in one place.

  part  logits (BertForPreTraining, return_dict=True)   targets (batch keys)
  mlm   [B, P, V] at masked_lm_positions (or, with        masked_lm_ids, masked_lm_weights
        mlm_loss_chunk, their pieces: made in the loss)
  nsp   [B, 2] or packed [B, K, 2] on the pooled [CLS]   next_sentence_labels (1 = random next)
  sop   the same head shape, ALBERT's sentence order     next_sentence_labels (1 = swapped)
  sbo   [B, P, V] from the span's boundary tokens        masked_lm_ids, masked_lm_weights
  rtd   ELECTRA's discriminator (bert_jax/families/electra/objective.py):   input_mask (every real token)
        {"logits": [B, T], "labels": [B, T] sampled in the step}
  distill_ce   the prediction layer's soft targets (bert_jax/  masked_lm_weights
        layerwise.py's objective): {"student", "teacher": MLM logits [B, P, V], "temperature": T}
  distill_cos  {"student", "teacher": last hidden [B, T, H]}  input_mask (every real token)

The records keep one label field, `next_sentence_labels`, whatever the sentence task; what the
label means is the records' `sentence_objective` in dataset_info.json, checked against the model's
objectives before compute (data_pipelines/records/dataset_info.py).

A model's outputs are a dict {part: logits}; the loss is sum_part weight[part] * loss[part], with
weight WEIGHTS[part] (1 unless listed) unless given (BERT: MLM + NSP; ALBERT: MLM + SOP; SpanBERT:
MLM + SBO, as the papers; ELECTRA: generator MLM + 50 x replaced-token detection; the
distillation parts: layerwise.weights, from the config's alpha_* fields, e.g. DistilBERT's
5 x distill_ce + 2 x MLM + 1 x distill_cos, HF's recipe).
"""

import jax
import jax.numpy as jnp
import optax


def _weighted_ce(logits, labels, weights):
  """Mean cross-entropy and accuracy over the predictions with weight > 0."""
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  # 1e-5 as in google-research/bert: a batch with no predictions gives 0, not NaN.
  denom = jnp.sum(weights) + 1e-5
  correct = (jnp.argmax(logits, -1) == labels) * weights
  return jnp.sum(ce * weights) / denom, jnp.sum(correct) / denom


def masked_lm(name, logits, batch):
  """MLM (and SBO, which predicts the same tokens from the span's boundaries). `logits` may be
  the pieces they are made of (config.model.mlm_loss_chunk > 0: pretraining_heads.mlm_chunks),
  then made C predictions at a time: the same loss and gradients, never all at once."""
  if isinstance(logits, dict):
    from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
    weights = batch["masked_lm_weights"]
    ce_sum, hit_sum = pretraining_heads.chunked_cross_entropy(logits, batch["masked_lm_ids"],
                                                              weights)
    denom = jnp.sum(weights) + 1e-5   # as _weighted_ce
    loss, accuracy = ce_sum / denom, hit_sum / denom
  else:
    loss, accuracy = _weighted_ce(logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
  return loss, {f"{name}_loss": loss, f"{name}_accuracy": accuracy}


def sentence(name, logits, batch):
  """NSP / SOP: means over instances, over rows unpacked and over the nsp_weights [B, K] of packed
  rows (a row of 5 instances counts 5 times), so packing changes neither."""
  labels = batch["next_sentence_labels"]                                 # [B] or [B, K]
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  correct = (jnp.argmax(logits, -1) == labels).astype(jnp.float32)
  if "nsp_weights" in batch:
    w = batch["nsp_weights"]                                             # [B, K]
    loss = jnp.sum(ce * w) / jnp.maximum(jnp.sum(w), 1.0)
    accuracy = jnp.sum(correct * w) / jnp.maximum(jnp.sum(w), 1.0)
  else:
    loss, accuracy = jnp.mean(ce), jnp.mean(correct)
  return loss, {f"{name}_loss": loss, f"{name}_accuracy": accuracy}


def replaced_token_detection(name, outputs, batch):
  """ELECTRA's discriminator: sigmoid cross-entropy of "replaced?" on every real token, the mean
  over the batch's input_mask (google-research/electra _get_discriminator_output). The labels come
  with the logits: the step sampled the replacements (electra.corrupt)."""
  logits, labels = outputs["logits"], outputs["labels"].astype(jnp.float32)   # [B, T]
  w = batch["input_mask"].astype(jnp.float32)                                 # [B, T]
  denom = jnp.sum(w) + 1e-6   # as google's code: an empty batch gives 0, not NaN
  loss = jnp.sum(optax.sigmoid_binary_cross_entropy(logits, labels) * w) / denom
  correct = ((logits > 0) == (labels > 0)) * w
  return loss, {f"{name}_loss": loss, f"{name}_accuracy": jnp.sum(correct) / denom,
                f"{name}_replaced_fraction": jnp.sum(labels * w) / denom}


def soft_cross_entropy(name, outputs, batch, *, kl_t2=True):
  """The prediction layer's soft targets at temperature T over the masked positions (the mean
  over masked_lm_weights), in one of two forms (bert_jax/objectives/layerwise.py's distill_ce and
  distill_pred):
    kl_t2=True   KL(softmax(teacher/T) || softmax(student/T)) x T^2: DistilBERT's L_ce (HF
                 distiller.py: KLDivLoss(batchmean) over the selected positions, times T^2 so
                 its gradient keeps the scale of a T=1 loss; Hinton et al. 2015)
    kl_t2=False  -sum softmax(teacher/T) log softmax(student/T): TinyBERT's soft_cross_entropy
                 (their task distillation), no T^2
  KL = cross-entropy - H(teacher/T): the same gradient at equal scale, 0 when the student
  matches; so the two differ by the teacher's entropy and, at T != 1, by the factor T^2 (at
  T = 2: 4x the gradient). `accuracy`: the student's top-1 is the teacher's. outputs["weight"]
  (1 unless given) scales the loss: 0 in a progressive transfer's stage (progressive.py)."""
  t = outputs["temperature"]
  s_logits, t_logits = outputs["student"], outputs["teacher"]           # [B, P, V] float32
  log_p_t = jax.nn.log_softmax(t_logits / t, axis=-1)
  log_p_s = jax.nn.log_softmax(s_logits / t, axis=-1)
  if kl_t2:
    per = jnp.sum(jnp.exp(log_p_t) * (log_p_t - log_p_s), axis=-1) * (t * t)   # [B, P]
  else:
    per = -jnp.sum(jnp.exp(log_p_t) * log_p_s, axis=-1)                        # [B, P]
  w = batch["masked_lm_weights"]
  denom = jnp.sum(w) + 1e-5
  agree = (jnp.argmax(s_logits, -1) == jnp.argmax(t_logits, -1)) * w
  loss = jnp.sum(per * w) / denom * outputs.get("weight", 1.0)
  return loss, {f"{name}_loss": loss, f"{name}_accuracy": jnp.sum(agree) / denom}


def cosine_embedding(name, outputs, batch):
  """DistilBERT's L_cos (layerwise.py's distill_cos): 1 - cos(student, teacher) of the last
  hidden states, the mean over real tokens (input_mask; HF distiller.py: CosineEmbeddingLoss
  with target 1 on attention_mask); outputs["weight"] as soft_cross_entropy's."""
  s, t = (outputs[k].astype(jnp.float32) for k in ("student", "teacher"))   # [B, T, H]
  cos = jnp.sum(s * t, -1) / (jnp.maximum(jnp.linalg.norm(s, axis=-1), 1e-8)
                              * jnp.maximum(jnp.linalg.norm(t, axis=-1), 1e-8))  # [B, T]
  w = (batch["input_mask"] > 0).astype(jnp.float32)
  denom = jnp.sum(w) + 1e-6
  loss = jnp.sum((1.0 - cos) * w) / denom * outputs.get("weight", 1.0)
  return loss, {f"{name}_loss": loss, f"{name}_similarity": jnp.sum(cos * w) / denom}


PARTS = {"mlm": masked_lm, "nsp": sentence, "sop": sentence, "sbo": masked_lm,
         "rtd": replaced_token_detection, "distill_ce": soft_cross_entropy,
         "distill_cos": cosine_embedding}
# ELECTRA's lambda = 50 (Clark et al. 2020, section 2; google-research/electra
# configure_pretraining.py: gen_weight 1.0, disc_weight 50.0).
# The distillation parts' weights come from the run's config (layerwise.weights).
WEIGHTS = {"rtd": 50.0}


def pretraining_loss(outputs, batch, weights=None):
  """(sum of weighted part losses, metrics) for outputs {part: logits}, or BertForPreTraining's
  (mlm, nsp) tuple (google-research/bert's loss); metrics hold `loss` and each part's
  `<part>_loss` and `<part>_accuracy`."""
  if isinstance(outputs, (tuple, list)):
    outputs = {"mlm": outputs[0], "nsp": outputs[1]}
  weights = {**WEIGHTS, **(weights or {})}
  unknown = sorted(set(outputs) - set(PARTS))
  if unknown:
    raise ValueError(f"objectives.pretraining_loss: no part for outputs {unknown}; "
                     f"parts are {sorted(PARTS)}.")
  total, metrics = 0.0, {}
  for name, logits in outputs.items():
    loss, part_metrics = PARTS[name](name, logits, batch)
    total = total + weights.get(name, 1.0) * loss
    metrics.update(part_metrics)
  metrics["loss"] = total
  return total, metrics
