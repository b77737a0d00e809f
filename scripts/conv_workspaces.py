#!/usr/bin/env python3
"""What cuDNN allocates beside each convolution's and batch norm's outputs in
eager CUDA training, and how much of the step's peak that is (issue #46
item 6).

    conv_workspaces.py JOB.toml --micro-batch N [--device cuda|cpu] [--out FILE]
    conv_workspaces.py --table RUN.json [RUN.json ...]   # earlier runs, a Markdown row each

oomtune's meta and CPU probes count what every operator returns and keeps,
not what a CUDA library allocates and frees inside one call: cuDNN sizes a
convolution's workspace on the GPU at run time, for the algorithm its
heuristics pick there (aten/src/ATen/native/cudnn/Conv_v8.cpp, run_conv_plan:
plan.getWorkspaceSize() from the caching allocator; BatchNorm.cpp likewise for
batch norm's workspace and reserve space). On an H200 (2026-11-29) the meta
peaks of the torchvision CNNs were 0.7-3.2 % under eager PyTorch's
(docs/validation.md), 10-40 MiB, where the GPTs' were not; this measures
whether those bytes are the workspace of the call that runs at the step's
peak.

The step is scripts/eager_peaks.py's (the job's model as an eager nn.Module,
its inputs, loss and optimizer; fp32), one warm-up step first so that the
optimizer state exists, as oomtune measures. In the measured step every
nn.Conv2d and nn.BatchNorm2d call is a window, forward (module hooks) and
backward (hooks on its autograd node): at a window's start the caching
allocator's peak is read and reset, and at its end the window's peak less the
allocated bytes at its start and the bytes of what the call returned (rounded
to 512 B, c10/cuda/CUDACachingAllocator.cpp kMinBlockSize) is its extra:
what the call held beside its outputs at its high point. Batch norm's extra
includes its saved mean and inverse deviation (2 x C fp32: KiB), which meta
counts. The stretches between windows are measured the same way, so:

  step_peak_bytes                  the measured step's peak allocated bytes
  step_peak_without_extras_bytes   the same with every window's extra taken out
  at_peak                          the window whose peak is the step's, if any

Prints JSON; on the CPU (no allocator statistics) the byte fields are null
and only the windows are listed, which checks the hooks.
"""

import argparse
import contextlib
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import eager_peaks  # noqa: E402  (scripts/ is not a package)
from workspace_probe import tensor_bytes  # noqa: E402


class Windows:
    """The measured step cut into windows (one operator call each) and the
    stretches between them, each with its own peak."""

    def __init__(self, cuda):
        self.cuda = cuda
        self.records = []
        self.stretch_peaks = []
        self.open = None
        self.nested = 0

    def _peak_since_reset(self):
        if not self.cuda:
            return None
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        return peak

    def begin(self, info):
        if self.open is not None:  # not expected: modules' and nodes' calls do not nest
            self.nested += 1
            return
        self.stretch_peaks.append(self._peak_since_reset())
        self.open = (info, torch.cuda.memory_allocated() if self.cuda else None)

    def end(self, outputs):
        if self.open is None:
            return
        info, base = self.open
        self.open = None
        peak = self._peak_since_reset()
        extra = None if peak is None else peak - base - tensor_bytes(outputs)
        self.records.append(dict(info, peak_bytes=peak, extra_bytes=extra))

    def finish(self):
        self.stretch_peaks.append(self._peak_since_reset())


def summary(windows):
    """The step's peak with and without the windows' extras, the window at
    the peak and the one with the largest extra (all None on the CPU)."""
    records = windows.records
    if not windows.cuda:
        return dict(step_peak_bytes=None, step_peak_without_extras_bytes=None, at_peak=None, largest_extra=None)
    step_peak = max(windows.stretch_peaks + [r["peak_bytes"] for r in records])
    without = max(windows.stretch_peaks + [r["peak_bytes"] - max(r["extra_bytes"], 0) for r in records])
    return dict(step_peak_bytes=step_peak, step_peak_without_extras_bytes=without,
                at_peak=next((r for r in records if r["peak_bytes"] == step_peak), None),
                largest_extra=max(records, key=lambda r: r["extra_bytes"], default=None))


