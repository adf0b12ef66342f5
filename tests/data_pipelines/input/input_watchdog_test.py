"""The input watchdog: a stream that stops producing is an error naming its files, not a hang."""

import time

import pytest

from bert_jax_core import errors
from data_pipelines.input import input_watchdog


def test_a_stalled_input_is_an_error_naming_the_files():
  def stalls():
    yield 1
    time.sleep(30)                                              # a stream that stopped
    yield 2
  it = input_watchdog.stall_watchdog(stalls(), ["a.tfrecord", "b.tfrecord"], minutes=0.01)
  assert next(it) == 1
  with pytest.raises(input_watchdog.InputStallError,
                     match=r"no batch for 0.01 minutes from a.tfrecord, b.tfrecord"):
    next(it)

  def fails():
    yield 1
    raise errors.UserError("bad record")     # errors pass through unchanged
  it = input_watchdog.stall_watchdog(fails(), ["a.tfrecord"], minutes=1)
  assert next(it) == 1
  with pytest.raises(errors.UserError, match="bad record"):
    next(it)


def test_nothing_is_read_ahead_of_the_consumer():
  """Item i is read when item i is asked for: a SIGTERM sent while a batch is read lands at that
  step, and a closed stream leaves no thread reading on (it once delivered a finished run's
  SIGTERM to the next run in the same process)."""
  read = []

  def counted():
    for i in range(10):
      read.append(i)
      yield i
  it = input_watchdog.stall_watchdog(counted(), ["a.tfrecord"], minutes=1)
  assert [next(it), next(it)] == [0, 1]
  time.sleep(0.2)                                        # a read-ahead thread would go on here
  assert read == [0, 1]
  it.close()
  time.sleep(0.2)
  assert read == [0, 1]
  assert list(input_watchdog.stall_watchdog(counted(), ["a"], minutes=1)) == list(range(10))
