"""Per-task-type losses (padding and piece weights), task building and metric choice."""
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

from bert_jax.training import finetune_tasks as ft
from bert_jax.configs import finetune as finetune_config
from data_pipelines.tasks.common import TaskDataError


def test_padding_rows_do_not_count():
  logits = jnp.array([[2.0, 0.0], [0.0, 3.0], [5.0, -5.0]])
  batch = dict(label_ids=jnp.array([0, 1, 1]), example_weights=jnp.array([1.0, 1.0, 0.0]))
  loss, m = ft.loss_fn("classification", logits, batch)
  want = optax.softmax_cross_entropy_with_integer_labels(logits[:2], batch["label_ids"][:2])
  assert float(loss) == pytest.approx(float(want.mean()), rel=1e-6)
  assert float(m["accuracy"]) == 1.0  # the wrong third row is padding
  loss, _ = ft.loss_fn("regression", jnp.array([[1.0], [2.0], [9.0]]),
                       dict(label_ids=jnp.array([1.5, 2.0, 0.0]), example_weights=batch[
                           "example_weights"]))
  assert float(loss) == pytest.approx(0.25 / 2)


def test_span_and_tagging_losses():
  start = jnp.log(jnp.array([[0.1, 0.7, 0.2], [0.5, 0.25, 0.25]]))
  end = jnp.log(jnp.array([[0.1, 0.2, 0.7], [0.5, 0.25, 0.25]]))
  batch = dict(start_positions=jnp.array([1, 0]), end_positions=jnp.array([2, 0]),
               example_weights=jnp.ones(2))
  loss, _ = ft.loss_fn("span", (start, end), batch)
  # google-research/bert: mean of the start and end cross-entropies.
  want = (-np.log(0.7) - np.log(0.7) - np.log(0.5) - np.log(0.5)) / 4
  assert float(loss) == pytest.approx(want, rel=1e-5)
  logits = jnp.zeros((1, 4, 3)).at[0, 1, 2].set(10.0)  # [B, T, L]
  batch = dict(label_ids=jnp.array([[0, 2, 1, 0]]),
               label_weights=jnp.array([[0.0, 1.0, 0.0, 0.0]]), example_weights=jnp.ones(1))
  loss, m = ft.loss_fn("tagging", logits, batch)  # only position 1 (a first piece) counts
  assert float(loss) < 1e-3 and float(m["accuracy"]) == 1.0


def test_build_task_and_primary_metric():
  c = finetune_config.get_config("custom")
  c.custom.labels = ("neg, pos",)
  task = ft.build_task(c)
  assert task.labels == ("neg", "pos") and ft.primary_metric(task) == "accuracy"
  c.custom.labels = ()
  with pytest.raises(TaskDataError, match="config.custom.labels is empty"):
    ft.build_task(c)
  c.custom.type = "regression"
  assert ft.build_task(c).is_regression
  c.custom.type = "ranking"
  with pytest.raises(TaskDataError, match="config.custom.type='ranking'"):
    ft.build_task(c)
  assert ft.primary_metric(ft.build_task(finetune_config.get_config("squad_v2"))) == "f1"
  assert ft.primary_metric(ft.build_task(finetune_config.get_config("cola"))) == "mcc"
  assert ft.primary_metric(ft.build_task(finetune_config.get_config("stsb"))) == "pearson"


def test_presets_follow_the_paper():
  c = finetune_config.get_config("glue_mnli")
  assert (c.batch_size, c.paper_num_train_epochs, c.warmup_proportion, c.max_seq_length) == (
      32, 3.0, 0.1, 128)
  assert 2e-5 <= c.paper_learning_rate <= 5e-5
  assert c.learning_rate is None and c.num_train_epochs is None  # picked for the model's size
  s = finetune_config.get_config("squad_v1,sweep")
  assert (s.max_seq_length, s.paper_num_train_epochs, s.doc_stride, s.max_query_length) == (
      384, 2.0, 128, 64)
  assert s.learning_rates == (5e-5, 4e-5, 3e-5, 2e-5)
  with pytest.raises(ValueError, match="unknown variant"):
    finetune_config.get_config("swag,fast")
  assert isinstance(finetune_config.get_config("conll03,runlocal"), ml_collections.ConfigDict)


def test_single_class_warning():
  import numpy as np
  from types import SimpleNamespace
  task = SimpleNamespace(type="classification", labels=("neg", "pos"))
  split = SimpleNamespace(name="dev", features={"label_ids": np.array([0, 1] * 40)})
  logits = lambda preds: {"logits": np.eye(2)[np.asarray(preds)]}  # noqa: E731
  assert ft.single_class_warning(task, split, logits([0] * 80)) == (
      "the classifier predicts one class ('neg') for all 80 dev examples")
  assert ft.single_class_warning(task, split, logits([0] * 79 + [1])) == (
      "the classifier predicts one class ('neg') for 79 of 80 dev examples")
  assert ft.single_class_warning(task, split, logits([0] * 70 + [1] * 10)) is None
  skewed = SimpleNamespace(name="dev", features={"label_ids": np.array([0] * 76 + [1] * 4)})
  assert ft.single_class_warning(task, skewed, logits([0] * 80)) is None  # the labels are too
  regression = SimpleNamespace(type="regression")
  assert ft.single_class_warning(regression, split, logits([0] * 80)) is None
