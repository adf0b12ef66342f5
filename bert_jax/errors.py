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
"""

import sys

EXIT_USER_ERROR = 2


class UserError(ValueError):
  """An error the user can act on. Its message is one line: what, where, and the fix.

  It subclasses ValueError so that existing `except ValueError` callers keep working; CLIs catch
  UserError (never ValueError itself).
  """


def format_error(e: BaseException) -> str:
  """`error: <message>` on one line (newlines in the message are folded)."""
  msg = " ".join(str(e).split("\n")).strip()
  return f"error: {msg}"


def run_main(main, argv):
  """Calls main(argv); a UserError becomes one line on stderr and SystemExit(2)."""
  try:
    return main(argv)
  except UserError as e:
    print(format_error(e), file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)


def run(main, **absl_kwargs):
  """absl.app.run(main) with the user-error contract above.

  Flag parsing errors (unknown flag, bad value) are absl's: one usage line and exit code 1 from
  absl is replaced by exit code 2 here so that every user error has the same code.
  """
  from absl import app

  def wrapped(argv):
    return run_main(main, argv)

  try:
    app.run(wrapped, **absl_kwargs)
  except app.UsageError as e:  # raised by main before app.run's own handler in some absl paths
    print(format_error(e), file=sys.stderr, flush=True)
    sys.exit(EXIT_USER_ERROR)
