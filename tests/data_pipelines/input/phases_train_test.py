"""A pre-training run on phases of a mixture (data_pipelines/input/phases.py; issue 42 item 2): bad
phases are one line before compute; the run prints its phases, the summary tallies each phase's
sources; a run preempted inside a phase resumes the same stream; other phases are refused."""
import json
import signal

import numpy as np
import pytest

from bert_jax import train
from bert_jax_core import errors
from tests.testlib import sigterm_testlib
# pylint: disable-next=unused-import
from tests.data_pipelines.input.mixture_train_test import _config, no_model, sources


@pytest.mark.parametrize("kw,match", [
    (dict(phases="steps=3 | steps=4"), r"add up to 7 \(3 \+ 4\) but config.num_train_steps=6"),
    (dict(phases="steps=3,sources=ko;fr | steps=3"), "phase 1 names 'fr', which is not a source"),
    (dict(phases="steps=3,mask=1.5 | steps=3"), "phase 1: mask=1.5: expected a fraction"),
    (dict(phases="steps=3,mask=0.5 | steps=3"),
     "phase 1 masks 50% of 32 tokens = 16 predictions a row, but config.max_predictions_per_seq"
     "=6 would cap it; pass --config.max_predictions_per_seq=17"),
])
def test_bad_phases_before_compute(tmp_path, sources, no_model, kw, match):
  vocab, ko, en = sources
  with pytest.raises(errors.UserError, match=match) as e:
    train.train_and_evaluate(_config(vocab, f"ko={ko};en={en}", **kw), str(tmp_path / "w"))
  assert "\n" not in str(e.value)


def test_phases_need_named_sources(tmp_path, sources, no_model):
  vocab, ko, _ = sources
  c = _config(vocab, "", phases="steps=6")
  c.train_input_files = ko
  with pytest.raises(errors.UserError, match="config.phases needs config.train_sources"):
    train.train_and_evaluate(c, str(tmp_path / "w"))


# ko alone at 30% masking for 5 steps, then ko and en at tau 0.5 and 10% masking.
PHASES = "steps=5,sources=ko,mask=0.3 | steps=5,tau=0.5,mask=0.1"


@pytest.mark.slow   # three tiny runs of 10 steps, one preempted (~1.5 min on 2 cores)
def test_phases_print_tally_and_resume_inside_a_phase(tmp_path, sources, capsys, monkeypatch):
  vocab, ko, en = sources
  spec = f"ko={ko};en={en}"

  def config(phases=PHASES):
    c = _config(vocab, spec, phases=phases, num_train_steps=10, checkpoint_every=5)
    c.max_predictions_per_seq = 10   # 30% of 32 tokens
    return c

  full = train.train_and_evaluate(config(), str(tmp_path / "full"))
  out = capsys.readouterr().out
  assert ("mixture in 2 phases: ko (64 records, 4 file(s)), en (32 records, 2 file(s))") in out
  assert "  phase 1: steps 1-5 (5): ko 100.0% (records^1); mask 30%" in out
  assert "  phase 2: steps 6-10 (5): ko 58.6%, en 41.4% (records^0.5); mask 10%" in out
  summary = json.load(open(tmp_path / "full" / "summary.json"))
  one, two = summary["phases"]
  assert one["steps"] == [0, 5] and one["mask"] == 0.3
  assert set(one["sources"]) == {"ko"} and one["sources"]["ko"]["rows"] == 5 * 8
  assert two["sources"]["en"]["rows"] > 0 and two["sources"]["ko"]["rows"] > 0
  assert "  phase 1 (steps 1-5, mask 30%, records^1): ko 100.0% of rows" in out
  # More steps would move the phases: the summary offers a new run from this one instead.
  assert summary["next"][-1].startswith("train further: a new run from it, "
                                        "--config.init_checkpoint=")
  # Preempted at step 7 (inside phase 2), resumed: the same losses as the uninterrupted run.
  sigterm_testlib.sigterm_at_batch(monkeypatch, 6)
  first = train.train_and_evaluate(config(), str(tmp_path / "resumed"))
  assert first["stopped_early"] and first["final_step"] == 7
  second = train.train_and_evaluate(config(), str(tmp_path / "resumed"))
  signal.signal(signal.SIGTERM, signal.SIG_DFL)
  losses = [m["loss"] for run in (first, second) for _, m in run["history"]["train"]]
  np.testing.assert_allclose(losses, [m["loss"] for _, m in full["history"]["train"]],
                             rtol=1e-5)
  # Resuming with other phases is refused, naming both.
  with pytest.raises(errors.UserError, match=r"trained on the phases steps 1-5: ko 1.000 "
                     r"\(records\^1\), mask 30% \| steps 6-10: ko 0.586, en 0.414 \(records\^0.5\)"
                     r", mask 10% but this run asks for steps 1-5: ko 1.000 \(records\^1\), mask "
                     r"20%"):
    train.train_and_evaluate(config(PHASES.replace("0.3", "0.2")), str(tmp_path / "full"))
