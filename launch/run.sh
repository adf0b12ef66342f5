#!/usr/bin/env bash
# Start the trainer on every worker of TPU_NAME with identical flags, then stream worker 0's log.
#
#   launch/run.sh [--restart] [--no-follow] [-- TRAINER_FLAGS...]
#   launch/run.sh --attach          # only stream worker 0's log again (after an ssh drop)
#
# Runs `python -m MODULE --config=CONFIG --workdir=WORKDIR TRAINER_FLAGS...` on all workers at
# once (`gcloud compute tpus tpu-vm ssh --worker=all --command=...`): one command line, so every
# host gets the same flags. Each worker starts it with nohup (launch/remote_run.sh), so closing
# this terminal or losing ssh does not stop training. Then `tail -f` of worker 0's log (only
# process 0 logs and writes summaries) until training ends; exits with worker 0's exit code.
# --restart stops a run already going on the workers first; --no-follow returns once started.
# With MODULE other than bert_jax.train (e.g. MODULE=launch.pod_check), --config/--workdir are
# not added. Needs PROJECT, ZONE, TPU_NAME, and WORKDIR (or BUCKET); on a multi-host slice
# WORKDIR must be gs://, since every host writes its part of each checkpoint there.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

restart=() follow=1 attach=0
while [ $# -gt 0 ]; do
  case "$1" in
    --restart) restart=(--restart) ;;
    --no-follow) follow=0 ;;
    --attach) attach=1 ;;
    --) shift; break ;;
    *) die "unknown argument '$1' (trainer flags go after --); see launch/run.sh --help" ;;
  esac
  shift
done

load_config
require_vars PROJECT ZONE TPU_NAME MODULE REMOTE_DIR VENV_DIR LOG_DIR
require_gcloud
remote_run="bash $(quote_words "$REMOTE_DIR/launch/remote_run.sh")"

if [ "$attach" -eq 0 ]; then
  cmd=(python -m "$MODULE")
  if [ "$MODULE" = bert_jax.train ]; then
    require_vars CONFIG WORKDIR
    hosts="$(num_hosts)"
    if [ "$hosts" -gt 1 ] && [[ "$WORKDIR" != gs://* ]]; then
      die "WORKDIR=$WORKDIR is not on GCS but $ACCELERATOR_TYPE has $hosts hosts, which must all write the same checkpoints: set WORKDIR=gs://BUCKET/runs/NAME (or BUCKET=gs://...)."
    fi
    cmd+=(--config="$CONFIG" --workdir="$WORKDIR")
  fi
  cmd+=("$@")
  info "starting on every worker of $TPU_NAME: ${cmd[*]}"
  tpu_ssh all "$remote_run start $(quote_words --venv="$VENV_DIR" --logdir="$LOG_DIR" \
    ${restart[@]+"${restart[@]}"} -- "${cmd[@]}")"
  if [ "$follow" -eq 0 ]; then
    info "started; follow worker 0's log with: launch/run.sh --attach"
    exit 0
  fi
fi
info "streaming worker 0's log (Ctrl-C stops the streaming, not the training)"
tpu_ssh 0 "$remote_run follow $(quote_words --logdir="$LOG_DIR")"
