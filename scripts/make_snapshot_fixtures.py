#!/usr/bin/python3
"""Generate synthetic PyTorch CUDA memory snapshots for `oomtune diagnose` tests.

Usage: /usr/bin/python3 scripts/make_snapshot_fixtures.py [OUT_DIR]
       (default OUT_DIR: tests/fixtures/snapshots next to this script's repo)

No torch needed. A small model of PyTorch's caching allocator (the rules of
c10/cuda/CUDACachingAllocator.cpp, PyTorch 2.x: round to 512 bytes, small
pool for requests <= 1 MiB in 2 MiB segments, large requests < 10 MiB share
20 MiB segments, larger ones get their own segment rounded to 2 MiB; a free
block is split when more than 1 MiB (large pool) or at least 512 bytes
(small pool, expandable segments) would remain; free neighbours merge; on a
failed cudaMalloc the fully free cached segments are released, then an
`oom` trace entry is recorded) plays a scripted training run, and the final
state plus its trace are written in the snapshot layout of one PyTorch
version:

  layout  mirrors                       what differs
  v1_13   torch 1.13 memory_snapshot()  a bare list of segments; blocks have
                                        `history` [{addr, real_size, frames}]
  v2_0    torch 2.0 _dump_snapshot()    {segments, device_traces}; blocks
                                        have no address, keep `history`;
                                        state "active_pending_free"; oom
                                        entries carry device_free, no addr
  v2_1    torch 2.1                     blocks: address, requested_size,
                                        frames; segments: segment_pool_id,
                                        is_expandable, frames; no time_us
  v2_2    torch 2.2-2.3                 + time_us on trace entries
  v2_4    torch 2.4                     + allocator_settings
  v2_11   torch 2.5-2.11                + external_annotations,
                                        compile_context, user_metadata

(Sources: torch/cuda/memory.py _snapshot() docstring and
torch/csrc/cuda/Module.cpp of each release.)

Files written (each < 200 KB):
  layout_<L>.pickle     the same fragmentation scenario in each layout
                        (protocol 2 for v1_13/v2_0, 4 for the others, 5 for
                        layout_v2_11_protocol5.pickle)
  leak.pickle           6 iterations; each keeps its loss with the graph
  optimizer_oom.pickle  AdamW's first step runs out of memory allocating state;
                        the device itself is full (device_free 6 MiB), the
                        other files are capped processes on an 80 GB GPU
                        (device_free 70 GiB), like the real H100 snapshots
  backward_peak.pickle  out of memory in backward (frameless C++ allocations)
  expandable.pickle     expandable_segments:True, out of memory in forward
  missing_frames.pickle recorded without context: no frames anywhere
  hf_bert_forward_oom.pickle  a Hugging Face Trainer fine-tuning a BERT, out of
                        memory in modeling_bert.py's BertIntermediate; the project
                        and its venv sit in a folder named `torch`
  adamw_first_step_oom.pickle  the first AdamW step out of memory with 42 MiB
                        free in small blocks: 8-bit AdamW is enough, expandable
                        segments is not
  forward_holes_enough.pickle  the second iteration's forward out of memory,
                        14 x 10.5 MiB holes between live 9.5 MiB tensors: 167 MiB
                        reserved but free, which expandable segments cannot return
                        (no whole 20 MiB page is free)
  forward_holes_combined.pickle  the same with 6 holes: no single fix is enough,
                        checkpointing + expandable segments together are
  forward_holes_context_state.pickle  forward_holes_combined's run recorded with
                        context="state": the empty_cache() call is not seen, and
                        the replay under its own settings fails one request early
  rounding_waste_oom.pickle  30 tensors of 10 MiB + 2 KiB, each in a 12 MiB
                        segment, then a 24 MiB request under the cap: expandable
                        segments pack them and the request fits
  rounding_waste_second_iteration.pickle  the same waste kept by the script,
                        then the second iteration's forward out of memory:
                        expandable segments serve the whole forward (the first
                        fix, fragmentation the first verdict)
  frameless_optimizer_oom.pickle  optimizer_oom's run without frames, torch.optim's
                        step mark (Optimizer.step#AdamW.step) kept; _unmarked: none
  tagged_step_oom.pickle  compiled_step_oom's run tagged by user metadata
                        ("load", "train step N") and compile region (the
                        forward in "Torch-Compiled Region: 0/0")
  cudagraph_pool_oom.pickle  torch.compile(mode="reduce-overhead"): eager code
                        out of memory with 64 MiB free in the CUDA graph's private
                        pool, which it cannot use; cudagraph_capture_oom.pickle the
                        recording itself out of memory
  cudagraph_fragmentation_oom.pickle  the default pool fragmented beside a CUDA
                        graph's pool with 64 MiB free: expandable_segments not
                        enough, since the graph keeps its pool
  compare_seq_1x.pickle, compare_seq_2x.pickle  a Llama-like forward whose
                        sequence doubles: activations x2, modeling_llama.py:161
                        grows most
  compare_before_step.pickle, compare_after_step.pickle  one step before and
                        after AdamW's first step: 64 MiB of optimizer state appear
  oomtune_trial_oom.pickle  an oomtune CUDA trial's snapshot: no frames, its
                        phases marked (external_annotations "oomtune:<phase>"),
                        out of memory in the first AdamW step;
                        oomtune_trial_oom_unmarked.pickle the same without marks
  two_devices.pickle    one process on two GPUs: leak.pickle's run on device 0,
                        optimizer_oom.pickle's on device 1
  hf_bert_checkpointed_flash_oom.pickle  hf_bert_forward_oom's run with gradient
                        checkpointing and flash-attn's Function in forward
  hf_bert_checkpointed_recompute_oom.pickle  the same fine-tuning checkpointed,
                        out of memory in backward recomputing the last layer
  hf_bert_checkpointed_recompute_tied_oom.pickle  the same with a masked-LM
                        head's tied embedding gradient: out of memory earlier in
                        the recomputation, with most of the block still to come
  hf_bert_checkpointed_backward_oom.pickle  that run with half the micro-batch:
                        out of memory in the third layer's backward, after two
                        layers' recomputation and backward
  hf_bert_backward_oom.pickle  the same fine-tuning without checkpointing, at
                        an eighth of the micro-batch (its weights' gradients
                        outgrow the activations each layer's backward frees):
                        out of memory at the first layer's backward
  hf_llama_generate_oom.pickle  Hugging Face generate() (torch.no_grad) out of
                        memory in a Llama's prefill: the KV cache and an eager
                        attention's probabilities
  hf_llama_no_grad_oom.pickle  the same forward called by a script in a
                        `with torch.no_grad():` block (no frame says so)
  hf_gpt2_eval_outputs_oom.pickle  Hugging Face Trainer.evaluate() out of memory
                        concatenating a language model's logits of every step
                        on the device (no eval_accumulation_steps)
  hf_gpt2_eval_forward_oom.pickle  the same evaluation under a 160 MiB cap: out
                        of memory in the first step's cross-entropy
  compiled_step_oom.pickle  a torch.compile'd model (inductor's generated code)
                        out of memory in its second forward
  backward_peak_stacks_all.pickle, hf_bert_forward_oom_stacks_all.pickle  those
                        runs recorded with stacks="all": C++ frames around the
                        Python ones, the autograd engine's where there were none
  cnn_caught_oom.pickle  a CNN's forward under a 256 MiB cap: a convolution's
                        112 MiB cuDNN workspace finds no room, the out-of-memory
                        error is caught (cuDNN runs an engine with a 2 MiB
                        workspace) and the step runs to its end
  cnn_caught_then_fatal_oom.pickle  the same forward, then a 64 MiB
                        convolution output that does not fit ends the run
  malicious_global.pickle   GLOBAL os.system + REDUCE (must be refused)
  malicious_reduce.pickle   REDUCE alone
  bad_truncated.pickle, bad_memo.pickle, bad_length.pickle, bad_nesting.pickle,
  bad_type.pickle (segments[1].blocks[0].size is a str)
"""

import copy
import os
import pickle
import sys

from caching_allocator_rules import (K_LARGE_BUFFER, K_MIN_BLOCK, K_SMALL_BUFFER, K_SMALL_SIZE,
                                     allocation_size, round_size)

KIB = 1 << 10
MIB = 1 << 20

TORCH = "/usr/lib/python3/dist-packages/torch"
USER = "/home/user/train.py"


def frame(filename, name, line):
    return {"filename": filename, "name": name, "line": line}


def fwd(line):
    """Frames of an op inside the model's forward at train.py:line."""
    return [frame(f"{TORCH}/nn/modules/linear.py", "forward", 116),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
            frame(USER, "forward", line),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
            frame(USER, "train_step", 40),
            frame(USER, "main", 90)]


def opt_frames():
    return [frame(f"{TORCH}/optim/adamw.py", "_init_group", 120),
            frame(f"{TORCH}/optim/adamw.py", "step", 170),
            frame(USER, "train_step", 44),
            frame(USER, "main", 90)]


def param_frames():
    return [frame(f"{TORCH}/nn/modules/module.py", "_apply", 797),
            frame(f"{TORCH}/nn/modules/module.py", "to", 1145),
            frame(USER, "main", 80)]


def user_frames(line):
    return [frame(USER, "main", line)]


def empty_cache_frames(line):
    """The stack torch.cuda.empty_cache() records on its segment_free events
    (emptyCache gathers the caller's context; torch 2.11's memory.py calls
    torch._C._cuda_emptyCache() at line 224)."""
    return [frame(f"{TORCH}/cuda/memory.py", "empty_cache", 224)] + user_frames(line)


# A Hugging Face fine-tuning run as PyTorch 2.11 records it with
# stacks="python": the user's project and its virtual environment sit in a
# folder named `torch` (issue #48), the Trainer calls the model, the model's
# layers are transformers' modeling_bert.py (line numbers of transformers
# 4.57's BertSelfAttention, BertIntermediate, BertOutput, BertLayer,
# BertEncoder, BertModel, BertForSequenceClassification forwards).
HF_USER = "/home/user/torch/finetune.py"
HF_VENV = "/home/user/torch/.venv/lib/python3.11/site-packages"
HF_TORCH = f"{HF_VENV}/torch"
HF_BERT = f"{HF_VENV}/transformers/models/bert/modeling_bert.py"
HF_TRAINER = f"{HF_VENV}/transformers/trainer.py"


def hf_call():
    """torch's Module.__call__ between two modules."""
    return [frame(f"{HF_TORCH}/nn/modules/module.py", "_call_impl", 1784),
            frame(f"{HF_TORCH}/nn/modules/module.py", "_wrapped_call_impl", 1773)]


def hf_outer():
    """From BertLayer out to the script: encoder, model, head, Trainer, finetune.py, runpy."""
    return (hf_call() + [frame(f"{HF_VENV}/transformers/modeling_layers.py", "__call__", 94),
                         frame(HF_BERT, "forward", 657)] + hf_call() +
            [frame(HF_BERT, "forward", 1008)] + hf_call() +
            [frame(HF_BERT, "forward", 1493)] + hf_call() +
            [frame(f"{HF_VENV}/accelerate/utils/operations.py", "forward", 819),
             frame(HF_TRAINER, "compute_loss", 4071),
             frame(HF_TRAINER, "training_step", 4009),
             frame(HF_TRAINER, "_inner_training_loop", 2674),
             frame(HF_TRAINER, "train", 2325),
             frame(HF_USER, "main", 61),
             frame(HF_USER, "<module>", 66),
             frame("/usr/lib/python3.11/runpy.py", "_run_code", 88),
             frame("/usr/lib/python3.11/runpy.py", "_run_module_as_main", 198)])


