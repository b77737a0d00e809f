"""The plans the framework tests load, emitted by `oomtune emit` into a work
folder: every golden case (tests/recipes/golden/<case>/plan.toml) and the
configurations the autotune end-to-end tests choose (tests/autotune/
autotune_test.cpp), plus the plans the training runs use.

The autotune tests' plans are written here as plan.toml, as `autotune --emit`
writes them, rather than made by running autotune: a search takes from
half a minute to several minutes on two cores, and which micro-batch it
picks among the fitting ones depends on timing. The configurations below are
the ones those tests accept (their assertions, one plan per branch), on their
jobs: the small and wide GPTs with AdamW at lr 3e-4 and ResNet-50 with SGD
(lr 0.1, momentum 0.9, weight decay 1e-4), device "cpu".
"""

import os
import shutil
import subprocess
import sys
import tomllib

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "recipes", "golden")
sys.path.insert(0, os.path.join(HERE, "..", "recipes"))
from plan_text import plan_toml  # noqa: E402  (shared with recipes/framework_keys_test.py)

# Trainable parameters of each job's model, as autotune writes them ([job]
# parameters; they size DeepSpeed's ZeRO-2 buckets): the autotune test GPTs
# (tests/autotune/CMakeLists.txt; examples/export_models.py's GPT, counted),
# examples/models/resnet50.pt, and the training runs' GPT (TRAIN_GPT).
JOB_PARAMETERS = {"gpt_small": 167_680, "gpt_wide": 2_496_000, "resnet50": 25_557_032, "test_gpt": 30_080}

GPT_ADAMW = {"lr": 3e-4, "weight_decay": 0.01, "betas": [0.9, 0.999], "eps": 1e-08, "momentum": 0.0}
RESNET_SGD = {"lr": 0.1, "weight_decay": 1e-4, "betas": [0.9, 0.999], "eps": 1e-08, "momentum": 0.9}

# name: (job, micro_batch, accumulation_steps, checkpoint, optimizer, offload, precision, hyper-parameters)
AUTOTUNE_PLANS = {
    # PlainFitOnResNet50AndHeldBackPrediction: plain 8 x 1, SGD.
    "autotune_resnet50_plain": ("resnet50", 8, 1, "none", "sgd", False, "fp32", RESNET_SGD),
    # CheckpointingWhenOnlyRecomputeFits: 8 x 1 with checkpointing.
    "autotune_checkpointing": ("gpt_small", 8, 1, "all", "adamw", False, "fp32", GPT_ADAMW),
    "autotune_checkpointing_first": ("gpt_small", 8, 1, "first:1", "adamw", False, "fp32", GPT_ADAMW),
    # AccumulationWhenTheFullBatchDoesNotFitAndCrashesAreData: G = 16, micro < 16.
    "autotune_accumulation": ("gpt_small", 8, 2, "none", "adamw", False, "fp32", GPT_ADAMW),
    # EightBitWhenNoAdamWConfigurationFits: 8-bit AdamW 8 x 1, with and without checkpointing.
    "autotune_eight_bit": ("gpt_wide", 8, 1, "none", "adamw8bit", False, "fp32", GPT_ADAMW),
    "autotune_eight_bit_checkpointing": ("gpt_wide", 8, 1, "all", "adamw8bit", False, "fp32", GPT_ADAMW),
    # OffloadWhenEightBitDoesNotFit: offload 8 x 1, with and without checkpointing.
    "autotune_offload": ("gpt_wide", 8, 1, "none", "adamw", True, "fp32", GPT_ADAMW),
    "autotune_offload_checkpointing": ("gpt_wide", 8, 1, "all", "adamw", True, "fp32", GPT_ADAMW),
    # AccumulatedPeaksArePredictedFromBackwardsActivationLines: the four verified nodes.
    "autotune_accumulated_eight_bit": ("gpt_wide", 4, 4, "none", "adamw8bit", False, "fp32", GPT_ADAMW),
    "autotune_accumulated_eight_bit_checkpointing": ("gpt_wide", 4, 4, "all", "adamw8bit", False, "fp32", GPT_ADAMW),
    "autotune_accumulated_offload": ("gpt_wide", 8, 2, "none", "adamw", True, "fp32", GPT_ADAMW),
    "autotune_accumulated_offload_checkpointing": ("gpt_wide", 16, 1, "all", "adamw", True, "fp32", GPT_ADAMW),
    # Rescue...: checkpointing all blocks as the base, 8 x 1.
    "autotune_rescue_checkpointing": ("gpt_small", 8, 1, "all", "adamw", False, "fp32", GPT_ADAMW),
}

