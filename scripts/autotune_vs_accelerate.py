#!/usr/bin/env python3
"""`oomtune autotune --device cuda` against Hugging Face Accelerate's
find_executable_batch_size on the same model and budget, in one run on one
GPU (issue #44; scripts/device_check.sh --autotune), then each answer
trained again in a fresh PyTorch process for --rerun-steps steps under the
same budget: it must not run out of memory (fitting two steps is not
fitting, DESIGN.md).

    autotune_vs_accelerate.py --oomtune BUILD/oomtune --out DIR [--rerun-steps 100]
                              [--deadline SECONDS] JOB.toml:BUDGET [...]

BUDGET is bytes or oomtune's units (8GiB). For each case: autotune's choice,
its trials (probes, meta runs, verifications) and wall time, its verified
peak and reserved bytes and samples/s; Accelerate's batch size
(scripts/accelerate_batch_size.py: starting at the job's global batch,
x 0.9 on each out-of-memory, 2 steps an attempt), its attempts and wall time; then both
answers as eager PyTorch trains them (scripts/eager_peaks.py --steps N
--budget), samples/s from those runs (the global batch differs: Accelerate
has no accumulation). A choice eager_peaks.py cannot train (8-bit AdamW,
offload, partial checkpointing) is said so, not rerun. Prints a Markdown
table and writes every run's output and results.json into --out.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def parse_bytes(text):
    match = re.fullmatch(r"([0-9.]+)\s*([KMG]i?B|B)?", text)
    if not match:
        raise SystemExit(f"autotune_vs_accelerate.py: {text!r}: expected bytes or e.g. 8GiB")
    return int(float(match.group(1)) * UNITS[match.group(2) or "B"])


class Deadline:
    """Seconds left of --deadline for the next run (None: no bound)."""

    def __init__(self, seconds):
        self.end = None if seconds is None else time.monotonic() + seconds

    def timeout(self, cap):
        """min(cap, seconds left); cap None: the seconds left (None without a deadline)."""
        if self.end is None:
            return cap
        left = max(0, int(self.end - time.monotonic()))
        return left if cap is None else min(cap, left)


def run(command, path, deadline, cap=600):
    """Runs `command`, keeps its stdout in `path`: (exit status or None when
    not run or timed out, parsed JSON or None, seconds, stderr's last line)."""
    timeout = deadline.timeout(cap)
    if timeout < 5:
        return None, None, 0.0, "not run: out of time"
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, None, time.perf_counter() - start, f"timed out after {timeout} s"
    seconds = time.perf_counter() - start
    with open(path, "w") as f:
        f.write(done.stdout)
    try:
        output = json.loads(done.stdout)
    except json.JSONDecodeError:
        output = None
    lines = done.stderr.strip().splitlines()
    return done.returncode, output, seconds, lines[-1] if lines else ""


def eager_config(config):
    """eager_peaks.py's arguments for an oomtune config string, or None where it cannot train it."""
    settings = dict(item.split("=", 1) for item in config.split(","))
    if settings.get("optimizer") not in ("adamw", "sgd") or settings.get("offload") != "off" or \
            settings.get("ckpt") not in ("none", "all") or settings.get("precision") not in ("fp32", "bf16"):
        return None
    return ["--micro-batch", settings["micro_batch"], "--accum", settings["accum"], "--ckpt", settings["ckpt"],
            "--precision", settings["precision"]]


def rerun(args, job, budget, eager_args, tag, deadline):
    """The answer trained for --rerun-steps steps in a fresh PyTorch process under the budget."""
    status, output, seconds, why = run([args.python, os.path.join(HERE, "eager_peaks.py"), job, "--budget",
                                        str(budget), "--steps", str(args.rerun_steps), "--device", "cuda",
                                        *eager_args], os.path.join(args.out, f"{tag}.json"), deadline)
    if output is None:
        return {"error": why or f"exit {status}"}
    steps = output["steps"]
    timed = steps[1:] or steps  # the first step allocates the optimizer state and warms up the kernels
    samples = output["micro_batch"] * output["accum"] * len(timed)
    return {"steps_run": len(steps), "out_of_memory": output.get("out_of_memory"),
            "samples_per_second": samples / sum(s["seconds"] for s in timed) if timed else None,
            "peak_bytes": max((s[p]["peak_bytes"] for s in steps for p in ("forward", "loss", "backward",
                                                                             "optimizer")), default=None)}


def compare(args, job, budget_text, deadline):
    budget = parse_bytes(budget_text)
    name = f"{os.path.basename(job)[:-5]}_{budget_text}"
    result = {"case": f"{job}:{budget_text}", "budget_bytes": budget}
    status, output, seconds, why = run([args.oomtune, "autotune", job, "--device", "cuda", "--budget", budget_text,
                                        "--json", "--snapshot-dir", os.path.join(args.out, f"{name}_snapshots")],
                                       os.path.join(args.out, f"{name}_autotune.json"), deadline)
    chosen = (output or {}).get("chosen")
    if chosen:
        verification = chosen.get("verification") or {}
        result["oomtune"] = {
            "config": chosen["config"], "seconds": seconds,
            "trials": len(output.get("probes", [])) + output.get("verification_trials", 0),
            "meta_trials": output.get("meta_trials", 0),
            "peak_bytes": verification.get("peak_bytes"),
            "reserved_bytes": (verification.get("measured_reserved") or {}).get("peak_reserved_bytes"),
            "samples_per_second": verification.get("samples_per_second")}
        eager_args = eager_config(chosen["config"])
        result["oomtune"]["rerun"] = (rerun(args, job, budget, eager_args, f"{name}_oomtune_rerun", deadline)
                                      if eager_args else {"error": "eager_peaks.py cannot train this configuration"})
    else:
        result["oomtune"] = {"error": why or f"exit {status}: no configuration chosen", "seconds": seconds}

    status, output, seconds, why = run([args.python, os.path.join(HERE, "accelerate_batch_size.py"), job, "--budget",
                                        str(budget)], os.path.join(args.out, f"{name}_accelerate.json"), deadline)
    if output and output.get("batch_size"):
        result["accelerate"] = {"batch_size": output["batch_size"], "attempts": len(output["attempts"]),
                                "seconds": output["wall_seconds"]}
        result["accelerate"]["rerun"] = rerun(args, job, budget, ["--micro-batch", str(output["batch_size"])],
                                              f"{name}_accelerate_rerun", deadline)
    else:
        result["accelerate"] = {"error": (output or {}).get("error") or why or f"exit {status}"}
    return result


def rerun_cell(side):
    r = side.get("rerun") or {}
    if "error" in r:
        return r["error"]
    if r.get("out_of_memory"):
        return f"out of memory at step {r['out_of_memory']['step']} ({r['out_of_memory']['phase']})"
    return f"{r['steps_run']} steps, {r['samples_per_second']:.1f} samples/s, peak {r['peak_bytes'] / 2**20:.0f} MiB"


def table(results):
    lines = ["| case | oomtune choice | trials (meta) | s | verified peak / reserved MiB | eager rerun | "
             "Accelerate batch | attempts | s | eager rerun |", "|---|---|---:|---:|---:|---|---:|---:|---:|---|"]
    for r in results:
        o, a = r["oomtune"], r["accelerate"]
        if "error" in o:
            ours = f"{o['error']} | | | |"
        else:
            mib = lambda v: "-" if v is None else f"{v / 2**20:.0f}"  # noqa: E731
            ours = (f"{o['config']} | {o['trials']} ({o['meta_trials']}) | {o['seconds']:.0f} | "
                    f"{mib(o['peak_bytes'])} / {mib(o['reserved_bytes'])} | {rerun_cell(o)}")
        theirs = (f"{a['error']} | | |" if "error" in a else
                  f"{a['batch_size']} | {a['attempts']} | {a['seconds']:.0f} | {rerun_cell(a)}")
        lines.append(f"| {r['case']} | {ours} | {theirs} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oomtune", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rerun-steps", type=int, default=100)
    parser.add_argument("--deadline", type=int, help="seconds from the start after which nothing starts; each "
                        "case gets an equal share of what is left when it starts")
    parser.add_argument("cases", nargs="+", metavar="JOB.toml:BUDGET")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    deadline = Deadline(args.deadline)
    results = []
    for index, case in enumerate(args.cases):
        job, _, budget = case.rpartition(":")
        # Each case gets an equal share of what is left, so that a slow one leaves the others their time.
        left = deadline.timeout(None)
        share = Deadline(None if left is None else left // (len(args.cases) - index))
        results.append(compare(args, job, budget, share))
        with open(os.path.join(args.out, "results.json"), "w") as f:  # what is done survives a later timeout
            json.dump(results, f, indent=1)
        print(f"autotune_vs_accelerate: {case} done", file=sys.stderr, flush=True)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
