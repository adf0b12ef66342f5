#!/usr/bin/env bash
# Quick start, command 2: run the whole test suite (fast tests first, then the slow end-to-end ones).
# Self-sufficient on a fresh machine with Python 3.11: creates/reuses .venv and installs pins.
source "$(dirname "${BASH_SOURCE[0]}")/env.sh" requirements-test.txt
set +e
# Two worker processes (pytest-xdist), one test file per worker at a time: the tests are mostly
# single-threaded Python, compiles and subprocesses, so two workers use both cores of a 2-core CI
# machine. One pytest session: every fast test is handed out before any slow (end-to-end) one, and
# in each tier the longest units first, a few long slow tests each on their own
# (tests/xdist_order.py, chosen in tests/conftest.py for --dist loadfile), so that neither worker
# idles while the other ends on a long file (two sessions, fast then slow, paid the collection
# twice and the fast tier's idle end). BERT_JAX_TEST_WORKERS=0 runs in this process (for pdb, or
# one test). Extra arguments go to pytest: -m "not slow" runs the fast tier alone.
workers=(-n "${BERT_JAX_TEST_WORKERS:-2}" --dist loadfile)
[ "${BERT_JAX_TEST_WORKERS:-2}" = "0" ] && workers=()
python -m pytest -q "${workers[@]}" "$@"
rc=$?
# pytest exits 5 when a selection holds no test; that is not a failure of the suite.
[ $rc -eq 5 ] && rc=0
if [ $rc -ne 0 ]; then
  echo "tests FAILED (pytest rc=$rc)"
  exit 1
fi
echo "all tests passed"
