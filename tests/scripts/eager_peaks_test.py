"""scripts/eager_peaks.py rebuilds the nn.Module of an exported example with
the file's sizes and weights. On the CPU, training it eagerly must give the
losses that training the TorchScript file gives, step for step (same weights,
same dropout masks), also with every GPT or ResNet block checkpointed and
under bf16 autocast; every phase must be reported. The byte counts need CUDA
(scripts/device_check.sh --peaks).

Usage: eager_peaks_test.py SOURCE_DIR EXAMPLES_DIR
"""

import json
import math
import subprocess
import sys

source, examples = sys.argv[1], sys.argv[2]
failures = 0


def losses(job, *flags):
    done = subprocess.run([sys.executable, f"{source}/scripts/eager_peaks.py", f"{examples}/{job}",
                           "--micro-batch", "2", "--steps", "2", "--device", "cpu", *flags],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"FAIL {job} {flags}: {done.stderr.strip()}")
    result = json.loads(done.stdout)
    for step in result["steps"]:
        assert set(step) == {"forward", "loss", "backward", "optimizer", "loss_value"}, step.keys()
    return [step["loss_value"] for step in result["steps"]]


def expect_equal(name, got, want):
    global failures
    if all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want)) and len(got) == len(want):
        print(f"ok   {name}: {got}")
    else:
        print(f"FAIL {name}: eager {got}, TorchScript {want}", file=sys.stderr)
        failures += 1


gpt_script = losses("gpt.toml", "--mode", "script")
expect_equal("gpt", losses("gpt.toml", "--mode", "eager"), gpt_script)
expect_equal("gpt ckpt=all", losses("gpt.toml", "--mode", "eager", "--ckpt", "all"), gpt_script)
expect_equal("gpt bf16", losses("gpt.toml", "--mode", "eager", "--precision", "bf16"),
             losses("gpt.toml", "--mode", "script", "--precision", "bf16"))
resnet_script = losses("resnet18.toml", "--mode", "script")
expect_equal("resnet18", losses("resnet18.toml", "--mode", "eager"), resnet_script)
expect_equal("resnet18 ckpt=all", losses("resnet18.toml", "--mode", "eager", "--ckpt", "all"), resnet_script)
sys.exit(1 if failures else 0)
