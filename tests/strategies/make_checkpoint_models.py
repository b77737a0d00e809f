#!/usr/bin/env python3
"""Tiny scripted models for the activation checkpointing tests
(tests/strategies/checkpointing_test.cpp). Run with /usr/bin/python3 (Debian's
python3-torch); writes into the folder given as the first argument:

  pair.pt        blocks with two tensor inputs and a tuple of two outputs, in
                 a ModuleList; the first block is fed the raw input (nothing
                 that requires grad), input x [B, 16] -> [B, 4]
  shared.pt      a ModuleList of two Sequentials of the same shape, so both
                 Sequentials share one TorchScript type and one compiled
                 forward (a call site there serves two block objects); blocks
                 hold a BatchNorm1d, whose num_batches_tracked shows how often
                 each block ran; input x [B, 16] -> [B, 16]
  no_blocks.pt   three Linear layers as plain attributes: nothing repeated
  int_arg.pt     repeated blocks whose forward takes (Tensor, int)
  masked.pt      blocks whose forward takes (Tensor, Optional[Tensor], float,
                 bool): block 0 gets mask None, block 1 a mask computed from
                 the input, each with dropout; input x [B, 16] -> [B, 16]
  encoder.pt     nn.TransformerEncoder (2 layers of nn.TransformerEncoderLayer,
                 d_model 16, dropout 0.1), whose layers take Optional[Tensor]
                 masks; input x [B, 6, 16] -> [B, 6, 16]
  tuple_arg.pt   repeated blocks whose forward takes Tuple[Tensor, Tensor],
                 input x [B, 16] -> [B, 16]
  dict_arg.pt    repeated blocks whose forward takes Dict[str, Tensor]
  appending.pt   blocks whose forward appends its result to its List[Tensor]
                 argument (the caller reads it from there), input x [B, 16]
  dense.pt       as torchvision's DenseNet: a stem, a DenseBlock (an
                 nn.ModuleDict subclass) of three DenseLayers, and a head;
                 each DenseLayer's forward is overloaded (List[Tensor] or
                 Tensor; TorchScript names them forward__0, forward__1), takes
                 the list of all earlier features, which the DenseBlock
                 appends to after each call, and holds a BatchNorm1d and
                 dropout; input x [B, 16] -> [B, 16]
  in_place.pt    two blocks that scale their input in place (x.mul_(0.5))
                 before using it; input x [B, 16] -> [B, 16]
  in_place_branch.pt, appending_branch.pt  as in_place.pt and appending.pt,
                 with the write under `if x.dim() == 2` / `if len(xs) > 0`:
                 the graph cannot tell that it always runs
  pre_activation.pt two blocks that apply nn.ReLU(inplace=True) to their
                 input first (a pre-activation ResNet block's order); input
                 x [B, 16] -> [B, 16]
  saved_output.pt two blocks of a Linear(16, 16) and exp, whose backward
                 saves its result: each block's output is saved inside it;
                 input x [B, 16] -> [B, 16]
  halves.pt      three blocks that take (a, b) and return the two halves of
                 one tanh (chunk: both outputs of one autograd node), input
                 x [B, 16] -> [B, 4]
  passthrough.pt three blocks that take (a, b) and return b unchanged beside
                 a new tensor (a recomputed output that is the block's own
                 input: a leaf), input x [B, 16] -> [B, 4]
  widening.pt    two blocks of Linear(16, 64), exp and Linear(64, 16): the
                 gradient that comes into a block is needed by its first
                 backward node only; input x [B, 16] -> [B, 16]
  llama_trace.pt a Llama-style decoder as Hugging Face's LlamaForCausalLM lays
                 it out (embed_tokens, layers of RMSNorm, rotary attention
                 with dropout 0.1 and a SwiGLU MLP, norm, lm_head), *traced*
                 in training mode as users export HF models: each layer gets
                 the hidden states, the rotary cos/sin (a tuple in Python,
                 two Tensors in the trace) and the causal mask, and returns a
                 one-element tuple; input ids [B, 16] in [0, 100) -> logits
                 [B, 16, 100]
  mixed.pt       a Sequential `features` of a stem, three Units, three plain
                 Sequentials of two, two and one Unit (stages), and a head (as
                 MobileNetV3 and EfficientNet lay out their features), Units
                 with dropout; input x [B, 16] -> [B, 16]

Nothing here is committed as .pt; the test runs this script at test time.
"""

import os
import sys
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F


class PairBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin_a = nn.Linear(16, 16)
        self.lin_b = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.lin_a(a) + self.lin_b(b))
        return self.drop(h) + a, h * b


class PairNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([PairBlock() for _ in range(3)])
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = x
        b = x * 2.0
        for block in self.blocks:
            a, b = block(a, b)
        return self.head(a + b)


class NormBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.relu(self.norm(self.lin(x))))


class SharedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.stages = nn.ModuleList([nn.Sequential(NormBlock(), NormBlock()) for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.inp(x)
        for stage in self.stages:
            x = stage(x)
        return x


class NoBlocks(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 32)
        self.fc3 = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class TwoBlocks(nn.Module):
    """Two instances of `block` in self.blocks, each fed the one before's
    output; subclasses whose blocks take other arguments say, in their own
    forward, how the blocks are called (the argument form each model tests)."""

    def __init__(self, block):
        super().__init__()
        self.blocks = nn.ModuleList([block() for _ in range(2)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


class IntArgBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, times: int) -> torch.Tensor:
        for _ in range(times):
            x = self.lin(x)
        return x


class IntArgNet(TwoBlocks):
    def __init__(self):
        super().__init__(IntArgBlock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x, 2)
        return x


class MaskedBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor], scale: float, residual: bool) -> torch.Tensor:
        h = self.drop(torch.tanh(self.lin(x))) * scale
        if mask is not None:
            h = h * mask
        return h + x if residual else h


class MaskedNet(TwoBlocks):
    def __init__(self):
        super().__init__(MaskedBlock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = torch.sigmoid(x)
        for i, block in enumerate(self.blocks):
            x = block(x, None if i == 0 else mask, 0.5 + i, i == 1)
        return x


class TupleArgBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, xs: Tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.lin(xs[0]) * torch.tanh(xs[1])


class TupleArgNet(TwoBlocks):
    def __init__(self):
        super().__init__(TupleArgBlock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block((x, x * 2.0))
        return x


class DictArgBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, xs: Dict[str, torch.Tensor]) -> torch.Tensor:
        return self.lin(xs["a"] + xs["b"])


class DictArgNet(TwoBlocks):
    def __init__(self):
        super().__init__(DictArgBlock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block({"a": x, "b": x * 2.0})
        return x


class AppendingBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, xs: List[torch.Tensor]) -> torch.Tensor:
        y = self.lin(xs[-1])
        xs.append(y)
        return y.sum(1, keepdim=True)


class AppendingNet(TwoBlocks):
    def __init__(self):
        super().__init__(AppendingBlock)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xs = [x]
        for block in self.blocks:
            block(xs)
        return xs[-1]


class ScalingBlock(nn.Module):
    """Scales its input in place before using it (pre-activation blocks do
    the same with ReLU(inplace=True))."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(0.5)
        return x + torch.tanh(self.lin(x))


class ScalingNet(TwoBlocks):
    def __init__(self):
        super().__init__(ScalingBlock)


class BranchAppendingBlock(AppendingBlock):
    def forward(self, xs: List[torch.Tensor]) -> torch.Tensor:
        y = self.lin(xs[-1])
        if len(xs) > 0:
            xs.append(y)
        return y.sum(1, keepdim=True)


class BranchAppendingNet(AppendingNet):
    def __init__(self):
        TwoBlocks.__init__(self, BranchAppendingBlock)


class BranchScalingBlock(ScalingBlock):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            x.mul_(0.5)
        return x + torch.tanh(self.lin(x))


class BranchScalingNet(TwoBlocks):
    def __init__(self):
        super().__init__(BranchScalingBlock)


class PreActivationBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.relu = nn.ReLU(inplace=True)
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(x)
        return y + self.lin(y)


class PreActivationNet(TwoBlocks):
    def __init__(self):
        super().__init__(PreActivationBlock)


class DenseLayer(nn.Module):
    """torchvision.models.densenet._DenseLayer in small: the concatenation
    of all earlier features, normalized, projected to `growth` features."""

    def __init__(self, width: int, growth: int):
        super().__init__()
        self.norm = nn.BatchNorm1d(width)
        self.lin = nn.Linear(width, growth)
        self.drop = nn.Dropout(0.1)

    @torch.jit._overload_method  # noqa: F811
    def forward(self, features: List[torch.Tensor]) -> torch.Tensor:  # noqa: F811
        pass

    @torch.jit._overload_method  # noqa: F811
    def forward(self, features: torch.Tensor) -> torch.Tensor:  # noqa: F811
        pass

    def forward(self, features):  # noqa: F811
        if isinstance(features, torch.Tensor):
            prev = [features]
        else:
            prev = features
        return self.drop(self.lin(torch.relu(self.norm(torch.cat(prev, 1)))))


class DenseBlock(nn.ModuleDict):
    def __init__(self, layers: int, width: int, growth: int):
        super().__init__()
        for i in range(layers):
            self.add_module(f"layer{i + 1}", DenseLayer(width + i * growth, growth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for name, layer in self.items():
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(16, 8)
        self.block = DenseBlock(3, 8, 4)
        self.head = nn.Linear(8 + 3 * 4, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.block(self.stem(x)))


class Stem(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


class Unit(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(self.norm(torch.tanh(self.lin(x))))


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class MixedNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(Stem(), Unit(), Unit(), Unit(), nn.Sequential(Unit(), Unit()),
                                      nn.Sequential(Unit(), Unit()), nn.Sequential(Unit()), Head())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int):
        super().__init__()
        inv_freq = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, position_ids: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, d // heads
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.o_proj = nn.Linear(d, d, bias=False)

    def forward(self, x, position_embeddings, attention_mask):
        b, t, d = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                   for proj in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = (e.unsqueeze(1) for e in position_embeddings)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        weights = torch.softmax(q @ k.transpose(-1, -2) / self.head_dim ** 0.5 + attention_mask, -1)
        weights = F.dropout(weights, 0.1, self.training)
        return self.o_proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class LlamaMLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.gate_proj = nn.Linear(d, 2 * d, bias=False)
        self.up_proj = nn.Linear(d, 2 * d, bias=False)
        self.down_proj = nn.Linear(2 * d, d, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.self_attn = LlamaAttention(d, heads)
        self.mlp = LlamaMLP(d)
        self.input_layernorm = RMSNorm(d)
        self.post_attention_layernorm = RMSNorm(d)

    def forward(self, hidden_states, attention_mask, position_embeddings):
        h = hidden_states + self.self_attn(self.input_layernorm(hidden_states), position_embeddings, attention_mask)
        return (h + self.mlp(self.post_attention_layernorm(h)),)


class LlamaModel(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList([LlamaDecoderLayer(d, heads) for _ in range(layers)])
        self.norm = RMSNorm(d)
        self.rotary_emb = RotaryEmbedding(d // heads)

    def forward(self, input_ids):
        b, t = input_ids.shape
        x = self.embed_tokens(input_ids)
        position_embeddings = self.rotary_emb(torch.arange(t)[None].expand(b, t))
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        for layer in self.layers:
            x = layer(x, mask, position_embeddings)[0]
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab: int = 100, d: int = 32, heads: int = 4, layers: int = 3):
        super().__init__()
        self.model = LlamaModel(vocab, d, heads, layers)
        self.lm_head = nn.Linear(d, vocab, bias=False)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def traced_llama() -> torch.jit.ScriptModule:
    model = LlamaForCausalLM().train()
    return torch.jit.trace(model, (torch.randint(0, 100, (2, 16)),), check_trace=False)


class ExpBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.exp(self.lin(x))  # exp's backward saves its result: the block's output


class ExpNet(TwoBlocks):
    def __init__(self):
        super().__init__(ExpBlock)


class HalvesBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        halves = torch.tanh(self.lin(torch.cat([a, b], dim=-1))).chunk(2, dim=-1)
        return halves[0], halves[1]


class PassthroughBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 8)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return b, torch.tanh(self.lin(torch.cat([a, b], dim=-1)))


class HalvesNet(nn.Module):
    """Three `block`s fed the two halves of the input, each pair of outputs
    the next block's inputs."""

    def __init__(self, block=HalvesBlock):
        super().__init__()
        self.blocks = nn.ModuleList([block() for _ in range(3)])
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        for block in self.blocks:
            a, b = block(a, b)
        return self.head(a * b)


class WideningBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.exp(self.up(x)))


class WideningNet(TwoBlocks):
    def __init__(self):
        super().__init__(WideningBlock)


def encoder() -> nn.Module:
    layer = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
    return nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    for name, model in [("pair", PairNet()), ("shared", SharedNet()), ("no_blocks", NoBlocks()),
                        ("int_arg", IntArgNet()), ("masked", MaskedNet()), ("encoder", encoder()),
                        ("tuple_arg", TupleArgNet()), ("mixed", MixedNet()), ("dense", DenseNet()),
                        ("appending", AppendingNet()), ("dict_arg", DictArgNet()),
                        ("in_place", ScalingNet()), ("in_place_branch", BranchScalingNet()),
                        ("appending_branch", BranchAppendingNet()), ("pre_activation", PreActivationNet()),
                        ("saved_output", ExpNet()), ("widening", WideningNet()), ("halves", HalvesNet()),
                        ("passthrough", HalvesNet(PassthroughBlock))]:
        path = os.path.join(out, f"{name}.pt")
        torch.jit.script(model).save(path + ".tmp")
        os.replace(path + ".tmp", path)
    path = os.path.join(out, "llama_trace.pt")
    traced_llama().save(path + ".tmp")
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
