#!/usr/bin/python3
"""Every file `oomtune emit` writes uses only keys and values its framework
accepts, as read from the framework's own source (framework_keys.json, made by
scripts/extract_framework_keys.py; none of the frameworks is installed here).

Usage: framework_keys_test.py OOMTUNE_EMIT FRAMEWORK_KEYS_JSON WORK_DIR

It writes a grid of plans (precision x optimizer x offload x checkpointing x
accumulation x device), emits each with `OOMTUNE_EMIT PLAN --out DIR`, and
checks the four framework files against the lists, plus the rules the
frameworks enforce when they load them:
- DeepSpeed: train_batch_size = train_micro_batch_size_per_gpu *
  gradient_accumulation_steps (config.py _batch_assertion, one GPU); the
  pydantic sections accept only their fields (extra="forbid"); autocast
  plans ask for torch_autocast with a dtype DtypeEnum reads and never for
  the bf16/fp16 sections (which cast the weights; DeepSpeed refuses both
  together), bf16_params for bf16; ZeRO-2's buckets hold at most the
  plan's parameters (allgather_bucket_size even, stage_1_and_2.py); an optimizer
  "type" is one of DEEPSPEED_OPTIMIZERS (any case) or a torch.optim class,
  and its "params" are that optimizer's keyword arguments (DeepSpeedCPUAdam
  under offload, FusedAdam otherwise; engine.py _configure_basic_optimizer),
  or with "torch_adam": true torch.optim.AdamW's, "foreach" among them
  (engine.py get_optimizer_configuration pops both; DeepSpeed 0.19.8).
- transformers: TrainingArguments' fields; optim one of OptimizerNames; not
  both bf16 and fp16, and neither for autocast under DeepSpeed;
  `deepspeed` names a file written beside it.
- Lightning: Trainer's parameters, a precision of _PRECISION_INPUT_STR, a
  registered strategy or DeepSpeedStrategy's class with its kwargs (its
  config checked as DeepSpeed's, without what Lightning refuses or sets:
  gradient_accumulation_steps, the optimizer), and an accelerator; the
  optimizer's kwargs fit its class.
- Accelerate: ClusterConfig's fields (from_yaml_file raises on any other
  key); deepspeed_config keys are `accelerate launch` options (launch copies
  each onto its arguments); under DeepSpeed, deepspeed_config_file names
  the ds_config.json written beside it, with no mixed_precision; enum values
  as DistributedType, PrecisionType, ComputeEnvironment.
And in every file the global batch is the plan's, exactly.

Needs PyYAML and torch (torch.optim signatures) in this Python; exits 77
(ctest: skipped) when either is missing.
"""

import inspect
import itertools
import json
import os
import shutil
import subprocess
import sys

from plan_text import plan_toml

try:
    import torch
    import yaml
except ImportError as e:
    print(f"framework_keys_test: skipped: {e}")
    sys.exit(77)

# Keys oomtune adds for the reader: DeepSpeed reads its config by the keys it
# knows (DeepSpeedConfig._initialize_params) and ignores others at the top
# level; JSON has no comments, so the notes travel in this key.
OOMTUNE_KEYS = {"oomtune_notes"}

failures = []

PARAMETERS = 1_000_001  # the grid's trainable parameter count ([job] parameters): odd, so buckets round down


def check(condition, where, message):
    if not condition:
        failures.append(f"{where}: {message}")


def subset(keys, allowed, where, what):
    unknown = sorted(set(keys) - set(allowed))
    check(not unknown, where, f"{what} the framework does not accept: {unknown}")


def kwargs_of(class_path):
    """The keyword arguments class_path accepts, from the lists or torch."""
    if class_path == "deepspeed.ops.adam.DeepSpeedCPUAdam":
        return KEYS["deepspeed"]["cpu_adam_kwargs"]
    if class_path == "bitsandbytes.optim.AdamW8bit":
        return KEYS["bitsandbytes"]["adamw8bit_kwargs"]
    if class_path == "transformers.optimization.Adafactor":
        return KEYS["transformers"]["adafactor_kwargs"]
    if class_path.startswith("torch.optim.") and hasattr(torch.optim, class_path.rsplit(".", 1)[1]):
        return list(inspect.signature(getattr(torch.optim, class_path.rsplit(".", 1)[1])).parameters)
    return None


