#!/usr/bin/env python3
"""Small TorchScript models with known memory, for oomtune's core tests.

Writes into the folder given as the first argument:
  mlp.pt         3 Linear layers 256 -> 512 -> 512 -> 10 (P known exactly)
  bigmatmul.pt   x [B, 256] @ W [256, 8192]: the forward's largest
                 allocation is the matmul output, B * 8192 * 4 bytes; the
                 backward's is W's gradient, 8 MiB
  dict_out.pt    returns {"logits": [B, 10], "hidden": [B, 32]}
  tuple_out.pt   returns (logits [B, 10], hidden [B, 32])
  returns_loss.pt returns {"loss": scalar, "logits": [B, 10]} given (x, labels)
  returns_loss_tuple.pt returns (loss, logits) given (x, labels), as Hugging
                 Face models do given labels and return_dict=False
  two_inputs.pt  forward(input_ids [B, 16] int64, attention_mask [B, 16] float,
                 bias: Optional = None) -> [B, 10]; swapping the two fails
  dict_in.pt     two_inputs' layers and computation, taking
                 forward(batch: Dict[str, Tensor]) with the keys input_ids
                 and attention_mask (scripted)
  tuple_in.pt    the same taking forward(inputs: (ids, mask)), traced with
                 a tuple example input (the schema keeps the tuple type)
  list_in.pt     forward(xs: List[Tensor]): one Linear 16 -> 10 applied to
                 the sum of any number of [B, 16] float tensors
  int_arg.pt     forward(x [B, 16], repeats: int): an argument no input fits
  encoder_decoder.pt an `encoder` ModuleList of two Residual blocks and a
                 `decoder` ModuleList of two Halving blocks, which scale their
                 input in place (x.mul_(0.5)) first: their graph shows it, so
                 checkpointing refuses them before running; x [B, 64] -> [B, 64]
  encoder_decoder_branch.pt the same with BranchHalving blocks, which scale
                 their input in place under `if x.dim() == 2`: the graph
                 cannot tell, the recompute operator refuses them at run time
  mlp_meta.pt    the MLP built on the meta device: its shapes, no weights
                 (a few KB), as a model too big for the machine is exported
  llama7b_meta.pt a LLaMA-7B architecture (hidden 4096, 32 layers, 32 heads,
                 SwiGLU 11008, vocab 32000, untied head: 6,738,415,616
                 parameters; RMSNorm, rotary, causal attention over at most
                 2048 positions) built on the meta device: no weights, ~80 KB
  unused_parameter.pt the MLP with one more parameter, `mask_token` [1, 256],
                 that forward never uses (as a ViT's mask token without a mask)
  unique.pt      BigMatmul scaled by the count of x's distinct values
                 (torch.unique: aten::_unique2 has CPU and CUDA kernels and
                 no meta kernel, the meta device's refusal to test)
  token_mlp.pt   a language model without attention: embedding (1000 x 64),
                 two per-token Linear 64 -> 256 -> 64 with GELU, a head to
                 1000; input_ids [B, T] int64 -> logits [B, T, 1000]. Every
                 tensor is B·T·width: no request grows with T² (issue #47)
  dropout_mlp.pt Linear 256 -> 512, nn.Dropout(0.5), Linear 512 -> 10
                 (scripted: aten::dropout inside torch.nn.functional.dropout,
                 a function the module's graph calls); dropout_mlp_p0.pt the
                 same with p = 0 (dropout returns its input);
                 dropout_mlp_trace.pt traced in training mode (aten::dropout
                 in the module's own graph); dropout_mlp_inplace.pt with
                 nn.Dropout(0.5, inplace=True) (aten::dropout_)
  softmax_mlp.pt Linear 256 -> 512, softmax over the 512, Linear 512 -> 10;
                 relu_mlp.pt the same with ReLU: under CUDA's autocast the
                 softmax runs in fp32 and the second Linear keeps a bf16
                 copy of its output, ReLU stays bf16
  not_torchscript/  what users pass instead of TorchScript: a state_dict, a
                 pickled module and a checkpoint dict (torch.save), the pre-1.6
                 torch.save format, safetensors, a PT2 archive (torch.export),
                 a Hugging Face model folder
Run with /usr/bin/python3 (Debian's python3-torch).
"""

