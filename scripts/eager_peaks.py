#!/usr/bin/env python3
"""Per-phase memory peaks of a job's training step run by PyTorch itself: the
reference that oomtune's numbers are checked against on a GPU (issue #11,
validation; scripts/device_check.sh runs it there).

    eager_peaks.py JOB.toml --micro-batch N [--accum K] [--mode eager|script]
                   [--ckpt none|all] [--precision fp32|bf16|fp16]
                   [--device cuda|cpu] [--steps 3] [--budget BYTES]
                   [--out FILE] [--step-events FILE | --snapshot FILE]

The job spec is oomtune's (docs/job_spec.md): its inputs, output, loss and
optimizer are used as oomtune uses them (integer inputs uniform in
[low, high), floats normal(0, 1); losses mean-reduced in fp32; AdamW with
decoupled weight decay, SGD with L2 and momentum; the optimizer's
`implementation`, foreach by default as on CUDA; `max_grad_norm`, gradient
clipping with torch.nn.utils.clip_grad_norm_ before the step,
docs/job_spec.md).

--mode eager (default) trains the nn.Module, as users do: the model file must
be one that examples/export_models.py writes (gpt.pt, resnet18.pt,
resnet50.pt), a torchvision model scripted as NAME.pt (efficientnet_b0.pt:
torchvision.models.efficientnet_b0), or one of the Hugging Face GPT-2 files of
../shared/fixtures/torchscript (needs transformers); the module is rebuilt
from that script's classes, or transformers' GPT2LMHeadModel, with the
file's sizes and weights (GPT-2's dropout off: the files were traced in eval
mode). --ckpt all then wraps each GPT block, each ResNet block (layerN.i) or
each GPT-2 block (transformer.h.i, transformers' gradient checkpointing) in
torch.utils.checkpoint.checkpoint(use_reentrant=False), as oomtune's
ckpt=all checkpoints those blocks. --mode script trains the TorchScript file
with graph-executor optimization off, which is what oomtune runs (any model).
bf16 is torch.autocast over forward and loss, one region for both.

--accum K runs K micro-batches (forward, loss, backward each) before each
optimizer step, gradients accumulating: a phase's record is its peak over the
K micro-batches, from the first one's start to the last one's end.
--budget BYTES caps the caching allocator as an oomtune trial does
(torch.cuda.set_per_process_memory_fraction(BYTES / total)); a step that
runs out of memory ends the run: "out_of_memory" names the step and phase
and the exit status is 3 (a rerun of a chosen configuration, e.g. --steps
100, must end with 0). On CUDA "allocator" gives the caching allocator's
num_ooms and num_alloc_retries over the run: a run that ends with 0 and
num_ooms above 0 had out-of-memory errors caught inside it (a convolution's
cuDNN workspace that did not fit, run with another engine instead).

Each step's phases (forward, loss, backward, optimizer; gradients set to None
at the end of the optimizer phase) are measured on CUDA with
torch.cuda.reset_peak_memory_stats() at the phase's start and
max_memory_allocated() / max_memory_reserved() / memory_allocated() at its end,
after synchronizing (torch/cuda/memory.py). On the CPU no allocator keeps such
statistics: the byte fields are null, and only the losses are reported (a
check that the rebuilt module computes what the file does). Prints JSON:
every step (its phases, loss and seconds), and "measured_step" 1, the first
step whose optimizer state existed before it started, as oomtune measures.

--step-events FILE (CUDA) records the caching allocator's history over the
measured step (torch.cuda.memory._record_memory_history, Python frames) and
writes its allocations in oomtune's step-events format
(scripts/eager_step_events.py), for scripts/compare_step_events.py against
an oomtune trial's `probe --step-events`; the phase ends then also read the
trace, which adds to that step's seconds, not to its bytes.

--snapshot FILE (CUDA) records the caching allocator's history over the
whole run (Python frames) and dumps it at the end, or at the step that ran
out of memory (torch.cuda.memory._dump_snapshot, the pickle `oomtune
diagnose` reads): a capped CNN's run keeps the out-of-memory errors cuDNN
caught for its convolutions' workspaces.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import sys
import time
import tomllib

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_step_events  # noqa: E402  (scripts/ is not a package)

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
    elif name in HF_GPT2_FIXTURES:
        model = hf_gpt2(state, HF_GPT2_FIXTURES[name])
    elif torchvision_builder(name[:-3]) is not None:  # resnet18.pt, resnet50.pt, efficientnet_b0.pt, ...
        # The classifier is the last 2-D weight: fc (ResNet), classifier.N (EfficientNet, MobileNet), head.
        classes = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 2][-1].shape[0]
        model = torchvision_builder(name[:-3])(num_classes=classes)
    else:
        fail(f"{path}: --mode eager knows the models of examples/export_models.py, torchvision's models saved as "
             "NAME.pt and the Hugging Face GPT-2 fixtures only; use --mode script")
    model.load_state_dict(state, strict=False)  # GPT's buffers are not persistent
    return model


def torchvision_builder(name):
    """torchvision.models' builder of that name (resnet50, efficientnet_b0, ...), or None."""
    try:
        import torchvision
    except ImportError:
        return None
    return getattr(torchvision.models, name, None) if name in torchvision.models.list_models() else None


