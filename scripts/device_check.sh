#!/usr/bin/env bash
# The checks that need the GPU machine (../shared/device/README.md). A session
# that is lent one has 15 minutes of device time in all, the machine's start
# (a minute or two) included, so the GPU work of the open issues is one call
# of at most 330 s, with time left to run it again:
#
#   scripts/device_check.sh --pack       here, once: .device-deps/ (the Debian
#                                        libraries, ../shared/device/pack-deps)
#                                        and .device-shared/ (a copy of
#                                        ../shared/fixtures, which does not travel)
#   scripts/device_check.sh              there, the call (OOMTUNE_DEVICE_SECONDS,
#                                        330): build what it needs against that
#                                        machine's PyTorch as README tells PyTorch
#                                        2.x users (OOMTUNE_TORCH=python
#                                        ./setup.sh), then, while the peaks of
#                                        --validate run beside them (the CUDA,
#                                        eager and meta sides: the slow CPU side
#                                        needs no GPU and is merged here later),
#                                        the GPU tests (test_cuda,
#                                        test_cuda_checkpointing), the example GPT
#                                        and the SDPA fixture probed on CUDA, the
#                                        budget on CUDA (#46 item 6), --snapshots'
#                                        two snapshots and the example GPT's
#                                        autotune on CUDA under 256 MiB, then,
#                                        with 150 s left, --autotune's first
#                                        case (resnet50:8GiB)
#
# A later call, or a later session, runs one of these alone (560 s each):
#
#   scripts/device_check.sh --validate   issue #44's docs/validation.md and #46
#                                        item 6: per-phase allocated and reserved
#                                        peaks of oomtune on CUDA next to eager
#                                        PyTorch's (scripts/compare_peaks.py;
#                                        OOMTUNE_VALIDATE_SIDES, cuda,eager,meta:
#                                        meta after the pairs; the CPU side, the
#                                        same bytes as meta's, runs here), for
#                                        four torchvision CNNs no test contains
#                                        (AdamW, micro-batch 8), then the example
#                                        GPT, the GPT-2 fixture and ResNet-50 at
#                                        micro-batch 8, 16, 32, plain, checkpointed,
#                                        bf16, both
#   scripts/device_check.sh --autotune   issue #44: autotune --device cuda
#                                        against Accelerate's
#                                        find_executable_batch_size, each answer
#                                        rerun for 100 steps in eager PyTorch
#                                        (scripts/autotune_vs_accelerate.py); the
#                                        cases as arguments, by default all three:
#                                        resnet50:8GiB, resnet50:16GiB (AdamW,
#                                        224x224) and gpt100m:8GiB (12 blocks,
#                                        d = 768, T = 1024); one case a call fits
#                                        the 560 s better
#   scripts/device_check.sh --snapshots  issues #48 and #44: a Hugging Face
#                                        GPT-2's out-of-memory snapshot
#                                        (scripts/record_hf_snapshot.py) and an
#                                        oomtune trial's, each diagnosed; then
#                                        GPT-2's Trainer.evaluate() out of
#                                        memory by keeping every step's logits
#                                        (--evaluate), diagnosed, and the same
#                                        evaluation rerun with the
#                                        eval_accumulation_steps diagnose
#                                        recommends: it must run to its end;
#                                        then a checkpointed GPT-2 out of
#                                        memory while backward recomputes a
#                                        block (--checkpointing), diagnosed:
#                                        its need must be read from the block
#   scripts/device_check.sh --checkpointing
#                                        the checkpoint operator's GPU tests
#                                        (ctest -R '^CudaCheckpointing':
#                                        gradients, the incoming gradient's
#                                        release on autograd's device thread),
#                                        SDPA with a learned bias (scripts/
#                                        sdpa_mask_gradient.py, seconds),
#                                        then the two open questions of checkpointed
#                                        runs on CUDA (docs/validation.md), both
#                                        likely fixed on 2026-12-02: GPT-2
#                                        checkpointed in bf16 failed in backward
#                                        (now run with both fixtures; the whole
#                                        error, C++ backtrace included, if it
#                                        still fails: OOMTUNE_FULL_ERRORS,
#                                        TORCH_SHOW_CPP_STACKTRACES), and the
#                                        checkpointed backward peaked above
#                                        meta's (ResNet-50 at 32: +122 MiB):
#                                        what was live at each run's peak, CUDA
#                                        against meta, group by group
#                                        (scripts/compare_compositions.py); then
#                                        the checkpointed cases against eager
#                                        PyTorch (compare_peaks.py, at most
#                                        200 s), and two plain cases whose
#                                        predicted reserved bytes missed eager's
#                                        (each run's allocations kept for
#                                        scripts/compare_step_events.py), then
#                                        cuDNN's bytes beside each convolution
#                                        (scripts/conv_workspaces.py, at most
#                                        60 s); about 360 s after the build
#                                        (OOMTUNE_DEVICE_SECONDS=480 with the
#                                        tool's timeout_s 520)
#   scripts/device_check.sh --recorded   issue #48: the GPT-2 runs the CPU
#                                        recorder diagnoses in CI
#                                        (tests/scripts/cpu_snapshot_test.py),
#                                        recorded by CUDA's own allocator under
#                                        real caps (scripts/
#                                        record_cuda_snapshot.py) and
#                                        diagnosed with the same expectations:
#                                        verdicts, need methods, needs within
#                                        5 % of the uncapped CUDA run's growth
#                                        (docs/gpu_machine.md items 8 and 9)
#   scripts/device_check.sh --suite      the whole test suite there (the GPU
#                                        tests among them), the probes of the
#                                        first call on the CPU too
#
# All take carry [".device-deps", ".device-shared"] and write to $OUT
# (default ./device_out), at most the 8 files the device tool returns:
# summary.md (versions, each step's exit status and time, and its tables),
# steps.log (every step's stderr), setup.log, and the modes' own: cuda_tests.xml,
# probes.tar.gz, validation.tar.gz (results.json and every run's output),
# snapshots.tar.gz (the snapshots and their diagnoses); autotune.tar.gz;
# checkpointing.tar.gz (the error and the probes' JSON); recorded.tar.gz;
# ctest.log. The build goes to /tmp/oomtune_build (OOMTUNE_BUILD_DIR) and is
# reused while the machine stays warm; only --suite builds every target.
#
# Knobs for a shorter call (what is left of the session's device time):
# OOMTUNE_DEVICE_SECONDS, the seconds the whole script may take;
# OOMTUNE_CTEST_ARGS, arguments added to ctest (say -R 'ChildTrial|Autotune').
# OOMTUNE_CTEST_THREADS, the OMP_NUM_THREADS of the tests alone (1): ctest
# -j16 with torch's default of one thread per core ran 16 x 16 threads on 16
# cores (2026-11-26): Cli.ProbeTableHasPhasesAsRows took 130 s there and 2 s
# on the 2-core CI machine, Trial.ALaterStepPeaksLikeTheMeasuredStep 190 s
# and 4 s. Never export OMP_NUM_THREADS to the whole script: nproc answers
# it, and the build then ran on one core.
#
# Here, as a dry run against Debian's libtorch (the GPU steps find no CUDA
# and say so in one line each): OOMTUNE_TORCH=debian
# OOMTUNE_PYTHON=/usr/bin/python3 scripts/device_check.sh [MODE]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root="$PWD"
mode="${1:-}"
if [ $# -gt 0 ]; then shift; fi

if [ "$mode" = --pack ]; then
  set -e
  [ -d .device-deps/usr ] || sh ../shared/device/pack-deps
  rm -rf .device-shared && mkdir -p .device-shared && cp -r ../shared/fixtures .device-shared/
  du -sh .device-deps .device-shared
  exit 0
fi
case "$mode" in
  ""|--validate|--autotune|--snapshots|--checkpointing|--recorded|--suite) ;;
  *) echo "usage: scripts/device_check.sh [--pack|--validate|--autotune [CASE ...]|--snapshots|--checkpointing|--recorded|--suite]" >&2
     exit 2 ;;
