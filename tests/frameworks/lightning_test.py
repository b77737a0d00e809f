"""Lightning loads and runs what `oomtune emit` writes (lightning_trainer.json).

Usage: lightning_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan,
       Trainer(**trainer) constructs with the emitted precision,
       accumulate_grad_batches and strategy (under DeepSpeed the file's
       class and kwargs build DeepSpeedStrategy, as its note says; as they
       stand Trainer refuses them) on the CPU accelerator: a file for a GPU
       ("accelerator": "gpu") is constructed with accelerator="cpu", the one
       thing this machine cannot give; DeepSpeedStrategy refuses to *run* on
       anything but CUDA (strategies/deepspeed.py setup_environment), which
       construction does not reach. The DataModule's batch_size x
       accumulate_grad_batches is the plan's global batch, and the optimizer
       class is built with its kwargs where its package is installed (torch,
       deepspeed; bitsandbytes is not: its kwargs are checked by
       recipes.framework_keys). Under DeepSpeed, the config the strategy
       hands to deepspeed.initialize once Lightning has added its precision
       (fabric/strategies/deepspeed.py _format_precision_config) asks for no
       clipping, the plan's precision and ZeRO stage (0 for bf16_params, not
       "deepspeed_stage_1"'s 1) and buckets no larger than the model
       (emitted.check_deepspeed_config); for autocast, "bf16-mixed" /
       "16-mixed" would add DeepSpeed's casting section, as the note says.
train: Trainer.fit trains the test GPT (a LightningModule whose
       configure_optimizers() builds the emitted class and kwargs, DataLoader
       batch_size from the file) for the plain plans on the CPU; samples per
       optimizer step = global batch; the loss decreases. Lightning's
       DeepSpeedStrategy refuses to run on the CPU, so for the DeepSpeed
       plans the engine is made from the strategy's config as the strategy
       makes it and trained (train_as_the_strategy).
"""

import copy

import importlib
import json
import os
import sys

import lightning.pytorch as pl
import torch
from lightning.fabric.strategies.deepspeed import _format_precision_config
from lightning.pytorch.strategies import DeepSpeedStrategy

from emitted import AUTOCAST_DTYPE, check_deepspeed_config, run_test
from training import OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_run

PRECISION_PLUGINS = {  # Trainer precision -> the plugin class Lightning picks with the strategy
    ("32-true", False): "Precision", ("bf16-mixed", False): "MixedPrecision", ("16-mixed", False): "MixedPrecision",
    ("32-true", True): "DeepSpeedPrecision", ("bf16-mixed", True): "DeepSpeedPrecision",
    ("16-mixed", True): "DeepSpeedPrecision",
}


def optimizer_class(path):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def trainer_kwargs(case, emitted):
    """The Trainer's keyword arguments as the file's note builds them: a
    strategy given as class and kwargs (DeepSpeedStrategy) is built."""
    kwargs = dict(emitted["trainer"])
    if isinstance(kwargs.get("strategy"), dict):
        kwargs["strategy"] = optimizer_class(kwargs["strategy"]["class"])(**kwargs["strategy"]["kwargs"])
    return kwargs