def hf_op(torch_file, torch_fn, torch_line, bert_line, via_layer=None):
    """An op in a BertLayer: torch's frames, then modeling_bert.py:bert_line
    (inside BertLayer at via_layer when the op is in a submodule)."""
    inner = [frame(f"{HF_TORCH}/{torch_file}", torch_fn, torch_line)]
    if torch_file != "nn/functional.py":
        inner += hf_call()
    inner.append(frame(HF_BERT, "forward", bert_line))
    if via_layer is not None:
        inner += hf_call() + [frame(HF_BERT, "forward", via_layer)]
    return inner + hf_outer()


# model.to("cuda") in finetune.py:48: the 4 layers' 24 MiB of weights each.
HF_LOAD = [frame(f"{HF_TORCH}/nn/modules/module.py", "_apply", 1355),
           frame(f"{HF_TORCH}/nn/modules/module.py", "to", 1369),
           frame(f"{HF_VENV}/transformers/modeling_utils.py", "to", 4343),
           frame(HF_USER, "main", 48),
           frame(HF_USER, "<module>", 66)]


def hf_bert_forward_oom():
    """BERT-like fine-tuning (4 layers of 24 MiB weights, moved to the GPU by
    finetune.py:48), out of memory in the forward of the second layer's
    BertIntermediate (modeling_bert.py:466, its dense projection to 4 x
    hidden): each layer keeps q, k, v (8 MiB each), the attention
    probabilities (32 MiB), the intermediate (32 MiB) and the output (8 MiB)
    for backward; under the 300 MiB cap, 272 MiB are reserved when the second
    intermediate asks for its 32 MiB segment."""
    sim = Sim(cap=300 * MIB)
    [sim.malloc(24 * MIB, HF_LOAD) for _ in range(4)]
    try:
        for _ in range(4):
            for line in (329, 330, 331):  # query, key, value (BertSelfAttention)
                sim.malloc(8 * MIB, hf_op("nn/modules/linear.py", "forward", 134, line, via_layer=598))
            sim.malloc(32 * MIB, hf_op("nn/functional.py", "softmax", 2140, 360, via_layer=598))
            sim.malloc(32 * MIB, hf_op("nn/modules/linear.py", "forward", 134, 466, via_layer=630))
            sim.malloc(8 * MIB, hf_op("nn/modules/linear.py", "forward", 134, 480, via_layer=630))
    except OutOfMemory:
        pass
    return sim


class OutOfMemory(Exception):
    pass


