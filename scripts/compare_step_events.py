#!/usr/bin/env python3
"""Where two recordings of one training step allocate differently.

    python3 scripts/compare_step_events.py A_events.json B_events.json [--top N] [--min-bytes N]
                                           [--ignore-ops]

A and B are `oomtune probe --step-events` files (allocsim/step_events_json.h:
the measured step's allocs and frees, each with its bytes, phase and
operator), for instance a GPU trial's and the meta run of the same
configuration (`scripts/compare_peaks.py --step-events`), or eager PyTorch's
step (`scripts/eager_peaks.py --step-events`, whose "operators" are Python
lines: then align with --ignore-ops). The caching
allocator's reserved bytes depend on the order and sizes of the requests, not
only on the peak, so a predicted reserved figure can miss a measured one while
the peaks agree; this says where the two streams part.

It prints, as Markdown in MiB:
  - each file's live peak above what was alive before the step, and the
    same without its transient requests (freed before the next request is
    made: a kernel's workspace, which cuDNN takes on a GPU and a meta run
    has not; the step's last request is not one);
  - per phase, the allocations (count, bytes) of each;
  - the operators whose allocated bytes differ, largest difference first
    (with --ignore-ops: the request sizes whose counts differ);
  - the stretches where the two sequences differ, aligned by difflib on
    (kind, bytes, operator), with a free's bytes those of its alloc
    ("before the step" for an allocation the file does not hold); with
    --min-bytes, of the requests of at least that size alone (1048577: the
    caching allocator's large pool, whose segments are the reserved bytes
    that can differ by 20 MiB at a time; CUDACachingAllocator.cpp,
    kSmallSize and kLargeBuffer); with --ignore-ops, on (kind, bytes)
    alone, for two files that name operators differently.

Exit 2 with one line on a file that is not a step-events file.
"""

import argparse
import collections
import difflib
import json
import sys

MIB = 1024 * 1024
PHASES = ("load", "forward", "loss", "backward", "optimizer")


class Stream:
    """One file's events as comparable tokens, and its figures."""

    def __init__(self, path, min_bytes=0):
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            if data.get("format") != "oomtune step events":
                raise ValueError(f"format {data.get('format')!r}, expected 'oomtune step events'")
            events = [tuple(e) for e in data["events"]]
            if any(len(e) != 5 or e[0] not in ("alloc", "free") or not isinstance(e[2], int) or e[2] < 0
                   for e in events):
                raise ValueError("an event is not [alloc|free, id, bytes >= 0, phase, op]")
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            print(f"compare_step_events: {path}: not an oomtune step-events file ({e})", file=sys.stderr)
            sys.exit(2)
        self.path = path
        self.events = len(events)
        self.tokens = []  # (kind, bytes or "before the step", op)
        self.phases = []  # the phase of each token
        self.allocated = collections.Counter()  # (phase) -> bytes
        self.allocations = collections.Counter()  # (phase) -> count
        self.by_op = collections.Counter()  # op -> bytes allocated
        self.op_of = {}  # request size -> the first operator that asked for it
        transient = transient_requests(events)
        self.transients = len(transient)
        live = {}  # id -> (bytes, transient): ids can be addresses, which the allocator hands out again
        now = peak = now_lasting = peak_lasting = 0  # "lasting": without the transient requests
        for index, (kind, ident, size, phase, op) in enumerate(events):
            if kind == "alloc":
                live[ident] = (size, index in transient)
                now += size
                peak = max(peak, now)
                if index not in transient:
                    now_lasting += size
                    peak_lasting = max(peak_lasting, now_lasting)
                self.allocated[phase] += size
                self.allocations[phase] += 1
                self.by_op[op] += size
                self.op_of.setdefault(size, op)
                token = ("alloc", size, op)
            else:
                size, was_transient = live.pop(ident, (None, False))
                if size is not None:
                    now -= size
                    if not was_transient:
                        now_lasting -= size
                token = ("free", "before the step" if size is None else size, op)
            if size is None or size >= min_bytes:
                self.tokens.append(token)
                self.phases.append(phase)
        self.peak = peak
        self.peak_without_transients = peak_lasting

    def sizes(self):
        """How many requests of each size the file holds."""
        return collections.Counter(size for kind, size, _ in self.tokens if kind == "alloc")


def transient_requests(events):
    """The indices of the requests freed before the next request is made
    (a kernel's workspace); the last request is not one, there being no
    next one."""
    latest = None  # the id of the latest request while it is the latest
    index_of = {}  # id -> the index of its latest request
    transient = set()
    last_alloc = max((i for i, e in enumerate(events) if e[0] == "alloc"), default=-1)
    for i, (kind, ident, _, _, _) in enumerate(events):
        if kind == "alloc":
            latest, index_of[ident] = ident, i
        elif ident == latest:
            if index_of[ident] != last_alloc:
                transient.add(index_of[ident])
            latest = None
    return transient


