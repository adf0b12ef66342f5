"""One user-error base class and one CLI wrapper for every bert_jax / data_pipelines program.

A `UserError` is something the user can fix (a bad flag, a missing or corrupt file, a vocab or
checkpoint that does not match): every CLI prints it as ONE line on stderr and exits with code 2.
Anything else is a bug and keeps its traceback. Subclass `UserError` (per module, for `except`
clauses that need to be specific); never catch a broad built-in exception to produce one, and
never rewrite an error's text to rename a flag: say the right name where the error is raised.

  from bert_jax import errors
  def main(argv): ...
  if __name__ == "__main__":
    define_flags()
    errors.run(main)         # absl app.run + one-line user errors + exit code 2

What `run` turns into `error: ...` + exit code 2:
  - a `UserError` (or absl's `app.UsageError`) raised by main or by distributed start-up;
  - a flag absl cannot parse (unknown flag, bad value), where absl prints two lines and exits 1;
  - ml_collections config flags: a `--config=FILE` that does not exist, a `get_config` that
    raises a ValueError/TypeError (absl folds the traceback into its message: we keep the last
    line), and an override of a field the config does not have (`--config.learning_rat=1`, an
    AttributeError chained three times inside ml_collections).
"""

import os
import gc
import re
import sys

EXIT_USER_ERROR = 2


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


def run_main(main, argv, *, init_distributed=False):
  """Calls main(argv); a UserError or UsageError becomes one line on stderr and SystemExit(2).

  With init_distributed, `distributed.maybe_initialize_distributed()` runs first, inside the same
  handler, so a malformed BERT_JAX_* environment is a one-line error too.
  """
  from absl import app  # pylint: disable=g-import-not-at-top
  try:
    if init_distributed:
      from bert_jax import distributed  # pylint: disable=g-import-not-at-top
      distributed.maybe_initialize_distributed()
    return main(argv)
  except (UserError, app.UsageError) as e:
    line = format_error(e)
  # Exit outside the handler, after a collection: the error's traceback holds the frames of the
  # failed run, and with them live tf.data iterators whose tf.numpy_function stages (the packer)
  # deadlock if they are first destroyed during interpreter shutdown (seen: a user error raised
  # after the input pipeline started printed its line, then hung for good).
  gc.collect()
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


PACKAGED_CONFIGS = "bert_jax/configs/"


def _packaged_configs(argv, names):
  """argv with `--config=bert_jax/configs/X.py[:arg]` pointed at the installed package's copy when
  that relative path does not exist here (a pip-installed bert_jax run outside the repository)."""
  out = []
  for arg in argv:
    for name in names:
      prefix = f"--{name}={PACKAGED_CONFIGS}"
      if arg.startswith(prefix):
        rel, sep, rest = arg[len(f"--{name}="):].partition(":")
        if not os.path.isfile(rel):
          packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                                  rel[len(PACKAGED_CONFIGS):])
          if os.path.isfile(packaged):
            arg = f"--{name}={packaged}{sep}{rest}"
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


def parse_flags(argv, parser=None, help_config=None, program=None):
  """absl's flag parsing (or `parser(argv)`, e.g. known_only parsing) with one-line errors and
  exit code 2 (see the module docstring). With help_config (a config file), --help prints the
  help generated from that config (bert_jax.cli.print_config_help) and exits 0."""
  from absl import flags  # pylint: disable=g-import-not-at-top
  names = _config_flag_names(flags.FLAGS)
  if help_config:
    from bert_jax import cli  # pylint: disable=g-import-not-at-top
    if cli.wants_help(argv):
      others = [(n, flags.FLAGS[n].help) for n in ("workdir",) if n in flags.FLAGS]
      cli.print_config_help(argv, help_config, program or os.path.basename(argv[0]), others)
      sys.exit(0)
  argv = _packaged_configs(argv, names)
  _check_config_files(argv, names)
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


def run(main, *, init_distributed=False, flags_parser=None, help_config=None, program=None):
  """absl.app.run(main) with the user-error contract above (exit code 2, one line on stderr).

  flags_parser: optional `argv -> args` replacing `FLAGS(argv)` (e.g. known_only parsing for a
  program that forwards unknown flags); its flag errors get the same one-line treatment.
  help_config: the program's config file; its --help is generated from it (parse_flags).
  program: the command name shown in that help (default: argv[0]'s file name).
  """
  from absl import app  # pylint: disable=g-import-not-at-top

  def wrapped(argv):
    quiet_third_party_logs()
    return run_main(main, argv, init_distributed=init_distributed)

  app.run(wrapped, flags_parser=lambda argv: parse_flags(argv, flags_parser, help_config,
                                                         program))
