#!/usr/bin/python3
"""Convert a PyTorch CUDA memory snapshot pickle into an allocsim event file.

Usage: snapshot_to_events.py SNAPSHOT.pickle[.gz] OUT.json [--device N]

Reads the pickle written by torch.cuda.memory._dump_snapshot() with the
standard `pickle` module (plain dicts, lists, strings, numbers: no torch
needed) and writes the JSON that allocsim/allocsim_trace.h reads:

  {"format": "oomtune-allocsim-trace", "version": 1,
   "source": "...", "device": 0,
   "allocator_settings": {"max_split_size": -1 | bytes,
                          "max_non_split_rounding_size": bytes | absent,
                          "garbage_collection_threshold": 0.0,
                          "expandable_segments": false,
                          "roundup_power2_divisions": [16 ints]},
   "initial_segments": [{"address": A, "total_size": S, "segment_type": "large",
                         "blocks": [{"address": a, "size": s, "requested_size": r,
                                     "size_inferred": false}, ...]}, ...],
   "events": [["alloc", addr, size], ["free_completed", addr, size],
              ["segment_alloc", addr, size], ["segment_free", addr, size],
              ["segment_map", addr, size], ["segment_unmap", addr, size],
              ["oom", 0, size], ...],
   "budget": {"lower": bytes, "upper": bytes | null},
   "final_segments": [{"address": A, "total_size": S, "segment_type": "large",
                       "blocks": [[address, size, allocated], ...]}, ...]}

initial_segments is the allocator's state when recording began, and
`blocks` lists only the blocks allocated then (the rest of each segment was
free). It is derived by undoing the trace from the dumped state: segments
with a segment_alloc in the trace did not exist before it (segment_free
events put theirs back), and blocks allocated at dump time are undone by
their `alloc` events (free_completed events put theirs back). The dump
gives the size of a block still allocated at the end; a block allocated
before recording and freed during it has only its requested size, so its
size is inferred (round to 512; absorb a gap too small to have been split
off) and flagged "size_inferred".

final_segments is the dumped state itself (every block, allocated or
free), to compare with the simulator's state after the replay.

budget: the per-process cap (set_per_process_memory_fraction) is not stored
in a snapshot, but the trace bounds it: the cap is at least the largest
reserved total reached (lower) and below reserved + the failing cudaMalloc
at every oom event (upper, exclusive; null when there was no oom).

Only the trace's own events are kept (free_requested is dropped: on one
stream it is followed at once by free_completed); events of other devices
are ignored. This mirrors c10/cuda/CUDACachingAllocator.cpp TraceEntry and
torch/cuda/memory.py _snapshot().
"""

import argparse
import gzip
import json
import os
import pickle
import sys

from caching_allocator_rules import K_MIN_BLOCK, K_SMALL_BUFFER, K_SMALL_SIZE, allocation_size, round_size

KEPT_ACTIONS = ("alloc", "free_completed", "segment_alloc", "segment_free",
                "segment_map", "segment_unmap", "oom")


def settings_of(snapshot):
    raw = snapshot.get("allocator_settings", {}) or {}
    divisions = [0] * 16
    rp2 = raw.get("roundup_power2_divisions", {})
    if isinstance(rp2, dict):
        for key, value in rp2.items():
            index = int(key).bit_length() - 1  # interval start in MiB -> log2
            if 0 <= index < 16:
                divisions[index] = int(value)
    elif isinstance(rp2, list):
        divisions = [int(v) for v in rp2][:16] + [0] * max(0, 16 - len(rp2))
    max_split = raw.get("max_split_size", -1)
    out = {
        "max_split_size": int(max_split) if max_split is not None else -1,
        "garbage_collection_threshold": float(raw.get("garbage_collection_threshold", 0.0) or 0.0),
        "expandable_segments": bool(raw.get("expandable_segments", False)),
        "roundup_power2_divisions": divisions,
    }
    if "max_non_split_rounding_size" in raw:
        out["max_non_split_rounding_size"] = int(raw["max_non_split_rounding_size"])
    return out


