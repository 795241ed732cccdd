#!/usr/bin/env bash
# The GPU check on a bare GPU machine (no network), from the repository root (DEVELOPERS.md):
#
#   bash bench/performance/run_gpu_check.sh [gpu_check.py options, e.g. --cpu]
#
# Installs the wheels bench/performance/pack_wheels.sh packed into gpu-wheels/ (GPU_WHEELS=DIR
# for another folder) into the interpreter that has torch (PYTHON=... to choose it), with
# --no-deps --no-index, then runs bench/performance/gpu_check.py with src/ on PYTHONPATH (the
# race package, not installed).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
WHEELS="${GPU_WHEELS:-$ROOT/gpu-wheels}"
if [ ! -f "$WHEELS/install.sh" ]; then
  echo "run_gpu_check: no $WHEELS/install.sh; pack it where a registry is reachable" \
       "(bash bench/performance/pack_wheels.sh) and bring gpu-wheels/ along" >&2
  exit 2
fi
if [ -z "${PYTHON:-}" ]; then
  for candidate in python3 python; do
    if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
      PYTHON="$candidate"
      break
    fi
  done
fi
if [ -z "${PYTHON:-}" ]; then
  echo "run_gpu_check: no python3 or python here imports torch (set PYTHON=...)" >&2
  exit 2
fi

# A distribution's own Python may be marked externally managed (PEP 668); this machine is
# disposable. Nothing may reach for the network: there is none, and a retry would only wait.
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_ROOT_USER_ACTION=ignore
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
PYTHON="$PYTHON" sh "$WHEELS/install.sh"

cd "$ROOT"
PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" bench/performance/gpu_check.py "$@"
