"""Every CLI turns a user error into ONE line on stderr starting with `error:` and exit code 2.

Each program runs as a real subprocess (`python -m ...`) on one bad input chosen to fail early
(before any model is built). All of them start at once in a module fixture, so the whole file
costs about one TensorFlow + JAX start-up per core rather than one per program.

TensorFlow's and XLA's C++ runtimes write their own start-up log lines to stderr (`I0000 ...`,
`E0000 ... cuInit`, "WARNING: All log messages before absl::InitializeLog() ...") before Python
code runs; those are not ours and are left out before counting lines.
"""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = tests.ROOT
_CPP_LOG = re.compile(r"^([IWEF]\d{4} |WARNING: All log messages before absl::InitializeLog)")


def _two_layer_export(tmp):
  """A 2-layer BERT export with its vocab.txt: errors found after a checkpoint is loaded."""
  import shutil  # pylint: disable=g-import-not-at-top
  import jax  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import linen as nn  # pylint: disable=g-import-not-at-top
  from bert_jax.checkpoint import store as ckpt_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import model as model_lib  # pylint: disable=g-import-not-at-top
  from bert_jax.models import pretraining_heads  # pylint: disable=g-import-not-at-top
  from tests.testlib import tasks_testlib  # pylint: disable=g-import-not-at-top
  vocab = tasks_testlib.write_vocab(tmp, "the cat sat on the mat . a dog ran")
  with open(vocab) as f:
    size = len(f.read().splitlines())
  cfg = model_lib.get_bert_config("tiny", vocab_size=size, hidden_size=32, num_heads=2,
                                  intermediate_size=64, num_layers=2, max_position_embeddings=32)
  params = jax.tree.map(np.asarray, nn.unbox(pretraining_heads.init_params(cfg,
                                                                           jax.random.PRNGKey(0))))
  export = os.path.join(tmp, "export")
  ckpt_lib.save_params(export, params, cfg, meta={"do_lower_case": True})
  shutil.copyfile(vocab, os.path.join(export, "vocab.txt"))
  return export


def _cases(tmp):
  """name -> (argv after `python -m`, regex the error line must match)."""
  nope = os.path.join(tmp, "does-not-exist")
  export = _two_layer_export(tmp)
  cases = {
      "predict": (["bert_jax.predict", f"--init_checkpoint={nope}", "fill-mask", "a [MASK] ."],
                  rf"^error: --init_checkpoint={re.escape(nope)}: no such file"),
      "predict_unknown_flag": (["bert_jax.predict", "--checkpoint=x", "fill-mask", "a"],
                               r"^error: Unknown command line flag 'checkpoint'"),
      "extract_features": (["bert_jax.extract_features", "--input_file=in.txt",
                            "--output_file=out.npz", f"--init_checkpoint={nope}",
                            "--max_seq_length=0"],
                           r"^error: --max_seq_length=0: must be at least 3"),
      # After the checkpoint is loaded (Orbax's INFO logs must not reach stderr either).
      "extract_features_layers": (["bert_jax.extract_features", "--input_file=in.txt",
                                   "--output_file=out.npz", f"--init_checkpoint={export}",
                                   "--layers=-1,-3"],
                                  r"^error: --layers=-1,-3: the model has 2 layers"),
      "convert": (["bert_jax.convert", f"--input={nope}", f"--output={tmp}/out"],
                  rf"^error: --input={re.escape(nope)}: no such directory"),
      "report": (["bert_jax.report", nope], rf"^error: {re.escape(nope)}: no such directory"),
      "checkpoint_verify": (["bert_jax.checkpoint", "verify", nope],
                            rf"^error: .*{re.escape(nope)}"),
      "build_vocab": (["data_pipelines.build_vocab", f"--input_file={nope}/*.txt",
                       f"--output={tmp}/new/vocab.txt", "--vocab_size=100"],
                      rf"^error: --input_file={re.escape(nope)}/\*\.txt"),
      "create_pretraining_data": (["data_pipelines.create_pretraining_data",
                                   f"--input_file={nope}/*.txt", f"--output_dir={tmp}/records",
                                   f"--vocab_file={nope}/vocab.txt"],
                                  rf"^error: .*{re.escape(nope)}"),
      "tokenize": (["data_pipelines.tokenize", f"--vocab_file={nope}.txt"],
                   rf"^error: --vocab_file={re.escape(nope)}\.txt: no such file"),
      "stdlib_corpus": (["data_pipelines.stdlib_corpus", "--num_files=many"],
                        r"^error: flag --num_files=many"),
      "local_pod": (["launch.local_pod", "--num_processes=2"],
                    r"^error: no module to run: pass it after `--`"),
      "plan": (["bert_jax.plan", "--config=bert_jax/configs/pretrain.py:tiny", "--topology=v3-8"],
               r"^error: --topology='v3-8': not a TPU slice name of v4, v5e, v5p, v6e"),
      "pod_check": (["launch.pod_check", "--global_batch=3"],
                    r"^error: --global_batch=3: must divide by 1 processes and 8 devices"),
  }
  if os.path.exists(os.path.join(ROOT, "data_pipelines", "beam_pipeline.py")):
    cases["beam_pipeline"] = (["data_pipelines.beam_pipeline", f"--input_file={nope}/*.txt",
                               f"--output_dir={tmp}/beam", f"--vocab_file={nope}/vocab.txt"],
                              rf"^error: .*{re.escape(nope)}")
  # The trainers: a misspelt config field and a missing config file, both at flag parsing.
  cases["train"] = (["bert_jax.train", "--config=bert_jax/configs/pretrain.py:tiny",
                     "--config.learning_rat=1", f"--workdir={tmp}/run"],
                    r"^error: --config\.learning_rat: the config has no such field; "
                    r"Did you mean learning_rate")
  cases["finetune"] = (["bert_jax.finetune", "--config=bert_jax/configs/nope.py:glue_mrpc",
                        f"--workdir={tmp}/ft"],
                       r"^error: --config=bert_jax/configs/nope\.py: no such config file")
  return cases


