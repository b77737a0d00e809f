#!/usr/bin/env bash
# The checks that need the GPU machine (../shared/device/README.md), one
# device call each, every step bounded so that the call ends inside the
# device tool's 10 minutes and its files come back (at most 8 are returned).
#
#   scripts/device_check.sh --pack       here, once: .device-deps/ (the Debian
#                                        libraries, ../shared/device/pack-deps)
#                                        and .device-shared/ (a copy of
#                                        ../shared/fixtures, which does not travel)
#   scripts/device_check.sh              there: build oomtune against that
#                                        machine's PyTorch the way README tells
#                                        PyTorch 2.x users to (OOMTUNE_TORCH=python
#                                        ./setup.sh), run the whole test suite
#                                        (the GPU tests among them), probe both
#                                        Hugging Face fixtures (the SDPA one must
#                                        probe there) and the example GPT, on the
#                                        CPU and on the GPU
#   scripts/device_check.sh --validate   there, issue #44's docs/validation.md
#                                        and #46 item 6: per-phase allocated and
#                                        reserved peaks of oomtune on CUDA, on meta
#                                        and on the CPU next to eager PyTorch's
#                                        (scripts/compare_peaks.py), for the example
#                                        GPT, ResNet-50 and the GPT-2 fixture at
#                                        micro-batch 8, 16, 32, plain and
#                                        checkpointed, fp32 and bf16; and four
#                                        torchvision CNNs no test contains
#   scripts/device_check.sh --autotune   there, issue #44: autotune --device cuda
#                                        against Accelerate's
#                                        find_executable_batch_size (ResNet-50,
#                                        AdamW, under 8 and 16 GiB; a 100 M GPT,
#                                        T = 1024, under 8 GiB), each answer rerun
#                                        for 100 steps in eager PyTorch
#                                        (scripts/autotune_vs_accelerate.py)
#   scripts/device_check.sh --snapshots  there, issues #48 and #44: a Hugging Face
#                                        GPT-2's out-of-memory snapshot
#                                        (scripts/record_hf_snapshot.py) and an
#                                        oomtune trial's, each diagnosed
#
# All take carry [".device-deps", ".device-shared"] and write to $OUT
# (default ./device_out): summary.md (versions, each step's exit status and
# time, and the step's tables) and the step's files: setup.log, ctest.log,
# probe_*.json; validation.md, validation.json, validation.tar.gz (every
# run's output); autotune.md, autotune.json, autotune.tar.gz;
# snapshots.tar.gz (the snapshots and their diagnoses). The build goes to
# /tmp/oomtune_build (OOMTUNE_BUILD_DIR) and is reused while the machine
# stays warm; the modes but the first build only oomtune and its trial
# module.
#
# Knobs for a shorter call (what is left of the session's device time):
# OOMTUNE_DEVICE_SECONDS, the seconds the whole script may take (560);
# OOMTUNE_CTEST_ARGS, arguments added to ctest (say -R 'ChildTrial|Autotune').
# OOMTUNE_CTEST_THREADS, the OMP_NUM_THREADS of the tests alone (1): ctest
# -j16 with torch's default of one thread per core ran 16 x 16 threads on 16
# cores (2026-11-26): Cli.ProbeTableHasPhasesAsRows took 130 s there and 2 s
# on the 2-core CI machine, Trial.ALaterStepPeaksLikeTheMeasuredStep 190 s
# and 4 s. Never export OMP_NUM_THREADS to the whole script: nproc answers
# it, and the build then ran on one core.
#
# Here, as a dry run against Debian's libtorch (the SDPA probe then gives its
# clear load error, and the GPU steps find no CUDA): OOMTUNE_TORCH=debian
# OOMTUNE_PYTHON=/usr/bin/python3 scripts/device_check.sh [MODE]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
mode="${1:-}"

