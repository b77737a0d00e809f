"""scripts/compare_peaks.py (docs/validation.md's tables) reads oomtune's and
PyTorch's figures, computes each error against eager PyTorch and says which
cases miss the 2 % target. Here the runs are stand-ins that print known
figures: a fake `oomtune probe` whose bytes depend on --device, and a fake
Python for eager_peaks.py, so every cell of the tables is known by
construction. Needs no torch.

Usage: compare_peaks_test.py SOURCE_DIR
"""

import json
import os
import subprocess
import sys
import tempfile

from stand_ins import Checks, executable

source = sys.argv[1]
work = tempfile.mkdtemp()
checks = Checks()


# Eager PyTorch: peaks 100, 120, 200, 50 MiB by phase (step 200), reserved 256 MiB at the step. With
# --step-events it writes the file it names.
fake_python = executable(work, "python", """
import json, sys
if "--step-events" in sys.argv:
    with open(sys.argv[sys.argv.index("--step-events") + 1], "w") as f:
        f.write("eager")
phases = dict(forward=100, loss=120, backward=200, optimizer=50)
step = {p: dict(start_bytes=0, end_bytes=0, peak_bytes=v * 2**20,
                peak_reserved_bytes=(256 if p == "backward" else 128) * 2**20) for p, v in phases.items()}
print(json.dumps(dict(measured_step=1, steps=[{}, step])))
""")
# oomtune: the CUDA side 1 % above eager in every phase, 3 % above at micro-batch 16; meta and CPU
# tensors 5 % below, and 4 MiB of cuBLAS workspaces beside them (in the CUDA side's peaks); reserved
# 258 MiB measured on CUDA, 250 MiB simulated from the CUDA run's allocations, 240 MiB predicted from
# meta's and the CPU's. "cuda" fails at micro-batch 4. With --step-events it writes the file it names,
# holding its device's name.
fake_oomtune = executable(work, "oomtune", """
import json, sys
args = sys.argv
device, batch = args[args.index("--device") + 1], int(args[args.index("--batch") + 1])
if device == "cuda" and batch == 4:
    print("oomtune: no CUDA device", file=sys.stderr)
    sys.exit(2)
scale = {"cuda": 1.03 if batch == 16 else 1.01}.get(device, 0.95)
phases = {p: dict(peak_bytes=int(v * scale * 2**20), reserved_peak_bytes=258 * 2**20 if device == "cuda" else 0)
          for p, v in dict(forward=100, loss=120, backward=200, optimizer=50).items()}
report = dict(outcome="ok", phases=phases, peak_bytes=phases["backward"]["peak_bytes"],
              workspaces=dict(total_bytes=4 * 2**20, in_peaks=device == "cuda"))
if device == "cuda":
    report["measured_reserved"] = dict(peak_reserved_bytes=258 * 2**20)
report["reserved"] = dict(peak_reserved_bytes=(250 if device == "cuda" else 240) * 2**20)
if "--step-events" in args:
    with open(args[args.index("--step-events") + 1], "w") as f:
        f.write(device)
print(json.dumps(dict(report=report)))
""")


def compare(*args):
    done = subprocess.run([sys.executable, f"{source}/scripts/compare_peaks.py", "--oomtune", fake_oomtune,
                           "--python", fake_python, "--out", work, "--jobs", "2", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"FAIL compare_peaks.py {args}: {done.stderr.strip()}")
    return done.stdout


# The GPU side first, the CPU side merged in afterwards (as on two machines).
compare("--sides", "cuda,eager,meta", "--step-events", "job.toml:4", "job.toml:8", "job.toml:16:ckpt")
tables = compare("--sides", "cpu", "--step-events", "--merge", f"{work}/results.json", "job.toml:8", "job.toml:16:ckpt")
checks.expect_in("summary row, errors against eager", "| job.toml:8 | 200.00 | 202.00 (+1.0 %) | 194.00 (-3.0 %) | "
          "194.00 (-3.0 %) | 256.00 | 258.00 (+0.8 %) | 250.00 (-2.3 %) | 240.00 (-6.2 %) |", tables)
checks.expect_in("the 2 % target", "within 2 % of eager in 1 of 2 measured cases; outside: job.toml:16:ckpt.", tables)
checks.expect_in("a failed side", "failed: cuda: exit 2: oomtune: no CUDA device", tables)
checks.expect_in("a phase row", "| loss | 120.00 | - | 121.20 (+1.0 %) | 118.00 (-1.7 %) | 118.00 (-1.7 %) | 128.00 | "
          "258.00 (+101.6 %) |", tables)
checks.expect_in("the workspaces line", "cuBLAS workspaces of the target GPU, added to oomtune's meta and CPU peaks above "
          "(a CUDA run holds them through the step): 4.00 MiB.", tables)
checks.expect_in("a case the merge did not run keeps its sides", "| job.toml:4 | 200.00 | - | 194.00 (-3.0 %) | - |", tables)
with open(f"{work}/results.json") as f:
    results = json.load(f)
checks.expect_in("merged sides", "['cpu', 'cuda', 'eager', 'meta']",
          str(sorted(next(c for c in results["cases"] if c["case"] == "job.toml:8")["sides"])))
checks.expect_in("--tables renders the results file again", tables.strip(),
          compare("--tables", f"{work}/results.json"))
for side in ("cuda", "meta", "eager"):
    with open(f"{work}/job_8_none_fp32_{side}_events.json") as f:
        checks.expect_in(f"--step-events: the {side} run's allocations", side, f.read())
checks.expect_in("--step-events: none for the CPU run (its bytes are meta's)", "False",
                 str(os.path.exists(f"{work}/job_8_none_fp32_cpu_events.json")))
for case in results["cases"]:
    case.get("sides", {}).get("cuda", {}).pop("simulated_reserved_bytes", None)
with open(f"{work}/older.json", "w") as f:
    json.dump(results, f)
checks.expect_in("a results file from before the simulated column", "| 258.00 (+0.8 %) | - | 240.00 (-6.2 %) |",
                 compare("--tables", f"{work}/older.json"))
late = compare("--sides", "eager", "--deadline", "0", "--out", f"{work}/late", "job.toml:8")
checks.expect_in("a run past --deadline is not run", "failed: eager: not run: past --deadline 0 s", late)
sys.exit(checks.exit_status())
