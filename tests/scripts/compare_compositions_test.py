"""scripts/compare_compositions.py: two hand-made probe JSONs whose peak
compositions differ by known groups give those groups, largest difference
first, and an unreadable file one line and exit 2. Needs no torch.

Usage: compare_compositions_test.py SOURCE_DIR
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
MIB = 1024 * 1024


def probe(name, live, shares):
    path = os.path.join(work, name)
    rows = [dict(op=op, phase=phase, earlier_step=earlier, bytes=mib * MIB, blocks=blocks)
            for op, phase, earlier, mib, blocks in shares]
    with open(path, "w") as f:
        json.dump(dict(report=dict(peak_composition=dict(phase="backward", live_bytes=live * MIB, shares=rows))), f)
    return path


# B (the GPU) holds 98 MiB more of the recomputed conv's outputs and 24 MiB of
# a batch norm A never kept at its peak; the loaded model is equal in both.
a = probe("meta.json", 300, [("(unknown)", "load", True, 100, 320),
                             ("checkpoint recomputation > aten::conv2d", "backward", False, 200, 3)])
b = probe("cuda.json", 422, [("(unknown)", "load", True, 100, 320),
                             ("checkpoint recomputation > aten::conv2d", "backward", False, 298, 4),
                             ("checkpoint recomputation > aten::batch_norm", "backward", False, 24, 1)])
script = os.path.join(source, "scripts", "compare_compositions.py")
run = subprocess.run([sys.executable, script, a, b], capture_output=True, text=True)
checks.expect_in("exit 0", "exit 0", f"exit {run.returncode}")
checks.expect_in("the totals", "B - A: +122.00 MiB", run.stdout)
checks.expect_in("the largest difference first",
                 "| checkpoint recomputation > aten::conv2d | backward | 200.00 (3) | 298.00 (4) | +98.00 |\n"
                 "| checkpoint recomputation > aten::batch_norm | backward | 0.00 (0) | 24.00 (1) | +24.00 |",
                 run.stdout)
checks.expect_in("equal groups left out", "no (unknown) row",
                 run.stdout if "(unknown)" in run.stdout else "no (unknown) row")
bad = os.path.join(work, "bad.json")
with open(bad, "w") as f:
    f.write("{}")
run = subprocess.run([sys.executable, script, a, bad], capture_output=True, text=True)
checks.expect_in("a file without a composition: exit 2 and one line", "2 1",
                 f"{run.returncode} {len(run.stderr.strip().splitlines())}")
checks.expect_in("the line names the file", f"{bad}: not an oomtune probe --json", run.stderr)
sys.exit(checks.exit_status())