esac

out="${OUT:-$root/device_out}"
mkdir -p "$out"
build="${OOMTUNE_BUILD_DIR:-/tmp/oomtune_build}"
torch_source="${OOMTUNE_TORCH:-python}"
python="${OOMTUNE_PYTHON:-$(command -v python3)}"
summary="$out/summary.md"
: > "$summary"
: > "$out/steps.log"
say() { printf '%s\n' "$*" | tee -a "$summary"; }
# Seconds a step may take: at most its own, and never past $cap s from the
# start (the device tool stops a command at 600 s; the first call must leave
# the session's 15 minutes room for a second).
default_cap=560
if [ -z "$mode" ]; then default_cap=330; fi
cap="${OOMTUNE_DEVICE_SECONDS:-$default_cap}"
budget() {
  local seconds=$((cap - SECONDS))
  if [ "$1" -lt "$seconds" ]; then seconds=$1; fi
  echo $((seconds > 1 ? seconds : 1))
}

# The tests and examples find the fixtures at ../shared beside the checkout.
if [ ! -e ../shared ] && [ -d .device-shared ]; then ln -s "$root/.device-shared" ../shared; fi

say "# oomtune on the GPU machine: device_check.sh ${mode:-(the first call)} ($(date -u +%Y-%m-%dT%H:%MZ)," \
    "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), $cap s)"
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

# Set-up as README documents it for PyTorch 2.x, with the libraries carried;
# every target for the suite, else what the mode runs.
start=$SECONDS
case "$mode" in
  --suite) targets="" ;;
  "") targets="oomtune oomtune_trial_module test_cuda test_cuda_checkpointing" ;;
  --checkpointing) targets="oomtune oomtune_trial_module test_cuda_checkpointing" ;;
  *) targets="oomtune oomtune_trial_module" ;;
esac
OOMTUNE_TORCH="$torch_source" OOMTUNE_PYTHON="$python" OOMTUNE_DEPS="$root/.device-deps/usr" \
  OOMTUNE_BUILD_DIR="$build" OOMTUNE_BUILD_TARGETS="$targets" timeout "$(budget 330)" ./setup.sh > "$out/setup.log" 2>&1
status=$?
say ""
say "## Set-up: OOMTUNE_TORCH=$torch_source OOMTUNE_BUILD_TARGETS=\"$targets\" ./setup.sh: exit $status in" \
    "$((SECONDS - start)) s"
