"""bert_jax.plan on a reranker config (bert_jax/tasks/reranker.py's train_batch): the
cross-encoder's training step, B rows of S (query, document) pairs, compiled for a TPU slice with
libtpu (plan_test.py's rule: skip locally without it, FAIL in CI)."""

import json

import jax
import pytest

from tests.bert_jax import plan_test
from tests.bert_jax.plan_test import _cli

libtpu = plan_test.libtpu   # autouse: skip locally without libtpu, FAIL in CI

TINY_RERANKER = ("--config=bert_jax/configs/finetune.py:custom,runlocal",
                 "--config.custom.type=reranker", "--config.reranker.loss=mnrl",
                 "--config.reranker.hard_negatives=2", "--config.reranker.in_batch_negatives=1",
                 "--config.model_name=tiny", "--config.max_seq_length=32")


@pytest.fixture
def vocab(tmp_path):
  path = tmp_path / "vocab.txt"
  path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                            + [f"w{i}" for i in range(507)]) + "\n")
  return str(path)


def _config(vocab, **reranker):
  from bert_jax.configs import finetune as finetune_config  # pylint: disable=g-import-not-at-top
  c = finetune_config.get_config("custom,runlocal")
  c.custom.type, c.model_name, c.max_seq_length, c.batch_size = "reranker", "tiny", 32, 16
  c.vocab_file = vocab
  for k, v in reranker.items():
    setattr(c.reranker, k, v)
  return c


def test_train_batch_is_rows_of_pairs(vocab):
  """S = 1 positive + hard_negatives + (mnrl) in_batch_negatives pairs a row, T tokens each."""
  from bert_jax import tasks  # pylint: disable=g-import-not-at-top
  from bert_jax.planning import plan_finetune  # pylint: disable=g-import-not-at-top
  from bert_jax.training import finetune_tasks as ft  # pylint: disable=g-import-not-at-top
  c = _config(vocab, loss="mnrl", hard_negatives=2, in_batch_negatives=1)
  task = ft.build_task(c)
  shapes = tasks.of(task).train_batch(task, c)
  assert shapes["input_ids"] == ((16, 4, 32), "int32")
  assert shapes["labels"] == ((16, 4), "float32") and shapes["example_weights"] == ((16,),
                                                                                     "float32")
  bce = _config(vocab, loss="bce")
  assert tasks.of(ft.build_task(bce)).train_batch(ft.build_task(bce), bce)["input_ids"][0] == (
      (16, 1, 32))
  # The plan's own checks pass (the compile is the slow test's): a chip's rows, no refusal.
  _, task, _, _, rows, _ = plan_finetune.check(c, jax.devices())
  assert task.type == "reranker" and rows == 16 // len(jax.devices())


@pytest.mark.slow   # one TPU compile of BERT-tiny (tests/xdist_order.py)
def test_cli_plans_the_reranker_step_for_a_slice(tmp_path, vocab):
  out = tmp_path / "plan.json"
  p = _cli(*TINY_RERANKER, f"--config.vocab_file={vocab}", "--topology=v5e:1x1",
           "--config.batch_size=8", f"--json={out}")
  assert p.returncode == 0, (p.stdout[-3000:], p.stderr[-3000:])
  result = json.loads(out.read_text())
  assert result["kind"] == "finetune" and result["fits"] is True
  assert result["config"]["batch_shape"] == [8, 4, 32]   # 1 + 2 hard + 1 in-batch pairs a row
  assert any(l.startswith("verdict:") and "FITS" in l for l in p.stdout.splitlines()), p.stdout
