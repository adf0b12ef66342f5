#!/usr/bin/env bash
# Copy the run's TensorBoard event files and worker 0's train.log to this machine.
#
#   launch/fetch_logs.sh [--dest=DIR]       # default DIR: runs/TPU_NAME
#
# WORKDIR on gs://: `gcloud storage rsync --recursive` of the event files only (checkpoints are
# excluded; they are GBs), into DIR/tensorboard. A worker-local WORKDIR (single host only) is
# copied from worker 0 with `gcloud compute tpus tpu-vm scp --recurse`. Worker 0's
# ~/LOG_DIR/train.log goes to DIR/train.log while the VM exists. Re-run it to refresh.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

dest=""
for arg in "$@"; do
  case "$arg" in
    --dest=*) dest="${arg#*=}" ;;
    *) die "unknown argument '$arg'; see launch/fetch_logs.sh --help" ;;
  esac
done

load_config
require_vars PROJECT ZONE TPU_NAME WORKDIR LOG_DIR
require_gcloud
loc_flags
dest="${dest:-runs/$TPU_NAME}"
mkdir -p "$dest/tensorboard"

if [[ "$WORKDIR" == gs://* ]]; then
  info "syncing TensorBoard event files from $WORKDIR to $dest/tensorboard"
  # --exclude takes a Python regex on the relative path: skip everything but event files.
  gcloud storage rsync --recursive --exclude='^(?!.*tfevents).*$' "$WORKDIR" "$dest/tensorboard"
else
  info "copying $WORKDIR from worker 0 of $TPU_NAME to $dest/tensorboard"
  gcloud compute tpus tpu-vm scp --recurse "$TPU_NAME:$WORKDIR" "$dest/tensorboard" "${LOC[@]}" --worker=0
fi
if gcloud compute tpus tpu-vm scp "$TPU_NAME:$LOG_DIR/train.log" "$dest/train.log" "${LOC[@]}" --worker=0; then
  info "worker 0's log: $dest/train.log"
else
  info "could not copy worker 0's train.log (VM gone or not started yet); event files are in $dest/tensorboard"
fi
