"""scripts/eager_peaks.py's cap_allocator (used by accelerate_batch_size.py
too) must give torch.cuda.set_per_process_memory_fraction a device it
accepts: a torch.device("cuda") without an index raises ValueError in
PyTorch 2.11, which stopped every capped eager run and every Accelerate
search on an H200 (2026-11-29). No GPU is needed: the device's properties
are stood in for, and the fraction goes through PyTorch's own device check
(torch.cuda._utils._get_device_index) instead of the allocator.

Usage: cuda_cap_test.py SOURCE_DIR
"""

import sys
import types

sys.path.insert(0, f"{sys.argv[1]}/scripts")
import torch  # noqa: E402
from torch.cuda._utils import _get_device_index  # noqa: E402

import eager_peaks  # noqa: E402

total = 80 << 30
calls = []
torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(total_memory=total)
torch.cuda.current_device = lambda: 0


def set_fraction(fraction, device=None):
    calls.append((fraction, _get_device_index(device)))  # raises as PyTorch would


torch.cuda.set_per_process_memory_fraction = set_fraction
for device in (torch.device("cuda"), torch.device("cuda", 0)):
    eager_peaks.cap_allocator(device, 8 << 30)
expected = [(0.1, 0), (0.1, 0)]
if calls != expected:
    raise SystemExit(f"FAIL: set_per_process_memory_fraction got {calls}, expected {expected}")
print("cap_allocator passes PyTorch's device check: ok")