AUTOCAST_DTYPE = {"bf16": "bfloat16", "fp16": "float16"}  # plan precision -> torch_autocast dtype


def check_engine_sections(config, plan, where):
    """The entries ds_config.json and Lightning's DeepSpeedStrategy config
    share: zero_optimization and its buckets, the precision sections."""
    ds = KEYS["deepspeed"]
    zero = config.get("zero_optimization", {})
    subset(zero, ds["zero_optimization"], where, "zero_optimization keys")
    check(zero.get("stage", 0) in ds["zero_stage"], where, f"zero stage {zero.get('stage')}")
    offload = zero.get("offload_optimizer")
    if offload is not None:
        subset(offload, ds["offload_optimizer"], where, "offload_optimizer keys")
        check(offload.get("device") in ds["offload_device"], where, f"offload device {offload.get('device')}")
    check((offload is not None and offload.get("device") != "none") == plan["offload"], where,
          f"optimizer offload {offload} for a plan with offload {plan['offload']}")
    buckets = [zero[key] for key in ("reduce_bucket_size", "allgather_bucket_size") if key in zero]
    if plan["offload"]:
        # Two buckets under torch_autocast, one otherwise (Note [ZeRO buckets]).
        per_bucket = plan["parameters"] // (2 if plan["precision"] in AUTOCAST_DTYPE else 1)
        check(len(buckets) == 2 and all(0 < b <= max(2, per_bucket) for b in buckets)
              and zero["allgather_bucket_size"] % 2 == 0, where,
              f"ZeRO-2 buckets {buckets} for {plan['parameters']} parameters")
    else:
        check(not buckets, where, f"buckets {buckets} without ZeRO")
    for section in ("fp16", "bf16", "activation_checkpointing", "torch_autocast"):
        if section in config:
            subset(config[section], ds[section], where, f"{section} keys")
    autocast = config.get("torch_autocast", {})
    if plan["precision"] in AUTOCAST_DTYPE:
        check(autocast.get("enabled") is True and autocast.get("dtype") == AUTOCAST_DTYPE[plan["precision"]]
              and autocast["dtype"] in ds["torch_autocast_dtype"], where, f"torch_autocast {autocast}")
    else:
        check(not autocast, where, f"torch_autocast {autocast} for precision {plan['precision']}")
    for section in ("bf16", "fp16"):
        enabled = config.get(section, {}).get("enabled", False)
        check(enabled == (section == "bf16" and plan["precision"] == "bf16_params"), where,
              f"{section}.enabled {enabled} for precision {plan['precision']} (casts the weights)")


def check_deepspeed(path, plan):
    ds = KEYS["deepspeed"]
    config = json.load(open(path))
    where = path
    subset(config, ds["top_level"] + sorted(OOMTUNE_KEYS), where, "top-level keys")
    micro, accum = config.get("train_micro_batch_size_per_gpu"), config.get("gradient_accumulation_steps")
    check(config.get("train_batch_size") == plan["global"] and micro == plan["micro"] and accum == plan["accum"],
          where, f"batch sizes {config.get('train_batch_size')} = {micro} x {accum}, plan {plan['global']}")
    check(config.get("gradient_clipping") == plan["max_grad_norm"], where,
          f"gradient_clipping {config.get('gradient_clipping')}, the plan {plan['max_grad_norm']}")
    check_engine_sections(config, plan, where)
    optimizer = config.get("optimizer")
    if optimizer is not None:
        subset(optimizer, ["type", "params"], where, "optimizer keys")
        kind = optimizer["type"]
        params = optimizer.get("params", {})
        if kind.lower() in ds["optimizer_types"] and params.get("torch_adam"):
            torch_adamw = kwargs_of("torch.optim.AdamW")
            allowed = None if torch_adamw is None else ["torch_adam", "foreach"] + torch_adamw
        elif kind.lower() in ds["optimizer_types"]:
            allowed = ds["cpu_adam_kwargs"] if plan["offload"] else ds["fused_adam_kwargs"]
        else:
            allowed = kwargs_of(f"torch.optim.{kind}")
            check(allowed is not None, where, f"optimizer type {kind} is neither DeepSpeed's nor torch.optim's")
        if allowed is not None:
            subset(optimizer.get("params", {}), allowed, where, f"{kind} params")


