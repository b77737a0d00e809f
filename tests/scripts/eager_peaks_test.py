"""scripts/eager_peaks.py rebuilds the nn.Module of an exported example with
the file's sizes and weights. On the CPU, training it eagerly must give the
losses that training the TorchScript file gives, step for step (same weights,
same dropout masks), also with every GPT or ResNet block checkpointed, under
bf16 autocast and with gradients accumulated over two micro-batches, and for
a torchvision model scripted as NAME.pt (EfficientNet-B0); every phase must
be reported. With --hf, the same for the Hugging Face GPT-2
fixtures (examples/hf_gpt2.toml) rebuilt as transformers' GPT2LMHeadModel,
both attentions, plain and checkpointed, and the SDPA one under fp16 with
GradScaler: a Python with transformers (and PyTorch 2) runs it.
The byte counts need CUDA (scripts/device_check.sh --validate).

Usage: eager_peaks_test.py SOURCE_DIR EXAMPLES_DIR [--hf]
"""

import json
import math
import os
import re
import subprocess
import sys
import tempfile

source, examples = sys.argv[1], sys.argv[2]
hugging_face = sys.argv[3:] == ["--hf"]
failures = 0


def losses(job, *flags):
    done = subprocess.run([sys.executable, f"{source}/scripts/eager_peaks.py", os.path.join(examples, job),
                           "--micro-batch", "2", "--steps", "2", "--device", "cpu", *flags],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"FAIL {job} {flags}: {done.stderr.strip()}")
    result = json.loads(done.stdout)
    for step in result["steps"]:
        assert set(step) == {"forward", "loss", "backward", "optimizer", "loss_value", "seconds"}, step.keys()
    return [step["loss_value"] for step in result["steps"]]


def expect_equal(name, got, want):
    global failures
    if all(math.isclose(g, w, rel_tol=1e-6) for g, w in zip(got, want)) and len(got) == len(want):
        print(f"ok   {name}: {got}")
    else:
        print(f"FAIL {name}: eager {got}, TorchScript {want}", file=sys.stderr)
        failures += 1


if hugging_face:
    # hf_gpt2.toml with the SDPA file, whose path is resolved from the job's folder.
    with open(os.path.join(examples, "hf_gpt2.toml")) as f:
        text = f.read()
    eager_file = re.search(r'^model = "(.*)"$', text, re.M).group(1)
    sdpa_file = os.path.join(os.path.abspath(examples), eager_file.replace("_eager_", "_sdpa_"))
    sdpa_job = os.path.join(tempfile.mkdtemp(), "hf_gpt2_sdpa.toml")
    with open(sdpa_job, "w") as out:
        out.write(text.replace(f'"{eager_file}"', f'"{sdpa_file}"'))
    for name, job in (("hf_gpt2 eager attention", "hf_gpt2.toml"), ("hf_gpt2 sdpa", sdpa_job)):
        script = losses(job, "--mode", "script")
        expect_equal(name, losses(job, "--mode", "eager"), script)
        expect_equal(f"{name} ckpt=all", losses(job, "--mode", "eager", "--ckpt", "all"), script)
    # fp16 with torch.amp.GradScaler (PyTorch 2.3+, as the Python with
    # transformers has): the scaled backward, unscale, step and update.
    expect_equal("hf_gpt2 sdpa fp16", losses(sdpa_job, "--mode", "eager", "--precision", "fp16"),
                 losses(sdpa_job, "--mode", "script", "--precision", "fp16"))
    sys.exit(1 if failures else 0)

# bf16: one autocast region over forward and loss, as oomtune's trials run
# it (session/train_step.cpp), so the weights' cached casts outlive the
# forward; backward outside it.
sys.path.insert(0, os.path.join(source, "scripts"))
import eager_peaks  # noqa: E402


class AutocastAtPhaseStart(eager_peaks.PhaseMeter):
    def __init__(self):
        super().__init__(eager_peaks.torch.device("cpu"))
        self.seen = []

    def phase(self, record, name):
        self.seen.append((name, eager_peaks.torch.is_autocast_cpu_enabled()))
        return super().phase(record, name)


