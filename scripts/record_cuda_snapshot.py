#!/usr/bin/env python3
"""The GPT-2 runs of record_cpu_snapshot.py, recorded on CUDA: the same
options, the same JSON, a snapshot that is CUDA's own.

    record_cuda_snapshot.py --out FILE.pickle [the options of record_cpu_snapshot.py]

What the CPU recorder models, CUDA does here: the run is PyTorch's on the
GPU (its CUDA kernels' requests, backward on the autograd engine's device
thread, host tensors off the device), its history recorded by the caching
allocator itself (torch.cuda.memory._record_memory_history, stacks
"python"), the cap is the allocator's (torch.cuda.set_per_process_memory_
fraction) and the out-of-memory a real torch.cuda.OutOfMemoryError; the
snapshot is torch.cuda.memory._snapshot() taken in the handler, as a
user's `except` writes it with _dump_snapshot (the failing step's tensors
still alive). docs/gpu_machine.md item 8 holds its diagnoses against those
of the CPU recordings: tests/scripts/cpu_snapshot_test.py with this
script as its RECORDER.

The cap: after a warm-up run (the cuBLAS workspaces, made once per
process, stay allocated), one uncapped run gives the allocations, its
phases' ranges (torch.cuda.memory_stats' allocation count as each phase
begins) and the peak reserved bytes; then caps from 2 MiB below that
peak, in 2 MiB steps, each run afresh (empty cache, the model built
again) until one fails where the options say: with --oom-in PHASE, in
that phase of step --oom-step (default the last) within its first
--share of allocations ("backward" counts a recomputation, "recomputation"
needs the failing request's frames in one); with --oom-after F, at or
after the run's F share of its allocations, at the lowest such cap (the
CPU recorder freezes the cap there: the first later allocation needing a
segment fails). uncapped_growth_bytes is read from the uncapped run's
trace at the failing allocation's index, as on the CPU (the runs make the
same requests in the same order).

With --compile the snapshots are taken with augment_with_fx_traces=True,
as record_cpu_snapshot.py augments its own, the history is recorded with
compile_context=True (each event's torch.compile region), and each phase
sets torch.cuda.memory._set_memory_metadata("PHASE step N"), so that the
snapshot holds both tags PyTorch 2.11 can record (diagnose/event_tags.h;
not run on a GPU yet). --cuda-graphs (torch.compile(mode="reduce-overhead"),
CUDA graph trees in a private memory pool; tagged likewise) is recorded
here only: the CPU recorder has no CUDA graphs (exit 78); so are
--empty-cache (torch.cuda.empty_cache() after each step) and --side-stream
(a side stream's buffer freed beside a tensor of it kept: memory cached for
another stream than the step's).

Exit 0 with the snapshot, 1 when no cap fails there, 2 on bad arguments or
without a CUDA device, 77 without transformers.
"""

import gc
import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import record_cpu_snapshot as cpu  # noqa: E402  (parse_args, train, uncapped_growth)

STEP_MIB = 2 << 20
RECOMPUTING = ("unpack_hook", "recompute_fn")  # torch/utils/checkpoint.py, use_reentrant=False


class Alloc:
    """One allocation (size > 0) or free (size < 0) of a trace, as
    record_cpu_snapshot.uncapped_growth reads them."""
    __slots__ = ("ptr", "size")

    def __init__(self, ptr, size):
        self.ptr, self.size = ptr, size


def trace_events(trace):
    """A device trace's allocations and requested frees, in order."""
    return [Alloc(e["addr"], e["size"] if e["action"] == "alloc" else -e["size"])
            for e in trace if e["action"] in ("alloc", "free_requested")]


def oom_index(trace):
    """(index of the failing allocation among the trace's allocations,
    whether its frames rerun a checkpointed block) at the last
    out-of-memory; (None, False) without one."""
    ooms = [i for i, e in enumerate(trace) if e["action"] == "oom"]
    if not ooms:
        return None, False
    last = ooms[-1]
    recomputing = any(f.get("name") in RECOMPUTING and f.get("filename", "").endswith("utils/checkpoint.py")
                      for f in trace[last].get("frames", []))
    return sum(1 for e in trace[:last] if e["action"] == "alloc"), recomputing


def phase_ranges(marks):
    """{(phase, step): (first, end)} allocation indices from the marks
    (phase, step, allocations made before it) of one run."""
    return {(phase, step): (first, marks[k + 1][2]) for k, (phase, step, first) in enumerate(marks[:-1])}


def wanted(args, ranges, allocations):
    """The test a capped run's failure must pass: f(index, recomputing)."""
    if args.oom_after is not None:
        start = int(allocations * args.oom_after)
        return lambda index, recomputing: index >= start
    step = args.oom_step if args.oom_step is not None else args.steps - 1
    first, end = ranges[("backward" if args.oom_in == "recomputation" else args.oom_in, step)]
    last = first + max(1, int((end - first) * args.share)) - 1
    if args.oom_in == "recomputation":
        return lambda index, recomputing: recomputing and first <= index < end
    return lambda index, recomputing: first <= index <= last


