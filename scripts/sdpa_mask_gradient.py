"""What PyTorch does on this GPU with a learned attention bias (a float
attn_mask that requires grad, as T5's relative position bias) in
scaled_dot_product_attention: which kernel runs, whether it raises, and
whether its backward makes the mask's gradient at the broadcast size
[B, H, T, round16(S)] as oomtune counts it (Note [Mask gradients] in
probes/attention_model.cpp, read from PyTorch 2.11's sources and its meta
registrations, not yet run on a GPU).

One line a case, as Markdown table rows: the kernel (the autograd node
behind the output), the error if it raised, and whether the allocator's
trace of the backward holds a block of the broadcast gradient's size.
Needs a CUDA device; runs in seconds.

Usage: sdpa_mask_gradient.py
"""

import sys

import torch
import torch.nn.functional as F

B, H, T, E = 4, 8, 1024, 64


def kernel_of(output: torch.Tensor) -> str:
    """The SDPA autograd node behind `output` (math shows as its matmuls)."""
    node, seen = output.grad_fn, 0
    while node is not None and seen < 8:
        name = type(node).__name__
        if "ScaledDotProduct" in name:
            return name.replace("ScaledDotProduct", "").replace("AttentionBackward0", "")
        if name.startswith("Bmm") or name.startswith("UnsafeView"):
            return "math"
        node = node.next_functions[0][0] if node.next_functions else None
        seen += 1
    return "?"


def block_bytes(requested: int) -> int:
    """The caching allocator's block size for a request (512-byte rounding)."""
    return (requested + 511) // 512 * 512


def case(dtype: torch.dtype, key_length: int, cudnn: bool) -> str:
    torch.backends.cuda.enable_cudnn_sdp(cudnn)
    element = torch.finfo(dtype).bits // 8
    q = torch.randn(B, H, T, E, device="cuda", dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, key_length, E, device="cuda", dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, key_length, E, device="cuda", dtype=dtype, requires_grad=True)
    bias = (0.02 * torch.randn(1, H, T, key_length, device="cuda", dtype=dtype)).requires_grad_()
    label = f"| {str(dtype).replace('torch.', '')} | {key_length} | {'on' if cudnn else 'off'} |"
    try:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    except RuntimeError as error:
        return f"{label} - | raised in forward: {str(error).splitlines()[0][:160]} | - |"
    kernel = kernel_of(out)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    try:
        out.backward(torch.randn_like(out))
    except RuntimeError as error:
        torch.cuda.memory._record_memory_history(enabled=None)
        return f"{label} {kernel} | raised in backward: {str(error).splitlines()[0][:160]} | - |"
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    broadcast = B * H * T * ((key_length + 15) // 16 * 16) * element
    sizes = [e["size"] for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    found = block_bytes(broadcast) in sizes
    largest = max(sizes) if sizes else 0
    grad = "defined" if bias.grad is not None else "None"
    return (f"{label} {kernel} | bias.grad {grad}; largest backward block {largest} B |"
            f" {broadcast} B: {'found' if found else 'not found'} |")


def main() -> int:
    if not torch.cuda.is_available():
        print("sdpa_mask_gradient.py: no CUDA device", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()};"
          f" B={B} H={H} T={T} E={E}, bias [1, H, T, S] requiring grad")
    print()
    print("| dtype | S | cuDNN SDPA | kernel | outcome | broadcast gradient [B, H, T, round16(S)] |")
    print("|---|---|---|---|---|---|")
    for dtype, key_length, cudnn in ((torch.float32, 1000, True), (torch.bfloat16, 1024, True),
                                     (torch.bfloat16, 1024, False), (torch.bfloat16, 1000, False)):
        print(case(dtype, key_length, cudnn), flush=True)
        torch.cuda.empty_cache()
    torch.backends.cuda.enable_cudnn_sdp(True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
