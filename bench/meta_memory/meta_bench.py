#!/usr/bin/env python3
"""bench/meta_memory: autotune with memory from meta vs from the probes' lines.

Runs `oomtune autotune JOB --json --memory-from SOURCE` for SOURCE = probes
and meta, alternating for --rounds rounds, and prints per run the chosen
configuration, the real trials (probes + verification runs: the ones that
train the model), the meta runs (memory only) and the wall time; then the
ratios meta / probes of the medians. The targets (issue #46): the same
chosen configuration, fewer real trials, less wall time.
"""

import argparse
import json
import statistics
import subprocess
import time


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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oomtune", required=True)
    parser.add_argument("--job", required=True)
    parser.add_argument("--rounds", type=int, default=1)
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
    same = {r["chosen"] for r in runs["probes"]} == {r["chosen"] for r in runs["meta"]}
    print(f"meta / probes: real trials {median['meta'][0] / median['probes'][0]:.2f}x, "
          f"wall time {median['meta'][1] / median['probes'][1]:.2f}x; same chosen configuration: "
          f"{'yes' if same else 'no'}")


if __name__ == "__main__":
    main()