def check_hf(path, out_dir, plan):
    hf = KEYS["transformers"]
    args = json.load(open(path))["training_args"]
    where = path
    subset(args, hf["training_args"], where, "TrainingArguments fields")
    check(args.get("optim") in hf["optim"], where, f"optim {args.get('optim')}")
    check(not (args.get("bf16") and args.get("fp16")), where, "bf16 and fp16 both true")
    if "deepspeed" in args and plan["precision"] in AUTOCAST_DTYPE:
        # The Trainer's Accelerate would add DeepSpeed's bf16/fp16 section.
        check(not args.get("bf16") and not args.get("fp16"), where, "bf16/fp16 switched on under DeepSpeed")
    check(args.get("lr_scheduler_type") == "constant", where, f"lr_scheduler_type {args.get('lr_scheduler_type')}")
    check(args.get("max_grad_norm") == plan["max_grad_norm"], where, f"max_grad_norm {args.get('max_grad_norm')}")
    check(args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == plan["global"], where,
          "per_device_train_batch_size x gradient_accumulation_steps is not the global batch")
    if "deepspeed" in args:
        check(os.path.isfile(os.path.join(out_dir, args["deepspeed"])), where,
              f"deepspeed = {args['deepspeed']} was not written beside it")


def check_lightning(path, plan):
    pl = KEYS["lightning"]
    config = json.load(open(path))
    trainer = config["trainer"]
    where = path
    subset(config, ["trainer", "datamodule", "optimizer", "notes"], where, "sections")
    subset(trainer, pl["trainer"], where, "Trainer parameters")
    for key in ("precision", "strategy", "accelerator"):
        if key in trainer and not isinstance(trainer[key], dict):
            check(trainer[key] in pl[key], where, f"{key} {trainer[key]!r}")
    strategy = trainer.get("strategy")
    deepspeed = plan["offload"] or plan["precision"] == "bf16_params"
    check(isinstance(strategy, dict) == deepspeed, where, f"strategy {strategy!r}")
    if isinstance(strategy, dict):
        check(strategy.get("class") == "lightning.pytorch.strategies.DeepSpeedStrategy", where,
              f"strategy class {strategy.get('class')}")
        subset(strategy.get("kwargs", {}), pl["deepspeed_strategy_kwargs"], where, "DeepSpeedStrategy kwargs")
        ds_config = strategy.get("kwargs", {}).get("config", {})
        subset(ds_config, KEYS["deepspeed"]["top_level"], where, "DeepSpeedStrategy config keys")
        for refused in ("gradient_accumulation_steps", "optimizer"):  # Lightning refuses / configure_optimizers
            check(refused not in ds_config, where, f"DeepSpeedStrategy config has {refused}")
        check(ds_config.get("gradient_clipping") == plan["max_grad_norm"], where,
              f"DeepSpeedStrategy config clips at {ds_config.get('gradient_clipping')}")
        check_engine_sections(ds_config, plan, where)
        # "bf16-mixed" / "16-mixed" would make Lightning add the casting section.
        check(trainer["precision"] == ("bf16-mixed" if plan["precision"] == "bf16_params" else "32-true"), where,
              f"precision {trainer['precision']} under DeepSpeed")
    else:
        check(trainer.get("gradient_clip_val") == (plan["max_grad_norm"] or None) and
              trainer.get("gradient_clip_algorithm") == ("norm" if plan["max_grad_norm"] else None), where,
              f"gradient_clip_val {trainer.get('gradient_clip_val')} ({trainer.get('gradient_clip_algorithm')})")
    check(config["datamodule"]["batch_size"] * trainer.get("accumulate_grad_batches", 1) == plan["global"], where,
          "batch_size x accumulate_grad_batches is not the global batch")
    optimizer = config["optimizer"]
    allowed = kwargs_of(optimizer["class"])
    check(allowed is not None, where, f"optimizer class {optimizer['class']} is not known")
    if allowed is not None:
        subset(optimizer["kwargs"], allowed, where, f"{optimizer['class']} kwargs")


