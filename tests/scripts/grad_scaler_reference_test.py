#!/usr/bin/env python3
"""GradScaler's device scalars in the installed torch 2.x, as
bench/optimizers/grad_scaler_reference.py reads them from eager PyTorch's
CPU allocations, against what oomtune's DynamicLossScaler allocates
(strategies/mixed_precision.h; the same figures, from the meta device, in
tests/core/meta_device_test.cpp, MetaDevice.Fp16*). A torch upgrade that
changes GradScaler's allocations fails here.

    grad_scaler_reference_test.py SOURCE_DIR
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_reference import run_reference  # noqa: E402

measured = {r["implementation"]: r for r in run_reference(sys.argv[1], "grad_scaler_reference.py")["runs"]}

# unscale_: the scale in fp64, its reciprocal, the fp32 inverse, found_inf,
# and _MultiDeviceReplicator's copies of found_inf and the inverse; the copy
# of found_inf alive through the step. Fused: _check_inf_per_device's 1 and
# found_inf, their copies, then sum()'s found_inf and the scale times 1,
# handed to the optimizer. Fused after an explicit unscale_ (gradient
# clipping): unscale_'s six, then sum()'s found_inf alone (no scale: the
# gradients are unscaled). All peak at 16 B: the fp64 pair, or the four
# scalars of the check.
expected = {"foreach": ([8, 8, 4, 4, 4, 4], 16, 4), "fused": ([4, 4, 4, 4, 4, 4], 16, 12),
            "fused after unscale_": ([8, 8, 4, 4, 4, 4, 4], 16, 8)}
failures = []
for implementation, (sizes, peak, alive) in expected.items():
    got = measured[implementation]
    if (got["device_allocation_bytes"], got["device_bytes_peak"], got["device_bytes_alive_at_optimizer_step"]) != (
            sizes, peak, alive):
        failures.append(f"{implementation}: allocations {got['device_allocation_bytes']}, "
                        f"{got['device_bytes_peak']} B at most, {got['device_bytes_alive_at_optimizer_step']} B "
                        f"alive at the step; DynamicLossScaler makes {sizes}, {peak} B at most, {alive} B alive")
for failure in failures:
    print("FAIL:", failure)
if not failures:
    print("GradScaler allocates what DynamicLossScaler does:", expected)
sys.exit(1 if failures else 0)
