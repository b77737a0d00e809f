"""DeepSpeed loads and runs what `oomtune emit` writes (ds_config.json).

Usage: deepspeed_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan,
       deepspeed.runtime.config.DeepSpeedConfig(ds_config) accepts the file
       at the world size the plan assumes (one GPU: no process group, so
       DeepSpeed takes world size 1), and its batch triple holds:
       train_batch_size = micro x accumulation x world = the plan's global
       batch, each as the plan says.
train: the engine (deepspeed.initialize) on DeepSpeed's CPU accelerator,
       one process with the gloo backend, trains the test GPT with the
       emitted ds_config.json (the plain plan, the offload one: ZeRO-2 with
       DeepSpeedCPUAdam, and Adafactor); the optimizer section of the file
       builds the optimizer, or, where the file has none (Adafactor), the
       note's client optimizer is passed to deepspeed.initialize. Samples
       per optimizer step = global batch; loss decreases.
"""

import json
import os
import sys

import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig

from emitted import run_test
from training import OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_run, script_optimizer


def load(cases, failures):
    for case in cases:
        config = json.load(open(case.path("ds_config.json")))
        try:
            ds = DeepSpeedConfig(config)
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "DeepSpeedConfig", e)
            continue
        failures.check(ds.world_size == 1, case, f"world size {ds.world_size}, the plan assumes 1")
        failures.check(ds.train_batch_size == ds.train_micro_batch_size_per_gpu * ds.gradient_accumulation_steps *
                       ds.world_size, case, "train_batch_size != micro x accumulation x world")
        failures.check((ds.train_batch_size, ds.train_micro_batch_size_per_gpu, ds.gradient_accumulation_steps) ==
                       (case.global_batch, case.micro_batch, case.accumulation_steps), case,
                       f"DeepSpeed reads batch {ds.train_batch_size} = {ds.train_micro_batch_size_per_gpu} x "
                       f"{ds.gradient_accumulation_steps}, the plan says {case.global_batch} = {case.micro_batch} x "
                       f"{case.accumulation_steps}")
        failures.check(ds.zero_optimization_stage == (2 if case.offload else 0), case,
                       f"ZeRO stage {ds.zero_optimization_stage}")
    return len(cases)


def train(cases, failures):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("OOMTUNE_TEST_PORT", "29517"), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    # The CPU accelerator's own backend is oneCCL (oneccl_bindings_for_pytorch,
    # not installed); one process needs no more than gloo.
    deepspeed.init_distributed(dist_backend="gloo")
    for case in cases:
        model = CountingGPT()
        with open(case.path("ds_config.json")) as f:
            has_optimizer = "optimizer" in json.load(f)
        # No optimizer section (8-bit AdamW, Adafactor): the note's client
        # optimizer, passed to deepspeed.initialize.
        client = {} if has_optimizer else {"optimizer": script_optimizer(case, model.parameters())}
        engine, optimizer, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                            config=case.path("ds_config.json"),
                                                            training_data=TokenRule(case.global_batch * OPTIMIZER_STEPS),
                                                            **client)
        print(f"deepspeed: {case.name}: engine on {engine.device}, optimizer {type(optimizer).__name__} "
              f"({type(engine.basic_optimizer).__name__}), ZeRO stage {engine.zero_optimization_stage()}")
        log = StepLog(model)
        for batch in loader:  # DeepSpeed's loader: batches of train_micro_batch_size_per_gpu
            loss = engine(**batch)["loss"]
            engine.backward(loss)
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if boundary:
                log.optimizer_step()
        failures.check(engine.global_steps == OPTIMIZER_STEPS, case, f"engine.global_steps {engine.global_steps}")
        check_run("deepspeed", case, log, failures)
    return len(cases)


def main(argv):
    return run_test("deepspeed", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
