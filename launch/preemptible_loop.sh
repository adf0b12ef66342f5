#!/usr/bin/env bash
# Keep a run going on spot/preemptible capacity: whenever the slice is reclaimed, delete it,
# create it again, set it up and restart training on the same WORKDIR, which resumes from its
# last checkpoint. Run it on a machine that stays up (a small VM, or under tmux/screen).
#
#   launch/preemptible_loop.sh [--once] [--max-recreates=N] [-- TRAINER_FLAGS...]
#
# Every POLL_SECONDS it reads the slice state (`gcloud compute tpus tpu-vm describe`, and
# `queued-resources describe` for CAPACITY != on-demand):
#   missing                                  -> launch/create.sh, then setup + run
#   PREEMPTED/TERMINATED/STOPPED (node),
#   FAILED/SUSPENDED (queued resource)       -> launch/delete.sh, create.sh, setup + run
#   READY                                    -> asks worker 0 how training is doing: running ->
#                                               wait; exited 0 -> done (exit 0); exited non-zero
#                                               on a slice that stays READY -> stop with an
#                                               error (a bug is not fixed by retrying).
# If the slice is READY with training already running when the loop starts, it adopts that run.
# At most MAX_RECREATES (--max-recreates) re-creations or failed launches, then it gives up.
# --once: stop after the first launch (or adoption) and one status check; for testing.
# WORKDIR must be on gs://: a re-created VM starts with empty disks.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

once=0 max_recreates=""
while [ $# -gt 0 ]; do
  case "$1" in
    --once) once=1 ;;
    --max-recreates=*) max_recreates="${1#*=}" ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (trainer flags go after --); see launch/preemptible_loop.sh --help" ;;
  esac
  shift
done
train_flags=("$@")

load_config
require_vars PROJECT ZONE TPU_NAME WORKDIR LOG_DIR REMOTE_DIR
require_gcloud
max_recreates="${max_recreates:-$MAX_RECREATES}"
case "$max_recreates" in ''|*[!0-9]*) die "--max-recreates / MAX_RECREATES='$max_recreates': expected a whole number." ;; esac
[[ "$WORKDIR" == gs://* ]] || die "WORKDIR=$WORKDIR: the loop needs a gs:// WORKDIR, since a re-created slice starts with empty disks and could not resume; set WORKDIR=gs://BUCKET/runs/NAME."

attempts=0 unknown=0 launched=0
spend_attempt() {  # $1: why
  attempts=$((attempts + 1))
  if [ "$attempts" -gt "$max_recreates" ]; then
    die "$1; giving up after $max_recreates re-creations/relaunches (MAX_RECREATES). The run resumes from $WORKDIR when you start the loop again."
  fi
  info "$1 (attempt $attempts of $max_recreates)"
}

worker0_status() {  # prints running PID | exited RC | not-started | exited unknown | UNKNOWN
  local out
  if out="$(tpu_ssh 0 "bash $(quote_words "$REMOTE_DIR/launch/remote_run.sh") status $(quote_words --logdir="$LOG_DIR")" 2>/dev/null)"; then
    grep -E '^(running|exited|not-started)' <<<"$out" | tail -n 1 || echo UNKNOWN
  else
    echo UNKNOWN
  fi
}

launch() {
  if "$LAUNCH_DIR/setup.sh" && "$LAUNCH_DIR/run.sh" --restart --no-follow -- ${train_flags[@]+"${train_flags[@]}"}; then
    launched=1
    info "training started on $TPU_NAME; checkpoints and summaries go to $WORKDIR"
  else
    spend_attempt "setup or start failed on $TPU_NAME"
  fi
}

first=1
while true; do
  [ "$first" -eq 1 ] || sleep "$POLL_SECONDS"
  first=0
  state="$(slice_state)"
  [ "$state" = UNKNOWN ] || unknown=0
  case "$state" in
    MISSING)
      info "$TPU_NAME does not exist; creating it"
      launched=0
      "$LAUNCH_DIR/create.sh" || spend_attempt "create failed"
      ;;
    BROKEN)
      spend_attempt "$TPU_NAME was preempted or failed; deleting and re-creating it"
      launched=0
      "$LAUNCH_DIR/delete.sh" || info "delete failed; trying to create anyway"
      "$LAUNCH_DIR/create.sh" || info "create failed; will look again in ${POLL_SECONDS}s"
      ;;
    WAITING) info "$TPU_NAME is being created or queued; waiting" ;;
    UNKNOWN)
      unknown=$((unknown + 1))
      [ "$unknown" -lt 10 ] || die "could not read the state of $TPU_NAME 10 times in a row (see the gcloud errors above)."
      ;;
    READY)
      status="$(worker0_status)"
      if [ "$launched" -eq 0 ]; then
        if [[ "$status" == running* ]]; then
          info "$TPU_NAME is READY and training is already running ($status); following it"
          launched=1
        else
          launch
        fi
        [ "$once" -eq 0 ] || [ "$launched" -eq 0 ] || { info "--once: stopping the loop; training goes on"; exit 0; }
        continue
      fi
      case "$status" in
        running*) info "training is running on $TPU_NAME" ;;
        "exited 0") info "training finished (exit 0 on worker 0); the loop is done"; exit 0 ;;
        exited*)
          # A preempted host can kill training a little before the slice shows PREEMPTED.
          sleep "$POLL_SECONDS"
          if [ "$(slice_state)" = READY ]; then
            die "training $status on worker 0 while $TPU_NAME stays READY: a crash, not a preemption; see the log (launch/run.sh --attach or launch/fetch_logs.sh), fix it and start the loop again"
          fi
          ;;
        not-started) spend_attempt "$TPU_NAME is READY but nothing runs (repaired or restarted VM); starting again"; launched=0 ;;
        *) info "could not read training status from worker 0 ($status); looking again" ;;
      esac
      ;;
  esac
done
