#!/usr/bin/env python3
"""Python eager PyTorch's allocations in GradScaler.step and update, the
reference for oomtune's DynamicLossScaler (strategies/mixed_precision.h).

Runs torch.amp.GradScaler with torch.optim.AdamW (foreach=True and
fused=True; fused optimizers take the scale instead of unscaled gradients;
and fused after an explicit scaler.unscale_, as a loop that clips does)
on CPU tensors and reads the profiler's memory events of the second
`[scaler.unscale_(opt);] scaler.step(opt); scaler.update()` (torch.profiler, profile_memory=True),
each with the aten operators around it. Prints every event, then the
scaler's device scalars: the allocations a GPU run makes on the GPU. Left
out of those: the optimizer's own (python_reference.py has them), and the
Python numbers wrapped as CPU tensors with their dtype conversions (an
8-byte allocation outside any operator; an aten::to inside aten::add or
aten::mul), which stay in host memory when the other operand is on a GPU.

Usage: grad_scaler_reference.py [--json]
"""
import argparse
import json
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from profiler_events import annotated_events, is_python_number


def is_scaler_device_allocation(nbytes, around):
    if nbytes <= 0 or any(name.startswith("Optimizer.step") for name in around):
        return False
    return not is_python_number(nbytes, around)


def run(implementation, unscale_first=False):
    """`unscale_first`: scaler.unscale_(opt) before scaler.step(opt), as a
    loop that clips gradients does (torch.amp: "Working with unscaled
    gradients")."""
    torch.manual_seed(0)
    params = [torch.randn(n, requires_grad=True) for n in (1000, 300)]
    opt = torch.optim.AdamW(params, lr=1e-3, **{implementation: True})
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(2):  # the second step: AdamW's state exists
        scaler.scale(sum((p * p).sum() for p in params)).backward()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            if unscale_first:
                scaler.unscale_(opt)
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)
    events, step_starts = annotated_events(prof)
    step_start = min(step_starts)
    device = {}  # address: bytes of the scaler's device scalars alive
    sizes, alive_at_step, peak = [], None, 0
    for t, nbytes, ptr, around in events:
        if alive_at_step is None and t >= step_start:
            alive_at_step = sum(device.values())
        if is_scaler_device_allocation(nbytes, around):
            device[ptr] = nbytes
            sizes.append(nbytes)
            peak = max(peak, sum(device.values()))
        elif nbytes < 0:
            device.pop(ptr, None)
    return {"implementation": implementation + (" after unscale_" if unscale_first else ""),
            "events": [{"bytes": n, "operators": around} for _, n, _, around in events],
            "device_allocation_bytes": sizes,
            "device_bytes_alive_at_optimizer_step": alive_at_step,
            "device_bytes_peak": peak}


def main():
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"torch": torch.__version__, "runs": [run("foreach"), run("fused"), run("fused", unscale_first=True)]}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"torch {out['torch']}: GradScaler.step + update, AdamW, fp32 parameters of 1000 and 300 elements")
    for r in out["runs"]:
        print(f"== {r['implementation']}")
        for e in r["events"]:
            print(f"  {e['bytes']:+6d}  {' > '.join(e['operators'])}")
        sizes = r["device_allocation_bytes"]
        print(f"  GradScaler's device scalars: {len(sizes)} allocations, {sum(sizes)} B {sizes}; "
              f"at most {r['device_bytes_peak']} B alive at once, "
              f"{r['device_bytes_alive_at_optimizer_step']} B when the optimizer's step begins")


if __name__ == "__main__":
    main()