def describe(name, module, x, direction):
    """A window's record: the module, its kind, the pass, its input's shape and
    a convolution's geometry."""
    info = {"module": name, "kind": type(module).__name__, "pass": direction, "input": list(x.shape)}
    if isinstance(module, torch.nn.Conv2d):
        padding = module.padding if isinstance(module.padding, str) else list(module.padding)  # or "same"
        info.update(weight=list(module.weight.shape), stride=list(module.stride), padding=padding,
                    groups=module.groups)
    return info


def watch(model, windows):
    """Hooks on every Conv2d and BatchNorm2d: a forward window per call, and a
    backward window on its autograd node. Returns the handles."""
    handles = []
    for name, module in model.named_modules():
        if not isinstance(module, (torch.nn.Conv2d, torch.nn.BatchNorm2d)):
            continue

        def pre(module, inputs, name=name):
            windows.begin(describe(name, module, inputs[0], "forward"))

        def post(module, inputs, output, name=name):
            windows.end(output)
            node = output.grad_fn
            if node is not None:
                info = describe(name, module, inputs[0], "backward")
                node.register_prehook(lambda grad_outputs, info=info: windows.begin(info))
                node.register_hook(lambda grad_inputs, grad_outputs: windows.end(grad_inputs))

        handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]
    return handles


class NoPhases:
    """eager_peaks.Training's phase meter, silenced: the windows own the
    allocator's peak statistics here."""

    def phase(self, record, name):
        return contextlib.nullcontext()


def table(paths):
    """A Markdown row per run (its file's name): the step's peak with and
    without the extras, in MiB, the window at the peak and the largest extra."""
    def mib(nbytes):
        return "-" if nbytes is None else f"{nbytes / 2**20:.2f}"

    lines = ["| run | eager step peak | without the extras | raised by the extras | window at the peak | "
             "largest extra |", "|---|---:|---:|---:|---|---|"]
    for path in paths:
        try:
            with open(path) as f:
                r = json.load(f)
        except (OSError, ValueError) as e:
            lines.append(f"| {os.path.basename(path)} | not read: {e} | | | | |")
            continue
        peak, without = r["step_peak_bytes"], r["step_peak_without_extras_bytes"]
        at, big = r["at_peak"], r["largest_extra"]
        at_text = f"{at['module']} {at['pass']}" if at else "between windows" if peak is not None else "-"
        big_text = f"{big['module']} {big['pass']}: {mib(big['extra_bytes'])}" if big else "-"
        extras = None if peak is None else peak - without
        lines.append(f"| {os.path.basename(path)[:-5]} | {mib(peak)} | {mib(without)} | {mib(extras)} | "
                     f"{at_text} | {big_text} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("job", nargs="?")
    parser.add_argument("--table", nargs="+", metavar="RUN_JSON", help="print the table of earlier runs")
    parser.add_argument("--micro-batch", type=int)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    if args.table:
        print(table(args.table))
        return 0
    if not args.job or not args.micro_batch:
        parser.error("JOB and --micro-batch are needed (or --table)")

    job, path = eager_peaks.read_job(args.job)
    device = torch.device(args.device)
    training = eager_peaks.Training(job, path, "eager", device, args.micro_batch, seed=args.seed)
    training.meter = NoPhases()
    training.step({phase: {} for phase in eager_peaks.PHASES})  # warm-up: the optimizer's state
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    windows = Windows(cuda)
    handles = watch(training.model, windows)
    training.step({phase: {} for phase in eager_peaks.PHASES})
    windows.finish()
    for handle in handles:
        handle.remove()

    result = {"job": args.job, "model": path, "device": str(device), "torch": torch.__version__,
              "cudnn": torch.backends.cudnn.version() if cuda else None, "micro_batch": args.micro_batch,
              "windows": windows.records, "nested_windows": windows.nested}
    result.update(summary(windows))
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
