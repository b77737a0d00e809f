#!/usr/bin/env python3
"""Python eager PyTorch's optimizer-step allocations, the reference for
oomtune's EagerAdamW and EagerSgd (strategies/eager_adamw.h, eager_sgd.h).

Runs torch.optim.AdamW / SGD in each implementation (foreach=True,
fused=True, foreach=False) on CPU tensors and counts the CPU allocator's
bytes with the profiler's memory events (torch.profiler, profile_memory=True:
one event per allocation and free, with its signed size; read in time order
from prof.profiler.kineto_results), as the CUDA caching allocator would see
the same storages, one-element tensors apart (SCALAR_BYTES). Prints, per
implementation and step, the peak of live bytes above the live bytes at the
step's start, and the bytes the step left alive (the state it created).

Usage: python_reference.py [--sizes 1000,300,5000] [--json]
"""
import argparse
import json
import warnings

import torch
from torch.profiler import ProfilerActivity, profile


# One-element tensors (0-dim float32 or float64: 4 or 8 bytes): on a GPU
# machine the Python scalars wrapped for an op and the step counts of
# foreach and single_tensor are CPU tensors, host memory; the parameters
# here are all larger. Counted apart.
SCALAR_BYTES = 8


def step_bytes(opt):
    """(peak above start, end minus start, scalar bytes allocated) of one
    opt.step(), in bytes, from the profiler's memory events in time order."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        opt.step()
    events = [(e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    live = peak = scalars = 0
    for _, nbytes in sorted(events):
        if abs(nbytes) <= SCALAR_BYTES:
            scalars += max(nbytes, 0)
            continue
        live += nbytes
        peak = max(peak, live)
    return peak, live, scalars


def run(kind, implementation, sizes, weight_decay, momentum, steps):
    torch.manual_seed(0)
    params = [torch.randn(n, requires_grad=True) for n in sizes]
    kwargs = {"foreach": {"foreach": True}, "fused": {"fused": True}, "single_tensor": {"foreach": False}}[implementation]
    if kind == "adamw":
        opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=weight_decay, **kwargs)
    else:
        opt = torch.optim.SGD(params, lr=1e-2, momentum=momentum, weight_decay=weight_decay, **kwargs)
    rows = []
    for step in range(1, steps + 1):
        for p in params:
            p.grad = torch.randn_like(p)
        peak, left, scalars = step_bytes(opt)
        rows.append({"step": step, "peak_above_start_bytes": peak, "left_alive_bytes": left,
                     "scalar_bytes": scalars})
    return rows


def main():
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,300,5000,20,1200", help="parameter element counts (fp32); default: the sizes of tests/strategies/eager_optimizers_test.cpp")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    out = {"torch": torch.__version__, "sizes": sizes, "runs": []}
    for kind, weight_decay, momentum in (("adamw", 0.01, 0.0), ("sgd", 0.0, 0.9), ("sgd", 0.01, 0.9)):
        for implementation in ("foreach", "fused", "single_tensor"):
            rows = run(kind, implementation, sizes, weight_decay, momentum, args.steps)
            out["runs"].append({"optimizer": kind, "weight_decay": weight_decay, "momentum": momentum,
                                "implementation": implementation, "steps": rows})
    if args.json:
        print(json.dumps(out, indent=1))
        return
    print(f"torch {out['torch']}, fp32 parameters of {sizes} elements ({4 * sum(sizes)} bytes)")
    for r in out["runs"]:
        cells = ", ".join(f"step {s['step']}: peak +{s['peak_above_start_bytes']} B, left +{s['left_alive_bytes']} B "
                          f"({s['scalar_bytes']} B in scalars)"
                          for s in r["steps"])
        print(f"{r['optimizer']:5} wd={r['weight_decay']:<4} momentum={r['momentum']:<3} {r['implementation']:13} {cells}")


if __name__ == "__main__":
    main()
