#!/usr/bin/env bash
# The optimizer step of each torch.optim implementation (issue #46 item 6):
# `oomtune probe --json --no-fit` of the example models with
# optimizer.implementation = foreach, fused, single_tensor (the same job
# otherwise), one trial each, interleaved over ROUNDS rounds. Prints, per
# model and implementation, the optimizer phase's temporaries (its peak above
# its start: parameters, gradients and state), the optimizer phase's peak,
# the step peak, and their ratios to foreach (PyTorch's default on CUDA);
# the analytic foreach AdamW temporaries (4 bytes per fp32 parameter: one
# torch._foreach_sqrt over every second moment) beside them; and the median
# optimizer-step seconds over the rounds and its ratio.
# Then runs bench/optimizers/python_reference.py (Python eager PyTorch's own
# counts of the same operations), grad_scaler_reference.py (fp16's
# GradScaler around the step) and clip_grad_reference.py (gradient clipping
# before it), when the PyPI venv is there.
# Usage: bench/optimizers/run.sh [ROUNDS]      (default 3)
#   BUILD_DIR  an oomtune build directory configured from this checkout
#   BATCH      the global batch of every probe (default 4: the optimizer
#              step does not depend on it)
set -euo pipefail
source "$(dirname "$0")/../common/build.sh"
bench_build oomtune
rounds="${1:-3}"
batch="${BATCH:-4}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
models=(gpt resnet18)
impls=(foreach fused single_tensor)
for model in "${models[@]}"; do
  for impl in "${impls[@]}"; do
    # The example job with the implementation in its [optimizer] table, the
    # model path made absolute (the job moves to the temp folder).
    sed -e "s|^model = \"models/|model = \"$root/examples/models/|" \
        -e "s|^\[optimizer\]$|[optimizer]\nimplementation = \"$impl\"|" \
        "$root/examples/$model.toml" >"$work/$model-$impl.toml"
  done
done
for ((round = 1; round <= rounds; round++)); do
  for model in "${models[@]}"; do
    for impl in "${impls[@]}"; do
      "$build/oomtune" probe "$work/$model-$impl.toml" --json --no-fit --batch "$batch" >"$work/$model-$impl-$round.json" 2>/dev/null
    done
  done
done
python3 - "$work" "$rounds" "${models[@]}" <<'PY'
import json, statistics, sys
work, rounds, models = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
impls = ["foreach", "fused", "single_tensor"]
mib = lambda b: f"{b / 2**20:9.2f} MiB"
for model in models:
    rows = {}
    for impl in impls:
        runs = [json.load(open(f"{work}/{model}-{impl}-{r}.json"))["report"] for r in range(1, rounds + 1)]
        r = runs[0]
        rows[impl] = dict(temp=r["optimizer"]["temporary_bytes"], opt=r["phases"]["optimizer"]["peak_bytes"],
                          step=r["peak_bytes"], params=r["parameter_count"],
                          sec=statistics.median(x["timing"]["steady_optimizer_seconds"] for x in runs))
    base = rows["foreach"]
    print(f"\n{model}: {base['params']} fp32 parameters, AdamW; analytic foreach temporaries 4 x P = {mib(4 * base['params'])}")
    print(f"{'implementation':14} {'temporaries':>13} {'opt. peak':>13} {'ratio':>6} {'step peak':>13} {'ratio':>6} {'opt. s':>8} {'ratio':>6}")
    for impl in impls:
        x = rows[impl]
        print(f"{impl:14} {mib(x['temp'])} {mib(x['opt'])} {x['opt'] / base['opt']:6.3f} {mib(x['step'])} "
              f"{x['step'] / base['step']:6.3f} {x['sec']:8.4f} {x['sec'] / base['sec']:6.2f}")
PY
if [[ -x "$root/.venv-pypi/bin/python" ]]; then
  echo
  echo "Python eager PyTorch, the same operations (bench/optimizers/python_reference.py):"
  "$root/.venv-pypi/bin/python" "$root/bench/optimizers/python_reference.py" 2>/dev/null
  echo
  echo "fp16's GradScaler around that step (bench/optimizers/grad_scaler_reference.py):"
  "$root/.venv-pypi/bin/python" "$root/bench/optimizers/grad_scaler_reference.py" 2>/dev/null | grep -v '^  [+-]'
  echo
  echo "Gradient clipping before that step (bench/optimizers/clip_grad_reference.py):"
  "$root/.venv-pypi/bin/python" "$root/bench/optimizers/clip_grad_reference.py" 2>/dev/null | grep -v '^  [+-]'
fi
