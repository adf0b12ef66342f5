"""Sentence (pair) regression: GLUE's stsb, or your own scored pairs (task=custom with no
labels). classification.py's reader and head with one output -> [B, 1] score, squared error,
Pearson/Spearman (metrics.classification_metrics), GLUE's STS-B.tsv submission file."""

from bert_jax.evaluation import metrics as metrics_lib
from bert_jax.tasks import classification
from bert_jax.tasks import common
from bert_jax.tasks import registry
from data_pipelines.tasks import glue
from data_pipelines.tasks.common import TaskDataError


def custom_task(config, labels):
  del labels   # a score per row, no classes
  return classification.glue_custom_task(config.custom, ())


def create_head(model_config, num_labels=1, num_choices=4):
  del num_labels, num_choices
  return classification.create_head(model_config, 1)


def loss(outputs, batch):
  """Squared error of [B, (K,) 1] scores; example_weights as classification's."""
  err = (outputs[..., 0] - batch["label_ids"]) ** 2  # [B] or [B, K]
  value = common.weighted_mean(err, batch["example_weights"])
  return value, {"loss": value}


def cannot_learn(task, train, tokenizer, config):
  """One line when every training score is the same: squared error then learns that constant
  (the head's bias) and nothing of the text."""
  del tokenizer
  score = common.one_value(train.features["label_ids"])
  if score is None:
    return []
  where, n = common.train_source(task, config, train), len(train.features["label_ids"])
  raise TaskDataError(f"{where}: all {n} training scores are {float(score):g}: squared error "
                      "learns only that constant, nothing of the text; check the score column "
                      "(for classes, --config.custom.type=classification with "
                      "--config.custom.labels).")


def evaluate(task, split, outputs, tokenizer, config, output_dir=None):
  del tokenizer, config, output_dir
  return metrics_lib.classification_metrics(task.metrics, outputs["logits"][:, 0],
                                            split.features["label_ids"])


def write_test(task, split, outputs, tokenizer, config, output_dir):
  del tokenizer, config
  return [glue.write_predictions(task, split.name, split.examples, outputs["logits"][:, 0],
                                 output_dir)]


TYPE = registry.register(registry.TaskType(
    name="regression",
    summary="dense(1) on [CLS] -> [B, 1] score, squared error; STS-B and your own scored pairs",
    named_tasks={n: t for n, t in glue.TASKS.items() if t.is_regression},
    label_keys=("label_ids",),
    load_split=classification.load_split, custom_task=custom_task,
    create_head=create_head, input_shape=classification.input_shape, loss=loss,
    predict_outputs=classification.predict_outputs, evaluate=evaluate, write_test=write_test,
    cannot_learn=cannot_learn, packable=True, hf_head="SequenceClassification",
    hf_problem_type="regression"))
