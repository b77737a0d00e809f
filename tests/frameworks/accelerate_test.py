"""Accelerate loads and runs what `oomtune emit` writes (accelerate_config.yaml).

Usage: accelerate_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan, the YAML loads
       with Accelerate's own loader (commands/config/config_args.py
       load_config_from_file: ClusterConfig, which refuses unknown keys);
       `accelerate launch --config_file` reads it as far as the launcher
       (commands/launch.py _validate_launch_command, then
       prepare_deepspeed_cmd_env or prepare_simple_launcher_cmd_env: the
       environment the training process gets), and Accelerator() constructs
       in that environment, here in one process on the CPU. Checked: the
       distributed type, mixed precision, DeepSpeed's ZeRO stage, offload
       and accumulation, and micro-batch x accumulation = the plan's global
       batch. Outside DeepSpeed the file has no accumulation key: the script
       passes Accelerator(gradient_accumulation_steps=N), as its note says.
       Under DeepSpeed, the form the notes give (deepspeed_config_file:
       'ds_config.json') loads too, unclipped. What needs a GPU (use_cpu:
       false, DeepSpeed's CUDA kernels) is checked only as far as the loader
       and construction go.
train: an Accelerate loop (prepare, accumulate, backward, step) trains the
       test GPT with the emitted config, plain and offload (DeepSpeed
       ZeRO-2 with DeepSpeedCPUAdam on DeepSpeed's CPU accelerator), and the
       offload plan again in the notes' config-file form with DummyOptim;
       samples per optimizer step = global batch; the loss decreases. The
       engine's gradient clipping is checked against the note: 1.0 from the
       inline config (DeepSpeed >= 0.19.3's default), 0.0 from the file.
"""

import contextlib
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

from emitted import run_test
from training import OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_run, script_optimizer


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


def config_file_form(case):
    """The form the DeepSpeed notes of accelerate_config.yaml give (for SGD
    under offload, and to keep gradients unclipped with DeepSpeed 0.19.3 and
    later): deepspeed_config_file: 'ds_config.json' in place of the other
    deepspeed_config keys, no mixed_precision line. Written beside as
    accelerate_config_file_form.yaml; returns its path."""
    with open(case.path("accelerate_config.yaml")) as f:
        config = yaml.safe_load(f)
    config["deepspeed_config"] = {"deepspeed_config_file": case.path("ds_config.json"),
                                  "zero3_init_flag": config["deepspeed_config"]["zero3_init_flag"]}
    del config["mixed_precision"]
    path = case.path("accelerate_config_file_form.yaml")
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
                with launched(case, config_file_form(case)) as (_, accelerator):
                    check_config_file_form(case, accelerator, failures)
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "Accelerate", e)
    return len(cases)


def check_accelerator(case, config, accelerator, failures):
    deepspeed = config.distributed_type == DistributedType.DEEPSPEED
    failures.check(accelerator.distributed_type == config.distributed_type, case,
                   f"distributed type {accelerator.distributed_type}, the file says {config.distributed_type}")
    failures.check(str(accelerator.mixed_precision) == str(config.mixed_precision), case,
                   f"mixed precision {accelerator.mixed_precision}, the file says {config.mixed_precision}")
    failures.check(accelerator.gradient_accumulation_steps == case.accumulation_steps, case,
                   f"accumulation {accelerator.gradient_accumulation_steps}")
    failures.check(case.micro_batch * accelerator.gradient_accumulation_steps * accelerator.num_processes ==
                   case.global_batch, case, "micro-batch x accumulation x processes != global batch")
    failures.check(deepspeed == (case.offload or case.precision == "bf16_params"), case,
                   f"distributed type {config.distributed_type}")
    if deepspeed:
        ds = accelerator.state.deepspeed_plugin.deepspeed_config
        zero = ds["zero_optimization"]
        failures.check(zero["stage"] == (2 if case.offload else 0), case, f"ZeRO {zero}")
        failures.check(zero.get("offload_optimizer", {}).get("device", "none") == ("cpu" if case.offload else "none"),
                       case, f"offload in {zero}")
        failures.check(ds["gradient_accumulation_steps"] == case.accumulation_steps, case, f"deepspeed {ds}")


def check_config_file_form(case, accelerator, failures):
    """The notes' form: ds_config.json decides, gradients unclipped."""
    ds = accelerator.state.deepspeed_plugin.deepspeed_config
    failures.check(accelerator.distributed_type == DistributedType.DEEPSPEED, case, "config-file form: not DeepSpeed")
    failures.check(ds.get("gradient_clipping") == 0.0, case, f"config-file form: gradient_clipping {ds}")
    # Accelerator takes the file's accumulation at prepare(); its config has it now.
    failures.check(ds["gradient_accumulation_steps"] == case.accumulation_steps, case,
                   f"config-file form: accumulation {ds}")
    failures.check(ds["train_micro_batch_size_per_gpu"] * ds["gradient_accumulation_steps"] == case.global_batch,
                   case, f"config-file form: batch {ds}")


def train(cases, failures):
    for case in cases:
        with launched(case, case.path("accelerate_config.yaml")) as (config, accelerator):
            deepspeed = config.distributed_type == DistributedType.DEEPSPEED
            engine = train_one(case, accelerator, failures, dummy_optimizer=False)
            if deepspeed:
                # The note: Accelerate leaves gradient_clipping 0.0 out of the
                # DeepSpeed config it builds, and DeepSpeed 0.19.3 and later
                # then clip at 1.0. Checked, so that the note stays true.
                failures.check(engine.gradient_clipping() == 1.0, case,
                               f"inline deepspeed_config clips at {engine.gradient_clipping()}: update the note")
        if deepspeed:
            with launched(case, config_file_form(case)) as (_, accelerator):
                engine = train_one(case, accelerator, failures, dummy_optimizer=True)
                failures.check(engine.gradient_clipping() == 0.0, case,
                               f"config-file form clips at {engine.gradient_clipping()}")
    return len(cases)


def train_one(case, accelerator, failures, dummy_optimizer):
    """Trains the test GPT; the optimizer is the script's (the plan's AdamW or
    Adafactor: training.script_optimizer), or under the
    config-file form accelerate.utils.DummyOptim (ds_config.json's optimizer
    section builds it). Returns the prepared model."""
    model = CountingGPT()
    optimizer = DummyOptim(model.parameters()) if dummy_optimizer else script_optimizer(case, model.parameters())
    data = torch.utils.data.DataLoader(TokenRule(case.global_batch * OPTIMIZER_STEPS), batch_size=case.micro_batch,
                                       shuffle=True)
    model_run, optimizer, data = accelerator.prepare(model, optimizer, data)
    form = "config-file form" if dummy_optimizer else "emitted"
    print(f"accelerate: {case.name} ({form}): {accelerator.distributed_type} on {accelerator.device}, "
          f"optimizer {type(optimizer.optimizer).__name__}")
    log = StepLog(model)
    model_run.train()
    for batch in data:
        with accelerator.accumulate(model_run):
            loss = model_run(**batch)["loss"]
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            if accelerator.sync_gradients:
                log.optimizer_step()
    check_run(f"accelerate ({form})", case, log, failures)
    return model_run


def main(argv):
    return run_test("accelerate", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
