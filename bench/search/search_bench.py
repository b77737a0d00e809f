#!/usr/bin/env python3
"""bench/search: oomtune's search against two batch-size finders and an oracle.

Every method gets the same real trial, run by the oomtune binary on the CPU
backend with the budget enforced (the counting allocator fails an allocation
that would pass the usable budget, as a GPU would):

    oomtune probe JOB --config micro_batch=B[,STRATEGY] --enforce-budget --no-fit --json

and a trial fits when it ran and its peak is within the usable budget
(bench/common/probe_trial.py: a kernel's output can pass the budget unrefused,
and such a run reads "over_budget").

runs the job's whole global batch as ceil(G/B) micro-batches of B (gradient
accumulation, remainder = "last_smaller"), so "B fits" means the training
step the user would run fits, with accumulated gradients alive.

Methods (the baselines only change the micro-batch; they know no strategies):
  lightning   Lightning's scale_batch_size(mode="binsearch") as implemented in
              lightning/pytorch/tuner/batch_size_scaling.py (_run_binary_scaling):
              start at init_val (2), double on success until the first OOM,
              then bisect between the last success (low) and the failure
              (high) until high - low <= 1; at most max_trials (25) successful
              trials. The size is capped at the global batch (Lightning caps
              it at the dataset length in _adjust_batch_size).
  accelerate  Accelerate's find_executable_batch_size (accelerate/utils/memory.py):
              start at starting_batch_size and on each OOM set
              batch_size = int(batch_size * 0.9) until one runs (or 0).
              starting_batch_size is the global batch here (the default 128
              would only add failing trials).
  oomtune     `oomtune autotune JOB --json`: probes, then at most 3 verification
              runs; "largest" is the largest micro-batch it predicts plain to
              fit (largest_fitting_micro_batch of its "micro-batch +
              accumulation" or "plain" node; the node itself runs the
              balanced split with as few micro-batches).
  oracle      every micro-batch 1..G with each strategy set (plain, ckpt=all,
              optimizer=adamw8bit, offload=on): the largest plain micro-batch
              that fits and the fastest configuration that fits.

Throughput: each distinct answer (and the oracle's fastest) is re-measured
in --rounds interleaved runs of the same probe and compared by median, "vs
fastest" being the ratio to the best median (methods with the same answer
share its samples); oomtune's own verified samples/s is printed beside it.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from probe_trial import probe_trial  # noqa: E402

STRATEGIES = ["", "ckpt=all", "optimizer=adamw8bit", "offload=on"]


class Trials:
    """Runs real trials through the oomtune binary and remembers them."""

    def __init__(self, binary, job):
        self.binary, self.job = binary, job
        self.cache = {}

    def run(self, micro_batch, strategy=""):
        key = (micro_batch, strategy)
        if key in self.cache:
            return self.cache[key]
        config = f"micro_batch={micro_batch}" + (f",{strategy}" if strategy else "")
        report = probe_trial(self.binary, self.job, config)
        ok = report["fits"]
        outcome = report["outcome"] if report["outcome"] != "ok" or ok else "over_budget"
        result = {"ok": ok, "outcome": outcome, "config": report["config"],
                  "peak": report["peak_bytes"], "samples_per_second": report["samples_per_second"] if ok else 0.0}
        print(f"  trial {config:<40} {outcome:<14} peak {report['peak_bytes'] / 2**20:8.2f} MiB"
              f"  {result['samples_per_second']:8.1f} samples/s", file=sys.stderr)
        self.cache[key] = result
        return result


def lightning_binsearch(fits, global_batch, init_val=2, max_trials=25):
    """_run_binary_scaling of lightning/pytorch/tuner/batch_size_scaling.py, one trial per call of fits()."""
    low, high, count, new_size, trials = 1, None, 0, min(init_val, global_batch), 0
    while True:
        trials += 1
        if fits(new_size):
            count += 1
            if count > max_trials:
                break
            low = new_size
            if high:
                if high - low <= 1:
                    break
                new_size = (high + low) // 2
            else:
                doubled = min(new_size * 2, global_batch)  # _adjust_batch_size caps at the data
                if doubled == new_size:
                    break  # "not changed"
                new_size = doubled
        else:
            high = new_size
            new_size = (high + low) // 2
            if high - low <= 1:
                break
    return new_size, trials


def accelerate_shrink(fits, starting_batch_size):
    """find_executable_batch_size of accelerate/utils/memory.py."""
    batch_size, trials = starting_batch_size, 0
    while batch_size > 0:
        trials += 1
        if fits(batch_size):
            return batch_size, trials
        batch_size = int(batch_size * 0.9)
    return 0, trials


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--oomtune", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--global-batch", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved re-measurements of each answer")
    args = parser.parse_args()
    g = args.global_batch
    rows = []

    # oomtune first, on a machine without other trials in flight.
    start = time.monotonic()
    proc = subprocess.run([args.oomtune, "autotune", args.job, "--json"], capture_output=True, text=True)
    oomtune_seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"search_bench: autotune exited {proc.returncode}: {proc.stderr.strip()[-600:]}")
    at = json.loads(proc.stdout)
    plain_largest = 0
    for node in at["trail"]:  # the node runs a balanced split; b* is the largest that fits
        if node["node"] in ("plain", "micro-batch + accumulation") and node["predicted_fit"]:
            plain_largest = max(plain_largest, node["largest_fitting_micro_batch"])
    chosen = at["chosen"]

    def timed(name, fn):
        trials = Trials(args.oomtune, args.job)
        start = time.monotonic()
        found, n = fn(lambda b: trials.run(b)["ok"])
        return found, n, time.monotonic() - start

    print("lightning binsearch:", file=sys.stderr)
    lightning = timed("lightning", lambda fits: lightning_binsearch(fits, g))
    print("accelerate shrink-by-0.9:", file=sys.stderr)
    accelerate = timed("accelerate", lambda fits: accelerate_shrink(fits, g))

    print("oracle:", file=sys.stderr)
    oracle = Trials(args.oomtune, args.job)
    start = time.monotonic()
    for strategy in STRATEGIES:
        for b in range(1, g + 1):
            oracle.run(b, strategy)
    oracle_seconds = time.monotonic() - start
    fitting = [r for r in oracle.cache.values() if r["ok"]]
    oracle_largest = max((b for (b, s), r in oracle.cache.items() if s == "" and r["ok"]), default=0)
    fastest = max(fitting, key=lambda r: r["samples_per_second"])

    # One measurement per configuration is noisy (+-15 % on a shared 2-core
    # machine) and the oracle's best of 64 is a winner's curse; so the
    # answers are re-measured in interleaved rounds and compared by median.
    finalists = {"lightning": (lightning[0], ""), "accelerate": (accelerate[0], "")}
    chosen_key = next((k for k, r in oracle.cache.items() if r["config"] == chosen["config"]), None)
    fastest_key = next(k for k, r in oracle.cache.items() if r is fastest)
    if chosen_key:
        finalists["oomtune"] = chosen_key
    finalists["oracle"] = fastest_key
    # Each distinct configuration is measured once per round: two methods
    # that found the same answer share its samples (measured separately, one
    # configuration once gave 181 and 195 samples/s, a 0.93 "ratio" to itself).
    distinct = sorted({key for key in finalists.values() if key[0] > 0})
    samples = {key: [] for key in distinct}
    print(f"re-measuring the answers, {args.rounds} interleaved rounds:", file=sys.stderr)
    for _ in range(args.rounds):
        for b, strategy in distinct:
            fresh = Trials(args.oomtune, args.job)
            samples[(b, strategy)].append(fresh.run(b, strategy)["samples_per_second"])
    median = {name: statistics.median(samples[key]) if key in samples else 0.0 for name, key in finalists.items()}
    best = max(median.values())
    fastest = dict(fastest, samples_per_second=best)
    chosen_sps = median.get("oomtune", chosen["verification"]["samples_per_second"])

    def throughput_of_plain(b):
        return median["lightning"] if b == lightning[0] else median["accelerate"]

    def row(method, trials, seconds, found, sps, config, extra=""):
        rows.append((method, trials, f"{seconds:.1f}", found, f"{sps:.1f}", f"{sps / fastest['samples_per_second']:.2f}",
                     config + extra))

    row("lightning binsearch", str(lightning[1]), lightning[2], f"{lightning[0]}", throughput_of_plain(lightning[0]),
        f"micro_batch={lightning[0]} (plain)")
    row("accelerate x0.9", str(accelerate[1]), accelerate[2], f"{accelerate[0]}", throughput_of_plain(accelerate[0]),
        f"micro_batch={accelerate[0]} (plain)")
    row("oomtune autotune", f"{len(at['probes'])} probes + {at['verification_trials']}", oomtune_seconds,
        f"{plain_largest} (pred.); chose {chosen['micro_batch']}", chosen_sps, chosen["config"],
        f"  [own verification {chosen['verification']['samples_per_second']:.1f}/s]")
    row("oracle (exhaustive)", str(len(oracle.cache)), oracle_seconds, f"{oracle_largest}",
        median["oracle"], fastest["config"], "  [fastest that fits in the sweep]")

    head = ("method", "real trials", "wall s", "largest plain micro-batch", "samples/s", "vs fastest", "config")
    widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
    print(f"job {args.job}: global batch {g}, usable budget {at['usable_budget_bytes'] / 2**20:.2f} MiB, "
          f"oracle's largest plain micro-batch {oracle_largest}")
    for r in [head] + rows:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths)))
    targets = [("oomtune's largest plain micro-batch == oracle's", plain_largest == oracle_largest),
               ("oomtune used <= 3 real trials beyond the probes", at["verification_trials"] <= 3),
               ("chosen throughput >= 0.95 x fastest that fits", chosen_sps >= 0.95 * fastest["samples_per_second"])]
    for name, ok in targets:
        print(f"target: {name}: {'met' if ok else 'NOT met'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