if [ "$mode" = --pack ]; then
  set -e
  [ -d .device-deps/usr ] || sh ../shared/device/pack-deps
  rm -rf .device-shared && mkdir -p .device-shared && cp -r ../shared/fixtures .device-shared/
  du -sh .device-deps .device-shared
  exit 0
fi
case "$mode" in
  ""|--validate|--autotune|--snapshots) ;;
  *) echo "usage: scripts/device_check.sh [--pack|--validate|--autotune|--snapshots]" >&2; exit 2 ;;
esac

out="${OUT:-$root/device_out}"
mkdir -p "$out"
build="${OOMTUNE_BUILD_DIR:-/tmp/oomtune_build}"
torch_source="${OOMTUNE_TORCH:-python}"
python="${OOMTUNE_PYTHON:-$(command -v python3)}"
summary="$out/summary.md"
: > "$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }
# Seconds a step may take: at most CAP, and never past $cap s from the start
# (the device tool stops a command at 600 s).
cap="${OOMTUNE_DEVICE_SECONDS:-560}"
budget() {
  local seconds=$((cap - SECONDS))
  if [ "$1" -lt "$seconds" ]; then seconds=$1; fi
  echo $((seconds > 1 ? seconds : 1))
}

# The tests and examples find the fixtures at ../shared beside the checkout.
if [ ! -e ../shared ] && [ -d .device-shared ]; then ln -s "$root/.device-shared" ../shared; fi