# The training runs' plans: the test GPT (TRAIN_GPT below) with a learning
# rate that makes a few steps show; accumulation so that samples per
# optimizer step differ from the micro-batch. DeepSpeed's plans last: their
# runs leave a process group and Accelerate's state behind. bf16 and fp16
# autocast under offload run through DeepSpeed's torch_autocast (fp32
# weights, fp16 loss-scaled); bf16_params through its bf16 mode.
TRAIN_ADAMW = {"lr": 3e-3, "weight_decay": 0.0, "betas": [0.9, 0.999], "eps": 1e-08, "momentum": 0.0}
TRAIN_PLANS = {
    # Gradient clipping at 1.0 (the Trainer's default) here and under
    # DeepSpeed with fp16's loss scaling (train_offload_fp16).
    "train_accumulation": ("test_gpt", 4, 3, "none", "adamw", False, "fp32", dict(TRAIN_ADAMW, max_grad_norm=1.0)),
    # Adafactor (issue #45's strategy-table example): HF builds it from
    # optim = "adafactor", Lightning from the emitted class and kwargs,
    # DeepSpeed and Accelerate take the script's (training.script_optimizer).
    "train_adafactor": ("test_gpt", 4, 3, "none", "adafactor", False, "fp32", TRAIN_ADAMW),
    "train_offload": ("test_gpt", 4, 3, "none", "adamw", True, "fp32", TRAIN_ADAMW),
    "train_offload_bf16": ("test_gpt", 4, 3, "none", "adamw", True, "bf16", TRAIN_ADAMW),
    "train_offload_fp16": ("test_gpt", 4, 3, "none", "adamw", True, "fp16", dict(TRAIN_ADAMW, max_grad_norm=1.0)),
    "train_bf16_params": ("test_gpt", 4, 3, "none", "adamw", False, "bf16_params", TRAIN_ADAMW),
}

# The test GPT: examples/export_models.py's architecture, small.
TRAIN_GPT = {"vocab": 64, "d_model": 32, "n_layers": 2, "n_heads": 2, "seq": 16}

class Case:
    """One emitted plan: its folder (the emitted files beside plan.toml) and
    the plan as read back from plan.toml."""

    def __init__(self, name, folder):
        self.name = name
        self.folder = folder
        with open(os.path.join(folder, "plan.toml"), "rb") as f:
            self.plan = tomllib.load(f)
        config = self.plan["config"]
        self.micro_batch = config["micro_batch"]
        self.accumulation_steps = config["accumulation_steps"]
        self.global_batch = self.plan["job"]["global_batch"]
        self.precision = config.get("precision", "fp32")
        self.optimizer = config.get("optimizer", "adamw")
        self.offload = config.get("offload_optimizer", False)
        self.device = self.plan["job"].get("device", "cuda")
        self.parameters = self.plan["job"].get("parameters")  # None: a plan written before the key
        # The job's gradient clipping (0.0: none; absent from plans written before the key).
        self.max_grad_norm = self.plan.get("optimizer", {}).get("max_grad_norm", 0.0)
        # Every framework runs it through DeepSpeed (recipes/recipe_text.h uses_deepspeed).
        self.deepspeed = self.offload or self.precision == "bf16_params"

    def path(self, file_name):
        return os.path.join(self.folder, file_name)


def write_plan(path, job, micro, accum, checkpoint, optimizer, offload, precision, hyper):
    with open(path, "w") as f:
        f.write(plan_toml(micro, accum, checkpoint, optimizer, offload, precision, "cpu", job=job,
                          parameters=JOB_PARAMETERS[job], **hyper))


def emit(driver, plan_path, out):
    """Runs `oomtune emit PLAN --out OUT`; the plan is copied in too (format all)."""
    run = subprocess.run([driver, "emit", plan_path, "--out", out], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"oomtune emit {plan_path} failed (exit {run.returncode}): {run.stderr.strip()}")


