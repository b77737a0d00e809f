"""scripts/record_cpu_snapshot.py on the CPU, then `oomtune diagnose`, on
a real transformers GPT-2 (PyTorch's own allocations, lifetimes and
frames; backward's stacks as CUDA's allocator records them on the engine's
device thread):

- its forward under `with torch.no_grad():`, which leaves no frame, reads
  as inference from its blocks (Note [Blocks that kept nothing],
  diagnose/nothing_saved.h) and gets no activation checkpointing, its need
  the blocks still to run (Note [Blocks without autograd]) within 5% of
  the uncapped run's growth; the same
  forward with autograd, at the same share of its allocations, reads as
  training, where the rest of its blocks, the head's logits and the loss's
  log_softmax over them are what it still needed (Note [Phase need] rule
  3, Note [A language model's head]), within 5% of what the run without
  the cap allocates from there. The
  model's weights, made in its own __init__ on the device, are its
  parameters; a Llama's training forward (--model llama) likewise, its d
  from its norms' size where its MLP's matrices are the most common;
- the second training step's forward: the first step's says what it still
  needed (Note [Phase need] rule 1), within 5% of the uncapped run; a
  Llama's, whose backward rises above its forward, with the first step's
  backward (Note [The rest of the iteration]);
- a first optimizer step: AdamW's states are two per parameter, the
  foreach temporaries alive at the out-of-memory are temporaries, the need
  within 5% of the uncapped run's; a fused AdamW failing among its states
  reads as fused from its step counters (Note [Step counters on the
  device]); RMSprop's and SGD's one state; options that add states
  (amsgrad=True; RMSprop's momentum and centered=True) three, from
  _init_group's lines (Note [States an option adds]);
- an out-of-memory in backward past its first block, plain and with
  activation checkpointing: what the rest of backward's blocks need (Note
  [Blocks in backward], diagnose/backward_need.cpp), then the embeddings'
  gradients (and a tied head's sum with the embedding's), is more than
  the request and at most 5% above what the same run without the cap
  allocates from there, within a quarter of it below plain and a tenth
  with checkpointing (a Llama's plain backward, its head untied, within
  15%: no more blocks than its parameters show); one while backward
  recomputes a
  checkpointed block: what the rest of the recomputation needs (Note
  [Recomputed block]), likewise more than the request and at most that;
- the plain backward under torch.compile(backend="aot_eager") with the
  snapshot augmented with FX traces (--compile): the failing call's layer
  a modeling_gpt2.py line (diagnose/fx_trace.h), the need as plain's;
- with a CUDA recorder only, torch.compile(mode="reduce-overhead")
  (--cuda-graphs): the AdamW step out of memory beside the CUDA graphs'
  private pool, which it cannot use (Note [Private memory pools]); and
  torch.cuda.empty_cache() after each step (--empty-cache): the calls
  found by their stack (FrameIndex::calls_empty_cache), one a step before
  the failing one.

Exit 77 (skipped) without transformers.

Usage: cpu_snapshot_test.py SOURCE_DIR OOMTUNE [RECORDER [RECORDER_ARGS...]]

Prints a line per case (phase, need, the uncapped run's growth, the first
verdict); with OOMTUNE_RECORDED_DIR set, the snapshots and their diagnoses
(--json) stay in that folder.

RECORDER (default SOURCE_DIR/scripts/record_cpu_snapshot.py): another
recorder taking the same options (after RECORDER_ARGS) and printing the
same JSON; on the GPU machine scripts/record_cuda_snapshot.py, whose
snapshots are CUDA's own (docs/gpu_machine.md), and anywhere
tests/scripts/replay_recorded.py with the folder of those recorded on an
H200 (ctest h200_snapshots_diagnosed): the same expectations hold there,
but two. Which phase of the first step peaks higher is CUDA's kernels'
(GPT-2's backward rises above its forward on the H200, a Llama's does not),
so the second step's later phase is held to the CPU's only there. Where the
recorder says the whole run was under a default device ("default_device":
`with torch.device("cuda"):`), foreach's step counters are on the device
too and a fused AdamW failing among its states reads as foreach: its need
then exceeds the uncapped run's by foreach's temporaries (1 x the
parameters' bytes), within 5%. A case the recorder has no recording of
(exit 78) is said and skipped.
"""

import contextlib
import json
import os
import subprocess
import sys
import tempfile

source, oomtune = sys.argv[1], sys.argv[2]
recorder = sys.argv[3] if len(sys.argv) > 3 else os.path.join(source, "scripts", "record_cpu_snapshot.py")
recorder_args = sys.argv[4:]
on_cpu = os.path.basename(recorder) == "record_cpu_snapshot.py"
NOT_RECORDED = 78  # replay_recorded.py: no recording of the case
failures = []


