"""TensorBoard event files for scalars and text (process 0 only; no-ops elsewhere)."""

import os


class MetricsWriter:
  """Writes `workdir/tensorboard/` event files with tf.summary (TF on CPU only)."""

  def __init__(self, workdir, enabled=True, subdir="tensorboard"):
    self.enabled = enabled
    self._writer = None
    if enabled:
      from data_pipelines.tf_setup import tf
      self._tf = tf
      self._writer = tf.summary.create_file_writer(os.path.join(workdir, subdir))

  def write_scalars(self, step, scalars):
    if not self._writer:
      return
    with self._writer.as_default():
      for k, v in scalars.items():
        self._tf.summary.scalar(k, float(v), step=int(step))
    self._writer.flush()

  def write_text(self, name, text, step=0):
    if not self._writer:
      return
    with self._writer.as_default():
      self._tf.summary.text(name, text, step=step)
    self._writer.flush()

  def close(self):
    if self._writer:
      self._writer.close()


def read_scalars(logdir):
  """{tag: [(step, value), ...]} from the event files in `logdir` (for tests and tools)."""
  from data_pipelines.tf_setup import tf
  out = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for v in event.summary.value:
        value = tf.make_ndarray(v.tensor) if v.HasField("tensor") else v.simple_value
        value = value.item() if getattr(value, "shape", None) == () else value
        out.setdefault(v.tag, []).append((event.step, value))
  return out
