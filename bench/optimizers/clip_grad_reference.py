#!/usr/bin/env python3
"""Python eager PyTorch's allocations in torch.nn.utils.clip_grad_norm_, the
reference for oomtune's gradient clipping (strategies/gradient_clipping.h).

Clips fp32 gradients of 10, 200000 and 300 elements (all ones: norm above
max_norm, so every gradient is scaled) on CPU tensors and reads the
profiler's memory events (torch.profiler, profile_memory=True), each with
the aten operators around it. Prints every event, then the device
allocations: those a GPU run makes on the GPU, less the scratch CUDA's
_foreach_norm kernel adds (the CPU's has none; oomtune allocates it, see
gradient_clipping.h). Left out: Python numbers wrapped as CPU tensors and
their dtype conversions (profiler_events.is_python_number), host memory
when the gradients are on a GPU.

Usage: clip_grad_reference.py [--json]
"""
import argparse
import json
import warnings

import torch
from torch.profiler import ProfilerActivity, profile

from profiler_events import annotated_events, is_python_number

SIZES = (10, 200000, 300)


def run():
    params = [torch.zeros(n, requires_grad=True) for n in SIZES]
    for p in params:
        p.grad = torch.ones_like(p)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        torch.nn.utils.clip_grad_norm_(params, 1.0)  # the total norm dropped at once
    events, _ = annotated_events(prof)
    device, sizes, peak = {}, [], 0
    for _, nbytes, ptr, around in events:
        if nbytes > 0 and not is_python_number(nbytes, around):
            device[ptr] = nbytes
            sizes.append(nbytes)
            peak = max(peak, sum(device.values()))
        elif nbytes < 0:
            device.pop(ptr, None)
    return {"gradient_elements": list(SIZES),
            "clipped": all(bool((p.grad < 1).all()) for p in params),
            "events": [{"bytes": n, "operators": around} for _, n, _, around in events],
            "device_allocation_bytes": sizes,
            "device_bytes_peak": peak,
            "device_bytes_left": sum(device.values())}


def main():
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    out = {"torch": torch.__version__, "run": run()}
    if args.json:
        print(json.dumps(out, indent=1))
        return
    r = out["run"]
    print(f"torch {out['torch']}: clip_grad_norm_(max_norm=1), fp32 gradients of {r['gradient_elements']} elements")
    for e in r["events"]:
        print(f"  {e['bytes']:+6d}  {' > '.join(e['operators'])}")
    sizes = r["device_allocation_bytes"]
    print(f"  device allocations: {len(sizes)}, {sum(sizes)} B {sizes}; at most {r['device_bytes_peak']} B alive "
          f"at once, {r['device_bytes_left']} B left")


if __name__ == "__main__":
    main()