import math
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from typing import Dict, List, Optional, Tuple


class MLP(nn.Module):
    def __init__(self, device=None):
        super().__init__()
        self.fc1 = nn.Linear(256, 512, device=device)
        self.fc2 = nn.Linear(512, 512, device=device)
        self.fc3 = nn.Linear(512, 10, device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class UnusedParameter(MLP):
    def __init__(self):
        super().__init__()
        self.mask_token = nn.Parameter(torch.zeros(1, 256))


class BigMatmul(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(256, 8192) * 0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight)


class Unique(BigMatmul):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(x, self.weight) * torch.unique(x).numel()


class RMSNorm(nn.Module):
    def __init__(self, d: int, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d, device=device))
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

def rotate(x: torch.Tensor) -> torch.Tensor:
    h = x.size(-1) // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

class RotaryAttention(nn.Module):
    def __init__(self, d: int, heads: int, device=None):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False, device=device)
        self.k = nn.Linear(d, d, bias=False, device=device)
        self.v = nn.Linear(d, d, bias=False, device=device)
        self.o = nn.Linear(d, d, bias=False, device=device)
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        b, t, d = x.size(0), x.size(1), x.size(2)
        hd = d // self.heads
        q = self.q(x).view(b, t, self.heads, hd).transpose(1, 2)
        k = self.k(x).view(b, t, self.heads, hd).transpose(1, 2)
        v = self.v(x).view(b, t, self.heads, hd).transpose(1, 2)
        q = q * cos + rotate(q) * sin
        k = k * cos + rotate(k) * sin
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(hd)
        att = att.masked_fill(mask[:t, :t] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, d)
        return self.o(y)

class SwiGLU(nn.Module):
    def __init__(self, d: int, hidden: int, device=None):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False, device=device)
        self.up = nn.Linear(d, hidden, bias=False, device=device)
        self.down = nn.Linear(hidden, d, bias=False, device=device)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))

class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int, hidden: int, device=None):
        super().__init__()
        self.norm1 = RMSNorm(d, device)
        self.attn = RotaryAttention(d, heads, device)
        self.norm2 = RMSNorm(d, device)
        self.mlp = SwiGLU(d, hidden, device)
    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))

class Llama(nn.Module):
    """The LLaMA architecture (Touvron et al. 2023): rotary tables and the
    causal mask are buffers (2 x 2048 x 128 and 2048 x 2048 fp32)."""

    def __init__(self, vocab: int, d: int, layers: int, heads: int, hidden: int, max_len: int, device=None):
        super().__init__()
        self.embed = nn.Embedding(vocab, d, device=device)
        self.blocks = nn.ModuleList([LlamaBlock(d, heads, hidden, device) for _ in range(layers)])
        self.norm = RMSNorm(d, device)
        self.head = nn.Linear(d, vocab, bias=False, device=device)
        hd = d // heads
        self.register_buffer("cos", torch.ones(max_len, hd, device=device), persistent=False)
        self.register_buffer("sin", torch.zeros(max_len, hd, device=device), persistent=False)
        self.register_buffer("mask", torch.ones(max_len, max_len, device=device), persistent=False)
    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.size(1)
        x = self.embed(input_ids)
        cos = self.cos[:t]
        sin = self.sin[:t]
        for block in self.blocks:
            x = block(x, cos, sin, self.mask)
        return self.head(self.norm(x))


class DictOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> Dict[str, torch.Tensor]:
        h = self.body(x)
        return {"logits": self.head(h), "hidden": h}


