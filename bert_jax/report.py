r"""Look at a run: its curves as a PNG and its summary as a table.

  python -m bert_jax.report runs/quickstart/workdir            # -> WORKDIR/report.png
  python -m bert_jax.report runs/mrpc --output=mrpc.png

Reads the TensorBoard event files of a pre-training or fine-tuning workdir (WORKDIR/tensorboard)
and draws four panels: loss, accuracy (and the other eval scores), learning rate, throughput.
Then prints the run's summary.json (what it did, the final evaluation, where the model is, the
next commands) and the last value of every scalar. Tags follow bert_jax.evaluation.metrics_writer's scheme:
train/<metric>, eval/<metric>, eval/<split>/<metric>.
"""

import os

from absl import flags

from bert_jax import cli
from bert_jax_core import errors
from bert_jax_core import files as files_lib
from bert_jax.evaluation import metrics_writer


class ReportError(errors.UserError):
  pass


# Panel title -> which tags it draws (a tag goes to the first panel that claims it).
PANELS = (
    ("loss", lambda t: t.endswith("loss")),
    ("accuracy and eval scores", lambda t: (t.startswith("eval/") or t.endswith("accuracy"))
     and not t.endswith("real_token_fraction")),  # (a property of the data, not a score)
    ("learning rate", lambda t: t == "train/learning_rate"),
    ("throughput (sequences/s)", lambda t: t == "train/sequences_per_sec"),
)


def load(workdir):
  """({tag: [(step, value)]}, summary dict or None) of a workdir; a one-line error if empty."""
  logdir = os.path.join(workdir, "tensorboard")
  if os.path.exists(workdir) and not os.path.isdir(workdir):   # was "no such directory"
    raise ReportError(f"{workdir}: is a file, not a directory; pass a pre-training or "
                      "fine-tuning --workdir (the folder that holds tensorboard/).")
  if not os.path.isdir(workdir):
    raise ReportError(f"{workdir}: no such directory; pass a pre-training or fine-tuning "
                      "--workdir.")
  parent = os.path.dirname(os.path.normpath(workdir))
  if (not os.path.isdir(logdir) and os.path.basename(os.path.normpath(workdir)) in
      ("checkpoints", "tensorboard") and os.path.isdir(os.path.join(parent, "tensorboard"))):
    # A folder inside the workdir (issue 49 item 7): name the workdir itself.
    raise ReportError(f"{workdir}: is a folder inside the run's workdir; pass the workdir "
                      f"itself: python -m bert_jax.report {parent}")
  scalars = metrics_writer.read_scalars(logdir) if os.path.isdir(logdir) else {}
  scalars = {k: sorted(v) for k, v in scalars.items()
             if v and all(isinstance(x, (int, float)) for _, x in v)}
  if not scalars:
    raise ReportError(f"{workdir}: no scalars in {logdir}; is it the --workdir of a run that "
                      "logged at least one step?")
  return scalars, metrics_writer.read_summary(workdir)


def draw(scalars, output, title):
  """The four panels as one PNG at `output`; returns {panel: [tags drawn]}."""
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")  # files only, no display
  from matplotlib import pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(2, 2, figsize=(12, 8))
  drawn, claimed = {}, set()
  for ax, (name, wants) in zip(axes.flat, PANELS):
    tags = [t for t in sorted(scalars) if t not in claimed and wants(t)]
    claimed.update(tags)
    for t in tags:
      steps, values = zip(*scalars[t])
      ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=t)
    ax.set_title(name)
    ax.set_xlabel("optimizer step")
    ax.grid(alpha=0.3)
    if tags:
      ax.legend(fontsize=7)
    else:
      ax.text(0.5, 0.5, "not logged", ha="center", va="center", transform=ax.transAxes)
    drawn[name] = tags
  fig.suptitle(title)
  fig.tight_layout()
  # format="png": the file is `output` exactly (matplotlib appends ".png" to a name without an
  # extension, and wrote <dir>.png for an existing directory); renamed into place when complete.
  with files_lib.atomic_path(output) as tmp:
    fig.savefig(tmp, dpi=100, format="png")
  plt.close(fig)
  return drawn


def table(scalars):
  """The last value of every scalar, one line each."""
  width = max(len(t) for t in scalars)
  lines = [f"{'scalar':<{width}}  {'step':>8}  last value"]
  for t in sorted(scalars):
    step, value = scalars[t][-1]
    lines.append(f"{t:<{width}}  {step:>8}  {value:.6g}")
  return lines


FLAGS = flags.FLAGS


def define_flags():
  flags.DEFINE_string("output", None, "PNG to write (default: WORKDIR/report.png).")
  flags.DEFINE_bool("overwrite", False, "Replace an existing --output (without it: refused).")


def check_output_name(output):
  """The report is always a PNG: another extension got PNG bytes silently (curves.pdf, .txt)."""
  if not output.lower().endswith(".png"):
    stem = os.path.splitext(output)[0]
    raise ReportError(f"--output={output}: the report is a PNG image; name a .png file (e.g. "
                      f"--output={stem}.png).")


def main(argv):
  if len(argv) != 2:
    raise ReportError("usage: python -m bert_jax.report WORKDIR [--output=curves.png]")
  workdir = argv[1]
  output = FLAGS.output or os.path.join(workdir, "report.png")
  if FLAGS.output:   # the one output check, before the event files are read
    files_lib.check_output_file(output, "--output", overwrite=FLAGS.overwrite)
    check_output_name(output)   # (after: a directory is named one, not "not a .png")
  scalars, summary = load(workdir)
  if not FLAGS.output:   # (the workdir exists now: load said so) the run's own file, redrawn
    files_lib.check_output_file(output, "--output", overwrite=True)
  drawn = draw(scalars, output, title=workdir)
  if summary:
    print("\n".join(metrics_writer.summary_lines(summary)))
  else:
    print(f"{workdir}: no summary.json (the run has not finished)")
  print("\n".join(table(scalars)))
  print(f"wrote {output} ({', '.join(f'{k}: {len(v)}' for k, v in drawn.items())} curves)")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
