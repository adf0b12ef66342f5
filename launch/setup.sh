#!/usr/bin/env bash
# Copy this checkout to every worker of TPU_NAME and install the environment there.
#
#   launch/setup.sh [--code-only]
#
# 1. Packs the checkout (tracked and untracked files that git does not ignore: the same code
#    you see, uncommitted edits included) into a tarball and copies it to every worker
#    (`gcloud compute tpus tpu-vm scp --worker=all`), unpacking it into ~/REMOTE_DIR.
# 2. Runs launch/remote_setup.sh on every worker (`ssh --worker=all`): a Python 3.11
#    virtualenv ~/VENV_DIR with requirements.txt and jax[tpu] at the jax version pinned there.
#    --code-only skips this step (after the first setup, to ship a code change quickly).
# Every worker gets the same files, so all hosts run identical code; the trainer checks that
# the config and vocab hash the same on every host at start-up.

set -euo pipefail
# shellcheck source-path=SCRIPTDIR
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
maybe_help "$@"

install=1
for arg in "$@"; do
  case "$arg" in
    --code-only) install=0 ;;
    *) die "unknown argument '$arg'; see launch/setup.sh --help" ;;
  esac
done

load_config
require_vars PROJECT ZONE TPU_NAME REMOTE_DIR VENV_DIR
require_gcloud
loc_flags

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
tarball="$tmp/bert_jax.tgz"
if git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # Files git knows or would add, minus those deleted from the working tree.
  git -C "$REPO_ROOT" ls-files -z --cached --others --exclude-standard \
    | (cd "$REPO_ROOT" && while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done) \
    | tar -C "$REPO_ROOT" --null -czf "$tarball" -T -
else
  tar -C "$REPO_ROOT" -czf "$tarball" --exclude=.git --exclude=.venv --exclude=__pycache__ \
    --exclude=runs --exclude=data .
fi
info "copying $(du -h "$tarball" | cut -f1) of code to every worker of $TPU_NAME"
gcloud compute tpus tpu-vm scp "$tarball" "$TPU_NAME:bert_jax.tgz" "${LOC[@]}" --worker=all

# Unpack next to the old copy, then swap, so a failed copy never leaves half a checkout.
rd="$(quote_words "$REMOTE_DIR")" new="$(quote_words "$REMOTE_DIR.new")"
unpack="rm -rf $new && mkdir -p $new && tar -xzf bert_jax.tgz -C $new && rm -rf $rd && mv $new $rd && rm bert_jax.tgz"
if [ "$install" -eq 1 ]; then
  remote="$unpack && bash $rd/launch/remote_setup.sh $(quote_words --venv="$VENV_DIR" --python="$PYTHON_VERSION" --uv="$UV_VERSION")"
else
  remote="$unpack"
fi
info "setting up every worker of $TPU_NAME (--worker=all)"
tpu_ssh all "set -e; $remote"
info "done; next: launch/run.sh"
