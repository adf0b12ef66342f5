#!/usr/bin/env bash
# Delete the TPU VM / pod slice (and its queued resource), so it stops costing money.
#
#   launch/delete.sh
#
# CAPACITY=on-demand: `gcloud compute tpus tpu-vm delete TPU_NAME`. Otherwise
# `gcloud compute tpus queued-resources delete QUEUED_RESOURCE --force`, which deletes the node
# too. Asks no question (--quiet). Data and checkpoints on gs:// are kept; anything only on the
# workers' disks (a local WORKDIR, ~/LOG_DIR) is lost: run launch/fetch_logs.sh first.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"
[ $# -eq 0 ] || die "unknown argument '$1'; see launch/delete.sh --help"

load_config
require_vars PROJECT ZONE TPU_NAME
require_gcloud
loc_flags
if uses_queued_resource; then
  info "deleting queued resource $QUEUED_RESOURCE and its node $TPU_NAME"
  gcloud compute tpus queued-resources delete "$QUEUED_RESOURCE" "${LOC[@]}" --force --quiet
else
  info "deleting $TPU_NAME"
  gcloud compute tpus tpu-vm delete "$TPU_NAME" "${LOC[@]}" --quiet
fi
