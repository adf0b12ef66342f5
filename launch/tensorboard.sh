#!/usr/bin/env bash
# Show the run in TensorBoard on this machine.
#
#   launch/tensorboard.sh [--live] [--port=6006]
#
# Default: launch/fetch_logs.sh, then `tensorboard --logdir runs/TPU_NAME/tensorboard`.
# --live: `tensorboard --logdir WORKDIR` straight on gs:// (TensorBoard reads GCS through
# TensorFlow's file system; needs `gcloud auth application-default login`), always current.
# TensorBoard comes with the pinned tensorflow in .venv.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

live=0 port=6006
for arg in "$@"; do
  case "$arg" in
    --live) live=1 ;;
    --port=*) port="${arg#*=}" ;;
    *) die "unknown argument '$arg'; see launch/tensorboard.sh --help" ;;
  esac
done

load_config
require_vars TPU_NAME WORKDIR
command -v tensorboard >/dev/null 2>&1 || die "tensorboard not found on PATH: activate the project's .venv (source .venv/bin/activate) or pip install tensorboard."
if [ "$live" -eq 1 ]; then
  [[ "$WORKDIR" == gs://* ]] || die "--live needs WORKDIR on gs:// (got $WORKDIR); drop --live to fetch the logs instead."
  logdir="$WORKDIR"
else
  "$LAUNCH_DIR/fetch_logs.sh"
  logdir="runs/$TPU_NAME/tensorboard"
fi
info "TensorBoard on http://localhost:$port for $logdir"
exec tensorboard --logdir "$logdir" --port "$port"
