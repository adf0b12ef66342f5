"""Console scripts (`pip install .` puts them on PATH): each runs a program exactly as
`python -m <module>` does (its flags, then errors.run with one-line user errors, exit code 2).

  bert-jax-train --config=bert_jax/configs/pretrain.py:tiny,runlocal --workdir=runs/tiny ...
  bert-jax-predict --init_checkpoint=runs/tiny fill-mask "The man went to the [MASK] ."

A `--config=bert_jax/configs/<file>.py[:arg]` that does not exist under the current directory
(outside a clone of the repository) is read from the installed package.

`run` is how every bert_jax program ends (`python -m` and console script alike):
bert_jax_core.errors.run plus what only bert_jax has: multi-host start-up, --help generated
from the config file, and configs read from the installed package.
"""

import importlib
import os
import sys

# console-script name -> (module, init_distributed). The modules import nothing heavy at the top
# beyond what their program needs; `--help` is answered before any model or data work.
# Programs whose options are a config file: their --help is generated from it (print_config_help).
CONFIG_HELP = {"bert_jax.train": "bert_jax/configs/pretrain.py",
               "bert_jax.finetune": "bert_jax/configs/finetune.py"}

PROGRAMS = {
    "bert-jax-train": ("bert_jax.train", True),
    "bert-jax-finetune": ("bert_jax.finetune", True),
    "bert-jax-predict": ("bert_jax.predict", False),
    "bert-jax-extract-features": ("bert_jax.extract_features", False),
    "bert-jax-convert": ("bert_jax.convert.__main__", False),
    "bert-jax-export-serving": ("bert_jax.export_serving", False),
    "bert-jax-report": ("bert_jax.report", False),
    "bert-jax-plan": ("bert_jax.plan", False),
    "bert-jax-mine": ("bert_jax.mine", True),
    "bert-jax-build-vocab": ("data_pipelines.build_vocab", False),
    "bert-jax-create-pretraining-data": ("data_pipelines.create_pretraining_data", False),
    "bert-jax-stdlib-corpus": ("data_pipelines.stdlib_corpus", False),
}


def run(main, *, init_distributed=False, help_config=None, program=None, flags_parser=None):
  """bert_jax_core.errors.run(main) for a bert_jax program.

  init_distributed: join the JAX distributed system first (distributed.py), inside the one-line
    error handler, so a malformed BERT_JAX_* environment is a one-line error too.
  help_config: the program's config file; its --help is generated from it (print_config_help).
  program: the command name shown in that help (default: argv[0]'s file name).
  """
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  from bert_jax_core import flag_help  # pylint: disable=g-import-not-at-top
  setup = None
  if init_distributed:
    def setup():
      from bert_jax.parallel import distributed  # pylint: disable=g-import-not-at-top  (imports jax)
      distributed.maybe_initialize_distributed()
  if help_config:
    def print_help(argv, flag_values):
      others = [(n, flag_values[n].help) for n in ("workdir",) if n in flag_values]
      print_config_help(argv, help_config, program or flag_help.program_name(argv), others)
  else:
    print_help = flag_help.for_main(main, program)
  errors.run(main, setup=setup, flags_parser=flags_parser, print_help=print_help,
             packaged_configs={PACKAGED_CONFIGS: _CONFIGS_DIR})


# `--config=bert_jax/configs/X.py` outside a clone of the repository: the installed package's copy.
PACKAGED_CONFIGS = "bert_jax/configs/"
_CONFIGS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")


def run_program(name):
  module_name, init_distributed = PROGRAMS[name]
  from absl import flags  # pylint: disable=g-import-not-at-top
  module = importlib.import_module(module_name)
  if hasattr(module, "prepare_environment"):   # before JAX starts (plan: on the CPU)
    module.prepare_environment()
  if hasattr(module, "define_flags"):
    module.define_flags()
  # absl's --help lists the flags of the __main__ module (here the installed script) and prints
  # its docstring: make them the program's, as under `python -m`.
  flags.adopt_module_key_flags(module)
  sys.modules["__main__"].__doc__ = module.__doc__
  run(module.main, init_distributed=init_distributed, help_config=CONFIG_HELP.get(module_name),
      program=name)


def _entry(name):
  def entry():
    return run_program(name)
  entry.__name__ = name.replace("-", "_")
  return entry


train = _entry("bert-jax-train")
finetune = _entry("bert-jax-finetune")
predict = _entry("bert-jax-predict")
extract_features = _entry("bert-jax-extract-features")
convert = _entry("bert-jax-convert")
export_serving = _entry("bert-jax-export-serving")
report = _entry("bert-jax-report")
plan = _entry("bert-jax-plan")
mine = _entry("bert-jax-mine")
build_vocab = _entry("bert-jax-build-vocab")
create_pretraining_data = _entry("bert-jax-create-pretraining-data")
stdlib_corpus = _entry("bert-jax-stdlib-corpus")


def verify():
  """bert-jax-verify DIR: `python -m bert_jax.checkpoint verify DIR`."""
  from bert_jax.checkpoint import store as checkpoint  # pylint: disable=g-import-not-at-top
  from bert_jax_core import errors  # pylint: disable=g-import-not-at-top
  errors.run_main(checkpoint.verify_main, [sys.argv[0], "verify", *sys.argv[1:]])