@pytest.fixture(scope="module")
def results(tmp_path_factory):
  tmp = str(tmp_path_factory.mktemp("cli"))
  with open(os.path.join(tmp, "in.txt"), "w") as f:
    f.write("a line\n")
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT,
             XLA_FLAGS="--xla_force_host_platform_device_count=8")
  for name in ("BERT_JAX_COORDINATOR", "BERT_JAX_NUM_PROCESSES", "BERT_JAX_PROCESS_ID"):
    env.pop(name, None)
  # At most 4 at once: each start-up holds TensorFlow + JAX (~0.5 GB) on a shared machine.
  pending, running, out, start = list(_cases(tmp).items()), {}, {}, time.monotonic()
  while pending or running:
    while pending and len(running) < 4:
      name, (argv, pattern) = pending.pop(0)
      running[name] = (subprocess.Popen(
          [sys.executable, "-m", *argv], cwd=tmp if name.startswith("extract_features") else ROOT,
          env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
          text=True), pattern)
    name = next(iter(running))
    p, pattern = running.pop(name)
    stdout, stderr = p.communicate(timeout=300)
    out[name] = (p.returncode, stdout, stderr, pattern)
  print(f"{len(out)} CLIs in {time.monotonic() - start:.1f} s")
  return out


def _python_lines(stderr):
  return [l for l in stderr.splitlines() if l.strip() and not _CPP_LOG.match(l)]


def test_every_cli_is_covered(results):
  assert {"predict", "extract_features", "convert", "build_vocab", "create_pretraining_data",
          "tokenize", "local_pod", "pod_check"} <= set(results)


@pytest.mark.parametrize("name", [
    "predict", "predict_unknown_flag", "extract_features", "extract_features_layers", "convert",
    "checkpoint_verify",
    "build_vocab", "create_pretraining_data", "tokenize", "stdlib_corpus", "local_pod",
    "pod_check", "plan", "beam_pipeline", "train", "finetune"])
def test_one_line_error_and_exit_code_2(results, name):
  if name not in results:
    pytest.skip(f"{name}: not wired in this checkout")
  rc, stdout, stderr, pattern = results[name]
  lines = _python_lines(stderr)
  assert "Traceback" not in stderr, stderr[-3000:]
  assert len(lines) == 1, f"{name}: expected one stderr line, got:\n" + "\n".join(lines[-20:])
  assert re.search(pattern, lines[0]), lines[0]
  assert rc == 2, (rc, lines[0])


def test_run_main_turns_user_errors_into_one_line_and_exit_2(capsys):
  from bert_jax_core import errors

  def main(argv):
    raise errors.UserError(f"--{argv[1]}=x: bad\nvalue")

  with pytest.raises(SystemExit) as e:
    errors.run_main(main, ["prog", "flag"])
  assert e.value.code == 2
  assert capsys.readouterr().err == "error: --flag=x: bad value\n"

  def bug(argv):
    raise ValueError("a bug, not a user error")

  with pytest.raises(ValueError, match="a bug"):  # keeps its traceback
    errors.run_main(bug, ["prog"])


def test_unknown_config_override_is_named_with_the_hint():
  from bert_jax_core import errors
  inner = KeyError("'learning_rat'\nDid you mean \"learning_rate\" instead of \"learning_rat\"?")
  found = errors._unknown_override(  # pylint: disable=protected-access
      ["prog", "--config=c.py", "--config.learning_rat=1"], ["config"], AttributeError(inner))
  assert found == ("--config.learning_rat",
                   'Did you mean "learning_rate" instead of "learning_rat"?')
  assert errors._unknown_override(  # pylint: disable=protected-access
      ["prog", "--config.lr=1"], ["config"], KeyError("other")) is None