def record_and_diagnose(name, args, tmp):
    """(what the recorder printed, oomtune diagnose --json), or None after a
    failure; prints a line of each: the need against the uncapped run's
    growth."""
    out = os.path.join(tmp, f"{name}.pickle")
    run = subprocess.run([sys.executable, recorder] + recorder_args + ["--out", out] + args, capture_output=True,
                         text=True)
    if run.returncode == 77:
        print(run.stdout.strip())
        sys.exit(77)
    if run.returncode == NOT_RECORDED:
        print(run.stdout.strip(), flush=True)
        return None
    if run.returncode != 0:
        failures.append(f"{name}: {os.path.basename(recorder)} exited {run.returncode}: {run.stderr[-2000:]}")
        return None
    recorded = json.loads(run.stdout.strip().splitlines()[-1])
    if recorded["oom_at"] is None:
        failures.append(f"{name}: the recording did not run out of memory: {recorded}")
        return None
    diagnosis = subprocess.run([oomtune, "diagnose", out, "--json"], capture_output=True, text=True)
    if diagnosis.returncode != 0:
        failures.append(f"{name}: oomtune diagnose exited {diagnosis.returncode}: {diagnosis.stderr}")
        return None
    with open(os.path.join(tmp, f"{name}.json"), "w") as f:
        f.write(diagnosis.stdout)
    d = json.loads(diagnosis.stdout)
    need, growth = d["need"], recorded["uncapped_growth_bytes"]
    print(f"{name}: {d['ooms'][-1]['phase']}, need {need['method']} {need['still_needed_bytes']} B, the uncapped "
          f"run {growth} B ({need['still_needed_bytes'] / max(growth, 1):.3f}), verdict {d['verdicts'][0]['id']}", flush=True)
    return recorded, d


def check_training_forward(name, recorded, d, within):
    """A training forward's need (Note [Phase need] rule 3, Note [A language model's head]): the rest of its
    blocks, the head's logits of --batch 4 x --seq 256 tokens x 1000 entries x 4 B and the loss's log_softmax
    as large, above the request and within `within` of what the run without the cap allocates from there."""
    need, growth, oom = d["need"], recorded["uncapped_growth_bytes"], d["ooms"][-1]
    if (need["method"] != "forward_blocks" or need["head_bytes"] != 4 * 256 * 1000 * 4 or
            need["loss_bytes"] != need["head_bytes"] or not oom["rounded_bytes"] < need["still_needed_bytes"] or
            abs(need["still_needed_bytes"] - growth) > within * growth):
        failures.append(f"{name}: expected the forward blocks' need with the logits of 1024 tokens x 1000 entries "
                        f"and the loss, within {within:.0%} of the {growth} B the uncapped run allocates from "
                        f"there; got {need['method']}, {need['still_needed_bytes']} B: {need['estimate']}")


keep = os.environ.get("OOMTUNE_RECORDED_DIR")  # the snapshots and diagnoses kept there (device_check.sh)
if keep:
    os.makedirs(keep, exist_ok=True)
