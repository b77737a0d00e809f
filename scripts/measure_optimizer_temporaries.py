#!/usr/bin/env python3
"""What each torch.optim optimizer's first step allocates, measured on the CPU.

    measure_optimizer_temporaries.py [--json]

For every optimizer of torch.optim (default options, lr 1e-3) and each of
its implementations (foreach=True, foreach=False, fused=True where it has
one), runs one step on parameters of two shapes sets with their gradients
set, under torch.profiler (profile_memory=True), and replays the step's
allocations and frees in order: the states it keeps (bytes alive at the end
of the step, in the parameters' bytes P) and the temporaries above them at
the step's peak: in P for foreach (whole-list temporaries, _foreach_sqrt of
every exp_avg_sq), in the largest parameter's bytes L for foreach=False
(one parameter at a time). The table in diagnose/optimizer_kind.cpp is
these figures; a figure that differs between the two shape sets (Rprop's
sign masks depend on the data) is printed as "varies" and not modelled.
The foreach kernels run their CPU fallback here, which allocates the same
outputs as CUDA's (one tensor per input).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # record_cpu_snapshot

SHAPES = ([(256, 1024), (1024,), (512, 512), (64,)], [(300, 700), (4096,), (128, 128), (7,)])


def step_bytes(cls, implementation, shapes, options):
    """(P, L, states, peak) in bytes for one first step; None where the implementation is refused."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from record_cpu_snapshot import allocations  # the profiler's allocations and frees, in order
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(*s)) for s in shapes]
    for p in params:
        p.grad = torch.randn_like(p)
    args = dict(lr=1e-3, **options)
    if implementation == "fused":
        args["fused"] = True
    else:
        args["foreach"] = implementation == "foreach"
    try:
        opt = cls(params, **args)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            opt.step()
    except (RuntimeError, TypeError, ValueError):
        return None
    live = peak = 0
    for _, size, _, _ in allocations(prof):
        live += size
        peak = max(peak, live)
    sizes = [p.numel() * p.element_size() for p in params]
    return sum(sizes), max(sizes), live, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="one JSON object instead of a table")
    args = parser.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    torch.set_num_threads(1)
    optim = torch.optim
    optimizers = [("Adam", optim.Adam, {}), ("AdamW", optim.AdamW, {}), ("NAdam", optim.NAdam, {}),
                  ("RAdam", optim.RAdam, {}), ("Adamax", optim.Adamax, {}), ("Adadelta", optim.Adadelta, {}),
                  ("Rprop", optim.Rprop, {}), ("RMSprop", optim.RMSprop, {}), ("SGD", optim.SGD, {"momentum": 0.9}),
                  ("ASGD", optim.ASGD, {}), ("Adagrad", optim.Adagrad, {})]
    results = {}
    for name, cls, options in optimizers:
        for implementation in ("foreach", "single_tensor", "fused"):
            figures = []
            for shapes in SHAPES:
                measured = step_bytes(cls, "foreach" if implementation == "foreach" else
                                      "fused" if implementation == "fused" else "single", shapes, options)
                if measured is None:
                    break
                p, largest, states, peak = measured
                unit = p if implementation == "foreach" else largest
                figures.append((round(states / p, 1), round((peak - states) / unit, 1)))
            if len(figures) != len(SHAPES):
                continue
            states = figures[0][0] if all(f[0] == figures[0][0] for f in figures) else "varies"
            temporaries = figures[0][1] if all(f[1] == figures[0][1] for f in figures) else "varies"
            results[f"{name} {implementation}"] = {"states_per_parameter": states, "temporaries": temporaries,
                                                   "temporaries_unit": "P" if implementation == "foreach" else "L"}
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        print(f"torch {torch.__version__}: states in the parameters' bytes P; temporaries above them at the peak, "
              f"in P (foreach) or in the largest parameter's bytes L")
        for key, r in results.items():
            print(f"  {key:24s} states {r['states_per_parameter']}  temporaries {r['temporaries']} "
                  f"{r['temporaries_unit']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
