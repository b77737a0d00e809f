#!/usr/bin/env bash
# bench/meta_memory: `oomtune autotune` on the example GPT (examples/gpt.toml,
# 256 MiB) with each node's memory measured on the meta device against the
# probes' lines alone, alternating in the same run: the chosen
# configuration of each, real trials (probes + verification runs), meta
# runs and wall time, and the ratios meta / probes (issue #46 item 4).
# Needs a libtorch 2 build (BUILD_DIR=build-pypi): on 1.13 the meta side
# falls back to the lines and says so.
#
# Usage: BUILD_DIR=build-pypi bench/meta_memory/run.sh
#   META_ROUNDS     rounds of the pair (default 1; each autotune takes ~20 s here)
#   META_REMEASURE  interleaved probe runs of each chosen configuration
#                   afterwards (default 5), by which "same choice" is judged
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build oomtune oomtune_trial_module
"${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --if-missing --only gpt >/dev/null
echo "load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
exec python3 "$root/bench/meta_memory/meta_bench.py" --oomtune "$build/oomtune" --job "$root/examples/gpt.toml" \
  --rounds "${META_ROUNDS:-1}" --remeasure "${META_REMEASURE:-5}"
