#!/usr/bin/env bash
# Builds and runs the activation checkpointing benchmark.
#   bench/checkpointing/run.sh [BUILD_DIR] [bench options...]
# BUILD_DIR defaults to ./build (a configured oomtune build tree). Options go
# to bench_checkpointing (--help lists them); the defaults measure the example
# GPT (examples/models/gpt.pt, made by examples/export_models.py) at batch 8
# and 16 with the graph executor's optimization off, as oomtune runs models.
set -euo pipefail
repo="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$repo/build}"
shift || true
cmake --build "$build" -j2 --target bench_checkpointing
if [[ ! -f "$repo/examples/models/gpt.pt" ]]; then
  "${OOMTUNE_PYTHON:-/usr/bin/python3}" "$repo/examples/export_models.py" --only gpt --if-missing
fi
cd "$repo"
exec "$build/bench/checkpointing/bench_checkpointing" --model "$repo/examples/models/gpt.pt" "$@"
