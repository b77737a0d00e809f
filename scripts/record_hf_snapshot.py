#!/usr/bin/env python3
"""A real out-of-memory snapshot of a Hugging Face model's training, for
issue #48 (oomtune diagnose names the layer: transformers' modeling_*.py
lines, not the training script's); run on the GPU machine by
scripts/device_check.sh --snapshots.

    record_hf_snapshot.py --out FILE.pickle [--layers 12] [--micro-batch 8]
                          [--seq 1024] [--budget BYTES] [--steps 3]
                          [--stacks python|all] [--max-entries 100000]
                          [--evaluate [--eval-accumulation-steps K]]
                          [--checkpointing] [--pretrained]

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

With --evaluate it runs transformers' Trainer.evaluate() instead, on --steps
batches of --micro-batch sequences (per_device_eval_batch_size), with a
compute_metrics that needs the logits (token accuracy), so Trainer keeps
every step's logits on the device and concatenates them
(trainer_pt_utils.py nested_concat) unless --eval-accumulation-steps K moves
them to the CPU every K steps (TrainingArguments.eval_accumulation_steps):
docs/diagnose.md, "Evaluation outputs kept on the device". Exit 1 then means
the evaluation ran to its end, as the eval_accumulation_steps that
`oomtune diagnose` recommends for the first snapshot should make it.

With --pretrained the model (the same random weights) is saved with
save_pretrained to a temporary folder before recording and loaded from it
with from_pretrained(..., device_map=) onto the GPU while recording, as
users load a checkpoint: its weights come to the device through
transformers' loading code (5.x: core_model_loading.py), not Module.to()
(docs/gpu_machine.md, item 10).

With --checkpointing every GPT2Block is checkpointed
(gradient_checkpointing_enable, use_reentrant=False) and attention is eager
(its probabilities materialized, as in the synthetic BERT fixtures); two
uncapped steps make the optimizer state and give the step's peak reserved
bytes, then caps from that peak down to what the step starts with are
tried, one step each with a fresh history (clear_history), until one runs
out of memory while backward recomputes a block (Note [Recomputed block],
diagnose/backward_need.cpp) or, failing that, later in a checkpointed
backward (Note [Blocks in backward]): the snapshot of the
first such cap, highest first. `oom_kind` in the JSON says which; exit 1
if no cap gave either. --budget is not used.
"""

import argparse
import gc
import json
import os
import pickle
import sys
import tempfile

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
    parser.add_argument("--evaluate", action="store_true", help="Trainer.evaluate() instead of training")
    parser.add_argument("--eval-accumulation-steps", type=int, default=None)
    parser.add_argument("--checkpointing", action="store_true",
                        help="checkpointed training; the cap is searched (see above)")
    parser.add_argument("--pretrained", action="store_true",
                        help="load the model with from_pretrained(device_map=) while recording (see above)")
    args = parser.parse_args()
    if args.checkpointing and args.evaluate:
        print("record_hf_snapshot: --checkpointing trains; it does not go with --evaluate", file=sys.stderr)
        return 2
    if args.eval_accumulation_steps is not None and (not args.evaluate or args.eval_accumulation_steps < 1):
        print("record_hf_snapshot: --eval-accumulation-steps needs --evaluate and a value >= 1", file=sys.stderr)
        return 2
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
    config = transformers.GPT2Config(n_layer=args.layers, n_positions=max(1024, args.seq), use_cache=False,
                                     **({"attn_implementation": "eager"} if args.checkpointing else {}))
    if args.pretrained:
        folder = tempfile.mkdtemp(prefix="record_hf_snapshot_")
        transformers.GPT2LMHeadModel(config).save_pretrained(folder)
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
        model = transformers.GPT2LMHeadModel.from_pretrained(folder, device_map={"": device.index}).train()
    else:
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks)
        model = transformers.GPT2LMHeadModel(config).to(device).train()
    result = {"torch": torch.__version__, "transformers": transformers.__version__,
              "parameters": sum(p.numel() for p in model.parameters()), "micro_batch": args.micro_batch,
              "seq": args.seq, "budget_bytes": args.budget, "stacks": args.stacks}
    if args.evaluate:
        return evaluate(args, transformers, model, config, result)
    if args.checkpointing:
        return checkpointed(args, model, config, result, device, total)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    phase = "load"
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
        return report(args, result, phase, e)
    return report(args, result, None, None,
                  "training did not run out of memory; raise --micro-batch or lower --budget")


RECOMPUTING = ("unpack_hook", "recompute_fn")  # torch/utils/checkpoint.py, use_reentrant=False


