#!/usr/bin/env python3
"""oomtune's CPU-measured peaks next to PyTorch's own on a GPU (issue #11,
validation item 1): for each case, `oomtune probe --json` on the CPU, and
scripts/eager_peaks.py on CUDA training the eager nn.Module (what users run)
and the TorchScript file (what oomtune runs). Prints a Markdown table per
case and writes every run's JSON into --out.

    compare_peaks.py --oomtune BUILD/oomtune --out DIR CASE [CASE ...]

CASE is JOB.toml:MICRO_BATCH[:ckpt][:bf16], e.g. examples/gpt.toml:32:ckpt.
Errors are (oomtune - eager) / eager: oomtune counts the bytes tensors ask
for, PyTorch's allocated bytes are rounded up to 512-byte blocks
(c10/cuda/CUDACachingAllocator.cpp, kMinBlockSize), and cuBLAS/cuDNN
workspaces are on CUDA only; a gap beyond a few % is something to explain.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
PHASES = ("forward", "loss", "backward", "optimizer")
MiB = 1024.0 * 1024.0


def run_json(command, path):
    """Runs `command`, keeps its stdout in `path`, returns the parsed JSON or the error text."""
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return "timed out after 180 s"
    with open(path, "w") as f:
        f.write(done.stdout)
    if done.returncode != 0:
        return f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    return json.loads(done.stdout)


def largest(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None


def mib(value):
    return "-" if value is None else f"{value / MiB:.2f}"


def error(ours, reference):
    if ours is None or not reference:
        return "-"
    return f"{100.0 * (ours - reference) / reference:+.1f} %"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oomtune", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--device", default="cuda", help="cpu runs the plumbing only: no byte counts there")
    parser.add_argument("cases", nargs="+")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    sys.stdout.reconfigure(line_buffering=True)  # a run stopped by its time limit keeps what it printed

    for case in args.cases:
        job, micro_batch, *flags = case.split(":")
        ckpt = "all" if "ckpt" in flags else "none"
        precision = "bf16" if "bf16" in flags else "fp32"
        tag = f"{os.path.basename(job)[:-5]}_{micro_batch}_{ckpt}_{precision}"
        config = f"micro_batch={micro_batch},ckpt={ckpt},precision={precision}"
        ours = run_json([args.oomtune, "probe", job, "--json", "--no-fit", "--batch", micro_batch,
                         "--config", config], os.path.join(args.out, f"{tag}_oomtune.json"))
        references = {}
        for mode in ("eager", "script"):
            if mode == "script" and ckpt == "all":
                continue  # eager_peaks.py checkpoints the eager module only
            references[mode] = run_json(
                [args.python, os.path.join(HERE, "eager_peaks.py"), job, "--micro-batch", micro_batch,
                 "--mode", mode, "--ckpt", ckpt, "--precision", precision, "--device", args.device],
                os.path.join(args.out, f"{tag}_{mode}.json"))

        print(f"\n### {job}, micro-batch {micro_batch}, ckpt={ckpt}, {precision}\n")
        failed = [f"{name}: {r}" for name, r in [("oomtune", ours)] + list(references.items()) if isinstance(r, str)]
        if failed:
            print("failed: " + "; ".join(failed))
            continue
        phases = ours["report"]["phases"]
        steps = {mode: r["steps"][r["measured_step"]] for mode, r in references.items()}
        print("| phase | oomtune (CPU) MiB | TorchScript on CUDA MiB | eager on CUDA MiB | oomtune vs eager |")
        print("|---|---:|---:|---:|---:|")
        for phase in PHASES:
            ours_peak = phases[phase]["peak_bytes"]
            script = steps.get("script", {}).get(phase, {}).get("peak_bytes")
            eager = steps["eager"][phase]["peak_bytes"]
            print(f"| {phase} | {mib(ours_peak)} | {mib(script)} | {mib(eager)} | {error(ours_peak, eager)} |")
        ours_step = ours["report"]["peak_bytes"]
        eager_step = largest(steps["eager"][p]["peak_bytes"] for p in PHASES)
        script_step = largest(steps["script"][p]["peak_bytes"] for p in PHASES) if "script" in steps else None
        print(f"| step | {mib(ours_step)} | {mib(script_step)} | {mib(eager_step)} | {error(ours_step, eager_step)} |")
        predicted = ours["report"].get("reserved", {}).get("peak_reserved_bytes")
        eager_reserved = largest(steps["eager"][p]["peak_reserved_bytes"] for p in PHASES)
        print(f"| reserved (oomtune predicted) | {mib(predicted)} | | {mib(eager_reserved)} | "
              f"{error(predicted, eager_reserved)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
