#include "probes/probe_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/error.h"

namespace oomtune {
namespace {

const std::array<std::pair<TrialOutcome, const char*>, 5> kOutcomeNames = {{
    {TrialOutcome::kOk, "ok"},
    {TrialOutcome::kOutOfMemory, "out_of_memory"},
    {TrialOutcome::kCrashed, "crashed"},
    {TrialOutcome::kTimeout, "timeout"},
    {TrialOutcome::kError, "error"},
}};

TrialOutcome outcome_from_string(const std::string& text) {
  for (const auto& [outcome, name] : kOutcomeNames)
    if (text == name) return outcome;
  throw InputError(fmt::format("probe report: unknown outcome '{}'", text));
}

// The phase named `name` in the record's `key`; InputError for any other text.
Phase phase_named(const std::string& name, const char* key) {
  const std::optional<Phase> phase = phase_from_name(name);
  if (!phase) throw InputError(fmt::format("probe report: unknown {} '{}'", key, name));
  return *phase;
}

nlohmann::json phase_json(const PhaseMemory& p) {
  return {{"start_bytes", p.start_bytes},
          {"peak_bytes", p.peak_bytes},
          {"end_bytes", p.end_bytes},
          {"allocations", p.allocations},
          {"allocated_bytes", p.allocated_bytes},
          {"host_peak_bytes", p.host_peak_bytes},
          {"kernel_scratch_peak_bytes", p.kernel_scratch_peak_bytes},
          {"reserved_peak_bytes", p.reserved_peak_bytes}};
}

// [[gradient_bytes, live_bytes, accumulating_bytes], ...]: a few hundred
// for a 7B model.
nlohmann::json gradient_levels_json(const std::vector<GradientLevel>& levels) {
  nlohmann::json j = nlohmann::json::array();
  for (const GradientLevel& level : levels)
    j.push_back({level.gradient_bytes, level.live_bytes, level.accumulating_bytes});
  return j;
}

PhaseMemory phase_from_json(const nlohmann::json& j) {
  PhaseMemory p;
  p.start_bytes = j.at("start_bytes").get<int64_t>();
  p.peak_bytes = j.at("peak_bytes").get<int64_t>();
  p.end_bytes = j.at("end_bytes").get<int64_t>();
  p.allocations = j.at("allocations").get<int64_t>();
  p.allocated_bytes = j.at("allocated_bytes").get<int64_t>();
  p.host_peak_bytes = j.at("host_peak_bytes").get<int64_t>();
  p.kernel_scratch_peak_bytes = j.value("kernel_scratch_peak_bytes", int64_t{0});
  p.reserved_peak_bytes = j.value("reserved_peak_bytes", int64_t{0});
  return p;
}

}  // namespace

std::string to_string(TrialOutcome outcome) {
  for (const auto& [value, name] : kOutcomeNames)
    if (value == outcome) return name;
  return "?";
}

const std::array<std::pair<PrecisionForm, const char*>, 4> kPrecisionFormNames = {{
    {PrecisionForm::kUnknown, ""},
    {PrecisionForm::kFp32, "fp32"},
    {PrecisionForm::kAutocast, "autocast"},
    {PrecisionForm::kHalfParameters, "bf16 parameters, fp32 master"},
}};

std::string to_string(PrecisionForm form) {
  for (const auto& [value, name] : kPrecisionFormNames)
    if (value == form) return name;
  return "?";
}

std::string outcome_text(const ProbeReport& r) {
  const std::string snapshot =
      r.snapshot_path.empty() ? "" : fmt::format(" (snapshot: oomtune diagnose {})", r.snapshot_path);
  const std::string outcome = to_string(r.outcome);
  if (r.message.rfind(outcome, 0) == 0) return r.message + snapshot;  // "crashed: SIGSEGV during forward" says it all
  const std::string where =
      r.phase_at_failure ? outcome + " during " + std::string(phase_name(*r.phase_at_failure)) : outcome;
  return (r.message.empty() ? where : where + ": " + r.message) + snapshot;
}

std::string kernel_scratch_text(const KernelScratch& k) {
  std::string text;
  if (k.allocations > 0)
    text = fmt::format(
        "{} at most at once, by {} ({} allocations); CPU only, not counted toward a CUDA prediction; "
        "with it the CPU held {} at most",
        format_bytes(k.peak_bytes), k.op, k.allocations, format_bytes(k.peak_with_scratch_bytes));
  if (k.raw_bytes_counted > 0)
    text += fmt::format("{}{} of library memory (not tensors) allocated outside any operator is counted as tensors",
                        text.empty() ? "" : "; ", format_bytes(k.raw_bytes_counted));
  return text;
}

std::string cudnn_text(const CudnnCalls& c) {
  std::vector<std::string> calls;
  if (c.convolutions + c.convolution_backwards > 0)
    calls.push_back(fmt::format("{} convolution{} ({} backward)", c.convolutions, c.convolutions == 1 ? "" : "s",
                                c.convolution_backwards));
  if (c.batch_norms > 0) calls.push_back(fmt::format("{} batch norm{}", c.batch_norms, c.batch_norms == 1 ? "" : "s"));
  // A convolution's workspace gives way under a cap (Note [cuDNN calls]).
  return fmt::format(
      "{} a step: on CUDA each call may take a workspace that cuDNN sizes at run time{}, not counted here{}",
      fmt::join(calls, " and "), c.batch_norms > 0 ? " (batch norm a reserve space too)" : "",
      c.convolutions + c.convolution_backwards > 0
          ? "; a convolution's that does not fit makes cuDNN pick an engine that needs less (slower, not out of "
            "memory)"
          : "");
}

std::string cuda_budget_text(const ReservedPrediction& r) {
  if (r.budget_bytes <= 0) return "";
  const std::string reserved = format_bytes(r.peak_reserved_bytes), usable = format_bytes(r.budget_bytes);
  if (r.peak_reserved_bytes <= r.budget_bytes)
    return fmt::format("{} reserved (predicted), within the usable {}", reserved, usable);
  if (!r.fits_budget)
    return fmt::format(
        "{} reserved (predicted) is over the usable {}: capped there the caching allocator runs out of memory at a "
        "{} request{} during {}",
        reserved, usable, format_bytes(r.failed_request_bytes), r.failed_op.empty() ? "" : " by " + r.failed_op,
        phase_name(r.failed_phase));
  return fmt::format(
      "{} reserved (predicted) is over the usable {}: capped there the caching allocator serves every request by "
      "freeing its cache {} time{} (each flush synchronizes the device and returns every cached segment)",
      reserved, usable, r.cache_flushes, r.cache_flushes == 1 ? "" : "s");
}

namespace {
std::string clipping_text(const OptimizerRecord& optimizer) {
  if (optimizer.max_grad_norm <= 0) return "";
  return fmt::format("; gradients clipped to norm {} before the update (clip_grad_norm_)", optimizer.max_grad_norm);
}
}  // namespace

std::string optimizer_text(const OptimizerRecord& optimizer) {
  if (optimizer.name.empty()) return "";
  const std::string bytes = format_bytes(optimizer.temporary_bytes);
  if (optimizer.implementation.empty())
    return fmt::format("{}: {} of temporaries above its state at the step's peak ({}; not foreach-modelled){}",
                       optimizer.name, bytes,
                       optimizer.name == "adamw" || optimizer.name == "sgd" ? "offload: libtorch's loop on the host"
                                                                            : "oomtune's own loop",
                       clipping_text(optimizer));
  std::string how;
  if (optimizer.implementation == "foreach")
    how = "whole-list: torch._foreach_* over every parameter at once; torch.optim's default on CUDA";
  else if (optimizer.implementation == "fused")
    how = "one fused kernel in place; step counts on the device";
  else
    how = "one parameter's at a time";
  return fmt::format("{}, {}: {} of temporaries above its state at the step's peak ({}){}", optimizer.name,
                     optimizer.implementation, bytes, how, clipping_text(optimizer));
}

std::optional<DrawnLengths> drawn_lengths(const ProbeReport& report) {
  if (report.step_lengths.size() < 3) return std::nullopt;
  const auto first = report.step_lengths.begin() + 2, last = report.step_lengths.end();
  DrawnLengths d;
  d.steps = static_cast<std::size_t>(last - first);
  d.shortest = *std::min_element(first, last);
  d.longest = *std::max_element(first, last);
  double tokens = 0;
  for (auto it = first; it != last; ++it) tokens += static_cast<double>(*it);
  d.mean = tokens / static_cast<double>(d.steps);
  return d;
}

nlohmann::json to_json(const ProbeReport& r) {
  nlohmann::json phases = nlohmann::json::object();
  for (std::size_t i = 0; i < kNumPhases; ++i)
    phases[std::string(phase_name(static_cast<Phase>(i)))] = phase_json(r.phases[i]);
  nlohmann::json j = {
      {"config", r.config},
      {"micro_batch", r.micro_batch},
      {"accumulation_steps", r.accumulation_steps},
      {"global_batch", r.global_batch},
      {"parameter_count", r.parameter_count},
      {"frozen_parameter_count", r.frozen_parameter_count},
      {"outcome", to_string(r.outcome)},
      {"message", r.message},
      {"input_error", r.input_error},
      {"phase_at_failure", r.phase_at_failure ? std::string(phase_name(*r.phase_at_failure)) : std::string()},
      {"phases", phases},
      {"peak_bytes", r.peak_bytes},
      {"host_peak_bytes", r.host_peak_bytes},
      {"steps_run", r.steps_run},
      {"skipped_steps", r.skipped_steps},
      {"measured_step_skipped", r.measured_step_skipped},
      {"static",
       {{"parameter_bytes", r.static_memory.parameter_bytes},
        {"buffer_bytes", r.static_memory.buffer_bytes},
        {"gradient_bytes", r.static_memory.gradient_bytes},
        {"optimizer_state_bytes", r.static_memory.optimizer_state_bytes},
        {"optimizer_host_bytes", r.static_memory.optimizer_host_bytes},
        {"frozen_parameter_bytes", r.static_memory.frozen_parameter_bytes},
        {"without_gradient", r.static_memory.without_gradient},
        {"without_gradient_count", r.static_memory.without_gradient_count}}},
      {"optimizer",
       {{"name", r.optimizer.name},
        {"implementation", r.optimizer.implementation},
        {"temporary_bytes", r.optimizer.temporary_bytes},
        {"max_grad_norm", r.optimizer.max_grad_norm}}},
      {"retained_activation_bytes", r.retained_activation_bytes},
      {"backward_activation_peak",
       {{"live_bytes", r.backward_activation_peak.live_bytes},
        {"gradient_bytes", r.backward_activation_peak.gradient_bytes},
        {"accumulating_bytes", r.backward_activation_peak.accumulating_bytes},
        {"by_gradients", gradient_levels_json(r.backward_activation_peak.by_gradients)}}},
      {"largest_allocation",
       {{"bytes", r.largest.bytes}, {"op", r.largest.op}, {"phase", std::string(phase_name(r.largest.phase))}}},
      {"kernel_scratch",
       {{"peak_bytes", r.kernel_scratch.peak_bytes},
        {"allocations", r.kernel_scratch.allocations},
        {"allocated_bytes", r.kernel_scratch.allocated_bytes},
        {"op", r.kernel_scratch.op},
        {"peak_with_scratch_bytes", r.kernel_scratch.peak_with_scratch_bytes},
        {"raw_bytes_counted", r.kernel_scratch.raw_bytes_counted}}},
      {"timing",
       {{"warmup_steps", r.timing.warmup_steps},
        {"warmup_seconds", r.timing.warmup_seconds},
        {"step_seconds", r.timing.step_seconds},
        {"steady_step_seconds", r.timing.steady_step_seconds},
        {"optimizer_seconds", r.timing.optimizer_seconds},
        {"steady_optimizer_seconds", r.timing.steady_optimizer_seconds},
        {"steady", r.timing.steady},
        {"tolerance", r.timing.tolerance},
        {"measured", r.timing.measured}}},
      {"samples_per_second", r.samples_per_second},
      {"checkpointed_blocks", r.checkpointed_blocks},
      {"torch_version", r.torch_version},
      {"optimizing_executor", r.optimizing_executor},
      {"precision_form", to_string(r.precision_form)},
      {"autocast_lists", r.autocast_lists},
  };
  if (!r.step_lengths.empty()) j["step_lengths"] = r.step_lengths;
  if (!r.step_peak_bytes.empty()) j["step_peak_bytes"] = r.step_peak_bytes;
  if (!r.refused_checkpoint_class.empty()) {
    j["checkpoint_refusal"] = {{"class", r.refused_checkpoint_class}, {"other_blocks", r.other_checkpointed_blocks}};
  }
  if (r.reserved) {
    j["reserved"] = {{"peak_reserved_bytes", r.reserved->peak_reserved_bytes},
                     {"reserved_minus_allocated_bytes", r.reserved->reserved_minus_allocated_bytes},
                     {"largest_free_block_bytes", r.reserved->largest_free_block_bytes},
                     {"segment_allocations", r.reserved->segment_allocations},
                     {"fits_budget", r.reserved->fits_budget},
                     {"budget_bytes", r.reserved->budget_bytes},
                     {"cache_flushes", r.reserved->cache_flushes}};
    if (r.reserved->failed_request_bytes > 0)
      j["reserved"]["failed_request"] = {{"bytes", r.reserved->failed_request_bytes},
                                         {"op", r.reserved->failed_op},
                                         {"phase", phase_name(r.reserved->failed_phase)}};
  }
  if (r.measured_reserved) {
    j["measured_reserved"] = {{"peak_reserved_bytes", r.measured_reserved->peak_reserved_bytes},
                              {"peak_active_bytes", r.measured_reserved->peak_active_bytes},
                              {"segment_allocations", r.measured_reserved->segment_allocations},
                              {"num_alloc_retries", r.measured_reserved->num_alloc_retries},
                              {"num_ooms", r.measured_reserved->num_ooms}};
  }
  if (!r.snapshot_path.empty()) j["snapshot"] = r.snapshot_path;
  if (r.allocatable) {
    j["allocatable"] = {{"largest_block_bytes", r.allocatable->largest_block_bytes},
                        {"device_free_bytes", r.allocatable->device_free_bytes},
                        {"device_total_bytes", r.allocatable->device_total_bytes},
                        {"attempts", r.allocatable->attempts},
                        {"bound_bytes", r.allocatable->bound_bytes}};
  }
  if (r.peak_composition.live_bytes > 0) {
    nlohmann::json shares = nlohmann::json::array();
    for (const PeakShare& share : r.peak_composition.shares)
      shares.push_back({{"op", share.op},
                        {"phase", phase_name(share.phase)},
                        {"earlier_step", share.earlier_step},
                        {"bytes", share.bytes},
                        {"blocks", share.blocks}});
    j["peak_composition"] = {{"phase", phase_name(r.peak_composition.phase)},
                             {"live_bytes", r.peak_composition.live_bytes},
                             {"shares", shares}};
  }
  if (r.attention) j["attention"] = to_json(*r.attention);
  if (r.dropout) j["dropout"] = to_json(*r.dropout);
  if (r.workspaces) j["workspaces"] = to_json(*r.workspaces);
  if (r.cudnn)
    j["cudnn"] = {{"convolutions", r.cudnn->convolutions},
                  {"convolution_backwards", r.cudnn->convolution_backwards},
                  {"batch_norms", r.cudnn->batch_norms}};
  return j;
}

ProbeReport probe_report_from_json(const nlohmann::json& j) {
  try {
    ProbeReport r;
    r.config = j.at("config").get<std::string>();
    r.micro_batch = j.at("micro_batch").get<int64_t>();
    r.accumulation_steps = j.at("accumulation_steps").get<int64_t>();
    r.global_batch = j.at("global_batch").get<int64_t>();
    r.parameter_count = j.at("parameter_count").get<int64_t>();
    // Absent from reports recorded before frozen parameters (issue #47): none.
    r.frozen_parameter_count = j.value("frozen_parameter_count", int64_t{0});
    r.outcome = outcome_from_string(j.at("outcome").get<std::string>());
    r.message = j.at("message").get<std::string>();
    r.input_error = j.value("input_error", false);
    if (const std::string phase = j.value("phase_at_failure", ""); !phase.empty()) {
      r.phase_at_failure = phase_named(phase, "phase_at_failure");
    }
    for (std::size_t i = 0; i < kNumPhases; ++i)
      r.phases[i] = phase_from_json(j.at("phases").at(std::string(phase_name(static_cast<Phase>(i)))));
    r.peak_bytes = j.at("peak_bytes").get<int64_t>();
    r.host_peak_bytes = j.at("host_peak_bytes").get<int64_t>();
    r.steps_run = j.at("steps_run").get<int64_t>();
    r.skipped_steps = j.value("skipped_steps", int64_t{0});  // absent before 2026-12-06
    r.measured_step_skipped = j.value("measured_step_skipped", false);
    // Only for a job with a length distribution (issue #47 item 2).
    r.step_lengths = j.value("step_lengths", std::vector<int64_t>{});
    r.step_peak_bytes = j.value("step_peak_bytes", std::vector<int64_t>{});
    const auto& s = j.at("static");
    r.static_memory.parameter_bytes = s.at("parameter_bytes").get<int64_t>();
    r.static_memory.buffer_bytes = s.at("buffer_bytes").get<int64_t>();
    r.static_memory.gradient_bytes = s.at("gradient_bytes").get<int64_t>();
    r.static_memory.optimizer_state_bytes = s.at("optimizer_state_bytes").get<int64_t>();
    r.static_memory.optimizer_host_bytes = s.at("optimizer_host_bytes").get<int64_t>();
    r.static_memory.frozen_parameter_bytes = s.value("frozen_parameter_bytes", int64_t{0});
    // Absent before 2026-12-06.
    r.static_memory.without_gradient = s.value("without_gradient", std::vector<std::string>{});
    r.static_memory.without_gradient_count = s.value("without_gradient_count", int64_t{0});
    // Absent from reports recorded before the optimizer line (issue #46): not recorded.
    if (const auto optimizer = j.find("optimizer"); optimizer != j.end())
      r.optimizer = {optimizer->at("name").get<std::string>(), optimizer->at("implementation").get<std::string>(),
                     optimizer->at("temporary_bytes").get<int64_t>(),
                     optimizer->value("max_grad_norm", 0.0)};  // absent before gradient clipping
    r.retained_activation_bytes = j.at("retained_activation_bytes").get<int64_t>();
    if (const auto peak = j.find("backward_activation_peak"); peak != j.end()) {
      BackwardActivationPeak& a = r.backward_activation_peak;
      a.live_bytes = peak->at("live_bytes").get<int64_t>();
      a.gradient_bytes = peak->at("gradient_bytes").get<int64_t>();
      a.accumulating_bytes = peak->at("accumulating_bytes").get<int64_t>();
      // Absent from reports recorded before the levels: not measured.
      if (const auto levels = peak->find("by_gradients"); levels != peak->end())
        for (const auto& level : *levels)
          a.by_gradients.push_back(
              {level.at(0).get<int64_t>(), level.at(1).get<int64_t>(), level.at(2).get<int64_t>()});
    }
    if (const auto composition = j.find("peak_composition"); composition != j.end()) {
      PeakComposition& c = r.peak_composition;
      c.phase = phase_named(composition->at("phase").get<std::string>(), "peak_composition.phase");
      c.live_bytes = composition->at("live_bytes").get<int64_t>();
      for (const auto& share : composition->at("shares"))
        c.shares.push_back({share.at("op").get<std::string>(),
                            phase_named(share.at("phase").get<std::string>(), "peak_composition.shares.phase"),
                            share.at("earlier_step").get<bool>(), share.at("bytes").get<int64_t>(),
                            share.at("blocks").get<int64_t>()});
    }
    const auto& largest = j.at("largest_allocation");
    r.largest.bytes = largest.at("bytes").get<int64_t>();
    r.largest.op = largest.at("op").get<std::string>();
    const std::string phase = largest.at("phase").get<std::string>();
    for (std::size_t i = 0; i < kNumPhases; ++i)
      if (phase_name(static_cast<Phase>(i)) == phase) r.largest.phase = static_cast<Phase>(i);
    if (const auto scratch = j.find("kernel_scratch"); scratch != j.end())
      r.kernel_scratch = {scratch->at("peak_bytes").get<int64_t>(),
                          scratch->at("allocations").get<int64_t>(),
                          scratch->at("allocated_bytes").get<int64_t>(),
                          scratch->at("op").get<std::string>(),
                          scratch->at("peak_with_scratch_bytes").get<int64_t>(),
                          scratch->at("raw_bytes_counted").get<int64_t>()};
    const auto& t = j.at("timing");
    r.timing.warmup_steps = t.at("warmup_steps").get<int64_t>();
    r.timing.warmup_seconds = t.at("warmup_seconds").get<double>();
    r.timing.step_seconds = t.at("step_seconds").get<std::vector<double>>();
    r.timing.steady_step_seconds = t.at("steady_step_seconds").get<double>();
    r.timing.optimizer_seconds = t.value("optimizer_seconds", std::vector<double>{});
    r.timing.steady_optimizer_seconds = t.value("steady_optimizer_seconds", 0.0);
    r.timing.steady = t.at("steady").get<bool>();
    r.timing.tolerance = t.at("tolerance").get<double>();
    r.timing.measured = t.value("measured", true);
    r.samples_per_second = j.at("samples_per_second").get<double>();
    r.checkpointed_blocks = j.at("checkpointed_blocks").get<std::vector<std::string>>();
    r.torch_version = j.at("torch_version").get<std::string>();
    r.optimizing_executor = j.at("optimizing_executor").get<bool>();
    r.autocast_lists = j.value("autocast_lists", "");
    const std::string form = j.value("precision_form", "");
    const auto named = std::find_if(kPrecisionFormNames.begin(), kPrecisionFormNames.end(),
                                    [&](const auto& entry) { return form == entry.second; });
    if (named == kPrecisionFormNames.end())
      throw InputError(fmt::format("probe report: unknown precision_form '{}'", form));
    r.precision_form = named->first;
    if (j.contains("checkpoint_refusal")) {
      const auto& refusal = j.at("checkpoint_refusal");
      r.refused_checkpoint_class = refusal.at("class").get<std::string>();
      r.other_checkpointed_blocks = refusal.at("other_blocks").get<std::vector<std::string>>();
    }
    if (j.contains("reserved")) {
      const auto& res = j.at("reserved");
      r.reserved = ReservedPrediction{};
      r.reserved->peak_reserved_bytes = res.at("peak_reserved_bytes").get<int64_t>();
      r.reserved->reserved_minus_allocated_bytes = res.at("reserved_minus_allocated_bytes").get<int64_t>();
      r.reserved->largest_free_block_bytes = res.at("largest_free_block_bytes").get<int64_t>();
      r.reserved->segment_allocations = res.at("segment_allocations").get<int64_t>();
      r.reserved->fits_budget = res.at("fits_budget").get<bool>();
      // Absent from reports recorded before the capped replay: no cap.
      r.reserved->budget_bytes = res.value("budget_bytes", int64_t{0});
      r.reserved->cache_flushes = res.value("cache_flushes", int64_t{0});
      if (const auto failed = res.find("failed_request"); failed != res.end()) {
        r.reserved->failed_request_bytes = failed->at("bytes").get<int64_t>();
        r.reserved->failed_op = failed->at("op").get<std::string>();
        r.reserved->failed_phase = phase_named(failed->at("phase").get<std::string>(), "reserved.failed_request.phase");
      }
    }
    if (j.contains("measured_reserved")) {
      const auto& m = j.at("measured_reserved");
      r.measured_reserved =
          MeasuredReserved{m.at("peak_reserved_bytes").get<int64_t>(), m.at("peak_active_bytes").get<int64_t>(),
                           m.at("segment_allocations").get<int64_t>(), m.at("num_alloc_retries").get<int64_t>(),
                           m.at("num_ooms").get<int64_t>()};
    }
    r.snapshot_path = j.value("snapshot", "");
    if (j.contains("allocatable")) {
      const auto& a = j.at("allocatable");
      r.allocatable =
          AllocatableRecord{a.at("largest_block_bytes").get<int64_t>(), a.at("device_free_bytes").get<int64_t>(),
                            a.at("device_total_bytes").get<int64_t>(), a.at("attempts").get<int64_t>(),
                            a.value("bound_bytes", int64_t{0})};
    }
    if (j.contains("attention")) r.attention = attention_record_from_json(j.at("attention"));
    if (j.contains("dropout")) r.dropout = dropout_record_from_json(j.at("dropout"));
    if (j.contains("workspaces")) r.workspaces = workspace_record_from_json(j.at("workspaces"));
    if (j.contains("cudnn")) {
      const auto& c = j.at("cudnn");
      r.cudnn = CudnnCalls{c.at("convolutions").get<int64_t>(), c.at("convolution_backwards").get<int64_t>(),
                           c.at("batch_norms").get<int64_t>()};
    }
    return r;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("probe report: {}", e.what()));
  }
}

}  // namespace oomtune
