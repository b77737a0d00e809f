#!/usr/bin/env bash
# diagnose's need against what the recorded run needed, per model family
# (bench/needs/needs.py; bench/README.md). Needs the PyPI environment
# (OOMTUNE_TORCH=pypi ./setup.sh: .venv-pypi with torch and transformers).
#
# Usage: bench/needs/run.sh [BUILD_DIR] [MODEL...]
#   BUILD_DIR  a build tree holding oomtune (default: $BUILD_DIR, else build/)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-${BUILD_DIR:-$root/build}}"
shift $(($# > 0 ? 1 : 0))
python="${OOMTUNE_PYPI_PYTHON:-$root/.venv-pypi/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "bench/needs: $python not found; run OOMTUNE_TORCH=pypi ./setup.sh first" >&2
  exit 1
fi
if [[ ! -x "$build/oomtune" ]]; then
  cmake --build "$build" --target oomtune -j "${JOBS:-2}"
fi
exec "$python" "$root/bench/needs/needs.py" "$build/oomtune" "$@"
