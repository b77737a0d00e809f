#!/usr/bin/env python3
"""torch.nn.utils.clip_grad_norm_'s device allocations in the installed
torch 2.x, as bench/optimizers/clip_grad_reference.py reads them from eager
PyTorch's CPU allocations, against what oomtune's clip_grad_norm_ allocates
without CUDA's foreach-norm scratch (strategies/gradient_clipping.h; the
same sequence in tests/strategies/gradient_clipping_test.cpp, with
ClipPlacement::kHost). A torch upgrade that changes them fails here.

    clip_grad_reference_test.py SOURCE_DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_reference import run_reference  # noqa: E402

got = run_reference(sys.argv[1], "clip_grad_reference.py")["run"]

# Three fp32 gradients: a norm each (4 B), their stack (12 B), the total
# (4 B); then `total + 1e-6`, its reciprocal, that times max_norm, the
# clamp. At most the norms, the stack and the total alive (28 B); nothing
# left once the total is dropped.
expected = {"device_allocation_bytes": [4, 4, 4, 12, 4, 4, 4, 4, 4], "device_bytes_peak": 28,
            "device_bytes_left": 0, "clipped": True}
failures = [f"{key}: eager PyTorch {got[key]}, oomtune {value}" for key, value in expected.items() if got[key] != value]
for failure in failures:
    print("FAIL:", failure)
if not failures:
    print("clip_grad_norm_ allocates what oomtune's does (less CUDA's scratch):", expected)
sys.exit(1 if failures else 0)