# The Hugging Face GPT-2 files of ../shared/fixtures/torchscript and the
# attention each was traced with; their README gives the config (n_head 2
# is not in the weights' shapes).
HF_GPT2_FIXTURES = {"hf_gpt2_eager_trace.pt": "eager", "hf_gpt2_sdpa_trace.pt": "sdpa"}
HF_GPT2_HEADS = 2


def hf_gpt2(state, attention):
    """transformers' GPT2LMHeadModel with the sizes of a traced file's weights
    (tied embeddings, as traced), dropout off: traced in eval mode, the file
    has none."""
    try:
        import transformers
    except ImportError:
        fail("--mode eager of a Hugging Face GPT-2 file needs transformers (pip install transformers)")
    vocab, dim = state["transformer.wte.weight"].shape
    layers = len({key.split(".")[2] for key in state if key.startswith("transformer.h.")})
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=state["transformer.wpe.weight"].shape[0],
                                     n_embd=dim, n_layer=layers, n_head=HF_GPT2_HEADS, use_cache=False,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = attention
    return transformers.GPT2LMHeadModel(config)


def forward_checkpointed(model, x):
    """The eager module's forward with each block oomtune's ckpt=all finds
    (docs/checkpointing.md) under torch.utils.checkpoint: GPT's blocks.i
    (export_models.GPT.forward), ResNet's layerN.i (torchvision's
    ResNet._forward_impl) or GPT-2's transformer.h.i."""
    from torch.utils.checkpoint import checkpoint

    if hasattr(model, "gradient_checkpointing_enable"):  # transformers: each GPT2Block, transformer.h.i
        if not model.is_gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return model(x)
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
    # docs/job_spec.md: foreach by default, as torch.optim does on CUDA.
    implementation = {"foreach": {"foreach": True}, "fused": {"fused": True},
                      "single_tensor": {"foreach": False}}.get(o.get("implementation", "foreach"))
    if implementation is None:
        fail(f"optimizer implementation {o['implementation']!r} is not foreach, fused or single_tensor")
    if kind == "adamw":
        return torch.optim.AdamW(parameters, lr=o.get("lr", 1e-3), betas=tuple(o.get("betas", (0.9, 0.999))),
                                 eps=o.get("eps", 1e-8), weight_decay=o.get("weight_decay", 0.01), **implementation)
    if kind == "sgd":
        return torch.optim.SGD(parameters, lr=o.get("lr", 1e-3), momentum=o.get("momentum", 0.0),
                               weight_decay=o.get("weight_decay", 0.0), **implementation)
    fail(f"optimizer {kind!r} is not supported (8-bit AdamW needs bitsandbytes)")


class PhaseMeter:
    """Allocated/reserved bytes of one phase on CUDA; null on the CPU. A
    phase measured again into the same record (the micro-batches of one
    accumulated step) keeps the first start, the largest peaks and the last
    end."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        # While a step's allocations are recorded (--step-events): (phase,
        # the allocator trace's length at its end), for eager_step_events.
        self.marks = None
        self.marks_error = None

    @contextlib.contextmanager
    def phase(self, record, name):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            record.setdefault("start_bytes", torch.cuda.memory_allocated())
        yield
        if self.cuda:
            torch.cuda.synchronize()
            for key, value in (("peak_bytes", torch.cuda.max_memory_allocated()),
                               ("peak_reserved_bytes", torch.cuda.max_memory_reserved())):
                record[key] = max(record.get(key, 0), value)
            record["end_bytes"] = torch.cuda.memory_allocated()
            if self.marks is not None:
                try:
                    self.marks.append((name, len(allocator_trace())))
                except Exception as e:  # recording is optional: the bytes above stand
                    self.marks, self.marks_error = None, f"reading the trace at the end of {name}: {e!r}"
        else:
            record.update(start_bytes=None, peak_bytes=None, peak_reserved_bytes=None, end_bytes=None)


class StepRecording:
    """--step-events: the caching allocator's history over one step, written
    as a step-events file. Recording is a by-product: where it fails (an API
    this PyTorch lacks, say), `error` says why, the JSON carries it as
    "step_events_error", and the step is measured all the same."""

    def __init__(self, path, meter):
        self.path, self.meter, self.error = path, meter, None

    def start(self):
        try:
            torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python")
            self.meter.marks = []
        except Exception as e:
            self.error = f"starting the allocator's history: {e!r}"

    def finish(self):
        if self.error is None:
            try:
                if self.meter.marks is None:
                    raise RuntimeError(self.meter.marks_error)
                eager_step_events.write(self.path, allocator_trace(), self.meter.marks,
                                        os.path.dirname(os.path.abspath(torch.__file__)))
            except Exception as e:
                self.error = f"writing {self.path}: {e!r}"
        self.meter.marks = None
        try:
            torch.cuda.memory._record_memory_history(enabled=None)
        except Exception:
            pass


def allocator_trace():
    """The caching allocator's recorded events on the current device (torch/cuda/memory.py _snapshot)."""
    return torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]


