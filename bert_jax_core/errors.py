"""One user-error base class and one CLI wrapper for every bert_jax / data_pipelines program.

A `UserError` is something the user can fix (a bad flag, a missing or corrupt file, a vocab or
checkpoint that does not match): every CLI prints it as ONE line on stderr and exits with code 2.
Anything else is a bug and keeps its traceback. Subclass `UserError` (per module, for `except`
clauses that need to be specific); never catch a broad built-in exception to produce one, and
never rewrite an error's text to rename a flag: say the right name where the error is raised.

  from bert_jax_core import errors
  def main(argv): ...
  if __name__ == "__main__":
    define_flags()
    errors.run(main)         # absl app.run + one-line user errors + exit code 2

This module imports no project module (it is the bottom layer): what a bert_jax program adds
(multi-host start-up, --help generated from its config, configs read from the installed package)
comes in as arguments, from `bert_jax.cli.run`.

What `run` turns into `error: ...` + exit code 2 (and a Ctrl-C outside a training loop into
"interrupted (Ctrl-C)" + exit code 130, no traceback):
  - a `UserError` (or absl's `app.UsageError`) raised by main or by `setup` (multi-host start-up);
  - a flag absl cannot parse (unknown flag, bad value), where absl prints two lines and exits 1;
  - ml_collections config flags: a `--config.FIELD=V` without `--config` ("--config is
    required"), a `--config=FILE` that does not exist, a `get_config` that
    raises a ValueError/TypeError (absl folds the traceback into its message: we keep the last
    line), and an override of a field the config does not have (`--config.learning_rat=1`, an
    AttributeError chained three times inside ml_collections).
"""

import os
import gc
import re
import sys

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C'd program


class UserError(ValueError):
  """An error the user can act on. Its message is one line: what, where, and the fix.

  It subclasses ValueError so that existing `except ValueError` callers keep working; CLIs catch
  UserError (never ValueError itself).
  """


def format_error(e) -> str:
  """`error: <message>` on one line (newlines in the message are folded)."""
  msg = " ".join(str(e).split("\n")).strip()
  return f"error: {msg}"


def fail(e) -> None:
  """Prints `error: <e>` on stderr and exits with code 2 (a UserError or a message)."""
  sys.stdout.flush()
  print(format_error(e), file=sys.stderr, flush=True)
  sys.exit(EXIT_USER_ERROR)


