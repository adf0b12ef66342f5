"""A SIGTERM that arrives while a training run reads its input (a preemption notice, as a TPU VM
gets one): the loop saves a checkpoint at the step it is in and exits; the next run resumes.

Shared by the pre-training resume tests (train, families_train, electra, distil, batch_warmup,
gcs), which copied the same generator.
"""
import os
import signal

import numpy as np

from bert_jax.training import input_source


def sigterm_at_batch(monkeypatch, index):
  """input_source.make_batches sends this process SIGTERM while it yields stream batch `index`
  of a run that starts at batch 0 (a resumed run, starting later, is left alone). Returns a
  function that puts the real make_batches back.

  The index counts every batch train.py reads: it peeks at batches 0-3 before the loop installs
  its SIGTERM handler, and with records (not synthetic rows) the input watchdog's thread reads up
  to 2 batches ahead, so the first safe index is 4 (synthetic) or 6 (records)."""
  real = input_source.make_batches

  def killing_batches(*args, **kwargs):
    for i, b in enumerate(real(*args, **kwargs)):
      if kwargs["start_batch"] == 0 and i == index:
        os.kill(os.getpid(), signal.SIGTERM)
      yield b

  monkeypatch.setattr(input_source, "make_batches", killing_batches)
  return lambda: monkeypatch.setattr(input_source, "make_batches", real)


def preempted_and_resumed(monkeypatch, index, run):
  """(first, second): `run()` SIGTERMed at stream batch `index` (sigterm_at_batch), then `run()`
  again, which resumes from the checkpoint the first saved; the default SIGTERM handler restored.
  Asserts the first stopped early and the second ran to the end."""
  restore = sigterm_at_batch(monkeypatch, index)
  first = run()
  restore()
  second = run()
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  assert first["stopped_early"] and not second["stopped_early"]
  return first, second


def assert_same_losses(runs, reference, rtol=1e-5):
  """The train losses of `runs` in order (a preempted run and its resume) equal `reference`'s (an
  uninterrupted run's), step by step."""
  losses = lambda rs: [m["loss"] for r in rs for _, m in r["history"]["train"]]  # noqa: E731
  np.testing.assert_allclose(losses(runs), losses([reference]), rtol=rtol)
