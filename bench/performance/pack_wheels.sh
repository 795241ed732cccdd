#!/usr/bin/env bash
# Pack the wheels a bare GPU image lacks for bench/performance/gpu_check.py (DEVELOPERS.md).
#
#   bash bench/performance/pack_wheels.sh [DEST]      # DEST: gpu-wheels/ (git-ignored)
#
# The image: Python 3.12, torch + CUDA, transformers, PEFT, accelerate, pandas, pyarrow; no
# network. Every version comes from envs/constraints.txt (the pinned stack). Wheels only, for
# CPython 3.12 on x86_64 Linux (PACK_PYTHON=3.11 packs for another interpreter, e.g. to try the
# pack here); DEST gets them and install.sh, the one line that installs them there:
#   sh DEST/install.sh      (run_gpu_check.sh runs it)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/gpu-wheels}"
PY_VERSION="${PACK_PYTHON:-3.12}"
CONSTRAINTS="$ROOT/envs/constraints.txt"
if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi

# What the image lacks, or has at other versions than the pinned stack:
PACKAGES=(
  # race train is TRL's GRPOTrainer on a datasets.Dataset; datasets imports dill,
  # multiprocess and xxhash, and caps fsspec (the image's comes with torch)
  trl datasets dill multiprocess xxhash fsspec
  # the pinned Hugging Face stack the FLOP model was measured on (the image's transformers is
  # older); transformers checks at import that tokenizers and huggingface_hub are in range
  transformers peft accelerate tokenizers huggingface_hub
  # huggingface_hub 2's HTTP client (the image's hub 1 uses httpx)
  httpx2 httpcore2 truststore h11 anyio idna
  # race itself: race.core.schema checks configs with jsonschema; race.evaluation uses scipy
  jsonschema attrs jsonschema-specifications referencing rpds-py scipy
)

# name==version from the constraints, names compared as pip does (case, -, _ and . alike)
normal() { tr 'A-Z' 'a-z' | sed -E 's/[-_.]+/-/g'; }
PINS=()
for name in "${PACKAGES[@]}"; do
  want="$(printf '%s' "$name" | normal)"
  pin="$(grep -E '^[A-Za-z0-9][A-Za-z0-9._-]*==' "$CONSTRAINTS" | while IFS= read -r line; do
    if [ "$(printf '%s' "${line%%==*}" | normal)" = "$want" ]; then printf '%s\n' "$line"; fi
  done)"
  if [ -z "$pin" ]; then
    echo "pack_wheels: $name is not pinned in envs/constraints.txt" >&2
    exit 1
  fi
  PINS+=("$(printf '%s' "$pin" | sed -E 's/[[:space:]]*#.*$//')")
done

mkdir -p "$DEST"
rm -f "$DEST"/*.whl "$DEST/install.sh"
# Binary wheels (tokenizers, xxhash, rpds-py, scipy) for manylinux x86_64: glibc 2.28 is what
# torch's own Linux wheels need, so an image that runs torch runs these (pip also accepts the
# older manylinux tags); pure-Python wheels match any platform.
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --dest "$DEST" --quiet --disable-pip-version-check "${PINS[@]}"

# The installer: the pinned versions from this folder only, nothing resolved or fetched.
printf '%s\n' "\"\${PYTHON:-python3}\" -m pip install --no-deps --no-index --find-links \"\$(dirname \"\$0\")\" --disable-pip-version-check ${PINS[*]}" \
  > "$DEST/install.sh"

count="$(find "$DEST" -name '*.whl' | wc -l)"
if [ "$count" -ne "${#PINS[@]}" ]; then
  echo "pack_wheels: ${#PINS[@]} packages, but $count wheels in $DEST" >&2
  exit 1
fi
echo "pack_wheels: $count wheels for CPython $PY_VERSION, $(du -sh "$DEST" | cut -f1) in $DEST:"
ls -1 "$DEST"
