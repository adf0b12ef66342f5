#!/usr/bin/env bash
# Create the TPU VM or pod slice described by launch/config.env (or $LAUNCH_CONFIG).
#
#   launch/create.sh [--no-wait]
#
# CAPACITY=on-demand runs `gcloud compute tpus tpu-vm create`, which returns once the VM is
# READY. Every other CAPACITY (queued, spot, reserved, best-effort) creates a queued resource
# QUEUED_RESOURCE whose node is TPU_NAME, then polls it every POLL_SECONDS until it is ACTIVE
# (at most CREATE_TIMEOUT_SECONDS); --no-wait returns right after the request is queued.
# Needs PROJECT, ZONE, ACCELERATOR_TYPE, TPU_NAME.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

wait_active=1
for arg in "$@"; do
  case "$arg" in
    --no-wait) wait_active=0 ;;
    *) die "unknown argument '$arg'; see launch/create.sh --help" ;;
  esac
done

load_config
require_vars PROJECT ZONE ACCELERATOR_TYPE RUNTIME_VERSION TPU_NAME
require_gcloud
loc_flags

create=()
if [ -n "$SERVICE_ACCOUNT" ]; then
  create+=(--service-account="$SERVICE_ACCOUNT" --scopes=cloud-platform)
fi
if [ -n "$EXTRA_CREATE_FLAGS" ]; then
  read -r -a extra <<<"$EXTRA_CREATE_FLAGS"
  create+=("${extra[@]}")
fi

hosts="$(num_hosts)"
if ! uses_queued_resource; then
  info "creating $TPU_NAME: $ACCELERATOR_TYPE (${hosts/#0/?} hosts), $RUNTIME_VERSION, on-demand, in $ZONE"
  gcloud compute tpus tpu-vm create "$TPU_NAME" "${LOC[@]}" \
    --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
    ${create[@]+"${create[@]}"}
  info "$TPU_NAME is READY; next: launch/setup.sh"
  exit 0
fi

alpha=()
case "$CAPACITY" in
  spot) create+=(--spot) ;;
  reserved) create+=(--reserved) ;;
  best-effort) alpha=(alpha); create+=(--best-effort) ;;  # only in gcloud alpha
  queued) ;;
esac
info "queueing $QUEUED_RESOURCE for node $TPU_NAME: $ACCELERATOR_TYPE (${hosts/#0/?} hosts), $RUNTIME_VERSION, $CAPACITY, in $ZONE"
gcloud ${alpha[@]+"${alpha[@]}"} compute tpus queued-resources create "$QUEUED_RESOURCE" "${LOC[@]}" \
  --node-id="$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" \
  --runtime-version="$RUNTIME_VERSION" ${create[@]+"${create[@]}"}
if [ "$wait_active" -eq 0 ]; then
  info "queued; watch it with: gcloud compute tpus queued-resources describe $QUEUED_RESOURCE --project=$PROJECT --zone=$ZONE"
  exit 0
fi

start=$SECONDS
while true; do
  state="$(describe_state queued-resources "$QUEUED_RESOURCE")"
  case "$state" in
    ACTIVE) info "$QUEUED_RESOURCE is ACTIVE: $TPU_NAME is up; next: launch/setup.sh"; exit 0 ;;
    FAILED|SUSPENDED|SUSPENDING|MISSING)
      die "$QUEUED_RESOURCE is $state: see 'gcloud compute tpus queued-resources describe $QUEUED_RESOURCE --project=$PROJECT --zone=$ZONE' (often: no quota or capacity for $ACCELERATOR_TYPE in $ZONE); delete it with launch/delete.sh and retry" ;;
  esac
  if (( SECONDS - start >= CREATE_TIMEOUT_SECONDS )); then
    die "$QUEUED_RESOURCE still $state after ${CREATE_TIMEOUT_SECONDS}s (CREATE_TIMEOUT_SECONDS); the request stays queued: check it with 'gcloud compute tpus queued-resources list --project=$PROJECT --zone=$ZONE' or delete it with launch/delete.sh"
  fi
  info "$QUEUED_RESOURCE is $state; checking again in ${POLL_SECONDS}s"
  sleep "$POLL_SECONDS"
done
