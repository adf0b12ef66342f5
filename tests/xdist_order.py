"""The order in which the two pytest-xdist workers take the suite's tests (scripts/run_tests.sh).

xdist's `--dist loadfile` hands out whole files, the files with the MOST TESTS first, and gives a
worker its next file while that worker still has two tests to run. This suite's time is in a few
files of few long tests (2-process pods, kill -9, TPU compiles, fine-tuning runs): they started
last, and the last of them ran alone on one worker while the other worker idled. Here instead:

  * the longest units first (longest-processing-time-first: the short ones fill in at the end);
  * a unit is a file, except a test named in SLOW, which is a unit of its own, so a file's two
    long tests can run on both workers at once (each then sets up the file's module fixtures, so
    only tests whose shared fixtures are cheap are named);
  * a worker gets its next unit when it starts its last test (not its second to last), so the
    units still queued go to whichever worker is free first.

FAST and SLOW: about how many wall seconds each unit takes in its tier on the 2-core box (a file
key counts that tier's tests of the file). Sources, 2026-11-25: the last full runs' figures
(issue 32's notes, commit messages: plan search ~200 s, stream ~200 s each, kill 83 / 132 s, the
BERT-teaches-DistilBERT run ~140 s) and single-file runs on the box under load, scaled by 1/3.
Only the order depends on them: a stale figure costs minutes, never a test. A unit not listed
counts as DEFAULT_SECONDS (after the listed ones, in file order). Re-measure with
`pytest -m slow --durations=0` (and `-m "not slow"`) on a quiet box when a file grows.
"""

import os

DEFAULT_SECONDS = 5.0

FAST = {   # -m "not slow": whole files
    "tests/plan_test.py": 145,             # TPU compiles, 145 CPU s (2026-11-26, SMALL programs)
    "tests/packing_test.py": 120,          # in-process fine-tunes, packed and not
    "tests/create_pretraining_data_test.py": 150,   # 190 CPU s, 2 worker processes in 4 runs
    "tests/cli_errors_test.py": 115,       # 114 CPU s: every CLI started, one bad input each
    "tests/local_pod_test.py": 60,         # five 2-process pods
    "tests/trainer_lib_test.py": 45,       # accumulation: two train steps compiled
    "tests/launch_test.py": 30,
    "tests/pretrain_input_test.py": 25,
    "tests/modernbert_cli_test.py": 45,    # 43 CPU s, 2026-11-26 (its CLI run moved to slow)
}

SLOW = {   # -m slow: a name with "::" is a unit of its own, a file the rest of its slow tests
    # Added 2026-11-26 (single runs under load, seconds): ModernBERT's CLI paths (3 tests, ~200 s,
    # + its one-step SQuAD, 93 s), its two-phase context extension (2 tests, 249 s), a pod with a
    # host 40 s late and one that times out (115 + 22 s).
    "tests/modernbert_cli_test.py": 115,   # CPU s, 2026-11-26 after sharing the reference model
    "tests/modernbert_phase2_test.py": 112,
    "tests/modernbert_export_test.py": 95,
    "tests/batch_warmup_test.py": 100,     # 66 s warm cache, 138 s cold
    "tests/korean_modern_test.py": 30,
    "tests/late_host_test.py": 140,
    # 515 s alone on the idle box, 2026-11-26: plan's TPU compiles no longer use the persistent
    # cache (issue 32), so the search compiles every candidate; 260 CPU s on SMALL programs.
    "tests/plan_test.py::test_search_finds_settings_that_fit": 260,
    "tests/stream_test.py::test_electra_one_and_two_hosts_give_the_same_losses_and_resume_on_"
    "each_other": 200,                     # 329 s wall in the 2026-11-26 slow run (loaded)
    "tests/stream_test.py::test_one_and_two_hosts_train_on_the_same_stream_and_resume_on_each_"
    "other": 160,
    "tests/multihost_train_test.py::test_two_process_pod_matches_one_process_and_resumes": 150,
    "tests/kill_test.py::test_sigkill_at_random_moments_resumes_bit_exactly[electra-tiny]": 200,
    "tests/finetune_test.py": 150,         # six fine-tuning runs on one 'pretrained' fixture
    "tests/distil_finetune_test.py::test_a_bert_teacher_distils_a_distilbert_student_in_"
    "finetune": 140,
    "tests/distil_test.py::test_two_host_pod_distils_like_one_host_with_the_teacher_sharded_"
    "across_hosts": 120,
    "tests/multihost_train_test.py::test_two_process_fsdp_finetune_exports_the_one_process_"
    "parameters": 100,
    "tests/kill_test.py::test_sigkill_at_random_moments_resumes_bit_exactly[tiny]": 130,
    "tests/e2e_pretrain_test.py": 160,     # 265 s wall in the 2026-11-26 slow run (loaded box)
    "tests/packaging_test.py": 90,         # 147 s wall there: a pip install into a fresh venv
    "tests/electra_test.py": 150,          # 2026-11-26 loaded: RTD learns 174 s, pre-train + resume 108 s
    "tests/gcs_test.py": 60,
    "tests/distil_finetune_test.py::test_distilled_workdir_feeds_finetune_predict_and_extract_"
    "features": 60,
    "tests/electra_finetune_test.py::test_pretrained_electra_workdir_feeds_finetune_predict_and_"
    "extract_features": 60,
    "tests/distil_test.py": 50,
    "tests/electra_finetune_test.py": 50,
}


def unit(nodeid):
  """The scheduling unit of a test: its own node id if SLOW names it, else its file."""
  base = nodeid.split("[", 1)[0]          # a parametrized test named without its case: one unit
  for name in (nodeid, base):
    if name in SLOW:
      return name
  return nodeid.split("::", 1)[0]


def seconds(item):
  table = SLOW if item.get_closest_marker("slow") else FAST
  return table.get(unit(item.nodeid), DEFAULT_SECONDS)


def longest_first(items):
  """Sorts collected items in place: units by decreasing seconds, each unit's tests together and
  in their file's order (a stable sort on (-seconds, the unit's first position))."""
  first = {}
  for i, item in enumerate(items):
    first.setdefault(unit(item.nodeid), i)
  items.sort(key=lambda item: (-seconds(item), first[unit(item.nodeid)]))


def under_xdist_worker():
  return "PYTEST_XDIST_WORKER" in os.environ


def make_scheduler(config, log):
  """A LoadFileScheduling over units() in the collected order, one test of look-ahead."""
  from xdist.scheduler import LoadFileScheduling  # pylint: disable=g-import-not-at-top

  class LongestFirst(LoadFileScheduling):

    def _split_scope(self, nodeid):
      return unit(nodeid)

    def _reschedule(self, node):
      # xdist's LoadScopeScheduling._reschedule with "> 2" pending tests made "> 1": a worker
      # holds the test it runs plus one (it needs the next test to start the current one).
      if node.shutting_down:
        return
      if not self.workqueue:
        node.shutdown()
        return
      if self._pending_of(self.assigned_work[node]) > 1:
        return
      self._assign_work_unit(node)

  config.option.loadscopereorder = False    # keep longest_first's order, not most-tests-first
  return LongestFirst(config, log)