def search(peak, attempt, accept, after=False):
    """The cap, from STEP_MIB below `peak` down in STEP_MIB steps, whose
    run fails as `accept(index, recomputing)` asks: the highest; with
    `after` (--oom-after), the lowest of those above the first that fails
    without passing. attempt(cap) -> (index of the failing allocation or
    None, recomputing, snapshot). Returns (cap, index, snapshot) or None."""
    previous = None
    for cap in range(peak - STEP_MIB, 0, -STEP_MIB):
        failed_at, recomputing, snapshot = attempt(cap)
        if failed_at is None:
            continue
        if not after and accept(failed_at, recomputing):
            return cap, failed_at, snapshot
        if after:
            if not accept(failed_at, recomputing):
                return previous
            previous = (cap, failed_at, snapshot)
    return previous if after else None


def run(args, torch, device, ids, cap=None, history=True):
    """One run from an empty cache under `cap` bytes reserved (None: the
    device's all): (parameter bytes or None, marks, snapshot or None,
    peak reserved bytes). The snapshot is taken at the out-of-memory or,
    uncapped, at the end."""
    gc.collect()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(device).total_memory
    torch.cuda.set_per_process_memory_fraction(1.0 if cap is None else cap / total, device)
    torch.cuda.reset_accumulated_memory_stats(device)
    torch.cuda.reset_peak_memory_stats(device)
    marks = []

    compiled = args.compile or args.cuda_graphs
    tag = compiled and hasattr(torch.cuda.memory, "_set_memory_metadata")

    def mark(phase, step):
        marks.append((phase, step, torch.cuda.memory_stats(device).get("allocation.all.allocated", 0)))
        if tag:
            torch.cuda.memory._set_memory_metadata(f"{phase} step {step}")

    if history:
        torch.cuda.memory._record_memory_history(max_entries=1_000_000, stacks="python", clear_history=True,
                                                 compile_context=compiled)
    parameter_bytes = snapshot = None
    try:
        # The parameters made on the device in the model's own __init__, as
        # on the CPU; the step runs outside torch.device(device), whose mode
        # would put every tensor made without a device there too (a foreach
        # optimizer's step counters, Note [Step counters on the device]) and
        # turned an out-of-memory in backward's recomputation of a
        # checkpointed block into "SystemError: ... returned NULL without
        # setting an exception" (torch 2.11, H200, 2026-12-04).
        parameter_bytes = cpu.train(args, ids, mark=mark, build_scope=lambda: torch.device(device))
        if history:
            snapshot = torch.cuda.memory._snapshot(augment_with_fx_traces=args.compile)
    except torch.cuda.OutOfMemoryError:  # the step's tensors still alive, as a user's handler sees them
        if history:
            snapshot = torch.cuda.memory._snapshot(augment_with_fx_traces=args.compile)
    finally:
        if tag:
            torch.cuda.memory._set_memory_metadata("")
        if history:
            torch.cuda.memory._record_memory_history(enabled=None)
    return parameter_bytes, marks, snapshot, torch.cuda.max_memory_reserved(device)


def main():
    args = cpu.parse_args(__doc__)
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    import torch
    if not torch.cuda.is_available():
        print("record_cuda_snapshot: no CUDA device (record_cpu_snapshot.py records on the CPU)", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    ids = torch.randint(0, 1000, (args.batch, args.seq), device=device)
    run(args, torch, device, ids, history=False)  # the workspaces cuBLAS keeps, made once
    parameter_bytes, marks, uncapped, peak = run(args, torch, device, ids)
    trace = uncapped["device_traces"][device.index]
    if parameter_bytes is None:
        print(json.dumps({"error": "the run without a cap ran out of memory: lower --batch or --seq"}))
        return 1
    events = trace_events(trace)
    allocations = sum(1 for e in events if e.size > 0)
    accept = wanted(args, phase_ranges(marks), allocations)

    def attempt(cap):
        snapshot = run(args, torch, device, ids, cap)[2]
        return oom_index(snapshot["device_traces"][device.index]) + (snapshot,)

    chosen = search(peak, attempt, accept, after=args.oom_after is not None)
    if chosen is None:
        print(json.dumps({"error": f"no cap runs out of memory in {args.oom_in or 'the run'} as asked"}))
        return 1
    cap, failed_at, snapshot = chosen
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f)
    os.replace(tmp, args.out)
    print(json.dumps({"allocations": allocations, "oom_at": failed_at,
                      "uncapped_growth_bytes": cpu.uncapped_growth(events, failed_at),
                      "parameter_bytes": parameter_bytes, "cap_bytes": cap, "peak_reserved_bytes": peak,
                      "device": torch.cuda.get_device_name(device), "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
