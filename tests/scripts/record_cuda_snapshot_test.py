"""scripts/record_cuda_snapshot.py without a GPU: how it reads a CUDA
trace and chooses its cap, on traces and runs made by hand whose answers
are known (the CUDA runs themselves: docs/gpu_machine.md item 8).

- trace_events and oom_index: the allocations and requested frees of a
  trace with segment events between them, the failing allocation's index
  and whether its frames rerun a checkpointed block;
- uncapped_growth (record_cpu_snapshot.py's, shared) on those events;
- phase_ranges and wanted: which failures --oom-in, --share, --oom-step
  and --oom-after accept;
- search: the highest cap whose run fails as asked; for --oom-after the
  lowest cap failing at or after the share.

Usage: record_cuda_snapshot_test.py SOURCE_DIR
"""

import os
import sys
import types

sys.path.insert(0, os.path.join(sys.argv[1], "scripts"))
import record_cuda_snapshot as cuda  # noqa: E402

failures = []


def check(what, got, expected):
    if got != expected:
        failures.append(f"{what}: expected {expected!r}, got {got!r}")


CHECKPOINT = {"filename": "/venv/lib/python3.12/site-packages/torch/utils/checkpoint.py", "name": "unpack_hook",
              "line": 1100}
MODEL = {"filename": "/venv/lib/python3.12/site-packages/transformers/models/gpt2/modeling_gpt2.py",
         "name": "forward", "line": 300}
trace = [
    {"action": "segment_alloc", "addr": 0, "size": 2 << 20},
    {"action": "alloc", "addr": 0, "size": 1000},
    {"action": "alloc", "addr": 1024, "size": 3000},
    {"action": "free_requested", "addr": 0, "size": 1000},
    {"action": "free_completed", "addr": 0, "size": 1000},
    {"action": "alloc", "addr": 0, "size": 500},
    {"action": "alloc", "addr": 4096, "size": 8000},
    {"action": "segment_free", "addr": 8 << 20, "size": 2 << 20},
    {"action": "oom", "size": 4 << 20, "device_free": 1 << 30, "frames": [MODEL, CHECKPOINT]},
]
events = cuda.trace_events(trace)
check("trace_events", [(e.ptr, e.size) for e in events],
      [(0, 1000), (1024, 3000), (0, -1000), (0, 500), (4096, 8000)])
check("oom_index", cuda.oom_index(trace), (4, True))
check("oom_index outside a recomputation", cuda.oom_index(trace[:-1] + [dict(trace[-1], frames=[MODEL])]), (4, False))
check("oom_index without one", cuda.oom_index(trace[:-1]), (None, False))
# Before the third allocation 3000 B are alive; the run then reaches 3000 + 500 + 8000.
check("uncapped_growth", cuda.cpu.uncapped_growth(events, 2), 8500)

# Two steps: forward 0-9, backward 10-29, optimizer 30-39, then step 1 from 40.
marks = [("forward", 0, 0), ("backward", 0, 10), ("optimizer", 0, 30), ("forward", 1, 40), ("backward", 1, 50),
         ("optimizer", 1, 70), ("end", 2, 80)]
ranges = cuda.phase_ranges(marks)
check("phase_ranges", (ranges[("backward", 1)], ranges[("optimizer", 0)], len(ranges)), ((50, 70), (30, 40), 6))


def options(**kw):
    base = dict(oom_after=None, oom_in=None, share=1.0, oom_step=None, steps=2)
    base.update(kw)
    return types.SimpleNamespace(**base)


backward_half = cuda.wanted(options(oom_in="backward", share=0.5), ranges, 80)  # step 1's 50..59
check("--oom-in backward --share 0.5", [backward_half(i, False) for i in (49, 50, 59, 60)],
      [False, True, True, False])
first_forward = cuda.wanted(options(oom_in="forward", oom_step=0), ranges, 80)
check("--oom-in forward --oom-step 0", [first_forward(i, False) for i in (0, 9, 10, 45)], [True, True, False, False])
recomputation = cuda.wanted(options(oom_in="recomputation"), ranges, 80)
check("--oom-in recomputation", [recomputation(55, True), recomputation(55, False), recomputation(45, True)],
      [True, False, False])
after = cuda.wanted(options(oom_after=0.7, steps=1), {}, 80)  # at or after allocation 56
check("--oom-after 0.7", [after(55, False), after(56, False)], [False, True])

# A run fails at allocation cap / 2 MiB (none above 60 MiB: the uncapped
# peak 64 MiB); at 40 MiB it runs through (a cache freed in time).
MIB = 1 << 20


def attempt(cap):
    if cap > 60 * MIB or cap == 40 * MIB:
        return None, False, None
    return cap // (2 * MIB), False, f"snapshot at {cap // MIB} MiB"


check("search: no cap fails in 50..59 (at most allocation 30)", cuda.search(64 * MIB, attempt, backward_half), None)
check("search: highest cap failing in 10..29", cuda.search(64 * MIB, attempt, lambda i, r: 10 <= i < 30),
      (58 * MIB, 29, "snapshot at 58 MiB"))
check("search: --oom-after, lowest cap failing at or after 22", cuda.search(
    64 * MIB, attempt, lambda i, r: i >= 22, after=True), (44 * MIB, 22, "snapshot at 44 MiB"))
check("search: nothing fails as asked", cuda.search(64 * MIB, attempt, lambda i, r: i > 40), None)
check("search: --oom-after, the first failure already too early", cuda.search(
    64 * MIB, attempt, lambda i, r: i >= 31, after=True), None)

for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
