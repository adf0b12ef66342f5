"""A watchdog on an input stream: no item for N minutes is an error naming the files, not a hang.

  batches = input_watchdog.stall_watchdog(batches, files, minutes=10, what="train_input_files")

tf.data cannot be interrupted: a stream that stops producing (a logical shard without records, a
filesystem that stops answering) would block `next()` for ever, the run silent at 80% CPU (issue
23, fault 1: killed after 36 min). Each item is read in a thread when the consumer asks for it
(nothing read ahead); the consumer waits at most `minutes`. No TensorFlow import here.
"""

import queue
import threading

from bert_jax_core import errors


class InputStallError(errors.UserError):
  pass


def stall_watchdog(batches, files, minutes, what="input"):
  """`batches`' items, each read in a thread when the consumer asks for it; none for `minutes` ->
  InputStallError naming the files. tf.data cannot be interrupted, so a stream that stops
  producing (a shard without records, a stuck filesystem) would otherwise hang the run silently.

  Nothing is read ahead: item i is read when the loop asks for item i, as without the watchdog,
  so a SIGTERM while batch i is read still lands at step i, and a finished loop leaves no thread
  pulling from its stream (a read-ahead thread kept reading a finished run's stream and delivered
  its test's SIGTERM to the next run in the same process)."""
  requests, replies = queue.Queue(), queue.Queue()

  def produce():
    it = iter(batches)
    while requests.get():                   # None: the consumer is done
      try:
        replies.put((True, next(it)))
      except StopIteration:
        replies.put((False, None))
        return
      except BaseException as e:  # pylint: disable=broad-except  (re-raised in the consumer)
        replies.put((None, e))
        return

  threading.Thread(target=produce, name="input-stall-watchdog", daemon=True).start()
  try:
    while True:
      requests.put(True)
      try:
        ok, item = replies.get(timeout=minutes * 60)
      except queue.Empty:
        shown = ", ".join(files[:3]) + (f" and {len(files) - 3} more" if len(files) > 3 else "")
        raise InputStallError(
            f"{what}: no batch for {minutes:g} minutes from {shown}; the records stopped "
            "producing batches (files without records, or storage that stopped answering): check "
            f"the files, or raise --config.input_stall_minutes if reading is that slow.") from None
      if ok is None:
        raise item
      if not ok:
        return
      yield item
  finally:
    requests.put(None)
