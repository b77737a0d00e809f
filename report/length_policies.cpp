#include "report/length_policies.h"

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "common/json_text.h"

namespace oomtune {
namespace {

// Reserved when step `n` (1-based) ended, or when the run's last step ended
// for a shorter run.
int64_t reserved_after(const allocsim::LengthRun& run, std::size_t n) {
  if (run.steps.empty()) return 0;
  return run.steps[std::min(n, run.steps.size()) - 1].reserved_bytes;
}

// The steps after which reserved is shown: 1, 10 and the last.
std::vector<std::size_t> checkpoints(std::size_t steps) {
  std::vector<std::size_t> at = {1};
  if (steps > 10) at.push_back(10);
  if (steps > 1) at.push_back(steps);
  return at;
}

}  // namespace

LengthPolicies replay_length_policies(const allocsim::LengthModel& step, const std::vector<int64_t>& persistent_bytes,
                                      const LengthDistribution& lengths, const std::string& description,
                                      std::uint64_t seed, int64_t steps, int64_t micro_batch,
                                      std::optional<int64_t> budget_bytes) {
  if (steps < 1) throw InputError(fmt::format("length replay: {} steps (at least 1)", steps));
  LengthPolicies p;
  p.distribution = description;
  p.seed = seed;
  p.steps = steps;
  p.micro_batch = micro_batch;
  p.budget_bytes = budget_bytes;
  allocsim::SimOptions options;
  options.budget_bytes = budget_bytes.value_or(0);
  p.policies =
      allocsim::compare_length_policies(step, persistent_bytes, draw_lengths(lengths, steps, seed), options,
                                        std::vector<int64_t>(kPaddingMultiples.begin(), kPaddingMultiples.end()));
  const allocsim::LengthPolicy& best = allocsim::recommended_policy(p.policies);
  p.recommended = static_cast<std::size_t>(&best - p.policies.data());
  return p;
}

std::string policy_change(const allocsim::LengthPolicy& policy) {
  if (policy.expandable_segments) return "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True";
  switch (policy.bucketing.kind) {
    case allocsim::Bucketing::Kind::kNone:
      return "nothing (lengths as they come)";
    case allocsim::Bucketing::Kind::kMultiple:
      return fmt::format(
          "pad each batch to a multiple of {} tokens (DataCollatorWithPadding(..., pad_to_multiple_of={}))",
          policy.bucketing.multiple, policy.bucketing.multiple);
    case allocsim::Bucketing::Kind::kPowerOfTwo:
      return "pad each batch to the next power of two";
  }
  return "?";
}

std::string render_length_policies_text(const LengthPolicies& p) {
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line(fmt::format("lengths   {}, seed {}: {} steps at micro-batch {} replayed through the caching allocator{}",
                   p.distribution, p.seed, p.steps, p.micro_batch,
                   p.budget_bytes ? fmt::format(" (budget {})", format_bytes(*p.budget_bytes)) : ""));
  const std::vector<std::size_t> at = checkpoints(static_cast<std::size_t>(p.steps));
  std::vector<std::string> after;
  for (std::size_t n : at) after.push_back(std::to_string(n));
  line(fmt::format("          {:<28} {:>13} {:>12} {:>9} {:>11} {:>7} {:>8}  reserved after {} steps", "policy",
                   "peak reserved", "peak alloc", "res/alloc", "cudaMallocs", "retries", "padding",
                   fmt::join(after, " / ")));
  for (std::size_t i = 0; i < p.policies.size(); ++i) {
    const allocsim::LengthPolicy& policy = p.policies[i];
    const allocsim::LengthRun& run = policy.run;
    std::vector<std::string> reserved;
    for (std::size_t n : at) reserved.push_back(format_bytes(reserved_after(run, n)));
    line(fmt::format("          {:<28} {:>13} {:>12} {:>8.3f}x {:>11} {:>7} {:>+7.1f}%  {}{}", policy.name,
                     format_bytes(run.totals.peak_reserved_bytes), format_bytes(run.totals.peak_allocated_bytes),
                     run.reserved_over_allocated(), run.totals.num_device_alloc, run.totals.num_alloc_retries,
                     100.0 * (policy.padded_tokens_ratio - 1.0), fmt::join(reserved, " / "),
                     run.totals.num_ooms > 0 ? "  OUT OF MEMORY" : ""));
  }
  const allocsim::LengthPolicy& best = p.policies.at(p.recommended);
  line(fmt::format("          recommended: {}: {} ({} peak reserved)", best.name, policy_change(best),
                   format_bytes(best.run.totals.peak_reserved_bytes)));
  return out;
}

nlohmann::json length_policies_json(const LengthPolicies& p) {
  nlohmann::json policies = nlohmann::json::array();
  for (const allocsim::LengthPolicy& policy : p.policies) {
    const allocsim::LengthRun& run = policy.run;
    nlohmann::json reserved = nlohmann::json::array();
    for (const allocsim::LengthStep& s : run.steps) reserved.push_back(s.reserved_bytes);
    policies.push_back({{"name", policy.name},
                        {"change", policy_change(policy)},
                        {"expandable_segments", policy.expandable_segments},
                        {"pad_multiple", policy.bucketing.kind == allocsim::Bucketing::Kind::kMultiple
                                             ? nlohmann::json(policy.bucketing.multiple)
                                             : nlohmann::json(nullptr)},
                        {"pad_power_of_two", policy.bucketing.kind == allocsim::Bucketing::Kind::kPowerOfTwo},
                        {"peak_reserved_bytes", run.totals.peak_reserved_bytes},
                        {"peak_allocated_bytes", run.totals.peak_allocated_bytes},
                        {"reserved_over_allocated", run.reserved_over_allocated()},
                        {"cuda_mallocs", run.totals.num_device_alloc},
                        {"alloc_retries", run.totals.num_alloc_retries},
                        {"ooms", run.totals.num_ooms},
                        {"padded_tokens_ratio", policy.padded_tokens_ratio},
                        {"reserved_bytes_after_each_step", reserved}});
  }
  return {{"distribution", p.distribution},
          {"seed", p.seed},
          {"steps", p.steps},
          {"micro_batch", p.micro_batch},
          {"budget_bytes", json_or_null(p.budget_bytes)},
          {"policies", policies},
          {"recommended", p.policies.at(p.recommended).name}};
}

}  // namespace oomtune
