"""Accelerate loads and runs what `oomtune emit` writes (accelerate_config.yaml).

Usage: accelerate_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan, the YAML loads
       with Accelerate's own loader (commands/config/config_args.py
       load_config_from_file: ClusterConfig, which refuses unknown keys);
       `accelerate launch --config_file` reads it as far as the launcher
       (commands/launch.py _validate_launch_command, then
       prepare_deepspeed_cmd_env or prepare_simple_launcher_cmd_env: the
       environment the training process gets), and Accelerator() constructs
       in that environment, here in one process on the CPU, in the emitted
       folder (deepspeed_config_file is relative to it). Checked: the
       distributed type, mixed precision, accumulation, and micro-batch x
       accumulation = the plan's global batch. Outside DeepSpeed the file has
       no accumulation key: the script passes
       Accelerator(gradient_accumulation_steps=N), as its note says. Under
       DeepSpeed the DeepSpeed config Accelerate will hand to
       deepspeed.initialize asks for the plan's clipping and precision and
       ZeRO stage and buckets no larger than the model
       (emitted.check_deepspeed_config); and the note's reason for the file
       form holds: the inline deepspeed_config keys with gradient_clipping
       0.0 leave it out (DeepSpeed >= 0.19.3 then clips at 1.0), and
       mixed_precision 'bf16' adds DeepSpeed's bf16 section. What needs a GPU
       (use_cpu: false, DeepSpeed's CUDA kernels) is checked only as far as
       the loader and construction go.
train: an Accelerate loop (prepare, accumulate, backward, step) trains the
       test GPT with the emitted config: plain, and through DeepSpeed on its
       CPU accelerator (ZeRO-2 offload with DeepSpeedCPUAdam in fp32, bf16
       and fp16 autocast; bf16_params) with accelerate.utils.DummyOptim, as
       the note says; samples per optimizer step = global batch; the loss
       decreases; through DeepSpeed the engine does not clip, the parameters
       keep the plan's dtype and ZeRO-2's gradient buckets hold at most the
       model.
"""

import contextlib
import json
import os
import sys

import torch
import yaml
from accelerate import Accelerator
from accelerate.commands.config.config_args import load_config_from_file
from accelerate.state import AcceleratorState, GradientState
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils import DistributedType, DummyOptim, patch_environment
from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_simple_launcher_cmd_env

from emitted import AUTOCAST_DTYPE, check_deepspeed_config, run_test
from training import (OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_deepspeed_run, check_run,
                      script_optimizer, zero_buckets)


def launch_environment(config_file):
    """The environment `accelerate launch --config_file CONFIG train.py`
    gives the training process (launch_command, up to the launcher)."""
    args = launch_command_parser().parse_args(["--config_file", config_file, "--main_process_port", "0", "train.py"])
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        if mp_from_config_flag:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
        # The one process torch.distributed.run starts for num_processes 1.
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=os.environ.get("OOMTUNE_TEST_PORT", "29518"))
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return {k: v for k, v in env.items() if k not in os.environ or os.environ[k] != v}


def inline_form(case, mixed_precision):
    """What the file form replaces: Accelerate's inline deepspeed_config
    keys (gradient_clipping 0.0, the ZeRO stage and offload) with
    mixed_precision, as accelerate_config.yaml was written before. Written
    beside as accelerate_config_inline.yaml; returns its path."""
    with open(case.path("accelerate_config.yaml")) as f:
        config = yaml.safe_load(f)
    config["deepspeed_config"] = {"gradient_accumulation_steps": case.accumulation_steps, "gradient_clipping": 0.0,
                                  "offload_optimizer_device": "cpu" if case.offload else "none",
                                  "offload_param_device": "none", "zero3_init_flag": False,
                                  "zero_stage": 2 if case.offload else 0}
    config["mixed_precision"] = mixed_precision
    path = case.path("accelerate_config_inline.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    return path


@contextlib.contextmanager
def launched(case, config_file):
    """Accelerator() as the script launched with config_file makes it, inside
    the launch environment: the accumulation steps from the file under
    DeepSpeed, else from the note's argument. Accelerate's process-wide
    state is reset after."""
    config = load_config_from_file(config_file)
    deepspeed = config.distributed_type == DistributedType.DEEPSPEED
    kwargs = {} if deepspeed else {"gradient_accumulation_steps": case.accumulation_steps}
    os.chdir(case.folder)  # where the script runs: deepspeed_config_file is relative to it
    try:
        with patch_environment(**launch_environment(config_file)):
            yield config, Accelerator(**kwargs)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def load(cases, failures):
    for case in cases:
        try:
            with launched(case, case.path("accelerate_config.yaml")) as (config, accelerator):
                check_accelerator(case, config, accelerator, failures)
            if config.distributed_type == DistributedType.DEEPSPEED:
                check_inline_form(case, failures)
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "Accelerate", e)
    return len(cases)


