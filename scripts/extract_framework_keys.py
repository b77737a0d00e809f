#!/usr/bin/python3
"""Extract, from the training frameworks' own sources, the keys and values
their config files accept; writes tests/recipes/framework_keys.json, which
tests/recipes/framework_keys_test.py checks every file `oomtune emit` writes
against.

Usage:
  scripts/extract_framework_keys.py --deepspeed DIR --accelerate DIR \\
      --lightning DIR --bitsandbytes DIR [--transformers TRAINING_ARGS_PY] \\
      [--out tests/recipes/framework_keys.json]

Each DIR is a source checkout (its root); each is read with `ast`, never
imported, so no framework needs to be installed. Without --transformers the
"transformers" section of the existing --out file is kept as it is.

What is read, and why it is what the framework accepts:
- DeepSpeed: runtime/constants.py string constants (DeepSpeedConfig reads
  top-level keys by these names); the pydantic models DeepSpeedZeroConfig
  (runtime/zero/config.py), DeepSpeedZeroOffloadOptimizerConfig
  (runtime/zero/offload_config.py), DeepSpeedFP16Config/DeepSpeedBF16Config
  (runtime/precision_config.py): their field names and aliases, which is all
  they accept (DeepSpeedConfigModel sets extra="forbid"); the torch_autocast
  section's keys (constants.py TORCH_AUTOCAST_*, read by config.py
  get_torch_autocast_*) and its dtype names (DtypeEnum's strings, config.py);
  ZeroStageEnum and
  OffloadDeviceEnum values; activation_checkpointing/config.py's ACT_CHKPT_* keys;
  DEEPSPEED_OPTIMIZERS (runtime/config.py; any other "type" must name a
  torch.optim class, engine.py _configure_basic_optimizer); the keyword
  arguments of DeepSpeedCPUAdam and FusedAdam (ops/adam/).
- transformers: TrainingArguments' dataclass fields and OptimizerNames'
  values (training_args.py); Adafactor.__init__'s parameters
  (optimization.py, beside it), what the recipes pass it.
- Lightning: Trainer.__init__'s parameters (pytorch/trainer/trainer.py);
  _PRECISION_INPUT_STR (fabric/plugins/precision/precision.py); the names
  registered by register_strategies() (pytorch/strategies/*.py),
  DeepSpeedStrategy.__init__'s parameters (pytorch/strategies/deepspeed.py,
  for a strategy written as class and kwargs) and
  the accelerators' name() (pytorch/accelerators/*.py, what
  register_accelerators() registers), plus the strategy and
  accelerator defaults of Trainer.__init__ and "gpu", which
  accelerator_connector.py maps to cuda or mps.
- Accelerate: the fields of BaseConfig and ClusterConfig
  (commands/config/config_args.py); the `accelerate launch` options
  (commands/launch.py), since launch copies every deepspeed_config key onto
  its parsed arguments; DistributedType, ComputeEnvironment and
  PrecisionType values (utils/dataclasses.py).
- bitsandbytes: AdamW8bit.__init__'s parameters (bitsandbytes/optim/adamw.py).
"""

import argparse
import ast
import json
import os
import subprocess
import sys


def parse(path):
    with open(path, encoding="utf-8") as f:
        return ast.parse(f.read(), filename=path)


def find_class(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise SystemExit(f"extract_framework_keys: no class {name}")


def find_function(node, name):
    for child in ast.walk(node):
        if isinstance(child, ast.FunctionDef) and child.name == name:
            return child
    raise SystemExit(f"extract_framework_keys: no function {name}")


def string_constants(tree):
    """Values of module-level NAME = "string" assignments that could be keys
    (identifiers: not the *_FORMAT help texts)."""
    out = []
    for node in tree.body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str) and node.value.value.isidentifier()):
            out.append(node.value.value)
    return out


def class_fields(cls, aliases=False):
    """Annotated class-level fields (dataclass, pydantic), with pydantic aliases."""
    out = []
    for node in cls.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out.append(node.target.id)
            if aliases and isinstance(node.value, ast.Call):
                for kw in node.value.keywords:
                    if kw.arg == "alias" and isinstance(kw.value, ast.Constant):
                        out.append(kw.value.value)
    return out


