"""bert_jax/cli.py: --help generated from the config files; console-script plumbing."""

import tests  # tests.ROOT: the repository, tests.DATA: tests/data
import importlib
import os
import re
import subprocess
import sys

import pytest

from bert_jax import cli

ROOT = tests.ROOT


def _help(*args):
  r = subprocess.run([sys.executable, "-m", *args, "--help"], cwd=ROOT, capture_output=True,
                     text=True, env=dict(os.environ, PYTHONPATH=ROOT, JAX_PLATFORMS="cpu"),
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stdout


def test_train_help_lists_presets_and_every_field_with_its_default_and_comment():
  out = _help("bert_jax.train")
  assert out.startswith("usage: python -m bert_jax.train --config=bert_jax/configs/pretrain.py:"
                        "PRESET[,VARIANT...] --workdir=DIR")
  assert "PRESET    a model size: tiny, mini, small, medium, base, large" in out  # the presets
  lines = out.splitlines()
  row = lambda flag: next(line for line in lines if line.strip().startswith(flag))  # noqa: E731
  assert row("--config.batch_size=256").split(None, 1)[1] == ("global, across all hosts and "
                                                              "devices")
  assert row("--config.learning_rate=0.0001")
  assert "phase 1: 90% of the paper's 1M steps" in row("--config.num_train_steps=900000")
  assert "Other flags:" in out and "--workdir: Checkpoints, TensorBoard" in out
  assert "Sections:" not in out  # train.py's notes for maintainers stay out of the help
  from bert_jax.configs import pretrain
  assert all(f"--config.{k}" in out for k in pretrain.get_config().keys())


def test_finetune_help_shows_the_chosen_presets_defaults():
  out = _help("bert_jax.finetune", "--config=bert_jax/configs/finetune.py:squad_v1")
  assert "--config.max_seq_length=384" in out and "--config.paper_learning_rate=3e-05" in out
  # The comment continued on its next line, after a column as wide as the longest flag.
  assert re.search(r"--config\.null_score_diff_threshold=0\.0 +v2: predict \"\" when null - best "
                   r"span > this; tune it with eval_results\.json's best_f1_thresh", out), out
  assert "glue_wnli squad_v1 squad_v2 conll03 swag custom" in out


def test_section_titles_are_not_field_comments(tmp_path):
  path = tmp_path / "c.py"
  path.write_text('"""Doc."""\nimport ml_collections\n\n\ndef get_config(arg="a"):\n'
                  '  c = ml_collections.ConfigDict()\n'
                  '  # Run.\n'
                  '  c.seed = 0\n'
                  '  # A comment that explains\n  # the next field.\n'
                  '  c.steps = 3\n'
                  '  c.sub = ml_collections.ConfigDict(dict(\n'
                  '      x=1,  # the x\n'
                  '  ))\n'
                  '  return c\n')
  out = cli.config_help(str(path))
  assert "  --config.seed=0\n" in out + "\n"
  assert "--config.steps=3  A comment that explains the next field." in out
  assert "--config.sub.x=1  the x" in out


# program -> (flag rows its --help must show, docstring text past the usage that must not show)
FLAG_PROGRAMS = {
    "bert_jax.predict": (["--top_k=5               Candidates per [MASK].",
                          "--init_checkpoint=None  Converted export"],
                         "The probabilities are a softmax"),
    "bert_jax.extract_features": (["--layers=-1,-2,-3,-4", "--pooling=concat",
                                   "--max_seq_length=128"], "Output (.npz, np.load"),
    "bert_jax.convert": (["--source=auto", "<auto|tf|hf|orbax>: Format of --input.",
                          "--seed=0"], "Every user error is one line"),
    "bert_jax.report": (["--output=None      PNG to write (default: WORKDIR/report.png).",
                         "--overwrite=false  Replace an existing --output"],
                        "Tags follow bert_jax.evaluation.metrics_writer's scheme"),
    "bert_jax.plan": (["--topology=None", "--search=false", "--config=None",
                       "--config.FIELD=VALUE"], "libtpu 0.0.42.1 segfaulted"),
    # data_pipelines' programs: the same help, from bert_jax_core (errors.run's default).
    "data_pipelines.build_vocab": (["--vocab_size=", "--lower_case=None", "--output=None"],
                                   "reservoir sampling"),
    "data_pipelines.create_pretraining_data": (["--dupe_factor=10", "--max_seq_length=128",
                                                "--num_shards=16"],
                                               "Masking is not done here"),
}


@pytest.mark.parametrize("program", sorted(FLAG_PROGRAMS))
def test_flag_programs_help_lists_their_flags_with_defaults_one_line_each(program):
  rows, left_out = FLAG_PROGRAMS[program]
  out = _help(program)
  lines = out.splitlines()
  assert lines[0] == f"usage: python -m {program} [--flag=VALUE ...]"
  module = importlib.import_module(program if program != "bert_jax.convert" else
                                   "bert_jax.convert.__main__")
  assert lines[2] == module.__doc__.strip().splitlines()[0]       # what the program does
  assert f"  python -m {program} " in out                          # how it is called
  flag_lines = lines[lines.index("Flags:") + 1:]
  for row in rows:
    assert any(row in line for line in flag_lines), (row, out)
  assert all(line.startswith("  --") for line in flag_lines)       # one line per flag
  assert left_out not in out                                       # details stay in the source
