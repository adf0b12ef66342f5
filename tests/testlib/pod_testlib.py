"""Shared by the tests that start a 2-host pod on localhost with `launch.local_pod`."""

import re
import sys

# A line a library printed, not the program (issue 32; the sources are named in launch/local_pod.py
# and bert_jax/parallel/distributed.py): gloo's `[Gloo] Rank 0 is connected to 7 peer ranks. ...`, an INFO
# record in absl's format (Python's `I1126 03:22:29.129541 1398... distributed.py:172] Connecting
# to JAX distributed service ...`, C++'s `I0000 00:00:1764...`) or in Python logging's or JAX's
# (`INFO:...`). Each may follow the launcher's `[pN] ` prefix.
_LIBRARY_LINE = re.compile(r"(\[p\d+\] )?(I\d{4} \d\d:\d\d:\d+\.\d+ |INFO:)")


# BERT-tiny on synthetic batches through bert_jax.train: the cheapest real run with a train step
# and a checkpoint (a test adds its warmup, steps and checkpoint flags).
TINY_SYNTHETIC_TRAIN = [
    "bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny,runlocal",
    "--config.train_input_files=synthetic", "--config.model.vocab_size=512",
    "--config.seq_length=32", "--config.max_predictions_per_seq=6", "--config.batch_size=16",
    "--config.log_every=1", "--config.async_checkpointing=False",
]


def library_lines(text):
  """The lines of `text` that libraries printed (see _LIBRARY_LINE); [] for a quiet run."""
  # "peer ranks": the tail of a gloo line another thread's copy cut in two (local_pod._GLOO_PIECES).
  return [l for l in text.splitlines()
          if "[Gloo]" in l or "peer ranks" in l or _LIBRARY_LINE.match(l)]


def pod_command(num_processes=2, devices_per_process=4):
  """The launcher's command line up to its `--`.

  The launcher's 10 s heartbeat catches a dead peer fast (tests/launch/local_pod_test.py tests that
  path); here a peer starved of CPU for 10 s on a shared 2-core box must not read as dead.
  """
  return [sys.executable, "-m", "launch.local_pod", f"--num_processes={num_processes}",
          f"--devices_per_process={devices_per_process}", "--heartbeat_timeout_seconds=60"]


def failure(r):
  """What a failed pod printed, without the interpreter's extension-module lists of an abort
  (which fill the tail and hide the cause): the fatal lines first, then the last 60 lines."""
  lines = [l for l in (r.stdout + r.stderr).splitlines() if "Extension modules" not in l]
  fatal = [l for l in lines if any(k in l for k in ("F0000", "Fatal", "Error", "error:",
                                                     "Check failed", "DEADLINE", "UNAVAILABLE"))]
  return "\n".join(fatal[:40] + ["--- last lines ---"] + lines[-60:])
