"""One real trial of a configuration, as the benchmarks run it: what
autotune's verification runs, `oomtune probe JOB --config C
--enforce-budget --no-fit --json` (docs/autotune.md), in a process of its
own."""
import json
import subprocess


def probe_trial(binary, job, config):
    """The probe's JSON report (its "report" object: outcome, peak_bytes,
    samples_per_second, config, ...) for `config` ("micro_batch=16,ckpt=all"),
    with "fits" added: whether the configuration fits the budget, as
    autotune's verification judges it (search/choose.cpp, fits_budget): it
    ran ("ok") and its peak is within the usable budget. An "ok" alone is
    not enough: a kernel's output that takes the tensors past the budget is
    refused one allocation late, and not at all where frees come first
    (probes/memory_tracker.cpp, Note [Budget and kernel scratch]); the small
    GPT of bench/search at micro-batch 14 ran "ok" at 9.36 MiB, over its
    8.55 MiB. A CPU job's peak is its tensors' (the benchmarks' jobs are
    all on the CPU). Exits with one line naming the configuration when the
    probe gives no JSON report."""
    done = subprocess.run([binary, "probe", job, "--config", config, "--enforce-budget", "--no-fit", "--json"],
                          capture_output=True, text=True, check=False)
    try:
        whole = json.loads(done.stdout)
        report = whole["report"]
        usable = whole["usable_budget_bytes"]
    except (ValueError, KeyError):
        raise SystemExit(f"probe --config {config} gave no JSON (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
    report["fits"] = report["outcome"] == "ok" and (usable is None or report["peak_bytes"] <= usable)
    return report
