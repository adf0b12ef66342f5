#!/usr/bin/env bash
# Issue 38's measurements in ONE device call (<= 9 minutes on one H100/H200): the versions; the
# new kernels' correctness on the chip (cuDNN with in-kernel attention dropout: per-run masks and
# the backward on the forward's mask; FP8 and the fused epilogues' numerics); then BERT-large/512
# in one process: the PyTorch peer (transformers + torch.compile, unpacked, attention dropout
# 0.1), ours unpacked and packed with the recipe's attention dropout 0.1, each lever alone and all
# together, 20 timed steps and a 3-step profile each, a versions tag on every row, and the ratio
# of every row to the peer (row for row where ours is unpacked too).
#
#   bash benchmarks/gpu_ab.sh                     # on the GPU machine, from the repo root
#   VARIANTS=cudnn@drop@resnorm,pallas_gpu UNPACKED_VARIANTS= bash benchmarks/gpu_ab.sh  # 2nd call
#   SMOKE=1 PY=.venv/bin/python bash benchmarks/gpu_ab.sh   # the same path on CPU (tiny model)
#
# Variants (benchmarks/accelerator.py's docstring): BACKEND@LEVER..., levers `drop` (attention
# dropout 0.1: cuDNN drops in its kernel, xla on the probabilities; pallas_gpu has none and is
# refused; `auto` does not pick cuDNN with dropout until the check below has passed on a chip,
# so the variants name cudnn), `fp8` (config.model.fp8), `gelu` (fused_bias_gelu, with the
# tanh GELU cuBLASLt's epilogue needs: a change of the recipe, named), `resnorm`
# (fused_residual_norm), `all` (the four). Defaults, in priority order (unpacked runs first):
#   UNPACKED_VARIANTS  cudnn@drop,cudnn@all                  (row for row against the peer)
#   VARIANTS           cudnn@drop@K8,cudnn@all@K8,cudnn@drop@K8@fp8,cudnn@drop@K8@gelu,
#                      cudnn@drop@K8@resnorm,cudnn@drop
# (`@K8`: rows of at most 8 instances, so cuDNN's ragged layout has 8 slots a row, not 32: on
# 2026-11-27 its backward memset a 2.18 GB dQ buffer per layer, B x 32 x T x H fp32, 11.4 ms a
# step; the quick start's lengths at seq 512 pack to the same fill with K = 8 as with 32.
# `cudnn@drop`: the 2026-11-27 figure, rerun. One variant's compile took 174 s that day.) BUDGET_S (330): no variant starts
# once the seconds gone plus the longest run so far would pass it; the ones not run are printed,
# for a second call. CUBLASLT (1): XLA_FLAGS=--xla_gpu_enable_cublaslt=true for every run of ours
# (baseline included, so the rows compare), the GEMM rewriter's path to bias+GELU epilogues;
# dropped with a line if this XLA does not know the flag. Timeouts: CHECK_TIMEOUT (75 s),
# AB_TIMEOUT (420 s), PEER_TIMEOUT (100 s). Call the device tool with timeout_s=570.
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

echo "== versions $(elapsed)"
"$PY" -c "from benchmarks import accelerator; print(accelerator.provenance())" | tee "$OUT/versions.log"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
  --format=csv,noheader 2>/dev/null | tee -a "$OUT/versions.log"

if [ "${SMOKE:-0}" = 1 ]; then
  export JAX_PLATFORMS=cpu
  CASE=smoke
  COMMON=(--smoke --peer_steps=2)
  : "${UNPACKED_VARIANTS=auto@drop}" "${VARIANTS=auto@drop,auto@all}" "${CHECKS:=0}"
  CUBLASLT=0
else
  CASE=large512
  COMMON=(--steps="${STEPS:-20}" --warmup=3 --peer_steps=20 --peer_warmup=5)
  : "${UNPACKED_VARIANTS=cudnn@drop,cudnn@all}"
  : "${VARIANTS=cudnn@drop@K8,cudnn@all@K8,cudnn@drop@K8@fp8,cudnn@drop@K8@gelu,cudnn@drop@K8@resnorm,cudnn@drop}"
fi