def initial_state(snapshot, trace, device):
    """Segments and allocated blocks when recording began (see module doc)."""
    segments = {}
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        segments[seg["address"]] = {
            "address": seg["address"],
            "total_size": seg["total_size"],
            "segment_type": seg.get("segment_type", "large"),
            "is_expandable": bool(seg.get("is_expandable", False)),
        }
    allocated = {}  # address -> (size or None, requested_size)
    for seg in snapshot.get("segments", []):
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        for block in seg.get("blocks", []):
            addr = block.get("address", addr)
            if block.get("state") == "active_allocated":
                allocated[addr] = (block["size"], block.get("requested_size", block["size"]))
            addr += block["size"]

    for event in reversed(trace):
        action = event["action"]
        if action == "segment_alloc":
            segments.pop(event["addr"], None)
        elif action == "segment_free":
            size = event["size"]
            segments[event["addr"]] = {
                "address": event["addr"], "total_size": size,
                "segment_type": "small" if size == K_SMALL_BUFFER else "large",
                "is_expandable": False}
        elif action == "alloc":
            allocated.pop(event["addr"], None)
        elif action == "free_completed":
            allocated[event["addr"]] = (None, event["size"])

    out = []
    for seg in sorted(segments.values(), key=lambda s: s["address"]):
        start, end = seg["address"], seg["address"] + seg["total_size"]
        addrs = sorted(a for a in allocated if start <= a < end)
        blocks = []
        for i, addr in enumerate(addrs):
            size, requested = allocated[addr]
            inferred = size is None
            if inferred:
                size = round_size(requested)
                limit = addrs[i + 1] if i + 1 < len(addrs) else end
                gap = limit - addr - size
                small = seg["segment_type"] == "small"
                # should_split(): an unsplit tail stays inside the block.
                if gap > 0 and ((small and gap < K_MIN_BLOCK) or (not small and gap <= K_SMALL_SIZE)):
                    size += gap
            blocks.append({"address": addr, "size": size, "requested_size": requested,
                           "size_inferred": inferred})
        seg = dict(seg)
        seg["blocks"] = blocks
        out.append(seg)
    return out


def budget_bounds(initial_segments, trace):
    reserved = sum(s["total_size"] for s in initial_segments)
    lower = reserved
    upper = None
    for event in trace:
        action = event["action"]
        if action in ("segment_alloc", "segment_map"):
            reserved += event["size"]
            lower = max(lower, reserved)
        elif action in ("segment_free", "segment_unmap"):
            reserved -= event["size"]
        elif action == "oom":
            bound = reserved + allocation_size(event["size"])
            upper = bound if upper is None else min(upper, bound)
    return {"lower": lower, "upper": upper}


def final_state(snapshot, device):
    out = []
    for seg in sorted(snapshot.get("segments", []), key=lambda s: s["address"]):
        if seg.get("device", 0) != device:
            continue
        addr = seg["address"]
        blocks = []
        for block in seg.get("blocks", []):
            addr = block.get("address", addr)
            blocks.append([addr, block["size"], block.get("state") == "active_allocated"])
            addr += block["size"]
        out.append({"address": seg["address"], "total_size": seg["total_size"],
                    "segment_type": seg.get("segment_type", "large"),
                    "is_expandable": bool(seg.get("is_expandable", False)),
                    "blocks": blocks})
    return out


def convert(snapshot, device, source):
    traces = snapshot.get("device_traces", [])
    trace = traces[device] if device < len(traces) else []
    initial = initial_state(snapshot, trace, device)
    events = []
    for event in trace:
        action = event["action"]
        if action not in KEPT_ACTIONS:
            continue
        addr = 0 if action == "oom" else int(event["addr"])
        events.append([action, addr, int(event["size"])])
    return {
        "format": "oomtune-allocsim-trace",
        "version": 1,
        "source": source,
        "device": device,
        "allocator_settings": settings_of(snapshot),
        "initial_segments": initial,
        "events": events,
        "budget": budget_bounds(initial, trace),
        "final_segments": final_state(snapshot, device),
    }


class PlainUnpickler(pickle.Unpickler):
    """A snapshot holds only plain containers: refuse any class or function."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(
            f"snapshot_to_events: refusing to load {module}.{name}: a memory snapshot "
            "holds only dicts, lists, strings and numbers")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot")
    parser.add_argument("output")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args(argv)
    with open(args.snapshot, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"  # the fixtures of tests/fixtures/snapshots/h200_recorded/
    with (gzip.open if gzipped else open)(args.snapshot, "rb") as f:
        snapshot = PlainUnpickler(f).load()
    if not isinstance(snapshot, dict) or "segments" not in snapshot:
        sys.exit(f"snapshot_to_events: {args.snapshot}: expected a dict with 'segments' "
                 f"(torch.cuda.memory._dump_snapshot), got {type(snapshot).__name__}")
    out = convert(snapshot, args.device, args.snapshot)
    tmp = args.output + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, separators=(",", ":"))
    os.replace(tmp, args.output)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
