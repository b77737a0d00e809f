#!/usr/bin/env bash
# Builds (Release) and runs the variable-length benchmark: 100 steps of a
# GPT-2-small-shaped step at lengths uniform in 256–1024 through the
# caching-allocator simulator, reserved/allocated against a fixed length
# (the baseline, same run), with expandable segments and padded to buckets.
# Usage: bench/lengths/run.sh [STEPS] [SEED]
#   BUILD_DIR  where to build (default: build-bench-lengths/ at the
#              repository root, ignored by git); a standalone project.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${BUILD_DIR:-$root/build-bench-lengths}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" --target length_bench -j "${JOBS:-2}"
exec "$build/oomtune/bench/lengths/length_bench" "$@"