say "# oomtune on the GPU machine ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
say ""
say '```'
"$python" -c 'import sys, torch
print("python", sys.executable, sys.version.split()[0])
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cxx11 ABI", torch.compiled_with_cxx11_abi())
print("GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
import glob, os, subprocess
lib = (glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so*")) or ["none"])[0]
nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True).stdout
print("std::filesystem symbols defined by", os.path.basename(lib) + ":",
      sum("_ZNSt10filesystem" in line or "_ZNKSt10filesystem" in line for line in nm.splitlines()))' 2>&1 |
  tee -a "$summary"
# CMake takes $CXX when set (there: /opt/gcc/bin/g++, 2026-11-26); which
# libstdc++ it links decides where std::filesystem calls bind (remove_tree.h).
{ command -v nvcc && nvcc --version | tail -n 1; g++ --version | head -n 1; cmake --version | head -n 1
  echo "CXX=${CXX:-unset}: $("${CXX:-c++}" --version | head -n 1)," \
       "libstdc++.so: $("${CXX:-c++}" -print-file-name=libstdc++.so)"; } 2>&1 |
  tee -a "$summary"
say '```'

# Set-up as README documents it for PyTorch 2.x, with the libraries carried.
start=$SECONDS
targets=""
if [ -n "$mode" ]; then targets="oomtune oomtune_trial_module"; fi  # no test runs in these modes
OOMTUNE_TORCH="$torch_source" OOMTUNE_PYTHON="$python" OOMTUNE_DEPS="$root/.device-deps/usr" \
  OOMTUNE_BUILD_DIR="$build" OOMTUNE_BUILD_TARGETS="$targets" timeout "$(budget 330)" ./setup.sh > "$out/setup.log" 2>&1
status=$?
say ""
say "## Set-up: OOMTUNE_TORCH=$torch_source ./setup.sh: exit $status in $((SECONDS - start)) s"
say '```'
grep -iE "warning|error|setup:" "$out/setup.log" | head -n 20 | tee -a "$summary"
"$build/oomtune" --version 2>&1 | tee -a "$summary"
say '```'
if [ "$status" -ne 0 ]; then
  tail -n 40 "$out/setup.log"
  exit 1
fi

# step TITLE FILE COMMAND...: runs the command with its stdout in $out/FILE
# and its stderr added to $out/steps.log, and says in the summary how it
# ended and what it printed (Markdown; the last lines of its stderr).
step() {
  local title=$1 file=$2 start=$SECONDS status
  shift 2
  echo "== $title" >> "$out/steps.log"
  "$@" > "$out/$file" 2> "$out/step.err"
  status=$?
  cat "$out/step.err" >> "$out/steps.log"
  say ""
  say "## $title: exit $status in $((SECONDS - start)) s"
  say ""
  cat "$out/$file" >> "$summary"
  tail -n 5 "$out/step.err" | sed 's/^/    /' | tee -a "$summary"
  rm -f "$out/step.err"
}

if [ -n "$mode" ]; then rm -f "$out/setup.log"; fi  # its warnings are in the summary; room for the results

if [ "$mode" = --validate ]; then
  # Torchvision CNNs that no test contains (#46 item 6), scripted, with the
  # ResNet-50 job's inputs and AdamW (the job's default optimizer).
  unseen=/tmp/oomtune_unseen
  mkdir -p "$unseen"
  cnns=(efficientnet_b0 mobilenet_v3_large convnext_tiny densenet121)
  "$python" -c 'import sys, torch, torchvision
for name in sys.argv[2:]:
    torch.jit.script(getattr(torchvision.models, name)()).save(f"{sys.argv[1]}/{name}.pt")' "$unseen" "${cnns[@]}"
  cases=()
  for job in examples/gpt.toml examples/resnet50.toml examples/hf_gpt2.toml; do
    for micro_batch in 8 16 32; do
      for flags in "" :ckpt :bf16 :ckpt:bf16; do cases+=("$job:$micro_batch$flags"); done
    done
  done
  for cnn in "${cnns[@]}"; do
    sed -e "s#^model = .*#model = \"$cnn.pt\"#" -e '/^\[optimizer\]/,$d' examples/resnet50.toml > "$unseen/$cnn.toml"
    cases+=("$unseen/$cnn.toml:8")
  done
  seconds="$(budget 540)"
  step "Peaks: oomtune on CUDA, meta and CPU against eager PyTorch (scripts/compare_peaks.py)" validation.md \
    timeout "$seconds" "$python" scripts/compare_peaks.py --oomtune "$build/oomtune" --python "$python" \
    --out /tmp/oomtune_validation --budget 32GiB --jobs 6 --timeout 150 --deadline $((seconds - 40)) "${cases[@]}"
  cp /tmp/oomtune_validation/results.json "$out/validation.json"
  tar -czf "$out/validation.tar.gz" -C /tmp oomtune_validation
  exit 0
fi

if [ "$mode" = --autotune ]; then
  work=/tmp/oomtune_autotune
  mkdir -p "$work"
  # A GPT of about 100 M parameters (12 blocks, d = 768, vocabulary 8192) at T = 1024.
  "$python" examples/export_models.py --only gpt --out "$work/models" --gpt-layers 12 --gpt-dim 768 --gpt-heads 12 \
    --gpt-seq 1024 --gpt-vocab 8192 --gpt-dropout 0
  sed -e "s#^model = .*#model = \"$root/examples/models/resnet50.pt\"#" -e 's/^global_batch = .*/global_batch = 256/' \
    -e '/^\[optimizer\]/,$d' -e '/^#/d' examples/resnet50.toml > "$work/resnet50_adamw.toml"
  sed -e 's/^global_batch = .*/global_batch = 32/' -e 's/"batch", 64/"batch", 1024/' -e 's/range = \[0, 1000\]/range = [0, 8192]/' \
    -e '/^#/d' examples/gpt.toml > "$work/gpt.toml"
  seconds="$(budget 540)"
  step "autotune --device cuda against Accelerate's find_executable_batch_size (scripts/autotune_vs_accelerate.py)" \
    autotune.md timeout "$seconds" "$python" scripts/autotune_vs_accelerate.py --oomtune "$build/oomtune" \
    --python "$python" --out "$work/out" --deadline $((seconds - 30)) "$work/resnet50_adamw.toml:8GiB" \
    "$work/resnet50_adamw.toml:16GiB" "$work/gpt.toml:8GiB"
  cp "$work/out/results.json" "$out/autotune.json"
  tar -czf "$out/autotune.tar.gz" -C "$work" out
  exit 0
fi

if [ "$mode" = --snapshots ]; then
  work=/tmp/oomtune_snapshots
  mkdir -p "$work"
  # #48: transformers' GPT-2 small running out of memory in its forward;
  # the report must name modeling_gpt2.py's lines.
  step "A Hugging Face GPT-2's out-of-memory snapshot (scripts/record_hf_snapshot.py)" hf_snapshot.json \
    timeout "$(budget 120)" "$python" scripts/record_hf_snapshot.py --out "$work/hf_gpt2_oom.pickle"
  step "oomtune diagnose on it" hf_diagnose.txt timeout "$(budget 60)" "$build/oomtune" diagnose \
    "$work/hf_gpt2_oom.pickle" --svg "$work/hf_gpt2_oom.svg"
  say ""
  say "modeling_gpt2.py lines named in the report: $(grep -c 'modeling_gpt2.py:' "$out/hf_diagnose.txt")"
  # #44: a trial of the example GPT that runs out of memory on the GPU writes
  # its snapshot (micro-batch 32 peaks at about 131 MiB; the budget is 96 MiB).
  step "An oomtune trial out of memory on CUDA" trial_oom.txt timeout "$(budget 120)" "$build/oomtune" probe \
    examples/gpt.toml --device cuda --budget 96MiB --config micro_batch=32 --no-fit --snapshot-dir "$work/trial"
  for snapshot in "$work"/trial/*.pickle; do
    [ -e "$snapshot" ] || { say "no trial snapshot was written"; break; }
    step "oomtune diagnose $(basename "$snapshot")" trial_diagnose.txt timeout "$(budget 60)" "$build/oomtune" \
      diagnose "$snapshot"
  done
  gzip "$work"/*.pickle "$work"/trial/*.pickle 2> /dev/null  # oomtune diagnose reads .pickle.gz too
  tar -czf "$out/snapshots.tar.gz" -C /tmp oomtune_snapshots
  exit 0
fi

# The whole test suite (fuzz needs clang's libFuzzer, absent there: skipped).
start=$SECONDS
cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
test_threads="${OOMTUNE_CTEST_THREADS:-1}"
# shellcheck disable=SC2086  # OOMTUNE_CTEST_ARGS is a list of arguments
OMP_NUM_THREADS="$test_threads" timeout "$(budget $((cap - 80 - SECONDS)))" ctest --test-dir "$build" \
  --output-on-failure -j"$cores" --timeout 300 ${OOMTUNE_CTEST_ARGS:-} > "$out/ctest.log" 2>&1
status=$?
say ""
say "## Tests: OMP_NUM_THREADS=$test_threads ctest -j$cores ${OOMTUNE_CTEST_ARGS:-}:" \
    "exit $status in $((SECONDS - start)) s"
say '```'
# Counted from the per-test lines, so that a run cut off by the timeout still
# says how far it got.
say "passed $(grep -c ' Passed ' "$out/ctest.log"), failed $(grep -c '\*\*\*Failed' "$out/ctest.log"), timed" \
    "out $(grep -c '\*\*\*Timeout' "$out/ctest.log"), skipped $(grep -c '\*\*\*Skipped' "$out/ctest.log"), crashed" \
    "$(grep -c '\*\*\*Exception' "$out/ctest.log"), not run $(grep -c '\*\*\*Not Run' "$out/ctest.log")" \
    "of $(grep -m 1 -oE '/[0-9]+ Test' "$out/ctest.log" | tr -dc 0-9) tests"
grep -E '\*\*\*|tests passed|Total Test time' "$out/ctest.log" | sed 's/ \.\.\.*/ /' | tee -a "$summary"
say '```'

# The first test that crashed, again under cuda-gdb (the machine has no gdb;
# cuda-gdb debugs CPU programs too): where it crashed.
crashed="$(grep -m 1 -oE 'Test +#[0-9]+: [^ ]+ \.+\*\*\*Exception' "$out/ctest.log" |
           sed -E 's/Test +#[0-9]+: ([^ ]+) .*/\1/')"
