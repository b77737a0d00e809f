"""scripts/record_cpu_snapshot.py on the CPU, then `oomtune diagnose`: a
real GPT-2 forward (transformers, PyTorch's own allocations, lifetimes and
frames) under `with torch.no_grad():`, which leaves no frame, reads as
inference from its blocks (Note [Blocks that kept nothing],
diagnose/nothing_saved.h) and gets no activation checkpointing; the same
forward with autograd, at the same share of its allocations, reads as
training. The model's weights, made in its own __init__ on the device, are
its parameters. Exit 77 (skipped) without transformers.

Usage: no_grad_snapshot_test.py SOURCE_DIR OOMTUNE
"""

import json
import os
import subprocess
import sys
import tempfile

source, oomtune = sys.argv[1], sys.argv[2]
recorder = os.path.join(source, "scripts", "record_cpu_snapshot.py")
failures = []
with tempfile.TemporaryDirectory() as tmp:
    for mode, kind, verdict in (("no_grad", "nothing_saved", "inference_forward"),
                                ("train", "none", "activations_in_forward")):
        out = os.path.join(tmp, f"{mode}.pickle")
        run = subprocess.run([sys.executable, recorder, "--out", out, "--mode", mode, "--oom-after", "0.7"],
                             capture_output=True, text=True)
        if run.returncode == 77:
            print(run.stdout.strip())
            sys.exit(77)
        if run.returncode != 0:
            failures.append(f"{mode}: record_cpu_snapshot.py exited {run.returncode}: {run.stderr[-2000:]}")
            continue
        recorded = json.loads(run.stdout.strip().splitlines()[-1])
        if recorded["oom_at"] is None:
            failures.append(f"{mode}: the recording did not run out of memory: {recorded}")
            continue
        diagnosis = subprocess.run([oomtune, "diagnose", out, "--json"], capture_output=True, text=True)
        if diagnosis.returncode != 0:
            failures.append(f"{mode}: oomtune diagnose exited {diagnosis.returncode}: {diagnosis.stderr}")
            continue
        d = json.loads(diagnosis.stdout)
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
        if mode == "no_grad" and oom["nothing_saved"]["freed_allocations"] < oom["nothing_saved"]["block_allocations"]:
            failures.append(f"{mode}: expected at least a block's allocations freed, got {oom['nothing_saved']}")
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
