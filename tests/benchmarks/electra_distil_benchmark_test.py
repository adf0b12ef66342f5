"""benchmarks/electra_distil.py without training: the equal-compute step count, the forward timer
and the tables (issue 21's figures)."""

import argparse
import statistics

import pytest

from benchmarks import electra_distil as ed
from benchmarks import families_side_by_side as fam
from bert_jax.families.electra import objective as electra
from bert_jax.models import model as model_lib


def test_step_flops_are_the_runs_and_electra_steps_spend_berts_compute():
  v = 4939
  bert = fam.step_flops("mini", 16, v, objectives="mlm")
  electra_step = fam.step_flops("electra-mini", 16, v)
  # ELECTRA's step: both networks (electra.flops_per_sequence, packed runlocal rows: 20 slots).
  c = model_lib.get_bert_config("electra-mini", vocab_size=v)
  assert electra_step == pytest.approx(16 * electra.flops_per_sequence(c, 128, 20), rel=0.05)
  assert electra_step > bert   # a generator and a head on every token on top of a BERT-mini
  steps = round(400 * bert / electra_step)
  assert abs(steps * electra_step - 400 * bert) <= electra_step / 2   # equal within half a step
  # DistilBERT's step adds the teacher's forward to the student's training.
  student = fam.step_flops("distilbert-tiny", 32, v, teacher_preset="tiny")
  assert student > fam.step_flops("distilbert-tiny", 32, v)


def test_inference_speed_times_every_preset():
  speed = ed.inference_speed(["tiny", "distilbert-tiny"], 100, batch=2, reps=3, seq=16)
  assert set(speed) == {"tiny", "distilbert-tiny"} and all(t > 0 for t in speed.values())


def test_tables_report_the_kept_fraction_and_each_seed():
  dev = lambda *xs: ed.dev_summary([dict(best=x + 0.01, last=x) for x in xs])  # noqa: E731
  base = dict(final_eval={"eval/mlm_accuracy": 0.09}, pretrain_tflop=18.1, gflop_per_step=45.3,
              steps=400, sec_per_step=1.5, params=4_621_312)
  run = lambda **kw: dict(base, **kw)  # noqa: E731
  rows = {"mini": run(dev=dev(0.8, 0.7)), "electra-mini": run(steps=377, dev=dev(0.6, 0.7))}
  args = argparse.Namespace(batch_size=16, ft_learning_rate=5e-4, ft_epochs=8, seeds="0,1",
                            student_steps=1500, speed_batch=32, teacher="tiny",
                            student="distilbert-tiny")
  text = ed.tables(args, rows, 377, run(params=1_000_000, dev=dev(0.6, 0.6)),
                   run(params=800_000, dev=dev(0.45, 0.45)),
                   {"tiny": 0.05, "distilbert-tiny": 0.025})
  assert f"| mini | 400 | 45.3 | 18.10 | 1.500 | 4.62M | 0.0900 | 0.750 ± " \
         f"{statistics.stdev([0.8, 0.7]):.3f} | 0.800 0.700 | 0.760 |" in text
  assert "| electra-mini | 377 |" in text
  assert ("student keeps 75.0% of the teacher's dev accuracy with 80.0% of its parameters, "
          "2.00x its inference speed") in text
