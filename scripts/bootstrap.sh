#!/usr/bin/env bash
# Set up .venv on a fresh machine: CPU torch first (an unpinned torch would pull
# several GB of CUDA packages), then this project with its test extra and the optional ray and fsspec extras (their
# tests run in CI).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check torch==2.13.0
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,ray,fsspec]'
