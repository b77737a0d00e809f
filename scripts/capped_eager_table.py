#!/usr/bin/env python3
"""The table of device_check.sh's capped eager runs (capped_eager there):
eager PyTorch's step capped at the reserved bytes oomtune predicts, against
the same step without a cap (docs/validation.md, "cuDNN's workspaces under a
cap").

    capped_eager_table.py DIR

DIR holds, per case NAME, NAME_capped.json and NAME.json (scripts/
eager_peaks.py --out) and NAME_capped.status and NAME.status ("EXIT CAP":
the run's exit status and the cap in bytes). Prints a Markdown table: the
cap; per run its exit status, the step's reserved peak (MiB, over every
step), the caching allocator's out-of-memory errors caught inside the run
(num_ooms: a convolution whose cuDNN workspace found no room ran another
engine) and cache flushes (num_alloc_retries), and its seconds a step
(the mean after the first two steps, which choose cuDNN's engines); then
the capped run's time over the free one's. A run without JSON reads
"exit N, no result".
"""

import json
import os
import sys

PHASES = ("forward", "loss", "backward", "optimizer")
MIB = 1 << 20


def read_run(directory, stem):
    """(exit status, cap bytes, the run's JSON or None)."""
    with open(os.path.join(directory, stem + ".status")) as f:
        status, cap = f.read().split()
    try:
        with open(os.path.join(directory, stem + ".json")) as f:
            run = json.load(f)
    except (OSError, ValueError):
        run = None
    return int(status), int(cap), run


def seconds_per_step(run):
    """The mean seconds of the steps after the first two (of all, if fewer)."""
    steps = run["steps"][2:] or run["steps"]
    return sum(s["seconds"] for s in steps) / len(steps) if steps else None


def reserved_peak(run):
    return max((s[p]["peak_reserved_bytes"] or 0 for s in run["steps"] for p in PHASES), default=0)


def run_cell(status, run):
    if run is None:
        return f"exit {status}, no result"
    counters = run.get("allocator") or {}
    seconds = seconds_per_step(run)
    text = (f"exit {status}, {reserved_peak(run) / MIB:.0f} MiB, {counters.get('num_ooms', '?')} OOMs caught, "
            f"{counters.get('num_alloc_retries', '?')} flushes, "
            f"{'-' if seconds is None else f'{seconds:.3f} s'}")
    if "out_of_memory" in run:
        oom = run["out_of_memory"]
        text += f", out of memory in step {oom['step']}'s {oom['phase']}"
    return text


def table(directory):
    names = sorted({f[:-len(".status")].removesuffix("_capped") for f in os.listdir(directory)
                    if f.endswith(".status")})
    lines = ["| case | cap: oomtune's predicted reserved | capped | no cap | capped time / free |",
             "|---|---:|---|---|---:|"]
    for name in names:
        status, cap, capped = read_run(directory, name + "_capped")
        free_status, _, free = read_run(directory, name)
        ratio = "-"
        if capped is not None and free is not None:
            a, b = seconds_per_step(capped), seconds_per_step(free)
            if a is not None and b:
                ratio = f"{a / b:.2f}"
        lines.append(f"| {name} | {cap / MIB:.0f} MiB | {run_cell(status, capped)} | {run_cell(free_status, free)} "
                     f"| {ratio} |")
    return "\n".join(lines)


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: capped_eager_table.py DIR")
    print(table(sys.argv[1]))


if __name__ == "__main__":
    main()
