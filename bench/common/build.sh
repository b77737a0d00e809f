# Sourced by bench/*/run.sh. Sets root (the repository) and build (BUILD_DIR,
# default build/, configured as Release when it is not yet), and defines
# bench_build TARGET..., which builds the targets with JOBS (default 2) jobs
# and prints the build log only when the build fails.
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
fi

bench_build() {
  local log
  log="$(cmake --build "$build" --target "$@" -j "${JOBS:-2}" 2>&1)" || { echo "$log" >&2; exit 1; }
}
