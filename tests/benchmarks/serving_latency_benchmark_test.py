"""benchmarks/serving_latency.py on two tiny presets: both exported, checked, timed, ratio
printed (the figure in docs/serving.md comes from the full run by hand)."""

import pytest

from benchmarks import serving_latency


@pytest.mark.slow   # two TFLite conversions: ~30 s on the loaded 2-core box
def test_student_and_teacher_are_exported_checked_and_timed_in_one_run(capsys):
  med = serving_latency.main(["--student=tinybert-tiny", "--teacher=tiny", "--seq=16",
                              "--runs=3", "--warmup=1", "--no_jax"])
  out = capsys.readouterr().out
  assert set(med) == {"student", "teacher"} and all(w > 0 and c >= 0 for w, c in med.values())
  assert "student tinybert-tiny: 1 x 64" in out and "teacher tiny: 2 x 128" in out
  assert "teacher / student: wall" in out and "commit" in out


def test_bad_presets_and_counts_are_refused():
  for argv in (["--student=nope"], ["--runs=0"]):
    with pytest.raises(SystemExit) as e:
      serving_latency.parse_args(argv)
    assert e.value.code == 2
