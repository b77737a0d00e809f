#!/usr/bin/env python3
"""A memory snapshot of a real PyTorch run, recorded on the CPU: no GPU needed.

    record_cpu_snapshot.py --out FILE.pickle [--mode no_grad|train|step]
                           [--model gpt2|llama|qwen2|gemma|bert|opt|neox|phi3]
                           [--layers 4] [--batch 4] [--seq 256]
                           [--checkpointing] [--eager-attention] [--compile]
                           [--steps 1] [--optimizer [adamw|rmsprop|sgd] [--fused]
                                        [--optimizer-option NAME=VALUE ...]]
                           [--oom-after FRACTION |
                            --oom-in forward|backward|recomputation|optimizer
                                     [--share 1] [--oom-step K]]

Runs a Hugging Face GPT2LMHeadModel (random weights from a small config:
n_embd 256, 4 heads, vocabulary 1000, --batch sequences of --seq tokens;
built inside the recording, so its parameters are allocated there), or
with --model another family's language model of the same width and
vocabulary (MODELS: Llama, hidden 256, MLP 688, 2 of 4 heads for keys
and values, its head its own as Llama 2 and 3 8B; Qwen2, Gemma, BERT's
masked LM, OPT, GPT-NeoX, Phi-3), under
`with torch.no_grad():` (--mode no_grad, model.eval(): what an inference
script does), forward with autograd (--mode train, model.train()) or
--steps training steps (--mode step: forward, backward and, with
--optimizer, an AdamW step, or RMSprop's or SGD's with momentum 0.9 with
--optimizer rmsprop|sgd, with foreach=True, CUDA's default
implementation, or with --fused fused=True; --optimizer-option adds
keyword arguments: amsgrad=True, centered=True), with --checkpointing
every block checkpointed (gradient_checkpointing_enable,
use_reentrant=False) and with
--eager-attention the attention's probabilities materialized, with
--compile under torch.compile(backend="aot_eager"): forward and backward
run as FX GraphModules, whose code torch 2.11 names
fx_generated__HASH.py when torch.fx.experimental._config.
enrich_profiler_metadata is set, and the snapshot is then augmented as
_dump_snapshot(augment_with_fx_traces=True) does it (torch/_utils.py,
_augment_memory_snapshot_stack_traces: each such frame gets fx_node_op,
fx_node_name, fx_node_target and the model source's stack,
fx_original_trace). It records
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
model's. What torch.tensor(...) makes without a device (the foreach
optimizers' step counters) is left out, a host tensor on CUDA
(host_tensor); the rest of what CUDA keeps on the host is not (the RNG
states a checkpointed block saves, other scalars).

Where it runs out of memory: with --oom-after F, once F of the run's
allocations are made the allocator may reserve no more (a memory cap at
what it holds then): the first later allocation that needs a new segment
fails and ends the trace, as in a capped run. With --oom-in PHASE
(--mode step): the highest cap, in 2 MiB steps below the run's peak
reserved, under which it fails in that phase of step --oom-step (default
the last), within the first --share of that phase's allocations there
("backward" includes a checkpointed block's recomputation).

Prints JSON: the allocations recorded, the failing allocation's index
(oom_at; null if none), the requested bytes the same run without the cap
allocates beyond what is alive there (uncapped_growth_bytes: the rest of
the run's need, to hold diagnose's estimate against), the bytes of the
model's parameters and buffers (each storage once). Exit 0, 1 when no cap
fails there, 77 without transformers, 2 on bad arguments. Used by
tests/scripts/cpu_snapshot_test.py (Note [Blocks that kept nothing],
diagnose/nothing_saved.h; Note [Blocks in backward], diagnose/backward_need.cpp).
"""

import argparse
import ast
import contextlib
import functools
import json
import linecache
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


FX_GENERATED = "fx_generated_"  # torch/fx/graph_module.py, FX_GRAPH_MODULE_FILE_PREFIX
STEP = "oomtune_step_"  # record_function's name around each training step