def load(cases, failures):
    for case in cases:
        emitted = json.load(open(case.path("lightning_trainer.json")))
        machine = dict(accelerator="cpu", logger=False, enable_checkpointing=False, default_root_dir=case.folder)
        try:
            trainer = pl.Trainer(**dict(trainer_kwargs(case, emitted), **machine))
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "Trainer", e)
            continue
        deepspeed = isinstance(trainer.strategy, DeepSpeedStrategy)
        failures.check(deepspeed == case.deepspeed, case, f"strategy {trainer.strategy}")
        if deepspeed:
            check_deepspeed_strategy(case, emitted, trainer, machine, failures)
        plugin = type(trainer.precision_plugin).__name__
        expected = PRECISION_PLUGINS[(emitted["trainer"]["precision"], deepspeed)]
        failures.check(plugin == expected, case, f"precision plugin {plugin}, expected {expected}")
        failures.check(trainer.accumulate_grad_batches == case.accumulation_steps, case,
                       f"accumulate_grad_batches {trainer.accumulate_grad_batches}")
        if not deepspeed:  # under DeepSpeed the strategy config's gradient_clipping (check_deepspeed_strategy)
            failures.check(trainer.gradient_clip_val == (case.max_grad_norm or None) and
                           (not case.max_grad_norm or trainer.gradient_clip_algorithm == "norm"), case,
                           f"gradient_clip_val {trainer.gradient_clip_val} ({trainer.gradient_clip_algorithm}), "
                           f"the plan clips at {case.max_grad_norm}")
        batch = emitted["datamodule"]["batch_size"] * trainer.accumulate_grad_batches * trainer.world_size
        failures.check(batch == case.global_batch, case, f"global batch {batch}, the plan's is {case.global_batch}")
        if not emitted["optimizer"]["class"].startswith("bitsandbytes."):
            try:
                optimizer_class(emitted["optimizer"]["class"])(CountingGPT().parameters(), **emitted["optimizer"]["kwargs"])
            except Exception as e:
                failures.refused(case, emitted["optimizer"]["class"], e)
    return len(cases)


def final_config(strategy, precision):
    """The strategy's DeepSpeed config once Lightning has added the
    precision and, where absent, the clipping of a Trainer without
    gradient_clip_val (DeepSpeedStrategy._format_config; not the batch keys,
    which need a LightningModule)."""
    config = copy.deepcopy(strategy.config)
    config.setdefault("gradient_clipping", 0.0)
    _format_precision_config(config=config, precision=precision, loss_scale=strategy.loss_scale,
                             loss_scale_window=strategy.loss_scale_window, min_loss_scale=strategy.min_loss_scale,
                             initial_scale_power=strategy.initial_scale_power, hysteresis=strategy.hysteresis)
    return config


def check_deepspeed_strategy(case, emitted, trainer, machine, failures):
    """The DeepSpeedStrategy the file's note builds, and the config it will
    hand to deepspeed.initialize; the note's claims."""
    strategy = trainer.strategy
    print(f"lightning: {case.name}: DeepSpeedStrategy config {strategy.config}, precision "
          f"{trainer.precision_plugin.precision}")
    failures.check("gradient_accumulation_steps" not in strategy.config and "optimizer" not in strategy.config, case,
                   f"DeepSpeedStrategy config {strategy.config}: Lightning refuses the accumulation, and "
                   "configure_optimizers() builds the optimizer")
    config = final_config(strategy, trainer.precision_plugin.precision)
    check_deepspeed_config(case, config, failures, "DeepSpeedStrategy")
    if case.offload and case.optimizer == "sgd":
        failures.check(config.get("zero_force_ds_cpu_optimizer") is False
                       and config.get("zero_allow_untested_optimizer"), case,
                       f"SGD under offload: DeepSpeedStrategy config {config}")
    if case.precision in AUTOCAST_DTYPE:
        # The note: "bf16-mixed" / "16-mixed" would add DeepSpeed's casting section.
        mixed, section = ("bf16-mixed", "bf16") if case.precision == "bf16" else ("16-mixed", "fp16")
        switched = final_config(strategy, mixed)
        failures.check(switched.get(section, {}).get("enabled") is True, case,
                       f"precision {mixed} leaves the DeepSpeed config at {switched.get(section)}: update the note")
    try:  # The note: Trainer refuses the class and kwargs as they stand.
        pl.Trainer(**dict(emitted["trainer"], **machine))
        failures.check(False, case, "Trainer took the strategy's class and kwargs as they stand: update the note")
    except Exception:
        pass


