"""The tier tables (tests/tiers.py) name tests that exist, and the quick selection uses them."""
import ast
import os

import pytest

from tests import tiers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tests_of(path):
  """The test function names a test file defines at module level."""
  with open(os.path.join(ROOT, path)) as f:
    tree = ast.parse(f.read())
  return {n.name for n in tree.body
          if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


@pytest.mark.parametrize("key", sorted(tiers.FULL_ONLY | tiers.SMOKE))
def test_every_key_names_a_test_file_and_function(key):
  path, _, rest = key.partition("::")
  assert os.path.isfile(os.path.join(ROOT, path)), f"{key}: no such file"
  if rest:
    name = rest.split("[", 1)[0]
    assert name in _tests_of(path), f"{key}: {path} defines no {name}"


def test_no_test_is_in_both_tables():
  assert not tiers.FULL_ONLY & tiers.SMOKE


class _Item:
  """What tiers.apply reads of a pytest item."""

  def __init__(self, nodeid):
    self.nodeid = nodeid
    self.marks = []

  def add_marker(self, mark):
    self.marks.append(mark.name)


def test_apply_marks_files_tests_and_cases_and_reports_unused_keys():
  items = [_Item("tests/data_pipelines/beam_pipeline_test.py::test_x"),
           _Item("tests/data_pipelines/records/packing_test.py::test_packed_start_batch_resumes_the_stream[5]"),
           _Item("tests/data_pipelines/records/packing_test.py::test_packed_start_batch_resumes_the_stream[1]"),
           _Item("tests/bert_jax/train_test.py::test_same_loss_on_1_device_data8_and_fsdp4_data2"),
           _Item("tests/bert_jax/families/electra/electra_test.py::"
                 "test_python_m_bert_jax_train_pretrains_electra_and_resumes_exactly"),
           _Item("tests/bert_jax/models/model_test.py::test_shapes_and_dtypes")]
  unused = tiers.apply(items)
  assert [i.marks for i in items] == [["slow"], ["slow"], [], ["slow"], ["smoke"], []]
  assert "tests/bert_jax/checkpoint/gcs_test.py" in unused
  assert "tests/data_pipelines/beam_pipeline_test.py" not in unused


def test_the_quick_command_selects_not_slow_or_smoke():
  with open(os.path.join(ROOT, "scripts", "run_tests.sh")) as f:
    script = f.read()
  assert 'quick) select=(-m "not slow or smoke")' in script
  with open(os.path.join(ROOT, ".ci", "run")) as f:
    assert "scripts/run_full_tests.sh" in f.read()