def cap_allocator(device, budget):
    """torch.cuda.set_per_process_memory_fraction(budget / total), as an
    oomtune trial caps the caching allocator at its budget (trial/
    cuda_measurement.h); the allocator then raises OutOfMemoryError past it."""
    if device.type != "cuda":
        fail("--budget caps the CUDA caching allocator: it needs --device cuda")
    total = torch.cuda.get_device_properties(device).total_memory
    if not 0 < budget <= total:
        fail(f"--budget {budget} B is not within the device's {total} B")
    # An index: set_per_process_memory_fraction refuses torch.device("cuda")
    # (ValueError on PyTorch 2.11, seen on an H200, 2026-11-29).
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(budget / total, index)


def allocator_counters(device):
    """The caching allocator's out-of-memory errors (num_ooms: those cuDNN
    caught to run another engine when a convolution's workspace did not fit,
    aten/src/ATen/native/cudnn/Conv_v8.cpp try_configs, count too) and cache
    flushes (num_alloc_retries) over the run; None off CUDA."""
    if device.type != "cuda":
        return None
    stats = torch.cuda.memory_stats(device)
    return {key: stats.get(key, 0) for key in ("num_ooms", "num_alloc_retries")}


def read_job(path):
    """The job spec (TOML) and its model file's path."""
    try:
        with open(path, "rb") as f:
            job = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        fail(f"{path}: {e}")
    return job, os.path.join(os.path.dirname(os.path.abspath(path)), job["model"])


