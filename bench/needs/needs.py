#!/usr/bin/env python3
"""How close `oomtune diagnose`'s need comes to what the run needed, across
model families: for each --model of scripts/record_cpu_snapshot.py (real
transformers models, recorded on the CPU with PyTorch's own allocations and
frames) and each case below, the need (JSON need.still_needed_bytes)
over what the same run without the cap allocates from the failing
allocation on (uncapped_growth_bytes): 1.000 is exact, below 1 an
underestimate (a fix judged enough may not be).

    needs.py OOMTUNE [--recorder R] [MODEL ...]        (default: every model)

R (default scripts/record_cpu_snapshot.py) is another recorder taking the
same options and printing the same JSON: on the GPU machine
scripts/record_cuda_snapshot.py, whose snapshots are CUDA's own.

Cases (record_cpu_snapshot.py options):
  forward        --mode train --oom-after 0.7                       rule 3
  second forward --mode step --steps 2 --optimizer adamw --oom-in forward   rule 1
  plain backward --mode step --batch 1 --seq 32 --oom-in backward --share 0.8   rule 4
  ckpt backward  --mode step --checkpointing --eager-attention --oom-in backward --share 0.5
  recomputation  --mode step --checkpointing --eager-attention --oom-in recomputation   rule 5
  first AdamW    --mode step --optimizer adamw --oom-in optimizer --share 0.2 --batch 1 --seq 32   rule 2

Prints one row per model: each case's ratio, starred where the need came
from another rule than the case's, each star explained below the table. The target (docs/diagnose.md, "Fixes
judged enough or not"): rules 1 to 4 within 0.85 to 1.05; rule 5 is a
lower bound of the recomputation alone (reported). Exit 0, 77 without
transformers, 1 when a recording or a diagnosis fails.
"""

import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECORDER = os.path.join(ROOT, "scripts", "record_cpu_snapshot.py")
CASES = [
    ("forward", "forward_blocks", ["--mode", "train", "--oom-after", "0.7"]),
    ("second forward", "trace", ["--mode", "step", "--steps", "2", "--optimizer", "adamw", "--oom-in", "forward"]),
    ("plain backward", "backward_blocks",
     ["--mode", "step", "--batch", "1", "--seq", "32", "--oom-in", "backward", "--share", "0.8"]),
    ("ckpt backward", "backward_blocks",
     ["--mode", "step", "--checkpointing", "--eager-attention", "--oom-in", "backward", "--share", "0.5"]),
    ("recomputation", "recomputed_block",
     ["--mode", "step", "--checkpointing", "--eager-attention", "--oom-in", "recomputation"]),
    ("first AdamW", "optimizer_first_step",
     ["--mode", "step", "--optimizer", "adamw", "--oom-in", "optimizer", "--share", "0.2", "--batch", "1",
      "--seq", "32"]),
]


def models():
    sys.path.insert(0, os.path.dirname(RECORDER))
    import record_cpu_snapshot
    return sorted(record_cpu_snapshot.MODELS)


def ratio(oomtune, recorder, model, args, tmp):
    """(need / uncapped growth, the need's rule), or raises RuntimeError."""
    out = os.path.join(tmp, "snapshot.pickle")
    run = subprocess.run([sys.executable, recorder, "--out", out, "--model", model] + args,
                         capture_output=True, text=True)
    if run.returncode == 77:
        print(run.stdout.strip())
        sys.exit(77)
    if run.returncode != 0:
        raise RuntimeError(f"{os.path.basename(recorder)} --model {model} {' '.join(args)}: exit {run.returncode}: "
                           f"{(run.stdout + run.stderr).strip().splitlines()[-1:]}")
    recorded = json.loads(run.stdout.strip().splitlines()[-1])
    diagnosis = subprocess.run([oomtune, "diagnose", out, "--json"], capture_output=True, text=True)
    if diagnosis.returncode != 0:
        raise RuntimeError(f"oomtune diagnose: exit {diagnosis.returncode}: {diagnosis.stderr.strip()}")
    need = json.loads(diagnosis.stdout)["need"]
    return need["still_needed_bytes"] / max(recorded["uncapped_growth_bytes"], 1), need["method"]


def main():
    if len(sys.argv) < 2:
        print(__doc__)
        return 2
    oomtune, rest = sys.argv[1], sys.argv[2:]
    recorder = RECORDER
    if rest[:1] == ["--recorder"] and len(rest) >= 2:
        recorder, rest = rest[1], rest[2:]
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        print(f"skipped: {e} (OOMTUNE_TORCH=pypi ./setup.sh makes .venv-pypi with it)")
        return 77
    chosen = rest or models()
    print("need / what the run without the cap allocated from the failure (1.000 exact)")
    print(f"{'model':<8}" + "".join(f"{name:>22}" for name, _, _ in CASES))
    failed = False
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        for model in chosen:
            cells = []
            for name, rule, args in CASES:
                try:
                    value, method = ratio(oomtune, recorder, model, args, tmp)
                    cells.append(f"{value:.3f}" + ("" if method == rule else "*"))
                    if method != rule:
                        notes.append(f"* {model} {name}: read by the {method} rule, not {rule}")
                except RuntimeError as e:
                    print(f"{model} {name}: {e}", file=sys.stderr)
                    cells.append("failed")
                    failed = True
            print(f"{model:<8}" + "".join(f"{c:>22}" for c in cells), flush=True)
    for note in notes:
        print(note)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