# cuDNN's attention with dropout aborts XLA 0.11.2 inside CUDA graphs (2026-11-27, H200:
# "Check failed: local_device_ordinal.has_value()"): keep cuDNN out of them for every run, the
# checks included (attention.CUDNN_DROPOUT_XLA_FLAG; the training programs set it themselves).
[ "${SMOKE:-0}" = 1 ] || export XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL ${XLA_FLAGS:-}"
# XLA's per-fusion autotuning results, kept between calls: one large512 variant took 174 s to
# compile on 2026-11-27, most of it autotuning, on a machine that starts bare each session. The
# results of a call come back in $OUT/autotune; copy them to .gpu_cache/autotune here (ignored by
# git) and carry it: `run(..., carry=[".whl", ".gpu_cache"])`. XLA keys each entry by the fusion
# and the device, so entries from another GPU or a changed fusion are simply not used.
AUTOTUNE_DIR=${AUTOTUNE_DIR:-$PWD/.gpu_cache/autotune}
if [ "${SMOKE:-0}" != 1 ]; then
  mkdir -p "$AUTOTUNE_DIR"
  echo "autotune cache: $(find "$AUTOTUNE_DIR" -type f | wc -l) entries carried in"
  export XLA_FLAGS="--xla_gpu_per_fusion_autotune_cache_dir=$AUTOTUNE_DIR $XLA_FLAGS"
fi

if [ "${CHECKS:-1}" = 1 ]; then
  echo "== correctness on the chip $(elapsed)"
  timeout "${CHECK_TIMEOUT:-75}" "$PY" -m pytest -q -p no:cacheprovider -p no:xdist \
    tests/bert_jax/layers/attention_test.py tests/bert_jax/layers/fp8_test.py tests/bert_jax/layers/fused_ops_test.py \
    -k "cudnn_equals or cudnn_dropout_masks or without_its_scales or used_twice or gelu_tanh_is \
or residual_layer_norm_equals" 2>&1 | tail -15 | tee "$OUT/check.log"
fi

if [ "${CUBLASLT:-1}" = 1 ]; then
  if XLA_FLAGS="--xla_gpu_enable_cublaslt=true ${XLA_FLAGS:-}" timeout 60 "$PY" -c \
      "import jax; jax.devices()" >/dev/null 2>&1; then
    export XLA_FLAGS="--xla_gpu_enable_cublaslt=true ${XLA_FLAGS:-}"
    echo "XLA_FLAGS=$XLA_FLAGS (every run of ours)"
  else
    echo "this XLA does not take --xla_gpu_enable_cublaslt: runs without it"
  fi
fi

packing=both
[ -z "$UNPACKED_VARIANTS" ] && packing=packed
echo "== $CASE: peer, then ours unpacked ($UNPACKED_VARIANTS) and packed ($VARIANTS) $(elapsed)"
timeout "${AB_TIMEOUT:-420}" "$PY" -m benchmarks.accelerator --cases="$CASE" \
  --packing="$packing" --unpacked_backends="$UNPACKED_VARIANTS" --backends="$VARIANTS" \
  "${COMMON[@]}" --profile_dir="$PROF" --profile_steps=3 --budget_s="${BUDGET_S:-330}" \
  --peer=torch --peer_sdpa=default --peer_attention_dropout=0.1 \
  --peer_timeout="${PEER_TIMEOUT:-100}" 2>&1 | tee "$OUT/ab.log"
echo "== exit ${PIPESTATUS[0]} $(elapsed)"
tar czf "$OUT/profiles.tgz" -C "$(dirname "$PROF")" "$(basename "$PROF")" 2>/dev/null
size=$(stat -c %s "$OUT/profiles.tgz" 2>/dev/null || echo 0)
[ "$size" -gt 16000000 ] && { rm -f "$OUT/profiles.tgz"; echo "profiles.tgz: $size bytes: not kept"; }
if [ "${SMOKE:-0}" != 1 ]; then
  mkdir -p "$OUT/autotune" && cp -r "$AUTOTUNE_DIR"/. "$OUT/autotune/" 2>/dev/null
  echo "autotune cache: $(find "$OUT/autotune" -type f | wc -l) entries in \$OUT/autotune"
fi
echo "== done $(elapsed)"