def emit_cases(driver, work, which):
    """Emits the plans into work/<name>/ and returns their Cases: the golden
    and autotune plans for which="load", the training plans for "train"."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    cases = []
    if which == "load":
        for name in sorted(os.listdir(GOLDEN)):
            out = os.path.join(work, "golden_" + name)
            emit(driver, os.path.join(GOLDEN, name, "plan.toml"), out)
            cases.append(Case("golden_" + name, out))
    plans = AUTOTUNE_PLANS if which == "load" else TRAIN_PLANS
    for name, fields in plans.items():
        plan_path = os.path.join(work, name + ".toml")
        write_plan(plan_path, *fields)
        out = os.path.join(work, name)
        emit(driver, plan_path, out)
        cases.append(Case(name, out))
    return cases


def run_test(framework, argv, load, train, runs_on_the_cpu=lambda case: True):
    """The main() of a <framework>_test.py: argv is load|train OOMTUNE_EMIT
    WORK_DIR; load(cases, failures) or train(cases, failures) on the plans
    emitted into WORK_DIR (for train, those runs_on_the_cpu keeps). Returns
    the exit status: 0, or 1 after printing every failure."""
    mode, driver, work = argv
    if mode not in ("load", "train"):
        raise SystemExit(f"{framework}_test.py: expected load or train, got {mode!r}")
    cases = emit_cases(driver, work, mode)
    if mode == "train":
        cases = [case for case in cases if runs_on_the_cpu(case)]
    failures = Failures()
    checked = (load if mode == "load" else train)(cases, failures)
    return failures.report(f"{framework} {mode}", checked)


AUTOCAST_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}  # plan precision -> torch_autocast dtype
DEEPSPEED_DEFAULT_BUCKET = 500_000_000  # reduce/allgather_bucket_size (deepspeed/runtime/zero/config.py, 0.19.8)


def check_deepspeed_config(case, config, failures, who):
    """A DeepSpeed config as `who` (a framework, or ds_config.json itself)
    hands it to deepspeed.initialize: the plan's gradient clipping, 0.0
    included (DeepSpeed's default is 1.0 from 0.19.3); for autocast (bf16, fp16) torch_autocast
    with the plan's dtype and neither "bf16" nor "fp16" enabled, which cast
    the weights (engine.py _cast_module_mixed_precision); for bf16_params
    "bf16" enabled; ZeRO stage 2 under offload, else 0; under offload
    buckets that together hold at most the plan's parameters (two under
    torch_autocast, one per communication dtype: Note [ZeRO buckets] in
    recipes/deepspeed_sections.cpp), or DeepSpeed's default where the plan
    has no count."""
    where = f"{who}'s DeepSpeed config"
    failures.check(config.get("gradient_clipping", 1.0) == case.max_grad_norm, case,
                   f"{where}: gradient_clipping {config.get('gradient_clipping', '(absent: 1.0)')}")
    autocast = config.get("torch_autocast", {})
    enabled = {section: config.get(section, {}).get("enabled", False) in (True, "true", "True")
               for section in ("bf16", "fp16")}
    if case.precision in AUTOCAST_DTYPE:
        failures.check(autocast.get("enabled") is True and autocast.get("dtype") == AUTOCAST_DTYPE[case.precision],
                       case, f"{where}: torch_autocast {autocast} for {case.precision} autocast")
        failures.check(not any(enabled.values()), case,
                       f"{where}: {config.get('bf16')} / {config.get('fp16')} casts the weights of an autocast plan")
    else:
        failures.check(not autocast.get("enabled"), case, f"{where}: torch_autocast {autocast}")
        failures.check(enabled == {"bf16": case.precision == "bf16_params", "fp16": False}, case,
                       f"{where}: bf16 {config.get('bf16')}, fp16 {config.get('fp16')} for {case.precision}")
    zero = config.get("zero_optimization", {})
    failures.check(zero.get("stage", 0) == (2 if case.offload else 0), case, f"{where}: ZeRO {zero}")
    if case.offload:
        reduce = zero.get("reduce_bucket_size", DEEPSPEED_DEFAULT_BUCKET)
        allgather = zero.get("allgather_bucket_size", DEEPSPEED_DEFAULT_BUCKET)
        if case.parameters is None:
            failures.check(reduce == allgather == DEEPSPEED_DEFAULT_BUCKET, case, f"{where}: buckets {zero}")
        else:
            buckets = 2 if case.precision in AUTOCAST_DTYPE else 1
            failures.check(reduce * buckets <= max(case.parameters, 2 * buckets) and allgather <= case.parameters
                           and allgather % 2 == 0, case,
                           f"{where}: buckets {reduce} x {buckets} / {allgather} for {case.parameters} parameters")


class Failures:
    """Collects failed checks, so that one run reports every refusal."""

    def __init__(self):
        self.messages = []

    def check(self, condition, case, message):
        if not condition:
            self.messages.append(f"{case.name}: {message}")

    def refused(self, case, what, error):
        self.messages.append(f"{case.name}: {what} refused it: {type(error).__name__}: {error}")

    def report(self, test, checked):
        for message in self.messages:
            print("FAIL", message)
        print(f"{test}: {checked} cases, {len(self.messages)} failures")
        return 1 if self.messages else 0
