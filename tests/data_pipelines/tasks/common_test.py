"""Fine-tuning task files (tasks/common.py): every reader reads through read_text (issue 49)."""

import pytest

from data_pipelines.tasks import common
from data_pipelines.tasks import glue
from data_pipelines.tasks import ner
from data_pipelines.tasks import pairs
from tests.testlib import not_text

_FOUND = {"png": "it is a PNG image", "gzip": "it is gzip-compressed",
          "utf16": "it is UTF-16LE (it starts with that byte-order mark)",
          # No mark: valid UTF-8 with a NUL byte after every ASCII one; it used to be read.
          "utf16_no_bom": "a NUL byte at byte 1 (line 1)",
          "cp949": "characters are invalid UTF-8 (the first at byte 0, line 1"}


@pytest.mark.parametrize("kind", not_text.KINDS)
def test_a_task_file_that_is_not_text_is_one_line_naming_it(tmp_path, kind):
  # The rule every corpus reader applies (bert_jax_core.text_files), for GLUE TSV, NER CoNLL and
  # pair files alike: they all read through common.read_text.
  path = not_text.write(tmp_path, kind, "train.tsv")
  task = glue.custom_task("c", text_a="a", labels=("0", "1"))
  readers = [lambda: common.read_text(path),
             lambda: glue.read_examples(task, str(tmp_path), "train"),
             lambda: ner.read_conll(path, ("O",)), lambda: pairs.read_pairs(path, "tsv")]
  for read in readers:
    with pytest.raises(common.TaskDataError) as e:
      read()
    msg = str(e.value)
    assert msg.startswith(f"{path} is not UTF-8 text: ") and _FOUND[kind] in msg, msg
    assert "\n" not in msg


def test_a_directory_is_named_as_one(tmp_path):
  (tmp_path / "train.tsv").mkdir()
  task = glue.custom_task("c", text_a="a", labels=("0", "1"))
  with pytest.raises(common.TaskDataError, match=r"train.tsv: is a directory, not a task file"):
    glue.read_examples(task, str(tmp_path), "train")

