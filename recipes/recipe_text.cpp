#include "recipes/recipe_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"

namespace oomtune::recipe_text {

std::string describe_checkpoint(const CheckpointPlan& plan) {
  switch (plan.mode) {
    case CheckpointPlan::Mode::kNone:
      return "no blocks";
    case CheckpointPlan::Mode::kAll:
      return "every detected block";
    case CheckpointPlan::Mode::kEveryK:
      return fmt::format("blocks 0, {}, {}, ... of the detected blocks", plan.every_k, 2 * plan.every_k);
    case CheckpointPlan::Mode::kFirstN:
      return plan.first_n == 1 ? "the first detected block" : fmt::format("the first {} detected blocks", plan.first_n);
    case CheckpointPlan::Mode::kPaths:
      return fmt::format("the submodule{} {}", plan.paths.size() == 1 ? "" : "s", fmt::join(plan.paths, ", "));
  }
  return "?";
}

std::string number(double value) { return fmt::format("{}", value); }

std::string optimizer_class(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
      return "torch.optim.AdamW";
    case OptimizerKind::kAdamW8bit:
      return "bitsandbytes.optim.AdamW8bit";
    case OptimizerKind::kSgd:
      return "torch.optim.SGD";
    case OptimizerKind::kAdafactor:
      return "transformers.optimization.Adafactor";
  }
  return "?";
}

std::pair<std::string, std::string> implementation_keyword(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  if (c.offload_optimizer || (c.optimizer != OptimizerKind::kAdamW && c.optimizer != OptimizerKind::kSgd)) return {};
  switch (plan.optimizer.implementation) {
    case OptimizerImplementation::kForeach:
      return {};
    case OptimizerImplementation::kFused:
      return {"fused", "True"};
    case OptimizerImplementation::kSingleTensor:
      return {"foreach", "False"};
  }
  return {};
}

std::string implementation_note(const Plan& plan, const std::string& what, const std::string& how) {
  if (implementation_keyword(plan).first.empty()) return "";
  return fmt::format(
      "{} runs torch.optim's default implementation (foreach on CUDA), but the plan measured "
      "implementation = \"{}\" (its optimizer step's temporaries differ): build optimizer = {} and {}",
      what, to_string(plan.optimizer.implementation), optimizer_call(plan, "model.parameters()"), how);
}

std::string optimizer_call(const Plan& plan, const std::string& params, const std::string& python_class) {
  const OptimizerHyperParameters& o = plan.optimizer;
  const std::string cls = python_class.empty() ? optimizer_class(plan.config.optimizer) : python_class;
  // fused=True / foreach=False, for a torch.optim class only.
  std::string implementation;
  if (const auto [key, value] = implementation_keyword(plan); !key.empty() && cls.rfind("torch.optim.", 0) == 0)
    implementation = fmt::format(", {}={}", key, value);
  if (plan.config.optimizer == OptimizerKind::kSgd)
    return fmt::format("{}({}, lr={}, momentum={}, weight_decay={}{})", cls, params, number(o.lr), number(o.momentum),
                       number(o.weight_decay), implementation);
  // As TrainingArguments(optim="adafactor") builds it (transformers/
  // trainer.py) and oomtune measured it (strategies/adafactor.h).
  if (plan.config.optimizer == OptimizerKind::kAdafactor)
    return fmt::format(
        "{}({}, lr={}, scale_parameter=False, relative_step=False, warmup_init=False, "
        "weight_decay={})",
        cls, params, number(o.lr), number(o.weight_decay));
  return fmt::format("{}({}, lr={}, betas=({}, {}), eps={}, weight_decay={}{})", cls, params, number(o.lr),
                     number(o.beta1), number(o.beta2), number(o.eps), number(o.weight_decay), implementation);
}

int zero_stage(const TrainingConfig& config) { return config.offload_optimizer ? 2 : 0; }

bool uses_deepspeed(const TrainingConfig& config) {
  return config.offload_optimizer || config.precision == Precision::kBf16Params;
}

