"""A watchdog on an input stream: no item for N minutes is an error naming the files, not a hang.

  batches = input_watchdog.stall_watchdog(batches, files, minutes=10, what="train_input_files")

tf.data cannot be interrupted: a stream that stops producing (a logical shard without records, a
filesystem that stops answering) would block `next()` for ever, the run silent at 80% CPU (issue
23, fault 1: killed after 36 min). The stream is read one item ahead in a thread; the consumer
waits at most `minutes`. No TensorFlow import here.
"""

import queue
import threading

from bert_jax_core import errors


class InputStallError(errors.UserError):
  pass


def stall_watchdog(batches, files, minutes, what="input"):
  """`batches`' items, read one ahead in a thread; none for `minutes` -> InputStallError naming
  the files. tf.data cannot be interrupted, so a stream that stops producing (a shard without
  records, a stuck filesystem) would otherwise hang the run without a word."""
  q, stop = queue.Queue(maxsize=1), threading.Event()

  def produce():
    try:
      for item in batches:
        while not stop.is_set():
          try:
            q.put((True, item), timeout=1.0)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
      q.put((False, None))
    except BaseException as e:  # pylint: disable=broad-except  (re-raised in the consumer)
      q.put((None, e))

  threading.Thread(target=produce, name="input-stall-watchdog", daemon=True).start()
  try:
    while True:
      try:
        ok, item = q.get(timeout=minutes * 60)
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
    stop.set()
