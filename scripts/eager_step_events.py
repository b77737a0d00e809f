"""One eager training step's CUDA allocations in oomtune's step-events format
(allocsim/step_events_json.h), from the caching allocator's own trace, so
that scripts/compare_step_events.py can set eager PyTorch's requests beside
an oomtune trial's: where the peaks differ, which request made the
difference.

The trace is what torch.cuda.memory._record_memory_history() keeps and
torch.cuda.memory._snapshot() returns under "device_traces" (c10/cuda/
CUDACachingAllocator.cpp TraceEntry: "alloc" and "free_completed" carry the
block's address and the size as requested). Each alloc becomes
["alloc", address, size, phase, op] and each free_completed
["free", address, 0, phase, ""]; an address names one allocation until its
free (the allocator hands it out again after). The phase is the one whose
end the event precedes (marks: the trace's length at each phase's end); the
op is the innermost Python frame outside the torch package ("model.py:41
forward"), or "" without frames. Segment events are left out: the
simulator makes its own.

Used by scripts/eager_peaks.py --step-events; no GPU needed here.
"""

import json
import os


def frame_name(frames, torch_dir):
    """The innermost frame outside torch_dir, as "file.py:LINE function"; "" when none."""
    for frame in frames or []:
        filename = frame.get("filename", "")
        if filename and not os.path.abspath(filename).startswith(torch_dir + os.sep):
            return f"{os.path.basename(filename)}:{frame.get('line', 0)} {frame.get('name', '')}".rstrip()
    return ""


def step_events(trace, marks, torch_dir):
    """The events of `trace` (TraceEntry dicts) as step-events rows; marks is
    [(phase, trace length at its end), ...] in order, the last covering the
    step's last event."""
    events = []
    bounds = iter(marks)
    phase, end = next(bounds, ("optimizer", len(trace)))
    for index, entry in enumerate(trace):
        while index >= end:  # past this phase's end (a phase may hold no event)
            phase, end = next(bounds, (phase, len(trace)))
        action = entry.get("action")
        if action == "alloc":
            events.append(["alloc", entry["addr"], entry["size"], phase, frame_name(entry.get("frames"), torch_dir)])
        elif action == "free_completed":
            events.append(["free", entry["addr"], 0, phase, ""])
    return events


def write(path, trace, marks, torch_dir):
    """Writes the step-events file (JSON) of `trace` to path."""
    with open(path, "w") as f:
        json.dump({"format": "oomtune step events", "version": 1, "columns": ["kind", "id", "bytes", "phase", "op"],
                   "events": step_events(trace, marks, torch_dir)}, f)
