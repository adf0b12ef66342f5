"""Fine-tuning task types, one module each (bert_jax/tasks/<name>.py), found by name in one table
(registry.py: the TaskType record and the lookups, re-exported here).

  from bert_jax import tasks
  tasks.get("span").loss(outputs, batch)        # what the loop's step computes
  tasks.of(task).evaluate(task, split, ...)     # a data task's type (task.type)

This package's __init__ imports the registry only: the task-type modules are loaded on the first
lookup (every module of the package, by pkgutil), so importing `bert_jax.tasks` imports no model.
"""

from bert_jax.tasks.registry import (REGISTRY, TaskType, get, named_tasks, names, of,  # noqa: F401
                                     recorded_type, register, resolve, unregister)