if [ -n "$crashed" ] && command -v cuda-gdb > /dev/null && [ "$(budget 60)" -gt 20 ]; then
  command_line="$(ctest --test-dir "$build" -N -V -R "^${crashed}\$" | sed -n 's/^.*Test command: //p' | head -n 1)"
  say ""
  say "## Backtrace: $crashed"
  say '```'
  eval "timeout $(budget 60) cuda-gdb -q -batch -ex run -ex bt -ex 'info sharedlibrary' --args $command_line" 2>&1 |
    grep -E '^#|SIG|signal|libtorch|libstdc' | head -n 40 | tee -a "$summary"
  say '```'
fi

# probe_job NAME FILE DEVICE [json]: the probe's table in the summary, and
# with json its JSON (no fits) beside it as probe_<DEVICE>_<NAME>.json.
probe_job() {
  local name=$1 file=$2 device=$3 json=${4:-} start=$SECONDS table status
  table="$(timeout "$(budget 120)" "$build/oomtune" probe "$file" --device "$device" 2>&1)"
  status=$?
  say ""
  say "## probe $name on $device ($file): exit $status in $((SECONDS - start)) s"
  say '```'
  say "$table"
  say '```'
  [ -n "$json" ] || return 0
  timeout "$(budget 60)" "$build/oomtune" probe "$file" --device "$device" --json --no-fit \
    > "$out/probe_${device}_$name.json" 2>/dev/null
}