def check_accelerator(case, config, accelerator, failures):
    deepspeed = config.distributed_type == DistributedType.DEEPSPEED
    failures.check(deepspeed == case.deepspeed, case, f"distributed type {config.distributed_type}")
    failures.check(accelerator.distributed_type == config.distributed_type, case,
                   f"distributed type {accelerator.distributed_type}, the file says {config.distributed_type}")
    # Under DeepSpeed Accelerate reads the precision from the DeepSpeed config:
    # its bf16 section (bf16_params); autocast is the config's torch_autocast.
    expected = ("bf16" if case.precision == "bf16_params" else "no") if deepspeed else str(config.mixed_precision)
    failures.check(str(accelerator.mixed_precision) == expected, case,
                   f"mixed precision {accelerator.mixed_precision}, expected {expected}")
    # Under DeepSpeed the Accelerator takes the file's accumulation at prepare(); its config has it now.
    ds = accelerator.state.deepspeed_plugin.deepspeed_config if deepspeed else {}
    steps = ds["gradient_accumulation_steps"] if deepspeed else accelerator.gradient_accumulation_steps
    failures.check(steps == case.accumulation_steps, case, f"accumulation {steps}")
    failures.check(case.micro_batch * steps * accelerator.num_processes == case.global_batch, case,
                   "micro-batch x accumulation x processes != global batch")
    if deepspeed:
        failures.check(config.mixed_precision is None, case,
                       f"mixed_precision {config.mixed_precision} beside the file")
        failures.check(ds["train_micro_batch_size_per_gpu"] == case.micro_batch, case, f"micro-batch {ds}")
        check_deepspeed_config(case, ds, failures, "Accelerate")


def check_inline_form(case, failures):
    """The note's reasons for deepspeed_config_file, so that it stays true."""
    mixed_precision = {"bf16": "bf16", "fp16": "fp16", "bf16_params": "bf16"}.get(case.precision, "no")
    with launched(case, inline_form(case, mixed_precision)) as (_, accelerator):
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        failures.check("gradient_clipping" not in ds, case,
                       f"the inline form keeps gradient_clipping {ds.get('gradient_clipping')}: update the note")
        if case.precision in AUTOCAST_DTYPE:
            failures.check(ds.get(case.precision, {}).get("enabled") is True, case,
                           f"mixed_precision '{mixed_precision}' leaves {ds.get(case.precision)}: update the note")


def train(cases, failures):
    for case in cases:
        with launched(case, case.path("accelerate_config.yaml")) as (config, accelerator):
            with open(case.path("ds_config.json")) as f:
                file_optimizer = "optimizer" in json.load(f)
            deepspeed = config.distributed_type == DistributedType.DEEPSPEED
            with zero_buckets() as buckets:
                engine, model = train_one(case, accelerator, failures, dummy_optimizer=deepspeed and file_optimizer)
            if deepspeed:
                failures.check(engine.gradient_clipping() == case.max_grad_norm, case,
                               f"the engine clips at {engine.gradient_clipping()}, the plan at {case.max_grad_norm}")
                check_deepspeed_run("accelerate", case, model, buckets, failures)
    return len(cases)


def train_one(case, accelerator, failures, dummy_optimizer):
    """Trains the test GPT; the optimizer is the script's (the plan's AdamW or
    Adafactor: training.script_optimizer), or, where ds_config.json has an
    optimizer section, accelerate.utils.DummyOptim (the section builds it),
    as the note says. Returns the prepared model and the model."""
    model = CountingGPT()
    optimizer = DummyOptim(model.parameters()) if dummy_optimizer else script_optimizer(case, model.parameters())
    data = torch.utils.data.DataLoader(TokenRule(case.global_batch * OPTIMIZER_STEPS), batch_size=case.micro_batch,
                                       shuffle=True)
    model_run, optimizer, data = accelerator.prepare(model, optimizer, data)
    print(f"accelerate: {case.name}: {accelerator.distributed_type} on {accelerator.device}, "
          f"optimizer {type(optimizer.optimizer).__name__}")
    log = StepLog(model)
    model_run.train()
    for batch in data:
        with accelerator.accumulate(model_run):
            loss = model_run(**batch)["loss"]
            accelerator.backward(loss)
            # The note without DeepSpeed (whose config file clips).
            if case.max_grad_norm and accelerator.sync_gradients and \
                    accelerator.distributed_type != DistributedType.DEEPSPEED:
                accelerator.clip_grad_norm_(model_run.parameters(), case.max_grad_norm)
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.sync_gradients:
                log.optimizer_step()
    check_run("accelerate", case, log, failures)
    return model_run, model


def main(argv):
    return run_test("accelerate", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
