#!/usr/bin/env bash
# Benchmark: `oomtune diagnose --json` against Python pickle.load +
# torch.cuda._memory_viz on a snapshot with >= 10^6 trace events.
# Usage: bench/diagnose/run.sh [BUILD_DIR] [EVENTS] [GENERATOR OPTIONS...]
#   EVENTS defaults to 10^6 (~79 MB); the options go to make_large_snapshot.py
#   (--real: one frames list per event, deep stacks, 512 segments;
#   --fragmented: an out-of-memory by fragmentation, so the trace is also
#   replayed under the allocator settings).
#   RUNS=N runs each tool N times (default 3; the median wall time is shown).
#   The 1 GB cases (see bench/README.md), ~6 minutes each:
#     bench/diagnose/run.sh BUILD_DIR 14000000          # ~1.1 GB
#     bench/diagnose/run.sh BUILD_DIR 10000000 --real   # ~1.1 GB
#     bench/diagnose/run.sh BUILD_DIR 10000000 --real --fragmented
#   They need ~1.1 GB free in TMPDIR and ~6 GB of memory for the Python side.
# Targets (issue #6): oomtune >= 10x faster; oomtune peak RSS <= 2x the file.
# Also timed: opcode_walk.cpp (built here with ${CXX:-g++} -O2), which only
# decodes the file's opcodes: about the floor of a one-thread reader of it.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="${1:-$here/../../build}"
events="${2:-1000000}"
shift $(( $# < 2 ? $# : 2 ))
gen_options=("$@")
runs="${RUNS:-3}"
oomtune="$build/oomtune"
py="${OOMTUNE_PYTHON:-/usr/bin/python3}"
[ -x "$oomtune" ] || { echo "no oomtune at $oomtune (pass the build folder)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "needs /usr/bin/time (GNU time)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
snap="$tmp/large.pickle"
"${CXX:-g++}" -std=c++17 -O2 -o "$tmp/opcode_walk" "$here/opcode_walk.cpp"
"$py" "$here/make_large_snapshot.py" "$snap" "$events" ${gen_options[@]+"${gen_options[@]}"}
bytes=$(stat -c %s "$snap")
sync "$snap"                 # no writeback of the fresh file during the timed runs,
cat "$snap" > /dev/null      # and both tools read it from the page cache

measure() {  # name command... -> "seconds rss_kib"; the output in $tmp/name.out
  local name="$1"; shift
  local log="$tmp/$name.time"
  if ! /usr/bin/time -v "$@" >"$tmp/$name.out" 2>"$log"; then
    # A run that fails fast would read as a large speed-up.
    echo "bench/diagnose: the $name run failed: $*" >&2
    grep -v $'^\t' "$log" | tail -n 5 >&2  # its stderr, not time's report
    return 1
  fi
  local wall rss
  wall=$(awk -F': ' '/Elapsed \(wall clock\)/ {print $2}' "$log")
  rss=$(awk -F': ' '/Maximum resident set size/ {print $2}' "$log")
  # h:mm:ss or m:ss.ss -> seconds
  secs=$(echo "$wall" | awk -F: '{ if (NF == 3) print $1*3600 + $2*60 + $3; else print $1*60 + $2 }')
  echo "$secs $rss"
}

median() {  # name command... -> median wall seconds and the largest RSS of $runs runs
  local name="$1"; shift
  local results=() result
  for _ in $(seq "$runs"); do
    result=$(measure "$name" "$@") || return 1
    results+=("$result")
  done
  printf '%s\n' "${results[@]}" | sort -n |
    awk -v m=$(( (runs + 1) / 2 )) 'NR == m {s = $1} {if ($2 > r) r = $2} END {print s, r}'
}

timed=$(median oomtune "$oomtune" diagnose "$snap" --json) || exit 1
read -r o_s o_rss <<< "$timed"
timed=$(median python "$py" "$here/python_baseline.py" "$snap") || exit 1
read -r p_s p_rss <<< "$timed"
timed=$(median walk "$tmp/opcode_walk" "$snap") || exit 1
read -r w_s w_rss <<< "$timed"

# Both read the same snapshot: the peak allocated and the out-of-memory
# count must agree, or one of them did less work than the other.
"$py" - "$tmp/oomtune.out" "$tmp/python.out" <<'EOF' || exit 1
import json
import sys

ours = json.load(open(sys.argv[1]))
segments, peak, reserved, ooms = map(int, open(sys.argv[2]).read().split())
mismatch = [f"{what}: oomtune {a}, Python {b}" for what, a, b in (
    ("peak allocated bytes", ours["peak"]["allocated_bytes"], peak),
    ("out-of-memory events", len(ours["ooms"]), ooms)) if a != b]
if mismatch:
    sys.exit("bench/diagnose: the two tools disagree: " + "; ".join(mismatch))
print(f"both tools: peak allocated {peak} bytes, {ooms} out-of-memory event(s)")
EOF

awk -v b="$bytes" -v ev="$events" -v opts="${gen_options[*]-}" -v n="$runs" -v os="$o_s" -v orss="$o_rss" -v ps="$p_s" -v prss="$p_rss" -v ws="$w_s" -v wrss="$w_rss" 'BEGIN {
  mib = 1048576
  printf "snapshot: %d trace events%s, %.1f MiB\n\n", ev, opts == "" ? "" : " (" opts ")", b / mib
  printf "(median of %d run%s)\n\n| tool | wall s | peak RSS MiB | RSS / file |\n|---|---|---|---|\n", n, n == 1 ? "" : "s"
  printf "| oomtune diagnose --json | %.2f | %.1f | %.2fx |\n", os, orss / 1024, orss * 1024 / b
  printf "| pickle.load + _memory_viz (torch 1.13) | %.2f | %.1f | %.2fx |\n", ps, prss / 1024, prss * 1024 / b
  printf "| opcode walk only (the one-thread floor) | %.2f | %.1f | %.2fx |\n", ws, wrss / 1024, wrss * 1024 / b
  printf "\nspeed-up: %.1fx (target >= 10x); oomtune RSS / file: %.2fx (target <= 2x)\n", ps / (os > 0 ? os : 0.01), orss * 1024 / b
  printf "oomtune / opcode walk: %.1fx; pickle.load + _memory_viz / opcode walk: %.1fx\n", os / (ws > 0 ? ws : 0.01), ps / (ws > 0 ? ws : 0.01)
}'
