"""The import layers, read statically (ast, nothing imported): bert_jax_core imports no other project
module, data_pipelines never imports bert_jax, and no import cycle joins project modules.
Imports inside functions count as much as those at the top of a file: a cycle that only closes
at run time is still a cycle (issue 23, point 11).

  bert_jax       -> data_pipelines, bert_jax_core
  data_pipelines -> bert_jax_core
  bert_jax_core  -> (nothing of ours)
"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("bert_jax_core", "data_pipelines", "bert_jax")
# package -> the project packages it may import (itself always).
ALLOWED = {"bert_jax_core": (), "data_pipelines": ("bert_jax_core",),
           "bert_jax": ("bert_jax_core", "data_pipelines")}


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
      if to != package and to not in ALLOWED[package]:
        out.append(f"{os.path.relpath(path, root)}:{line}: {name} imports {target} "
                   f"({package} may import only {', '.join(ALLOWED[package]) or 'itself'})")
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
