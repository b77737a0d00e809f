"""Lightning loads and runs what `oomtune emit` writes (lightning_trainer.json).

Usage: lightning_test.py load|train OOMTUNE_EMIT WORK_DIR

load:  for every golden plan and every autotune test's plan,
       Trainer(**trainer) constructs with the emitted precision,
       accumulate_grad_batches and strategy (a DeepSpeed strategy name builds
       Lightning's DeepSpeedStrategy, its ZeRO stage and offload from the
       name) on the CPU accelerator: a file for a GPU ("accelerator": "gpu")
       is constructed with accelerator="cpu", the one thing this machine
       cannot give; DeepSpeedStrategy refuses to *run* on anything but CUDA
       (strategies/deepspeed.py setup_environment), which construction does
       not reach. The DataModule's batch_size x accumulate_grad_batches is
       the plan's global batch, and the optimizer class is built with its
       kwargs where its package is installed (torch, deepspeed; bitsandbytes
       is not: its kwargs are checked by recipes.framework_keys). For SGD
       under offload, the note's DeepSpeedStrategy(config={...}) built from
       ds_config.json's entries constructs too.
train: Trainer.fit trains the test GPT (a LightningModule whose
       configure_optimizers() builds the emitted class and kwargs, DataLoader
       batch_size from the file) for the plain plan on the CPU; samples per
       optimizer step = global batch; the loss decreases. Not the offload
       plan: Lightning's DeepSpeedStrategy refuses to run on the CPU.
"""

import importlib
import json
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DeepSpeedStrategy

from emitted import run_test
from training import OPTIMIZER_STEPS, CountingGPT, StepLog, TokenRule, check_run

PRECISION_PLUGINS = {  # Trainer precision -> the plugin class Lightning picks with the strategy
    ("32-true", False): "Precision", ("bf16-mixed", False): "MixedPrecision", ("16-mixed", False): "MixedPrecision",
    ("32-true", True): "DeepSpeedPrecision", ("bf16-mixed", True): "DeepSpeedPrecision",
    ("16-mixed", True): "DeepSpeedPrecision",
}


def optimizer_class(path):
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def load(cases, failures):
    for case in cases:
        emitted = json.load(open(case.path("lightning_trainer.json")))
        kwargs = dict(emitted["trainer"], accelerator="cpu", logger=False, enable_checkpointing=False,
                      default_root_dir=case.folder)
        try:
            trainer = pl.Trainer(**kwargs)
        except Exception as e:  # any refusal is a writer bug
            failures.refused(case, "Trainer", e)
            continue
        deepspeed = isinstance(trainer.strategy, DeepSpeedStrategy)
        failures.check(deepspeed == (emitted["trainer"]["strategy"] != "auto"), case, f"strategy {trainer.strategy}")
        if deepspeed:
            zero = trainer.strategy.config["zero_optimization"]
            failures.check(zero["stage"] == (2 if case.offload else 1), case, f"ZeRO {zero}")
            failures.check(("offload_optimizer" in zero) == case.offload, case, f"offload in {zero}")
        plugin = type(trainer.precision_plugin).__name__
        expected = PRECISION_PLUGINS[(emitted["trainer"]["precision"], deepspeed)]
        failures.check(plugin == expected, case, f"precision plugin {plugin}, expected {expected}")
        failures.check(trainer.accumulate_grad_batches == case.accumulation_steps, case,
                       f"accumulate_grad_batches {trainer.accumulate_grad_batches}")
        batch = emitted["datamodule"]["batch_size"] * trainer.accumulate_grad_batches * trainer.world_size
        failures.check(batch == case.global_batch, case, f"global batch {batch}, the plan's is {case.global_batch}")
        if case.offload and case.optimizer == "sgd":
            check_sgd_offload_strategy(case, kwargs, failures)
        if not emitted["optimizer"]["class"].startswith("bitsandbytes."):
            try:
                optimizer_class(emitted["optimizer"]["class"])(CountingGPT().parameters(), **emitted["optimizer"]["kwargs"])
            except Exception as e:
                failures.refused(case, emitted["optimizer"]["class"], e)
    return len(cases)


def check_sgd_offload_strategy(case, kwargs, failures):
    """SGD under offload: the note's DeepSpeedStrategy(config={...}) with the
    zero_optimization, zero_allow_untested_optimizer and
    zero_force_ds_cpu_optimizer entries of ds_config.json constructs, and
    keeps them (the registered name cannot say the last)."""
    ds = json.load(open(case.path("ds_config.json")))
    config = {key: ds[key] for key in ("zero_optimization", "zero_allow_untested_optimizer",
                                        "zero_force_ds_cpu_optimizer")}
    try:
        trainer = pl.Trainer(**dict(kwargs, strategy=DeepSpeedStrategy(config=config)))
    except Exception as e:
        failures.refused(case, "DeepSpeedStrategy(config=...) of the SGD note", e)
        return
    kept = trainer.strategy.config
    print(f"lightning: {case.name}: the SGD note's DeepSpeedStrategy(config=...) constructs: {kept}")
    failures.check(kept.get("zero_force_ds_cpu_optimizer") is False and kept.get("zero_allow_untested_optimizer"),
                   case, f"DeepSpeedStrategy config {kept}")


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


def main(argv):
    # "RuntimeError: The DeepSpeed strategy is only supported on CUDA GPUs but
    # `CPUAccelerator` is used." (DeepSpeedStrategy.setup_environment): the
    # training run takes the plain plan only.
    return run_test("lightning", argv, load, train, runs_on_the_cpu=lambda case: not case.offload)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