say '```'
grep -iE "warning|error|setup:" "$out/setup.log" | head -n 20 | tee -a "$summary"
# Where each compiler warning comes from (the file and its "In function" /
# "inlined from" lines), for steps.log.
{ echo "== compiler warnings in context"; grep -B 14 -A 3 "warning:" "$out/setup.log" | grep -v "CMake Warning" | head -n 80; } \
  >> "$out/steps.log"
"$build/oomtune" --version 2>&1 | tee -a "$summary"
say '```'
if [ "$status" -ne 0 ]; then
  tail -n 40 "$out/setup.log"
  exit 1
fi
if [ "$mode" != --suite ]; then rm -f "$out/setup.log"; fi  # its warnings are in the summary

# step TITLE FILE COMMAND...: runs the command with its stdout in $out/FILE
# and its stderr added to $out/steps.log, and says in the summary how it
# ended and what it printed (Markdown; the last lines of its stderr).
# gpu_tests NAME REGEX SECONDS: ctest -R REGEX (GPU tests; ctest makes the
# test models they need first) within SECONDS, its JUnit in $out/NAME.xml
# (the messages and the figures the tests record), its failures and
# figures' lines in the summary.
gpu_tests() {
  local name=$1 regex=$2 seconds=$3 start=$SECONDS status
  OMP_NUM_THREADS="${OOMTUNE_CTEST_THREADS:-1}" timeout "$seconds" ctest --test-dir "$build" -R "$regex" \
    --output-on-failure -j4 --timeout 120 --output-junit "$out/$name.xml" > "$out/$name.log" 2>&1
  status=$?
  say ""
  say "## GPU tests: ctest -R '$regex': exit $status in $((SECONDS - start)) s"
  say '```'
  grep -E '\*\*\*|tests passed|Total Test time|Failure|Expected|Which is|actual|N = ' "$out/$name.log" |
    sed 's/ \.\.\.*/ /' | head -n 60 | tee -a "$summary"
  say '```'
  rm -f "$out/$name.log"
}

step() {
  local title=$1 file=$2 start=$SECONDS status
  shift 2
  "$@" > "$out/$file" 2> "$out/$file.err"
  status=$?
  { echo "== $title"; cat "$out/$file.err"; } >> "$out/steps.log"
  say ""
  say "## $title: exit $status in $((SECONDS - start)) s"
  say ""
  cat "$out/$file" >> "$summary"
  tail -n 5 "$out/$file.err" | sed 's/^/    /' | tee -a "$summary"
  rm -f "$out/$file.err"
}

# unseen_cnns: torchvision CNNs that no test contains (#46 item 6), scripted
# with the machine's torchvision into /tmp/oomtune_unseen, each with the
# ResNet-50 job's inputs and AdamW (the job's default optimizer); prints
# their jobs' paths.
unseen_cnns() {
  local unseen=/tmp/oomtune_unseen cnns=(efficientnet_b0 mobilenet_v3_large convnext_tiny densenet121) cnn
  mkdir -p "$unseen"
  timeout "$(budget 90)" "$python" -c 'import sys, torch, torchvision
for name in sys.argv[2:]:
    torch.jit.script(getattr(torchvision.models, name)()).save(f"{sys.argv[1]}/{name}.pt")' "$unseen" "${cnns[@]}" >&2
  for cnn in "${cnns[@]}"; do
    sed -e "s#^model = .*#model = \"$cnn.pt\"#" -e '/^\[optimizer\]/,$d' examples/resnet50.toml > "$unseen/$cnn.toml"
    echo "$unseen/$cnn.toml"
  done
}

# gpt_with NAME LINE: the example GPT's job with LINE added to its
# [optimizer] table, written to /tmp beside the examples' models; prints its
# path. fused_gpt: AdamW's fused implementation (to which GradScaler hands
# its scale instead of unscaling); clipped_gpt: gradient clipping at 1.0
# (clip_grad_norm_: a norm per gradient, 512-byte blocks on CUDA, and the
# foreach norm's scratch).
gpt_with() {
  local dir=/tmp/oomtune_jobs
  mkdir -p "$dir"
  sed -e "s#^model = \"#model = \"$PWD/examples/#" -e "/^weight_decay = /a $2" examples/gpt.toml > "$dir/gpt_$1.toml"
  echo "$dir/gpt_$1.toml"
}
fused_gpt() { gpt_with fused 'implementation = "fused"'; }
clipped_gpt() { gpt_with clipped 'max_grad_norm = 1.0'; }