def allocations(prof):
    """(address, bytes, frames, step) per allocation (bytes > 0) and free
    (bytes < 0), in the order they happened; frames innermost first; step:
    the training step (record_function STEP + its index) or -1. Each call
    node (PyCall, PyCCall) gives its caller's frame, at the line of the
    call; where the innermost is a Python function's call (PyCall), its own
    frame comes first too, at its `def` line: an operator it runs by syntax
    (`a + b`) makes no call node of its own."""
    from torch._C._profiler import _EventType
    out = []

    steps = []  # (start ns, end ns, index): record_function's ranges, which the tree does not nest under

    def walk(node, stack, callee):
        if node.tag in (_EventType.PyCall, _EventType.PyCCall):
            caller = frame_of(node.extra_fields.caller)
            stack = stack + [caller] if caller else stack
            callee = frame_of(node.extra_fields.callsite) if node.tag == _EventType.PyCall else None
        elif node.tag == _EventType.TorchOp and node.name.startswith(STEP):
            steps.append((node.start_time_ns, node.end_time_ns, int(node.name[len(STEP):])))
        if node.tag == _EventType.Allocation and node.extra_fields.alloc_size != 0:
            frames = stack + [callee] if callee else stack
            out.append((node.start_time_ns, len(out), node.extra_fields.ptr, node.extra_fields.alloc_size,
                        frames[::-1]))
        for child in node.children:
            walk(child, stack, callee)

    for root in prof.profiler.kineto_results.experimental_event_tree():
        walk(root, [], None)
    out.sort(key=lambda e: (e[0], e[1]))
    return [e[2:] + (next((k for start, end, k in steps if start <= e[0] <= end), -1),) for e in out]


def full_path(name, roots):
    """The profiler names a package's file relative to its sys.path entry."""
    if os.path.isabs(name) or name.startswith(FX_GENERATED):
        return name  # an FX GraphModule's code has no file: its name is its key in torch's FX registry
    for root in roots:
        path = os.path.join(root, name)
        if os.path.exists(path):
            return path
    return os.path.abspath(name)


ENGINE = "_engine_run_backward"  # torch/autograd/graph.py: Python's call into the autograd engine


class Event:
    """One allocation (bytes > 0) or free (bytes < 0) as the device records
    it: backward's stack cut to the engine's device thread (device_thread),
    its phase ("backward", "recomputation", "optimizer" or "": the forward
    and the loss) and step."""
    __slots__ = ("ptr", "size", "stack", "phase", "step")

    def __init__(self, ptr, size, stack, step):
        names = [name for _, _, name in stack]
        backward = ENGINE in names
        self.ptr, self.size, self.step = ptr, size, step
        self.stack = device_thread(stack, names) if backward else stack
        self.phase = ("recomputation" if recomputes(self.stack) else "backward") if backward else \
            "optimizer" if any("torch/optim/" in f for f, _, _ in stack) else ""


def device_thread(stack, names):
    """The frames CUDA's allocator records for an allocation the autograd
    engine makes: backward runs on the engine's device thread, where the
    only Python frames are those the engine calls back into (a checkpointed
    block's recomputation, a custom Function's backward). On the CPU the
    engine runs on the calling thread, below loss.backward()'s frames."""
    return stack[:names.index(ENGINE)]


def recomputes(stack):
    """A checkpointed block's forward rerun in backward (use_reentrant=False)."""
    return any(name in ("unpack_hook", "recompute_fn") for _, _, name in stack)


# --model: (config class, its keyword arguments, model class), all 256 wide
# with a vocabulary of 1000; a head tied to the embedding where the
# family's default ties it (GPT-2, Qwen2 here, Gemma, BERT's MLM, OPT), its
# own in Llama (as Llama 2 and 3 8B), GPT-NeoX and Phi-3.
MODELS = {
    "gpt2": ("GPT2Config", dict(n_embd=256, n_head=4, n_positions=256), "GPT2LMHeadModel"),
    "llama": ("LlamaConfig", dict(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False),
              "LlamaForCausalLM"),
    "qwen2": ("Qwen2Config", dict(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True),
              "Qwen2ForCausalLM"),
    "gemma": ("GemmaConfig", dict(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=64, max_position_embeddings=256),
              "GemmaForCausalLM"),
    "bert": ("BertConfig", dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                                max_position_embeddings=256), "BertForMaskedLM"),
    "opt": ("OPTConfig", dict(hidden_size=256, ffn_dim=1024, num_attention_heads=4, max_position_embeddings=256,
                              word_embed_proj_dim=256), "OPTForCausalLM"),
    "neox": ("GPTNeoXConfig", dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4,
                                   max_position_embeddings=256), "GPTNeoXForCausalLM"),
    "phi3": ("Phi3Config", dict(hidden_size=256, intermediate_size=688, num_attention_heads=4,
                                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0),
             "Phi3ForCausalLM"),
}


