"""A family is one folder (issue 47): nothing outside bert_jax/families/<name>/ names a family in
code (a string equal to its name, or an import of its folder) but the files listed in ALLOWED
(none today; docs/development.md, "The house", says the same). BERT, the family every other
builds on and the default, is left out: the programs and shared layers name it as the default.

Read statically (ast), as layers_test: a new reference fails here until it is moved into the
family's folder (or, where several families share it, listed with why)."""

import ast
import os

import tests  # tests.ROOT: the repository

FAMILIES_DIR = os.path.join(tests.ROOT, "bert_jax", "families")

# family -> {file outside its folder that names it: why}
ALLOWED = {}   # none: a family's pieces are in its folder; the tables discover the folders


def family_names(root=FAMILIES_DIR):
  return sorted(d for d in os.listdir(root)
                if os.path.isfile(os.path.join(root, d, "__init__.py")))


def references(top, families):
  """{family: {file: [lines]}}: code outside the family's folder that names it."""
  found = {f: {} for f in families}
  for package in ("bert_jax", "data_pipelines", "bert_jax_core"):
    for d, dirs, names in os.walk(os.path.join(top, package)):
      dirs[:] = [x for x in dirs if x != "__pycache__"]
      for n in names:
        if not n.endswith(".py"):
          continue
        path = os.path.join(d, n)
        rel = os.path.relpath(path, top).replace(os.sep, "/")
        with open(path, encoding="utf-8") as f:
          tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
          if isinstance(node, ast.Constant) and isinstance(node.value, str):
            names_ = [node.value]
          elif isinstance(node, ast.Import):
            names_ = [a.name for a in node.names]
          elif isinstance(node, ast.ImportFrom):
            names_ = [f"{node.module}.{a.name}" for a in node.names] + [node.module or ""]
          else:
            continue
          for fam in families:
            folder = f"bert_jax.families.{fam}"
            if rel.startswith(f"bert_jax/families/{fam}/"):
              continue
            if any(s == fam or s == folder or s.startswith(folder + ".") for s in names_):
              found[fam].setdefault(rel, []).append(node.lineno)
  return found


def test_each_family_is_named_only_in_its_folder_and_the_listed_files():
  families = [f for f in family_names() if f != "bert"]
  assert len(families) >= 7, families
  found = references(tests.ROOT, families)
  assert {f: sorted(files) for f, files in found.items() if files} == {
      f: sorted(files) for f, files in ALLOWED.items()}


def test_a_planted_reference_is_found(tmp_path):
  (tmp_path / "bert_jax" / "families" / "toy").mkdir(parents=True)
  (tmp_path / "bert_jax" / "families" / "toy" / "__init__.py").write_text('NAME = "toy"\n')
  (tmp_path / "bert_jax" / "training").mkdir()
  (tmp_path / "bert_jax" / "training" / "x.py").write_text(
      'from bert_jax.families.toy import layers\nif family == "toy":\n  pass\n')
  found = references(str(tmp_path), family_names(str(tmp_path / "bert_jax" / "families")))
  assert found == {"toy": {"bert_jax/training/x.py": [1, 2]}}
