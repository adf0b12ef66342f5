# Shared helpers of the launch/*.sh scripts; sourced, never run. Loads launch/config.env (or
# $LAUNCH_CONFIG) and defines logging, variable checks and the gcloud calls they share.
# shellcheck shell=bash source-path=SCRIPTDIR

LAUNCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # used by the scripts that source this file
REPO_ROOT="$(dirname "$LAUNCH_DIR")"
SCRIPT="$(basename "$0")"
LAUNCH_CONFIG="${LAUNCH_CONFIG:-$LAUNCH_DIR/config.env}"

info() { echo "[$SCRIPT] $*" >&2; }
die() { echo "[$SCRIPT] error: $*" >&2; exit 1; }

# Prints the comment block at the top of the calling script (line 2 up to the first blank line).
usage() { sed -n '2,/^$/{s/^# \{0,1\}//;p;}' "$0"; }

# Handles --help before anything else, so it works without a config or gcloud.
maybe_help() {
  local a
  for a in "$@"; do
    case "$a" in
      -h|--help) usage; exit 0 ;;
      --) return 0 ;;
    esac
  done
}

load_config() {
  [ -f "$LAUNCH_CONFIG" ] || die "LAUNCH_CONFIG=$LAUNCH_CONFIG: no such file; copy launch/config.env and point LAUNCH_CONFIG at the copy."
  # shellcheck source=config.env
  source "$LAUNCH_CONFIG"
  if [ -z "${RUNTIME_VERSION:-}" ]; then
    case "${ACCELERATOR_TYPE:-}" in
      v5litepod-*|v5e-*) RUNTIME_VERSION=v2-alpha-tpuv5-lite ;;
      v5p-*) RUNTIME_VERSION=v2-alpha-tpuv5 ;;
      v6e-*) RUNTIME_VERSION=v2-alpha-tpuv6e ;;
      *) RUNTIME_VERSION=tpu-ubuntu2204-base ;;
    esac
  fi
  case "${CAPACITY:-}" in
    on-demand|queued|spot|reserved|best-effort) ;;
    *) die "CAPACITY='${CAPACITY:-}': expected one of on-demand, queued, spot, reserved, best-effort (see launch/config.env)." ;;
  esac
}

# require_vars NAME...: one clear error listing every empty variable.
require_vars() {
  local missing=() v
  for v in "$@"; do
    [ -n "${!v:-}" ] || missing+=("$v")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    die "not set: ${missing[*]}; export each (e.g. export ${missing[0]}=...) or set it in $LAUNCH_CONFIG."
  fi
}

require_gcloud() {
  command -v gcloud >/dev/null 2>&1 || die "gcloud not found on PATH: install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install) and run 'gcloud auth login'."
}

uses_queued_resource() { [ "$CAPACITY" != on-demand ]; }

# Hosts (workers) in the slice, from the accelerator type; 0 when unknown. v2-v4 and v5p count
# TensorCores (8 per host: 4 chips x 2 cores), v5e/v6e count chips (8 on a 1-host slice, else 4
# per host): v4-8 -> 1, v5p-32 -> 4, v5litepod-8 -> 1, v5litepod-16 -> 4.
num_hosts() {
  local gen="${ACCELERATOR_TYPE%-*}" n="${ACCELERATOR_TYPE##*-}"
  case "$n" in ''|*[!0-9]*) echo 0; return ;; esac
  case "$gen" in
    v2|v3|v4|v5p) echo $(( n <= 8 ? 1 : n / 8 )) ;;
    v5litepod|v5e|v6e) echo $(( n <= 8 ? 1 : n / 4 )) ;;
    *) echo 0 ;;
  esac
}

# Array of the flags every gcloud tpus command takes.
loc_flags() { LOC=(--project="$PROJECT" --zone="$ZONE"); }

# tpu_ssh WORKER COMMAND: run COMMAND (a bash line) on worker WORKER (0, 1, all).
tpu_ssh() {
  local LOC; loc_flags
  gcloud compute tpus tpu-vm ssh "$TPU_NAME" "${LOC[@]}" --worker="$1" --command="$2"
}

# Joins its arguments into one line that bash on the worker splits back into the same words.
quote_words() {
  local out="" w
  for w in "$@"; do out+="$(printf '%q' "$w") "; done
  echo "${out% }"
}

# describe_state KIND NAME: prints the state of a tpu-vm node or a queued resource; MISSING when
# it does not exist; UNKNOWN (and the error on stderr) when gcloud fails for another reason.
describe_state() {
  local kind="$1" name="$2" field out rc=0 LOC; loc_flags
  if [ "$kind" = tpu-vm ]; then field='value(state)'; else field='value(state.state)'; fi
  out="$(gcloud compute tpus "$kind" describe "$name" "${LOC[@]}" --format="$field" 2>&1)" || rc=$?
  if [ "$rc" -eq 0 ] && [ -n "$out" ]; then
    echo "$out"
  elif grep -qiE 'NOT_FOUND|not found' <<<"$out"; then
    echo MISSING
  else
    echo "$out" >&2
    echo UNKNOWN
  fi
}

# slice_state: one word for the whole slice, from the node and (if used) its queued resource:
# READY, WAITING (being created or queued), BROKEN (preempted, failed, suspended, stopped:
# must be deleted and re-created), MISSING, UNKNOWN.
slice_state() {
  local qr node
  if uses_queued_resource; then
    qr="$(describe_state queued-resources "$QUEUED_RESOURCE")"
    case "$qr" in
      ACTIVE) ;;
      MISSING|UNKNOWN) echo "$qr"; return ;;
      ACCEPTED|CREATING|PROVISIONING|WAITING_FOR_RESOURCES) echo WAITING; return ;;
      *) echo BROKEN; return ;;  # FAILED, SUSPENDING, SUSPENDED, DELETING
    esac
  fi
  node="$(describe_state tpu-vm "$TPU_NAME")"
  case "$node" in
    READY) echo READY ;;
    MISSING) if uses_queued_resource; then echo BROKEN; else echo MISSING; fi ;;  # node of an
                                                        # ACTIVE queued resource gone: re-create
    UNKNOWN) echo UNKNOWN ;;
    CREATING|STARTING|RESTARTING|REPAIRING|REIMAGING) echo WAITING ;;
    *) echo BROKEN ;;  # PREEMPTED, TERMINATED, STOPPED, STOPPING, DELETING, HIDDEN
  esac
}
