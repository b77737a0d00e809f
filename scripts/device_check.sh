#!/usr/bin/env bash
# The checks that need the GPU machine (../shared/device/README.md), one
# device call each, every step bounded so that the call ends inside the
# device tool's 10 minutes and its files come back (at most 8 are returned).
#
#   scripts/device_check.sh --pack   here, once: .device-deps/ (the Debian
#                                    libraries, ../shared/device/pack-deps)
#                                    and .device-shared/ (a copy of
#                                    ../shared/fixtures, which does not travel)
#   scripts/device_check.sh          there, issue #10: build oomtune against
#                                    that machine's PyTorch the way README tells
#                                    PyTorch 2.x users to (OOMTUNE_TORCH=python
#                                    ./setup.sh), run the whole test suite, probe
#                                    both Hugging Face fixtures (the SDPA one
#                                    must probe there) and the example GPT
#   scripts/device_check.sh --peaks  there, issue #11 item 1: oomtune's CPU
#                                    peaks next to PyTorch's on CUDA, eager and
#                                    TorchScript (scripts/compare_peaks.py), for
#                                    the example GPT and ResNet-50
#
# Both take carry [".device-deps", ".device-shared"] and write to $OUT
# (default ./device_out): summary.md (versions, each step's exit status and
# time, test totals and failures, the probe tables, the peaks tables),
# setup.log, ctest.log, probe_cpu_eager.json, probe_cpu_sdpa.json,
# probe_cuda_gpt.json, probe_cuda_eager.json; peaks.tar.gz (every
# run's JSON) with --peaks. The build goes to /tmp/oomtune_build
# (OOMTUNE_BUILD_DIR) and is reused while the machine stays warm.
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
# clear load error, and --peaks has no CUDA): OOMTUNE_TORCH=debian
# OOMTUNE_PYTHON=/usr/bin/python3 scripts/device_check.sh
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
  ""|--peaks) ;;
  *) echo "usage: scripts/device_check.sh [--pack|--peaks]" >&2; exit 2 ;;
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
OOMTUNE_TORCH="$torch_source" OOMTUNE_PYTHON="$python" OOMTUNE_DEPS="$root/.device-deps/usr" \
  OOMTUNE_BUILD_DIR="$build" timeout "$(budget 330)" ./setup.sh > "$out/setup.log" 2>&1
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

if [ "$mode" = --peaks ]; then
  rm -f "$out/setup.log"  # its warnings are in the summary; room for the JSON
  start=$SECONDS
  say ""
  say "## Peaks: oomtune on the CPU, PyTorch on CUDA (scripts/compare_peaks.py)"
  timeout "$(budget 540)" "$python" scripts/compare_peaks.py --oomtune "$build/oomtune" --out /tmp/oomtune_peaks \
    --python "$python" examples/gpt.toml:8 examples/gpt.toml:16 examples/gpt.toml:32 examples/gpt.toml:32:ckpt \
    examples/gpt.toml:32:bf16 examples/resnet50.toml:8 examples/resnet50.toml:16 examples/resnet50.toml:16:ckpt \
    examples/resnet50.toml:16:bf16 \
    2>&1 | tee -a "$summary"
  status=${PIPESTATUS[0]}
  say ""
  say "compare_peaks.py: exit $status in $((SECONDS - start)) s"
  tar -czf "$out/peaks.tar.gz" -C /tmp oomtune_peaks
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
