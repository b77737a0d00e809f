#!/usr/bin/env bash
# Builds and runs the trials benchmark (issue #10): (a) a child process per
# trial (`oomtune trial`) against an in-process trial, in seconds and in
# training steps; (b) peak memory and steady step time with TorchScript
# graph-executor optimization off vs on, for the example GPT and ResNet-50
# (batch 2, 112x112 images by default, to keep CPU time short).
# Usage: bench/trials/run.sh [--rounds N] [--exec-rounds N] [--resnet-batch N] [--resnet-image PX] [--skip-resnet]
#   BUILD_DIR  a configured oomtune build tree (default: build/ at the repository root)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${BUILD_DIR:-$root/build}"
if [[ ! -f "$build/build.ninja" && ! -f "$build/Makefile" ]]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release
fi
log="$(cmake --build "$build" --target bench_trials oomtune -j "${JOBS:-2}" 2>&1)" || { echo "$log" >&2; exit 1; }
/usr/bin/python3 "$root/examples/export_models.py" --only gpt --only resnet50 --if-missing
exec "$build/bench/trials/bench_trials" --oomtune "$build/oomtune" --gpt-job "$root/examples/gpt.toml" \
  --resnet-job "$root/examples/resnet50.toml" "$@"
