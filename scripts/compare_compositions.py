#!/usr/bin/env python3
"""What two probes of one job held at their peaks, share by share.

    python3 scripts/compare_compositions.py A.json B.json [--top N]

A and B are `oomtune probe --json` outputs (a GPU trial and its meta
prediction, say). Their `report.peak_composition` (probes/peak_composition.h)
groups the blocks live at each run's peak by the operator that allocated them
and the phase it ran in; this prints the groups whose bytes differ, largest
difference first, as a Markdown table in MiB. Exit 2 with one line on a file
that is not such a probe.
"""

import argparse
import json
import sys

MIB = 1024 * 1024


def composition(path):
    try:
        with open(path, encoding="utf-8") as f:
            report = json.load(f)["report"]
        c = report["peak_composition"]
        shares = {}
        for s in c["shares"]:
            when = ("earlier " if s["earlier_step"] else "") + s["phase"]
            shares[(s["op"], when)] = (s["bytes"], s["blocks"])
        return c["phase"], c["live_bytes"], shares
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"compare_compositions: {path}: not an oomtune probe --json with a peak composition ({e!r})",
              file=sys.stderr)
        sys.exit(2)


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--top", type=int, default=15, help="rows shown (default 15)")
    args = parser.parse_args(argv)
    phase_a, live_a, a = composition(args.a)
    phase_b, live_b, b = composition(args.b)
    print(f"A: {args.a}: {live_a / MIB:.2f} MiB live at its peak, in {phase_a}")
    print(f"B: {args.b}: {live_b / MIB:.2f} MiB live at its peak, in {phase_b}")
    print(f"B - A: {(live_b - live_a) / MIB:+.2f} MiB")
    print()
    print("| operator | allocated in | A MiB (blocks) | B MiB (blocks) | B - A MiB |")
    print("|---|---|---:|---:|---:|")
    rows = []
    for key in set(a) | set(b):
        bytes_a, blocks_a = a.get(key, (0, 0))
        bytes_b, blocks_b = b.get(key, (0, 0))
        if bytes_a != bytes_b:
            rows.append((abs(bytes_b - bytes_a), key, bytes_a, blocks_a, bytes_b, blocks_b))
    rows.sort(key=lambda row: (-row[0], row[1]))
    for _, (op, when), bytes_a, blocks_a, bytes_b, blocks_b in rows[: args.top]:
        print(f"| {op} | {when} | {bytes_a / MIB:.2f} ({blocks_a}) | {bytes_b / MIB:.2f} ({blocks_b}) | "
              f"{(bytes_b - bytes_a) / MIB:+.2f} |")
    if len(rows) > args.top:
        print(f"\n{len(rows) - args.top} more groups differ.")
    if not rows:
        print("| (every group equal) | | | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
