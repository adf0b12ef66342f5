"""The test suite, in folders mirroring the code (tests/bert_jax/<subpackage>/, tests/data_pipelines/
<subpackage>/, ...); its shared helpers are in tests/testlib/. Every test folder reaches the
repository and the test data through these two names, whatever its depth."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # the repository
DATA = os.path.join(ROOT, "tests", "data")
