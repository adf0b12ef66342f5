#!/usr/bin/env bash
# The quick test command (README, quick start): does this install work? The fast tests plus one
# short end-to-end run per model family and per CLI (tests marked `smoke`), <= 20 min on a 2-core
# CPU box from a fresh clone with an empty compilation cache (figures: docs/development.md).
# The full suite (2-process pods, kill -9, learning runs, TPU compiles, exhaustive checks: every
# test) is `bash scripts/run_full_tests.sh`, what CI's `.ci/run` runs.
# Self-sufficient on a fresh machine with Python 3.11: creates/reuses .venv and installs pins.
#
# Which tier: BERT_JAX_TEST_TIER=quick (default here) selects -m "not slow or smoke";
# BERT_JAX_TEST_TIER=full selects everything. A -m of your own (extra arguments go to pytest)
# replaces the tier's selection: `bash scripts/run_tests.sh -m "not slow"` is the fast tests alone.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" requirements-test.txt
set +e
tier="${BERT_JAX_TEST_TIER:-quick}"
case "$tier" in
  quick) select=(-m "not slow or smoke") ;;
  full) select=() ;;
  *) echo "error: BERT_JAX_TEST_TIER=$tier: expected quick or full" >&2; exit 2 ;;
esac
# Two worker processes (pytest-xdist), one test file per worker at a time: the tests are mostly
# single-threaded Python, compiles and subprocesses, so two workers use both cores of a 2-core
# machine. One pytest session: every fast test is handed out before any slow (end-to-end) one,
# and in each tier the longest units first, a few long slow tests each on their own
# (tests/xdist_order.py, chosen in tests/conftest.py for --dist loadfile), so that neither worker
# idles while the other ends on a long file. BERT_JAX_TEST_WORKERS=0 runs in this process (for
# pdb, or one test).
workers=(-n "${BERT_JAX_TEST_WORKERS:-2}" --dist loadfile)
[ "${BERT_JAX_TEST_WORKERS:-2}" = "0" ] && workers=()
echo "[tests] $tier tier$([ "$tier" = quick ] && echo ' (the full suite: bash scripts/run_full_tests.sh)')" >&2
python -m pytest -q "${workers[@]}" "${select[@]}" "$@"
rc=$?
# pytest exits 5 when a selection holds no test; that is not a failure of the suite.
[ $rc -eq 5 ] && rc=0
if [ $rc -ne 0 ]; then
  echo "tests FAILED (pytest rc=$rc)"
  exit 1
fi
echo "all $tier-tier tests passed"
