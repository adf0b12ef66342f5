"""The input watchdog: a stream that stops producing is an error naming its files, not a hang."""

import time

import pytest

from bert_jax_core import errors
from data_pipelines import input_watchdog


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
