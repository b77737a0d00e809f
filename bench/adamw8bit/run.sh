#!/usr/bin/env bash
# Builds and runs the 8-bit AdamW benchmark: optimizer step time and state
# bytes of oomtune::AdamW8bit against torch::optim::AdamW on a ~10M-parameter
# GPT-shaped parameter set, in one process, and prints the ratios.
# Usage: bench/adamw8bit/run.sh [--steps N] [--threads N]
#   BUILD_DIR  an oomtune build directory configured from this checkout
#              (default: build/ at the repository root)
# Targets (issue #4): state bytes <= 27 % of AdamW's, step time <= 1.5x.
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build bench_adamw8bit
exec "$build/bench/adamw8bit/bench_adamw8bit" "$@"
