"""benchmarks/modern_side_by_side.py's pure part: the step counts at equal analytic FLOPs (no
training, no subprocess) and its table."""

import argparse
import random

import pytest

from benchmarks import modern_side_by_side as msbs


def test_equal_flops_steps_for_known_figures():
  # The dearer model keeps --steps; the cheaper one gets the budget over its own count.
  assert msbs.equal_flops_steps({"a": 3e9, "b": 2e9}, 100) == {"a": 100, "b": 150}
  # 600 x 7 = 4,200 = 1,400 x 3 exactly; 4,200 / 4 = 1,050.
  assert msbs.equal_flops_steps({"mini": 7.0, "modern": 3.0, "x": 4.0}, 600) == {
      "mini": 600, "modern": 1400, "x": 1050}
  # Not a whole number of steps: 20 x 5 = 100, 100 / 3 = 33.3 -> 33 (99, one third short).
  assert msbs.equal_flops_steps({"a": 5, "b": 3}, 20) == {"a": 20, "b": 33}
  # 100 / 6 = 16.67 -> 17 (102, 2 over: nearer than 16's 96).
  assert msbs.equal_flops_steps({"a": 10, "b": 6}, 10) == {"a": 10, "b": 17}
  # Equal costs: equal steps.
  assert msbs.equal_flops_steps({"a": 2.5e10, "b": 2.5e10}, 7) == {"a": 7, "b": 7}


def test_totals_never_differ_by_more_than_one_step():
  rng = random.Random(0)
  for _ in range(2000):
    flops = {"mini": rng.uniform(1e8, 1e11), "modernbert-mini": rng.uniform(1e8, 1e11)}
    steps = rng.randint(1, 5000)
    got = msbs.equal_flops_steps(flops, steps)
    budget = steps * max(flops.values())
    assert got[max(flops, key=flops.get)] == steps
    for name, f in flops.items():
      assert abs(got[name] * f - budget) <= f / 2 * (1 + 1e-12)   # nearest whole step
    totals = [got[n] * f for n, f in flops.items()]
    assert abs(totals[0] - totals[1]) <= min(flops.values()) * (1 + 1e-12)


@pytest.mark.parametrize("flops, steps", [({"a": 1.0, "b": 0.0}, 10), ({"a": 1.0}, 0), ({}, 5),
                                          ({"a": -1.0, "b": 2.0}, 3)])
def test_equal_flops_steps_refuses_nonsense(flops, steps):
  with pytest.raises(ValueError, match="must be > 0"):
    msbs.equal_flops_steps(flops, steps)


def test_table_reports_steps_totals_the_caveat_and_each_seed():
  def row(steps, gflop, dev):
    return dict(final_eval={"eval/mlm_accuracy": 0.1, "eval/mlm_loss": 5.0}, params=3_000_000,
                vocab_size=4939, steps=steps, gflop_per_step=gflop,
                total_tflop=steps * gflop / 1e3, sec_per_step=0.2,
                dev=[dict(best=d + 0.01, best_epoch=1, last=d, epochs=2) for d in dev])
  rows = {"mini": row(100, 30.0, [0.5, 0.7]), "modernbert-mini": row(120, 25.0, [0.6, 0.6])}
  text = msbs.table(rows, argparse.Namespace(steps=100, batch_size=16, seeds="0,1",
                                             ft_learning_rate=None, ft_epochs=None))
  assert "modernbert-mini / mini total = 1.0000" in text
  assert "NOT one task" in text
  lines = text.splitlines()
  assert lines[-2].startswith("| mini | 3.00M | 4,939 | 100 | 30.00 | 3.000 | 0.200 | 0.1000 |")
  assert "| 0.600 ± 0.141 | 0.500 0.700 | 0.610 |" in lines[-2]
  assert lines[-1].startswith("| modernbert-mini | 3.00M | 4,939 | 120 | 25.00 | 3.000 |")
  assert "| 0.600 ± 0.000 | 0.600 0.600 | 0.610 |" in lines[-1]
