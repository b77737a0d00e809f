"""What the end-to-end runs share: the test GPT (the example GPT's
architecture, examples/export_models.py, as a torch.nn.Module with its loss),
a learnable token dataset, and the checks: samples per optimizer step equal
the plan's global batch, and the loss decreases; for a run through
DeepSpeed, the parameters keep the plan's dtype and ZeRO-2's gradient
buckets hold at most the plan's parameters.
"""

import contextlib
import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples"))
from export_models import GPT  # noqa: E402  (the example GPT's architecture)

from emitted import TRAIN_GPT  # noqa: E402

OPTIMIZER_STEPS = 6  # enough for a tiny GPT at lr 3e-3 to lower its loss on a learnable rule


def script_optimizer(case, params):
    """The optimizer the training script builds where the emitted files leave
    it to the script (the notes of ds_config.json and accelerate_config.yaml):
    for Adafactor, transformers.optimization.Adafactor with the emitted
    keyword arguments (lightning_trainer.json carries the notes' call as
    class + kwargs); else the plan's AdamW."""
    if case.optimizer == "adafactor":
        from transformers.optimization import Adafactor
        with open(case.path("lightning_trainer.json")) as f:
            emitted = json.load(f)["optimizer"]
        assert emitted["class"] == "transformers.optimization.Adafactor", emitted
        return Adafactor(params, **emitted["kwargs"])
    hyper = case.plan["optimizer"]
    return torch.optim.AdamW(params, lr=hyper["lr"], betas=tuple(hyper["betas"]), eps=hyper["eps"],
                             weight_decay=hyper["weight_decay"])


class CountingGPT(torch.nn.Module):
    """The test GPT with next-token cross-entropy. In training mode its
    forward counts the samples it sees (samples_seen) and keeps each
    micro-batch's loss (micro_losses): what went into each optimizer step,
    whichever framework drives the loop."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        g = TRAIN_GPT
        self.gpt = GPT(g["vocab"], g["d_model"], g["n_layers"], g["n_heads"], g["seq"], dropout=0.0)
        self.samples_seen = 0
        self.micro_losses = []

    def forward(self, input_ids, labels):
        if self.training:
            self.samples_seen += input_ids.size(0)
        logits = self.gpt(input_ids)
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), labels.reshape(-1))
        if self.training:
            self.micro_losses.append(float(loss.detach()))
        return {"loss": loss, "logits": logits}


class TokenRule(torch.utils.data.Dataset):
    """Sequences that follow one rule, next = (5 * token + 3) mod vocab, from
    random starts: a tiny GPT learns it within a few steps. Items are dicts
    (input_ids, labels), the form Hugging Face's Trainer passes as keywords."""

    def __init__(self, samples):
        g = TRAIN_GPT
        generator = torch.Generator().manual_seed(1)
        tokens = torch.empty(samples, g["seq"] + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, g["vocab"], (samples,), generator=generator)
        for t in range(g["seq"]):
            tokens[:, t + 1] = (5 * tokens[:, t] + 3) % g["vocab"]
        self.inputs, self.labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()

    def __len__(self):
        return self.inputs.size(0)

    def __getitem__(self, i):
        return {"input_ids": self.inputs[i], "labels": self.labels[i]}


class StepLog:
    """Per optimizer step: the samples the model saw since the previous step
    and the mean of the micro-batch losses."""

    def __init__(self, model):
        self.model = model
        self.samples_counted = 0
        self.losses_counted = 0
        self.samples = []
        self.losses = []

    def optimizer_step(self):
        """Call once per optimizer step, after it."""
        self.samples.append(self.model.samples_seen - self.samples_counted)
        self.samples_counted = self.model.samples_seen
        step_losses = self.model.micro_losses[self.losses_counted:]
        self.losses_counted = len(self.model.micro_losses)
        if step_losses:
            self.losses.append(sum(step_losses) / len(step_losses))


def check_run(name, case, log, failures):
    """Samples per optimizer step equal the plan's global batch; the loss of
    the last step is below the first's. Prints the figures."""
    print(f"{name}: {case.name}: samples per optimizer step {log.samples}, global batch {case.global_batch}")
    print(f"{name}: {case.name}: loss per optimizer step {[round(x, 4) for x in log.losses]}")
    failures.check(len(log.samples) == OPTIMIZER_STEPS, case, f"{len(log.samples)} optimizer steps, expected {OPTIMIZER_STEPS}")
    failures.check(all(s == case.global_batch for s in log.samples), case,
                   f"samples per optimizer step {log.samples}, not the plan's global batch {case.global_batch}")
    failures.check(len(log.losses) >= 2 and log.losses[-1] < log.losses[0], case,
                   f"the loss did not decrease: {log.losses}")


@contextlib.contextmanager
def zero_buckets():
    """Yields a list that gets, each time DeepSpeed's ZeRO-1/2 optimizer
    allocates its gradient buckets (DeepSpeedZeroOptimizer.setup_buckets,
    deepspeed/runtime/zero/stage_1_and_2.py, 0.19.8: at every backward), the
    elements of all its bucket buffers together; whichever framework builds
    the engine."""
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    seen = []
    original = DeepSpeedZeroOptimizer.setup_buckets

    def setup_buckets(self):
        allocates = not self.ready_for_gradients and self.contiguous_gradients
        original(self)
        if allocates:
            seen.append(sum(t.numel() for bucket in self.ipg_buckets.values() for t in bucket.buffer))

    DeepSpeedZeroOptimizer.setup_buckets = setup_buckets
    try:
        yield seen
    finally:
        DeepSpeedZeroOptimizer.setup_buckets = original


def check_deepspeed_run(name, case, model, buckets, failures):
    """After a run through DeepSpeed: the parameters are fp32 for fp32 and
    autocast plans (DeepSpeed's bf16/fp16 sections would have cast them) and
    bf16 for bf16_params; under offload the bucket buffers (zero_buckets())
    held at most the plan's parameters, which are the model's."""
    dtypes = sorted({str(p.dtype) for p in model.parameters()})
    expected = "torch.bfloat16" if case.precision == "bf16_params" else "torch.float32"
    print(f"{name}: {case.name}: parameters {dtypes} after training; ZeRO bucket elements per backward "
          f"{sorted(set(buckets))}, the plan's parameters {case.parameters}")
    failures.check(dtypes == [expected], case, f"parameters {dtypes} after training, the plan's are {expected}")
    failures.check(case.parameters == sum(p.numel() for p in model.parameters()), case,
                   f"the plan says {case.parameters} parameters, the model has "
                   f"{sum(p.numel() for p in model.parameters())}")
    if case.offload:
        failures.check(bool(buckets) and max(buckets) <= case.parameters, case,
                       f"ZeRO-2 gradient buckets of {buckets} elements for a model of {case.parameters}")