# ----------------------------------------------------------------------------------------------
# --help for the config-driven programs, generated from the config file itself: its docstring
# (the presets and variants), then every field with its default and the comment written beside
# it. Nothing here is a second copy of a field or a comment.
# ----------------------------------------------------------------------------------------------
def _comments(source):
  """{line: (column, text)} of every comment, and the set of lines that hold only a comment."""
  import io  # pylint: disable=g-import-not-at-top
  import tokenize  # pylint: disable=g-import-not-at-top
  comments, code_lines = {}, set()
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      # (column, text, indented: the text starts after several spaces, a continuation)
      comments[tok.start[0]] = (tok.start[1], tok.string.lstrip("#").strip(),
                                tok.string[1:4] == "   ")
    elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                          tokenize.ENDMARKER):
      code_lines.update(range(tok.start[0], tok.end[0] + 1))
  return comments, {n for n in comments if n not in code_lines}


def _field_lines(source):
  """{dotted field: line} for `c.a = ...`, `c.a.b = ...` and `c.a = ConfigDict(dict(k=...))`."""
  import ast  # pylint: disable=g-import-not-at-top
  out = {}

  def path(node):
    parts = []
    while isinstance(node, ast.Attribute):
      parts.append(node.attr)
      node = node.value
    return ".".join(reversed(parts)) if isinstance(node, ast.Name) and node.id == "c" else None

  for node in ast.walk(ast.parse(source)):
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
      continue
    p = path(node.targets[0])
    if p is None:
      continue
    out.setdefault(p, node.lineno)
    value = node.value
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Call):
      value = value.args[0]  # ConfigDict(dict(...))
    if isinstance(value, ast.Call):
      for kw in value.keywords:
        if kw.arg:
          out.setdefault(f"{p}.{kw.arg}", kw.value.lineno)
  return out


def _field_comment(line, comments, comment_only):
  """The comment beside a field (continued on the comment lines below it that are aligned with
  it or indented), else the comment block right above it. A one-line block of under four words is a section title ("Run."), not a field's comment."""
  if line in comments and line not in comment_only:
    col, text, _ = comments[line]
    parts, n = [text], line + 1
    while n in comment_only and (comments[n][0] >= col or comments[n][2]):
      parts.append(comments[n][1])
      n += 1
    return " ".join(p for p in parts if p)
  n, block = line - 1, []
  while n in comment_only:
    block.insert(0, comments[n][1])
    n -= 1
  if len(block) == 1 and len(block[0].split()) < 4:
    return ""
  return " ".join(block)


def _flatten(d, prefix=""):
  for k, v in d.items():
    if isinstance(v, dict):
      yield from _flatten(v, f"{prefix}{k}.")
    else:
      yield f"{prefix}{k}", v


def config_help(config_file, arg=None):
  """The help text of a config file: its docstring, then `--config.FIELD=DEFAULT  comment` for
  every field of get_config(arg) (the file's default preset when arg is None)."""
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("_bert_jax_help_config", config_file)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  config = module.get_config(arg) if arg else module.get_config()
  with open(config_file, encoding="utf-8") as f:
    source = f.read()
  comments, comment_only = _comments(source)
  lines_of = _field_lines(source)
  fields = []
  order = lambda item: (lines_of.get(item[0], 1 << 30), item[0])  # noqa: E731  the file's order
  for name, value in sorted(_flatten(config.to_dict()), key=order):
    shown = "None" if value is None else (repr(value) if isinstance(value, str) else
                                          str(value).replace(" ", ""))
    note = _field_comment(lines_of[name], comments, comment_only) if name in lines_of else ""
    fields.append((f"--config.{name}={shown}", note))
  width = min(max(len(f) for f, _ in fields), 44)
  out = [(module.__doc__ or "").strip(), "",
         f"Config fields with the defaults of "
         f"{os.path.basename(config_file)}:{arg or '(default preset)'} (pass "
         "--config=FILE:PRESET --help to see another preset's):"]
  for flag, note in fields:
    out.append(f"  {flag:<{width}}  {note}" if note else f"  {flag}")
  return "\n".join(out)


def print_config_help(argv, config_file, program, other_flags):
  """--help of a config-driven program: usage, the config's presets and fields, other flags
  [(name, help)]. The program's own docstring (notes for maintainers) is not shown."""
  config_arg = None
  for a in argv[1:]:
    if a.startswith("--config="):
      path, _, config_arg = a.split("=", 1)[1].partition(":")
      config_file = path if os.path.isfile(path) else config_file
  shown = config_file
  if not os.path.isfile(config_file):  # installed: the package's copy
    config_file = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs",
                               os.path.basename(config_file))
  print(f"usage: {program} --config={shown}:PRESET[,VARIANT...] --workdir=DIR "
        "[--config.FIELD=VALUE ...]\n")
  print(config_help(config_file, config_arg or None))
  print("\nOther flags:")
  for name, text in other_flags:
    print(f"  --{name}: {text}")
  print("  --verbosity=N: absl logging level (default: warnings only); --helpfull: every flag")