# validate [SECONDS]: compare_peaks.py's cases, the unseen CNNs first, then
# each flag set over the three jobs and micro-batches, so that a deadline
# leaves out the least telling ones; "not run" in the tables where it does.
validate() {
  local seconds="${1:-$(budget 540)}" work=/tmp/oomtune_validation
  local cases=() job flags micro_batch
  for job in $(unseen_cnns); do cases+=("$job:8"); done
  for flags in "" :ckpt :bf16 :ckpt:bf16; do
    for job in examples/gpt.toml examples/hf_gpt2.toml examples/resnet50.toml; do
      for micro_batch in 8 16 32; do cases+=("$job:$micro_batch$flags"); done
    done
  done
  # fp16 with GradScaler (2026-12-06): its scalars and no gradient-sized
  # temporary; meta's peaks should be bf16's plus 8-12 bytes.
  # fp16 with a fused AdamW (2026-12-07): GradScaler's check, then the
  # scale handed to the kernel; meta's optimizer peak bf16's plus 20 bytes.
  # Gradient clipping (2026-12-06, later): meta's optimizer phase holds the
  # clip's norms and CUDA's foreach-norm scratch beside the step's.
  cases+=(examples/gpt.toml:32:fp16 examples/hf_gpt2.toml:16:fp16 examples/resnet50.toml:16:fp16
    "$(fused_gpt):32:fp16" "$(clipped_gpt):32")
  step "Peaks: oomtune against eager PyTorch (scripts/compare_peaks.py --sides ${OOMTUNE_VALIDATE_SIDES:-cuda,eager,meta})" \
    validation.md timeout "$seconds" "$python" scripts/compare_peaks.py --oomtune "$build/oomtune" \
    --python "$python" --out "$work" --sides "${OOMTUNE_VALIDATE_SIDES:-cuda,eager,meta}" --budget 8GiB --jobs 6 \
    --step-events --timeout 150 --deadline $((seconds - 30)) "${cases[@]}"
  tar -czf "$out/validation.tar.gz" -C /tmp oomtune_validation
  rm -f "$out/validation.md"  # in the summary, and again from results.json with --tables
}

