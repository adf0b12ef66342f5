"""The import layers, read statically (ast, nothing imported). Imports point down: a module may
import its own layer and the layers below it, never one above, and no cycle joins project modules.
Imports inside functions count as much as those at the top of a file: a cycle or a crossing that
only closes at run time is still one (issue 23 point 11, issue 47 point 4).

  bert_jax_core                                  (nothing of ours)
  data_pipelines: tokenizers < corpus < records < input < tasks < its programs (the root modules)
  bert_jax, bottom to top (LAYERS below): registries < parallel < layers < models < checkpoint
    < convert < inference < training < objectives < evaluation < tasks/<type> < families/<name>
    < programs (the root modules, every __main__, planning/, configs/)

A family folder imports no other family's folder but bert's, the family every other builds on.
docs/development.md draws the same house.
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("bert_jax_core", "data_pipelines", "bert_jax")
# package -> the project packages it may import (itself always).
ALLOWED = {"bert_jax_core": (), "data_pipelines": ("bert_jax_core",),
           "bert_jax": ("bert_jax_core", "data_pipelines")}

# Within a package, bottom to top: (layer, the module-name prefixes in it). A module is in the
# layer of its longest matching prefix; a package's root modules (its programs) are in "programs".
LAYERS = {
    "data_pipelines": [
        ("base", ["data_pipelines"]),             # the package's __init__
        ("tokenizers", ["data_pipelines.tokenizers"]),
        ("corpus", ["data_pipelines.corpus"]),
        ("records", ["data_pipelines.records"]),
        ("input", ["data_pipelines.input"]),
        ("tasks", ["data_pipelines.tasks"]),
    ],
    "bert_jax": [
        # The two open lists' tables (they import nothing of ours and find their members by
        # name) and what every task type shares; the package's face.
        ("registries", ["bert_jax", "bert_jax.families", "bert_jax.families.registry",
                        "bert_jax.tasks", "bert_jax.tasks.registry", "bert_jax.tasks.common"]),
        ("parallel", ["bert_jax.parallel"]),
        ("layers", ["bert_jax.layers"]),
        ("models", ["bert_jax.models"]),
        ("checkpoint", ["bert_jax.checkpoint"]),
        ("convert", ["bert_jax.convert"]),
        ("inference", ["bert_jax.inference"]),
        ("training", ["bert_jax.training"]),
        ("objectives", ["bert_jax.objectives"]),
        ("evaluation", ["bert_jax.evaluation"]),
        ("tasks", ["bert_jax.tasks."]),           # each task type's module
        ("families", ["bert_jax.families."]),     # each family's folder
        ("programs", ["bert_jax.planning", "bert_jax.configs"]),
    ],
    "bert_jax_core": [("base", ["bert_jax_core"])],
}
BASE_FAMILY = "bert_jax.families.bert"


def layer_of(name):
  """(rank, layer name) of a module: its longest matching prefix in LAYERS; a package's root
  modules and every __main__ are programs, the top."""
  package = name.split(".")[0]
  table = LAYERS[package]
  if name.endswith(".__main__") or (name.count(".") == 1 and not any(
      name == p or name.startswith(p.rstrip(".") + ".") for _, ps in table for p in ps
      if p.count(".") >= 1)):
    return len(table), "programs"
  best = None
  for rank, (layer, prefixes) in enumerate(table):
    for p in prefixes:
      hit = (name.startswith(p) and p.endswith(".")) or name == p or name.startswith(p + ".")
      if hit and (best is None or len(p) > best[0]):
        best = (len(p), rank, layer)
  if best is None:
    return len(table), "programs"
  _, rank, layer = best
  return (len(table), "programs") if layer == "programs" else (rank, layer)


def family_of(name):
  """The family folder a module is in (bert_jax.families.<f>), or None."""
  parts = name.split(".")
  if len(parts) >= 3 and parts[:2] == ["bert_jax", "families"] and parts[2] != "registry":
    return ".".join(parts[:3])
  return None


def modules(root):
  """{dotted module name: file path} of every .py file under the project packages."""
  out = {}
  for package in PACKAGES:
    for d, dirs, names in os.walk(os.path.join(root, package)):
      dirs[:] = [x for x in dirs if x != "__pycache__"]
      for n in names:
        if n.endswith(".py"):
          rel = os.path.relpath(os.path.join(d, n), root)[:-3].split(os.sep)
          if rel[-1] == "__init__":
            rel = rel[:-1]
          out[".".join(rel)] = os.path.join(d, n)
  return out


def imports(name, path, known):
  """[(imported project module, line)] of one file: every import statement, at any depth."""
  with open(path, encoding="utf-8") as f:
    tree = ast.parse(f.read(), path)
  is_package = path.endswith("__init__.py")
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: from . import x / from ..y import z
        parts = name.split(".")[:len(name.split(".")) - node.level + (1 if is_package else 0)]
        base = ".".join(parts + ([base] if base else []))
      # `from pkg import mod` imports the module pkg.mod when there is one, else names of pkg.
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    else:
      continue
    for t in targets:
      while t and t not in known:  # `import a.b.c` of a name inside a module: its module
        t = t.rpartition(".")[0]
      # A module importing itself (a program's `if __name__ == "__main__":` block importing its
      # own module by name, so workers unpickle one copy of it) is no cycle.
      if t and t.split(".")[0] in PACKAGES and t != name:
        out.append((t, node.lineno))
  return out


def cycles(graph):
  """Strongly connected components of more than one module: the import cycles."""
  index, low, stack, on_stack, found = {}, {}, [], set(), []

  def visit(v):  # Tarjan's algorithm; the graph is a few hundred nodes, recursion is fine
    index[v] = low[v] = len(index)
    stack.append(v)
    on_stack.add(v)
    for w in graph.get(v, ()):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on_stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on_stack.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def violations(root):
  """Every layer crossing and every cycle under root, as readable lines (empty when clean)."""
  known = modules(root)
  graph, out = {}, []
  for name, path in sorted(known.items()):
    package = name.split(".")[0]
    for target, line in imports(name, path, known):
      graph.setdefault(name, set()).add(target)
      to = target.split(".")[0]
      where = f"{os.path.relpath(path, root)}:{line}: {name} imports {target}"
      if to != package:
        if to not in ALLOWED[package]:
          out.append(f"{where} ({package} may import only {', '.join(ALLOWED[package]) or 'itself'})")
        continue
      (rank, layer), (to_rank, to_layer) = layer_of(name), layer_of(target)
      if to_rank > rank:
        out.append(f"{where} (upward: {layer} may not import {to_layer})")
      mine, theirs = family_of(name), family_of(target)
      if theirs and mine and theirs != mine and theirs != BASE_FAMILY:
        out.append(f"{where} (a family folder imports no other family's but {BASE_FAMILY})")
  for component in cycles(graph):
    out.append("import cycle: " + " <-> ".join(component))
  return out


def test_the_tree_keeps_its_layers_and_has_no_cycle():
  assert violations(ROOT) == []


def _write(root, rel, text):
  path = root / rel
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)


def test_a_planted_crossing_or_cycle_is_found(tmp_path):
  for package in PACKAGES:
    _write(tmp_path, f"{package}/__init__.py", "")
  _write(tmp_path, "bert_jax_core/errors.py", "import os\n")
  _write(tmp_path, "data_pipelines/ok.py", "from bert_jax_core import errors\n")
  _write(tmp_path, "bert_jax/ok.py", "from data_pipelines import ok\nfrom bert_jax_core import errors\n")
  assert violations(tmp_path) == []  # the allowed directions pass
  # An upward import, a core import of anything of ours, and a cycle closed inside a function.
  _write(tmp_path, "data_pipelines/bad.py", "def f():\n  from bert_jax import ok\n")
  _write(tmp_path, "bert_jax_core/bad.py", "import data_pipelines.ok\n")
  _write(tmp_path, "bert_jax/a.py", "from bert_jax import b\n")
  _write(tmp_path, "bert_jax/b.py", "def g():\n  from . import a\n")
  found = violations(tmp_path)
  assert any(v.startswith("data_pipelines/bad.py:2: data_pipelines.bad imports bert_jax.ok")
             for v in found), found
  assert any(v.startswith("bert_jax_core/bad.py:1: bert_jax_core.bad imports data_pipelines.ok")
             for v in found), found
  assert "import cycle: bert_jax.a <-> bert_jax.b" in found, found
  assert len(found) == 3, found


def test_the_layers_of_some_modules():
  assert layer_of("bert_jax.train")[1] == "programs"
  assert layer_of("bert_jax.convert.__main__")[1] == "programs"
  assert layer_of("bert_jax.convert")[1] == "convert"
  assert layer_of("bert_jax.families")[1] == "registries"
  assert layer_of("bert_jax.families.registry")[1] == "registries"
  assert layer_of("bert_jax.families.electra.objective")[1] == "families"
  assert layer_of("bert_jax.tasks.common")[1] == "registries"
  assert layer_of("bert_jax.tasks.span")[1] == "tasks"
  assert layer_of("bert_jax.planning.plan_compile")[1] == "programs"
  assert layer_of("data_pipelines.build_vocab")[1] == "programs"
  assert layer_of("data_pipelines.tokenizers.vocab")[1] == "tokenizers"
  ranks = [layer_of(m)[0] for m in ("bert_jax.parallel.sharding", "bert_jax.layers.attention",
                                     "bert_jax.models.model", "bert_jax.checkpoint.store",
                                     "bert_jax.convert.formats", "bert_jax.inference.loading",
                                     "bert_jax.training.trainer_lib", "bert_jax.objectives.layerwise",
                                     "bert_jax.evaluation.metrics", "bert_jax.tasks.span",
                                     "bert_jax.families.bert", "bert_jax.train")]
  assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks), ranks


def test_a_planted_upward_import_or_family_crossing_is_found(tmp_path):
  for package in PACKAGES:
    _write(tmp_path, f"{package}/__init__.py", "")
  for sub in ("layers", "models", "families", "families/a", "families/b", "families/bert"):
    _write(tmp_path, f"bert_jax/{sub}/__init__.py", "")
  _write(tmp_path, "bert_jax/models/m.py", "from bert_jax.layers import k\n")   # down: fine
  _write(tmp_path, "bert_jax/layers/k.py", "def f():\n  from bert_jax.families.a import net\n")
  _write(tmp_path, "bert_jax/families/a/net.py", "from bert_jax.families.bert import x\n")
  _write(tmp_path, "bert_jax/families/bert/x.py", "")
  _write(tmp_path, "bert_jax/families/b/y.py", "from bert_jax.families.a import net\n")
  _write(tmp_path, "data_pipelines/tokenizers/__init__.py", "")
  _write(tmp_path, "data_pipelines/input/__init__.py", "")
  _write(tmp_path, "data_pipelines/input/i.py", "")
  _write(tmp_path, "data_pipelines/tokenizers/t.py", "import data_pipelines.input.i\n")
  found = violations(tmp_path)
  assert any(v.startswith("bert_jax/layers/k.py:2: bert_jax.layers.k imports bert_jax.families.a"
                          ".net (upward: layers may not import families)") for v in found), found
  assert any(v.startswith("bert_jax/families/b/y.py:1: bert_jax.families.b.y imports "
                          "bert_jax.families.a.net (a family folder") for v in found), found
  assert any("data_pipelines.tokenizers.t imports data_pipelines.input.i (upward: tokenizers may "
             "not import input)" in v for v in found), found
  assert len(found) == 3, found


def test_every_test_folder_is_a_package():
  """tests/ mirrors the code in folders (tests/data_pipelines/tokenizers/, ...): each needs an
  __init__.py, or pytest's rootdir import puts the folder itself on sys.path, where its name
  would shadow a library's (tests/data_pipelines/tokenizers/ over Hugging Face `tokenizers`)."""
  missing = []
  for d, dirs, names in os.walk(os.path.join(ROOT, "tests")):
    dirs[:] = [x for x in dirs if x not in ("__pycache__", "data")]
    if any(n.endswith(".py") for n in names) and "__init__.py" not in names:
      missing.append(os.path.relpath(d, ROOT))
  assert missing == []
