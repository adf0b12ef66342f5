"""benchmarks/startup.py: the timing of one fresh process (the benchmark itself is run by hand)."""

import os
import sys

from benchmarks import startup


def test_timed_reports_first_output_exit_and_cpu():
  t_first, t_exit, cpu, first = startup.timed(
      [sys.executable, "-c", "print('hello', flush=True); sum(range(3_000_000)); print('bye')"],
      os.getcwd(), dict(os.environ))
  assert first == "hello" and 0 < t_first <= t_exit and cpu > 0


def test_a_failing_command_stops_the_benchmark():
  import pytest
  with pytest.raises(SystemExit, match="failed"):
    startup.timed([sys.executable, "-c", "raise SystemExit(3)"], os.getcwd(), dict(os.environ))
