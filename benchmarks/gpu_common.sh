# shellcheck shell=bash
# Sourced by benchmarks/gpu_session.sh and benchmarks/gpu_ab.sh (from the repo root, with PY set):
# unbuffered Python, TF quiet, `elapsed` for the log, and the wheels carried in .whl/ (packages
# bert_jax needs that the GPU image lacks, e.g. ml-collections) installed into /tmp/site.
export PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
start=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - start )) s]"; }
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