with tempfile.TemporaryDirectory() if not keep else contextlib.nullcontext(keep) as tmp:
    for mode, kind, verdict in (("no_grad", "nothing_saved", "inference_forward"),
                                ("train", "none", "activations_in_forward")):
        result = record_and_diagnose(mode, ["--mode", mode, "--oom-after", "0.7"], tmp)
        if result is None:
            continue
        recorded, d = result
        oom = d["ooms"][-1]
        fixes = [r["change"] for r in d["recommendations"]]
        got = (oom["phase"], oom["inference_kind"], d["verdicts"][0]["id"])
        if got != ("forward", kind, verdict):
            failures.append(f"{mode}: expected (forward, {kind}, {verdict}), got {got}; {d['verdicts'][0]}")
        # The model is built inside the recording, on the "device": its weights are parameters
        # (transformers' Conv1D makes them in its own __init__, frames.h).
        if oom["alive"]["parameters_bytes"] != recorded["parameter_bytes"]:
            failures.append(f"{mode}: expected the model's {recorded['parameter_bytes']} bytes of parameters alive, "
                            f"got {oom['alive']}")
        if not os.path.basename(oom["layer"]).startswith("modeling_gpt2.py:"):
            failures.append(f"{mode}: expected the layer in modeling_gpt2.py, got {oom['layer']!r}")
        checkpointing = any(f.startswith("Activation checkpointing") for f in fixes)
        if checkpointing != (mode == "train"):
            failures.append(f"{mode}: activation checkpointing {'missing from' if mode == 'train' else 'in'} "
                            f"the recommendations: {fixes}")
        # Half a block's allocations of earlier blocks, at least (Note [Blocks that kept nothing]).
        if mode == "no_grad" and \
                2 * oom["nothing_saved"]["freed_allocations"] < oom["nothing_saved"]["block_allocations"]:
            failures.append(f"{mode}: expected at least half a block's allocations freed, got {oom['nothing_saved']}")
        if mode == "train":
            check_training_forward(mode, recorded, d, 0.05)
        # Without autograd: the blocks still to run, above the KV cache entries each keeps (Note [Blocks
        # without autograd]), within 5% of the uncapped run's growth.
        need, growth = d["need"], recorded["uncapped_growth_bytes"]
        if mode == "no_grad" and (need["method"] != "inference_blocks" or
                                  abs(need["still_needed_bytes"] - growth) > 0.05 * growth):
            failures.append(f"{mode}: expected the inference blocks' need within 5% of the {growth} B the uncapped "
                            f"run allocates from there; got {need['method']}, {need['still_needed_bytes']} B: "
                            f"{need['estimate']}")

    # A Llama's forward: its blocks' most common parameter size is the MLP's (d x ff, three of them), which
    # divides neither its embedding nor the embedding's output; d is its norms' (Note [A language model's
    # head]): the logits of 4 x 256 tokens x 1000 entries and the loss's log_softmax, within 10% of the run
    # without the cap.
    result = record_and_diagnose("llama_train", ["--mode", "train", "--model", "llama", "--oom-after", "0.7"], tmp)
    if result is not None:
        check_training_forward("llama train", *result, 0.1)

    # The second training step's forward (AdamW's states alive): the first step's forward says what it
    # still needed (Note [Phase need] rule 1), within 5% of what the run without the cap allocates from
    # there (the first forward makes a few tensors once). A Llama's backward rises above its forward
    # (its untied head's gradient): the first step's backward says so (Note [The rest of the iteration]).
    for name, model, later in (("second step", "gpt2", None), ("llama second step", "llama", "backward")):
        result = record_and_diagnose(name.replace(" ", "_"), ["--mode", "step", "--model", model, "--steps", "2",
                                                              "--optimizer", "--oom-in", "forward"], tmp)
        if result is None:
            continue
        recorded, d = result
        need, growth = d["need"], recorded["uncapped_growth_bytes"]
        if need["method"] != "trace" or (on_cpu and need["later_peak_phase"] != later) or \
                abs(need["still_needed_bytes"] - growth) > 0.05 * growth:
            failures.append(f"{name}: expected the trace rule (a later peak in {later}) within 5% of the {growth} "
                            f"B the uncapped run allocates from there; got {need['method']}, "
                            f"{need['still_needed_bytes']} B: {need['estimate']}")

    # A first optimizer step (foreach, as on CUDA) out of memory after its states were made: the states
    # alive are the optimizer's per parameter (and its one-element `step` counters, host tensors on CUDA):
    # AdamW two, RMSprop one (square_avg), SGD with momentum one (momentum_buffer, made by its foreach
    # arithmetic, which makes no other temporaries); the foreach temporaries alive then are temporaries
    # (FrameIndex::runs_optimizer_math); the optimizer is named from its frames (OptimizerKind), and so is
    # the 8-bit class recommended. The need (the states still to make, then the arithmetic's temporaries
    # less those alive) is within 5% of what the uncapped run allocates from there; at --share 0.2 the
    # step fails among its states, before any frame shows the implementation (foreach assumed).
    # torch 2.11's AdamW runs Adam's step (adam.py), which names both.
    # fused=True (--fused, at --share 0.5: among its states): no frame of its arithmetic yet, but its step
    # counters on the device (Note [Step counters on the device]): fused, no temporaries to come. Options
    # that add states (AdamW's amsgrad, RMSprop's momentum and centered; at --share 0.2, among them): the
    # states its _init_group's lines make, three (Note [States an option adds]).
    fused = ["--fused"]
    amsgrad = ["--optimizer-option", "amsgrad=True"]
    rmsprop_options = ["--optimizer-option", "momentum=0.9", "--optimizer-option", "centered=True"]
    for kind, share, name, eight_bit_class, states, options in (
            ("adamw", "1", "Adam/AdamW", "Adam8bit or AdamW8bit", 2, []),
            ("adamw", "0.2", "Adam/AdamW", "Adam8bit or AdamW8bit", 2, []),
            ("adamw", "0.5", "Adam/AdamW", "Adam8bit or AdamW8bit", 2, fused),
            ("adamw", "0.2", "Adam/AdamW", "Adam8bit or AdamW8bit", 3, amsgrad),
            ("rmsprop", "1", "RMSprop", "RMSprop8bit", 1, []),
            ("rmsprop", "0.2", "RMSprop", "RMSprop8bit", 3, rmsprop_options),
            ("sgd", "0.5", "SGD", "SGD8bit", 1, [])):
        fused_step = options == fused
        result = record_and_diagnose(f"first_{kind}_step_{share}{'_fused' if fused_step else ''}"
                                     f"{'_options' if options and not fused_step else ''}",
                                     ["--mode", "step", "--batch", "1", "--seq", "32", "--optimizer", kind,
                                      "--oom-in", "optimizer", "--share", share] + options, tmp)
        if result is None:
            continue
        recorded, d = result
        oom, need, params = d["ooms"][-1], d["need"], recorded["parameter_bytes"]
        growth = recorded["uncapped_growth_bytes"]
        state, temporaries = oom["alive"]["optimizer_state_bytes"], oom["alive"]["temporaries_bytes"]
        eight_bit = [r["change"] for r in d["recommendations"] if r["id"] == "adamw_8bit"]
        states_made = share == "1"
        # Under a default device the fused step reads as foreach: its whole-list temporaries, 1 x the
        # parameters' bytes, come on top of what the run allocates.
        read_as_foreach = fused_step and recorded.get("default_device", False)
        implementation = ("foreach", "default_device") if read_as_foreach else \
            ("fused", "step_counters") if fused_step else ("foreach", need["optimizer_implementation_basis"])
        expected = growth + (params if read_as_foreach else 0)
        if oom["phase"] != "optimizer" or need["method"] != "optimizer_first_step" or \
                need["states_per_parameter"] != states or (d["optimizer"] or {}).get("name") != name or \
                (states_made and not (states * params <= state < states * params + (1 << 20) and temporaries > 0)) or \
                (need["optimizer_implementation"], need["optimizer_implementation_basis"]) != implementation or \
                abs(need["still_needed_bytes"] - expected) > 0.05 * expected or \
                eight_bit != [f"8-bit {name} (bitsandbytes.optim.{eight_bit_class}: blockwise-quantized states)"]:
            failures.append(f"first {name} step (share {share}): expected {states} x {params} B of state "
                            f"(+ the step counters), the foreach temporaries apart, {implementation}, "
                            f"optimizer_first_step within 5% of {expected} B (the uncapped run allocates {growth} B), "
                            f"and 8-bit {name}; got {oom['phase']}, "
                            f"{need['method']}, {need['still_needed_bytes']} B ({need['estimate']}), "
                            f"{d['optimizer']}, {oom['alive']}, {eight_bit}")

    # Backward: weights' gradients outgrow the activations each block frees
    # at one sequence of 32 tokens, so backward grows block by block.
    for name, args, method, within in (
            ("plain backward", ["--batch", "1", "--seq", "32", "--oom-in", "backward", "--share", "0.8"],
             "backward_blocks", 0.25),
            ("checkpointed backward", ["--checkpointing", "--eager-attention", "--oom-in", "backward",
                                       "--share", "0.5"], "backward_blocks", 0.1),
            ("recomputation", ["--checkpointing", "--eager-attention", "--oom-in", "recomputation"],
             "recomputed_block", None),
            # A Llama: no more blocks than its parameters show (Note [Blocks in backward]), its head untied.
            ("llama plain backward", ["--model", "llama", "--batch", "1", "--seq", "32", "--oom-in", "backward",
                                      "--share", "0.8"], "backward_blocks", 0.15)):
        result = record_and_diagnose(name.replace(" ", "_"), ["--mode", "step"] + args, tmp)
        if result is None:
            continue
        recorded, d = result
        need, oom, growth = d["need"], d["ooms"][-1], recorded["uncapped_growth_bytes"]
        if oom["phase"] != "backward" or need["method"] != method or oom["recomputing"] != (method ==
                                                                                          "recomputed_block"):
            failures.append(f"{name}: expected a backward out-of-memory read by the {method} rule; got "
                            f"{oom['phase']}, recomputing {oom['recomputing']}, {need['method']}: {need['estimate']}")
            continue
        still = need["still_needed_bytes"]
        ceiling = growth * (1.05 if method == "backward_blocks" else 1)
        if not oom["rounded_bytes"] < still <= ceiling or (within and still < (1 - within) * growth):
            failures.append(f"{name}: expected the need above the {oom['rounded_bytes']} B request and at most "
                            f"{ceiling:.0f} B (the uncapped run allocates {growth} B from there)"
                            f"{f' (within {within:.0%})' if within else ''}; got {still} B: {need['estimate']}")

    # The plain backward under torch.compile(backend="aot_eager"), the
    # snapshot augmented with FX traces: its allocations go to the model's
    # lines through the generated code's fx_original_trace (diagnose/fx_trace.h).
    result = record_and_diagnose("compiled_backward", ["--mode", "step", "--batch", "1", "--seq", "32", "--oom-in",
                                                      "backward", "--share", "0.8", "--compile"], tmp)
    if result is not None:
        recorded, d = result
        need, oom, growth = d["need"], d["ooms"][-1], recorded["uncapped_growth_bytes"]
        if (oom["phase"] != "backward" or "modeling_gpt2.py:" not in oom["layer"] or
                d["trace"]["fx_traced_frames"] < 1 or need["method"] != "backward_blocks" or
                not oom["rounded_bytes"] < need["still_needed_bytes"] <= 1.05 * growth or
                need["still_needed_bytes"] < 0.75 * growth):
            failures.append(f"compiled backward: expected a backward out-of-memory in a modeling_gpt2.py line "
                            f"(frames with FX traces), read by the backward_blocks rule within 25% below and 5% "
                            f"above the {growth} B the uncapped run allocates from there; got {oom['phase']} at "
                            f"'{oom['layer']}', {d['trace']['fx_traced_frames']} traced frames, {need['method']}, "
                            f"{need['still_needed_bytes']} B: {need['estimate']}")
    # torch.compile(mode="reduce-overhead") on CUDA (the CPU recorder has no
    # CUDA graphs: exit 78): forward and backward recorded into CUDA graph
    # trees, whose private pool the eager AdamW step cannot use (Note
    # [Private memory pools], diagnose/analysis.cpp). Checked: the dump
    # names the pool's segments, and the step's request is no recording.
    if not on_cpu:
        result = record_and_diagnose("cuda_graphs_optimizer", ["--mode", "step", "--steps", "3", "--optimizer",
                                                               "adamw", "--oom-in", "optimizer", "--share", "0.5",
                                                               "--cuda-graphs"], tmp)
        if result is not None:
            recorded, d = result
            oom = d["ooms"][-1]
            if oom["phase"] != "optimizer" or oom["private_pool_segments"] < 1 or oom["captures_cuda_graph"]:
                failures.append(f"cuda graphs: expected an optimizer out-of-memory outside any recording beside "
                                f"private pool segments; got {oom['phase']}, {oom['private_pool_segments']} "
                                f"segments ({oom['private_pool_reserved_bytes']} B reserved, "
                                f"{oom['private_pool_free_bytes']} B free), captures_cuda_graph "
                                f"{oom['captures_cuda_graph']}")

    # torch.cuda.empty_cache() after each step (CUDA only): its segment_free
    # events carry the call's stack (emptyCache gathers the context), which
    # the allocator-settings replays follow (diagnose/setting_replay.h).
    if not on_cpu:
        result = record_and_diagnose("empty_cache_steps", ["--mode", "step", "--steps", "3", "--optimizer", "adamw",
                                                           "--oom-in", "forward", "--share", "0.5",
                                                           "--empty-cache"], tmp)
        if result is not None:
            recorded, d = result
            calls = d["trace"]["empty_cache_calls"]
            if calls != 2:
                failures.append(f"empty_cache: expected the 2 calls after steps 0 and 1 found by their stack; got "
                                f"{calls}")
    # A side stream's segment, 124 MiB of it free beside a kept 4 MiB tensor
    # (--side-stream): none of it usable by the default stream's forward
    # (diagnose: Note [Memory on other streams]), and the replay under the
    # recording's own settings, each request on its stream, fails where
    # the allocator did.
    if not on_cpu:
        result = record_and_diagnose("side_stream", ["--mode", "step", "--steps", "2", "--optimizer", "adamw",
                                                     "--oom-in", "forward", "--share", "0.5", "--side-stream"], tmp)
        if result is not None:
            recorded, d = result
            oom = d["ooms"][-1]
            replay = d["as_recorded_replay"]  # null where no allocator setting was replayed
            if oom["other_stream_free_bytes"] != 124 << 20 or oom["other_stream_segments"] != 1:
                failures.append(f"side_stream: expected 1 segment of another stream with 124 MiB free; got "
                                f"{oom['other_stream_segments']} with {oom['other_stream_free_bytes']} B")
            if replay is not None and not replay["reproduces_oom"]:
                failures.append(f"side_stream: the replay under the recording's settings did not fail where the "
                                f"allocator did: {replay}")

for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
