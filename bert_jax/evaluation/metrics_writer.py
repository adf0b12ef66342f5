"""TensorBoard event files, the end-of-run summary, and the one metric naming scheme.

Metric names (TensorBoard tags, summary.json, eval_results.json) are the same in both loops:
  train/<metric>           training-stream metrics: train/loss, train/learning_rate, ...
  eval/<metric>            pre-training's held-out set: eval/mlm_accuracy, eval/nsp_loss, ...
  eval/<split>/<metric>    fine-tuning's dev splits: eval/dev/accuracy, eval/dev_matched/f1, ...
`train/learning_rate` is the mean of the rates of the steps since the previous log line (so is
every train/ metric: loss, accuracy, grad_norm), not the rate of the logged step alone.

Scalars are written as `simple_value` summaries (TF1's scalar format), which both TensorBoard's
web UI and its Python API list: `EventAccumulator(dir).Tags()["scalars"]`. (tf.summary.scalar
writes tensors, which the accumulator lists under "tensors" only.)
"""

import json
import os
import re
import socket
import time

from bert_jax_core import files as files_lib

SUMMARY_NAME = "summary.json"


class MetricsWriter:
  """Writes `workdir/tensorboard/` event files (process 0 only; no-ops elsewhere).

  The events go through tensorboard's own record framing (tensorboard.summary.writer, the writer
  torch's SummaryWriter uses), not tf.summary: a run whose input needs no TensorFlow (synthetic
  batches, the pods and resumes of the tests) then never imports it, 8 of the 48 CPU s a 6-step
  electra-tiny run took on the 2-core box (cProfile, 2026-11-26). A gs:// workdir's file is
  opened through tf.io.gfile (bert_jax_core.files), as every remote path is.
  """

  _count = 0     # files opened by this process: two writers started in one second never collide

  def __init__(self, workdir, enabled=True, subdir="tensorboard"):
    self.enabled = enabled
    self._records = None
    if enabled:
      logdir = os.path.join(workdir, subdir)
      files_lib.makedirs(logdir)
      MetricsWriter._count += 1
      # TF's own name: events.out.tfevents.<seconds>.<host>.<pid>.<n>.v2 (TensorBoard lists any
      # file whose name holds "tfevents").
      name = (f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}."
              f"{os.getpid()}.{MetricsWriter._count}.v2")
      from tensorboard.summary.writer import record_writer  # pylint: disable=g-import-not-at-top
      self._records = record_writer.RecordWriter(files_lib.open_file(
          os.path.join(logdir, name), "wb"))
      self._write(file_version="brain.Event:2")

  def _write(self, **event):
    from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
    self._records.write(event_pb2.Event(wall_time=time.time(), **event).SerializeToString())
    self._records.flush()

  def write_scalars(self, step, scalars):
    if not self._records:
      return
    from tensorboard.compat.proto import summary_pb2  # pylint: disable=g-import-not-at-top
    self._write(step=int(step), summary=summary_pb2.Summary(value=[
        summary_pb2.Summary.Value(tag=k, simple_value=float(v)) for k, v in scalars.items()]))

  def write_text(self, name, text, step=0):
    """A text summary as tf.summary.text writes one (a string tensor, the "text" plugin)."""
    if not self._records:
      return
    from tensorboard.plugins.text import summary_v2  # pylint: disable=g-import-not-at-top
    self._write(step=int(step), summary=summary_v2.text_pb(name, text))

  def close(self):
    if self._records:
      self._records.close()
      self._records = None


def read_scalars(logdir):
  """{tag: [(step, value), ...]} from the event files in `logdir` (for tests and tools)."""
  from bert_jax_core.tf_setup import tf  # pylint: disable=g-import-not-at-top
  from tensorboard.compat.proto import event_pb2  # pylint: disable=g-import-not-at-top
  out = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(logdir, "events.out.tfevents.*"))):
    # The records read as TF's deprecation note says (tf.compat.v1.train.summary_iterator
    # printed 4 lines of it on stderr in every `bert_jax.report`).
    for record in tf.data.TFRecordDataset(path):
      event = event_pb2.Event.FromString(record.numpy())
      for v in event.summary.value:
        if v.HasField("tensor") and v.metadata.plugin_data.plugin_name == "text":
          continue
        value = tf.make_ndarray(v.tensor) if v.HasField("tensor") else v.simple_value
        value = value.item() if getattr(value, "shape", None) == () else value
        out.setdefault(v.tag, []).append((event.step, value))
  return out


def prefixed(prefix, metrics):
  """{prefix + name: float(value)}: e.g. prefixed("train/", {"loss": 1.0})."""
  return {f"{prefix}{k}": float(v) for k, v in metrics.items()}


def eval_tags(entry):
  """A fine-tuning history entry in the scheme above: a key "<split>/<metric>" written before
  the scheme (eval_results.json, resume checkpoints of older runs) becomes "eval/<split>/..."."""
  return {k if k in ("epoch", "step") or k.startswith("eval/") else f"eval/{k}": v
          for k, v in entry.items()}


# ----------------------------------------------------------------------------------------------
# The end-of-run summary: printed, and written as WORKDIR/summary.json, by both loops.
# ----------------------------------------------------------------------------------------------
class Clock:
  """Wall time of a run from its start (the summary's wall_time_sec)."""

  def __init__(self):
    self.t0 = time.time()

  def seconds(self):
    return time.time() - self.t0


def format_duration(seconds):
  seconds = int(round(seconds))
  h, rem = divmod(seconds, 3600)
  return f"{h}h{rem // 60:02d}m{rem % 60:02d}s" if h else f"{rem // 60}m{rem % 60:02d}s"


