"""A SIGTERM that arrives while a training run reads its input (a preemption notice, as a TPU VM
gets one): the loop saves a checkpoint at the step it is in and exits; the next run resumes.

Shared by the pre-training resume tests (train, families_train, electra, distil, batch_warmup,
gcs), which copied the same generator.
"""
import os
import signal

from bert_jax import input_source


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
