"""One real trial of a configuration, as the benchmarks run it: what
autotune's verification runs, `oomtune probe JOB --config C
--enforce-budget --no-fit --json` (docs/autotune.md), in a process of its
own."""
import json
import subprocess


def probe_trial(binary, job, config):
    """The probe's JSON report (its "report" object: outcome, peak_bytes,
    samples_per_second, config, ...) for `config` ("micro_batch=16,ckpt=all").
    Exits with one line naming the configuration when the probe gives no
    JSON report."""
    done = subprocess.run([binary, "probe", job, "--config", config, "--enforce-budget", "--no-fit", "--json"],
                          capture_output=True, text=True, check=False)
    try:
        return json.loads(done.stdout)["report"]
    except (ValueError, KeyError):
        raise SystemExit(f"probe --config {config} gave no JSON (exit {done.returncode}): "
                         f"{done.stderr.strip()[-400:]}")
