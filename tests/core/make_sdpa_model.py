"""Exports the attention test model for tests/core/attention_test.cpp (issue #46).

Needs PyTorch 2 (torch.nn.functional.scaled_dot_product_attention); the PyPI
configuration runs it with OOMTUNE_HF_PYTHON. It mirrors one self-attention
layer as Hugging Face transformers writes it with attn_implementation="sdpa":
a fused qkv projection, heads split with view + transpose, SDPA, the heads
merged with transpose + reshape, an output projection.

  attention_sdpa.pt   x [B, T, C=32], 2 heads of head dim 16; causal, no mask
  attention_sdpa_mask.pt  the same with a boolean mask [T, T] argument
  attention_sdpa_bias.pt  the same with a learned bias [1, H, T, T] as the
                          mask (a parameter [H, 256, 256] cut to T; T5's
                          relative position bias reaches SDPA so)

Usage: make_sdpa_model.py OUT_DIR
"""

import os
import sys

import torch
import torch.nn.functional as F

CHANNELS = 32
HEADS = 2


MAX_LENGTH = 256


class Attention(torch.nn.Module):
    def __init__(self, masked: bool, biased: bool = False):
        super().__init__()
        self.qkv = torch.nn.Linear(CHANNELS, 3 * CHANNELS)
        self.out = torch.nn.Linear(CHANNELS, CHANNELS)
        self.masked = masked
        self.biased = biased
        self.heads = HEADS
        self.bias = torch.nn.Parameter(0.02 * torch.randn(HEADS, MAX_LENGTH, MAX_LENGTH)) if biased else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        h = self.heads
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        bias = self.bias
        if bias is not None:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias[:, :t, :t].unsqueeze(0))
        elif self.masked:
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, t, c))


def main() -> None:
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name, masked, biased in (
        ("attention_sdpa.pt", False, False),
        ("attention_sdpa_mask.pt", True, False),
        ("attention_sdpa_bias.pt", False, True),
    ):
        torch.jit.script(Attention(masked, biased)).save(os.path.join(out, name))


if __name__ == "__main__":
    main()
