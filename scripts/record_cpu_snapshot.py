#!/usr/bin/env python3
"""A memory snapshot of a real PyTorch run, recorded on the CPU: no GPU needed.

    record_cpu_snapshot.py --out FILE.pickle [--mode no_grad|train]
                           [--layers 4] [--oom-after FRACTION]

Runs a Hugging Face GPT2LMHeadModel (random weights from a small config:
n_embd 256, 4 heads, vocabulary 1000, batch 4 x 256 tokens; built inside
the recording, so its parameters are allocated there) once forward, under
`with torch.no_grad():` (--mode no_grad, model.eval(): what an inference
script does) or with autograd (--mode train, model.train(): a training
step's forward), and records every CPU allocation and free with the Python
stack that made it: torch.profiler with profile_memory=True and
with_stack=True, whose allocation events carry the storage's address and
bytes and sit under the Python calls (PyCall, PyCCall) that made them
(torch/profiler/_memory_profiler.py reads the same tree). The allocations
are then replayed through the caching-allocator model of
make_snapshot_fixtures.py (Sim) and written as torch.cuda.memory._dump_snapshot
writes a 2.11 snapshot: the order, sizes, lifetimes and frames are PyTorch's
own, the segments are the model's. With --oom-after F, once F of the
forward's allocations are made the allocator may reserve no more (a
memory cap at what it holds then): the first later allocation that needs a
new segment runs out of memory and ends the trace, as in a real capped run.

Prints JSON: the allocations recorded, whether and where it ran out of
memory (the allocation's index), the bytes of the model's parameters and
buffers (each storage once). Exit 0, 77 without transformers, 2 on bad
arguments. Used by tests/scripts/no_grad_snapshot_test.py (Note [Blocks
that kept nothing], diagnose/nothing_saved.h).
"""

import argparse
import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_snapshot_fixtures as fixtures  # noqa: E402  (Sim, frame)


def allocations(prof):
    """(bytes, frames) per allocation (bytes > 0) and free (bytes < 0) with
    its address, in the order they happened; frames innermost first."""
    from torch._C._profiler import _EventType
    out = []

    def walk(node, stack):
        if node.tag in (_EventType.PyCall, _EventType.PyCCall):
            caller = node.extra_fields.caller
            try:
                stack = stack + [(caller.file_name, caller.line_number, caller.function_name)]
            except UnicodeDecodeError:  # a C call's caller the profiler lost (torch 2.11): no frame
                pass
        if node.tag == _EventType.Allocation and node.extra_fields.alloc_size != 0:
            out.append((node.start_time_ns, len(out), node.extra_fields.ptr, node.extra_fields.alloc_size,
                        stack[::-1]))
        for child in node.children:
            walk(child, stack)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [])
    out.sort(key=lambda e: (e[0], e[1]))
    return [(ptr, size, stack) for _, _, ptr, size, stack in out]


def full_path(name, roots):
    """The profiler names a package's file relative to its sys.path entry."""
    if os.path.isabs(name):
        return name
    for root in roots:
        path = os.path.join(root, name)
        if os.path.exists(path):
            return path
    return os.path.abspath(name)


def record(mode, layers):
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread's allocations: the same on every machine
    config = transformers.GPT2Config(n_layer=layers, n_embd=256, n_head=4, n_positions=256, vocab_size=1000)
    ids = torch.randint(0, 1000, (4, 256))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        model = transformers.GPT2LMHeadModel(config)
        if mode == "no_grad":
            model.eval()
            with torch.no_grad():
                logits = model(ids).logits
        else:
            model.train()
            logits = model(ids, labels=ids).logits
        # The model's weights and buffers, each storage once (GPT-2 ties its head to the embeddings).
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in list(model.parameters()) + list(model.buffers())}
        del logits, model
    return allocations(prof), sum(storages.values())


def replay(events, oom_after, roots):
    """events through fixtures.Sim; returns (sim, index of the failing allocation or None)."""
    sim = fixtures.Sim(cap=1 << 60)
    stacks = {}

    def frames_of(stack):
        key = tuple(stack)
        if key not in stacks:
            stacks[key] = [fixtures.frame(full_path(f, roots), name, line) for f, line, name in stack]
        return stacks[key]

    total = sum(1 for _, size, _ in events if size > 0)
    freeze_at = None if oom_after is None else int(total * oom_after)
    address = {}  # the CPU storage's address -> the model's
    made = 0
    for ptr, size, stack in events:
        if size < 0:
            if ptr in address:
                sim.free(address.pop(ptr), frames_of(stack))
            continue
        if made == freeze_at:
            sim.cap = sim.reserved()
        try:
            address[ptr] = sim.malloc(size, frames_of(stack))
        except fixtures.OutOfMemory:
            return sim, made
        made += 1
    return sim, None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["no_grad", "train"], default="no_grad")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--oom-after", type=float, default=None)
    args = parser.parse_args()
    if args.layers < 1 or (args.oom_after is not None and not 0 <= args.oom_after < 1):
        parser.error("--layers must be >= 1 and --oom-after in [0, 1)")
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    events, parameter_bytes = record(args.mode, args.layers)
    sim, failed_at = replay(events, args.oom_after, [p for p in sys.path if os.path.isdir(p)])
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(sim.dump("v2_11"), f, protocol=4)
    os.replace(tmp, args.out)
    print(json.dumps({"allocations": sum(1 for _, size, _ in events if size > 0), "oom_at": failed_at,
                      "parameter_bytes": parameter_bytes, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
