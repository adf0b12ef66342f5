#!/usr/bin/env bash
# The full test suite: every test, the quick tier's (scripts/run_tests.sh) and the slow ones
# (2-process pods, kill -9, learning runs, TPU compiles, exhaustive checks), <= 60 min on a 2-core
# CPU box. What CI's `.ci/run` runs. Extra arguments go to pytest.
BERT_JAX_TEST_TIER=full exec bash "$(dirname "${BASH_SOURCE[0]}")/run_tests.sh" "$@"
