#!/usr/bin/env python3
"""Export a small Hugging Face Llama causal LM with LoRA adapters as TorchScript.

The fine-tuning fixture of issue #47: a Llama-architecture model
(transformers.LlamaForCausalLM, random weights, nothing downloaded) wrapped
by PEFT's get_peft_model with a LoraConfig on the attention projections
(q_proj, k_proj, v_proj, o_proj), traced as users trace one, once per
attention implementation. Needs PyPI's transformers and peft (the versions
scripts/pypi-constraints.txt pins): run it with .venv-pypi/bin/python.
Writes, into examples/models/ (or --out):

  llama_lora_eager.pt  attn_implementation="eager": matmul, softmax, matmul;
                       loads in Debian's libtorch 1.13 too
  llama_lora_sdpa.pt   attn_implementation="sdpa" (the transformers default):
                       aten::scaled_dot_product_attention, which needs a
                       libtorch 2.x (the PyPI build)

forward(input_ids, attention_mask, labels) -> {"loss", "logits"} (a dict:
transformers 5 returns its ModelOutput, which the trace keeps as a dict,
even with torchscript=True): the model computes its own loss (transformers
shifts the labels inside: loss/loss_utils.py, ForCausalLMLoss), so the job
says [loss] kind = "model_returns_loss", which reads the "loss" key
(examples/llama_lora.toml).

Every parameter is saved with requires_grad on (PEFT turns it off on the
base model; torch.jit.save keeps that flag): the job's `trainable` globs
choose what trains, so the same file serves the LoRA run and the
fully-trained comparison. Parameter names as the TorchScript module lists
them: "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight".

Traced in eval mode (no dropout inside the trace; LoRA dropout is 0) at
batch 2 and --seq tokens; the batch stays free. The script checks the saved
file against the PEFT model at another batch size before it keeps it. Model
files are generated, never committed.
"""

import argparse
import os
import sys
import tempfile

import torch

ATTENTIONS = ("eager", "sdpa")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


def make_model(attention: str, args):
    import peft
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.dim, intermediate_size=args.ffn, num_hidden_layers=args.layers,
        num_attention_heads=args.heads, num_key_value_heads=args.heads, max_position_embeddings=args.seq,
        use_cache=False, tie_word_embeddings=False, torchscript=True, attn_implementation=attention)
    base = transformers.LlamaForCausalLM(config)
    lora = peft.LoraConfig(r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.0, bias="none",
                           target_modules=LORA_TARGETS, task_type="CAUSAL_LM")
    model = peft.get_peft_model(base, lora)
    # PEFT's default init leaves lora_B zero (the adapter starts as the
    # identity); a random B makes the adapters' gradients flow into A too.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.02)
    for p in model.parameters():
        p.requires_grad_(True)
    return model.eval()


def example(batch: int, args):
    generator = torch.Generator().manual_seed(batch)
    ids = torch.randint(0, args.vocab, (batch, args.seq), generator=generator)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()}


def export(attention: str, path: str, args) -> int:
    model = make_model(attention, args)
    traced = torch.jit.trace(model, example_kwarg_inputs=example(2, args), strict=False, check_trace=False)
    with tempfile.NamedTemporaryFile(dir=os.path.dirname(path), suffix=".pt", delete=False) as tmp:
        traced.save(tmp.name)
    try:
        loaded = torch.jit.load(tmp.name)
        check = example(3, args)
        with torch.no_grad():
            want = model(**check)["loss"]
            got = loaded(**check)["loss"]
        if not torch.allclose(want, got, rtol=1e-5, atol=1e-6):
            raise SystemExit(f"{path}: the traced file's loss {got.item()} differs from the model's {want.item()}")
        names = [name for name, _ in loaded.named_parameters()]
        if not any(".lora_A." in name for name in names):
            raise SystemExit(f"{path}: no lora_A parameter among {names[:4]}...")
        os.chmod(tmp.name, 0o644)  # NamedTemporaryFile makes it 0600
        os.replace(tmp.name, path)
    except BaseException:
        os.unlink(tmp.name)
        raise
    return sum(p.numel() for p in model.parameters())


def main() -> int:
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join(here, "models"), help="output folder")
    parser.add_argument("--only", choices=ATTENTIONS, action="append", help="export only these (repeatable)")
    parser.add_argument("--if-missing", action="store_true", help="skip models whose file exists")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--ffn", type=int, default=344)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--vocab", type=int, default=1000)
    parser.add_argument("--rank", type=int, default=8)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for attention in args.only or ATTENTIONS:
        path = os.path.join(args.out, f"llama_lora_{attention}.pt")
        if args.if_missing and os.path.exists(path):
            continue
        n = export(attention, path, args)
        print(f"{os.path.basename(path)}: {n} parameters", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
