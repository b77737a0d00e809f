#!/usr/bin/env python3
"""The batch size Hugging Face Accelerate's find_executable_batch_size finds
for an oomtune job under a memory budget: the baseline that `oomtune
autotune --device cuda` is compared with on the GPU machine (issue #44;
scripts/device_check.sh --autotune).

    accelerate_batch_size.py JOB.toml --budget BYTES [--starting-batch-size N]
                             [--steps 2] [--ckpt none|all] [--device cuda]

As its documentation shows it used (accelerate/utils/memory.py, 1.15):
the decorated function builds the model and optimizer and trains --steps
steps at the batch size it is handed; on an out-of-memory error the
decorator frees the cache and retries at 0.9 x the batch size, down to 0.
It starts at the job's global batch (what HF Trainer's auto_find_batch_size
starts from: the batch the user asked for) unless --starting-batch-size.
The model, inputs, loss and optimizer are scripts/eager_peaks.py's (the
eager nn.Module users train); the caching allocator is capped at --budget
as an oomtune trial caps it. Prints JSON: the batch size found (its
micro-batch, no accumulation), every attempt with its outcome and seconds,
and the wall time.
"""

import argparse
import json
import sys
import time

import torch

import eager_peaks


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--budget", type=int, required=True, help="bytes")
    parser.add_argument("--starting-batch-size", type=int, help="default: the job's global batch")
    parser.add_argument("--steps", type=int, default=2, help="training steps per attempt")
    parser.add_argument("--ckpt", choices=["none", "all"], default="none")
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    try:
        from accelerate.utils import find_executable_batch_size
    except ImportError:
        print("accelerate_batch_size: needs accelerate (pip install accelerate)", file=sys.stderr)
        return 2

    job, path = eager_peaks.read_job(args.job)
    starting_batch_size = args.starting_batch_size or job["global_batch"]
    device = torch.device(args.device)
    if device.type == "cuda":
        eager_peaks.cap_allocator(device, args.budget)
    attempts = []

    @find_executable_batch_size(starting_batch_size=starting_batch_size)
    def train(batch_size):
        attempt = {"batch_size": batch_size, "outcome": "ok"}
        attempts.append(attempt)
        start = time.perf_counter()
        try:
            training = eager_peaks.Training(job, path, "eager", device, batch_size, ckpt=args.ckpt)
            for _ in range(args.steps):
                training.step({phase: {} for phase in eager_peaks.PHASES})
        except Exception as e:
            attempt["outcome"] = type(e).__name__
            raise
        finally:
            attempt["seconds"] = round(time.perf_counter() - start, 3)
        return batch_size

    start = time.perf_counter()
    try:
        found = train()
    except RuntimeError as e:  # "No executable batch size found, reached zero."
        found, error = None, str(e)
    else:
        error = None
    result = {"job": args.job, "budget_bytes": args.budget, "starting_batch_size": starting_batch_size,
              "steps_per_attempt": args.steps, "ckpt": args.ckpt, "batch_size": found, "error": error,
              "attempts": attempts, "wall_seconds": round(time.perf_counter() - start, 3),
              "torch": torch.__version__, "device": str(device)}
    print(json.dumps(result, indent=1))
    return 0 if found else 1


if __name__ == "__main__":
    sys.exit(main())
