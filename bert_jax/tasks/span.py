"""Span QA: SQuAD v1.1 and v2.0. dense(2) on every position -> start and end logits [B, T] each
(heads.BertForQuestionAnswering), the mean of the two cross-entropies (google-research/bert),
the official evaluation (exact match, F1; v2 its HasAns/NoAns and best threshold), and
predictions.json + nbest_predictions.json (+ null_odds.json) for dev and test splits."""

import optax

from bert_jax.models import heads
from bert_jax.evaluation import metrics as metrics_lib
from bert_jax.tasks import classification
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import squad, squad_predictions
from data_pipelines.tasks.common import TaskDataError


def load_split(task, split, tokenizer, config, is_training):
  read = squad.read_tfds if config.data_source == "tfds" else squad.read_file
  examples, data, skips = read(task, config.data_dir, split, is_training)
  examples = common.limit(examples, config, is_training)
  features, stats = squad.convert_examples(
      examples, tokenizer, config.max_seq_length, config.doc_stride, config.max_query_length,
      is_training=is_training)
  notes = "; ".join(x for x in (skips.summary(),
                                common.note(stats["questions_truncated"],
                                            f"questions cut to {config.max_query_length} pieces"))
                    if x)
  return common.Split(split, examples, features, data=data, notes=notes)


def create_head(model_config, num_labels=2, num_choices=4):
  del num_labels, num_choices
  return heads.BertForQuestionAnswering(model_config)


def loss(outputs, batch):
  start_logits, end_logits = outputs  # [B, T] each; google: mean of the two cross-entropies
  ce = (optax.softmax_cross_entropy_with_integer_labels(start_logits, batch["start_positions"])
        + optax.softmax_cross_entropy_with_integer_labels(end_logits,
                                                          batch["end_positions"])) / 2
  value = common.weighted_mean(ce, batch["example_weights"])
  return value, {"loss": value}


def cannot_learn(task, train, tokenizer, config):
  """One line when no training window holds an answer (every start and end is [CLS], position
  0): the model can learn only "no answer". Every question unanswerable (SQuAD 2.0's
  is_impossible), or every answer outside its windows (a window too small for it)."""
  del tokenizer
  f = train.features
  if len(f["start_positions"]) == 0 or (f["start_positions"] > 0).any() or (
      f["end_positions"] > 0).any():
    return []
  where, n = common.train_source(task, config, train), len(f["start_positions"])
  if all(getattr(ex, "is_impossible", False) for ex in train.examples):
    raise TaskDataError(f"{where}: all {len(train.examples)} training questions are unanswerable "
                        "(is_impossible): every window's answer is [CLS], so the model learns "
                        "only to answer nothing; train on answerable questions too.")
  raise TaskDataError(f"{where}: none of the {n} training windows holds its answer (every "
                      "start and end is [CLS]): the model learns only to answer nothing; the "
                      f"windows are too small for the answers: raise --config.max_seq_length="
                      f"{config.max_seq_length}, or lower --config.doc_stride="
                      f"{config.doc_stride} (more overlap) or --config.max_query_length="
                      f"{config.max_query_length}.")


def predict_outputs(outputs):
  return {"start_logits": outputs[0], "end_logits": outputs[1]}


def _predictions(task, split, outputs, tokenizer, config):
  return squad_predictions.compute_predictions(
      split.examples, split.features, outputs["start_logits"], outputs["end_logits"],
      id_to_token=tokenizer.id_to_token, do_lower_case=tokenizer.do_lower_case,
      vocab_kind=tokenizer.vocab.kind, n_best_size=config.n_best_size,
      max_answer_length=config.max_answer_length,
      version_2_with_negative=task.version_2_with_negative,
      null_score_diff_threshold=config.null_score_diff_threshold)


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  """The official metrics; with output_dir, the prediction files (SQuAD's submission)."""
  preds, nbest, null_odds = _predictions(task, split, outputs, tokenizer, config)
  if output_dir:
    squad_predictions.write_predictions(output_dir, preds, nbest, null_odds)
  if task.version_2_with_negative:
    out = metrics_lib.squad_v2_evaluate(split.data, preds, na_probs=null_odds)
    return {k: v for k, v in out.items() if k in ("exact", "f1", "HasAns_f1", "NoAns_f1",
                                                   "best_f1", "best_f1_thresh")}
  out = metrics_lib.squad_v1_evaluate(split.data, preds)
  return {"exact_match": out["exact_match"], "f1": out["f1"]}


def write_test(task, split, outputs, tokenizer, config, output_dir):
  preds, nbest, null_odds = _predictions(task, split, outputs, tokenizer, config)
  return list(squad_predictions.write_predictions(output_dir, preds, nbest, null_odds,
                                                  prefix=f"{split.name}_").values())


TYPE = registry.register(registry.TaskType(
    name="span",
    summary="dense(2) on every position -> start/end logits; SQuAD v1.1 and v2.0",
    named_tasks=dict(squad.TASKS),
    label_keys=("start_positions", "end_positions"),
    load_split=load_split, create_head=create_head, input_shape=classification.input_shape,
    loss=loss, predict_outputs=predict_outputs, evaluate=evaluate, write_test=write_test,
    cannot_learn=cannot_learn, primary_metric=lambda task: "f1", dev_prediction_files=True,
    hf_head="QuestionAnswering", hf_num_labels=2))
