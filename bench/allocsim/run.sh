#!/usr/bin/env bash
# Builds (Release) and runs the allocator-simulator replay benchmark: replay
# speed in events/s (items_per_second) on a generated 10^6-event training
# stream, for PyTorch's default allocator config, expandable_segments, and a
# budget with garbage_collection_threshold and max_split_size.
# Usage: bench/allocsim/run.sh [--benchmark_* flags]
#   BUILD_DIR  where to build (default: build-bench-allocsim/ at the repository
#              root, ignored by git); a standalone project from this folder.
# Needs Google Benchmark (Debian: libbenchmark-dev).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${BUILD_DIR:-$root/build-bench-allocsim}"
if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
cmake --build "$build" --target allocsim_bench -j "${JOBS:-2}"
exec "$build/oomtune/bench/allocsim/allocsim_bench" --benchmark_counters_tabular=true "$@"
