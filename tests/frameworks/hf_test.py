"""Hugging Face transformers loads and runs what `oomtune emit` writes
(hf_training_args.json, and the ds_config.json its `deepspeed` entry names).

Usage: hf_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan,
       TrainingArguments(output_dir=..., **training_args) constructs, in the
       emitted folder (the `deepspeed` entry is a path relative to the run's
       working folder: transformers then reads ds_config.json and checks it
       against the arguments), and its effective global batch,
       per_device_train_batch_size x gradient_accumulation_steps x world
       size, equals the plan's; the learning rate schedule is constant.
       Under DeepSpeed, Trainer(...) constructs (in the one-process
       environment the deepspeed launcher gives) and the DeepSpeed config
       its Accelerator will hand to deepspeed.initialize asks for no
       clipping, the plan's precision and ZeRO stage and buckets no larger
       than the model (emitted.check_deepspeed_config); for autocast, the
       same file with bf16 / fp16 = true gets DeepSpeed's casting bf16 / fp16
       section, as the note says.
train: Trainer trains the test GPT with those arguments on the CPU (only
       the run's length, output folder and logging added): the plain plan,
       and the DeepSpeed ones through ds_config.json (ZeRO-2 offload with
       DeepSpeedCPUAdam in fp32, bf16 and fp16 autocast; bf16_params); samples
       per optimizer step (counted in the model's forward, read at each
       on_optimizer_step) = global batch; the loss decreases; the learning
       rate ends where it began; through DeepSpeed the parameters keep the
       plan's dtype and ZeRO-2's gradient buckets hold at most the model.
"""

import contextlib
import json
import os
import sys

from accelerate.state import AcceleratorState, GradientState
from accelerate.utils import patch_environment
from transformers import Trainer, TrainerCallback, TrainingArguments

from emitted import AUTOCAST_DTYPE, check_deepspeed_config, run_test
from training import OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_deepspeed_run, check_run, zero_buckets


def emitted_args(case):
    return json.load(open(case.path("hf_training_args.json")))["training_args"]


def training_arguments(case, **run):
    """TrainingArguments from the emitted file, built in the case's folder.
    A file for a GPU (no use_cpu) is built with use_cpu=True, the one thing
    this machine cannot give: without a bf16 GPU TrainingArguments refuses
    bf16 otherwise. `run` adds arguments, or replaces emitted ones."""
    emitted = dict(emitted_args(case), **run)
    os.chdir(case.folder)
    machine = {} if "use_cpu" in emitted else {"use_cpu": True}
    return TrainingArguments(output_dir=os.path.join(case.folder, "hf_out"), report_to="none", **machine, **emitted)


def load(cases, failures):
    for case in cases:
        try:
            args = training_arguments(case)
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "TrainingArguments", e)
            continue
        effective = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
        failures.check(effective == case.global_batch, case,
                       f"effective global batch {args.per_device_train_batch_size} x {args.gradient_accumulation_steps}"
                       f" x {args.world_size} = {effective}, the plan's is {case.global_batch}")
        emitted = emitted_args(case)
        for_the_cpu = case.device == "cpu" and "deepspeed" not in emitted
        failures.check(emitted.get("use_cpu", False) == for_the_cpu, case,
                       f"use_cpu {emitted.get('use_cpu')} in a file for {'the CPU' if for_the_cpu else 'a GPU'}")
        failures.check(args.max_grad_norm == case.max_grad_norm, case,
                       f"max_grad_norm {args.max_grad_norm}: the plan clips at {case.max_grad_norm} (0: none)")
        failures.check(args.lr_scheduler_type == "constant", case,
                       f"lr_scheduler_type {args.lr_scheduler_type}: the measured learning rate is constant")
        failures.check(bool(args.deepspeed) == case.deepspeed, case, f"deepspeed {args.deepspeed}")
        if args.deepspeed:
            # transformers filled the DeepSpeed config from the arguments and
            # checked that the file's values agree ("auto" or equal).
            ds = args.hf_deepspeed_config.config
            failures.check(ds["train_batch_size"] == case.global_batch, case, f"deepspeed train_batch_size {ds}")
            check_final_deepspeed_config(case, failures)
    return len(cases)


def final_deepspeed_config(case, **override):
    """The DeepSpeed config the Trainer's Accelerator hands to
    deepspeed.initialize: after Trainer(...) (Accelerate's
    DeepSpeedPlugin.set_mixed_precision has added the Trainer's precision)."""
    with launched(case):
        args = training_arguments(case, **override)
        trainer = Trainer(model=CountingGPT(), args=args, train_dataset=TokenRule(case.global_batch))
        return dict(trainer.accelerator.state.deepspeed_plugin.deepspeed_config)


def check_final_deepspeed_config(case, failures):
    try:
        config = final_deepspeed_config(case)
    except Exception as e:  # any refusal is a writer bug
        failures.refused(case, "Trainer", e)
        return
    check_deepspeed_config(case, config, failures, "the Trainer")
    if case.precision in AUTOCAST_DTYPE:
        # The note: bf16 / fp16 = true would add DeepSpeed's casting section.
        switch = "bf16" if case.precision == "bf16" else "fp16"
        switched = final_deepspeed_config(case, **{switch: True})
        failures.check(switched.get(switch, {}).get("enabled") is True, case,
                       f"{switch}=True leaves the DeepSpeed config at {switched.get(switch)}: update the note")


class OptimizerSteps(TrainerCallback):
    def __init__(self, log):
        self.log = log

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.log.optimizer_step()


def train(cases, failures):
    for case in cases:
        with launched(case):
            train_one(case, failures)
    return len(cases)


@contextlib.contextmanager
def launched(case):
    """The environment the run's launcher gives: with ds_config.json, the one
    process `deepspeed train.py` (or torchrun) starts; else none, a plain
    `python train.py`. Accelerate's process-wide state is reset after."""
    deepspeed = "deepspeed" in emitted_args(case)
    launcher = dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=os.environ.get("OOMTUNE_TEST_PORT", "29519")) if deepspeed else {}
    try:
        with patch_environment(**launcher):
            yield
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()


def train_one(case, failures):
    args = training_arguments(case, max_steps=OPTIMIZER_STEPS, save_strategy="no", logging_strategy="no",
                              disable_tqdm=True, seed=0)
    model = CountingGPT()
    log = StepLog(model)
    trainer = Trainer(model=model, args=args, train_dataset=TokenRule(case.global_batch * OPTIMIZER_STEPS),
                      callbacks=[OptimizerSteps(log)])
    with zero_buckets() as buckets:
        trainer.train()
    print(f"hf: {case.name}: optimizer {type(trainer.optimizer).__name__}, device {args.device}, "
          f"distributed {args.parallel_mode}, learning rate {trainer.lr_scheduler.get_last_lr()}")
    check_run("hf", case, log, failures)
    # "constant": the default "linear" schedule would end at 0.
    failures.check(set(trainer.lr_scheduler.get_last_lr()) == {case.plan["optimizer"]["lr"]}, case,
                   f"learning rate {trainer.lr_scheduler.get_last_lr()} after training, the plan's is constant")
    if case.deepspeed:
        check_deepspeed_run("hf", case, model, buckets, failures)


def main(argv):
    return run_test("hf", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
