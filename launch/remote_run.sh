#!/usr/bin/env bash
# Runs ON EACH TPU WORKER (launch/run.sh and preemptible_loop.sh call it over ssh): starts the
# training command detached from the ssh session, reports on it, follows its log, stops it.
#
#   bash bert_jax/launch/remote_run.sh start --venv=DIR --logdir=DIR [--restart] -- CMD...
#   bash bert_jax/launch/remote_run.sh status --logdir=DIR   # running PID | exited RC | not-started
#   bash bert_jax/launch/remote_run.sh follow --logdir=DIR   # tail the log until CMD ends
#   bash bert_jax/launch/remote_run.sh stop --logdir=DIR
#
# start runs CMD in the code directory (the parent of launch/) with the virtualenv first on
# PATH, under nohup + setsid so a dropped ssh connection does not kill it; output goes to
# LOGDIR/train.log (the previous log is kept as train.log.prev), the pid to LOGDIR/train.pid
# and, when CMD ends, its exit code to LOGDIR/train.rc. Relative DIRs are taken from the
# current directory (the home directory under `gcloud ... ssh --command`).

set -euo pipefail
action="${1:-}"
[ $# -gt 0 ] && shift
venv="" logdir="" restart=0
while [ $# -gt 0 ]; do
  case "$1" in
    --venv=*) venv="${1#*=}" ;;
    --logdir=*) logdir="${1#*=}" ;;
    --restart) restart=1 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,/^$/{s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
    *) echo "remote_run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
  shift
done
case "$action" in
  start|status|follow|stop) ;;
  -h|--help) sed -n '2,/^$/{s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
  *) echo "remote_run.sh: first argument must be start, status, follow or stop (got '$action')" >&2; exit 2 ;;
esac
[ -n "$logdir" ] || { echo "remote_run.sh: --logdir=DIR is required" >&2; exit 2; }
host="$(hostname)"
mkdir -p "$logdir"
logdir="$(cd "$logdir" && pwd)"
log="$logdir/train.log" pidfile="$logdir/train.pid" rcfile="$logdir/train.rc"

running_pid() {  # prints the pid if the command is still running
  local pid
  [ -f "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}

stop() {
  local pid i
  pid="$(running_pid)" || return 0
  # TERM to the whole process group first (the trainer may checkpoint on it), KILL after 60 s.
  kill -TERM -- "-$pid" 2>/dev/null || true
  for i in $(seq 60); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 1
  done
  echo "[$host] pid $pid ignored SIGTERM for ${i}s; killing it" >&2
  kill -KILL -- "-$pid" 2>/dev/null || true
}

status() {
  local pid
  if pid="$(running_pid)"; then echo "running $pid"
  elif [ -f "$rcfile" ]; then echo "exited $(cat "$rcfile")"
  elif [ -f "$pidfile" ]; then echo "exited unknown"  # killed before it could write its code
  else echo "not-started"
  fi
}

case "$action" in
  start)
    [ $# -gt 0 ] || { echo "remote_run.sh start: no command after --" >&2; exit 2; }
    [ -n "$venv" ] || { echo "remote_run.sh start: --venv=DIR is required" >&2; exit 2; }
    [ -x "$venv/bin/python" ] || { echo "[$host] error: no virtualenv at $venv: run launch/setup.sh first" >&2; exit 1; }
    venv="$(cd "$venv" && pwd)"
    if pid="$(running_pid)"; then
      if [ "$restart" -eq 1 ]; then
        echo "[$host] stopping the running command (pid $pid)"
        stop
      else
        echo "[$host] error: already running (pid $pid); launch/run.sh --restart replaces it" >&2
        exit 1
      fi
    fi
    rm -f "$rcfile"
    [ -f "$log" ] && mv "$log" "$log.prev"
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    export PATH="$venv/bin:$PATH" VIRTUAL_ENV="$venv" PYTHONUNBUFFERED=1 RC_FILE="$rcfile"
    # shellcheck disable=SC2016  # expanded by the inner bash
    nohup setsid bash -c '"$@"; echo $? > "$RC_FILE"' bash "$@" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "[$host] started pid $! in $PWD: $*"
    ;;
  status) status ;;
  stop) stop; status ;;
  follow)
    for _ in $(seq 60); do [ -f "$pidfile" ] && break; sleep 1; done
    [ -f "$pidfile" ] || { echo "[$host] error: nothing started in $logdir" >&2; exit 1; }
    if pid="$(running_pid)"; then
      tail -n +1 --pid="$pid" -F "$log" 2>/dev/null
    else
      cat "$log"
    fi
    s="$(status)"
    echo "[$host] $s"
    case "$s" in "exited 0") exit 0 ;; "exited unknown") exit 1 ;; exited*) exit "${s#exited }" ;; esac
    exit 1
    ;;
esac
