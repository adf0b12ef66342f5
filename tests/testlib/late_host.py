r"""A program of a local pod with one host late: `python -m tests.testlib.late_host P:SECONDS:FUNCTION MODULE ARGS...`

Runs `python -m MODULE ARGS...` (under `launch.local_pod`), except that process P sleeps SECONDS
once, when its first call of `bert_jax.training.trainer_lib.FUNCTION` returns:
  build_steps     it reaches the state init and the first step late, as a host that compiles
                  slower (a loaded machine, a cold compilation cache) or reads its input later;
  check_workdir   it is late to the run's first collective (the workdir lock's broadcast).
Tests only (tests/end_to_end/late_host_test.py); the program itself is unchanged.
"""

import functools
import runpy
import sys
import time


def main():
  spec, module, *args = sys.argv[1:]
  process, seconds, function = spec.split(":")
  import jax  # pylint: disable=g-import-not-at-top  (the backend starts later, in MODULE)
  from bert_jax.training import trainer_lib  # pylint: disable=g-import-not-at-top
  original = getattr(trainer_lib, function)
  slept = []

  @functools.wraps(original)
  def late(*a, **kw):
    result = original(*a, **kw)
    if not slept and jax.process_index() == int(process):
      slept.append(seconds)
      print(f"late_host: process {process} sleeps {seconds} s after {function}", flush=True)
      time.sleep(float(seconds))
    return result

  setattr(trainer_lib, function, late)   # MODULE calls trainer_lib.FUNCTION through the module
  sys.argv = [module, *args]
  runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
  main()
