"""scripts/capped_eager_table.py: device_check.sh's capped eager runs as a
table, on stand-in runs whose figures are known: a capped run that ran with
two workspaces giving way, 1.5x slower than its free twin after the two
warm-up steps; a capped run that ran out of memory; a run without JSON.
Needs no torch.

Usage: capped_eager_table_test.py SOURCE_DIR
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
PHASES = ("forward", "loss", "backward", "optimizer")


def run(name, status, cap, seconds, reserved_mib, counters, out_of_memory=None):
    with open(os.path.join(work, name + ".status"), "w") as f:
        f.write(f"{status} {cap}\n")
    if seconds is None:
        return
    steps = [{**{p: {"peak_reserved_bytes": reserved_mib * MIB if p == "backward" else MIB} for p in PHASES},
              "seconds": s} for s in seconds]
    result = {"steps": steps, "allocator": counters}
    if out_of_memory:
        result["out_of_memory"] = out_of_memory
    with open(os.path.join(work, name + ".json"), "w") as f:
        json.dump(result, f)


cap = 1700 * MIB
# Warm-up steps 5 s and 4 s are left out: 0.3 s capped against 0.2 s free.
run("resnet50_32_all_fp32_capped", 0, cap, [5.0, 4.0, 0.3, 0.3], 1694, {"num_ooms": 2, "num_alloc_retries": 3})
run("resnet50_32_all_fp32", 0, cap, [5.0, 4.0, 0.2, 0.2], 2024, {"num_ooms": 0, "num_alloc_retries": 0})
run("resnet50_8_all_fp32_capped", 3, 764 * MIB, [1.0], 760, {"num_ooms": 1, "num_alloc_retries": 1},
    {"step": 1, "phase": "backward"})
run("resnet50_8_all_fp32", 124, 764 * MIB, None, 0, None)

table = subprocess.run([sys.executable, f"{source}/scripts/capped_eager_table.py", work], capture_output=True,
                       text=True, check=True).stdout
checks.expect_in("the header", "| case | cap: oomtune's predicted reserved | capped | no cap | capped time / free |",
                 table)
checks.expect_in("a capped run that ran, its workspaces given way",
                 "| resnet50_32_all_fp32 | 1700 MiB | exit 0, 1694 MiB, 2 OOMs caught, 3 flushes, 0.300 s | "
                 "exit 0, 2024 MiB, 0 OOMs caught, 0 flushes, 0.200 s | 1.50 |", table)
checks.expect_in("a capped run out of memory, and a run without a result",
                 "| resnet50_8_all_fp32 | 764 MiB | exit 3, 760 MiB, 1 OOMs caught, 1 flushes, 1.000 s, out of memory "
                 "in step 1's backward | exit 124, no result | - |", table)
sys.exit(checks.exit_status())
