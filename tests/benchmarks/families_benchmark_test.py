"""benchmarks/docstring_task.py (the real-text fine-tuning task of the families figure) and the
table of benchmarks/families_side_by_side.py, without training."""

import argparse
import csv
import statistics

from benchmarks import docstring_task
from benchmarks import families_side_by_side as fsbs


def test_docstring_task_is_a_stable_split_by_docstring(tmp_path):
  counts = docstring_task.build(str(tmp_path), packages=("json", "csv"))
  rows = {s: list(csv.DictReader(open(tmp_path / f"{s}.csv", encoding="utf-8")))
          for s in ("train", "dev")}
  for split, got in rows.items():
    assert {r["label"] for r in got} <= {"json", "csv"}
    assert len(got) == sum(counts[split].values()) > 0
    assert all(len(r["text"].split()) >= 4 for r in got)
  # The same files from a second build: the split is a hash of each docstring's name.
  again = docstring_task.build(str(tmp_path / "again"), packages=("json", "csv"))
  assert again == counts
  assert open(tmp_path / "dev.csv").read() == open(tmp_path / "again" / "dev.csv").read()


def test_table_reports_each_seed_and_the_mean():
  dev = [dict(best=0.6, best_epoch=3, last=0.5, epochs=4),
         dict(best=0.7, best_epoch=4, last=0.7, epochs=4)]
  rows = {"albert-mini": dict(
      final_eval={"eval/mlm_accuracy": 0.07, "eval/mlm_loss": 6.1, "eval/sop_accuracy": 0.8},
      sec_per_step=0.35, sec_per_step_timing_round=0.4, gflop_per_step=44.1, params=1_594_624,
      params_with_heads=1_633_290, dev=dev)}
  table = fsbs.table(rows, argparse.Namespace(steps=400, batch_size=16, seeds="0,1",
                                             ft_learning_rate=None, ft_epochs=None))
  line = table.splitlines()[-1]
  assert line.startswith("| albert-mini | 1.59M | 1.63M | 0.0700 | 6.100 | SOP 0.800 | 44 |")
  assert f"0.600 ± {statistics.stdev([0.5, 0.7]):.3f} | 0.500 0.700 | 0.650 |" in line