def run_main(main, argv, *, setup=None):
  """Calls main(argv); a UserError or UsageError becomes one line on stderr and SystemExit(2).

  setup: a no-argument callable run first, inside the same handler (bert_jax passes multi-host
  start-up, so a malformed BERT_JAX_* environment is a one-line error too).
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  try:
    if setup is not None:
      setup()
    return main(argv)
  except (UserError, app.UsageError) as e:
    line = format_error(e)
  except KeyboardInterrupt:
    # Ctrl-C outside a training loop (start-up, compiling, a second Ctrl-C while a step saves):
    # one line, not Python's traceback. Inside the loops Ctrl-C saves first
    # (distributed.PreemptionCheck) and main returns normally.
    line = None
  # Exit outside the handler, after a collection: the error's traceback holds the frames of the
  # failed run, and with them live tf.data iterators whose tf.numpy_function stages (the packer)
  # deadlock if they are first destroyed during interpreter shutdown (seen: a user error raised
  # after the input pipeline started printed its line, then hung for good).
  gc.collect()
  if line is None:
    sys.stdout.flush()
    print("interrupted (Ctrl-C)", file=sys.stderr, flush=True)
    sys.exit(EXIT_INTERRUPTED)
  fail(line[len("error: "):])


# ----------------------------------------------------------------------------------------------
# Flag parsing: absl's errors, and ml_collections config flags, as one line.
# ----------------------------------------------------------------------------------------------
def _config_flag_names(flag_values):
  """Names of the ml_collections config-file flags (`--config=FILE[:arg]`)."""
  try:
    # The parser class is public in its module (the package re-exports only the DEFINE_*s).
    from ml_collections.config_flags import config_flags  # pylint: disable=g-import-not-at-top
  except ImportError:
    return []
  return [name for name in flag_values
          if isinstance(flag_values[name].parser, config_flags.ConfigFileFlagParser)]


def _packaged_configs(argv, names, packaged):
  """argv with `--config=PREFIX/X.py[:arg]` pointed at `packaged[PREFIX]/X.py` when that relative
  path does not exist here (a pip-installed bert_jax run outside the repository: bert_jax.cli
  passes {"bert_jax/configs/": <the installed package's configs directory>})."""
  out = []
  for arg in argv:
    for name in names:
      for prefix_dir, directory in (packaged or {}).items():
        prefix = f"--{name}={prefix_dir}"
        if arg.startswith(prefix):
          rel, sep, rest = arg[len(f"--{name}="):].partition(":")
          if not os.path.isfile(rel):
            installed = os.path.join(directory, rel[len(prefix_dir):])
            if os.path.isfile(installed):
              arg = f"--{name}={installed}{sep}{rest}"
    out.append(arg)
  return out


def _check_config_files(argv, names):
  """A `--config=FILE[:arg]` naming a missing file: ml_collections would defer the IOError to
  the first attribute access (a traceback from inside main); say it now."""
  for arg in argv[1:]:
    for name in names:
      if arg.startswith(f"--{name}="):
        path = arg.split("=", 1)[1].split(":", 1)[0]
        if path and not os.path.isfile(path):
          fail(f"--{name}={path}: no such config file (e.g. "
               "bert_jax/configs/pretrain.py:tiny).")


def _check_overrides_have_config(argv, names, flag_values):
  """`--config.batch_size=8` without `--config=FILE`: absl only knows a config's fields once the
  file is given, and would say "Unknown command line flag 'config.batch_size'"; say what is
  missing instead."""
  for name in names:
    given = any(a in (f"--{name}", f"-{name}") or a.startswith((f"--{name}=", f"-{name}="))
                for a in argv[1:])
    overrides = [a.split("=", 1)[0] for a in argv[1:] if a.startswith(f"--{name}.")]
    if overrides and not given:
      fail(f"--{name} is required: {overrides[0]} sets a field of it. "
           f"{flag_values[name].help}")


def _unknown_override(argv, names, key_error):
  """(`--config.a.b` argument whose field the config lacks, ml_collections' hint) or None.

  ml_collections' message is "'field'" plus, for a near miss, a second line
  'Did you mean "learning_rate" instead of "learning_rat"?'.
  """
  text = key_error  # AttributeError(KeyError("'field'\nDid you mean ...")): unwrap to the text
  while isinstance(text, BaseException) and text.args:
    text = text.args[0]
  text = str(text)
  m = re.search(r"'?([^'\n]+)'?", text)
  missing = m.group(1) if m else ""
  hint = " ".join(line.strip() for line in text.splitlines()[1:] if line.strip())
  for arg in argv[1:]:
    for name in names:
      if arg.startswith(f"--{name}."):
        path = arg[len(name) + 3:].split("=", 1)[0]
        if missing and missing in path.split("."):
          return f"--{name}.{path}", hint
  return None


def wants_help(argv):
  return any(a in ("--help", "-h", "-?", "--helpshort") for a in argv[1:])


def parse_flags(argv, parser=None, *, print_help=None, packaged_configs=None):
  """absl's flag parsing (or `parser(argv)`, e.g. known_only parsing) with one-line errors and
  exit code 2 (see the module docstring).

  print_help: `(argv, flag_values) -> None`; when given, --help calls it and exits 0 (bert_jax's
    config-driven programs print the help generated from their config file).
  packaged_configs: {relative prefix: directory} for config files read from an installed package.
  """
  from absl import flags  # pylint: disable=g-import-not-at-top
  names = _config_flag_names(flags.FLAGS)
  if print_help is not None and wants_help(argv):
    print_help(argv, flags.FLAGS)
    sys.exit(0)
  argv = _packaged_configs(argv, names, packaged_configs)
  _check_config_files(argv, names)
  _check_overrides_have_config(argv, names, flags.FLAGS)
  try:
    return (parser or flags.FLAGS)(argv)
  except flags.Error as e:
    msg = str(e)
    if "Error whilst parsing config file" in msg:  # get_config raised; absl kept the traceback
      msg = [line for line in msg.splitlines() if line.strip()][-1].strip()
    fail(msg)
  except (AttributeError, KeyError) as e:
    # Only flag parsing runs here; ml_collections raises these for an unknown override field.
    found = _unknown_override(argv, names, e)
    if found is None:
      raise
    override, hint = found
    fail(f"{override}: the config has no such field; "
         + (hint.replace('"', "") if hint else "see the config file for the field names."))


# Third-party log messages that a user of our CLIs can do nothing about (each explained):
QUIET_LOG_MESSAGES = (
    # Orbax, on every load of a checkpoint without its optional checkpoint-level metadata file
    # (our params exports and older steps): the data is read and verified all the same.
    "Metadata file does not exist",
    # Orbax, when a save waits for the previous one: fine-tuning saves synchronously on purpose
    # (one resume state per epoch), so the wait is expected, not a misconfiguration.
    "Waiting for previous save to complete took",
)


class _QuietFilter:
  """A logging filter dropping QUIET_LOG_MESSAGES (matched on the message template's start)."""

  def filter(self, record):
    msg = record.msg if isinstance(record.msg, str) else ""
    return not msg.startswith(QUIET_LOG_MESSAGES)


def quiet_third_party_logs():
  """Installs the filter on absl's logger (Orbax logs through absl.logging); idempotent."""
  import logging  # pylint: disable=g-import-not-at-top
  logger = logging.getLogger("absl")
  if not any(isinstance(f, _QuietFilter) for f in logger.filters):
    logger.addFilter(_QuietFilter())


def run(main, *, setup=None, flags_parser=None, print_help=None, packaged_configs=None):
  """absl.app.run(main) with the user-error contract above (exit code 2, one line on stderr).

  setup: run before main inside the same handler (run_main).
  flags_parser: optional `argv -> args` replacing `FLAGS(argv)` (e.g. known_only parsing for a
  program that forwards unknown flags); its flag errors get the same one-line treatment.
  print_help, packaged_configs: see parse_flags. Without print_help, --help is generated from
    the program's own flags (flag_help.for_main), not absl's whole docstring and every flag.
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  from bert_jax_core import flag_help  # pylint: disable=g-import-not-at-top
  print_help = print_help or flag_help.for_main(main)

  def wrapped(argv):
    quiet_third_party_logs()
    return run_main(main, argv, setup=setup)

  app.run(wrapped, flags_parser=lambda argv: parse_flags(
      argv, flags_parser, print_help=print_help, packaged_configs=packaged_configs))
