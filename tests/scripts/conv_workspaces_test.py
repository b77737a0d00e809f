"""scripts/conv_workspaces.py: cuDNN's bytes beside each convolution's and
batch norm's outputs, window by window.

1. The window arithmetic against a stand-in allocator whose every figure is
   known: a convolution's window that allocates its 1 KiB output and a
   2 KiB workspace it frees has an extra of 2 KiB, and the step's peak
   without extras is the largest of the stretches' peaks and each window's
   peak less its extra.
2. The hooks on a real model on the CPU (no allocator statistics there):
   ResNet-18 exported by examples/export_models.py, rebuilt by
   eager_peaks.py, has 20 convolutions and 20 batch norms, each a forward
   window in module order and a backward window in reverse order.

Usage: conv_workspaces_test.py SOURCE_DIR EXAMPLES_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

import torch

source, examples = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(source, "scripts"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import conv_workspaces  # noqa: E402
from stand_ins import Checks  # noqa: E402

checks = Checks()


class Allocator:
    """torch.cuda's allocated-bytes statistics, as the caching allocator keeps them."""

    def __init__(self, allocated):
        self.allocated = self.peak = allocated

    def alloc(self, nbytes):
        self.allocated += nbytes
        self.peak = max(self.peak, self.allocated)

    def free(self, nbytes):
        self.allocated -= nbytes

    def reset(self):
        self.peak = self.allocated


MiB = 1 << 20
fake = Allocator(4 * MiB)
torch.cuda.memory_allocated = lambda *a: fake.allocated
torch.cuda.max_memory_allocated = lambda *a: fake.peak
torch.cuda.reset_peak_memory_stats = lambda *a: fake.reset()

windows = conv_workspaces.Windows(cuda=True)
fake.alloc(2 * MiB)  # a stretch: 6 MiB at most
fake.free(2 * MiB)
windows.begin({"module": "conv1", "pass": "forward"})  # at 4 MiB
output = torch.empty(MiB - 100, dtype=torch.uint8)  # 1 MiB in the allocator's 512-byte blocks
fake.alloc(MiB)
fake.alloc(2 * MiB)  # the workspace: 7 MiB at most
fake.free(2 * MiB)
windows.end(output)
windows.begin({"module": "bn1", "pass": "backward"})  # at 5 MiB
fake.alloc(MiB)  # its output, nothing beside it: 6 MiB
windows.end((torch.empty(MiB, dtype=torch.uint8), None))
windows.finish()
summary = conv_workspaces.summary(windows)
checks.expect_in("a window's extra: what it held beside its output", "{'module': 'conv1', 'pass': 'forward', "
                 f"'peak_bytes': {7 * MiB}, 'extra_bytes': {2 * MiB}}}", str(windows.records[0]))
checks.expect_in("a window with nothing beside its outputs", "'extra_bytes': 0", str(windows.records[1]))
# Before conv1, between the windows, after bn1.
checks.expect_in("the stretches' peaks", str([6 * MiB, 5 * MiB, 6 * MiB]), str(windows.stretch_peaks))
# Without conv1's workspace the step peaks at 6 MiB (the first stretch, bn1's window).
checks.expect_in("the step's peak, in conv1's window", f"{7 * MiB} {6 * MiB} conv1 conv1",
                 f"{summary['step_peak_bytes']} {summary['step_peak_without_extras_bytes']} "
                 f"{summary['at_peak']['module']} {summary['largest_extra']['module']}")
run = os.path.join(tempfile.mkdtemp(), "resnet50_8.json")
with open(run, "w") as f:
    json.dump(dict(summary, windows=windows.records), f)
checks.expect_in("a run's row in the table", "| resnet50_8 | 7.00 | 6.00 | 1.00 | conv1 forward | "
                 "conv1 forward: 2.00 |", conv_workspaces.table([run]))
checks.expect_in("a run not written", "| missing.json | not read:", conv_workspaces.table([run + "/missing.json"]))
windows.begin({"module": "nested"})
windows.begin({"module": "inside"})
checks.expect_in("a nested window is counted, not measured", "1", str(windows.nested))

done = subprocess.run([sys.executable, os.path.join(source, "scripts", "conv_workspaces.py"),
                       os.path.join(examples, "resnet18.toml"), "--micro-batch", "2", "--device", "cpu"],
                      capture_output=True, text=True)
if done.returncode != 0:
    raise SystemExit(f"FAIL conv_workspaces.py on resnet18.toml: {done.stderr.strip()}")
result = json.loads(done.stdout)
by_pass = {p: [w for w in result["windows"] if w["pass"] == p] for p in ("forward", "backward")}
checks.expect_in("forward windows: 20 convolutions and 20 batch norms", "20 20",
                 f"{sum(w['kind'] == 'Conv2d' for w in by_pass['forward'])} "
                 f"{sum(w['kind'] == 'BatchNorm2d' for w in by_pass['forward'])}")
checks.expect_in("forward in module order", "conv1 bn1 layer1.0.conv1",
                 " ".join(w["module"] for w in by_pass["forward"][:3]))
checks.expect_in("backward in reverse: ResNet-18's last batch norm first", "layer4.1.bn2 layer4.1.conv2",
                 " ".join(w["module"] for w in by_pass["backward"][:2]))
checks.expect_in("every module's backward window", "40", str(len(by_pass["backward"])))
checks.expect_in("a convolution's shapes", "'input': [2, 3, 224, 224], 'weight': [64, 3, 7, 7], 'stride': [2, 2]",
                 str(by_pass["forward"][0]))
checks.expect_in("no bytes on the CPU", "None None", f"{result['step_peak_bytes']} {by_pass['forward'][0]['extra_bytes']}")
sys.exit(checks.exit_status())
