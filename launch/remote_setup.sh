#!/usr/bin/env bash
# Runs ON EACH TPU WORKER (launch/setup.sh starts it with --worker=all): makes a Python 3.11
# virtualenv and installs the pinned requirements plus jax[tpu] at the same jax version.
#
#   bash bert_jax/launch/remote_setup.sh --venv=DIR --python=3.11 --uv=UV_VERSION
#
# Run from the home directory; the code is in the directory that holds this script's parent.
# The TPU images (Ubuntu 22.04) ship Python 3.10 while the pins need 3.11: where python3.11 is
# missing, uv (pinned, from PyPI) fetches a standalone CPython 3.11.

set -euo pipefail
venv="" python_version="3.11" uv_version=""
for arg in "$@"; do
  case "$arg" in
    --venv=*) venv="${arg#*=}" ;;
    --python=*) python_version="${arg#*=}" ;;
    --uv=*) uv_version="${arg#*=}" ;;
    -h|--help) sed -n '2,/^$/{s/^# \{0,1\}//;p;}' "$0"; exit 0 ;;
    *) echo "remote_setup.sh: unknown argument '$arg'" >&2; exit 2 ;;
  esac
done
[ -n "$venv" ] || { echo "remote_setup.sh: --venv=DIR is required" >&2; exit 2; }
code="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
host="$(hostname)"
say() { echo "[setup $host] $*"; }

jax_version="$(sed -n 's/^jax==\([0-9.]*\).*/\1/p' "$code/requirements.txt")"
[ -n "$jax_version" ] || { echo "[setup $host] error: no 'jax==X' pin in $code/requirements.txt" >&2; exit 1; }

if [ ! -x "$venv/bin/python" ]; then
  if command -v "python$python_version" >/dev/null 2>&1; then
    say "creating $venv with $(command -v "python$python_version")"
    "python$python_version" -m venv "$venv"
  else
    say "python$python_version not on this image; installing uv==$uv_version to fetch it"
    # pip on Ubuntu 22.04 images; 24.04 images need --break-system-packages (PEP 668) for a
    # --user install; with no pip at all, uv's own installer.
    python3 -m pip install --user --quiet "uv==$uv_version" 2>/dev/null \
      || python3 -m pip install --user --quiet --break-system-packages "uv==$uv_version" 2>/dev/null \
      || curl -LsSf "https://astral.sh/uv/$uv_version/install.sh" | sh
    "$HOME/.local/bin/uv" venv --seed --python "$python_version" "$venv"
  fi
fi
"$venv/bin/python" -m pip install --quiet --upgrade pip
say "installing requirements.txt + jax[tpu]==$jax_version (a few minutes)"
# One resolver run: jax[tpu] adds the matching libtpu wheel from PyPI to the pinned set.
"$venv/bin/python" -m pip install --quiet -r "$code/requirements.txt" "jax[tpu]==$jax_version"
"$venv/bin/python" -c 'import jax, libtpu, flax, optax, orbax.checkpoint; print("[setup] jax", jax.__version__, "flax", flax.__version__)'
say "done"