def summary_lines(summary):
  """The summary as the lines a run prints last (see write_summary for the fields)."""
  s = summary
  lines = [f"summary ({s['program']}): {s['status']}: steps {s['start_step']} -> "
           f"{s['final_step']} of {s['total_steps']} in {format_duration(s['wall_time_sec'])}"]
  if s.get("final_eval"):
    lines.append(f"  final eval (step {s.get('final_eval_step', s['final_step'])}): "
                 + ", ".join(f"{k} {v:.4f}" for k, v in s["final_eval"].items()
                             if isinstance(v, (int, float))))
  if s.get("pretrain_tflop") is not None:
    # A batch-size warmup's steps are smaller than the full one (gflop_per_step): its total
    # counts the rows it trained on (train_report.run_summary's trained_rows).
    steps = (f"{s['final_step']:,} steps x {s['gflop_per_step']:.3g} GFLOP" if s.get(
        "batch_warmup") is None else f"{s['final_step']:,} steps of a batch-size warmup (full "
        f"step {s['gflop_per_step']:.3g} GFLOP)")
    lines.append(f"  compute: {steps} = {s['pretrain_tflop']:.4g} TFLOP (analytic, "
                 "train.step_flops)")
  if s.get("sources"):   # a mixture's real tokens and epochs per source (input_source.py)
    total = max(sum(v["real_tokens"] for v in s["sources"].values()), 1)
    lines.append(f"  sources since step {s.get('sources_since_step', s['start_step'])}:")
    lines += [f"    {name}: {v['real_tokens']:,} real tokens "
              f"({100 * v['real_tokens'] / total:.1f}%; planned {100 * v['planned_share']:.1f}% "
              f"of rows), {v['epochs']:.2f} epoch(s)"
              + (" (repeated)" if v["epochs"] > 1 else "") for name, v in s["sources"].items()]
  for k, ph in enumerate(s.get("phases") or (), 1):   # config.phases: each phase's own tally
    rows = max(sum(v["rows"] for v in ph["sources"].values()), 1)
    lines.append(f"  phase {k} (steps {ph['steps'][0] + 1}-{ph['steps'][1]}, mask "
                 f"{100 * ph['mask']:g}%, {ph['sampling']}): " + (", ".join(
                     f"{name} {100 * v['rows'] / rows:.1f}% of rows (planned "
                     f"{100 * v['planned_share']:.1f}%), {v['real_tokens']:,} real tokens"
                     for name, v in ph["sources"].items()) if ph["sources"] and any(
                         v["rows"] for v in ph["sources"].values()) else "not reached"))
  if s.get("model"):
    lines.append(f"  model: {s['model']}")
  for k, v in (s.get("outputs") or {}).items():
    lines.append(f"  {k}: {v}")
  lines.append(f"  this summary: {os.path.join(s['workdir'], SUMMARY_NAME)}")
  if s.get("next"):
    lines.append("  next:")
    lines += [f"    {cmd}" for cmd in s["next"]]
  return lines


def write_summary(workdir, summary, *, is_main=True):
  """Prints the summary and writes it to WORKDIR/summary.json (process 0; atomically).

  Fields: program (train|finetune), status (finished|stopped_early|nothing_to_do), workdir,
  wall_time_sec, start_step, final_step, total_steps, final_eval ({tag: value}, the naming
  scheme above), final_eval_step, gflop_per_step and pretrain_tflop (train: the analytic FLOPs
  of one step and of all its steps so far), model (the path to load), outputs ({what: path}), next
  (commands to run next); a mixture's sources ({name: real_tokens, instances, epochs, rows,
  planned_share}) since sources_since_step, and under config.phases each phase's ([{steps, mask,
  sampling, sources: {name: rows, real_tokens, instances, planned_share}}]).
  """
  summary = dict(summary, workdir=workdir)
  if not is_main:
    return summary
  print("\n".join(summary_lines(summary)), flush=True)
  # Atomically: a stopped run's summary is replaced when it finishes.
  files_lib.write_atomic(f"{str(workdir).rstrip('/')}/{SUMMARY_NAME}",
                         json.dumps(summary, indent=2, sort_keys=True))
  return summary


def read_summary(workdir):
  """WORKDIR/summary.json as a dict, or None when the run never finished one. Its paths are
  this workdir's (reroot: a workdir copied elsewhere describes itself from where it is)."""
  from etils import epath  # pylint: disable=g-import-not-at-top
  path = epath.Path(workdir) / SUMMARY_NAME
  if not path.exists():
    return None
  summary = json.loads(path.read_text())
  return reroot(summary, summary.get("workdir"), workdir)


def reroot(value, recorded, workdir):
  """`value` (a summary's or a results file's strings, lists and dicts) with every path under
  the workdir it was written in (`recorded`: the workdir it records) moved under `workdir`,
  where it is read now: a finished workdir copied elsewhere and run again named the original's
  model, summary and next commands (issue 49). A path is the recorded workdir as a whole name
  (then '/' or the end of the name: runs/mrpc/best_epoch2, not runs/mrpc-ft), wherever it stands
  in a string (--init_checkpoint=runs/mrpc/best_epoch2). A file that records no workdir, or
  read where it was written, is returned as it is."""
  old, new = str(recorded or "").rstrip("/"), str(workdir).rstrip("/") or "/"
  if not old or old == new:
    return value
  name = r"\w.~+-"   # the characters of a path's name (a '/' ends one)
  pattern = re.compile(rf"(?<![{name}/]){re.escape(old)}(?![{name}])")

  def fix(v):
    if isinstance(v, str):
      return pattern.sub(lambda _: new, v)
    if isinstance(v, list):
      return [fix(x) for x in v]
    if isinstance(v, dict):
      return {k: fix(x) for k, x in v.items()}
    return v
  return fix(value)
