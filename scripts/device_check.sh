#!/usr/bin/env bash
# Issue #10's check on the GPU machine (../shared/device/README.md): build
# oomtune against that machine's PyTorch the way README tells PyTorch 2.x
# users to (OOMTUNE_TORCH=python ./setup.sh), run the whole test suite there
# and probe both Hugging Face fixtures, the SDPA one included.
#
#   scripts/device_check.sh --pack   here, once: .device-deps/ (the Debian
#                                    libraries, ../shared/device/pack-deps)
#                                    and .device-shared/ (a copy of
#                                    ../shared/fixtures, which does not travel)
#   scripts/device_check.sh          there, with carry [".device-deps",
#                                    ".device-shared"]; the results go to
#                                    $OUT (default ./device_out)
#
# Here, as a dry run against Debian's libtorch (the SDPA probe then gives
# its clear load error): OOMTUNE_TORCH=debian OOMTUNE_PYTHON=/usr/bin/python3
# scripts/device_check.sh; OOMTUNE_BUILD_DIR overrides /tmp/oomtune_build.
#
# Results: summary.md (versions, each step's exit status, the test totals and
# failures, the probe tables), setup.log, ctest.log, probe_*.txt and
# probe_*.json. Each step is bounded so that the whole run ends inside the
# device tool's 10 minutes and its files come back.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"

if [ "${1:-}" = --pack ]; then
  set -e
  [ -d .device-deps/usr ] || sh ../shared/device/pack-deps
  rm -rf .device-shared && mkdir -p .device-shared && cp -r ../shared/fixtures .device-shared/
  du -sh .device-deps .device-shared
  exit 0
fi

out="${OUT:-$root/device_out}"
mkdir -p "$out"
build="${OOMTUNE_BUILD_DIR:-/tmp/oomtune_build}"
torch_source="${OOMTUNE_TORCH:-python}"
python="${OOMTUNE_PYTHON:-$(command -v python3)}"
summary="$out/summary.md"
: > "$summary"
say() { printf '%s\n' "$*" | tee -a "$summary"; }

# The tests and examples find the fixtures at ../shared beside the checkout.
if [ ! -e ../shared ] && [ -d .device-shared ]; then ln -s "$root/.device-shared" ../shared; fi

say "# oomtune on the GPU machine ($(date -u +%Y-%m-%dT%H:%MZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'))"
say ""
say '```'
"$python" -c 'import sys, torch
print("python", sys.executable, sys.version.split()[0])
print("torch", torch.__version__, "CUDA", torch.version.cuda, "cxx11 ABI", torch.compiled_with_cxx11_abi())
print("GPU", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")' 2>&1 | tee -a "$summary"
{ command -v nvcc && nvcc --version | tail -n 1; g++ --version | head -n 1; cmake --version | head -n 1; } 2>&1 |
  tee -a "$summary"
say '```'

# 1. Set-up as README documents it for PyTorch 2.x, with the libraries carried.
start=$SECONDS
OOMTUNE_TORCH="$torch_source" OOMTUNE_PYTHON="$python" OOMTUNE_DEPS="$root/.device-deps/usr" \
  OOMTUNE_BUILD_DIR="$build" timeout 300 ./setup.sh > "$out/setup.log" 2>&1
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

# 2. The whole test suite (fuzz needs clang's libFuzzer, absent there: skipped).
start=$SECONDS
timeout 330 ctest --test-dir "$build" --output-on-failure -j"$(nproc)" --timeout 300 > "$out/ctest.log" 2>&1
status=$?
say ""
say "## Tests: ctest -j$(nproc): exit $status in $((SECONDS - start)) s"
say '```'
# Counted from the per-test lines, so that a run cut off by the timeout still
# says how far it got.
say "passed $(grep -c ' Passed ' "$out/ctest.log"), failed $(grep -c '\*\*\*Failed' "$out/ctest.log"), timed" \
    "out $(grep -c '\*\*\*Timeout' "$out/ctest.log"), skipped $(grep -c '\*\*\*Skipped' "$out/ctest.log"), crashed" \
    "$(grep -c '\*\*\*Exception' "$out/ctest.log"), not run $(grep -c '\*\*\*Not Run' "$out/ctest.log")" \
    "of $(grep -m 1 -oE '/[0-9]+ Test' "$out/ctest.log" | tr -dc 0-9) tests"
grep -E '\*\*\*|tests passed|Total Test time' "$out/ctest.log" | sed 's/ \.\.\.*/ /' | tee -a "$summary"
say '```'

# 3. Both fixtures probed end to end; the SDPA one must probe on a libtorch
#    that has aten::scaled_dot_product_attention.
sdpa_job=/tmp/hf_gpt2_sdpa.toml
sed "s#^model = .*#model = \"$(cd ../shared && pwd)/fixtures/torchscript/hf_gpt2_sdpa_trace.pt\"#" \
  examples/hf_gpt2.toml > "$sdpa_job"
for job in eager:examples/hf_gpt2.toml sdpa:$sdpa_job gpt:examples/gpt.toml; do
  name="${job%%:*}" file="${job#*:}"
  start=$SECONDS
  timeout 120 "$build/oomtune" probe "$file" > "$out/probe_$name.txt" 2>&1
  status=$?
  say ""
  say "## probe $name ($file): exit $status in $((SECONDS - start)) s"
  say '```'
  tee -a "$summary" < "$out/probe_$name.txt"
  say '```'
  timeout 120 "$build/oomtune" probe "$file" --json --no-fit > "$out/probe_$name.json" 2>/dev/null
done

# 4. A CUDA job is refused before any trial until the CUDA memory backend exists.
say ""
say "## device = cuda"
say '```'
"$build/oomtune" probe examples/gpt.toml --device cuda 2>&1 | tee -a "$summary"
say "exit ${PIPESTATUS[0]}"
say '```'
