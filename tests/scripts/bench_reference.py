"""Runs one of bench/optimizers' eager-PyTorch reference scripts with
--json, for the tests that hold oomtune's allocations to its figures
(clip_grad_reference_test.py, grad_scaler_reference_test.py)."""
import json
import os
import subprocess
import sys


def run_reference(source, script):
    """The JSON `bench/optimizers/SCRIPT --json` prints, run by this Python
    from the checkout at `source`; exits 1 with a FAIL line when it fails."""
    run = subprocess.run([sys.executable, os.path.join(source, "bench", "optimizers", script), "--json"],
                         capture_output=True, text=True)
    if run.returncode != 0:
        print(f"FAIL: {script} exited {run.returncode}: {run.stderr[-2000:]}")
        sys.exit(1)
    return json.loads(run.stdout)