job, model_path = eager_peaks.read_job(os.path.join(examples, "gpt.toml"))
training = eager_peaks.Training(job, model_path, "eager", eager_peaks.torch.device("cpu"), 2, precision="bf16")
training.meter = AutocastAtPhaseStart()
training.step({phase: {} for phase in eager_peaks.PHASES})
if training.meter.seen == [("forward", True), ("loss", True), ("backward", False), ("optimizer", False)]:
    print("ok   bf16 autocast on at forward and loss, off at backward and optimizer")
else:
    print(f"FAIL autocast at the starts of forward, loss, backward, optimizer: {training.meter.seen}", file=sys.stderr)
    failures += 1

# --step-events records as a by-product: where the allocator's history cannot
# be recorded (here: no CUDA), the error is kept and the step is not stopped.
recording = eager_peaks.StepRecording(os.path.join(examples, "never_written.json"), training.meter)
recording.start()
training.step({phase: {} for phase in eager_peaks.PHASES})
recording.finish()
if (recording.error or "").startswith("starting the allocator's history") and training.meter.marks is None \
        and not os.path.exists(os.path.join(examples, "never_written.json")):
    print(f"ok   a recording that cannot start: {recording.error[:60]}...")
else:
    print(f"FAIL a recording that cannot start: error {recording.error!r}, marks {training.meter.marks!r}",
          file=sys.stderr)
    failures += 1

# --snapshot records the CUDA allocator's history: refused on the CPU, with
# one line and exit 2, before anything trains.
refused = subprocess.run([sys.executable, f"{source}/scripts/eager_peaks.py", os.path.join(examples, "gpt.toml"),
                          "--micro-batch", "2", "--device", "cpu", "--snapshot", os.path.join(examples, "x.pickle")],
                         capture_output=True, text=True)
if refused.returncode == 2 and refused.stderr.strip() == ("eager_peaks: --snapshot records the CUDA caching "
                                                          "allocator's history: it needs --device cuda"):
    print("ok   --snapshot refused on the CPU")
else:
    print(f"FAIL --snapshot on the CPU: exit {refused.returncode}, {refused.stderr!r}", file=sys.stderr)
    failures += 1

gpt_script = losses("gpt.toml", "--mode", "script")
expect_equal("gpt", losses("gpt.toml", "--mode", "eager"), gpt_script)
expect_equal("gpt ckpt=all", losses("gpt.toml", "--mode", "eager", "--ckpt", "all"), gpt_script)
expect_equal("gpt bf16", losses("gpt.toml", "--mode", "eager", "--precision", "bf16"),
             losses("gpt.toml", "--mode", "script", "--precision", "bf16"))
expect_equal("gpt accum=2", losses("gpt.toml", "--mode", "eager", "--accum", "2"),
             losses("gpt.toml", "--mode", "script", "--accum", "2"))
resnet_script = losses("resnet18.toml", "--mode", "script")
expect_equal("resnet18", losses("resnet18.toml", "--mode", "eager"), resnet_script)
expect_equal("resnet18 ckpt=all", losses("resnet18.toml", "--mode", "eager", "--ckpt", "all"), resnet_script)

# A torchvision model that export_models.py does not make, scripted as NAME.pt:
# rebuilt by its builder's name (stochastic depth and dropout draw alike).
unseen = tempfile.mkdtemp()
subprocess.run([sys.executable, "-c", "import sys, torch, torchvision; "
                "torch.jit.script(torchvision.models.efficientnet_b0()).save(sys.argv[1])",
                os.path.join(unseen, "efficientnet_b0.pt")], check=True)
with open(os.path.join(examples, "resnet50.toml")) as f, open(os.path.join(unseen, "job.toml"), "w") as out:
    out.write(f.read().replace("models/resnet50.pt", "efficientnet_b0.pt"))
expect_equal("efficientnet_b0", losses(os.path.join(unseen, "job.toml"), "--mode", "eager"),
             losses(os.path.join(unseen, "job.toml"), "--mode", "script"))
sys.exit(1 if failures else 0)