def model_config(name, layers):
    """(config, model class) of --model `name` with `layers` blocks (MODELS)."""
    import transformers
    config_class, kwargs, model_class = MODELS[name]
    layer_key = "n_layer" if name == "gpt2" else "num_hidden_layers"
    config = getattr(transformers, config_class)(vocab_size=1000, **{layer_key: layers}, **kwargs)
    return config, getattr(transformers, model_class)


def train(args, ids, step_scope=contextlib.nullcontext, mark=lambda phase, step: None,
          build_scope=contextlib.nullcontext):
    """Builds the model (--model) inside build_scope() (parameters made on
    its default device, in the model's own __init__) and runs it outside,
    on `ids` (--batch x --seq token ids), as `args` (this script's options)
    say; step_scope(k) encloses training step k, mark(phase, k) is called
    as "forward", "backward" and "optimizer" of step k begin (--mode
    no_grad and train: one "forward" of step 0) and mark("end", steps)
    after. Returns the model's parameter and buffer bytes, each storage
    once (GPT-2 ties its head to the embeddings)."""
    import torch
    import transformers
    torch.manual_seed(0)
    config, model_class = model_config(args.model, args.layers)
    if args.eager_attention:
        config._attn_implementation = "eager"  # the probabilities materialized, as record_hf_snapshot.py runs it
    with build_scope():
        model = model_class(config)
    if args.checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if args.cuda_graphs:
        model = torch.compile(model, mode="reduce-overhead")  # CUDA graph trees, their private memory pool
    elif args.compile:
        import torch.fx.experimental._config
        torch.fx.experimental._config.enrich_profiler_metadata = True  # names its code fx_generated__HASH.py
        model = torch.compile(model, backend="aot_eager")
    out = opt = kept = None
    if args.side_stream:
        # A batch prefetched on a side stream (diagnose: Note [Memory on
        # other streams]): its 128 MiB staging buffer freed, a 4 MiB tensor
        # of that stream kept through the run at the start of the buffer's
        # segment, whose other 124 MiB stay cached for that stream only.
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            staging = torch.empty(128 << 20, dtype=torch.uint8, device=ids.device)
            del staging
            kept = torch.empty(4 << 20, dtype=torch.uint8, device=ids.device)
        torch.cuda.current_stream().wait_stream(side)
    if args.mode == "no_grad":
        model.eval()
        mark("forward", 0)
        with torch.no_grad():
            out = model(ids)
    elif args.mode == "train":
        model.train()
        mark("forward", 0)
        out = model(ids, labels=ids)
    else:
        model.train()
        # foreach=True: CUDA's default implementation (torch/optim/optimizer.py
        # _default_to_fused_or_foreach), its whole-list temporaries too;
        # fused=True: the one kernel for the list, no temporaries.
        kinds = {"adamw": torch.optim.AdamW, "rmsprop": torch.optim.RMSprop,
                 "sgd": lambda p, **kw: torch.optim.SGD(p, momentum=0.9, **kw)}
        if args.optimizer:
            opt = kinds[args.optimizer](model.parameters(), lr=1e-4, **{args.implementation: True},
                                        **args.optimizer_options)
        for step in range(args.steps):
            with step_scope(step):
                mark("forward", step)
                loss = model(ids, labels=ids).loss
                mark("backward", step)
                loss.backward()
                del loss
                if opt:
                    mark("optimizer", step)
                    opt.step()
                    opt.zero_grad(set_to_none=True)
                if args.empty_cache:
                    torch.cuda.empty_cache()  # its segment_free events carry this call's stack
    mark("end", args.steps if args.mode == "step" else 1)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in list(model.parameters()) + list(model.buffers())}
    del out, opt, model, kept
    return sum(storages.values())


