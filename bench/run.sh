#!/usr/bin/env bash
# Builds every benchmark, makes sure the example models exist, and runs each
# bench/*/run.sh in turn, printing its tables. A benchmark that fails (build
# error, crash, timeout) is reported and the next one runs; the exit status
# is 1 if any failed. bench/README.md says what each one measures.
#
# Usage: bench/run.sh [NAME...]        e.g. bench/run.sh tracker strategies
#   BUILD_DIR      oomtune build tree (default: build/ at the repository root;
#                  configured here as Release if it is not configured yet)
#   JOBS           parallel build jobs (default 2)
#   BENCH_TIMEOUT  seconds one benchmark may run (default 900)
#
# Every benchmark reports ratios against a baseline measured in the same run
# (interleaved, medians). Timings on a shared, loaded machine are noisy: the
# load average is printed before each benchmark; rerun one on its own
# (bench/NAME/run.sh) to confirm a result near its target.
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${BUILD_DIR:-$root/build}"
export JOBS="${JOBS:-2}"
timeout_s="${BENCH_TIMEOUT:-900}"
cd "$root"

note() { printf '\n==> %s\n' "$*"; }

if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  note "configuring $build (Release)"
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release || { echo "bench/run.sh: configure failed" >&2; exit 1; }
fi

# Build each target on its own so that one that does not compile does not
# stop the others; the benchmark that needs it fails later and says so.
note "building benchmark targets in $build"
for target in oomtune bench_adamw8bit bench_checkpointing bench_tracker bench_strategies bench_trials; do
  if ! cmake --build "$build" --target "$target" -j "$JOBS" >"$build/bench-build-$target.log" 2>&1; then
    echo "build of $target FAILED (log: $build/bench-build-$target.log)"
  fi
done

note "example models"
"${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --if-missing || echo "export_models.py FAILED: benchmarks that need the models will fail"

# How each benchmark's run.sh takes the build tree. Scripts not listed get
# BUILD_DIR in the environment and no arguments.
run_one() {
  local name="$1" script="$root/bench/$1/run.sh"
  case "$name" in
    checkpointing | diagnose) timeout "$timeout_s" bash "$script" "$build" ;;
    allocsim | lengths) env -u BUILD_DIR timeout "$timeout_s" bash "$script" ;;  # their own standalone builds (build-bench-NAME/)
    *) BUILD_DIR="$build" timeout "$timeout_s" bash "$script" ;;
  esac
}

if (($#)); then names=("$@"); else
  names=()
  for script in "$root"/bench/*/run.sh; do names+=("$(basename "$(dirname "$script")")"); done
fi

failed=()
for name in "${names[@]}"; do
  if [[ ! -f "$root/bench/$name/run.sh" ]]; then
    note "$name: no bench/$name/run.sh"; failed+=("$name (missing)"); continue
  fi
  note "$name ($(date +%H:%M:%S), load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs)"
  start=$SECONDS
  run_one "$name"
  status=$?
  if ((status == 124)); then
    echo "bench/run.sh: $name timed out after ${timeout_s} s"; failed+=("$name (timeout)")
  elif ((status != 0)); then
    echo "bench/run.sh: $name FAILED (exit $status); continuing"; failed+=("$name (exit $status)")
  fi
  echo "($name: $((SECONDS - start)) s)"
done

note "summary"
echo "ran: ${names[*]}"
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
echo "all benchmarks ran (see each table for its targets)"
