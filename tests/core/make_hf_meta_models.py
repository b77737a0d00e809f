#!/usr/bin/env python3
"""Export a tiny Hugging Face Llama twice, as a user of the meta device would.

Issue #46 item 2: a model too big for the machine is built under
torch.device("meta") and traced there (README, "Exporting a model without
its weights"); the same architecture traced on the CPU is the reference.
Both are transformers.LlamaForCausalLM from one LlamaConfig (hidden 64, 2
layers, 4 heads, SwiGLU 128, vocabulary 256, eager attention), traced in
train mode at batch 1 and 16 tokens (the trace bakes the batch into its
masks, so jobs use global_batch = 1). forward(input_ids) -> {"logits"}.

  llama_tiny_meta.pt  built and traced on meta: shapes, no weights
  llama_tiny_cpu.pt   built and traced on the CPU: random weights

and a tiny T5 (transformers.T5ForConditionalGeneration: d_model 64, 2
layers each side, 4 heads of 16, feed-forward 128, vocabulary 256, 32
relative position buckets, its default SDPA attention, which gets the
relative position bias as attn_mask), traced on the CPU at batch 2 and 16
tokens each side. forward(input_ids, decoder_input_ids) -> {"logits"}.

  t5_tiny_cpu.pt

and a tiny Mixtral (transformers.MixtralForCausalLM: hidden 64, 2 layers,
4 heads and 2 key/value heads of 16, 4 experts of SwiGLU 128 with 2 per
token, vocabulary 256), its experts in transformers' default
implementation, grouped matmuls (torch._grouped_mm over every expert's
weights, offsets from torch.histc), traced on the CPU at batch 2 and 16
tokens. forward(input_ids) -> {"logits"}.

  mixtral_tiny_cpu.pt

Needs PyPI's transformers: run with the .venv-pypi python
(OOMTUNE_HF_PYTHON). Usage: make_hf_meta_models.py OUT_DIR
"""

import os
import sys

import torch
from transformers import (LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM, T5Config,
                          T5ForConditionalGeneration)


def save(traced, path):
    traced.save(path + ".tmp")
    os.replace(path + ".tmp", path)


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, vocab_size=256, use_cache=False, torchscript=True,
                         attn_implementation="eager")
    for device in ("meta", "cpu"):
        torch.manual_seed(0)
        with torch.device(device):
            model = LlamaForCausalLM(config)
        model.train()
        ids = torch.zeros(1, 16, dtype=torch.long, device=device)
        traced = torch.jit.trace(model, (ids,), strict=False, check_trace=False)
        save(traced, os.path.join(out, f"llama_tiny_{device}.pt"))
    torch.manual_seed(0)
    t5 = T5ForConditionalGeneration(T5Config(d_model=64, d_ff=128, d_kv=16, num_layers=2, num_heads=4,
                                             vocab_size=256, relative_attention_num_buckets=32,
                                             use_cache=False, torchscript=True))
    t5.train()
    ids = torch.zeros(2, 16, dtype=torch.long)
    traced = torch.jit.trace(t5, example_kwarg_inputs={"input_ids": ids, "decoder_input_ids": ids}, strict=False,
                             check_trace=False)
    save(traced, os.path.join(out, "t5_tiny_cpu.pt"))
    torch.manual_seed(0)
    mixtral = MixtralForCausalLM(MixtralConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                               num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                               num_experts_per_tok=2, vocab_size=256, use_cache=False,
                                               torchscript=True))
    mixtral.train()
    ids = torch.randint(0, 256, (2, 16))
    traced = torch.jit.trace(mixtral, (ids,), strict=False, check_trace=False)
    save(traced, os.path.join(out, "mixtral_tiny_cpu.pt"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