# snapshots: #48's Hugging Face snapshot and #44's trial snapshot, diagnosed.
snapshots() {
  local work=/tmp/oomtune_snapshots snapshot
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
  # its snapshot (micro-batch 32 peaks at 187 MiB on an H200; capped at the
  # usable 91.20 MiB, it runs out in forward: --enforce-budget caps it).
  step "An oomtune trial out of memory on CUDA" trial_oom.txt timeout "$(budget 120)" "$build/oomtune" probe \
    examples/gpt.toml --device cuda --budget 96MiB --enforce-budget --config micro_batch=32 --no-fit \
    --snapshot-dir "$work/trial"
  for snapshot in "$work"/trial/*.pickle; do
    [ -e "$snapshot" ] || { say "no trial snapshot was written"; break; }
    step "oomtune diagnose $(basename "$snapshot")" trial_diagnose.txt timeout "$(budget 60)" "$build/oomtune" \
      diagnose "$snapshot"
  done
  mv "$out"/hf_snapshot.json "$out"/hf_diagnose.txt "$out"/trial_oom.txt "$out"/trial_diagnose.txt "$work"/ 2> /dev/null
  gzip -f "$work"/*.pickle "$work"/trial/*.pickle 2> /dev/null  # oomtune diagnose reads .pickle.gz too
  tar -czf "$out/snapshots.tar.gz" -C /tmp oomtune_snapshots
}

# checkpointed_snapshots (--snapshots only): GPT-2 small with every block
# checkpointed and eager attention, at 2 x 4096 tokens (the probabilities,
# 2 x 12 x 4096^2 fp32, 1.6 GB each, outgrow the head's 1.6 GB logits, so a
# block's recomputation and backward are the step's peak), under the first
# cap at which it runs out of memory while recomputing a block
# (record_hf_snapshot.py searches it); diagnose must read the need from the
# block (Note [Recomputed block] or [Blocks in backward]), not
# the request alone.
checkpointed_snapshots() {
  local work=/tmp/oomtune_snapshots
  mkdir -p "$work"
  step "A checkpointed GPT-2 out of memory in backward (scripts/record_hf_snapshot.py --checkpointing)" \
    hf_checkpointed_snapshot.json timeout "$(budget 150)" "$python" scripts/record_hf_snapshot.py --checkpointing \
    --micro-batch 2 --seq 4096 --out "$work/hf_gpt2_checkpointed_oom.pickle"
  step "oomtune diagnose on it" hf_checkpointed_diagnose.txt timeout "$(budget 60)" "$build/oomtune" diagnose \
    "$work/hf_gpt2_checkpointed_oom.pickle"
  timeout "$(budget 60)" "$build/oomtune" diagnose "$work/hf_gpt2_checkpointed_oom.pickle" --json \
    > "$work/hf_gpt2_checkpointed_oom.json" 2> /dev/null
  say ""
  say "need (backward_blocks or recomputed_block, not request): $("$python" -c \
    'import json, sys; n = json.load(open(sys.argv[1]))["need"]; print(n["method"], n["still_needed_bytes"])' \
    "$work/hf_gpt2_checkpointed_oom.json" 2>&1 | tail -n 1)"
  mv "$out"/hf_checkpointed_snapshot.json "$out"/hf_checkpointed_diagnose.txt "$work"/ 2> /dev/null
  gzip -f "$work"/*.pickle 2> /dev/null
  tar -czf "$out/snapshots.tar.gz" -C /tmp oomtune_snapshots
}

# eval_snapshots (--snapshots only): Trainer.evaluate() of GPT-2 small keeps
# every step's logits on the device (8 x 1024 x 50257 fp32, 1.6 GB a step)
# and runs out of memory concatenating them under 16 GiB; diagnose must say
# eval_outputs_accumulated and recommend an eval_accumulation_steps, with
# which the same evaluation must run to its end (record_hf_snapshot.py exit 1).
eval_snapshots() {
  local work=/tmp/oomtune_snapshots k
  local run=(scripts/record_hf_snapshot.py --evaluate --steps 8 --budget $((16 << 30)))
  mkdir -p "$work"
  step "Trainer.evaluate() out of memory (scripts/record_hf_snapshot.py --evaluate)" hf_eval_snapshot.json \
    timeout "$(budget 120)" "$python" "${run[@]}" --out "$work/hf_gpt2_eval_oom.pickle"
  step "oomtune diagnose on it" hf_eval_diagnose.txt timeout "$(budget 60)" "$build/oomtune" diagnose \
    "$work/hf_gpt2_eval_oom.pickle"
  k="$(grep -o 'eval_accumulation_steps=[0-9]*' "$out/hf_eval_diagnose.txt" | head -n 1 | cut -d= -f2)"
  if [ -n "$k" ]; then
    step "The same evaluation with eval_accumulation_steps=$k (exit 1: it ran to its end)" hf_eval_rerun.json \
      timeout "$(budget 120)" "$python" "${run[@]}" --eval-accumulation-steps "$k" --out "$work/hf_gpt2_eval_rerun.pickle"
  else
    say "diagnose recommended no eval_accumulation_steps"
  fi
  mv "$out"/hf_eval_snapshot.json "$out"/hf_eval_diagnose.txt "$out"/hf_eval_rerun.json "$work"/ 2> /dev/null
  gzip -f "$work"/*.pickle 2> /dev/null
  tar -czf "$out/snapshots.tar.gz" -C /tmp oomtune_snapshots
}

# recorded (--recorded): docs/gpu_machine.md items 8 and 9: the GPT-2 runs
# of tests/scripts/cpu_snapshot_test.py (no_grad and training forwards, a
# second step's forward, first AdamW (foreach at two shares, fused,
# amsgrad), RMSprop (plain, with momentum and centered) and SGD steps,
# backward plain, checkpointed and recomputing)
# recorded by CUDA's allocator under a real cap (scripts/
# record_cuda_snapshot.py) and diagnosed, against the expectations the CPU
# recordings meet; a line per case (need against the uncapped CUDA run) in
# the summary, the snapshots and diagnoses in recorded.tar.gz.
recorded() {
  local work=/tmp/oomtune_recorded
  rm -rf "$work" && mkdir -p "$work"
  step "The CPU recorder's GPT-2 runs on CUDA, diagnosed (tests/scripts/cpu_snapshot_test.py with scripts/record_cuda_snapshot.py)" \
    recorded.txt env OOMTUNE_RECORDED_DIR="$work" timeout "$(budget 400)" "$python" tests/scripts/cpu_snapshot_test.py \
    "$root" "$build/oomtune" scripts/record_cuda_snapshot.py
  mv "$out/recorded.txt" "$work/"
  gzip -f "$work"/*.pickle 2> /dev/null
  tar -czf "$out/recorded.tar.gz" -C /tmp oomtune_recorded
}

# probe_job NAME FILE DEVICE [ARGS...]: the probe's table in the summary,
# its JSON (no fits) as probe_<DEVICE>_<NAME>.json in probes.tar.gz.
probes=/tmp/oomtune_probes
mkdir -p "$probes"
probe_job() {
  local name=$1 file=$2 device=$3 start=$SECONDS table status
  shift 3
  table="$(timeout "$(budget 120)" "$build/oomtune" probe "$file" --device "$device" "$@" 2>&1)"
  status=$?
  say ""
  say "## probe $name on $device ($file $*): exit $status in $((SECONDS - start)) s"
  say '```'
  say "$table"
  say '```'
  timeout "$(budget 60)" "$build/oomtune" probe "$file" --device "$device" --json --no-fit "$@" \
    > "$probes/probe_${device}_$name.json" 2>> "$out/steps.log"
}

# #46 item 6: the CPU and meta probes' "budget on CUDA" verdict against a run
# whose caching allocator is capped at the usable budget. The meta probe
# predicts that the example GPT runs out of memory under 150 MiB (196 MiB
# reserved, the first failure a 7.81 MiB aten::cross_entropy_loss request in
# loss) and fits under 256 MiB.
budget_on_cuda() {
  local budget_size start predicted measured
  for budget_size in 150MiB 256MiB; do
    start=$SECONDS
    predicted="$(timeout "$(budget 60)" "$build/oomtune" probe examples/gpt.toml --device meta --no-fit \
                 --budget "$budget_size" 2>&1 | grep -E '^(step  |budget|predicted reserved|oomtune:)')"
    measured="$(timeout "$(budget 120)" "$build/oomtune" probe examples/gpt.toml --device cuda --no-fit \
                --enforce-budget --budget "$budget_size" 2>&1 |
                grep -E '^(outcome|step  |budget|measured reserved|predicted reserved|oomtune:)')"
    say ""
    say "## The budget on CUDA at $budget_size: meta's prediction, then a capped CUDA run ($((SECONDS - start)) s)"
    say '```'
    say "$predicted"
    say "--- cuda, --enforce-budget:"
    say "$measured"
    say '```'
  done
}

# autotune_compare SECONDS [CASE ...]: issue #44's autotune against
# Accelerate (the cases: resnet50:8GiB resnet50:16GiB gpt100m:8GiB by
# default), within SECONDS.
autotune_compare() {
  local seconds=$1 work=/tmp/oomtune_autotune cases=() case
  shift
  mkdir -p "$work"
  sed -e "s#^model = .*#model = \"$root/examples/models/resnet50.pt\"#" -e 's/^global_batch = .*/global_batch = 256/' \
    -e '/^\[optimizer\]/,$d' -e '/^#/d' examples/resnet50.toml > "$work/resnet50.toml"
  sed -e 's/^global_batch = .*/global_batch = 32/' -e 's/"batch", 64/"batch", 1024/' \
    -e 's/range = \[0, 1000\]/range = [0, 8192]/' -e '/^#/d' examples/gpt.toml > "$work/gpt100m.toml"
  if [ $# -eq 0 ]; then set -- resnet50:8GiB resnet50:16GiB gpt100m:8GiB; fi
  case " $* " in
    *" gpt100m:"*)  # a GPT of about 100 M parameters (12 blocks, d = 768, vocabulary 8192) at T = 1024
      "$python" examples/export_models.py --only gpt --out "$work/models" --gpt-layers 12 --gpt-dim 768 \
        --gpt-heads 12 --gpt-seq 1024 --gpt-vocab 8192 --gpt-dropout 0 ;;
  esac
  for case in "$@"; do cases+=("$work/${case%%:*}.toml:${case#*:}"); done
  step "autotune --device cuda against Accelerate's find_executable_batch_size (scripts/autotune_vs_accelerate.py)" \
    autotune.md timeout "$seconds" "$python" scripts/autotune_vs_accelerate.py --oomtune "$build/oomtune" \
    --python "$python" --out "$work/out" --deadline $((seconds - 30)) "${cases[@]}"
  rm -f "$out/autotune.md"  # in the summary
  tar -czf "$out/autotune.tar.gz" -C "$work" out
}