def enum_values(cls, kind=str):
    return [node.value.value for node in cls.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, kind)]


def parameters(function):
    args = function.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    return [n for n in names if n != "self"]


def parameter_default(function, name):
    args = function.args
    positional = args.posonlyargs + args.args
    for arg, default in zip(positional[len(positional) - len(args.defaults):], args.defaults):
        if arg.arg == name and isinstance(default, ast.Constant):
            return default.value
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if arg.arg == name and isinstance(default, ast.Constant):
            return default.value
    raise SystemExit(f"extract_framework_keys: {function.name}() has no constant default for {name}")


def module_trees(folder):
    """The parsed .py files of folder, in name order."""
    for file in sorted(os.listdir(folder)):
        if file.endswith(".py"):
            yield parse(os.path.join(folder, file))


def registered_names(folder, function_name):
    """First string argument of every .register(...) call inside function_name."""
    out = []
    for tree in module_trees(folder):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == function_name:
                for call in ast.walk(node):
                    if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                            and call.func.attr == "register" and call.args
                            and isinstance(call.args[0], ast.Constant)):
                        out.append(call.args[0].value)
    return out


def assigned_value(tree, name):
    """The expression of the module-level assignment NAME = ..."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
    raise SystemExit(f"extract_framework_keys: no {name}")


def literal_strings(tree, name):
    """The strings of NAME = Literal["a", "b", ...]."""
    return [c.value for c in ast.walk(assigned_value(tree, name))
            if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def argparse_options(tree):
    """Long options of every add_argument(...) call, without the dashes."""
    out = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "add_argument":
            for arg in call.args:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                    out.append(arg.value[2:].replace("-", "_"))
    return out


def source_of(root, paths):
    """Where the lists come from: AT[framework] when given (--at), else the
    commit (and tag) when root is a git checkout, else the folder."""
    if root in AT:
        return {"at": AT[root], "files": paths}
    try:
        commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True,
                                check=True).stdout.strip()
        described = subprocess.run(["git", "-C", root, "describe", "--tags"], capture_output=True,
                                   text=True).stdout.strip()
        where = f"commit {commit}" + (f" ({described})" if described else "")
    except (OSError, subprocess.CalledProcessError):
        where = os.path.abspath(root)
    return {"at": where, "files": paths}


AT = {}  # source root -> what --at says of it


def accelerator_names(folder):
    """What name() returns in each accelerator class (register_accelerators
    registers cls.name())."""
    out = []
    for tree in module_trees(folder):
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name == "name":
                for ret in ast.walk(node):
                    if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Constant):
                        out.append(ret.value.value)
    return out


def unique(names):
    return sorted(set(names))


def deepspeed(root):
    rt = os.path.join(root, "deepspeed", "runtime")
    files = ["deepspeed/runtime/constants.py", "deepspeed/runtime/zero/config.py",
             "deepspeed/runtime/zero/offload_config.py", "deepspeed/runtime/precision_config.py",
             "deepspeed/runtime/activation_checkpointing/config.py", "deepspeed/runtime/config.py",
             "deepspeed/ops/adam/cpu_adam.py", "deepspeed/ops/adam/fused_adam.py"]
    zero_tree = parse(os.path.join(rt, "zero", "config.py"))
    offload_tree = parse(os.path.join(rt, "zero", "offload_config.py"))
    precision_tree = parse(os.path.join(rt, "precision_config.py"))
    act_tree = parse(os.path.join(rt, "activation_checkpointing", "config.py"))
    config_tree = parse(os.path.join(rt, "config.py"))
    # DEEPSPEED_OPTIMIZERS lists names of module constants (ADAM_OPTIMIZER, ...).
    constants = {t.id: n.value.value for n in config_tree.body if isinstance(n, ast.Assign)
                 for t in n.targets if isinstance(t, ast.Name) and isinstance(n.value, ast.Constant)}
    optimizers = [constants[e.id] for e in assigned_value(config_tree, "DEEPSPEED_OPTIMIZERS").elts]
    cpu_adam = find_function(find_class(parse(os.path.join(root, "deepspeed/ops/adam/cpu_adam.py")),
                                        "DeepSpeedCPUAdam"), "__init__")
    fused_adam = find_function(find_class(parse(os.path.join(root, "deepspeed/ops/adam/fused_adam.py")),
                                          "FusedAdam"), "__init__")
    act_keys = [n.value.value for n in act_tree.body if isinstance(n, ast.Assign)
                and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)
                and any(isinstance(t, ast.Name) and t.id.startswith("ACT_CHKPT_") and not t.id.endswith("_DEFAULT")
                        and t.id != "ACT_CHKPT_FORMAT" for t in n.targets)]
    autocast_keys = [n.value.value for n in parse(os.path.join(rt, "constants.py")).body
                     if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                     and isinstance(n.value.value, str)
                     and any(isinstance(t, ast.Name) and t.id.startswith("TORCH_AUTOCAST_")
                             and not t.id.endswith(("_DEFAULT", "_FORMAT")) for t in n.targets)]
    # DtypeEnum members are tuples: a torch dtype, then the names it reads.
    dtype_names = [e.value for member in find_class(config_tree, "DtypeEnum").body if isinstance(member, ast.Assign)
                   and isinstance(member.value, ast.Tuple) for e in member.value.elts
                   if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return {
        "source": source_of(root, files),
        # The sections zero/config.py and activation_checkpointing/config.py name.
        "top_level": unique(string_constants(parse(os.path.join(rt, "constants.py")))
                            + [v for v in string_constants(zero_tree) if v == "zero_optimization"]
                            + [v for v in string_constants(act_tree) if v == "activation_checkpointing"]),
        "zero_optimization": unique(class_fields(find_class(zero_tree, "DeepSpeedZeroConfig"), aliases=True)),
        "zero_stage": unique(enum_values(find_class(zero_tree, "ZeroStageEnum"), int)),
        "offload_optimizer": unique(class_fields(find_class(offload_tree, "DeepSpeedZeroOffloadOptimizerConfig"),
                                                 aliases=True)),
        "offload_device": unique(enum_values(find_class(offload_tree, "OffloadDeviceEnum"))),
        "fp16": unique(class_fields(find_class(precision_tree, "DeepSpeedFP16Config"), aliases=True)),
        "bf16": unique(class_fields(find_class(precision_tree, "DeepSpeedBF16Config"), aliases=True)),
        "activation_checkpointing": unique(act_keys),
        "torch_autocast": unique(autocast_keys),
        "torch_autocast_dtype": unique(dtype_names),
        "optimizer_types": unique(optimizers),
        "cpu_adam_kwargs": unique(parameters(cpu_adam)),
        "fused_adam_kwargs": unique(parameters(fused_adam)),
    }


def transformers(training_args_py):
    tree = parse(training_args_py)
    keys = {
        "source": source_of(os.path.dirname(training_args_py), ["src/transformers/training_args.py"]),
        "training_args": unique(class_fields(find_class(tree, "TrainingArguments"))),
        "optim": unique(enum_values(find_class(tree, "OptimizerNames"))),
    }
    # Adafactor's keyword arguments (the Lightning and Accelerate recipes
    # build transformers.optimization.Adafactor), from its module beside.
    optimization_py = os.path.join(os.path.dirname(training_args_py), "optimization.py")
    if os.path.isfile(optimization_py):
        init = find_function(find_class(parse(optimization_py), "Adafactor"), "__init__")
        keys["adafactor_source"] = source_of(os.path.dirname(training_args_py), ["src/transformers/optimization.py"])
        keys["adafactor_kwargs"] = unique(parameters(init))
    return keys


def lightning(root):
    pl = os.path.join(root, "src", "lightning", "pytorch")
    init = find_function(find_class(parse(os.path.join(pl, "trainer", "trainer.py")), "Trainer"), "__init__")
    connector = open(os.path.join(pl, "trainer", "connectors", "accelerator_connector.py"), encoding="utf-8").read()
    if '"gpu"' not in connector:
        raise SystemExit("extract_framework_keys: accelerator_connector.py no longer maps \"gpu\"")
    return {
        "source": source_of(root, ["src/lightning/pytorch/trainer/trainer.py",
                                   "src/lightning/fabric/plugins/precision/precision.py",
                                   "src/lightning/pytorch/strategies/*.py", "src/lightning/pytorch/accelerators/*.py",
                                   "src/lightning/pytorch/trainer/connectors/accelerator_connector.py"]),
        "trainer": unique(parameters(init)),
        "precision": unique(literal_strings(parse(os.path.join(root, "src", "lightning", "fabric", "plugins",
                                                              "precision", "precision.py")), "_PRECISION_INPUT_STR")),
        "strategy": unique(registered_names(os.path.join(pl, "strategies"), "register_strategies")
                           + [parameter_default(init, "strategy")]),
        "deepspeed_strategy_kwargs": unique(parameters(find_function(
            find_class(parse(os.path.join(pl, "strategies", "deepspeed.py")), "DeepSpeedStrategy"), "__init__"))),
        "accelerator": unique(accelerator_names(os.path.join(pl, "accelerators"))
                              + [parameter_default(init, "accelerator"), "gpu"]),
    }


def accelerate(root):
    pkg = os.path.join(root, "src", "accelerate")
    config_tree = parse(os.path.join(pkg, "commands", "config", "config_args.py"))
    dataclasses_tree = parse(os.path.join(pkg, "utils", "dataclasses.py"))
    return {
        "source": source_of(root, ["src/accelerate/commands/config/config_args.py",
                                   "src/accelerate/commands/launch.py", "src/accelerate/utils/dataclasses.py"]),
        "config": unique(class_fields(find_class(config_tree, "BaseConfig"))
                         + class_fields(find_class(config_tree, "ClusterConfig"))),
        "launch_options": unique(argparse_options(parse(os.path.join(pkg, "commands", "launch.py")))),
        "distributed_type": unique(enum_values(find_class(dataclasses_tree, "DistributedType"))),
        "compute_environment": unique(enum_values(find_class(dataclasses_tree, "ComputeEnvironment"))),
        "mixed_precision": unique(enum_values(find_class(dataclasses_tree, "PrecisionType"))),
    }


def bitsandbytes(root):
    init = find_function(find_class(parse(os.path.join(root, "bitsandbytes", "optim", "adamw.py")), "AdamW8bit"),
                         "__init__")
    return {"source": source_of(root, ["bitsandbytes/optim/adamw.py"]),
            "adamw8bit_kwargs": unique(parameters(init))}


def main(argv):
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepspeed", required=True)
    parser.add_argument("--accelerate", required=True)
    parser.add_argument("--lightning", required=True)
    parser.add_argument("--bitsandbytes", required=True)
    parser.add_argument("--transformers", help="path of src/transformers/training_args.py")
    parser.add_argument("--at", action="append", default=[], metavar="FRAMEWORK=TEXT",
                        help="where a source tree came from (e.g. deepspeed='deepspeedai/DeepSpeed commit ...'), "
                             "for a folder that is not a git checkout")
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "recipes", "framework_keys.json"))
    args = parser.parse_args(argv)
    for item in args.at:
        framework, _, text = item.partition("=")
        root = getattr(args, framework, None)
        if root is None or not text:
            raise SystemExit(f"extract_framework_keys: --at {item}: expected FRAMEWORK=TEXT for a given framework")
        AT[os.path.dirname(root) if framework == "transformers" else root] = text
    out = {}
    if args.transformers:
        out["transformers"] = transformers(args.transformers)
    else:
        try:
            with open(args.out, encoding="utf-8") as f:
                out["transformers"] = json.load(f)["transformers"]
        except (OSError, KeyError, ValueError) as e:
            raise SystemExit(f"extract_framework_keys: {args.out}: no transformers section to keep ({e}); "
                             "pass --transformers")
    out["deepspeed"] = deepspeed(args.deepspeed)
    out["lightning"] = lightning(args.lightning)
    out["accelerate"] = accelerate(args.accelerate)
    out["bitsandbytes"] = bitsandbytes(args.bitsandbytes)
    text = json.dumps(dict(sorted(out.items())), indent=1) + "\n"
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main(sys.argv[1:])