class Sim:
    """The caching allocator, one device; a block serves requests of its
    segment's stream only (get_free_block), and a flush returns every
    stream's wholly free segments."""

    def __init__(self, cap, expandable=False, record_frames=True, device_free=70 << 30):
        self.cap = cap
        self.expandable = expandable
        self.record_frames = record_frames
        self.device_free = device_free  # what CUDA reports free at an oom
        self.segments = []  # {address, size, large, expandable, blocks: [...]}
        self.trace = []
        self.next_address = 0x7F0000000000
        self.time_us = 1_700_000_000_000_000
        self.recording = True
        self.annotations = []  # external_annotations (v2_11)
        # What the next events record as compile_context and user_metadata
        # (v2_11): PyTorch's "N/A" and "" unless a scenario sets them.
        self.compile_context = "N/A"
        self.user_metadata = ""
        # The memory pool the next requests target (segment_pool_id): (0, 0)
        # the default one; another, a CUDA graph's private pool while it is
        # recorded (torch.cuda.graph, CUDA graph trees).
        self.pool = (0, 0)
        # The CUDA stream the next requests are made on (cudaStream_t as an
        # integer): 0, the default stream, unless a scenario sets a side
        # stream's (torch.cuda.stream(s)).
        self.stream = 0

    def reserved(self):
        return sum(s["size"] for s in self.segments)

    def event(self, action, addr, size, frames, device_free=None, stream=None):
        """A trace entry; `stream` the block's or segment's (free and
        segment events record it), else the current one."""
        if not self.recording:
            return
        self.time_us += 7
        e = {"action": action, "size": size, "stream": self.stream if stream is None else stream,
             "time_us": self.time_us,
             "frames": frames if self.record_frames else []}
        if action == "oom":
            e["device_free"] = device_free
        else:
            e["addr"] = addr
        e["_tags"] = (self.compile_context, self.user_metadata)
        self.trace.append(e)

    def mark(self, phase, stage):
        """oomtune's phase mark, as a CUDA trial records it (recordAnnotation
        with name and stage; torch/csrc/cuda/memory_snapshot.cpp adds device
        and time_us)."""
        self.time_us += 7
        self.annotations.append({"name": "oomtune:" + phase, "stage": stage, "device": 0,
                                 "time_us": self.time_us})

    def record_function(self, name, stage):
        """A record_function mark the allocator's history keeps (PyTorch
        2.11's recordings hold torch.optim's "Optimizer.step#AdamW.step"
        START and END with device and time_us)."""
        self.time_us += 7
        self.annotations.append({"stage": stage, "name": name, "device": 0, "time_us": self.time_us})

    def _new_segment(self, size, large, frames):
        while self.reserved() + size > self.cap:
            # release_cached_blocks: the default pool's free segments (a live
            # graph keeps its private pool's)
            empty = [s for s in self.segments
                     if all(not b["allocated"] for b in s["blocks"]) and s.get("pool", (0, 0)) == (0, 0)]
            if not empty:
                return None
            s = empty[0]
            self.segments.remove(s)
            self.event("segment_free", s["address"], s["size"], frames, stream=s["stream"])
        seg = {"address": self.next_address, "size": size, "large": large, "expandable": False,
               "stream": self.stream, "frames": frames,
               "blocks": [{"address": self.next_address, "size": size, "requested": 0, "allocated": False,
                           "frames": []}]}
        if self.pool != (0, 0):
            seg["pool"] = self.pool
        self.next_address += size + (64 << 20)
        self.segments.append(seg)
        self.event("segment_alloc", seg["address"], size, frames)
        return seg

    def empty_cache(self, frames):
        """torch.cuda.empty_cache(): every cached segment with no live block
        goes back to CUDA. frames None: recorded with context="state", each
        segment_free carries the segment's allocation stack (release_block:
        context ? context : context_when_segment_allocated; with "alloc"
        that is empty too)."""
        for seg in [s for s in self.segments if all(not b["allocated"] for b in s["blocks"])]:
            self.segments.remove(seg)
            self.event("segment_free", seg["address"], seg["size"], seg["frames"] if frames is None else frames,
                       stream=seg["stream"])

    def _expand(self, large, needed, frames):
        page = K_LARGE_BUFFER if large else K_SMALL_BUFFER
        seg = next((s for s in self.segments if s["large"] == large and s["stream"] == self.stream), None)
        if seg is None:
            seg = {"address": self.next_address, "size": 0, "large": large, "expandable": True,
                   "stream": self.stream, "frames": frames, "blocks": []}
            self.next_address += 1 << 36
            self.segments.append(seg)
        tail = seg["blocks"][-1] if seg["blocks"] and not seg["blocks"][-1]["allocated"] else None
        missing = needed - (tail["size"] if tail else 0)
        size = (missing + page - 1) // page * page
        if self.reserved() + size > self.cap:
            return None
        start = seg["address"] + seg["size"]
        seg["size"] += size
        self.event("segment_map", start, size, frames)
        if tail:
            tail["size"] += size
        else:
            seg["blocks"].append({"address": start, "size": size, "requested": 0, "allocated": False,
                                  "frames": []})
        return seg

    def malloc(self, requested, frames):
        rounded = round_size(requested)
        large = requested > K_SMALL_SIZE
        best = None
        for s in self.segments:
            if s["large"] != large or s.get("pool", (0, 0)) != self.pool or s["stream"] != self.stream:
                continue
            for i, b in enumerate(s["blocks"]):
                if not b["allocated"] and b["size"] >= rounded and (best is None or b["size"] < best[2]["size"]):
                    best = (s, i, b)
        if best is None:
            seg = self._expand(large, rounded, frames) if self.expandable else \
                self._new_segment(allocation_size(rounded), large, frames)
            if seg is None:
                self.event("oom", 0, requested, frames, device_free=self.device_free)
                raise OutOfMemory(requested)
            return self.malloc_after_growth(requested, frames)
        seg, i, b = best
        remaining = b["size"] - rounded
        split = remaining >= K_MIN_BLOCK if (not large or seg["expandable"]) else remaining > K_SMALL_SIZE
        if split:
            rest = {"address": b["address"] + rounded, "size": remaining, "requested": 0, "allocated": False,
                    "frames": []}
            b["size"] = rounded
            seg["blocks"].insert(i + 1, rest)
        b["allocated"] = True
        b["requested"] = requested
        b["frames"] = frames if self.record_frames else []
        self.event("alloc", b["address"], requested, frames)
        return b["address"]

    def malloc_after_growth(self, requested, frames):
        return self.malloc(requested, frames)

    def free(self, address, frames):
        for s in self.segments:
            for i, b in enumerate(s["blocks"]):
                if b["address"] == address and b["allocated"]:
                    self.event("free_requested", address, b["requested"], frames, stream=s["stream"])
                    self.event("free_completed", address, b["requested"], frames, stream=s["stream"])
                    b["allocated"] = False
                    b["requested"] = 0
                    b["frames"] = []
                    # merge with free neighbours
                    if i + 1 < len(s["blocks"]) and not s["blocks"][i + 1]["allocated"]:
                        b["size"] += s["blocks"].pop(i + 1)["size"]
                    if i > 0 and not s["blocks"][i - 1]["allocated"]:
                        s["blocks"][i - 1]["size"] += s["blocks"].pop(i)["size"]
                    return
        raise KeyError(address)

    # ---- the dump, per layout
    def dump(self, layout, settings=None):
        segments = []
        for s in sorted(self.segments, key=lambda s: s["address"]):
            allocated = sum(b["size"] for b in s["blocks"] if b["allocated"])
            requested = sum(b["requested"] for b in s["blocks"] if b["allocated"])
            seg = {"device": 0, "address": s["address"], "total_size": s["size"], "allocated_size": allocated,
                   "active_size": allocated, "requested_size": requested, "stream": s["stream"],
                   "segment_type": "large" if s["large"] else "small"}
            if layout not in ("v1_13", "v2_0"):
                seg["segment_pool_id"] = s.get("pool", (0, 0))
                seg["is_expandable"] = s["expandable"]
                seg["frames"] = s["frames"] if self.record_frames else []
            blocks = []
            for b in s["blocks"]:
                state = "active_allocated" if b["allocated"] else "inactive"
                if layout in ("v1_13", "v2_0"):
                    block = {"size": b["size"], "state": state}
                    if layout == "v2_0":
                        block["requested_size"] = b["requested"]
                    if b["allocated"]:
                        block["history"] = [{"addr": b["address"], "real_size": b["requested"],
                                             "frames": b["frames"]}]
                else:
                    block = {"address": b["address"], "size": b["size"], "requested_size": b["requested"],
                             "state": state, "frames": b["frames"]}
                blocks.append(block)
            seg["blocks"] = blocks
            segments.append(seg)
        if layout == "v1_13":
            return segments
        trace = []
        for e in self.trace:
            e = dict(e)
            compile_context, user_metadata = e.pop("_tags")
            if layout in ("v2_0", "v2_1"):
                del e["time_us"]
            if layout == "v2_11":
                e["compile_context"] = compile_context
                e["user_metadata"] = user_metadata
            trace.append(e)
        out = {"segments": segments, "device_traces": [trace]}
        if layout in ("v2_4", "v2_11"):
            out["allocator_settings"] = settings or {
                "PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                "expandable_segments": self.expandable,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
        if layout == "v2_11":
            out["external_annotations"] = list(self.annotations)
        return out


# ---------------------------------------------------------------- scenarios

def fragmentation():
    """Pairs of 9.5 MiB tensors fill 20 MiB segments up to a 400 MiB cap; one
    of each pair is freed; a 64 MiB request fails (the real
    oom_fragmentation.pickle, scaled down)."""
    sim = Sim(cap=400 * MIB)
    kept = []
    for i in range(20):
        a = sim.malloc(9 * MIB + MIB // 2, user_frames(10))
        b = sim.malloc(9 * MIB + MIB // 2, user_frames(10))
        kept.append((a, b))
    for a, b in kept:
        sim.free(b, user_frames(12))
    try:
        sim.malloc(64 * MIB, user_frames(14))
    except OutOfMemory:
        pass
    return sim


def training_step(sim, n_layers, act_bytes, param_addrs, grads, keep=None, opt_state=None, fail_in=None,
                  param_bytes=8 * MIB, step_mark=None):
    """One iteration: forward keeps activations, backward (no frames, C++
    thread) frees them and makes gradients, then the optimizer."""
    acts = []
    for layer in range(n_layers):
        acts.append(sim.malloc(act_bytes, fwd(20 + layer % 3)))
        tmp = sim.malloc(act_bytes // 2, fwd(25))
        sim.free(tmp, fwd(25))
    loss = sim.malloc(4096, user_frames(41))
    if keep is not None:
        keep.append(loss)  # the leak: the loss and its graph stay alive
        keep.extend(acts[:2])
        acts = acts[2:]
    else:
        sim.free(loss, user_frames(41))
    # backward: gradients (first step only), frees activations
    for layer in reversed(range(n_layers)):
        if fail_in == "backward":
            sim.malloc(act_bytes * 6, [])
        if len(grads) < len(param_addrs):
            grads.append(sim.malloc(param_bytes, []))
        tmp = sim.malloc(act_bytes, [])
        sim.free(tmp, [])
        if layer < len(acts):
            sim.free(acts[layer], [])
    for a in acts[len(acts):]:
        sim.free(a, [])
    while len(grads) < len(param_addrs):  # every parameter has its gradient before the step
        grads.append(sim.malloc(param_bytes, []))
    if opt_state is not None:
        if step_mark:  # torch.optim's record_function around Optimizer.step
            sim.record_function(f"Optimizer.step#{step_mark}.step", "START")
        try:
            if not opt_state:
                for p in param_addrs:
                    opt_state.append(sim.malloc(param_bytes, opt_frames()))
                    opt_state.append(sim.malloc(param_bytes, opt_frames()))
        finally:  # record_function's __exit__ marks the END as the error leaves the step
            if step_mark:
                sim.record_function(f"Optimizer.step#{step_mark}.step", "END")


def leak():
    sim = Sim(cap=8 << 30)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads, state, kept = [], [], []
    for _ in range(6):
        training_step(sim, 4, 12 * MIB, params, grads, keep=kept, opt_state=state)
    return sim


def optimizer_oom():
    # No cap: the 220 MiB are the device; 6 MiB stay free for the context.
    sim = Sim(cap=220 * MIB, device_free=6 * MIB)
    params = [sim.malloc(12 * MIB, param_frames()) for _ in range(6)]
    grads, state = [], []
    try:
        training_step(sim, 3, 12 * MIB, params, grads, opt_state=state, param_bytes=12 * MIB)
    except OutOfMemory:
        pass
    return sim


def frameless_optimizer_oom(class_name="AdamW"):
    """optimizer_oom's run recorded without frames
    (_record_memory_history(context=None)), torch.optim's step mark
    "Optimizer.step#<class_name>.step" kept (its END as the error left
    the step): its first step allocates 5 states of 12 MiB, the 6th
    fails; without the mark (class_name None)
    those are frameless events after the forward, read as backward."""
    sim = Sim(cap=220 * MIB, device_free=6 * MIB, record_frames=False)
    params = [sim.malloc(12 * MIB, param_frames()) for _ in range(6)]
    grads, state = [], []
    try:
        training_step(sim, 3, 12 * MIB, params, grads, opt_state=state, param_bytes=12 * MIB, step_mark=class_name)
    except OutOfMemory:
        pass
    assert len(state) == 5, len(state)
    return sim


def backward_peak():
    sim = Sim(cap=300 * MIB)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads = []
    try:
        training_step(sim, 4, 16 * MIB, params, grads, fail_in="backward")
    except OutOfMemory:
        pass
    return sim


def expandable():
    sim = Sim(cap=400 * MIB, expandable=True)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads = []
    try:
        training_step(sim, 30, 16 * MIB, params, grads)
    except OutOfMemory:
        pass
    return sim


def missing_frames():
    sim = Sim(cap=8 << 30, record_frames=False)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads, state = [], []
    training_step(sim, 3, 4 * MIB, params, grads, opt_state=state)
    return sim


# ---------------------------------------------------------------- enough or not (issue #48 part 2)
# Each scenario is built so that what the failing phase still needed and what
# each fix frees are known by construction (the numbers in the docstrings).

def small_pool_holes(sim, pairs):
    """`pairs` 2 MiB small-pool segments, each holding two 1 MiB tensors, one
    of which is freed: `pairs` MiB reserved but free in 1 MiB holes."""
    both = [(sim.malloc(MIB, user_frames(30)), sim.malloc(MIB, user_frames(30))) for _ in range(pairs)]
    for _, b in both:
        sim.free(b, user_frames(31))
    return [a for a, _ in both]


def adamw_first_step_oom():
    """The issue's case: the first AdamW step runs out of memory with 42 MiB
    reserved but free in small blocks.
    8 parameters of 32 MiB (256 MiB), their 8 gradients (256 MiB), 42 MiB free
    in 1 MiB holes of the small pool; the forward's 8 x 16 MiB activations are
    freed in backward and their cached segments released at the cap (800 MiB).
    AdamW allocates two 32 MiB states per parameter: 6 fit (192 MiB), the 7th
    fails. Still needed: 2 x 256 - 192 = 320 MiB. 8-bit AdamW frees 75% of 512
    = 384 MiB: enough; offload frees 512 MiB: enough; expandable_segments
    frees the 42 MiB: not enough alone (fragmentation is not the first
    verdict)."""
    sim = Sim(cap=800 * MIB)
    params = [sim.malloc(32 * MIB, param_frames()) for _ in range(8)]
    small_pool_holes(sim, 42)
    acts = [sim.malloc(16 * MIB, fwd(20)) for _ in range(8)]
    grads = []
    for a in reversed(acts):  # backward, from the autograd engine's thread: no frames
        grads.append(sim.malloc(32 * MIB, []))
        sim.free(a, [])
    try:
        for _ in params:
            sim.malloc(32 * MIB, opt_frames())
            sim.malloc(32 * MIB, opt_frames())
    except OutOfMemory:
        pass
    return sim


def forward_second_iteration(holes, call_frames=True):
    """Two iterations; the second's forward runs out of memory, with `holes`
    10.5 MiB holes (9.5 MiB tensors kept in 20 MiB segments) made between them.
    4 parameters of 8 MiB (two 20 MiB segments, 4 MiB free in each); each
    forward keeps 7 blocks of 24 MiB (each its own 24 MiB segment); backward
    frees them and makes 4 gradients of 8 MiB (one 20 MiB segment, 4 MiB
    free, and a freed 24 MiB block of the forward, 8 MiB free). Between the
    iterations the script calls torch.cuda.empty_cache() and keeps one 9.5 MiB
    tensor of each pair; the cap, reserved + 24 MiB, then lets exactly one
    24 MiB block of the second forward in, and the second fails.
    Still needed (trace: the first forward grew by 7 x 24 = 168 MiB, the
    second by 24 MiB when it failed): 144 MiB. Reserved but free at the oom:
    holes x 10.5 + 4 + 4 + 4 + 8 MiB. Activation checkpointing frees 83% of
    (24 alive + 144 to come) = 139.44 MiB; half the micro-batch frees 84 MiB.
    14 holes: 167 MiB free, more than the need, but no 20 MiB page of an
    expandable segment is wholly free: replayed with expandable_segments the
    forward still fails, so fragmentation comes after the forward's verdict;
    6 holes: 83 MiB, nothing alone is enough, checkpointing + expandable
    segments together are (222.44 MiB). call_frames False: the
    empty_cache() call recorded without its stack (context="state"), so a
    replay cannot tell it from the allocator's own flush."""
    sim = Sim(cap=400 * MIB)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads = []

    def forward_and_backward():
        acts = [sim.malloc(24 * MIB, fwd(20 + b % 3)) for b in range(7)]
        for a in reversed(acts):
            if len(grads) < len(params):
                grads.append(sim.malloc(8 * MIB, []))
            sim.free(a, [])

    forward_and_backward()
    sim.empty_cache(empty_cache_frames(59) if call_frames else None)
    pairs = [(sim.malloc(9 * MIB + MIB // 2, user_frames(60)), sim.malloc(9 * MIB + MIB // 2, user_frames(60)))
             for _ in range(holes)]
    for _, b in pairs:
        sim.free(b, user_frames(61))
    sim.cap = sim.reserved() + 24 * MIB
    try:
        forward_and_backward()
    except OutOfMemory:
        pass
    return sim


def rounding_waste_oom():
    """Tensors of 10 MiB + 2 KiB, all kept, in the forward at train.py:20:
    each is its own block of 10 MiB + 2 KiB (round_size rounds to 512 B), in
    a 12 MiB segment (requests of 10 MiB or more get segments rounded up to
    2 MiB), and the 2 MiB - 2 KiB left over is split off free. 30 of them
    reserve 360 MiB with 59.94 MiB free in 30 pieces; under a 370 MiB cap a
    24 MiB request needs a new segment and fails: fragmentation. With
    expandable_segments the same tensors sit back to back: 300.06 MiB in 16
    pages of 20 MiB (320 MiB); the 24 MiB request extends the last free
    block to 324.06 MiB, 17 pages, 340 MiB, below the 360 MiB the trace
    reached: defragmenting is enough, whatever the cap."""
    sim = Sim(cap=370 * MIB)
    [sim.malloc(10 * MIB + 2048, fwd(20)) for _ in range(30)]
    try:
        sim.malloc(24 * MIB, fwd(21))
    except OutOfMemory:
        pass
    return sim


def rounding_waste_second_iteration():
    """The second iteration's forward out of memory among rounding waste.
    The first forward keeps 3 blocks of 24 MiB at train.py:21 (each its own
    24 MiB segment: it grows by 72 MiB), backward (frameless) frees them and
    the script calls torch.cuda.empty_cache(). The script then keeps 30
    tensors of 10 MiB + 2 KiB (train.py:60), each in a 12 MiB segment with
    2 MiB - 2 KiB split off free: 360 MiB reserved, 59.94 MiB of it free in
    30 pieces. The cap, reserved + 24 MiB, lets the second forward's first
    block in and fails its second: fragmentation. Still needed (trace: the
    first forward grew by 72 MiB, this one by 24 MiB): 48 MiB. With
    expandable segments the 30 tensors sit back to back, 300.06 MiB in 16
    pages of 20 MiB; the forward's three blocks extend the last free block to
    372.06 MiB, 19 pages, 380 MiB, under the 384 MiB cap: defragmenting
    serves the whole forward at no cost, so it is the first fix and
    fragmentation the first verdict. Activation checkpointing frees 83% of
    (24 alive + 48 to come) = 59.76 MiB: enough too, at a higher cost; half
    the micro-batch, 12 + 24 = 36 MiB, is not."""
    sim = Sim(cap=1024 * MIB)

    def forward():
        return [sim.malloc(24 * MIB, fwd(21)) for _ in range(3)]

    for a in reversed(forward()):
        sim.free(a, [])
    sim.empty_cache(empty_cache_frames(59))
    for _ in range(30):
        sim.malloc(10 * MIB + 2048, user_frames(60))
    sim.cap = sim.reserved() + 24 * MIB
    try:
        forward()
    except OutOfMemory:
        pass
    return sim


# ---------------------------------------------------------------- pairs to compare (issue #48 part 3)

LLAMA = "/opt/venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py"
LLAMA_TORCH = "/opt/venv/lib/python3.12/site-packages/torch"


def llama_op(line, via):
    """An op at modeling_llama.py:line inside a decoder layer (modeling_llama.py:via), called from train.py:30."""
    call = [frame(f"{LLAMA_TORCH}/nn/modules/module.py", "_call_impl", 1784)]
    return ([frame(f"{LLAMA_TORCH}/nn/modules/linear.py", "forward", 134)] + call +
            [frame(LLAMA, "forward", line)] + call + [frame(LLAMA, "forward", via)] + call +
            [frame(LLAMA, "forward", 450)] + call + [frame(USER, "main", 30)])


def llama_forward(seq_mib):
    """A 4-layer Llama-like forward recorded until its end (no oom: compared at
    its peak). Each layer keeps q, k, v (seq_mib MiB each, modeling_llama.py
    :264-266), the attention output (seq_mib, :287) and the MLP's gate and up
    projections (3 x seq_mib each, :161): 10 x seq_mib per layer, 40 x seq_mib
    in all. The 4 x 16 MiB weights are the same whatever the sequence.
    seq_mib 4 -> 8: activations 160 -> 320 MiB (x2), :161 grows 96 -> 192 MiB."""
    sim = Sim(cap=8 << 30)
    [sim.malloc(16 * MIB, param_frames()) for _ in range(4)]
    for _ in range(4):
        for line in (264, 265, 266):
            sim.malloc(seq_mib * MIB, llama_op(line, 320))
        sim.malloc(seq_mib * MIB, llama_op(287, 320))
        sim.malloc(3 * seq_mib * MIB, llama_op(161, 335))
        sim.malloc(3 * seq_mib * MIB, llama_op(161, 335))
    return sim


def first_step(take_step):
    """One training step of 4 parameters of 8 MiB, recorded to its peak.
    The forward keeps 4 x 24 MiB; backward frees each block's activations
    before making its gradient, so the peak is the end of a forward.
    take_step=False: dumped after backward (peak: the first forward, no
    optimizer state). take_step=True: AdamW's step makes 2 states per
    parameter (8 x 8 MiB = 64 MiB), zero_grad(set_to_none) frees the
    gradients, and the second forward's end is the peak: the two peaks differ
    by the 64 MiB of optimizer state alone."""
    sim = Sim(cap=8 << 30)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]

    def forward_backward():
        acts = [sim.malloc(24 * MIB, fwd(20 + b % 3)) for b in range(4)]
        grads = []
        for a in reversed(acts):
            sim.free(a, [])
            grads.append(sim.malloc(8 * MIB, []))
        return grads

    grads = forward_backward()
    if take_step:
        for _ in params:
            sim.malloc(8 * MIB, opt_frames())
            sim.malloc(8 * MIB, opt_frames())
        for g in grads:
            sim.free(g, [frame(f"{TORCH}/optim/optimizer.py", "zero_grad", 980), frame(USER, "train_step", 46)])
        for _ in range(4):
            sim.malloc(24 * MIB, fwd(20))
    return sim


def oomtune_trial_oom(marked=True):
    """An oomtune CUDA trial (C++: no frames on any event) whose first AdamW
    step runs out of memory under a 200 MiB cap: 4 parameters of 16 MiB
    loaded, 4 activations of 12 MiB kept by forward, a 4 KiB loss, backward
    frees each activation after making its 16 MiB gradient, then the
    optimizer's two 16 MiB states per parameter. Its phases are marked as
    the trial marks them (marked=False: the same trace without the marks)."""
    sim = Sim(cap=200 * MIB, record_frames=False)
    mark = sim.mark if marked else (lambda phase, stage: None)
    mark("load", "START")
    params = [sim.malloc(16 * MIB, []) for _ in range(4)]
    mark("load", "END")
    mark("forward", "START")
    acts = [sim.malloc(12 * MIB, []) for _ in range(4)]
    mark("forward", "END")
    mark("loss", "START")
    loss = sim.malloc(4096, [])
    mark("loss", "END")
    mark("backward", "START")
    grads = []
    for a in reversed(acts):
        grads.append(sim.malloc(16 * MIB, []))
        sim.free(a, [])
    sim.free(loss, [])
    mark("backward", "END")
    mark("optimizer", "START")
    state = []
    try:
        for _ in params:
            state.append(sim.malloc(16 * MIB, []))
            state.append(sim.malloc(16 * MIB, []))
    except OutOfMemory:
        pass
    return sim


def two_devices(on_0, on_1):
    """One process that drives two GPUs (Accelerate's device_map="auto",
    pipeline stages): _snapshot() gives every device's segments in one list,
    each marked with its device, and one trace per device
    (torch/csrc/cuda/memory_snapshot.cpp). Device 0 leaks, device 1 runs out
    of memory in the optimizer step: each diagnosed alone must read as its
    own single-device file."""
    out = on_0.dump("v2_11")
    second = on_1.dump("v2_11")
    for seg in second["segments"]:
        seg["device"] = 1
    for a in second["external_annotations"]:
        a["device"] = 1
    out["segments"] += second["segments"]
    out["device_traces"] = [out["device_traces"][0], second["device_traces"][0]]
    out["external_annotations"] += second["external_annotations"]
    return out


def conv_frames(line):
    """A convolution at train.py:line in the model's forward: torch's
    Conv2d._conv_forward, where cuDNN allocates the output and then its
    workspace (aten/src/ATen/native/cudnn/Conv_v8.cpp)."""
    return [frame(f"{TORCH}/nn/modules/conv.py", "_conv_forward", 549),
            frame(f"{TORCH}/nn/modules/conv.py", "forward", 554),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
            frame(USER, "forward", line),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1501),
            frame(USER, "train_step", 40),
            frame(USER, "main", 90)]


def cnn_caught_oom(fatal):
    """A CNN's forward under a 256 MiB cap (a capped process on an 80 GB GPU):
    64 MiB of weights; six convolutions each allocate a 24 MiB output (kept
    for backward) and then a cuDNN workspace freed before the next request.
    The fourth's first engine wants 112 MiB: with 160 MiB allocated and the
    cached 16 MiB workspace segment released, 272 MiB would pass the cap, so
    the allocator raises out of memory; cuDNN catches it (Conv_v8.cpp
    try_configs) and runs an engine with a 2 MiB workspace. Without `fatal`
    the step then runs to its end: the loss, the backward (frameless, the
    autograd engine's thread: each output freed as a 16 MiB weight gradient
    is made) and the dump. With `fatal` a seventh convolution's 64 MiB output
    does not fit (208 MiB allocated, 228 reserved: with the cached 20 MiB
    workspace segment released, 272 MiB would pass the cap) and the error
    ends the run, its outputs freed as it unwinds."""
    sim = Sim(cap=256 * MIB)
    weights = [sim.malloc(16 * MIB, param_frames()) for _ in range(4)]
    outputs = []
    for i in range(6):
        at = conv_frames(20 + i)
        outputs.append(sim.malloc(24 * MIB, at))
        try:
            workspace = sim.malloc((112 if i == 3 else 16) * MIB, at)
        except OutOfMemory:
            workspace = sim.malloc(2 * MIB, at)
        sim.free(workspace, at)
    if fatal:
        try:
            sim.malloc(64 * MIB, conv_frames(26))
        except OutOfMemory:
            for out in reversed(outputs):
                sim.free(out, user_frames(95))
        return sim
    loss = sim.malloc(512, user_frames(41))
    grads = []
    for out in reversed(outputs):
        if len(grads) < len(weights):
            grads.append(sim.malloc(16 * MIB, []))
        sim.free(out, [])
    sim.free(loss, user_frames(42))
    return sim


def with_frames_mapped(dump, fn, allocated_blocks_only=False):
    """A copy of a v2_11 dump with every frames list (segments', blocks',
    trace events') replaced by fn(frames): the same run, recorded with
    other stacks. Free blocks keep theirs where allocated_blocks_only."""
    dump = copy.deepcopy(dump)
    for seg in dump["segments"]:
        seg["frames"] = fn(seg["frames"])
        for b in seg["blocks"]:
            if b["state"] == "active_allocated" or not allocated_blocks_only:
                b["frames"] = fn(b["frames"])
    for e in dump["device_traces"][0]:
        e["frames"] = fn(e["frames"])
    return dump


# Gradient checkpointing and a custom autograd.Function in forward, as
# PyTorch 2.11 records their frames (sys.setprofile on the CPU): transformers'
# GradientCheckpointingLayer.__call__ (modeling_layers.py) calls
# torch.utils.checkpoint.checkpoint (behind dynamo's disable wrapper), which
# calls the layer; flash-attn's flash_attn_func calls FlashAttnFunc.apply
# (torch/autograd/function.py Function.apply). Both run in forward.
CHECKPOINT_FWD = [frame(f"{HF_TORCH}/utils/checkpoint.py", "checkpoint", 512),
                  frame(f"{HF_TORCH}/_dynamo/eval_frame.py", "_fn", 1263),
                  frame(f"{HF_TORCH}/_compile.py", "inner", 54)]
FLASH = f"{HF_VENV}/flash_attn/flash_attn_interface.py"
FLASH_FWD = [frame(FLASH, "_flash_attn_forward", 91), frame(FLASH, "forward", 839),
             frame(f"{HF_TORCH}/autograd/function.py", "apply", 596), frame(FLASH, "flash_attn_func", 1201)]


def checkpointed_flash(dump):
    """hf_bert_forward_oom's run with gradient checkpointing on every layer
    and the attention's softmax replaced by flash-attn's Function: the same
    allocations in forward, framed through checkpoint() and Function.apply.
    Its diagnosis must be hf_bert_forward_oom's."""
    def wrap(frames):
        out = []
        for f in frames:
            if f["filename"].endswith("transformers/modeling_layers.py"):
                out += CHECKPOINT_FWD
            if f["filename"] == f"{HF_TORCH}/nn/functional.py" and f["name"] == "softmax":
                out += FLASH_FWD
                continue
            out.append(f)
        return out

    return with_frames_mapped(dump, wrap)


# Recomputation in backward, as PyTorch 2.11 records it on CUDA: the autograd
# engine's device thread unpacks a saved tensor of a checkpoint(use_reentrant=
# False) block, whose unpack hook reruns the block (recompute_fn calls the
# BertLayer through Module.__call__). No user frame: the thread starts in C++.
RECOMPUTE = [frame(f"{HF_TORCH}/utils/checkpoint.py", "recompute_fn", 1607),
             frame(f"{HF_TORCH}/utils/checkpoint.py", "_run_fn_with_dynamo_disabled", 1139),
             frame(f"{HF_TORCH}/_dynamo/eval_frame.py", "_fn", 1263),
             frame(f"{HF_TORCH}/_compile.py", "inner", 54),
             frame(f"{HF_TORCH}/utils/checkpoint.py", "unpack_hook", 1173)]
# A BertLayer's allocations: (bytes, torch file, function, line, modeling_bert.py line, BertLayer line).
BERT_LAYER = [(8 * MIB, "nn/modules/linear.py", "forward", 134, 329, 598),  # query
              (8 * MIB, "nn/modules/linear.py", "forward", 134, 330, 598),  # key
              (8 * MIB, "nn/modules/linear.py", "forward", 134, 331, 598),  # value
              (32 * MIB, "nn/functional.py", "softmax", 2140, 360, 598),   # attention probabilities
              (32 * MIB, "nn/modules/linear.py", "forward", 134, 466, 630),  # intermediate
              (8 * MIB, "nn/modules/linear.py", "forward", 134, 480, 630)]  # output


def bert_backward_oom(cap=256 * MIB, embedding_grad=0, micro_batch_divisor=1, checkpointing=True):
    """hf_bert_forward_oom's fine-tuning with gradient checkpointing on every
    BertLayer (non-reentrant), out of memory in backward while recomputing
    the last layer's forward. Forward: the embeddings' 8 MiB output, then
    each layer allocates its 96 MiB inside checkpoint() and keeps only its
    8 MiB output (the next layer's input). Backward, from the engine's
    thread: the head's 8 MiB gradient, then the unpack hook recomputes the
    last layer. Under the 256 MiB cap its intermediate (modeling_bert.py:466,
    32 MiB) fails: alive are the 96 MiB of weights, 40 MiB of checkpoint
    inputs (the embeddings' output and 4 layer outputs), the head's gradient
    and the recomputed q, k, v and probabilities (56 MiB): 200 MiB allocated,
    240 MiB reserved; the recomputation would reach 240 MiB allocated, 16 MiB
    more than the forward's peak (224 MiB). Activation
    checkpointing is already on, so turning it on frees nothing; the
    recomputed block and the checkpoint inputs scale with the micro-batch.
    (Past the cap, each layer's backward runs as below: caps from 272 MiB
    fail in a gradient instead.)

    With `embedding_grad`, a masked-LM head's backward also makes the gradient
    of the word embeddings tied to its decoder (no frames, on the engine's
    thread), alive through the layers' backward. With 32 MiB of it the
    probabilities (modeling_bert.py:360) fail instead: 200 MiB allocated, of
    which the checkpoint inputs and the recomputed q, k, v are 64 MiB of
    activations; the block's forward went on from there to 72 MiB more
    (probabilities 32, intermediate 32, output 8 MiB), which halving the
    micro-batch does not cover ((64 + 72) / 2 = 68 MiB freed).

    `micro_batch_divisor` divides what scales with the micro-batch (the
    activations and their gradients; not the weights or their gradients).
    Halved, the tied run still fails, in the third layer's backward
    (hf_bert_checkpointed_backward_oom.pickle; tests/scripts/recompute_fixture_test.py).
    Its recomputation of the last
    layer fits: diagnose's need counts bytes beyond those allocated at the
    out-of-memory, not the room left under a cap it knows only to lie
    between 240 and 272 MiB, and a gradient of an activation (the head's) as
    a gradient, which halving does not shrink: conservative.

    Without `checkpointing`, forward keeps each layer's q, k, v,
    probabilities and intermediate for backward (frames without
    checkpoint()), and backward frees them where the checkpointed run frees
    their recomputed copies: a layer's backward then keeps 24 MiB of weight
    gradients and frees 96 MiB / micro_batch_divisor of activations, so
    from a divisor of 8 on each layer's backward starts higher than the one
    before (hf_bert_backward_oom.pickle)."""
    b = micro_batch_divisor
    sim = Sim(cap=cap)
    [sim.malloc(24 * MIB, HF_LOAD) for _ in range(4)]

    def in_checkpoint(frames):
        i = next(i for i, f in enumerate(frames) if f["filename"].endswith("transformers/modeling_layers.py"))
        return frames[:i] + CHECKPOINT_FWD + frames[i:]

    def recomputed(frames):
        # The layer's frames up to BertLayer.forward and its Module.__call__, then the hook.
        i = next(i for i, f in enumerate(frames) if f["filename"].endswith("transformers/modeling_layers.py"))
        return frames[:i] + RECOMPUTE

    # BertEmbeddings' output (modeling_bert.py:120), called by BertModel.forward
    # at :1000; from BertModel's caller on, the frames of hf_outer().
    outer = hf_outer()
    above_model = outer[outer.index(frame(HF_BERT, "forward", 1008)) + 1:]
    hidden = [sim.malloc(8 * MIB // b, [frame(f"{HF_TORCH}/nn/modules/sparse.py", "forward", 192)] + hf_call() +
                         [frame(HF_BERT, "forward", 120)] + hf_call() + [frame(HF_BERT, "forward", 1000)] +
                         above_model)]
    wrap = in_checkpoint if checkpointing else (lambda frames: frames)
    saved = []  # without checkpointing: each layer's tensors saved for backward
    for _ in range(4):
        made = [sim.malloc(size // b, wrap(hf_op(f, fn, line, bert, via_layer=layer)))
                for size, f, fn, line, bert, layer in BERT_LAYER]
        if checkpointing:
            for a in made[:-1]:  # freed as BertLayer.forward returns (saved tensors are recomputed instead)
                sim.free(a, in_checkpoint([frame(HF_BERT, "forward", 630)] + hf_outer()))
        else:
            saved.append(made[:-1])
        hidden.append(made[-1])
    grad_out = sim.malloc(8 * MIB // b, [])  # the gradient of the last hidden state, from the head
    if embedding_grad:
        sim.malloc(embedding_grad, [])
    try:
        for _ in range(4):  # last layer first, each op's backward in reverse order (no frames)
            if checkpointing:
                q, k, v, probs, inter, out = [
                    sim.malloc(size // b, recomputed(hf_op(f, fn, line, bert, via_layer=layer)))
                    for size, f, fn, line, bert, layer in BERT_LAYER]
            else:  # the layer's output is the next layer's input, freed by its backward
                (q, k, v, probs, inter), out = saved.pop(), None
            # BertOutput's dense: its weight's gradient and the intermediate's.
            sim.malloc(8 * MIB, [])
            grad_inter = sim.malloc(32 * MIB // b, [])
            if out:
                sim.free(out, [])
            # BertIntermediate's dense: its weight's gradient and the attention output's.
            sim.malloc(8 * MIB, [])
            grad_attention = sim.malloc(8 * MIB // b, [])
            sim.free(inter, [])
            sim.free(grad_inter, [])
            # Self-attention: the probabilities' gradient, then q, k, v's weights' gradient.
            grad_probs = sim.malloc(32 * MIB // b, [])
            sim.free(probs, [])
            sim.malloc(8 * MIB, [])
            for a in (q, k, v, grad_probs, grad_out, hidden.pop()):
                sim.free(a, [])
            grad_out = grad_attention
    except OutOfMemory:
        pass
    return sim


# Hugging Face generate() on a Llama, as PyTorch 2.11 records it with
# transformers 5.24 (a TorchDispatchMode's traceback at each op, on the CPU,
# 2026-12-03): generate() is decorated with torch.no_grad()
# (torch/utils/_contextlib.py decorate_context), and the prefill calls
# LlamaForCausalLM, LlamaModel, each LlamaDecoderLayer and its attention.
HF_GEN = f"{HF_VENV}/transformers/generation/utils.py"
HF_LLAMA = f"{HF_VENV}/transformers/models/llama/modeling_llama.py"
HF_GEN_USER = "/home/user/torch/generate.py"
HF_NO_GRAD_USER = "/home/user/torch/infer.py"
HF_DEPRECATION = frame(f"{HF_VENV}/transformers/utils/deprecation.py", "wrapped_func", 173)


def hf_model_to(script):
    """A Hugging Face model's weights moved to the GPU by `model.to("cuda")` at script:12."""
    return [frame(f"{HF_TORCH}/nn/modules/module.py", "_apply", 1355),
            frame(f"{HF_TORCH}/nn/modules/module.py", "to", 1369),
            frame(f"{HF_VENV}/transformers/modeling_utils.py", "to", 4343),
            frame(script, "<module>", 12)]


def llama_generate_call():
    """torch's Module.__call__ as transformers 5.24 sees it."""
    return [frame(f"{HF_TORCH}/nn/modules/module.py", "_call_impl", 1790),
            frame(f"{HF_TORCH}/nn/modules/module.py", "_wrapped_call_impl", 1779)]


def llama_frames(inner, where, generate=True):
    """`inner` (innermost first) inside the prefill of generate.py:20's
    model.generate(): where = "attention:LINE" (LlamaAttention.forward at
    LINE), "model" (LlamaModel.forward's loop) or "head" (LlamaForCausalLM).
    Without `generate`, inside infer.py:20's `logits = model(ids).logits`
    in a `with torch.no_grad():` block, which leaves no frame."""
    caller = [frame(HF_GEN, "_prefill", 4333), frame(HF_GEN, "_sample", 3208), frame(HF_GEN, "generate", 3008),
              frame(f"{HF_TORCH}/utils/_contextlib.py", "decorate_context", 124), HF_DEPRECATION, HF_DEPRECATION,
              frame(HF_GEN_USER, "<module>", 20)] if generate else [frame(HF_NO_GRAD_USER, "<module>", 20)]
    head = [frame(f"{HF_VENV}/transformers/utils/generic.py", "wrapper", 1036), HF_DEPRECATION] + \
        llama_generate_call() + caller
    model = [frame(HF_LLAMA, "forward", 394), frame(f"{HF_VENV}/transformers/utils/output_capturing.py", "wrapper", 361),
             frame(f"{HF_VENV}/transformers/utils/generic.py", "wrapper", 1182), HF_DEPRECATION] + \
        llama_generate_call() + [frame(HF_LLAMA, "forward", 459)] + head
    if where == "head":
        return inner + [frame(HF_LLAMA, "forward", 471)] + head
    if where == "model":
        return inner + model
    line = int(where.split(":")[1])
    layer = [frame(HF_LLAMA, "forward", 299), HF_DEPRECATION,
             frame(f"{HF_VENV}/transformers/modeling_layers.py", "forward_with_checkpointing", 124)] + \
        llama_generate_call()
    return inner + [frame(HF_LLAMA, "forward", line), HF_DEPRECATION] + llama_generate_call() + layer + model


def llama_generate_oom(cap=384 * MIB, generate=True):
    """Hugging Face generate() on a 4-layer Llama-like model, out of memory in
    its prefill: the eager attention's probabilities of the last layer
    (modeling_llama.py:197, softmax, 64 MiB) do not fit. Weights: 4 layers
    of 32 MiB and 64 MiB of embeddings (192 MiB, loaded by generate.py:12).
    The prefill keeps each layer's keys and values in the KV cache
    (cache_utils.py:136, 2 x 16 MiB a layer) and the 16 MiB hidden state
    between layers; each layer's attention probabilities are freed when its
    attention returns. Under the 384 MiB cap: 192 MiB weights, 96 MiB of
    KV cache (3 layers) + 32 MiB (the 4th layer's keys and values, cached
    before its attention) and the 16 MiB hidden state: 336 MiB allocated
    (368 MiB reserved) when the 64 MiB request fails. No autograd: nothing is kept for
    backward, so activation checkpointing does not apply; half the batch
    halves the cache, the hidden state and the probabilities.

    Without `generate`: the same forward called by infer.py:20 inside
    `with torch.no_grad():` (no frame says so): the blocks before the last
    complete one (the first layer) freed their probabilities and output (2
    allocations, 80 MiB) before the out-of-memory, their keys and values
    aside (Note [Blocks that kept nothing], diagnose/nothing_saved.h)."""
    sim = Sim(cap=cap)
    load = hf_model_to(HF_GEN_USER if generate else HF_NO_GRAD_USER)
    [sim.malloc(32 * MIB, load) for _ in range(6)]

    def at(inner, where):  # the frames of this run
        return llama_frames(inner, where, generate)

    embed = [frame(f"{HF_TORCH}/nn/modules/sparse.py", "forward", 192)] + llama_generate_call()
    hidden = sim.malloc(16 * MIB, at(embed + [frame(HF_LLAMA, "forward", 372)], "model"))
    kv = [frame(f"{HF_VENV}/transformers/cache_utils.py", "update", 136),
          frame(f"{HF_VENV}/transformers/cache_utils.py", "update", 1620)]
    softmax = [frame(f"{HF_TORCH}/nn/functional.py", "softmax", 2161), frame(HF_LLAMA, "eager_attention_forward", 197)]
    try:
        for _ in range(4):
            sim.malloc(16 * MIB, at(kv, "attention:252"))  # keys
            sim.malloc(16 * MIB, at(kv, "attention:252"))  # values
            probs = sim.malloc(64 * MIB, at(softmax, "attention:258"))
            sim.free(probs, at([], "attention:258"))
            out = sim.malloc(16 * MIB, at([], "model"))  # the layer's output
            sim.free(hidden, at([], "model"))
            hidden = out
    except OutOfMemory:
        pass
    return sim


# Hugging Face Trainer.evaluate() on a GPT-2 language model, as PyTorch 2.11
# records it with transformers 5.24 (a TorchDispatchMode's traceback at each
# op, on the CPU, 2026-12-03): evaluation_loop calls prediction_step, whose
# forward runs under `with torch.no_grad():` (no frame), then concatenates
# the step's losses (line 3008), logits (3023) and labels (3027) onto the
# steps before (EvalLoopContainer.add -> trainer_pt_utils.py nested_concat
# -> torch_pad_and_concatenate -> torch.cat); frees record frames too.
HF_GPT2 = f"{HF_VENV}/transformers/models/gpt2/modeling_gpt2.py"
HF_EVAL_USER = "/home/user/torch/evaluate.py"


def gpt2_eval_frames(inner, where):
    """`inner` (innermost first) in evaluate.py:31's trainer.evaluate():
    where = "mlp:LINE" (GPT2MLP.forward at LINE, in a block), "model"
    (GPT2Model.forward's loop), "head:LINE" (GPT2LMHeadModel.forward) or
    "concat:LINE" (evaluation_loop's add at LINE)."""
    loop = [frame(HF_TRAINER, "evaluate", 2871), frame(HF_EVAL_USER, "<module>", 31)]
    if where.startswith("concat:"):
        return inner + [frame(f"{HF_VENV}/transformers/trainer_pt_utils.py", "torch_pad_and_concatenate", 86),
                        frame(f"{HF_VENV}/transformers/trainer_pt_utils.py", "nested_concat", 128),
                        frame(f"{HF_VENV}/transformers/trainer_pt_utils.py", "add", 376),
                        frame(HF_TRAINER, "evaluation_loop", int(where.split(":")[1]))] + loop
    step = llama_generate_call() + [frame(HF_TRAINER, "compute_loss", 2172), frame(HF_TRAINER, "prediction_step", 3275),
                                    frame(HF_TRAINER, "evaluation_loop", 2996)] + loop
    head = [frame(f"{HF_VENV}/transformers/utils/generic.py", "wrapper", 1036)] + step
    if where.startswith("head:"):
        return inner + [frame(HF_GPT2, "forward", int(where.split(":")[1])), HF_DEPRECATION] + head
    model = [frame(HF_GPT2, "forward", 608), HF_DEPRECATION,
             frame(f"{HF_VENV}/transformers/utils/output_capturing.py", "wrapper", 361),
             frame(f"{HF_VENV}/transformers/utils/generic.py", "wrapper", 1182)] + \
        llama_generate_call() + [frame(HF_GPT2, "forward", 683), HF_DEPRECATION] + head
    if where == "model":
        return inner + model
    block = [frame(HF_GPT2, "forward", 308), HF_DEPRECATION,
             frame(f"{HF_VENV}/transformers/modeling_layers.py", "forward_with_checkpointing", 124)] + \
        llama_generate_call()
    return inner + [frame(HF_GPT2, "forward", int(where.split(":")[1]))] + llama_generate_call() + block + model


def gpt2_eval_outputs_oom(cap=512 * MIB, accumulation_steps=None):
    """Hugging Face Trainer.evaluate() of a 2-block GPT-2-like language model
    with compute_metrics and no eval_accumulation_steps: every step's logits
    (32 MiB: batch x sequence x vocabulary floats, lm_head at
    modeling_gpt2.py:698) are concatenated onto the steps before on the
    device, beside the labels (32 KiB a step) and losses (512 bytes a step).
    Weights: 96 MiB (3 x 32 MiB, moved by evaluate.py:12). Each step's
    forward frees its hidden states, MLP temporaries (16 MiB) and
    cross-entropy's log-probabilities (32 MiB) as it goes (no autograd).
    Under the 512 MiB cap the 6th step's concatenation of logits asks for
    192 MiB (6 steps) while 96 MiB of weights, 160 MiB of outputs (5 steps
    of logits, labels and losses) and the 6th step's 32 MiB of logits are
    allocated (288 MiB; 386 MiB reserved: an earlier concatenation's 128 MiB
    segment holds the logits beside a 96 MiB free block). Halving the batch
    halves each step, not the samples kept; eval_accumulation_steps=3 keeps
    at most 3 steps (96 MiB) in a concatenation.
    With `accumulation_steps` K, the outputs go to the CPU after every K
    steps (to_cpu_and_numpy frees them on the device), as with
    TrainingArguments(eval_accumulation_steps=K)."""
    sim = Sim(cap=cap)
    load = hf_model_to(HF_EVAL_USER)
    [sim.malloc(32 * MIB, load) for _ in range(3)]
    inputs = [frame(HF_TRAINER, "_prepare_input", 2384), frame(HF_TRAINER, "<dictcomp>", 2374),
              frame(HF_TRAINER, "_prepare_input", 2374), frame(HF_TRAINER, "_prepare_inputs", 2392),
              frame(HF_TRAINER, "prediction_step", 3232), frame(HF_TRAINER, "evaluation_loop", 2996),
              frame(HF_TRAINER, "evaluate", 2871), frame(HF_EVAL_USER, "<module>", 31)]
    linear = [frame(f"{HF_VENV}/transformers/pytorch_utils.py", "forward", 119)] + llama_generate_call()
    gelu = [frame(f"{HF_VENV}/transformers/activations.py", "forward", 66)] + llama_generate_call()
    embed = [frame(f"{HF_TORCH}/nn/functional.py", "embedding", 2567),
             frame(f"{HF_TORCH}/nn/modules/sparse.py", "forward", 189)] + llama_generate_call()
    lm_head = [frame(f"{HF_TORCH}/nn/modules/linear.py", "forward", 134)] + llama_generate_call()
    loss = [frame(f"{HF_TORCH}/nn/functional.py", "cross_entropy", 3504),
            frame(f"{HF_VENV}/transformers/loss/loss_utils.py", "fixed_cross_entropy", 42),
            frame(f"{HF_VENV}/transformers/loss/loss_utils.py", "ForCausalLMLoss", 72)]
    outputs = {3008: None, 3023: None, 3027: None}  # losses, logits, labels on the device
    try:
        for step in range(16):
            ids = sim.malloc(32 * KIB, inputs)
            labels = sim.malloc(32 * KIB, inputs)
            hidden = sim.malloc(4 * MIB, gpt2_eval_frames(embed, "model"))
            for _ in range(2):
                up = sim.malloc(16 * MIB, gpt2_eval_frames(linear, "mlp:241"))
                act = sim.malloc(16 * MIB, gpt2_eval_frames(gelu, "mlp:242"))
                sim.free(up, gpt2_eval_frames([], "mlp:242"))
                out = sim.malloc(4 * MIB, gpt2_eval_frames(linear, "mlp:243"))
                sim.free(act, gpt2_eval_frames([], "mlp:243"))
                sim.free(hidden, gpt2_eval_frames([], "model"))
                hidden = out
            logits = sim.malloc(32 * MIB, gpt2_eval_frames(lm_head, "head:698"))
            sim.free(hidden, gpt2_eval_frames([], "head:698"))
            log_probs = sim.malloc(32 * MIB, gpt2_eval_frames(loss, "head:703"))
            step_loss = sim.malloc(512, gpt2_eval_frames(loss, "head:703"))
            sim.free(log_probs, gpt2_eval_frames([], "head:703"))
            # The step's inputs and loss are dropped in evaluation_loop (frees record frames
            # too: _record_memory_history's default context="all").
            loop = [frame(HF_TRAINER, "evaluation_loop", 3007)] + inputs[-2:]
            sim.free(ids, loop)
            losses = sim.malloc(512, loop)
            sim.free(step_loss, loop)
            for line, tensor, size in ((3008, losses, 512), (3023, logits, 32 * MIB), (3027, labels, 32 * KIB)):
                if outputs[line] is None:
                    outputs[line] = tensor  # EvalLoopContainer.add keeps the first step's tensor itself
                    continue
                kept = step % accumulation_steps if accumulation_steps else step
                joined = sim.malloc(size * (kept + 1), gpt2_eval_frames([], f"concat:{line}"))
                sim.free(outputs[line], gpt2_eval_frames([], f"concat:{line}")[2:])  # EvalLoopContainer.add
                sim.free(tensor, loop)
                outputs[line] = joined
            if accumulation_steps and (step + 1) % accumulation_steps == 0:
                to_cpu = [frame(f"{HF_VENV}/transformers/trainer_pt_utils.py", "to_cpu_and_numpy", 387),
                          frame(HF_TRAINER, "evaluation_loop", 3048)] + inputs[-2:]
                for line in outputs:
                    sim.free(outputs[line], to_cpu)
                    outputs[line] = None
    except OutOfMemory:
        pass
    return sim


# torch.compile's frames as PyTorch 2.11 records them (sys.setprofile at
# inductor's empty_strided calls on the CPU): the generated wrapper's `call`
# in inductor's cache, AOTAutograd's runtime wrappers (a Function.apply in
# forward), dynamo's frame, then the compiled module's own forward frame.
# Backward runs the generated backward from the engine's thread: its
# outermost Python frame is BackwardCFunction.apply.
INDUCTOR = "/tmp/torchinductor_user"
AOT = f"{TORCH}/_functorch/_aot_autograd"


def compiled_fwd(line):
    return [frame(f"{INDUCTOR}/dc/cdcfaxosx55gpcyisnoztxhiq7rl3to54rvduz7cnc2nxcx6lezd.py", "call", line),
            frame(f"{TORCH}/_inductor/output_code.py", "__call__", 656),
            frame(f"{AOT}/runtime_wrappers.py", "inner_fn", 1011),
            frame(f"{AOT}/utils.py", "call_func_at_runtime_with_args", 138),
            frame(f"{AOT}/runtime_wrappers.py", "forward", 2503),
            frame(f"{TORCH}/autograd/function.py", "apply", 596),
            frame(f"{AOT}/runtime_wrappers.py", "runtime_wrapper", 566),
            frame(f"{TORCH}/_functorch/aot_autograd.py", "forward", 1200),
            frame(f"{TORCH}/_dynamo/eval_frame.py", "_fn", 1263),
            frame(USER, "forward", 13),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1790),
            frame(f"{TORCH}/_dynamo/eval_frame.py", "compile_wrapper", 1024),
            frame(f"{TORCH}/nn/modules/module.py", "_call_impl", 1790),
            frame(f"{TORCH}/_dynamo/eval_frame.py", "__call__", 472),
            frame(USER, "train_step", 40),
            frame(USER, "main", 90)]


def compiled_bwd(line):
    return [frame(f"{INDUCTOR}/w2/cw24ufrn2zpkjofer7ozp6fvkw7e74ge66sv3pxsxmrimiznpjto.py", "call", line),
            frame(f"{TORCH}/_inductor/output_code.py", "__call__", 656),
            frame(f"{TORCH}/_dynamo/eval_frame.py", "_fn", 1263),
            frame(f"{AOT}/utils.py", "call_func_at_runtime_with_args", 138),
            frame(f"{AOT}/runtime_wrappers.py", "_backward_impl", 2918),
            frame(f"{AOT}/runtime_wrappers.py", "impl_fn", 2734),
            frame(f"{AOT}/runtime_wrappers.py", "backward", 2748),
            frame(f"{TORCH}/autograd/function.py", "apply", 317)]


def compiled_step_oom():
    """A torch.compile'd model: 4 parameters of 8 MiB; each forward keeps 4 x
    16 MiB (the generated call's lines 133-136) and frees a 4 MiB scratch;
    backward (generated, on the engine's thread) makes the gradients once
    and frees the activations; the second iteration's forward runs out of
    memory asking for its fourth 16 MiB under a 128 MiB cap (its segment
    past the cap)."""
    sim = Sim(cap=128 * MIB)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads = []
    try:
        for _ in range(2):
            acts = [sim.malloc(16 * MIB, compiled_fwd(133 + k)) for k in range(4)]
            tmp = sim.malloc(4 * MIB, compiled_fwd(140))
            sim.free(tmp, compiled_fwd(140))
            for a in reversed(acts):
                if len(grads) < len(params):
                    grads.append(sim.malloc(8 * MIB, compiled_bwd(210)))
                sim.free(a, compiled_bwd(215))
    except OutOfMemory:
        pass
    return sim


def tagged_step_oom():
    """compiled_step_oom's run as a script that tags it: user metadata
    (torch.cuda.memory._set_memory_metadata) "load" while the parameters
    are made, then "train step N" for each iteration, and the compile
    region recorded (_record_memory_history(compile_context=True)) around
    each compiled forward, "Torch-Compiled Region: 0/0"
    (torch/_dynamo/convert_frame.py names it so); backward runs outside it.
    At the out-of-memory: "load" 4 x 8 MiB, "train step 0" 4 x 8 MiB (the
    gradients), "train step 1" 3 x 16 MiB (its activations, in the region).
    The script also wraps each iteration in record_function("train_step"),
    its forward in "forward" and its backward in "backward": the failing
    call is inside "train_step" > "forward", and what is alive was made in
    "forward" (the activations), "backward" (the gradients) or in none (the
    parameters)."""
    sim = Sim(cap=128 * MIB)
    sim.user_metadata = "load"
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    grads = []
    try:
        for step in range(2):
            sim.user_metadata = f"train step {step}"
            sim.record_function("train_step", "START")
            sim.record_function("forward", "START")
            sim.compile_context = "Torch-Compiled Region: 0/0"
            acts = [sim.malloc(16 * MIB, compiled_fwd(133 + k)) for k in range(4)]
            tmp = sim.malloc(4 * MIB, compiled_fwd(140))
            sim.free(tmp, compiled_fwd(140))
            sim.compile_context = "N/A"
            sim.record_function("forward", "END")
            sim.record_function("backward", "START")
            for a in reversed(acts):
                if len(grads) < len(params):
                    grads.append(sim.malloc(8 * MIB, compiled_bwd(210)))
                sim.free(a, compiled_bwd(215))
            sim.record_function("backward", "END")
            sim.record_function("train_step", "END")
    except OutOfMemory:
        pass
    return sim


CUDAGRAPH_TREES = f"{TORCH}/_inductor/cudagraph_trees.py"


def cudagraph_fwd(line):
    """compiled_fwd's call while torch.compile(mode="reduce-overhead")
    records it into a CUDA graph tree node (its allocations in the tree's
    private pool)."""
    inner = compiled_fwd(line)
    return [inner[0],
            frame(CUDAGRAPH_TREES, "run_graph", 1040),
            frame(CUDAGRAPH_TREES, "_record", 2349),
            frame(CUDAGRAPH_TREES, "record_function", 2294),
            frame(CUDAGRAPH_TREES, "run", 2009)] + inner[8:]


def record_graph_forward(sim):
    """torch.compile(mode="reduce-overhead") records the forward into a CUDA
    graph: 6 activations of 16 MiB in the graph's private pool (1, 0), a
    segment each, then 4 freed in the pool (96 MiB reserved, 64 MiB free)."""
    sim.pool = (1, 0)
    acts = [sim.malloc(16 * MIB, cudagraph_fwd(133 + k)) for k in range(6)]
    for a in acts[:4]:
        sim.free(a, cudagraph_fwd(150))
    sim.pool = (0, 0)


def cudagraph_pool_oom(fail_in_capture=False):
    """torch.compile(mode="reduce-overhead"): 4 parameters of 8 MiB (two
    20 MiB segments, 8 MiB free in them); the forward recorded into a CUDA
    graph whose private pool (segment_pool_id (1, 0)) gets 6 activations of
    16 MiB, a segment each; 4 are freed in the pool after the recording,
    2 stay (the graph's outputs): 96 MiB reserved there, 64 MiB free. Then
    eager code asks 16 MiB at a time from the default pool under a 256 MiB
    cap: 7 fit, the 8th fails with 8 MiB free in the default pool and
    64 MiB in the graph's. With fail_in_capture the cap (120 MiB) stops
    the recording itself at its 6th activation, the earlier ones alive."""
    sim = Sim(cap=120 * MIB if fail_in_capture else 256 * MIB)
    params = [sim.malloc(8 * MIB, param_frames()) for _ in range(4)]
    try:
        record_graph_forward(sim)
        for _ in range(8):
            sim.malloc(16 * MIB, user_frames(60))
    except OutOfMemory:
        pass
    assert params
    return sim


def cudagraph_fragmentation_oom():
    """The default pool fragmented beside a CUDA graph's private pool. Under
    a 200 MiB cap: 16 eager tensors of 5 MiB tile four 20 MiB segments of
    the default pool, and three of each four are freed (each segment keeps
    its first: 20 MiB allocated, 60 MiB free in blocks of 15 MiB, no
    segment wholly free); then torch.compile(mode="reduce-overhead")
    records 6 activations of 16 MiB into the graph's pool (1, 0), a segment
    each, and frees 4 (96 MiB reserved there, 64 MiB free); then eager code
    asks 40 MiB: 176 + 40 > 200, nothing to flush, out of memory.
    Under expandable_segments the 5 MiB tensors would tile 20 MiB pages
    the same way, each page keeping a live tensor, so nothing unmaps; the
    graph's pool never uses expandable segments and a live graph keeps its
    cached segments: the request still needs 2 new pages, 216 MiB > the
    cap. Replayed as one pool, the graph's freed 64 MiB served it."""
    sim = Sim(cap=200 * MIB)
    eager = [sim.malloc(5 * MIB, user_frames(40)) for _ in range(16)]
    for k, a in enumerate(eager):
        if k % 4 != 0:
            sim.free(a, user_frames(41))
    try:
        record_graph_forward(sim)
        sim.malloc(40 * MIB, user_frames(60))
    except OutOfMemory:
        pass
    return sim


# A torch.cuda.Stream()'s cudaStream_t as a trace records it (the default
# stream is 0 in every PyTorch 2.11 recording of tests/fixtures/snapshots/
# h200_recorded/).
SIDE_STREAM = 0x55D2C4A1B3E0


def prefetch_frames(line):
    return [frame(USER, "prefetch", line), frame(USER, "main", 88)]


def cross_stream_oom():
    """A batch prefetched on a side stream (with torch.cuda.stream(s)) under
    a 200 MiB cap: its 120 MiB staging tensor is freed, and a 4 MiB tensor
    made on the same stream takes the start of that segment (best fit on
    its stream; the other 116 MiB are split off and stay cached for it).
    The forward on the default stream then holds 60 MiB in a segment of its
    own and asks 48 MiB: no free block of its stream, 180 + 48 > 200, and
    the flush frees nothing (the side segment holds a live tensor): out of
    memory beside 116 MiB free. Under expandable_segments the flush unmaps
    the side segment's five free 20 MiB pages, and the request fits.
    Replayed as one stream, the side stream's free block served it."""
    sim = Sim(cap=200 * MIB)
    sim.stream = SIDE_STREAM
    staging = sim.malloc(120 * MIB, prefetch_frames(70))
    sim.free(staging, prefetch_frames(72))
    sim.malloc(4 * MIB, prefetch_frames(74))
    sim.stream = 0
    try:
        sim.malloc(60 * MIB, fwd(20))
        sim.malloc(48 * MIB, fwd(22))
    except OutOfMemory:
        pass
    return sim


# C/C++ frames as stacks="all" (_record_memory_history's default) records
# them beside the Python ones: addr2line's function name, its file "??" or
# "" where the library has no line table (torch/csrc/profiler/unwind/
# unwind.cpp, Symbolizer), innermost first. Taken from a PyTorch 2.11
# wheel's CapturedTraceback (torch._C._profiler.gather_traceback(True, True,
# True)), with the allocator's own frames that _memory_viz.py omits
# (unwind::unwind, CapturedTraceback::gather, gather_with_cpp).
def native(name, filename="??", line=0):
    return {"filename": filename, "name": name, "line": line}


CPP_ALLOC = [native("torch::unwind::unwind()"), native("torch::CapturedTraceback::gather(bool, bool, bool)"),
             native("torch::cuda::(anonymous namespace)::gather_with_cpp()", ""),
             native("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "
                    "unsigned long, CUstream_st*)"),
             native("c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::allocate(unsigned long)"),
             native("at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, std::optional<c10::Device>, "
                    "std::optional<c10::MemoryFormat>)"),
             native("at::_ops::addmm::call(at::Tensor const&, at::Tensor const&, at::Tensor const&, "
                    "c10::Scalar const&, c10::Scalar const&)")]
CPP_BINDING = native("torch::autograd::THPVariable_linear(_object*, _object*, _object*)", "python_nn_functions.cpp")
CPP_EVAL = native("_PyEval_EvalFrameDefault")
CPP_MAIN = [native("Py_RunMain"), native("Py_BytesMain"),
            native("__libc_start_call_main", "./csu/../sysdeps/x86/libc-start.c", 58),
            native("__libc_start_main_impl", "./csu/../csu/libc-start.c", 360), native("_start")]
# The autograd engine's device thread: no Python frame at all.
CPP_ENGINE = [native("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, "
                     "torch::autograd::Node*, torch::autograd::InputBuffer&, "
                     "std::shared_ptr<torch::autograd::ReadyQueue> const&)"),
              native("torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)"),
              native("torch::autograd::Engine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> "
                     "const&, bool)"),
              native("torch::autograd::python::PythonEngine::thread_init(int, "
                     "std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", ""),
              native("start_thread", "./nptl/pthread_create.c", 442),
              native("clone3", "../sysdeps/unix/sysv/linux/x86_64/clone3.S", 81)]


def stacks_all(dump):
    """The same run recorded with stacks="all": C++ frames around every
    Python stack (each Python frame followed by the interpreter's), and the
    autograd engine's frames where stacks="python" recorded none. Its
    diagnosis must be the Python-stack one's."""
    def with_cpp(frames):
        if not frames:
            return CPP_ALLOC + CPP_ENGINE
        out = CPP_ALLOC + [CPP_BINDING]
        for f in frames:
            out += [f, CPP_EVAL]
        return out + CPP_MAIN

    return with_frames_mapped(dump, with_cpp, allocated_blocks_only=True)


def write(path, obj, protocol):
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=protocol)
    assert os.path.getsize(path) < 200_000, path


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "tests", "fixtures", "snapshots")
    os.makedirs(out, exist_ok=True)
    frag = fragmentation()
    for layout, protocol in (("v1_13", 2), ("v2_0", 2), ("v2_1", 4), ("v2_2", 4), ("v2_4", 4), ("v2_11", 4)):
        write(os.path.join(out, f"layout_{layout}.pickle"), frag.dump(layout), protocol)
    write(os.path.join(out, "layout_v2_11_protocol5.pickle"), frag.dump("v2_11"), 5)
    write(os.path.join(out, "leak.pickle"), leak().dump("v2_11"), 4)
    write(os.path.join(out, "optimizer_oom.pickle"), optimizer_oom().dump("v2_11"), 4)
    write(os.path.join(out, "backward_peak.pickle"), backward_peak().dump("v2_11"), 4)
    exp = expandable()
    settings = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "max_split_size": -1,
                "garbage_collection_threshold": 0.0, "expandable_segments": True,
                "roundup_power2_divisions": {str(1 << i): 0 for i in range(16)}}
    write(os.path.join(out, "expandable.pickle"), exp.dump("v2_11", settings), 4)
    write(os.path.join(out, "missing_frames.pickle"), missing_frames().dump("v2_11"), 4)
    write(os.path.join(out, "hf_bert_forward_oom.pickle"), hf_bert_forward_oom().dump("v2_11"), 4)
    write(os.path.join(out, "adamw_first_step_oom.pickle"), adamw_first_step_oom().dump("v2_11"), 4)
    write(os.path.join(out, "forward_holes_enough.pickle"), forward_second_iteration(14).dump("v2_11"), 4)
    write(os.path.join(out, "forward_holes_combined.pickle"), forward_second_iteration(6).dump("v2_11"), 4)
    write(os.path.join(out, "forward_holes_context_state.pickle"),
          forward_second_iteration(6, call_frames=False).dump("v2_11"), 4)
    write(os.path.join(out, "rounding_waste_oom.pickle"), rounding_waste_oom().dump("v2_11"), 4)
    write(os.path.join(out, "rounding_waste_second_iteration.pickle"), rounding_waste_second_iteration().dump("v2_11"),
          4)
    write(os.path.join(out, "compare_seq_1x.pickle"), llama_forward(4).dump("v2_11"), 4)
    write(os.path.join(out, "compare_seq_2x.pickle"), llama_forward(8).dump("v2_11"), 4)
    write(os.path.join(out, "compare_before_step.pickle"), first_step(False).dump("v2_11"), 4)
    write(os.path.join(out, "compare_after_step.pickle"), first_step(True).dump("v2_11"), 4)
    write(os.path.join(out, "oomtune_trial_oom.pickle"), oomtune_trial_oom().dump("v2_11"), 4)
    write(os.path.join(out, "cross_stream_oom.pickle"), cross_stream_oom().dump("v2_11"), 4)
    write(os.path.join(out, "oomtune_trial_oom_unmarked.pickle"), oomtune_trial_oom(False).dump("v2_11"), 4)
    write(os.path.join(out, "two_devices.pickle"), two_devices(leak(), optimizer_oom()), 4)
    write(os.path.join(out, "hf_bert_checkpointed_flash_oom.pickle"),
          checkpointed_flash(hf_bert_forward_oom().dump("v2_11")), 4)
    write(os.path.join(out, "hf_bert_checkpointed_recompute_oom.pickle"), bert_backward_oom().dump("v2_11"), 4)
    write(os.path.join(out, "hf_bert_checkpointed_recompute_tied_oom.pickle"),
          bert_backward_oom(embedding_grad=32 * MIB).dump("v2_11"), 4)
    write(os.path.join(out, "hf_bert_checkpointed_backward_oom.pickle"),
          bert_backward_oom(embedding_grad=32 * MIB, micro_batch_divisor=2).dump("v2_11"), 4)
    write(os.path.join(out, "hf_bert_backward_oom.pickle"),
          bert_backward_oom(208 * MIB, micro_batch_divisor=8, checkpointing=False).dump("v2_11"), 4)
    write(os.path.join(out, "hf_llama_generate_oom.pickle"), llama_generate_oom().dump("v2_11"), 4)
    write(os.path.join(out, "hf_llama_no_grad_oom.pickle"), llama_generate_oom(generate=False).dump("v2_11"), 4)
    write(os.path.join(out, "hf_gpt2_eval_outputs_oom.pickle"), gpt2_eval_outputs_oom().dump("v2_11"), 4)
    write(os.path.join(out, "hf_gpt2_eval_forward_oom.pickle"), gpt2_eval_outputs_oom(160 * MIB).dump("v2_11"), 4)
    write(os.path.join(out, "compiled_step_oom.pickle"), compiled_step_oom().dump("v2_11"), 4)
    write(os.path.join(out, "tagged_step_oom.pickle"), tagged_step_oom().dump("v2_11"), 4)
    write(os.path.join(out, "frameless_optimizer_oom.pickle"), frameless_optimizer_oom().dump("v2_11"), 4)
    write(os.path.join(out, "frameless_optimizer_oom_unmarked.pickle"), frameless_optimizer_oom(None).dump("v2_11"), 4)
    write(os.path.join(out, "cudagraph_pool_oom.pickle"), cudagraph_pool_oom().dump("v2_11"), 4)
    write(os.path.join(out, "cudagraph_capture_oom.pickle"), cudagraph_pool_oom(True).dump("v2_11"), 4)
    write(os.path.join(out, "cudagraph_fragmentation_oom.pickle"), cudagraph_fragmentation_oom().dump("v2_11"), 4)
    write(os.path.join(out, "backward_peak_stacks_all.pickle"), stacks_all(backward_peak().dump("v2_11")), 4)
    write(os.path.join(out, "hf_bert_forward_oom_stacks_all.pickle"), stacks_all(hf_bert_forward_oom().dump("v2_11")),
          4)

    write(os.path.join(out, "cnn_caught_oom.pickle"), cnn_caught_oom(False).dump("v2_11"), 4)
    write(os.path.join(out, "cnn_caught_then_fatal_oom.pickle"), cnn_caught_oom(True).dump("v2_11"), 4)

    # Hostile and broken inputs (hand-written opcodes, CPython Lib/pickletools.py).
    marker = b"/tmp/oomtune_fixture_pwned"
    raw = {
        # GLOBAL 'os system', the command string, TUPLE1, REDUCE, STOP
        "malicious_global.pickle": b"\x80\x02cos\nsystem\nX" + len(b"touch " + marker).to_bytes(4, "little")
                                   + b"touch " + marker + b"\x85R.",
        # None called with (): REDUCE without any import
        "malicious_reduce.pickle": b"\x80\x02N)R.",
        # BINGET 5 with an empty memo
        "bad_memo.pickle": b"\x80\x02h\x05.",
        # BINUNICODE8 claiming 2^60 bytes
        "bad_length.pickle": b"\x80\x04\x8d" + (1 << 60).to_bytes(8, "little") + b"abc.",
        # 2000 lists, each appended into the one before
        "bad_nesting.pickle": b"\x80\x02" + b"]" * 2000 + b"a" * 1999 + b".",
    }
    for name, data in raw.items():
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    whole = pickle.dumps(frag.dump("v2_11"), protocol=4)
    with open(os.path.join(out, "bad_truncated.pickle"), "wb") as f:
        f.write(whole[: len(whole) // 2])
    broken = frag.dump("v2_11")
    broken["segments"][1]["blocks"][0]["size"] = "ten"
    write(os.path.join(out, "bad_type.pickle"), broken, 4)


if __name__ == "__main__":
    main()
