#!/usr/bin/env bash
# Idempotent install for a fresh machine: the Python environment, the Triton
# sidecar's runtime and the sample models. Heavy wheels come from pip's cache
# after the first run, so a second machine-local run takes seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv

stamp=".venv/.installed-$(cat pyproject.toml | sha1sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "install: Python dependencies (first run downloads torch with its CUDA wheels, ~3 GB; cached afterwards)"
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e '.[worker,operator,router,test]'
  touch "$stamp"
fi

scripts/install-triton.sh
.venv/bin/hotset-samples --out build/models