class Module(pl.LightningModule):
    def __init__(self, optimizer):
        super().__init__()
        self.model = CountingGPT()
        self.optimizer = optimizer
        self.log_steps = StepLog(self.model)

    def training_step(self, batch, batch_idx):
        return self.model(**batch)["loss"]

    def configure_optimizers(self):
        return optimizer_class(self.optimizer["class"])(self.parameters(), **self.optimizer["kwargs"])

    def optimizer_step(self, *args, **kwargs):
        super().optimizer_step(*args, **kwargs)
        self.log_steps.optimizer_step()


def train(cases, failures):
    for case in cases:
        emitted = json.load(open(case.path("lightning_trainer.json")))
        if case.deepspeed:
            train_as_the_strategy(case, emitted, failures)
            continue
        module = Module(emitted["optimizer"])
        data = torch.utils.data.DataLoader(TokenRule(case.global_batch * OPTIMIZER_STEPS),
                                           batch_size=emitted["datamodule"]["batch_size"], shuffle=True)
        trainer = pl.Trainer(**emitted["trainer"], max_steps=OPTIMIZER_STEPS, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, default_root_dir=case.folder)
        trainer.fit(module, data)
        print(f"lightning: {case.name}: accelerator {type(trainer.accelerator).__name__}, "
              f"precision {type(trainer.precision_plugin).__name__}")
        check_run("lightning", case, module.log_steps, failures)
    return len(cases)


def train_as_the_strategy(case, emitted, failures):
    """A DeepSpeed plan: Lightning's DeepSpeedStrategy refuses to run on the
    CPU ("The DeepSpeed strategy is only supported on CUDA GPUs",
    setup_environment), so the engine is made as the strategy makes it
    (strategies/deepspeed.py _initialize_deepspeed_train:
    deepspeed.initialize with its formatted config and the optimizer
    configure_optimizers() returns), on DeepSpeed's CPU accelerator, and
    trained: the parameters keep the plan's dtype, ZeRO-2's buckets hold at
    most the model, the plan's clipping."""
    import deepspeed
    from training import check_deepspeed_run, zero_buckets

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("OOMTUNE_TEST_PORT", "29520"), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")
    trainer = pl.Trainer(**dict(trainer_kwargs(case, emitted), accelerator="cpu", logger=False,
                                enable_checkpointing=False, default_root_dir=case.folder))
    config = final_config(trainer.strategy, trainer.precision_plugin.precision)
    # _format_batch_size_and_grad_accum_config, with the DataLoader's batch size.
    config.update(gradient_accumulation_steps=trainer.accumulate_grad_batches,
                  train_micro_batch_size_per_gpu=emitted["datamodule"]["batch_size"])
    module = Module(emitted["optimizer"])
    with zero_buckets() as buckets:
        engine, _, loader, _ = deepspeed.initialize(model=module.model, optimizer=module.configure_optimizers(),
                                                    config=config,
                                                    training_data=TokenRule(case.global_batch * OPTIMIZER_STEPS))
        for batch in loader:
            engine.backward(engine(**batch)["loss"])
            boundary = engine.is_gradient_accumulation_boundary()
            engine.step()
            if boundary:
                module.log_steps.optimizer_step()
    print(f"lightning: {case.name}: engine from DeepSpeedStrategy's config, torch_autocast "
          f"{engine.torch_autocast_enabled()} ({engine.torch_autocast_dtype()}), bf16 {engine.bfloat16_enabled()}, "
          f"fp16 {engine.fp16_enabled()}, ZeRO stage {engine.zero_optimization_stage()}")
    failures.check(engine.gradient_clipping() == case.max_grad_norm, case,
                       f"the engine clips at {engine.gradient_clipping()}, the plan at {case.max_grad_norm}")
    check_run("lightning (as DeepSpeedStrategy)", case, module.log_steps, failures)
    check_deepspeed_run("lightning", case, module.model, buckets, failures)


def main(argv):
    return run_test("lightning", argv, load, train)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
