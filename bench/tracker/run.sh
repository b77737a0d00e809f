#!/usr/bin/env bash
# Builds and runs the MemoryTracker overhead benchmark (issues #3, #8): step
# time of the example GPT (batch 8, AdamW, graph executor optimization off)
# without a tracker, with one (attribute_ops on), and with event recording on;
# all interleaved in one process. Prints a Markdown table.
# Usage: bench/tracker/run.sh [--batch N] [--rounds N] [--job TOML]
#   BUILD_DIR  a configured oomtune build tree (default: build/ at the repository root)
# Targets: tracker on/off <= 1.03; events on/off <= 1.05 (ratios of medians).
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build bench_tracker
"${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --only gpt --if-missing
exec "$build/bench/tracker/bench_tracker" --job "$root/examples/gpt.toml" "$@"