def host_tensor(stack, roots):
    """Whether an allocation is one a CUDA run makes on the host, outside the
    device's allocator: its innermost frame's call is torch.tensor(...)
    with no device (a CPU tensor wherever the model runs; torch 2.11's
    foreach and single-tensor optimizers host their step counters so:
    adam.py's "special device hosting for step", where fused and
    capturable ones make them on the device with torch.zeros)."""
    return bool(stack) and calls_host_factory(stack[0][0], stack[0][1], tuple(roots))


@functools.lru_cache(maxsize=None)
def calls_host_factory(file, line, roots):
    """Whether line `line` of `file` calls torch.tensor( with no device (host_tensor)."""
    path = full_path(file, roots)
    text = ""
    for k in range(line, line + 5):  # the call's lines, to its closing parenthesis
        text += linecache.getline(path, k)
        if "torch.tensor(" not in text or text.count("(") <= text.count(")"):
            break
    return "torch.tensor(" in text and "device" not in text


def search_roots():
    """The folders the profiler's relative file names are relative to."""
    return [p for p in sys.path if os.path.isdir(p)]


def record(args):
    """The Events of one run on the CPU, less those CUDA makes on the host
    (host_tensor), and the model's parameter and buffer bytes."""
    import torch
    import transformers
    from torch.profiler import ProfilerActivity, profile, record_function
    torch.set_num_threads(1)  # one thread's allocations: the same on every machine
    ids = torch.randint(0, 1000, (args.batch, args.seq))
    # transformers imports its modules lazily; imported under the profiler
    # with stacks they took 14 s more: a tiny GPT-2 built here imports them.
    transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=8, n_head=1, vocab_size=8))
    if args.compile:
        train(args, ids)  # compiled here, not under the profiler: the recorded run reuses the graphs
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True) as prof:
        parameter_bytes = train(args, ids, step_scope=lambda step: record_function(f"{STEP}{step}"))
    roots = search_roots()
    events = [Event(*e) for e in allocations(prof)]
    return [e for e in events if e.size < 0 or not host_tensor(e.stack, roots)], parameter_bytes


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

    freeze_at = None if oom_after is None else int(sum(1 for e in events if e.size > 0) * oom_after)
    address = {}  # the CPU storage's address -> the model's
    made = 0
    for e in events:
        ptr, size, stack = e.ptr, e.size, e.stack
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


def cap_in_phase(events, roots, phase, share=1.0, step=None):
    """The highest cap, in 2 MiB steps below the uncapped run's peak
    reserved, under which the run runs out of memory in `phase` (of step
    `step`, default the last), within its first `share` of that phase's
    allocations there; "backward" counts the recomputation's too: (sim,
    index of the failing allocation), or (None, None)."""
    allocs = [e for e in events if e.size > 0]
    step = max(e.step for e in allocs) if step is None else step
    inside = [i for i, e in enumerate(allocs) if e.step == step and
              (e.phase == ("" if phase == "forward" else phase) or (phase == "backward" and e.phase == "recomputation"))]
    if not inside:
        return None, None
    last = inside[max(0, int(len(inside) * share) - 1)]
    inside = set(inside)
    peak = replay(events, roots)[0].reserved()
    for cap in range(peak - (2 << 20), 0, -(2 << 20)):
        sim, failed_at = replay(events, roots, cap=cap)
        if failed_at is not None and failed_at in inside and failed_at <= last:
            return sim, failed_at
    return None, None


def uncapped_growth(events, failed_at):
    """Requested bytes the uncapped run allocates beyond what is alive just
    before allocation `failed_at` (that allocation included): what the
    rest of the run needed (the independent figure for diagnose's need)."""
    live = peak = made = 0
    alive = {}
    base = None
    for e in events:
        ptr, size = e.ptr, e.size
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


