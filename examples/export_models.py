#!/usr/bin/env python3
"""Export the bundled example models as TorchScript files for oomtune.

Run with Debian's Python (`/usr/bin/python3`, packages python3-torch and
python3-torchvision). Writes, into examples/models/ (or --out):

  gpt.pt        a small GPT written below (scripted: the blocks stay a
                ModuleList, so each block call is a prim::CallMethod that
                activation checkpointing can rewrite); sequences up to
                --gpt-seq (64) tokens
  gpt_seq.pt    the same GPT with a position table and causal mask of
                --gpt-seq-max (1024) tokens: any length up to it (its
                job, gpt_seq.toml, names "seq"; docs/sequence_length.md)
  resnet18.pt   torchvision ResNet-18 (scripted)
  resnet50.pt   torchvision ResNet-50 (scripted)

Model files are generated, never committed. The job TOMLs next to this script
(gpt.toml, gpt_seq.toml, resnet18.toml, resnet50.toml) refer to them.
"""

import argparse
import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, max_len: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        # A buffer, not torch.ones(..., device=x.device) in forward: a tensor
        # made in forward bakes its device into a trace (see issue #10).
        mask = torch.tril(torch.ones(max_len, max_len)).view(1, 1, max_len, max_len)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.qkv(x).split(C, dim=2)
        hd = C // self.n_heads
        q = q.view(B, T, self.n_heads, hd).transpose(1, 2)
        k = k.view(B, T, self.n_heads, hd).transpose(1, 2)
        v = v.view(B, T, self.n_heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.proj(y)


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)); x + mlp(ln(x))."""

    def __init__(self, d_model: int, n_heads: int, max_len: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads, max_len, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model), nn.Dropout(dropout)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int, d_model: int, n_layers: int, n_heads: int, max_len: int, dropout: float):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList([Block(d_model, n_heads, max_len, dropout) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.register_buffer("positions", torch.arange(max_len), persistent=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        T = input_ids.size(1)
        x = self.drop(self.tok_emb(input_ids) + self.pos_emb(self.positions[:T]))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def export_gpt(path: str, vocab: int, d_model: int, n_layers: int, n_heads: int, seq: int, dropout: float):
    torch.manual_seed(0)
    model = GPT(vocab, d_model, n_layers, n_heads, seq, dropout)
    torch.jit.script(model).save(path)
    return sum(p.numel() for p in model.parameters())


def export_resnet(path: str, depth: int, num_classes: int):
    import torchvision

    torch.manual_seed(0)
    model = getattr(torchvision.models, f"resnet{depth}")(num_classes=num_classes)
    torch.jit.script(model).save(path)
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(here, "models"), help="output folder")
    parser.add_argument("--only", choices=["gpt", "gpt_seq", "resnet18", "resnet50"], action="append",
                        help="export only these (repeatable)")
    parser.add_argument("--if-missing", action="store_true", help="skip models whose file exists")
    parser.add_argument("--gpt-layers", type=int, default=4)
    parser.add_argument("--gpt-dim", type=int, default=128)
    parser.add_argument("--gpt-heads", type=int, default=4)
    parser.add_argument("--gpt-seq", type=int, default=64)
    parser.add_argument("--gpt-seq-max", type=int, default=1024,
                        help="gpt_seq.pt: the longest sequence its position table and mask hold")
    parser.add_argument("--gpt-vocab", type=int, default=1000)
    parser.add_argument("--gpt-dropout", type=float, default=0.1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    wanted = set(args.only or ["gpt", "gpt_seq", "resnet18", "resnet50"])
    if args.if_missing:
        wanted = {name for name in wanted if not os.path.exists(os.path.join(args.out, f"{name}.pt"))}
    if "gpt" in wanted:
        n = export_gpt(os.path.join(args.out, "gpt.pt"), args.gpt_vocab, args.gpt_dim, args.gpt_layers,
                       args.gpt_heads, args.gpt_seq, args.gpt_dropout)
        print(f"gpt.pt: {n} parameters", file=sys.stderr)
    if "gpt_seq" in wanted:
        n = export_gpt(os.path.join(args.out, "gpt_seq.pt"), args.gpt_vocab, args.gpt_dim, args.gpt_layers,
                       args.gpt_heads, args.gpt_seq_max, args.gpt_dropout)
        print(f"gpt_seq.pt: {n} parameters", file=sys.stderr)
    for depth in (18, 50):
        if f"resnet{depth}" in wanted:
            n = export_resnet(os.path.join(args.out, f"resnet{depth}.pt"), depth, 1000)
            print(f"resnet{depth}.pt: {n} parameters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
