#!/usr/bin/env bash
# Issue 29's A/B in ONE device call (about 5 minutes on one H100/H200): does cuDNN's
# flash attention on packed rows (ragged offsets, attention.py `_cudnn_packed`) beat the Pallas
# kernel that the 2026-11-26 profile found taking 27% of BERT-large/512's step, and do bigger
# Pallas backward tiles help? First the kernels' correctness against the xla path on the chip
# (tests/attention_test.py's GPU tests: forward and dQ/dK/dV, bf16), then the variants of
# large512 packed in one process (XLA's autotuning results carry over between them), each
# profiled (benchmarks/profile_table.py's table).
#
#   bash benchmarks/gpu_ab.sh                     # on the GPU machine, from the repo root
#   VARIANTS=pallas_gpu,pallas_gpu@vpad128@headbf16,cudnn@M8 bash benchmarks/gpu_ab.sh
#
# Wheels: as benchmarks/gpu_session.sh says (carry .whl with ml-collections).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
PY=${PY:-python3}
OUT=${OUT:-/tmp/gpu_ab}
PROF=/tmp/gpu_ab_profiles
rm -rf "$PROF"; mkdir -p "$OUT"
# shellcheck source=benchmarks/gpu_common.sh
source benchmarks/gpu_common.sh   # elapsed, the carried wheels
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null

echo "== correctness on the chip $(elapsed)"
timeout "${CHECK_TIMEOUT:-90}" "$PY" -m pytest -q -p no:cacheprovider -p no:xdist \
  tests/attention_test.py -k "cudnn_equals or pallas_gpu_equals" 2>&1 | tail -15 | tee "$OUT/check.log"

echo "== large512 packed: ${VARIANTS:=pallas_gpu,pallas_gpu@vpad128@headbf16,cudnn@M8,pallas_gpu@bwd64} $(elapsed)"
timeout "${AB_TIMEOUT:-250}" "$PY" -m benchmarks.accelerator --cases=large512 --packing=packed \
  --backends="$VARIANTS" --steps="${STEPS:-20}" --warmup=3 --profile_dir="$PROF" \
  --profile_steps=2 2>&1 | tee "$OUT/ab.log"
echo "== exit ${PIPESTATUS[0]} $(elapsed)"
tar czf "$OUT/profiles.tgz" -C "$(dirname "$PROF")" "$(basename "$PROF")" 2>/dev/null
size=$(stat -c %s "$OUT/profiles.tgz" 2>/dev/null || echo 0)
[ "$size" -gt 16000000 ] && { rm -f "$OUT/profiles.tgz"; echo "profiles.tgz: $size bytes: not kept"; }
echo "== done $(elapsed)"
