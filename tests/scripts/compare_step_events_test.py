"""scripts/compare_step_events.py: where two recordings of a step allocate
differently. Two step-events files made here, whose differences are known by
construction: B allocates its 2 MiB backward gradient sum out of place where
A adds it in place (meta against CUDA), and runs a 30 MiB request before a
free that A makes first. Needs no torch.

Usage: compare_step_events_test.py SOURCE_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

from stand_ins import Checks

source = sys.argv[1]
work = tempfile.mkdtemp()
checks = Checks()
MIB = 1 << 20


def write(name, events):
    path = os.path.join(work, name)
    with open(path, "w") as f:
        json.dump({"format": "oomtune step events", "version": 1, "columns": ["kind", "id", "bytes", "phase", "op"],
                   "events": events}, f)
    return path


common = [["free", 7, 0, "forward", ""],  # the previous step's batch: not in the file
          ["alloc", 1, 8 * MIB, "forward", "aten::mm"],
          ["alloc", 2, 512, "forward", "aten::add"]]
a = write("a.json", common + [
    ["free", 2, 0, "forward", ""],
    ["alloc", 3, 30 * MIB, "loss", "aten::log_softmax"],
    ["free", 3, 0, "backward", ""],
    ["free", 1, 0, "backward", ""]])
b = write("b.json", common + [
    ["alloc", 3, 30 * MIB, "loss", "aten::log_softmax"],
    ["free", 2, 0, "loss", ""],
    ["alloc", 4, 2 * MIB, "backward", "MulBackward0 > gradient sum"],
    ["free", 4, 0, "backward", ""],
    ["free", 3, 0, "backward", ""],
    ["free", 1, 0, "backward", ""]])


def compare(*args, status=0):
    done = subprocess.run([sys.executable, f"{source}/scripts/compare_step_events.py", *args],
                          capture_output=True, text=True)
    if done.returncode != status:
        raise SystemExit(f"FAIL compare_step_events.py {args}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout + done.stderr


out = compare(a, b)
# A: 8 MiB + 512 B, then 512 B freed, then 30 MiB: 38 MiB at most. B: 8 MiB + 512 B + 30 MiB, the 512 B
# freed, then the 2 MiB sum while both are live: 40 MiB.
checks.expect_in("A's live peak", f"A: {a}: 7 events, live peak 38.00 MiB above the step's start", out)
checks.expect_in("B's live peak", f"B: {b}: 9 events, live peak 40.00 MiB above the step's start", out)
# A's 512 B request is freed before the 30 MiB one: transient; B's is not (the 30 MiB request comes
# first), and neither's last request is.
checks.expect_in("A without its transient requests", "(38.00 MiB without its 1 transient requests)", out)
checks.expect_in("B without its transient requests", "(40.00 MiB without its 0 transient requests)", out)
# A 16 MiB workspace between two tensors: the step peaks at 24 MiB with it, 12 without.
workspace = write("workspace.json", [["alloc", 1, 8 * MIB, "forward", "aten::conv2d"],
                                     ["alloc", 2, 16 * MIB, "forward", "aten::conv2d"],
                                     ["free", 2, 0, "forward", ""],
                                     ["alloc", 3, 4 * MIB, "forward", "aten::batch_norm"],
                                     ["free", 3, 0, "backward", ""],
                                     ["free", 1, 0, "backward", ""]])
checks.expect_in("a workspace is transient", "live peak 24.00 MiB above the step's start (12.00 MiB without its 1 "
                 "transient requests)", compare(workspace, a))
checks.expect_in("a phase row", "| backward | 0 | 0.00 | 1 | 2.00 | +2.00 |", out)
checks.expect_in("the operator that differs", "| MulBackward0 > gradient sum | 0.00 | 2.00 | +2.00 |", out)
checks.expect_in("an operator alike in both is not listed", "False", str("| aten::mm |" in out))
# The shortest alignment: B's 30 MiB request comes before the 512 B free (an insertion there), and
# where A makes it, B sums the gradient.
checks.expect_in("the stretches", "2 stretches of the events differ; 1 events of A and 3 of B in them", out)
checks.expect_in("the 30 MiB request before the free", "- insert, in forward: A events 3-3 (0), B events 3-3 (1)\n"
                 "  B alloc 30.00 MiB aten::log_softmax\n", out)
checks.expect_in("the gradient sum, in B alone", "- replace, in loss: A events 4-4 (1), B events 5-6 (2)\n"
                 "  A alloc 30.00 MiB aten::log_softmax\n"
                 "  B alloc 2.00 MiB MulBackward0 > gradient sum\n"
                 "  B free 2.00 MiB\n", out)
checks.expect_in("a free of an allocation before the step", "  A free before the step",
                 compare(a, write("none.json", []), "--min-bytes", "0"))
large = compare(a, b, "--min-bytes", str(MIB + 1))
checks.expect_in("--min-bytes: the large pool's requests alone", "1 stretches of the events of at least 1.00 MiB "
                 "differ; 0 events of A and 2 of B in them", large)
# --ignore-ops: A's requests under other names (eager PyTorch's Python lines) align with A's own.
renamed = write("renamed.json", [[kind, ident, size, phase, f"model.py:{i} forward" if kind == "alloc" else ""]
                                 for i, (kind, ident, size, phase, _) in enumerate(common + [
                                     ["free", 2, 0, "forward", ""],
                                     ["alloc", 3, 30 * MIB, "loss", "aten::log_softmax"],
                                     ["free", 3, 0, "backward", ""],
                                     ["free", 1, 0, "backward", ""]])])
same = compare(a, renamed, "--ignore-ops")
checks.expect_in("--ignore-ops: the same requests under other names", "Both made the same requests, size for size.",
                 same)
checks.expect_in("--ignore-ops: nothing to align", "0 stretches of the events differ", same)
checks.expect_in("without it, every request differs", "2 stretches of the events differ; 3 events of A and 3 of B",
                 compare(a, renamed))
checks.expect_in("--ignore-ops: the sizes made more often", "| 2.00 MiB | 0 | 1 | +2.00 | MulBackward0 > gradient sum |",
                 compare(a, b, "--ignore-ops"))
checks.expect_in("not a step-events file", "compare_step_events: /dev/null: not an oomtune step-events file",
                 compare(a, "/dev/null", status=2))
bad = write("bad.json", [["alloc", 1, 5, "forward"]])
checks.expect_in("an event of four fields", f"{bad}: not an oomtune step-events file (an event is not",
                 compare(bad, b, status=2))
text = write("text.json", [["alloc", 1, "5", "forward", ""]])
checks.expect_in("bytes that are not a number", f"{text}: not an oomtune step-events file (an event is not",
                 compare(text, b, status=2))
sys.exit(checks.exit_status())
