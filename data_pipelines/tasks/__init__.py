"""Fine-tuning tasks' data: one module per data format, and `TASKS`, every named task.

  task type         module  tasks
  classification    glue    cola sst2 mrpc qqp mnli qnli rte wnli (+ glue.custom_task)
  regression        glue    stsb (+ glue.custom_task(labels=()))
  span              squad   squad_v1 squad_v2
  tagging           ner     conll03 (+ ner.custom_task)
  multiple_choice   swag    swag

Each task is a frozen dataclass with `name`, `type` (its task type: bert_jax/tasks/<type>.py,
which the fine-tuning loop looks up), `files` (split -> file under data_dir), `eval_splits` and
`metrics`; its module here reads its files, builds numpy features with a tokenizer from
`data_pipelines.tokenizers.tokenization.get_tokenizer`, and writes test predictions.
"""

from data_pipelines.tasks import glue
from data_pipelines.tasks import ner
from data_pipelines.tasks import squad
from data_pipelines.tasks import swag
from data_pipelines.tasks.common import TaskDataError

TASKS = {**glue.TASKS, **squad.TASKS, **ner.TASKS, **swag.TASKS}

def get_task(name):
  """The registered task called `name`, or a one-line error listing the names."""
  if name not in TASKS:
    raise TaskDataError(f"unknown task {name!r}; registered tasks: {', '.join(sorted(TASKS))} "
                        "(or a custom task built with glue.custom_task / ner.custom_task).")
  return TASKS[name]


__all__ = ["TASKS", "get_task", "TaskDataError", "glue", "ner", "squad", "swag"]
