#!/usr/bin/env python3
"""Per-phase memory peaks of a job's training step run by PyTorch itself: the
reference that oomtune's numbers are checked against on a GPU (issue #11,
validation; scripts/device_check.sh runs it there).

    eager_peaks.py JOB.toml --micro-batch N [--mode eager|script]
                   [--ckpt none|all] [--precision fp32|bf16]
                   [--device cuda|cpu] [--steps 3] [--out FILE]

The job spec is oomtune's (docs/job_spec.md): its inputs, output, loss and
optimizer are used as oomtune uses them (integer inputs uniform in
[low, high), floats normal(0, 1); losses mean-reduced in fp32; AdamW with
decoupled weight decay, SGD with L2 and momentum).

--mode eager (default) trains the nn.Module, as users do: the model file must
be one that examples/export_models.py writes (gpt.pt, resnet18.pt,
resnet50.pt); the module is rebuilt from that script's classes with the
file's sizes and weights. --ckpt all then wraps each GPT block, or each
ResNet block (layerN.i), in torch.utils.checkpoint.checkpoint(
use_reentrant=False), as oomtune's ckpt=all checkpoints those blocks.
--mode script trains the TorchScript file
with graph-executor optimization off, which is what oomtune runs (any model).
bf16 is torch.autocast over forward and loss.

Each step's phases (forward, loss, backward, optimizer; gradients set to None
at the end of the optimizer phase) are measured on CUDA with
torch.cuda.reset_peak_memory_stats() at the phase's start and
max_memory_allocated() / max_memory_reserved() / memory_allocated() at its end,
after synchronizing (torch/cuda/memory.py). On the CPU no allocator keeps such
statistics: the byte fields are null, and only the losses are reported (a
check that the rebuilt module computes what the file does). Prints JSON: every
step, and "measured_step" 1, the first step whose optimizer state existed
before it started, as oomtune measures.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import tomllib

import torch
import torch.nn.functional as F

PHASES = ("forward", "loss", "backward", "optimizer")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DTYPES = {"float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
          "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64, "int64": torch.int64,
          "long": torch.int64, "int32": torch.int32, "int": torch.int32, "bool": torch.bool}


def fail(message):
    print(f"eager_peaks: {message}", file=sys.stderr)
    sys.exit(2)


def export_script():
    """examples/export_models.py as a module (its GPT class)."""
    spec = importlib.util.spec_from_file_location("export_models", os.path.join(REPO, "examples", "export_models.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def eager_module(path, scripted):
    """The nn.Module that export_models.py scripted into `path`, with its weights."""
    name = os.path.basename(path)
    state = scripted.state_dict()
    if name == "gpt.pt":
        vocab, dim = state["tok_emb.weight"].shape
        max_len = state["pos_emb.weight"].shape[0]
        layers = len({key.split(".")[1] for key in state if key.startswith("blocks.")})
        heads = getattr(scripted.blocks, "0").attn.n_heads
        dropout = getattr(scripted.drop, "p", 0.1)
        model = export_script().GPT(vocab, dim, layers, heads, max_len, dropout)
    elif name in ("resnet18.pt", "resnet50.pt"):
        import torchvision

        classes = state["fc.weight"].shape[0]
        model = getattr(torchvision.models, name[:-3])(num_classes=classes)
    else:
        fail(f"{path}: --mode eager knows the models of examples/export_models.py only; use --mode script")
    model.load_state_dict(state, strict=False)  # GPT's buffers are not persistent
    return model


def forward_checkpointed(model, x):
    """The eager module's forward with each block oomtune's ckpt=all finds
    (docs/checkpointing.md) under torch.utils.checkpoint: GPT's blocks.i
    (export_models.GPT.forward) or ResNet's layerN.i (torchvision's
    ResNet._forward_impl)."""
    from torch.utils.checkpoint import checkpoint

    if hasattr(model, "blocks"):
        T = x.size(1)
        x = model.drop(model.tok_emb(x) + model.pos_emb(model.positions[:T]))
        for block in model.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return model.head(model.ln_f(x))
    x = model.maxpool(model.relu(model.bn1(model.conv1(x))))
    for layer in (model.layer1, model.layer2, model.layer3, model.layer4):
        for block in layer:
            x = checkpoint(block, x, use_reentrant=False)
    return model.fc(torch.flatten(model.avgpool(x), 1))


def make_inputs(job, micro_batch, device, generator):
    inputs = {}
    for spec in job["inputs"]:
        shape = [micro_batch if d == "batch" else d for d in spec["shape"]]
        dtype = DTYPES[spec.get("dtype", "float32").removeprefix("torch.")]
        if "range" in spec:
            low, high = spec["range"]
            if dtype.is_floating_point:
                t = torch.rand(shape, generator=generator) * (high - low) + low
            else:
                t = torch.randint(int(low), int(high), shape, generator=generator)
        else:
            t = torch.randn(shape, generator=generator)
        inputs[spec["name"]] = t.to(device=device, dtype=dtype)
    return inputs


def select_output(out, key):
    if isinstance(out, dict):
        return out[key if key is not None else "loss"]
    if isinstance(out, (tuple, list)):
        return out[key if key is not None else 0]
    return out


def loss_of(job, output, inputs):
    loss = job["loss"]
    kind = loss["kind"]
    if kind == "cross_entropy":
        target = inputs[loss["target"]]
        return F.cross_entropy(output.float().reshape(-1, output.shape[-1]), target.reshape(-1))
    if kind == "mse":
        return F.mse_loss(output.float(), inputs[loss["target"]].float())
    if kind == "mean":
        return output.float().mean()
    if kind == "model_returns_loss":
        return output.float()
    fail(f"loss kind {kind!r} is not supported")


def make_optimizer(job, parameters):
    o = job.get("optimizer", {})
    kind = o.get("kind", "adamw")
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=o.get("lr", 1e-3), betas=tuple(o.get("betas", (0.9, 0.999))),
                                 eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01))
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=o.get("lr", 1e-3), momentum=o.get("momentum", 0.0),
                               weight_decay=o.get("weight_decay", 0.0))
    fail(f"optimizer {kind!r} is not supported (8-bit AdamW needs bitsandbytes)")


class PhaseMeter:
    """Allocated/reserved bytes of one phase on CUDA; null on the CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    @contextlib.contextmanager
    def phase(self, record):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            record["start_bytes"] = torch.cuda.memory_allocated()
        yield
        if self.cuda:
            torch.cuda.synchronize()
            record["peak_bytes"] = torch.cuda.max_memory_allocated()
            record["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            record["end_bytes"] = torch.cuda.memory_allocated()
        else:
            record.update(start_bytes=None, peak_bytes=None, peak_reserved_bytes=None, end_bytes=None)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--mode", choices=["eager", "script"], default="eager")
    parser.add_argument("--ckpt", choices=["none", "all"], default="none")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()

    try:
        with open(args.job, "rb") as f:
            job = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        fail(f"{args.job}: {e}")
    path = os.path.join(os.path.dirname(os.path.abspath(args.job)), job["model"])
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    scripted = torch.jit.load(path, map_location="cpu")
    if args.mode == "script":
        torch._C._set_graph_executor_optimize(False)  # as oomtune runs it (issue #10 item 5)
        model = scripted
    else:
        model = eager_module(path, scripted)
    if args.ckpt == "all" and args.mode != "eager":
        fail("--ckpt all checkpoints the eager module only (--mode eager)")
    model = model.to(device).train()
    torch.manual_seed(args.seed)  # building the eager module drew from the RNG: same dropout masks in both modes
    target_name = job["loss"].get("target")
    optimizer = make_optimizer(job, [p for p in model.parameters() if p.requires_grad])
    generator = torch.Generator().manual_seed(args.seed)
    meter = PhaseMeter(device)
    autocast = (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if args.precision == "bf16" else (
        contextlib.nullcontext)

    steps = []
    for _ in range(args.steps):
        inputs = make_inputs(job, args.micro_batch, device, generator)
        args_in = [t for name, t in inputs.items() if name != target_name]
        record = {phase: {} for phase in PHASES}
        with meter.phase(record["forward"]), autocast():
            if args.ckpt == "all":
                raw = forward_checkpointed(model, *args_in)
            else:
                raw = model(*args_in)
            output = select_output(raw, job.get("output"))
        with meter.phase(record["loss"]), autocast():
            loss = loss_of(job, output, inputs)
        del raw, output
        with meter.phase(record["backward"]):
            loss.backward()
        with meter.phase(record["optimizer"]):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        record["loss_value"] = loss.item()
        del loss
        steps.append(record)

    result = {"job": args.job, "model": path, "mode": args.mode, "device": str(device),
              "torch": torch.__version__, "micro_batch": args.micro_batch, "ckpt": args.ckpt,
              "precision": args.precision, "measured_step": 1 if args.steps > 1 else 0, "steps": steps}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
