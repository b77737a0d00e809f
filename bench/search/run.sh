#!/usr/bin/env bash
# bench/search: oomtune autotune vs Lightning's binsearch batch finder, vs
# Accelerate's shrink-by-0.9 finder, vs an exhaustive oracle, all on real
# trials of the CPU backend under the enforced budget (search_bench.py says
# what each mirrors). Prints one table.
#
# Usage: bench/search/run.sh          BUILD_DIR (default build/) holds oomtune
#   SEARCH_BUDGET   budget of the job (default 9MiB)
#   SEARCH_BATCH    global batch (default 16)
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build oomtune
oomtune="$build/oomtune"
work="$build/bench-search"
mkdir -p "$work"
# The small GPT of tests/autotune (2 blocks, d=64, seq 32, vocabulary 512).
[[ -f "$work/gpt.pt" ]] || "${OOMTUNE_PYTHON:-/usr/bin/python3}" "$root/examples/export_models.py" --only gpt --out "$work" \
  --gpt-layers 2 --gpt-dim 64 --gpt-seq 32 --gpt-vocab 512
batch="${SEARCH_BATCH:-16}"
cat >"$work/job.toml" <<TOML
# bench/search job: global batch $batch; any micro-batch allowed (the last one smaller).
model = "gpt.pt"
global_batch = $batch
remainder = "last_smaller"
device = "cpu"
budget = "${SEARCH_BUDGET:-9MiB}"
trial_timeout = 120

[[inputs]]
name = "input_ids"
shape = ["batch", 32]
dtype = "int64"
range = [0, 512]

[[inputs]]
name = "targets"
shape = ["batch", 32]
dtype = "int64"
range = [0, 512]

[loss]
kind = "cross_entropy"
target = "targets"

[optimizer]
kind = "adamw"
lr = 3e-4
TOML
echo "load average $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
exec python3 "$root/bench/search/search_bench.py" --oomtune "$oomtune" --job "$work/job.toml" --global-batch "$batch"
