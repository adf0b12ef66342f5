"""tests/xdist_order.py: every unit it names exists, and the order it gives the workers."""

import ast
import json
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


def test_fast_tests_first_then_longest_units_first_each_units_tests_together(monkeypatch,
                                                                            tmp_path):
  monkeypatch.setattr(xdist_order, "SLOW", {"a_test.py::test_big": 100, "b_test.py": 50})
  monkeypatch.setattr(xdist_order, "FAST", {"c_test.py": 30})
  ids = tmp_path / "slow_ids.json"
  monkeypatch.setenv(xdist_order.TIERS_ENV, str(ids))
  items = [_Item(n, slow=slow) for n, slow in (
      ("a_test.py::test_small", True), ("a_test.py::test_big[1]", True),
      ("a_test.py::test_big[2]", True), ("a_test.py::test_fast", False),
      ("b_test.py::test_one", True), ("c_test.py::test_x", False), ("b_test.py::test_two", True),
      ("c_test.py::test_y", True))]
  xdist_order.longest_first(items)
  assert [i.nodeid for i in items] == [
      "c_test.py::test_x",                                  # fast, 30 s
      "a_test.py::test_fast",                               # fast, unlisted
      "a_test.py::test_big[1]", "a_test.py::test_big[2]",   # slow, 100 s: its own unit
      "b_test.py::test_one", "b_test.py::test_two",         # slow, 50 s
      "a_test.py::test_small", "c_test.py::test_y"]         # slow, unlisted: in file order
  # What the scheduler in the controller reads: the slow node ids, and its units from them.
  slow = set(json.loads(ids.read_text()))
  assert slow == {i.nodeid for i in items if i.slow}
  unit = {i.nodeid: xdist_order.unit(i.nodeid, i.nodeid in slow) for i in items}
  assert unit["a_test.py::test_big[2]"] == "a_test.py::test_big"
  assert unit["a_test.py::test_small"] == "a_test.py (slow)"
  assert unit["a_test.py::test_fast"] == "a_test.py"       # a file's fast tests: another unit
  assert unit["c_test.py::test_y"] != unit["c_test.py::test_x"]