def parse_args(description):
    """This script's options, checked (shared with record_cuda_snapshot.py,
    whose docstring is `description`); exits 2 on bad ones."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=["no_grad", "train", "step"], default="no_grad")
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--oom-after", type=float, default=None)
    parser.add_argument("--oom-in", choices=["forward", "backward", "recomputation", "optimizer"],
                        help="instead of --oom-after (--mode step): the highest cap that runs out of memory there")
    parser.add_argument("--share", type=float, default=1.0,
                        help="with --oom-in: within this first share of that phase's allocations")
    parser.add_argument("--oom-step", type=int, default=None, help="with --oom-in: in this step (default the last)")
    parser.add_argument("--steps", type=int, default=1, help="--mode step: training steps")
    parser.add_argument("--optimizer", nargs="?", const="adamw", choices=["adamw", "rmsprop", "sgd"],
                        help="--mode step: an optimizer step (foreach) in each, AdamW's by default")
    parser.add_argument("--fused", dest="implementation", action="store_const", const="fused", default="foreach",
                        help="with --optimizer adamw or sgd: fused=True instead of foreach=True")
    parser.add_argument("--optimizer-option", action="append", default=[], metavar="NAME=VALUE",
                        help="with --optimizer: one more keyword argument of the optimizer, VALUE a Python literal "
                             "(amsgrad=True, momentum=0.9); repeatable")
    parser.add_argument("--checkpointing", action="store_true")
    parser.add_argument("--eager-attention", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help='torch.compile(backend="aot_eager"), the snapshot augmented with FX traces')
    parser.add_argument("--cuda-graphs", action="store_true",
                        help='torch.compile(mode="reduce-overhead"): CUDA graphs in a private memory pool (CUDA '
                             'recorders only; this one exits 78)')
    parser.add_argument("--empty-cache", action="store_true",
                        help="torch.cuda.empty_cache() after each training step (CUDA recorders only; this one "
                             "exits 78)")
    parser.add_argument("--side-stream", action="store_true",
                        help="before the run, a 128 MiB buffer made and freed on a side stream and a 4 MiB tensor "
                             "of it kept (CUDA recorders only; this one exits 78)")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=256)
    args = parser.parse_args()
    if min(args.layers, args.batch, args.seq) < 1 or args.seq > 256 or \
            (args.oom_after is not None and not 0 <= args.oom_after < 1):
        parser.error("--layers, --batch and --seq must be >= 1 (--seq <= 256) and --oom-after in [0, 1)")
    if args.oom_in and (args.mode != "step" or args.oom_after is not None or not 0 < args.share <= 1 or
                        (args.oom_in == "recomputation" and not args.checkpointing) or
                        (args.oom_in == "optimizer" and not args.optimizer)):
        parser.error("--oom-in needs --mode step, no --oom-after, a --share in (0, 1], --checkpointing to "
                     "recompute and --optimizer for the optimizer")
    if args.steps < 1 or (args.oom_step is not None and not 0 <= args.oom_step < args.steps):
        parser.error("--steps must be >= 1 and --oom-step one of them")
    if args.implementation == "fused" and args.optimizer not in ("adamw", "sgd"):
        parser.error("--fused needs --optimizer adamw or sgd (RMSprop has no fused kernel)")
    options = {}
    for option in args.optimizer_option:
        name, _, value = option.partition("=")
        try:
            options[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            parser.error(f"--optimizer-option {option!r}: expected NAME=VALUE with VALUE a Python literal")
    if options and not args.optimizer:
        parser.error("--optimizer-option needs --optimizer")
    args.optimizer_options = options
    return args


def main():
    args = parse_args(__doc__)
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e}")
        return 77
    if args.cuda_graphs or args.empty_cache or args.side_stream:
        print("not recorded: --cuda-graphs, --empty-cache and --side-stream need a CUDA recorder "
              "(scripts/record_cuda_snapshot.py)")
        return 78
    events, parameter_bytes = record(args)
    roots = search_roots()
    if args.oom_in:
        sim, failed_at = cap_in_phase(events, roots, args.oom_in, args.share, args.oom_step)
        if sim is None:
            print(json.dumps({"error": f"no cap runs out of memory in {args.oom_in}"}))
            return 1
    else:
        sim, failed_at = replay(events, roots, oom_after=args.oom_after)
    snapshot = sim.dump("v2_11")
    if args.compile:
        from torch._utils import _augment_memory_snapshot_stack_traces
        _augment_memory_snapshot_stack_traces(snapshot)  # what _dump_snapshot(augment_with_fx_traces=True) does
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)
    os.replace(tmp, args.out)
    print(json.dumps({"allocations": sum(1 for e in events if e.size > 0), "oom_at": failed_at,
                      "uncapped_growth_bytes": None if failed_at is None else uncapped_growth(events, failed_at),
                      "parameter_bytes": parameter_bytes, "out": args.out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
