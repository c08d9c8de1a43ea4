#!/usr/bin/env bash
# Creates .venv and installs everything the studio and its tests need.
# Idempotent: a second run only checks what is already there (seconds).
# Versions come from constraints.txt (the set the tests passed with). To move to the newest
# versions pyproject.toml allows and pin them again:  ./setup.sh --refresh-constraints
set -euo pipefail
cd "$(dirname "$0")"

REFRESH=0
case "${1:-}" in
  --refresh-constraints) REFRESH=1 ;;
  "") ;;
  *) echo "usage: ./setup.sh [--refresh-constraints]" >&2; exit 2 ;;
esac

PY=${PYTHON:-python3}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
STAMP=.venv/.setup-stamp
WANT="$(cat pyproject.toml setup.sh constraints.txt | sha256sum | cut -c1-16)"

if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python

install_torch() {
  # torch first, or pip pulls the CUDA wheels as a dependency of diffusers/accelerate.
  if ! "$VPY" -c "import torch" 2>/dev/null; then
    # Where nvidia-smi works PyPI's default wheel is the CUDA build; on this project's
    # CPU machines the configured wheel source serves the CPU build of the same version.
    echo "[setup] installing torch $TORCH_VERSION"
    "$VPY" -m pip install --quiet "torch==$TORCH_VERSION"
  fi
}

if [ "$REFRESH" = "1" ]; then
  install_torch
  echo "[setup] upgrading to the newest versions pyproject.toml allows (no constraints)"
  "$VPY" -m pip install --quiet --upgrade --upgrade-strategy eager -e ".[test]" "torch==$TORCH_VERSION"
  "$VPY" tools/freeze_constraints.py constraints.txt
  echo "[setup] run the tests, then commit constraints.txt"
  WANT="$(cat pyproject.toml setup.sh constraints.txt | sha256sum | cut -c1-16)"
  echo "$WANT" > "$STAMP"
elif [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then
  echo "[setup] .venv is up to date"
else
  "$VPY" -m pip install --quiet --upgrade pip
  install_torch
  echo "[setup] installing the project with test extras (versions from constraints.txt)"
  "$VPY" -m pip install --quiet -e ".[test]" -c constraints.txt
  echo "$WANT" > "$STAMP"
fi

# The browser tests drive Debian's chromium (never `playwright install`).
if [ "${SKIP_CHROMIUM:-0}" != "1" ] && ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing chromium (apt)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
      || echo "[setup] warning: chromium could not be installed; browser tests will be skipped"
  else
    echo "[setup] note: chromium not found; install it (apt-get install chromium) for the browser tests"
  fi
fi
echo "[setup] done. Start the studio: .venv/bin/python app.py"
