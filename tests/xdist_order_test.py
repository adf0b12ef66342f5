"""tests/xdist_order.py: every unit it names exists, and the order it gives the workers."""

import ast
import os

import pytest

from tests import xdist_order

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tests_of(path):
  """{test function name: is it marked slow} of a test file, read without importing it."""
  tree = ast.parse(open(os.path.join(ROOT, path), encoding="utf-8").read())
  out = {}
  for node in tree.body:
    if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
      out[node.name] = any("slow" in ast.unparse(d) for d in node.decorator_list)
  return out


@pytest.mark.parametrize("table", ["FAST", "SLOW"])
def test_every_named_unit_exists_in_its_tier(table):
  # A renamed test or file would silently fall back to DEFAULT_SECONDS: say so here instead.
  for name in getattr(xdist_order, table):
    path, _, test = name.partition("::")
    tests = _tests_of(path)
    assert any(slow == (table == "SLOW") for slow in tests.values()), (name, "no test of its tier")
    if test:
      function = test.split("[", 1)[0]
      assert function in tests, name
      assert tests[function], (name, "named in SLOW but not marked slow")


class _Item:

  def __init__(self, nodeid, slow=False):
    self.nodeid, self.slow = nodeid, slow

  def get_closest_marker(self, name):
    return name == "slow" and self.slow or None


def test_longest_units_first_and_each_units_tests_together_in_file_order(monkeypatch):
  monkeypatch.setattr(xdist_order, "SLOW", {"a_test.py::test_big": 100, "b_test.py": 50})
  items = [_Item(n, slow=True) for n in (
      "a_test.py::test_small", "a_test.py::test_big[1]", "a_test.py::test_big[2]",
      "b_test.py::test_one", "c_test.py::test_x", "b_test.py::test_two")]
  xdist_order.longest_first(items)
  assert [i.nodeid for i in items] == [
      "a_test.py::test_big[1]", "a_test.py::test_big[2]",   # 100 s: its own unit
      "b_test.py::test_one", "b_test.py::test_two",         # 50 s
      "a_test.py::test_small", "c_test.py::test_x"]         # unlisted: in file order
  assert xdist_order.unit("a_test.py::test_big[2]") == "a_test.py::test_big"
  assert xdist_order.unit("a_test.py::test_small") == "a_test.py"
