"""scripts/eager_step_events.py: an eager step's CUDA allocator trace as
oomtune's step-events file. A trace made here, as
torch.cuda.memory._snapshot()["device_traces"] holds one (c10/cuda/
CUDACachingAllocator.cpp TraceEntry), with the phases' ends marked: each
alloc and free_completed becomes an event of the phase it falls in, named by
its innermost frame outside the torch package; segment and free_requested
entries are left out; and scripts/compare_step_events.py reads the file.
Needs no torch.

Usage: eager_step_events_test.py SOURCE_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

source = sys.argv[1]
sys.path.insert(0, os.path.join(source, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_step_events  # noqa: E402
from stand_ins import Checks  # noqa: E402

checks = Checks()
work = tempfile.mkdtemp()
torch_dir = "/venv/lib/python3.12/site-packages/torch"
# The model's own line under a folder named torch (issue #48's case) is not torch's package.
model_frame = {"filename": "/home/me/torch/model.py", "line": 41, "name": "forward"}
torch_frame = {"filename": f"{torch_dir}/nn/functional.py", "line": 2000, "name": "linear"}
trace = [
    {"action": "segment_alloc", "addr": 1 << 30, "size": 20 << 20},
    {"action": "alloc", "addr": 100, "size": 4 << 20, "frames": [torch_frame, model_frame]},  # forward
    {"action": "alloc", "addr": 200, "size": 512, "frames": []},
    {"action": "free_requested", "addr": 200, "size": 512},
    {"action": "free_completed", "addr": 200, "size": 512},  # loss (the mark below)
    {"action": "alloc", "addr": 200, "size": 1024, "frames": [torch_frame]},  # backward: the address again
    {"action": "free_completed", "addr": 100, "size": 4 << 20},
    {"action": "free_completed", "addr": 200, "size": 1024},  # optimizer
]
marks = [("forward", 4), ("loss", 5), ("backward", 7), ("optimizer", 8)]
events = eager_step_events.step_events(trace, marks, torch_dir)
checks.expect_in("the events, their phases and names", str([
    ["alloc", 100, 4 << 20, "forward", "model.py:41 forward"],
    ["alloc", 200, 512, "forward", ""],
    ["free", 200, 0, "loss", ""],
    ["alloc", 200, 1024, "backward", ""],
    ["free", 100, 0, "backward", ""],
    ["free", 200, 0, "optimizer", ""]]), str(events))
# A loss phase that made no event: the free after forward's end is backward's.
checks.expect_in("a phase without events", "['free', 200, 0, 'backward', '']",
                 str(eager_step_events.step_events(trace, [("forward", 4), ("loss", 4), ("backward", 8)], torch_dir)[2]))

path = os.path.join(work, "eager.json")
eager_step_events.write(path, trace, marks, torch_dir)
with open(path) as f:
    checks.expect_in("the step-events format", "'format': 'oomtune step events', 'version': 1", str(json.load(f)))
done = subprocess.run([sys.executable, os.path.join(source, "scripts", "compare_step_events.py"), path, path,
                       "--ignore-ops"], capture_output=True, text=True)
checks.expect_in("compare_step_events.py reads it: 4 MiB + 1 KiB live at most", "6 events, live peak 4.00 MiB",
                 done.stdout + done.stderr)
sys.exit(checks.exit_status())