def oom_kind(trace):
    """What a device trace's last out-of-memory hit: "recomputing" when its
    frames (the allocator records the failing request's) run inside a
    checkpointed block's recomputation, "after_recomputation" when a
    recomputation ran earlier in the trace, else "other"; None without one.
    `trace`: a list of torch.cuda.memory._snapshot()'s trace entries."""
    ooms = [i for i, e in enumerate(trace) if e.get("action") == "oom"]
    if not ooms:
        return None

    def recomputes(e):
        return any(f.get("name") in RECOMPUTING and f.get("filename", "").endswith("utils/checkpoint.py")
                   for f in e.get("frames", []))

    oom = ooms[-1]
    if recomputes(trace[oom]):
        return "recomputing"
    if any(e.get("action") == "alloc" and recomputes(e) for e in trace[:oom]):
        return "after_recomputation"
    return "other"


def checkpointed(args, model, config, result, device, total):
    """Checkpointed training under caps searched for an out-of-memory in a
    recomputation (see the module's docstring)."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        ids = torch.randint(0, config.vocab_size, (args.micro_batch, args.seq), device=device)
        model(ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    torch.cuda.memory._record_memory_history(enabled=None)
    torch.cuda.set_per_process_memory_fraction(1.0, device)
    for _ in range(2):
        step()
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    step()
    peak = torch.cuda.max_memory_reserved(device)
    result.update(mode="checkpointing", step_start_bytes=start, step_peak_reserved_bytes=peak, caps_tried=[])
    fallback = None
    for i in range(1, 20):
        cap = peak - (peak - start) * i // 20
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(cap / total, device)
        torch.cuda.memory._record_memory_history(max_entries=args.max_entries, stacks=args.stacks, clear_history=True)
        result["caps_tried"].append(cap)
        message, snapshot = None, None
        try:
            step()
        except torch.cuda.OutOfMemoryError as e:  # the step's tensors still alive, as a user's handler sees them
            message, snapshot = str(e).splitlines()[0], torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        optimizer.zero_grad(set_to_none=True)
        if snapshot is None:
            continue
        kind = oom_kind(snapshot["device_traces"][device.index])
        if kind == "recomputing":
            return write_checkpointed(args, result, snapshot, kind, cap, message)
        if kind == "after_recomputation" and fallback is None:
            fallback = (snapshot, kind, cap, message)
    if fallback is not None:
        return write_checkpointed(args, result, *fallback)
    return report(args, result, None, None, "no cap ran out of memory in a checkpointed backward")


def write_checkpointed(args, result, snapshot, kind, cap, message):
    """Writes `snapshot` as torch.cuda.memory._dump_snapshot does (a pickle)
    and prints `result` with the cap and the out-of-memory's kind; exit 0."""
    with open(args.out, "wb") as f:
        pickle.dump(snapshot, f)
    result.update(phase="backward", oom_kind=kind, budget_bytes=cap, message=message,
                  snapshot_bytes=os.path.getsize(args.out))
    print(json.dumps(result, indent=1))
    return 0


def report(args, result, phase, error, why=""):
    """Writes the snapshot at an out-of-memory `error` and prints `result` as
    JSON: exit 0 with a snapshot, else 1 with `why` on stderr."""
    result["phase"] = phase
    if error is not None:
        result["message"] = str(error).splitlines()[0]
        torch.cuda.memory._dump_snapshot(args.out)
        torch.cuda.memory._record_memory_history(enabled=None)
        result["snapshot_bytes"] = os.path.getsize(args.out)
    print(json.dumps(result, indent=1))
    if error is None:
        print(f"record_hf_snapshot: {why}", file=sys.stderr)
    return 0 if error is not None else 1


def evaluate(args, transformers, model, config, result):
    """Trainer.evaluate() of `model` until the end or the first out-of-memory (see the module's docstring)."""
    import tempfile

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return args.steps * args.micro_batch

        def __getitem__(self, i):
            ids = torch.randint(0, config.vocab_size, (args.seq,), generator=torch.Generator().manual_seed(i))
            return {"input_ids": ids, "labels": ids}

    def accuracy(prediction):  # needs every step's logits: Trainer keeps them
        predicted = prediction.predictions.argmax(-1)[:, :-1]
        return {"token_accuracy": float((predicted == prediction.label_ids[:, 1:]).mean())}

    result.update(mode="evaluate", eval_accumulation_steps=args.eval_accumulation_steps)
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = transformers.Trainer(
            model=model,
            args=transformers.TrainingArguments(output_dir=output_dir, per_device_eval_batch_size=args.micro_batch,
                                                eval_accumulation_steps=args.eval_accumulation_steps,
                                                report_to=[], dataloader_num_workers=0),
            eval_dataset=Batches(), compute_metrics=accuracy)
        try:
            result["metrics"] = trainer.evaluate()
        except torch.cuda.OutOfMemoryError as e:
            return report(args, result, "evaluate", e)
    return report(args, result, None, None, f"the evaluation of {args.steps} steps ran to its end")


if __name__ == "__main__":
    sys.exit(main())
