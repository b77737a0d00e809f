"""DeepSpeed loads and runs what `oomtune emit` writes (ds_config.json).

Usage: deepspeed_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan,
       deepspeed.runtime.config.DeepSpeedConfig(ds_config) accepts the file
       at the world size the plan assumes (one GPU: no process group, so
       DeepSpeed takes world size 1), and its batch triple holds:
       train_batch_size = micro x accumulation x world = the plan's global
       batch, each as the plan says. DeepSpeed reads the plan's clipping and
       precision (torch_autocast for bf16/fp16 autocast, never the bf16/fp16
       modes that cast the weights; bf16 for bf16_params), and the ZeRO stage
       with buckets no larger than the model (emitted.check_deepspeed_config).
train: the engine (deepspeed.initialize) on DeepSpeed's CPU accelerator,
       one process with the gloo backend, trains the test GPT with the
       emitted ds_config.json (the plain plan, the offload ones: ZeRO-2 with
       DeepSpeedCPUAdam in fp32, bf16 and fp16 autocast; bf16_params; and
       Adafactor); the optimizer section of the file builds the optimizer,
       or, where the file has none (Adafactor), the note's client optimizer
       is passed to deepspeed.initialize. Samples per optimizer step = global
       batch; loss decreases; the parameters keep the plan's dtype (fp32
       under autocast) and ZeRO-2's gradient buckets hold at most the model.
"""

import json
import os
import sys

import deepspeed
from deepspeed.runtime.config import DeepSpeedConfig

from emitted import check_deepspeed_config, run_test
from training import (OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_deepspeed_run, check_run,
                      script_optimizer, zero_buckets)


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
        # As DeepSpeed parsed it, then the file's entries.
        failures.check(ds.gradient_clipping == case.max_grad_norm, case,
                       f"DeepSpeed reads gradient_clipping {ds.gradient_clipping}, the plan {case.max_grad_norm}")
        failures.check((ds.bfloat16_config.enabled, ds.float16_config.enabled, ds.torch_autocast_enabled) ==
                       (case.precision == "bf16_params", False, case.precision in ("bf16", "fp16")), case,
                       f"DeepSpeed reads bf16 {ds.bfloat16_config.enabled}, fp16 {ds.float16_config.enabled}, "
                       f"torch_autocast {ds.torch_autocast_enabled} ({ds.torch_autocast_dtype}) for {case.precision}")
        if case.offload and case.parameters:
            failures.check(ds.zero_config.reduce_bucket_size <= case.parameters, case,
                           f"DeepSpeed reads reduce_bucket_size {ds.zero_config.reduce_bucket_size}")
        check_deepspeed_config(case, config, failures, "ds_config.json")
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
        with zero_buckets() as buckets:
            engine, optimizer, loader, _ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=case.path("ds_config.json"),
                training_data=TokenRule(case.global_batch * OPTIMIZER_STEPS), **client)
            print(f"deepspeed: {case.name}: engine on {engine.device}, optimizer {type(optimizer).__name__} "
                  f"({type(engine.basic_optimizer).__name__}), ZeRO stage {engine.zero_optimization_stage()}, "
                  f"torch_autocast {engine.torch_autocast_enabled()} ({engine.torch_autocast_dtype()}), "
                  f"bf16 {engine.bfloat16_enabled()}, fp16 {engine.fp16_enabled()}")
            log = StepLog(model)
            for batch in loader:  # DeepSpeed's loader: batches of train_micro_batch_size_per_gpu
                loss = engine(**batch)["loss"]
                engine.backward(loss)
                boundary = engine.is_gradient_accumulation_boundary()
                engine.step()
                if boundary:
                    log.optimizer_step()
        failures.check(engine.global_steps == OPTIMIZER_STEPS, case, f"engine.global_steps {engine.global_steps}")
        failures.check(engine.gradient_clipping() == case.max_grad_norm, case,
                       f"the engine clips at {engine.gradient_clipping()}, the plan at {case.max_grad_norm}")
        check_run("deepspeed", case, log, failures)
        check_deepspeed_run("deepspeed", case, model, buckets, failures)
    return len(cases)


def main(argv):
    return run_test("deepspeed", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