def check_accelerate(path, plan):
    acc = KEYS["accelerate"]
    config = yaml.safe_load(open(path))
    where = path
    subset(config, acc["config"], where, "config keys (ClusterConfig.from_yaml_file refuses others)")
    for key in ("distributed_type", "compute_environment"):
        check(config.get(key) in acc[key], where, f"{key} {config.get(key)!r}")
    ds = config.get("deepspeed_config")
    # Next to a DeepSpeed config file Accelerate refuses mixed_precision.
    check(("mixed_precision" in config) == (ds is None), where, f"mixed_precision {config.get('mixed_precision')!r}")
    if "mixed_precision" in config:
        check(config["mixed_precision"] in acc["mixed_precision"], where,
              f"mixed_precision {config['mixed_precision']}")
    if ds is not None:
        subset(ds, acc["launch_options"], where, "deepspeed_config keys (not `accelerate launch` options)")
        # The file form: the inline keys drop gradient_clipping 0.0 and cannot
        # say the buckets or torch_autocast.
        check(set(ds) == {"deepspeed_config_file", "zero3_init_flag"}, where, f"deepspeed_config {ds}")
        ds_file = os.path.join(os.path.dirname(path), ds.get("deepspeed_config_file", ""))
        check(os.path.isfile(ds_file), where, f"deepspeed_config_file {ds.get('deepspeed_config_file')} not beside it")
        if os.path.isfile(ds_file):
            check(json.load(open(ds_file)).get("gradient_accumulation_steps") == plan["accum"], where,
                  "gradient_accumulation_steps")
    check(config.get("num_processes") == 1, where, "num_processes (the plan was measured on one device)")


def main(argv):
    global KEYS
    emit, keys_path, work = argv
    KEYS = json.load(open(keys_path))
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    emitted = refused = 0
    grid = itertools.product(("fp32", "bf16", "fp16", "bf16_params"), ("adamw", "adamw8bit", "sgd", "adafactor"),
                             (False, True),
                             ("none", "all", "first:2"), ((8, 1), (2, 4)), ("cpu", "cuda"))
    for precision, optimizer, offload, checkpoint, (micro, accum), device in grid:
        name = f"{precision}-{optimizer}-{'offload' if offload else 'gpu'}-" \
               f"{checkpoint.replace(':', '')}-{micro}x{accum}-{device}"
        case = os.path.join(work, name)
        os.makedirs(case)
        plan_path = os.path.join(case, "plan.toml")
        max_grad_norm = 1.0 if accum > 1 else 0.0  # half the grid clips
        with open(plan_path, "w") as f:
            f.write(plan_toml(micro, accum, checkpoint, optimizer, offload, precision, device,
                              momentum=0.9 if optimizer == "sgd" else 0.0, parameters=PARAMETERS,
                              max_grad_norm=max_grad_norm))
        out = os.path.join(case, "out")
        run = subprocess.run([emit, "emit", plan_path, "--out", out], capture_output=True, text=True)
        if run.returncode != 0:
            # A plan oomtune refuses is refused cleanly: one line, exit 2, no folder.
            refused += 1
            lines = run.stderr.strip().splitlines()
            check(run.returncode == 2 and len(lines) == 1 and lines[0].startswith("oomtune: ")
                  and not os.path.exists(out), name, f"refused with exit {run.returncode}: {run.stderr.strip()}")
            continue
        emitted += 1
        plan = {"global": micro * accum, "micro": micro, "accum": accum, "offload": offload,
                "precision": precision, "parameters": PARAMETERS, "max_grad_norm": max_grad_norm}
        check_deepspeed(os.path.join(out, "ds_config.json"), plan)
        check_hf(os.path.join(out, "hf_training_args.json"), out, plan)
        check_lightning(os.path.join(out, "lightning_trainer.json"), plan)
        check_accelerate(os.path.join(out, "accelerate_config.yaml"), plan)
    print(f"framework_keys_test: {emitted} plans emitted and checked, {refused} refused")
    check(emitted >= 100, "grid", f"only {emitted} plans emitted")
    for failure in failures[:20]:
        print("FAIL", failure)
    if len(failures) > 20:
        print(f"... and {len(failures) - 20} more failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
