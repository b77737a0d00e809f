#!/usr/bin/env bash
# Builds and runs the trials benchmark (issue #10): (a) a child process per
# trial (`oomtune trial`) against an in-process trial, in seconds and in
# training steps; (b) peak memory and steady step time with TorchScript
# graph-executor optimization off vs on, for the example GPT and ResNet-50
# (batch 2, 112x112 images by default, to keep CPU time short).
# Usage: bench/trials/run.sh [--rounds N] [--exec-rounds N] [--resnet-batch N] [--resnet-image PX] [--skip-resnet]
#   BUILD_DIR  a configured oomtune build tree (default: build/ at the repository root)
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build bench_trials oomtune
"${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --only gpt --only resnet50 --if-missing
exec "$build/bench/trials/bench_trials" --oomtune "$build/oomtune" --gpt-job "$root/examples/gpt.toml" \
  --resnet-job "$root/examples/resnet50.toml" "$@"
