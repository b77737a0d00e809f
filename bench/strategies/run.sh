#!/usr/bin/env bash
# Builds and runs the strategies benchmark (issue #4): checkpointing, 8-bit
# AdamW, optimizer offload and micro-batching against the plain config on the
# example GPT (global batch 16), memory from run_trial and interleaved step
# times. Prints Markdown tables with ratios and pass/fail per target.
# Usage: bench/strategies/run.sh [--batch N] [--rounds N] [--job TOML]
#   BUILD_DIR  a configured oomtune build tree (default: build/ at the repository root)
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build bench_strategies
"${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --only gpt --if-missing
exec "$build/bench/strategies/bench_strategies" --job "$root/examples/gpt.toml" "$@"