class Training:
    """A job's model and optimizer on a device, trained one step at a time
    as oomtune's trials train it (phases measured into a record)."""

    def __init__(self, job, path, mode, device, micro_batch, accum=1, ckpt="none", precision="fp32", seed=0):
        if accum < 1 or micro_batch < 1:
            fail("--micro-batch and --accum must be at least 1")
        if ckpt == "all" and mode != "eager":
            fail("--ckpt all checkpoints the eager module only (--mode eager)")
        torch.manual_seed(seed)
        scripted = torch.jit.load(path, map_location="cpu")
        if mode == "script":
            torch._C._set_graph_executor_optimize(False)  # as oomtune runs it (issue #10 item 5)
            model = scripted
        else:
            model = eager_module(path, scripted)
        self.model = model.to(device).train()
        torch.manual_seed(seed)  # building the eager module drew from the RNG: same dropout masks in both modes
        self.optimizer = make_optimizer(job, [p for p in self.model.parameters() if p.requires_grad])
        self.job, self.device, self.micro_batch, self.accum, self.ckpt = job, device, micro_batch, accum, ckpt
        self.generator = torch.Generator().manual_seed(seed)
        self.meter = PhaseMeter(device)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = (lambda: torch.autocast(device.type, dtype=dtype)) if dtype else contextlib.nullcontext
        # fp16: dynamic loss scaling, torch.amp's recipe (GradScaler: scale
        # the loss for backward, unscale and step, update the scale).
        self.scaler = None
        if precision == "fp16":
            if not hasattr(torch, "amp") or not hasattr(torch.amp, "GradScaler"):
                fail(f"--precision fp16 needs torch.amp.GradScaler (PyTorch 2.3 or later; this is {torch.__version__})")
            self.scaler = torch.amp.GradScaler(device.type)

    def step(self, record):
        """One optimizer step of `accum` micro-batches; record["at"] names the
        phase running, for an out-of-memory error to say where it came."""
        job, meter, autocast = self.job, self.meter, self.autocast
        target_name = job["loss"].get("target")
        for _ in range(self.accum):
            inputs = make_inputs(job, self.micro_batch, self.device, self.generator)
            args_in = [t for name, t in inputs.items() if name != target_name]
            # One autocast region over forward and loss, as torch.amp's recipe
            # writes it and oomtune's trials run it: the weights' bf16 casts
            # stay cached through the loss (a checkpointed model keeps no
            # other reference to them: 48.6 MiB for ResNet-50's).
            with autocast():
                record["at"] = "forward"
                with meter.phase(record["forward"], "forward"):
                    if self.ckpt == "all":
                        raw = forward_checkpointed(self.model, *args_in)
                    else:
                        raw = self.model(*args_in)
                    output = select_output(raw, job.get("output"))
                record["at"] = "loss"
                with meter.phase(record["loss"], "loss"):
                    loss = loss_of(job, output, inputs)
                    if self.accum > 1:
                        loss = loss / self.accum
            del raw, output
            record["at"] = "backward"
            with meter.phase(record["backward"], "backward"):
                (self.scaler.scale(loss) if self.scaler else loss).backward()
            record["loss_value"] = loss.item() * self.accum
            del loss
        record["at"] = "optimizer"
        with meter.phase(record["optimizer"], "optimizer"):
            # The job's gradient clipping, as torch.amp's recipe writes it:
            # unscale_ first with fp16, so that max_norm meets the true
            # gradients; the total norm dropped.
            max_norm = job.get("optimizer", {}).get("max_grad_norm", 0.0)
            if max_norm > 0:
                if self.scaler:
                    self.scaler.unscale_(self.optimizer)
                torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], max_norm)
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        del record["at"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job")
    parser.add_argument("--micro-batch", type=int, required=True)
    parser.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--mode", choices=["eager", "script"], default="eager")
    parser.add_argument("--ckpt", choices=["none", "all"], default="none")
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget", type=int, help="bytes: cap the CUDA caching allocator there")
    parser.add_argument("--out", help="write the JSON here too")
    parser.add_argument("--step-events", metavar="FILE", help="CUDA: the measured step's allocations, from the "
                        "allocator's trace, in oomtune's step-events format (scripts/eager_step_events.py)")
    parser.add_argument("--snapshot", metavar="FILE", help="CUDA: the allocator's history over the whole run, "
                        "dumped at its end (torch.cuda.memory._dump_snapshot)")
    args = parser.parse_args()

    job, path = read_job(args.job)
    device = torch.device(args.device)
    if args.step_events and device.type != "cuda":
        fail("--step-events records the CUDA caching allocator's trace: it needs --device cuda")
    if args.snapshot and device.type != "cuda":
        fail("--snapshot records the CUDA caching allocator's history: it needs --device cuda")
    if args.snapshot and args.step_events:
        fail("--snapshot and --step-events both record the allocator's history: give one")
    if args.budget is not None:
        cap_allocator(device, args.budget)
    if args.steps < 1:
        fail("--steps must be at least 1")
    training = Training(job, path, args.mode, device, args.micro_batch, args.accum, args.ckpt, args.precision,
                        args.seed)

    if args.snapshot:
        torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                                 max_entries=1_000_000)
    steps = []
    out_of_memory = step_events_error = None
    measured_step = 1 if args.steps > 1 else 0
    for index in range(args.steps):
        record = {phase: {} for phase in PHASES}
        recording = StepRecording(args.step_events, training.meter) if args.step_events and index == measured_step \
            else None
        if recording:
            recording.start()
        start = time.perf_counter()
        try:
            training.step(record)
        except torch.cuda.OutOfMemoryError as e:
            out_of_memory = {"step": index, "phase": record["at"], "message": str(e).splitlines()[0]}
            break
        record["seconds"] = time.perf_counter() - start  # the phases synchronize the device
        steps.append(record)
        if recording:
            recording.finish()
            if recording.error:
                step_events_error = recording.error

    if args.snapshot:
        torch.cuda.memory._dump_snapshot(args.snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    result = {"job": args.job, "model": path, "mode": args.mode, "device": str(device),
              "torch": torch.__version__, "micro_batch": args.micro_batch, "accum": args.accum, "ckpt": args.ckpt,
              "precision": args.precision, "budget_bytes": args.budget, "snapshot": args.snapshot,
              "measured_step": measured_step, "steps": steps}
    if (counters := allocator_counters(device)) is not None:
        result["allocator"] = counters
    if out_of_memory is not None:
        result["out_of_memory"] = out_of_memory
    if step_events_error is not None:
        result["step_events_error"] = step_events_error
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 3 if out_of_memory is not None else 0


if __name__ == "__main__":
    sys.exit(main())
