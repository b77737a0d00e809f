#include "recipes/deepspeed_sections.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "recipes/recipe_text.h"

namespace oomtune::deepspeed_sections {

// Note [ZeRO buckets]
// ~~~~~~~~~~~~~~~~~~~
// Rationale: under ZeRO-2 DeepSpeed copies each gradient into a contiguous
// bucket of reduce_bucket_size elements, one per communication dtype, which
// setup_buckets allocates on the device at every backward
// (deepspeed/runtime/zero/stage_1_and_2.py:3256-3280, DeepSpeed 0.19.8),
// whatever the model's size. The default is 5e8 elements
// (zero/config.py:113): 1.86 GiB in fp32 for a model of any size, which
// oomtune's own offload step (strategies/training_step.cpp) never holds.
// contiguous_gradients = false does not avoid it: offload turns it back on
// (stage_1_and_2.py:300).
//
// Approach: size the buckets so that together they hold at most the
// trainable parameters, the gradients the measured step held anyway.
// Under torch_autocast there are two buckets, one per communication dtype
// (autocast's for Linear and Conv weights, fp32 for the rest:
// torch_autocast.py init_autocast_params, stage_1_and_2.py:608-616), each
// with its own buffer of reduce_bucket_size elements; otherwise one. A
// gradient larger than the bucket bypasses it (stage_1_and_2.py:1443), so
// any size trains. allgather_bucket_size gets the same value, rounded down
// to a multiple of 2 as DeepSpeed asserts (stage_1_and_2.py:389-391); it
// allocates nothing on one GPU (runtime/utils.py all_gather_dp_groups
// returns for a world size of 1) but stays no larger than the model.
//
// Limitations: the count is the plan's [job] parameters; a plan written
// before that key leaves DeepSpeed's default, with unsized_buckets_note.
// Smaller buckets mean more, smaller copies to the host during backward,
// which on one GPU costs little.

bool has_optimizer_section(const Plan& plan) {
  if (plan.config.optimizer == OptimizerKind::kAdafactor) return false;
  return plan.config.optimizer != OptimizerKind::kAdamW8bit || plan.config.offload_optimizer;
}

std::optional<int64_t> bucket_elements(const Plan& plan) {
  if (!plan.config.offload_optimizer || !plan.parameter_count) return std::nullopt;
  const int64_t buckets = autocast_dtype(plan.config.precision).empty() ? 1 : 2;
  const int64_t elements = *plan.parameter_count / buckets;
  return std::max<int64_t>(2, elements - elements % 2);
}

Json zero_optimization(const Plan& plan) {
  Json zero{{"stage", recipe_text::zero_stage(plan.config)}};
  if (!plan.config.offload_optimizer) return zero;
  zero["offload_optimizer"] = {{"device", "cpu"}, {"pin_memory", true}};
  if (const std::optional<int64_t> elements = bucket_elements(plan)) {
    zero["reduce_bucket_size"] = *elements;
    zero["allgather_bucket_size"] = *elements;
  }
  return zero;
}

std::string autocast_dtype(Precision precision) {
  // torch dtype names, as DeepSpeed's DtypeEnum reads them (runtime/config.py:144-149).
  switch (precision) {
    case Precision::kBf16:
      return "bfloat16";
    case Precision::kFp16:
      return "float16";
    case Precision::kFp32:
    case Precision::kBf16Params:
      return "";
  }
  return "";
}

std::vector<std::pair<std::string, Json>> precision(const Plan& plan) {
  const Precision p = plan.config.precision;
  // torch_autocast: runtime/constants.py:175-191; fp16 is loss-scaled by
  // torch.amp.GradScaler (engine.py:666-672 without ZeRO,
  // zero/stage_1_and_2.py:608-612 with it), dynamically, as measured.
  if (const std::string dtype = autocast_dtype(p); !dtype.empty())
    return {{"torch_autocast", Json{{"enabled", true}, {"dtype", dtype}}}};
  if (p == Precision::kBf16Params) return {{"bf16", Json{{"enabled", true}}}};
  return {};
}

std::vector<std::pair<std::string, Json>> sgd_offload_entries(const Plan& plan) {
  if (plan.config.optimizer != OptimizerKind::kSgd || !plan.config.offload_optimizer) return {};
  return {{"zero_allow_untested_optimizer", true}, {"zero_force_ds_cpu_optimizer", false}};
}

std::string unsized_buckets_note(const Plan& plan) {
  if (!plan.config.offload_optimizer || plan.parameter_count) return "";
  return fmt::format(
      "the plan does not record its parameter count ([job] parameters; re-run autotune to get it), so "
      "zero_optimization leaves DeepSpeed's gradient bucket at its default of {} elements ({} in fp32), which "
      "ZeRO-2 allocates on the GPU at every backward and the measured peak does not contain: set "
      "\"reduce_bucket_size\" and \"allgather_bucket_size\" to the model's trainable parameter count (half of it "
      "under torch_autocast, which keeps two buckets)",
      kDeepSpeedDefaultBucket, format_bytes(kDeepSpeedDefaultBucket * 4));
}

std::string autocast_version_note(const Plan& plan) {
  const std::string dtype = autocast_dtype(plan.config.precision);
  if (dtype.empty()) return "";
  std::string note = fmt::format(
      "\"torch_autocast\" ({} autocast over fp32 weights and gradients, as measured) needs DeepSpeed 0.17.2 or "
      "later; earlier versions ignore the section and train in fp32",
      dtype);
  if (plan.config.precision == Precision::kFp16 && !plan.config.offload_optimizer)
    note += "; without ZeRO, torch_autocast's float16 loss scaling (torch.amp.GradScaler) needs 0.18.0";
  return note;
}

}  // namespace oomtune::deepspeed_sections
