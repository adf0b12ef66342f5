"""pyproject.toml: `pip install .` / `pip install -e .` give importable packages and console
scripts that run outside the repository; every script names a real program; a subset of the
test suite passes against the non-editable install."""

import os
import re
import subprocess
import sys
import sysconfig
import tomllib

import pytest

from bert_jax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject():
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
    return tomllib.load(f)


def test_console_scripts_name_programs_with_a_main():
  import importlib
  scripts = _pyproject()["project"]["scripts"]
  assert scripts["bert-jax-train"] == "bert_jax.cli:train"
  for name, target in scripts.items():
    module, attr = target.split(":")
    assert callable(getattr(importlib.import_module(module), attr)), name
    if name in cli.PROGRAMS:
      assert callable(importlib.import_module(cli.PROGRAMS[name][0]).main), name
  assert set(cli.PROGRAMS) <= set(scripts)


def test_gitignore_covers_the_readme_outputs():
  lines = open(os.path.join(ROOT, ".gitignore")).read().split()
  # ".venv", not ".venv/": a venv linked into a worktree or clone is a symlink, which ".venv/"
  # does not match (2026-11-29: one was committed, and a merge replaced the real venv with it).
  assert {"/hf/", "/ckpt/", ".venv", "*.egg-info/"} <= set(lines)


def _venv(path):
  """A fresh virtualenv that sees this environment's installed requirements (a .pth file), so
  installing bert-jax needs no network; returns its bin directory."""
  subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
  py = os.path.join(path, "bin", "python")
  purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                           check=True, capture_output=True, text=True).stdout.strip()
  with open(os.path.join(purelib, "deps.pth"), "w") as f:
    f.write(sysconfig.get_paths()["purelib"] + "\n")
  return os.path.join(path, "bin")


@pytest.mark.slow
@pytest.mark.parametrize("editable", [False, True])
def test_pip_install_then_the_cli_runs_outside_the_repository(tmp_path, editable):
  bindir = _venv(tmp_path / "venv")
  src = tmp_path / "src"  # a copy of the tree: the build writes build/ and *.egg-info into it
  subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", "-o", str(tmp_path / "t.tar"),
                  "HEAD"], check=True)
  src.mkdir()
  subprocess.run(["tar", "-xf", str(tmp_path / "t.tar"), "-C", str(src)], check=True)
  for rel in ("pyproject.toml", ".gitignore", "bert_jax/cli.py",
              "bert_jax_core/errors.py"):
    with open(os.path.join(ROOT, rel)) as f, open(src / rel, "w") as g:  # the working copy
      g.write(f.read())
  r = subprocess.run([os.path.join(bindir, "pip"), "install", "-q", "--no-build-isolation",
                      *(["-e"] if editable else []), str(src)],
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  away = tmp_path / "elsewhere"
  away.mkdir()
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  env["JAX_PLATFORMS"] = "cpu"
  r = subprocess.run([os.path.join(bindir, "python"), "-c",
                      "import bert_jax.train, data_pipelines.tokenizers.vocab, bert_jax; "
                      "print(bert_jax.__file__)"],
                     cwd=away, env=env, capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip().startswith(str(src) if editable else str(tmp_path / "venv"))
  # A console script, run elsewhere, reads the packaged config and trains two steps.
  workdir = away / "run"
  r = subprocess.run([os.path.join(bindir, "bert-jax-train"),
                      "--config=bert_jax/configs/pretrain.py:tiny,runlocal", f"--workdir={workdir}",
                      "--config.train_input_files=synthetic", "--config.num_train_steps=2",
                      "--config.warmup_steps=1", "--config.batch_size=8", "--config.seq_length=32",
                      "--config.max_predictions_per_seq=4", "--config.model.vocab_size=128"],
                     cwd=away, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  assert re.search(r"summary \(train\): finished: steps 0 -> 2 of 2", r.stdout), r.stdout
  assert (workdir / "summary.json").exists()
  # `python -m` keeps working with the installed package.
  r = subprocess.run([os.path.join(bindir, "python"), "-m", "bert_jax.checkpoint", "verify",
                      str(workdir)], cwd=away, env=env, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0 and "step 2: ok" in r.stdout, r.stdout + r.stderr[-3000:]
  if not editable:
    _installed_package_passes_tests(bindir, away, env)


# A few test files that exercise the installed package through its public entry points: the
# loss (objectives), the task heads on the model (heads_test), the configs read from the package
# and --help of every program (cli_test).
INSTALLED_SUBSET = ("tests/bert_jax/objectives/objectives_test.py", "tests/bert_jax/models/heads_test.py", "tests/bert_jax/cli_test.py")


def _installed_package_passes_tests(bindir, away, env):
  """The test suite against the NON-editable install: tests/ copied to a directory without the
  sources, so `import bert_jax` can only find the installed copy (checked inside pytest)."""
  import shutil  # pylint: disable=g-import-not-at-top
  shutil.copytree(os.path.join(ROOT, "tests"), away / "tests",
                  ignore=shutil.ignore_patterns("__pycache__"))
  assert not (away / "bert_jax").exists() and not (away / "data_pipelines").exists()
  (away / "tests" / "installed_check_test.py").write_text(
      "import bert_jax, bert_jax_core, data_pipelines\n\n"
      "def test_imports_come_from_the_installed_package():\n"
      "  for m in (bert_jax, bert_jax_core, data_pipelines):\n"
      f"    assert m.__file__.startswith({str(away.parent / 'venv')!r}), m.__file__\n")
  r = subprocess.run([os.path.join(bindir, "python"), "-m", "pytest", "-q", "-p",
                      "no:cacheprovider", "tests/installed_check_test.py", *INSTALLED_SUBSET],
                     cwd=away, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
  assert re.search(r"\d+ passed", r.stdout) and "failed" not in r.stdout, r.stdout[-2000:]
