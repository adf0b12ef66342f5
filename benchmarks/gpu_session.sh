#!/usr/bin/env bash
# Issue 29's measurements in ONE device call (about 8 minutes on one H100): versions and the card,
# then BERT-large seq 512 and BERT-base seq 128, each as: the PyTorch peer (transformers
# BertForPreTraining, SDPA, bf16 autocast, torch.compile, fused AdamW) on the same rows, then ours
# (packed rows, the pallas_gpu kernel: the fastest measured on 2026-11-25) with a 3-step profile
# and the table of where the step's time goes, then the ratios.
#
#   bash benchmarks/gpu_session.sh                  # on the GPU machine, from the repo root
#   SMOKE=1 PY=.venv/bin/python bash benchmarks/gpu_session.sh   # the same path on CPU (tiny model)
#
# Knobs (environment): CASES="large512 base128" (in this order: the target case first), BACKEND
# (pallas_gpu), PACKING (packed; both adds ours unpacked and the row-for-row ratio, one more
# compile per case: BACKEND=auto then picks cudnn for the padded rows), PEER_SDPA_large512 (default,cudnn), PEER_SDPA_base128 (default), STEPS (30),
# TIMEOUT_large512 / TIMEOUT_base128 (s per case: 330 / 190), PEER_TIMEOUT (s per peer run,
# torch.compile included: 100), OUT (where logs and the profiles' tarball go; the device tool's
# $OUT brings them back). Worst case 330 + 190 s + start-up: call the tool with timeout_s=600.
# Expected (2026-11-25 runs): ours ~2-3 min per case, nearly all XLA's compile and autotuning;
# the peer's torch.compile of BERT is not yet timed on that machine (hence its timeout).
#
# Order inside a case: the peer runs first, in its own process, because JAX keeps 75% of the
# GPU's memory from its first step on; ours follows in the benchmark's process. Every piece has a
# timeout, so a slow compile costs its own figure, not the session: a peer past PEER_TIMEOUT is
# reported and skipped, a case past CASE_TIMEOUT is cut (its log keeps what it printed).
#
# Packages: the GPU image has jax/jaxlib (CUDA plugin), flax, optax, orbax, torch, transformers;
# anything else bert_jax imports (checked below, e.g. ml_collections) travels as wheels: here,
# before the call,
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 -d .whl \
#     ml-collections==1.1.0
# and call the device tool with carry=[".whl"]; this script installs what it finds in .whl/.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_session}
PROF=/tmp/gpu_session_profiles      # the traces: too deep for $OUT, tarred there at the end
rm -rf "$PROF"; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh   # elapsed, the carried wheels

echo "== versions $(elapsed)"
if ! "$PY" - <<'EOF'
import importlib, platform, sys
from importlib import metadata
names = ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda12-plugin", "flax", "optax",
         "orbax-checkpoint", "ml-collections", "numpy", "torch", "transformers", "triton")
def v(n):
  try:
    return metadata.version(n)
  except metadata.PackageNotFoundError:
    return "-"
print(f"python {platform.python_version()}; " + ", ".join(f"{n} {v(n)}" for n in names))
missing = [m for m in ("ml_collections", "flax", "optax", "orbax.checkpoint", "absl", "torch",
                       "transformers") if importlib.util.find_spec(m.split(".")[0]) is None]
if missing:
  print(f"error: missing Python packages {missing}: carry them as wheels (see this script's "
        "header)", file=sys.stderr)
  sys.exit(2)
EOF
then
  exit 2
fi
git log -1 --format='commit %h %cd' 2>/dev/null || true
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit \
    --format=csv
  "$PY" -c "import torch; print('torch cuda', torch.version.cuda,
                               'cudnn', torch.backends.cudnn.version())"
else
  echo "nvidia-smi: not here (CPU)"
fi

if [ "${SMOKE:-0}" = 1 ]; then
  export JAX_PLATFORMS=cpu
  CASES=${CASES:-smoke}
  COMMON=(--smoke --peer_steps=2)
  BACKEND=${BACKEND:-xla}
else
  CASES=${CASES:-large512 base128}
  COMMON=(--steps="${STEPS:-30}" --warmup=3 --peer_steps=20 --peer_warmup=5)
  BACKEND=${BACKEND:-pallas_gpu}
fi

for case in $CASES; do
  sdpa_var="PEER_SDPA_$case"
  default_sdpa=default
  [ "$case" = large512 ] && default_sdpa=default,cudnn
  echo "== $case: torch peer (sdpa ${!sdpa_var:-$default_sdpa}), then ours ($BACKEND, packed," \
       "profiled) $(elapsed)"
  timeout_var="TIMEOUT_$case"
  default_timeout=190
  [ "$case" = large512 ] && default_timeout=330
  timeout "${!timeout_var:-$default_timeout}" \
    "$PY" -m benchmarks.accelerator --cases="$case" --packing="${PACKING:-packed}" \
    --backends="$BACKEND" "${COMMON[@]}" --profile_dir="$PROF" --profile_steps=3 \
    --peer=torch --peer_sdpa="${!sdpa_var:-$default_sdpa}" --peer_timeout="${PEER_TIMEOUT:-100}" \
    2>&1 | tee "$OUT/$case.log"
  echo "== $case: exit ${PIPESTATUS[0]} $(elapsed)"
done

# The traces (TensorBoard / Perfetto) and each run's HLO, if small enough to come back (16 MiB).
tar czf "$OUT/profiles.tgz" -C "$(dirname "$PROF")" "$(basename "$PROF")" 2>/dev/null
size=$(stat -c %s "$OUT/profiles.tgz" 2>/dev/null || echo 0)
if [ "$size" -gt 16000000 ]; then
  rm -f "$OUT/profiles.tgz"; echo "profiles.tgz: $size bytes, over 16 MB: not kept"
fi
echo "== done $(elapsed)"
