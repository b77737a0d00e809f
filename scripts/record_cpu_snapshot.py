#!/usr/bin/env python3
"""A memory snapshot of a real PyTorch run, recorded on the CPU: no GPU needed.

    record_cpu_snapshot.py --out FILE.pickle [--mode no_grad|train|step]
                           [--layers 4] [--batch 4] [--seq 256]
                           [--checkpointing] [--eager-attention]
                           [--oom-after FRACTION | --in-backward [SHARE]
                                                  [--recomputing]]

Runs a Hugging Face GPT2LMHeadModel (random weights from a small config:
n_embd 256, 4 heads, vocabulary 1000, --batch sequences of --seq tokens;
built inside the recording, so its parameters are allocated there) under
`with torch.no_grad():` (--mode no_grad, model.eval(): what an inference
script does), forward with autograd (--mode train, model.train()) or a
training step's forward and backward (--mode step; no optimizer step:
CPU's AdamW is not CUDA's), with --checkpointing every block checkpointed
(gradient_checkpointing_enable, use_reentrant=False) and with
--eager-attention the attention's probabilities materialized. It records
every CPU allocation and free with the Python stack that made it:
torch.profiler with profile_memory=True and with_stack=True, whose
allocation events carry the storage's address and bytes and sit under the
Python calls (PyCall, PyCCall) that made them (torch/profiler/
_memory_profiler.py reads the same tree). Backward's stacks are cut to what
CUDA's allocator records on the autograd engine's device thread: only the
Python frames the engine calls back into (a checkpointed block's
recomputation), none for its own operators. The allocations are replayed
through the caching-allocator model of make_snapshot_fixtures.py (Sim) and
written as torch.cuda.memory._dump_snapshot writes a 2.11 snapshot: the
order, sizes, lifetimes and frames are PyTorch's own, the segments are the
model's (a CPU run also allocates what CUDA keeps on the host: the RNG
states a checkpointed block saves, scalars).

Where it runs out of memory: with --oom-after F, once F of the run's
allocations are made the allocator may reserve no more (a memory cap at
what it holds then): the first later allocation that needs a new segment
fails and ends the trace, as in a capped run. With --in-backward [SHARE]
(--mode step): the highest cap, in 2 MiB steps below the run's peak
reserved, under which it fails in backward within the first SHARE of
backward's allocations (with --recomputing, of the allocations backward
makes recomputing a checkpointed block, one of which fails).

Prints JSON: the allocations recorded, the failing allocation's index
(oom_at; null if none), the requested bytes the same run without the cap
allocates beyond what is alive there (uncapped_growth_bytes: the rest of
the run's need, to hold diagnose's estimate against), the bytes of the
model's parameters and buffers (each storage once). Exit 0, 1 when no cap
fails in backward, 77 without transformers, 2 on bad arguments. Used by
tests/scripts/cpu_snapshot_test.py (Note [Blocks that kept nothing],
diagnose/nothing_saved.h; Note [Blocks in backward], diagnose/phase_need.cpp).
"""

import argparse
import json
import os
import pickle
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_snapshot_fixtures as fixtures  # noqa: E402  (Sim, frame)


def frame_of(state):
    """(file, line, function) of a profiler _PyFrameState; None where the
    profiler lost it (a C call's caller, torch 2.11: undecodable bytes)."""
    try:
        return state.file_name, state.line_number, state.function_name
    except UnicodeDecodeError:
        return None


def allocations(prof):
    """(address, bytes, frames) per allocation (bytes > 0) and free (bytes
    < 0), in the order they happened; frames innermost first. Each call
    node (PyCall, PyCCall) gives its caller's frame, at the line of the
    call; where the innermost is a Python function's call (PyCall), its own
    frame comes first too, at its `def` line: an operator it runs by syntax
    (`a + b`) makes no call node of its own."""
    from torch._C._profiler import _EventType
    out = []

    def walk(node, stack, callee):
        if node.tag in (_EventType.PyCall, _EventType.PyCCall):
            caller = frame_of(node.extra_fields.caller)
            stack = stack + [caller] if caller else stack
            callee = frame_of(node.extra_fields.callsite) if node.tag == _EventType.PyCall else None
        if node.tag == _EventType.Allocation and node.extra_fields.alloc_size != 0:
            frames = stack + [callee] if callee else stack
            out.append((node.start_time_ns, len(out), node.extra_fields.ptr, node.extra_fields.alloc_size,
                        frames[::-1]))
        for child in node.children:
            walk(child, stack, callee)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [], None)
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


ENGINE = "_engine_run_backward"  # torch/autograd/graph.py: Python's call into the autograd engine


def device_thread(stack):
    """The frames CUDA's allocator records for an allocation the autograd
    engine makes: backward runs on the engine's device thread, where the
    only Python frames are those the engine calls back into (a checkpointed
    block's recomputation, a custom Function's backward). On the CPU the
    engine runs on the calling thread, below loss.backward()'s frames."""
    names = [name for _, _, name in stack]
    if ENGINE not in names:
        return stack, False
    return stack[:names.index(ENGINE)], True