std::string deepspeed_needs_gpu_note(const TrainingConfig& config) {
  return fmt::format(
      "{} through DeepSpeed, which trains on a GPU, so this file targets one although the plan was measured on "
      "the CPU (device = \"cpu\"): its memory numbers are host memory; re-run autotune with device = \"cuda\" "
      "before trusting them on a GPU",
      config.offload_optimizer ? "optimizer offload runs" : "bf16 parameters with fp32 master weights run");
}

std::string bf16_params_note(const std::string& how) {
  return "precision bf16_params (bf16 weights and gradients, fp32 master weights kept by the optimizer; oomtune "
         "measures it when bf16 autocast fails for the model) is DeepSpeed's bf16 mode: " +
         how;
}

std::string adafactor_note() {
  return "transformers.optimization.Adafactor (the transformers package) with scale_parameter=False, "
         "relative_step=False: the learning rate is used as given, as TrainingArguments(optim=\"adafactor\") does "
         "and oomtune measured; it keeps no momentum and a factored second moment, so compare the loss curve "
         "with AdamW's before relying on it";
}

std::string adamw8bit_offload_note() {
  return "8-bit AdamW with optimizer offload: DeepSpeed offloads only its own CPU optimizers (DeepSpeedCPUAdam, "
         "fp32 states in host memory) and bitsandbytes' 8-bit states cannot run on the host, so this file asks "
         "for AdamW instead: the GPU still holds no optimizer state, but the host holds fp32 states (8 bytes "
         "per parameter, not about 2)";
}

std::string offload_host_note(const Plan& plan) {
  const TrainingConfig& c = plan.config;
  if (!c.offload_optimizer) return "";
  // 8-bit AdamW offloads as AdamW (adamw8bit_offload_note).
  const int64_t per_parameter = offload_host_bytes_per_parameter(c.optimizer, plan.optimizer.momentum > 0);
  std::string note = fmt::format(
      "optimizer offload keeps the fp32 parameters, their gradients and the optimizer state in pinned host memory, "
      "{} bytes per trainable parameter",
      per_parameter);
  if (plan.parameter_count)
    note += fmt::format(
        " ({} for {} parameters; DeepSpeed's estimate_zero2_model_states_mem_needs asks 1.5 times "
        "that)",
        format_bytes(per_parameter * *plan.parameter_count), *plan.parameter_count);
  if (plan.measured_host_peak_bytes)
    note +=
        fmt::format("; the verified run held {} on the host at its peak", format_bytes(*plan.measured_host_peak_bytes));
  return note + ": the training process needs that much free host RAM, beside the data loader's";
}

std::string batch_note(const Plan& plan, const std::string& where) {
  return fmt::format(
      "{} takes batch_size={} (the micro-batch): micro-batch {} x {} accumulation steps = global "
      "batch {}, as measured",
      where, plan.config.micro_batch, plan.config.micro_batch, plan.config.accumulation_steps, plan.global_batch);
}

std::string trainable_note(const Plan& plan) {
  const ParameterSelection& t = plan.trainable;
  if (!t.freezes()) return "";
  std::vector<std::string> quoted;
  for (const std::string& glob : t.globs) quoted.push_back(fmt::format("\"{}\"", glob));
  const std::string which =
      t.rule == ParameterSelection::Rule::kTrainable
          ? fmt::format("only the parameters matching trainable = [{}]", fmt::join(quoted, ", "))
          : fmt::format("every parameter but those matching frozen = [{}]", fmt::join(quoted, ", "));
  return fmt::format(
      "{} were trained (names as the TorchScript module lists them; the others frozen: no gradient, no optimizer "
      "state{}): this config freezes nothing, so freeze the same set in your script (PEFT's LoraConfig, or "
      "requires_grad_(False) before the optimizer is built) or the measured memory does not hold",
      which, t.frozen_bf16 ? ", stored as bf16" : "");
}

}  // namespace oomtune::recipe_text
