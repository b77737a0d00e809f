#!/usr/bin/env python3
"""A real out-of-memory snapshot of a Hugging Face model's training, for
issue #48 (oomtune diagnose names the layer: transformers' modeling_*.py
lines, not the training script's); run on the GPU machine by
scripts/device_check.sh --snapshots.

    record_hf_snapshot.py --out FILE.pickle [--layers 12] [--micro-batch 8]
                          [--seq 1024] [--budget BYTES] [--steps 3]
                          [--stacks python|all] [--max-entries 100000]

Trains transformers' GPT2LMHeadModel built from GPT-2 small's config
(n_embd 768, 12 heads, vocabulary 50257; random weights, nothing
downloaded) with torch.optim.AdamW, as a user's loop does, with the caching
allocator capped at --budget (torch.cuda.set_per_process_memory_fraction)
and its history recorded (torch.cuda.memory._record_memory_history, with
--stacks: "python" is what docs/diagnose.md advises; torch/cuda/memory.py).
At the first torch.cuda.OutOfMemoryError it writes the snapshot
(torch.cuda.memory._dump_snapshot, a pickle) to --out and prints JSON: the
step and phase that ran out, the message, the file's size. Exit 0 when the
snapshot was written, 1 if training never ran out of memory (raise
--micro-batch or lower --budget), 2 on bad arguments.
"""

import argparse
import json
import os
import sys

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--budget", type=int, default=8 << 30, help="bytes")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--stacks", choices=["python", "all"], default="python")
    parser.add_argument("--max-entries", type=int, default=100000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("record_hf_snapshot: no CUDA device (the allocator's history exists on CUDA only)", file=sys.stderr)
        return 2
    import transformers

    device = torch.device("cuda", torch.cuda.current_device())  # an index: set_per_process_memory_fraction wants one
    total = torch.cuda.get_device_properties(device).total_memory
    if not 0 < args.budget <= total:
        print(f"record_hf_snapshot: --budget {args.budget} B is not within the device's {total} B", file=sys.stderr)
        return 2
    torch.cuda.set_per_process_memory_fraction(args.budget / total, device)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=args.layers, n_positions=max(1024, args.seq), use_cache=False)
    torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
    model = transformers.GPT2LMHeadModel(config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phase = "load"
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "parameters": sum(p.numel() for p in model.parameters()), "micro_batch": args.micro_batch,
              "seq": args.seq, "budget_bytes": args.budget, "stacks": args.stacks}
    try:
        for step in range(args.steps):
            result["step"] = step
            ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
            phase = "forward"
            loss = model(ids, labels=ids).loss
            phase = "backward"
            loss.backward()
            phase = "optimizer"
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss
    except torch.cuda.OutOfMemoryError as e:
        result.update(phase=phase, message=str(e).splitlines()[0])
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)
        result["snapshot_bytes"] = os.path.getsize(args.out)
        print(json.dumps(result, indent=1))
        return 0
    result["phase"] = None
    print(json.dumps(result, indent=1))
    print("record_hf_snapshot: training did not run out of memory; raise --micro-batch or lower --budget",
          file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