class TupleOut(DictOut):
    def forward(self, x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = self.body(x)
        return self.head(h), h


class ReturnsLoss(DictOut):
    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Dict[str, torch.Tensor]:
        logits = self.head(self.body(x))
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class ReturnsLossTuple(DictOut):
    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        logits = self.head(self.body(x))
        return nn.functional.cross_entropy(logits, labels), logits


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.out = nn.Linear(32, 10)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        h = self.emb(input_ids) * attention_mask.unsqueeze(-1)
        if bias is not None:
            h = h + bias
        return self.out(h.mean(1))


class DictIn(TwoInputs):
    def forward(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        h = self.emb(batch["input_ids"]) * batch["attention_mask"].unsqueeze(-1)
        return self.out(h.mean(1))


class TupleIn(TwoInputs):
    def forward(self, inputs: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h = self.emb(inputs[0]) * inputs[1].unsqueeze(-1)
        return self.out(h.mean(1))


class ListIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.out = nn.Linear(16, 10)

    def forward(self, xs: List[torch.Tensor]) -> torch.Tensor:
        total = xs[0]
        for x in xs[1:]:
            total = total + x
        return self.out(total)


class IntArg(ListIn):
    def forward(self, x: torch.Tensor, repeats: int) -> torch.Tensor:
        return self.out(x * repeats)


class Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.tanh(self.lin(x))


class Halving(Residual):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return x + torch.tanh(self.lin(x))


class BranchHalving(Residual):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x.mul_(0.5)
        return x + torch.tanh(self.lin(x))


class EncoderDecoder(nn.Module):
    def __init__(self, decoder_block=Halving):
        super().__init__()
        self.encoder = nn.ModuleList([Residual() for _ in range(2)])
        self.decoder = nn.ModuleList([decoder_block() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.encoder:
            x = block(x)
        for block in self.decoder:
            x = block(x)
        return x


class TokenMLP(nn.Module):
    def __init__(self, vocab: int = 1000, dim: int = 64):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.emb(input_ids)
        return self.head(x + self.mlp(x))


class DropoutMLP(nn.Module):
    def __init__(self, p: float, inplace: bool = False):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.drop = nn.Dropout(p, inplace=inplace)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.drop(self.fc1(x)))


class ActivationMLP(nn.Module):
    def __init__(self, softmax: bool):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.softmax = softmax
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(x)
        h = torch.softmax(h, dim=-1) if self.softmax else torch.relu(h)
        return self.fc2(h)


class MadeInForward(nn.Module):
    """Creates a tensor in forward from x's device: tracing on CPU bakes
    device=cpu into the graph (issue #10)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.size(1), device=x.device)
        return x.float().unsqueeze(-1) + self.emb(positions)


class MaskedScores(nn.Module):
    """Attention scores masked as transformers masks them, with the minimum
    of the scores' dtype: a trace records torch.finfo(scores.dtype).min as
    an fp32 constant, which bf16 and fp16 scores cannot hold (on a GPU
    either; libtorch 1.13 cannot script torch.finfo)."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.view(x.size(0), 4, 16)
        scores = torch.matmul(self.q(h), h.transpose(1, 2))
        mask = torch.ones(4, 4, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, torch.finfo(scores.dtype).min)
        return torch.matmul(torch.softmax(scores, dim=-1), h)


class Amplified(nn.Module):
    """fc(x) * factor, for fp16's loss scaling: at 1e3 the scaled gradients
    overflow fp16 at GradScaler's first scales (2^16 x 1e3 over 32 outputs
    of a batch of 2), which then halve until they fit; at inf they never do."""

    def __init__(self, factor: float):
        super().__init__()
        self.fc = nn.Linear(64, 16)
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.factor


def write_not_torchscript(out: str) -> None:
    """Files as torch.save, safetensors and torch.export write them. Debian's
    torch 1.13 has neither torch.export nor safetensors: those two are laid
    out here by their specs (torch/export/pt2_archive/constants.py: an
    `archive_format` record holding "pt2"; safetensors: u64 little-endian
    header length, JSON header, raw data)."""
    import json
    import struct
    os.makedirs(out, exist_ok=True)
    model = DictOut()
    torch.save(model.state_dict(), os.path.join(out, "state_dict.pt"))
    torch.save(model, os.path.join(out, "pickled_module.pt"))
    torch.save({"model": model.state_dict(), "step": 3}, os.path.join(out, "checkpoint.pt"))
    torch.save(model.state_dict(), os.path.join(out, "legacy.pt"), _use_new_zipfile_serialization=False)
    bias = model.head.bias.detach().tolist()  # not .numpy(): torch may come without numpy
    weight = struct.pack(f"<{len(bias)}f", *bias)
    header = json.dumps({"head.bias": {"dtype": "F32", "shape": [10], "data_offsets": [0, len(weight)]}}).encode()
    with open(os.path.join(out, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + weight)
    writer = torch._C.PyTorchFileWriter(os.path.join(out, "exported.pt2"))
    for name, data in [("archive_format", b"pt2"), ("archive_version", b"0"),
                       ("models/model.json", b"{}"), ("data/weights/weight_0", weight)]:
        writer.write_record(name, data, len(data))
    writer.write_end_of_file()
    os.makedirs(os.path.join(out, "hf_folder"), exist_ok=True)
    with open(os.path.join(out, "hf_folder", "config.json"), "w") as f:
        f.write('{"model_type": "gpt2"}\n')


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name, model in [("mlp", MLP()), ("bigmatmul", BigMatmul()), ("dict_out", DictOut()),
                        ("tuple_out", TupleOut()), ("returns_loss", ReturnsLoss()), ("two_inputs", TwoInputs()),
                        ("encoder_decoder", EncoderDecoder()),
                        ("encoder_decoder_branch", EncoderDecoder(BranchHalving)), ("unique", Unique()),
                        ("token_mlp", TokenMLP()), ("unused_parameter", UnusedParameter()),
                        ("mlp_meta", MLP(device="meta")),
                        ("llama7b_meta", Llama(32000, 4096, 32, 32, 11008, 2048, device="meta"))]:
        torch.jit.script(model).save(os.path.join(out, f"{name}.pt"))
    for name, model in [("dropout_mlp", DropoutMLP(0.5)), ("dropout_mlp_p0", DropoutMLP(0.0)),
                        ("dropout_mlp_inplace", DropoutMLP(0.5, inplace=True)),
                        ("softmax_mlp", ActivationMLP(softmax=True)), ("relu_mlp", ActivationMLP(softmax=False))]:
        torch.jit.script(model).save(os.path.join(out, f"{name}.pt"))
    torch.jit.trace(DropoutMLP(0.5), torch.zeros(2, 256), check_trace=False).save(
        os.path.join(out, "dropout_mlp_trace.pt"))
    made = MadeInForward()
    torch.jit.trace(made, torch.zeros(2, 8)).save(os.path.join(out, "arange_trace.pt"))
    torch.jit.script(made).save(os.path.join(out, "arange_script.pt"))
    torch.jit.trace(MaskedScores(), torch.zeros(2, 64)).save(os.path.join(out, "masked_scores_trace.pt"))
    for name, factor in [("amplified_1e3", 1e3), ("amplified_inf", float("inf"))]:
        torch.jit.script(Amplified(factor)).save(os.path.join(out, f"{name}.pt"))
    write_not_torchscript(os.path.join(out, "not_torchscript"))
    # Made last, so that the models above keep their weights.
    for name, model in [("dict_in", DictIn()), ("list_in", ListIn()), ("int_arg", IntArg()),
                        ("returns_loss_tuple", ReturnsLossTuple())]:
        torch.jit.script(model).save(os.path.join(out, f"{name}.pt"))
    example = (torch.randint(0, 100, (2, 16)), torch.ones(2, 16))
    torch.jit.trace(TupleIn(), (example,)).save(os.path.join(out, "tuple_in.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
