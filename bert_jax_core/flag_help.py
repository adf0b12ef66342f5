"""`--help` of a flag-driven program, generated from its flags: what a user needs, one screen.

  usage: python -m data_pipelines.build_vocab [--flag=VALUE ...]

  <the module docstring's first line>
    <the indented example command right below it>

  Flags:
    --flag=DEFAULT  its help, on one line

The rest of the docstring (details, notes for maintainers) stays in the source and the docs.
`errors.run` answers --help this way for every program that passes no help of its own
(bert_jax's config-driven programs generate theirs from the config file: bert_jax/cli.py).
"""

import os
import sys


def program_name(argv):
  """`python -m pkg.mod` under python -m, else the script's name (e.g. bert-jax-predict)."""
  spec = getattr(sys.modules["__main__"], "__spec__", None)
  name = getattr(spec, "name", "") or ""
  if name and name != "__main__":
    return f"python -m {name.removesuffix('.__main__')}"
  return os.path.basename(argv[0])


def _usage(doc):
  """The docstring's first line and the indented example block that follows it."""
  lines = (doc or "").strip("\n").splitlines()
  if not lines:
    return []
  out, started = [lines[0].strip(), ""], False
  for line in lines[1:]:
    if not line.strip():
      if started:
        break
      continue
    if not line.startswith((" ", "\t")):
      break
    started = True
    out.append(line.rstrip())
  return out if started else out[:1]


def _flag_default(flag):
  if flag.default is None:
    return "None"
  if isinstance(flag.default, bool):
    return "true" if flag.default else "false"
  if isinstance(flag.default, (list, tuple)):
    return ",".join(str(x) for x in flag.default)
  return str(flag.default)


def flags_help(doc, program_flags, program):
  """--help of a flag-driven program: usage, then `--flag=DEFAULT  help` one line each."""
  out = [f"usage: {program} [--flag=VALUE ...]", ""] + _usage(doc) + ["", "Flags:"]
  rows = []
  for flag in sorted(program_flags, key=lambda f: f.name):
    text = " ".join((flag.help or "").split())   # (absl puts an enum's choices first: "<a|b>: ")
    if flag.name == "config":   # a config file: its fields are --config.FIELD overrides
      text += (" Override any field with --config.FIELD=VALUE; `python -m bert_jax.train --help` "
               "lists the fields with their defaults.")
    rows.append((f"--{flag.name}=" + _flag_default(flag), text))
  width = min(max((len(f) for f, _ in rows), default=0), 36)
  out += [f"  {f:<{width}}  {t}" for f, t in rows]
  out.append("  --verbosity=N: absl logging level (default: warnings only); --helpfull: every flag")
  return "\n".join(out)


def for_main(main, program=None):
  """The `print_help(argv, flag_values)` of the program whose entry point is `main`."""

  def print_help(argv, flag_values):
    # The program's own flags: under `python -m` absl files them under argv[0] (__main__), under
    # a console script or an imported `_module.main` under the module that defined them.
    owner = argv[0] if main.__module__ == "__main__" else main.__module__
    program_flags = flag_values.get_flags_for_module(owner)
    if not program_flags:   # flags defined by a module it builds on (beam_pipeline: cpd's)
      package = main.__module__.split(".")[0]
      program_flags = [f for module, fs in flag_values.flags_by_module_dict().items()
                       if module.startswith(package + ".") for f in fs]
    print(flags_help(sys.modules["__main__"].__doc__, program_flags,
                     program or program_name(argv)))
  return print_help