def mib(value):
    return f"{value / MIB:.2f}"


def size_text(size):
    """Bytes as B, KiB or MiB, whichever reads best."""
    if isinstance(size, str):
        return size
    if size < 1024:
        return f"{size} B"
    return f"{size / 1024:.2f} KiB" if size < MIB else f"{size / MIB:.2f} MiB"


def token_text(token):
    kind, size, op = token
    return f"{kind} {size_text(size)} {op}".rstrip()


def by_operator(a, b, top):
    """The operators whose allocated bytes differ, largest difference first."""
    rows = sorted(((abs(b.by_op[op] - a.by_op[op]), op) for op in set(a.by_op) | set(b.by_op)
                   if a.by_op[op] != b.by_op[op]), key=lambda row: (-row[0], row[1]))
    if not rows:
        print("Every operator allocated the same bytes in both.")
        return
    print("| operator | A MiB allocated | B MiB allocated | B - A MiB |")
    print("|---|---:|---:|---:|")
    for _, op in rows[:top]:
        print(f"| {op} | {mib(a.by_op[op])} | {mib(b.by_op[op])} | {(b.by_op[op] - a.by_op[op]) / MIB:+.2f} |")


def by_size(a, b, top):
    """The request sizes made a different number of times, most bytes of difference first."""
    count_a, count_b = a.sizes(), b.sizes()
    rows = sorted(((abs(count_b[size] - count_a[size]) * size, size) for size in set(count_a) | set(count_b)
                   if count_a[size] != count_b[size]), key=lambda row: (-row[0], row[1]))
    if not rows:
        print("Both made the same requests, size for size.")
        return
    print("| request | A count | B count | B - A MiB | made by (B, else A) |")
    print("|---:|---:|---:|---:|---|")
    for _, size in rows[:top]:
        print(f"| {size_text(size)} | {count_a[size]} | {count_b[size]} | "
              f"{(count_b[size] - count_a[size]) * size / MIB:+.2f} | {b.op_of.get(size) or a.op_of.get(size, '')} |")


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--top", type=int, default=12, help="rows of each table, events of each stretch (12)")
    parser.add_argument("--min-bytes", type=int, default=0, help="align only the requests of at least this "
                        "many bytes (and frees of allocations from before the step)")
    parser.add_argument("--ignore-ops", action="store_true", help="align on kind and bytes alone, and count "
                        "requests by size instead of by operator (files that name operators differently)")
    args = parser.parse_args(argv)
    a, b = Stream(args.a, args.min_bytes), Stream(args.b, args.min_bytes)
    for name, stream in (("A", a), ("B", b)):
        print(f"{name}: {stream.path}: {stream.events} events, live peak {mib(stream.peak)} MiB above the "
              f"step's start ({mib(stream.peak_without_transients)} MiB without its {stream.transients} "
              "transient requests)")
    print()
    print("| phase | A allocations | A MiB | B allocations | B MiB | B - A MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for phase in PHASES:
        if a.allocations[phase] or b.allocations[phase]:
            print(f"| {phase} | {a.allocations[phase]} | {mib(a.allocated[phase])} | {b.allocations[phase]} | "
                  f"{mib(b.allocated[phase])} | {(b.allocated[phase] - a.allocated[phase]) / MIB:+.2f} |")

    print()
    if args.ignore_ops:
        by_size(a, b, args.top)
    else:
        by_operator(a, b, args.top)

    key = (lambda token: token[:2]) if args.ignore_ops else (lambda token: token)
    matcher = difflib.SequenceMatcher(None, [key(t) for t in a.tokens], [key(t) for t in b.tokens], autojunk=False)
    stretches = [op for op in matcher.get_opcodes() if op[0] != "equal"]
    print()
    aligned = f" of at least {size_text(args.min_bytes)}" if args.min_bytes else ""
    print(f"{len(stretches)} stretches of the events{aligned} differ; "
          f"{sum(i2 - i1 for _, i1, i2, _, _ in stretches)} events of A and "
          f"{sum(j2 - j1 for _, _, _, j1, j2 in stretches)} of B in them"
          + (f" (the first {args.top} stretches below)" if len(stretches) > args.top else ""))
    for tag, i1, i2, j1, j2 in stretches[: args.top]:
        phase = a.phases[i1] if i1 < len(a.phases) else b.phases[j1] if j1 < len(b.phases) else "end"
        print()
        print(f"- {tag}, in {phase}: A events {i1}-{i2 - 1 if i2 > i1 else i1} ({i2 - i1}), "
              f"B events {j1}-{j2 - 1 if j2 > j1 else j1} ({j2 - j1})")
        for side, tokens in (("A", a.tokens[i1:i2]), ("B", b.tokens[j1:j2])):
            for token in tokens[: args.top]:
                print(f"  {side} {token_text(token)}")
            if len(tokens) > args.top:
                print(f"  {side} ... {len(tokens) - args.top} more")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