# Both fixtures probed end to end on the CPU (the SDPA one must probe on a
# libtorch that has aten::scaled_dot_product_attention), and the example
# GPT; then the example GPT and the eager GPT-2 fixture on the GPU itself
# (issue #44: the CUDA backend).
sdpa_job=/tmp/hf_gpt2_sdpa.toml
sed "s#^model = .*#model = \"$(cd ../shared && pwd)/fixtures/torchscript/hf_gpt2_sdpa_trace.pt\"#" \
  examples/hf_gpt2.toml > "$sdpa_job"
probe_job eager examples/hf_gpt2.toml cpu json
probe_job sdpa "$sdpa_job" cpu json
probe_job gpt examples/gpt.toml cpu
probe_job gpt examples/gpt.toml cuda json
probe_job eager examples/hf_gpt2.toml cuda json

# #46 item 6: the CPU and meta probes' "budget on CUDA" verdict against a run
# whose caching allocator is capped at the usable budget. The meta probe
# predicts that the example GPT runs out of memory under 150 MiB (220 MiB
# reserved, the first failure a 7.81 MiB aten::linear request in forward)
# and fits under 256 MiB. Summary only: the call already returns 8 files.
for budget_size in 150MiB 256MiB; do
  start=$SECONDS
  predicted="$(timeout "$(budget 60)" "$build/oomtune" probe examples/gpt.toml --device meta --no-fit \
               --budget "$budget_size" 2>&1 | grep -E '^(step  |budget|predicted reserved|oomtune:)')"
  measured="$(timeout "$(budget 120)" "$build/oomtune" probe examples/gpt.toml --device cuda --no-fit \
              --enforce-budget --budget "$budget_size" 2>&1 | grep -E '^(outcome|step  |budget|measured reserved|predicted reserved|oomtune:)')"
  say ""
  say "## The budget on CUDA at $budget_size: meta's prediction, then a capped CUDA run ($((SECONDS - start)) s)"
  say '```'
  say "$predicted"
  say "--- cuda, --enforce-budget:"
  say "$measured"
  say '```'
done
