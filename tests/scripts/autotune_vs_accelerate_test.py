"""scripts/autotune_vs_accelerate.py (issue #44's comparison on the GPU) on
stand-in runs whose answers are known: a fake `oomtune autotune` choosing
micro-batch 16 x 2 accumulation (or 8-bit AdamW under a small budget), a
fake Accelerate finder answering 48, and a fake eager_peaks.py in which
more than 32 samples a micro-batch run out of memory at step 7. The table
must show oomtune's choice surviving the rerun, Accelerate's not, and the
8-bit choice not rerun. Needs no torch.

Usage: autotune_vs_accelerate_test.py SOURCE_DIR
"""

import json
import subprocess
import sys
import tempfile

from stand_ins import Checks, executable

source = sys.argv[1]
work = tempfile.mkdtemp()
checks = Checks()


fake_python = executable(work, "python", """
import json, sys
script, args = sys.argv[1], sys.argv[2:]
value = lambda flag, default=None: args[args.index(flag) + 1] if flag in args else default
if script.endswith("accelerate_batch_size.py"):
    print(json.dumps(dict(batch_size=48, attempts=[{}] * 7, wall_seconds=12.5)))
    sys.exit(0)
micro, accum, steps = int(value("--micro-batch")), int(value("--accum", 1)), int(value("--steps"))
record = dict(seconds=0.5, **{p: dict(peak_bytes=micro * 2**20) for p in ("forward", "loss", "backward", "optimizer")})
result = dict(micro_batch=micro, accum=accum, steps=[record] * (steps if micro <= 32 else 7))
if micro > 32:
    result["out_of_memory"] = dict(step=7, phase="backward")
print(json.dumps(result))
sys.exit(3 if micro > 32 else 0)
""")
fake_oomtune = executable(work, "oomtune", """
import json, sys
budget = sys.argv[sys.argv.index("--budget") + 1]
config = ("micro_batch=16,accum=2,ckpt=none,optimizer=adamw,offload=off,precision=fp32" if budget == "8GiB" else
          "micro_batch=32,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32")
print(json.dumps(dict(probes=[{}] * 5, verification_trials=3, meta_trials=2, chosen=dict(
    config=config, verification=dict(peak_bytes=6 * 2**30, samples_per_second=100.0,
                                     measured_reserved=dict(peak_reserved_bytes=7 * 2**30))))))
""")


def compare(*args):
    done = subprocess.run([sys.executable, f"{source}/scripts/autotune_vs_accelerate.py", "--oomtune", fake_oomtune,
                           "--python", fake_python, "--out", work, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"FAIL autotune_vs_accelerate.py: {done.stderr.strip()}")
    return done.stdout


late = compare("--deadline", "0", "job.toml:8GiB")
table = compare("job.toml:8GiB", "job.toml:2GiB")


# 99 timed steps of 16 x 2 samples in 0.5 s each: 64 samples/s; Accelerate's 48 runs out at step 7.
checks.expect_in("oomtune's choice survives 100 steps",
          "| job.toml:8GiB | micro_batch=16,accum=2,ckpt=none,optimizer=adamw,offload=off,precision=fp32 | 8 (2) | ",
          table)
checks.expect_in("its rerun's throughput and peak", "| 6144 / 7168 | 100 steps, 64.0 samples/s, peak 16 MiB |", table)
checks.expect_in("Accelerate's answer runs out later", "| 48 | 7 | 12 | out of memory at step 7 (backward) |", table)
checks.expect_in("a choice eager PyTorch cannot train is not rerun", "eager_peaks.py cannot train this configuration",
          table)
checks.expect_in("past --deadline nothing runs", "| job.toml:8GiB | not run: out of time | | | | | "
                 "not run: out of time | | | |", late)
with open(f"{work}/results.json") as f:
    results = json.load(f)
checks.expect_in("the budget in bytes", "8589934592", str(results[0]["budget_bytes"]))
sys.exit(checks.exit_status())
