#!/usr/bin/env python3
"""bench/meta_memory: autotune with memory from meta vs from the probes' lines.

Runs `oomtune autotune JOB --json --memory-from SOURCE` for SOURCE = probes
and meta, alternating for --rounds rounds, and prints per run the chosen
configuration, the real trials (probes + verification runs: the ones that
train the model), the meta runs (memory only) and the wall time; then the
ratios meta / probes of the medians. The targets (issue #46): the same
chosen configuration, fewer real trials, less wall time.

"The same chosen configuration" is judged by speed, not by name. On the
example GPT several configurations tie on a CPU (offload runs as fast as
plain, 32 x 1 as 16 x 2), and one verification's samples/s spreads far wider
than autotune's 3 % tie band (141-189 samples/s over 15 runs of plain 32 x 1
on a 2-core machine), so which of the tied ones a run picks follows the noise
on both sides. So every distinct chosen configuration is re-measured
afterwards by `oomtune probe --config C --enforce-budget` in --remeasure
interleaved rounds (as bench/search does), and each side's choices are worth
the median samples/s of those re-measurements: meta chooses the same as the
probes when its choices are within the tie band (>= 0.97x) of theirs, and a
shortfall smaller than twice the medians' standard error is called undecided.
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


def autotune(binary, job, source):
    start = time.monotonic()
    done = subprocess.run([binary, "autotune", job, "--json", "--memory-from", source],
                          capture_output=True, text=True, check=False)
    seconds = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"autotune --memory-from {source} exited {done.returncode}: "
                         f"{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}")
    report = json.loads(done.stdout)
    chosen = report["chosen"]["config"] if report["chosen"] else "nothing fits"
    return {"source": report["memory_from"], "chosen": chosen, "probes": len(report["probes"]),
            "verifications": report["verification_trials"], "meta": report["meta_trials"], "seconds": seconds}


def remeasure(binary, job, configs, rounds):
    """Samples/s of each configuration, one probe run per round, interleaved: {config: [samples/s, ...]}."""
    samples = {config: [] for config in configs}
    for round_index in range(rounds):
        # Rotate the order so that no configuration always runs first.
        shift = round_index % max(len(configs), 1)
        for config in configs[shift:] + configs[:shift]:
            report = probe_trial(binary, job, config)
            if not report["fits"]:
                raise SystemExit(f"probe --config {config}: {report['outcome']}, peak {report['peak_bytes']} B, "
                                 f"on re-measurement: not within the budget")
            samples[config].append(report["samples_per_second"])
    return samples


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oomtune", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--remeasure", type=int, default=5, help="interleaved re-measurements of each chosen configuration")
    args = parser.parse_args()
    runs = {"probes": [], "meta": []}
    for round_index in range(args.rounds):
        order = ["probes", "meta"] if round_index % 2 == 0 else ["meta", "probes"]
        for source in order:
            runs[source].append(autotune(args.oomtune, args.job, source))
    print(f"{'asked':<7} {'used':<7} {'real trials':>11} {'meta runs':>9} {'wall s':>8}  chosen")
    for source in ("probes", "meta"):
        for r in runs[source]:
            print(f"{source:<7} {r['source']:<7} {r['probes'] + r['verifications']:>11} {r['meta']:>9} "
                  f"{r['seconds']:>8.1f}  {r['chosen']}")
    median = {s: (statistics.median(r["probes"] + r["verifications"] for r in runs[s]),
                  statistics.median(r["seconds"] for r in runs[s])) for s in runs}
    same_names = {r["chosen"] for r in runs["probes"]} == {r["chosen"] for r in runs["meta"]}
    print(f"meta / probes: real trials {median['meta'][0] / median['probes'][0]:.2f}x, "
          f"wall time {median['meta'][1] / median['probes'][1]:.2f}x; same chosen configuration by name: "
          f"{'yes' if same_names else 'no'}")

    chosen = sorted({r["chosen"] for s in runs for r in runs[s] if r["chosen"] != "nothing fits"})
    if not chosen or args.remeasure < 1:
        return
    samples = remeasure(args.oomtune, args.job, chosen, args.remeasure)
    speed = {config: statistics.median(values) for config, values in samples.items()}
    print(f"\nchosen configurations re-measured, {args.remeasure} interleaved probe runs each:")
    print(f"{'samples/s':>9} {'range':>13} {'by probes':>9} {'by meta':>7}  configuration")
    for config in sorted(chosen, key=lambda c: -speed[c]):
        picks = {s: sum(r["chosen"] == config for r in runs[s]) for s in runs}
        print(f"{speed[config]:>9.1f} {min(samples[config]):>6.1f}-{max(samples[config]):<6.1f} "
              f"{picks['probes']:>9} {picks['meta']:>7}  {config}")
    # A side that found nothing in a run scores 0 there: that is a worse choice, not a tie.
    worth = {s: statistics.median(speed.get(r["chosen"], 0.0) for r in runs[s]) for s in runs}
    ratio = worth["meta"] / worth["probes"] if worth["probes"] > 0 else float("nan")
    noise = 2 * (relative_error(samples, runs["meta"]) ** 2 + relative_error(samples, runs["probes"]) ** 2) ** 0.5
    if ratio >= 0.97:
        verdict = "yes"
    elif ratio >= 0.97 - noise:
        verdict = f"undecided (the difference is within twice the re-measurement's error, {noise:.0%})"
    else:
        verdict = "no"
    print(f"median re-measured samples/s of the choices: probes {worth['probes']:.1f}, meta {worth['meta']:.1f}; "
          f"meta / probes {ratio:.2f}x; same choice up to autotune's 3 % tie band: {verdict}")


def relative_error(samples, side_runs):
    """Relative standard error of the median re-measured samples/s of a side's most frequent choice.

    The median of n samples has a standard error of about 1.25 sigma / sqrt(n)
    (normal samples), and sigma is about IQR / 1.35.
    """
    chosen = [r["chosen"] for r in side_runs if r["chosen"] in samples]
    if not chosen:
        return 0.0
    values = sorted(samples[max(set(chosen), key=chosen.count)])
    if len(values) < 4:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return 1.25 * (q3 - q1) / 1.35 / len(values) ** 0.5 / statistics.median(values)


if __name__ == "__main__":
    main()