def record(mode, layers, checkpointing=False, eager=False, batch=4, seq=256):
    """The allocations of one run (allocations() with each stack as the
    device records it, and whether backward made it) and the model's
    parameter and buffer bytes."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile
    torch.manual_seed(0)
    torch.set_num_threads(1)  # one thread's allocations: the same on every machine
    config = transformers.GPT2Config(n_layer=layers, n_embd=256, n_head=4, n_positions=256, vocab_size=1000)
    if eager:
        config._attn_implementation = "eager"  # the probabilities materialized, as record_hf_snapshot.py runs it
    ids = torch.randint(0, 1000, (batch, seq))
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        model = transformers.GPT2LMHeadModel(config)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if mode == "no_grad":
            model.eval()
            with torch.no_grad():
                out = model(ids)
        else:
            model.train()
            out = model(ids, labels=ids)
            if mode == "step":
                out.loss.backward()
        # The model's weights and buffers, each storage once (GPT-2 ties its head to the embeddings).
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                    for t in list(model.parameters()) + list(model.buffers())}
        del out, model
    events = [(ptr, size) + device_thread(stack) for ptr, size, stack in allocations(prof)]
    return events, sum(storages.values())


def replay(events, roots, oom_after=None, cap=1 << 60):
    """events through fixtures.Sim under `cap`; returns (sim, index of the
    failing allocation or None). With oom_after the cap also freezes once
    that share of the allocations is made."""
    sim = fixtures.Sim(cap=cap)
    stacks = {}

    def frames_of(stack):
        key = tuple(stack)
        if key not in stacks:
            stacks[key] = [fixtures.frame(full_path(f, roots), name, line) for f, line, name in stack]
        return stacks[key]

    freeze_at = None if oom_after is None else int(sum(1 for e in events if e[1] > 0) * oom_after)
    address = {}  # the CPU storage's address -> the model's
    made = 0
    for ptr, size, stack, _ in events:
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


def recomputes(stack):
    """A checkpointed block's forward rerun in backward (use_reentrant=False)."""
    return any(name in ("unpack_hook", "recompute_fn") for _, _, name in stack)


def cap_in_backward(events, roots, share, recomputing=False):
    """The highest cap, in 2 MiB steps below the uncapped run's peak
    reserved, under which the run runs out of memory in backward (while it
    recomputes a checkpointed block, with `recomputing`), within its first
    `share` of backward's allocations: (sim, index of the failing
    allocation), or (None, None)."""
    allocs = [e for e in events if e[1] > 0]
    backward = [i for i, e in enumerate(allocs) if e[3] and (recomputes(e[2]) or not recomputing)]
    if not backward:
        return None, None
    last = backward[max(0, int(len(backward) * share) - 1)]
    peak = replay(events, roots)[0].reserved()
    for cap in range(peak - (2 << 20), 0, -(2 << 20)):
        sim, failed_at = replay(events, roots, cap=cap)
        if failed_at is not None and failed_at in backward and failed_at <= last:
            return sim, failed_at
    return None, None


def uncapped_growth(events, failed_at):
    """Requested bytes the uncapped run allocates beyond what is alive just
    before allocation `failed_at` (that allocation included): what the
    rest of the run needed (the independent figure for diagnose's need)."""
    live = peak = made = 0
    alive = {}
    base = None
    for ptr, size, _, _ in events:
        if size < 0:
            live -= alive.pop(ptr, 0)
            continue
        if made == failed_at:
            base = peak = live
        alive[ptr] = size
        live += size
        made += 1
        peak = max(peak, live)
    return None if base is None else peak - base


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["no_grad", "train", "step"], default="no_grad")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--oom-after", type=float, default=None)
    parser.add_argument("--in-backward", type=float, nargs="?", const=1.0, default=None, metavar="SHARE",
                        help="instead of --oom-after: the highest cap that runs out of memory in backward, "
                             "within its first SHARE of allocations (default 1)")
    parser.add_argument("--recomputing", action="store_true",
                        help="with --in-backward: out of memory while backward recomputes a checkpointed block")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--eager-attention", action="store_true")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    if min(args.layers, args.batch, args.seq) < 1 or args.seq > 256 or \
            (args.oom_after is not None and not 0 <= args.oom_after < 1):
        parser.error("--layers, --batch and --seq must be >= 1 (--seq <= 256) and --oom-after in [0, 1)")
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    if args.in_backward is not None and (args.mode != "step" or args.oom_after is not None or
                                         not 0 < args.in_backward <= 1):
        parser.error("--in-backward needs --mode step, no --oom-after and a share in (0, 1]")
    if args.recomputing and (args.in_backward is None or not args.checkpointing):
        parser.error("--recomputing needs --in-backward and --checkpointing")
    events, parameter_bytes = record(args.mode, args.layers, args.checkpointing, args.eager_attention, args.batch,
                                     args.seq)
    roots = [p for p in sys.path if os.path.isdir(p)]
    if args.in_backward is not None:
        sim, failed_at = cap_in_backward(events, roots, args.in_backward, args.recomputing)
        if sim is None:
            print(json.dumps({"error": "no cap runs out of memory in backward"}))
            return 1
    else:
        sim, failed_at = replay(events, roots, oom_after=args.oom_after)
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(sim.dump("v2_11"), f, protocol=4)
    os.replace(tmp, args.out)
    print(json.dumps({"allocations": sum(1 for e in events if e[1] > 0), "oom_at": failed_at,
                      "uncapped_growth_bytes": None if failed_at is None else uncapped_growth(events, failed_at),
                      "parameter_bytes": parameter_bytes, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