# checkpointing: the whole error of GPT-2 checkpointed in bf16 on CUDA, and
# the checkpointed peaks' compositions on CUDA against meta (with the same
# jobs unchecked as the control: there only cuDNN's workspaces may differ).
checkpointing() {
  local work=/tmp/oomtune_checkpointing job batch flags name device
  mkdir -p "$work"
  # First the checkpoint operator's own tests on the GPU: gradients equal the
  # plain run's (CUDA dropout masks, bf16 autocast, cuDNN), and the incoming
  # gradient released on the autograd engine's device thread.
  gpu_tests cuda_checkpointing_tests '^CudaCheckpointing' "$(budget 120)"
  # A learned attention bias (T5's) through SDPA: which kernel, whether
  # cuDNN raises, and the broadcast gradient oomtune counts (Note [Mask
  # gradients] in probes/attention_model.cpp). Seconds.
  step "SDPA with a mask that requires grad (scripts/sdpa_mask_gradient.py)" sdpa_mask_gradient.md \
    timeout "$(budget 40)" "$python" scripts/sdpa_mask_gradient.py
  rm -f "$out/sdpa_mask_gradient.md"  # in the summary
  # Both GPT-2 fixtures (eager attention, and SDPA: oomtune's attention
  # operator) tell whether the attention is where the dtypes meet. The
  # step's exit status is the probe's (its output cut to 120 lines).
  sed "s#^model = .*#model = \"$(cd ../shared && pwd)/fixtures/torchscript/hf_gpt2_sdpa_trace.pt\"#" \
    examples/hf_gpt2.toml > "$work/hf_gpt2_sdpa.toml"
  for job in examples/hf_gpt2.toml "$work/hf_gpt2_sdpa.toml"; do
    step "$(basename "$job" .toml) checkpointed in bf16 on CUDA (the whole error, if it fails)" "$(basename "$job" .toml)_ckpt_bf16.txt" \
      env OOMTUNE_FULL_ERRORS=1 TORCH_SHOW_CPP_STACKTRACES=1 timeout "$(budget 120)" bash -c \
      '"$0" probe "$1" --device cuda --no-fit --batch 8 --config micro_batch=8,ckpt=all,precision=bf16 > "$2" 2>&1
       status=$?; grep -vE "^\s*$" "$2" | head -n 120; exit $status' "$build/oomtune" "$job" "$work/probe_output.txt"
    mv "$out/$(basename "$job" .toml)_ckpt_bf16.txt" "$work/"
  done
  for job in examples/resnet50.toml:32 examples/gpt.toml:32; do
    batch=${job#*:}
    for flags in ckpt=all ckpt=none; do
      name="$(basename "${job%%:*}" .toml)_${batch}_${flags#ckpt=}"
      for device in meta cuda; do
        timeout "$(budget 120)" "$build/oomtune" probe "${job%%:*}" --device "$device" --no-fit --batch "$batch" \
          --config "micro_batch=$batch,$flags" --json > "$work/${name}_$device.json" 2>> "$out/steps.log"
      done
      step "At the peak, $name: meta (A) against CUDA (B)" "$name.md" "$python" scripts/compare_compositions.py \
        "$work/${name}_meta.json" "$work/${name}_cuda.json"
      rm -f "$out/$name.md"  # in the summary
    done
  done
  # Then the 2 % target: the checkpointed cases that missed it on
  # 2026-11-29 (and GPT-2 in bf16, which failed), against eager PyTorch;
  # last, two cases whose reserved bytes missed eager's by 20 MiB (the GPT
  # at 32, where eager also allocated 3.81 MiB more; GPT-2 at 32 in bf16,
  # predicted over): the CUDA runs' own allocations simulated, and every
  # run's allocations kept (--step-events: CUDA, meta and eager) for
  # scripts/compare_step_events.py, say whether the simulator missed or the
  # requests differed, and which. ResNet-50 at 8 unchecked too: its meta
  # prediction is 2.1 % under eager's peak, cuDNN's workspace at the peak
  # 12.94 of the 20.95 MiB (docs/validation.md); its events name the rest.
  local seconds
  seconds="$(budget 200)"
  step "Checkpointed peaks against eager PyTorch (scripts/compare_peaks.py)" checkpointed_peaks.md \
    timeout "$seconds" "$python" scripts/compare_peaks.py --oomtune "$build/oomtune" --python "$python" \
    --out "$work/peaks" --sides cuda,eager,meta --budget 8GiB --jobs 6 --timeout 120 --deadline $((seconds - 20)) \
    --step-events examples/resnet50.toml:{8,16,32}:ckpt examples/resnet50.toml:16:ckpt:bf16 \
    examples/gpt.toml:32:ckpt examples/hf_gpt2.toml:{8,32}:ckpt examples/hf_gpt2.toml:{8,32}:ckpt:bf16 \
    examples/gpt.toml:32 examples/hf_gpt2.toml:32:bf16 examples/resnet50.toml:8
  rm -f "$out/checkpointed_peaks.md"  # in the summary; the tables: compare_peaks.py --tables
  cudnn_workspaces "$work/cudnn"
  capped_eager "$work/capped"
  tar -czf "$out/checkpointing.tar.gz" -C /tmp oomtune_checkpointing
}

# capped_eager DIR: eager PyTorch's ResNet-50 checkpointed (and plain at
# 32), capped at the reserved bytes oomtune's meta run predicts, 10 steps,
# then the same without a cap: capped, each must end with 0, a
# convolution's cuDNN workspace giving way where it finds no room (the
# allocator's num_ooms above 0, caught by cuDNN), at the cost in step time
# the two runs' seconds say (docs/validation.md, "cuDNN's workspaces under
# a cap": simulated on the 2026-12-04 step events, each runs there; the
# plain case since meta sums gradients in place, 2026-12-06: predicted
# 3352 MiB against eager's 3532). Each run's JSON in DIR.
capped_eager() {
  local dir=$1 case batch precision ckpt predicted name capped snapshot
  mkdir -p "$dir"
  for case in 32:fp32:all 16:fp32:all 8:fp32:all 16:bf16:all 32:fp32:none; do
    IFS=: read -r batch precision ckpt <<< "$case"
    name="resnet50_${batch}_${ckpt}_${precision}"
    predicted=$("$build/oomtune" probe examples/resnet50.toml --device meta --no-fit --batch "$batch" \
      --config "micro_batch=$batch,ckpt=$ckpt,precision=$precision" --budget 8GiB --json 2>> "$out/steps.log" |
      "$python" -c 'import json, sys; print(json.load(sys.stdin)["report"]["reserved"]["peak_reserved_bytes"])')
    [ -n "$predicted" ] || { say "capped_eager: $name: no predicted reserved bytes (steps.log)"; continue; }
    for capped in "--budget $predicted" ""; do
      # The capped run at 32 keeps its allocator history: the errors cuDNN
      # caught, for `oomtune diagnose` (below) and a test fixture.
      snapshot=""
      if [ -n "$capped" ] && [ "$case" = 32:fp32:all ]; then snapshot="--snapshot $dir/${name}_capped.pickle"; fi
      # shellcheck disable=SC2086  # the budget's and the snapshot's two words
      timeout "$(budget 60)" "$python" scripts/eager_peaks.py examples/resnet50.toml --micro-batch "$batch" \
        --ckpt "$ckpt" --precision "$precision" --steps 10 $capped $snapshot \
        --out "$dir/${name}${capped:+_capped}.json" > /dev/null 2>> "$out/steps.log"
      echo "$? $predicted" > "$dir/${name}${capped:+_capped}.status"
    done
  done
  step "Eager ResNet-50 checkpointed, capped at oomtune's predicted reserved bytes" capped_eager.md \
    "$python" scripts/capped_eager_table.py "$dir"
  # The capped run's snapshot diagnosed: its out-of-memory errors (num_ooms)
  # must read as caught, in convolutions, and none as ending the run.
  snapshot="$dir/resnet50_32_all_fp32_capped.pickle"
  if [ -f "$snapshot" ]; then
    step "oomtune diagnose of the capped ResNet-50 at 32's snapshot: the errors cuDNN caught" capped_diagnose.txt \
      bash -c '"$0" diagnose "$1" --json > "$1.json"; "$0" diagnose "$1" | head -n 30' "$build/oomtune" "$snapshot"
    gzip -9 "$snapshot"
    # Kept (a fixture of caught errors) unless too big to bring back.
    if [ "$(stat -c %s "$snapshot.gz")" -gt 8000000 ]; then rm -f "$snapshot.gz"; fi
  fi
}

# cudnn_workspaces DIR: what cuDNN holds beside each convolution's and batch
# norm's outputs in eager training, and whether that is the CNNs' gap between
# the meta prediction and eager's peak (#46 item 6; docs/validation.md: 10-40
# MiB): ResNet-50 at 8, 16, 32 and the unseen CNNs at 8, at once (at most 60
# s); each run's JSON in DIR, a table in the summary.
cudnn_workspaces() {
  local dir=$1 job jobs seconds
  mkdir -p "$dir"
  jobs="$(unseen_cnns 2>> "$out/steps.log" | sed 's/$/:8/')"
  seconds="$(budget 60)"
  for job in examples/resnet50.toml:8 examples/resnet50.toml:16 examples/resnet50.toml:32 $jobs; do
    timeout "$seconds" "$python" scripts/conv_workspaces.py "${job%:*}" --micro-batch "${job##*:}" \
      --out "$dir/$(basename "${job%:*}" .toml)_${job##*:}.json" > /dev/null 2>> "$out/steps.log" &
  done
  wait
  step "cuDNN's bytes beside each call (scripts/conv_workspaces.py)" cudnn_workspaces.md \
    "$python" scripts/conv_workspaces.py --table "$dir"/*.json
  rm -f "$out/cudnn_workspaces.md"  # in the summary
}

case "$mode" in
  --validate) validate; exit 0 ;;
  --snapshots) snapshots; eval_snapshots; checkpointed_snapshots; exit 0 ;;
  --checkpointing) checkpointing; exit 0 ;;
  --recorded) recorded; exit 0 ;;
  --autotune) autotune_compare "$(budget 540)" "$@"
    exit 0 ;;
esac

cores="$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)"
test_threads="${OOMTUNE_CTEST_THREADS:-1}"
# The SDPA fixture's job: examples/hf_gpt2.toml with the other file.
sdpa_job=/tmp/hf_gpt2_sdpa.toml
sed "s#^model = .*#model = \"$(cd ../shared && pwd)/fixtures/torchscript/hf_gpt2_sdpa_trace.pt\"#" \
  examples/hf_gpt2.toml > "$sdpa_job"

if [ -z "$mode" ]; then
  # The peaks need the most time and no other step's results: they run
  # beside the rest, each run its own process with its own CUDA context
  # and caching allocator (the figures do not mix), until 25 s before the
  # end. Their summary goes to a file of its own, added at the end.
  validation_seconds=$((cap - SECONDS - 25))
  : > "$out/validation_summary.md"
  summary="$out/validation_summary.md" validate "$validation_seconds" > /dev/null 2>&1 &
  validation=$!

  # The GPU tests, the allocator's own figures against known bytes.
  gpu_tests cuda_tests '^Cuda' "$(budget 150)"

  # #46 item 6: which library call allocates what beside the tensors.
  step "What the CUDA libraries allocate beside the tensors (scripts/workspace_probe.py)" workspace_probe.json \
    timeout "$(budget 60)" "$python" scripts/workspace_probe.py
  mv "$out/workspace_probe.json" "$probes/"

  # The example GPT on CUDA with the retained-activation fit; the SDPA
  # fixture on CUDA and on meta for a CUDA target (#46 item 3: the flash
  # kernel's bytes, not T x T).
  probe_job gpt examples/gpt.toml cuda
  probe_job sdpa "$sdpa_job" cuda --no-fit
  probe_job sdpa "$sdpa_job" meta --no-fit
  budget_on_cuda
  snapshots
  # #44 item 3: a whole autotune on the GPU, its verified runs held by the
  # reserved bytes the allocator's cap limits (tested against a fake GPU
  # only); the larger cases are --autotune's.
  step "autotune examples/gpt.toml --device cuda --budget 256MiB" autotune_gpt.txt timeout "$(budget 120)" \
    "$build/oomtune" autotune examples/gpt.toml --device cuda --budget 256MiB --snapshot-dir "$probes/snapshots"
  mv "$out/autotune_gpt.txt" "$probes/"
  tar -czf "$out/probes.tar.gz" -C /tmp oomtune_probes
  # Then, while 150 s are left, the first of --autotune's cases (ResNet-50,
  # AdamW, fp32, 8 GiB), beside the validation's last runs.
  if [ $((cap - SECONDS - 25)) -ge 150 ]; then autotune_compare $((cap - SECONDS - 25)) resnet50:8GiB; fi

  wait "$validation"
  cat "$out/validation_summary.md" >> "$summary"
  rm -f "$out/validation_summary.md"
  say ""
  say "Done in $SECONDS s."
  exit 0
fi

# --suite: the whole test suite (fuzz needs clang's libFuzzer, absent
# there: skipped), then the probes on the CPU and on the GPU.
start=$SECONDS
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

# Both fixtures probed end to end on the CPU (the SDPA one must probe on a
# libtorch that has aten::scaled_dot_product_attention), and the example
# GPT; then the example GPT and the eager GPT-2 fixture on the GPU.
probe_job eager examples/hf_gpt2.toml cpu
probe_job sdpa "$sdpa_job" cpu
probe_job gpt examples/gpt.toml cpu
probe_job gpt examples/gpt.toml cuda
probe_job eager examples/hf_gpt2.toml cuda
tar -czf "$out/probes.tar.gz" -C /tmp oomtune_probes
