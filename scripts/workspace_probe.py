#!/usr/bin/env python3
"""What PyTorch's CUDA libraries allocate through the caching allocator
beside a step's tensors (issue #46 item 6: cuBLAS and cuBLASLt workspaces),
measured in a fresh process: torch.cuda.memory_allocated() before and after
the first call of each kind of operator, less the bytes of the tensors the
call returns (rounded up to the allocator's 512 bytes). Prints one JSON
object: {"torch", "device", "calls": [{"call", "extra_bytes"}, ...]}.

    workspace_probe.py

The validation (scripts/compare_peaks.py) found oomtune's meta peaks of
the example GPT and the GPT-2 fixture 1.00 MiB under eager PyTorch's in
every phase, from the forward on, on an H200 (2026-11-29); the cuBLAS
workspace (32 MiB on sm90, aten/src/ATen/cuda/CublasHandlePool.cpp) is
already counted there, so this says which call allocates the rest.
"""

import json
import sys

import torch


def rounded(nbytes):
    return (nbytes + 511) // 512 * 512


def tensor_bytes(values):
    """Bytes the caching allocator handed out for these tensors (one, or a
    tuple or list; None and non-tensors skipped), each rounded to its 512-byte
    blocks (c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize)."""
    values = values if isinstance(values, (tuple, list)) else [values]
    # untyped_storage() is PyTorch 2's; 1.13 (the CPU tests') has storage() alone.
    return sum(rounded(getattr(v, "untyped_storage", v.storage)().nbytes()) for v in values if torch.is_tensor(v))


def main():
    if not torch.cuda.is_available():
        print("workspace_probe: no CUDA device", file=sys.stderr)
        return 2
    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    calls = []
    kept = []

    def measure(name, run):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        out = run()
        torch.cuda.synchronize()
        calls.append({"call": name, "extra_bytes": torch.cuda.memory_allocated() - before - tensor_bytes(out)})
        kept.append(out)

    a = torch.randn(64, 256, device=device)
    w = torch.randn(128, 256, device=device, requires_grad=True)
    b = torch.randn(128, device=device, requires_grad=True)
    x3 = torch.randn(8, 64, 256, device=device, requires_grad=True)
    measure("mm fp32 (first cuBLAS call)", lambda: a @ w.detach().t())
    measure("mm fp32 again", lambda: a @ w.detach().t())
    measure("linear 2-D with bias fp32 (addmm: cuBLASLt epilogue)", lambda: torch.nn.functional.linear(a, w.detach(), b.detach()))
    measure("linear 3-D with bias fp32", lambda: torch.nn.functional.linear(x3.detach(), w.detach(), b.detach()))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        measure("linear 3-D with bias bf16 autocast", lambda: torch.nn.functional.linear(x3.detach(), w, b))
    y = torch.nn.functional.linear(x3, w, b)
    measure("backward of linear (autograd's thread: its own handle)",
            lambda: torch.autograd.grad(y.sum(), [x3, w, b]))
    print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(device),
                      "capability": list(torch.cuda.get_device_capability(device)), "calls": calls}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
