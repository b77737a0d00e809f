#include "report/probe_summary.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/byte_size.h"
#include "common/json_text.h"
#include "probes/peak_composition.h"
#include "search/model_fit.h"

namespace oomtune {
namespace {

// The shares of the "at the peak" lines; --json has them all.
constexpr std::size_t kPeakSharesListed = 6;

std::string percent_diff(int64_t measured, int64_t expected) {
  if (expected == 0) return measured == 0 ? "exact" : "-";
  const double diff = 100.0 * static_cast<double>(measured - expected) / static_cast<double>(expected);
  return std::fabs(diff) < 0.005 ? "exact" : fmt::format("{:+.2f} %", diff);
}

// "blocks.0, blocks.2"; past kListed names, the first three and the last.
std::string block_list(const std::vector<std::string>& paths) {
  constexpr std::size_t kListed = 6;
  if (paths.size() <= kListed) return fmt::format("{}", fmt::join(paths, ", "));
  return fmt::format("{}, {}, {}, ..., {} (--json lists all)", paths[0], paths[1], paths[2], paths.back());
}

// Under the gradients line: which trainable parameters got none, the
// difference from the analytic counts.
std::string without_gradient_text(const StaticMemory& m) {
  const std::size_t n = m.without_gradient.size();
  return fmt::format(
      "{:<22} no gradient: {} ({} tensor{}, {} element{}; the loss does not depend on them, so they get no "
      "optimizer state either)",
      "", block_list(m.without_gradient), n, n == 1 ? "" : "s", m.without_gradient_count,
      m.without_gradient_count == 1 ? "" : "s");
}

// The step-time line of a trial at drawn lengths (trial/trial_runner.cpp,
// Note [Variable-length steps]): the mean over steps 3.., the measured
// step's own time at the longest beside it.
std::string variable_step_time_text(const ProbeReport& r, const DrawnLengths& drawn) {
  return fmt::format(
      "step time            {:.4f} s mean of {} steps at drawn lengths ({} to {} tokens, mean {:.0f}; optimizer "
      "step {:.4f} s of it), {:.1f} samples/s; the measured step at {} tokens {:.4f} s; warm-up {} step, {:.3f} s",
      r.timing.steady_step_seconds, drawn.steps, drawn.shortest, drawn.longest, drawn.mean,
      r.timing.steady_optimizer_seconds, r.samples_per_second, r.step_lengths[1], r.timing.step_seconds[0],
      r.timing.warmup_steps, r.timing.warmup_seconds);
}

// The step-peaks line of a trial at drawn lengths: the smallest and largest
// step peak after the warm-up, each with its length.
std::string step_peaks_text(const ProbeReport& r) {
  const auto [low, high] = std::minmax_element(r.step_peak_bytes.begin(), r.step_peak_bytes.end());
  const auto length_of = [&](std::vector<int64_t>::const_iterator it) {
    return r.step_lengths[static_cast<std::size_t>(it - r.step_peak_bytes.begin()) + 1];
  };
  return fmt::format("step peaks           {} steps: {} at {} tokens to {} at {} tokens", r.step_peak_bytes.size(),
                     format_bytes(*low), length_of(low), format_bytes(*high), length_of(high));
}

}  // namespace

std::string render_probe_text(const ProbeSummary& s) {
  const ProbeReport& r = s.report;
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  // A trial that died before loading finished counted no parameters.
  std::string parameters = r.parameter_count > 0 ? fmt::format("{} parameters, ", r.parameter_count) : "";
  if (r.frozen_parameter_count > 0)
    parameters = fmt::format("{} trainable + {} frozen parameters, ", r.parameter_count, r.frozen_parameter_count);
  line(fmt::format("model     {}  ({}device {})", s.model_path, parameters, device_name(s.device)));
  line(fmt::format("config    {}", r.config));
  if (!r.checkpointed_blocks.empty())
    line(fmt::format("ckpt      {} block{} recomputed: {}", r.checkpointed_blocks.size(),
                     r.checkpointed_blocks.size() == 1 ? "" : "s", block_list(r.checkpointed_blocks)));
  line(fmt::format("batch     global {} = micro-batch {} x {} accumulation steps", r.global_batch, r.micro_batch,
                   r.accumulation_steps));
  if (r.outcome != TrialOutcome::kOk) {
    line(fmt::format("outcome   {}", outcome_text(r)));
    return out;
  }
  line("");
  line(fmt::format("{:<10} {:>12} {:>12} {:>12} {:>12}", "phase", "start", "peak", "end", "allocations"));
  for (std::size_t i = 1; i < kNumPhases; ++i) {
    const PhaseMemory& p = r.phases[i];
    line(fmt::format("{:<10} {:>12} {:>12} {:>12} {:>12}", phase_name(static_cast<Phase>(i)),
                     format_bytes(p.start_bytes), format_bytes(p.peak_bytes), format_bytes(p.end_bytes),
                     p.allocations));
  }
  line(fmt::format("{:<10} {:>12} {:>12}", "step", "", format_bytes(r.peak_bytes)));
  if (r.host_peak_bytes > 0 || s.usable_host_budget_bytes) {
    // A host budget (search/host_budget.cpp, Note [Host budget]): its margin.
    std::string host_budget;
    if (const std::optional<int64_t> usable = s.usable_host_budget_bytes)
      host_budget =
          r.host_peak_bytes <= *usable
              ? fmt::format("; margin {} to the usable host budget", format_bytes(*usable - r.host_peak_bytes))
              : fmt::format("; {} over the usable host budget ({}): out of host memory",
                            format_bytes(r.host_peak_bytes - *usable), format_bytes(*usable));
    line(
        fmt::format("{:<10} {:>12} {:>12}  (host memory: the global batch before it is copied, checkpointing's RNG "
                    "states, an offloaded optimizer{})",
                    "host", "", format_bytes(r.host_peak_bytes), host_budget));
  }
  line("");
  line(fmt::format("{:<22} {:>12} {:>12} {:>10}", "static memory", "measured", "analytic", "diff"));
  const StaticMemory& m = r.static_memory;
  line(fmt::format("{:<22} {:>12} {:>12} {:>10}", "parameters", format_bytes(m.parameter_bytes),
                   format_bytes(s.analytic.parameter_bytes),
                   percent_diff(m.parameter_bytes, s.analytic.parameter_bytes)));
  if (r.frozen_parameter_count > 0)
    line(fmt::format("{:<22} {:>12} {:>12} {:>10}", "frozen parameters", format_bytes(m.frozen_parameter_bytes),
                     format_bytes(s.analytic.frozen_parameter_bytes),
                     percent_diff(m.frozen_parameter_bytes, s.analytic.frozen_parameter_bytes)));
  line(fmt::format("{:<22} {:>12} {:>12} {:>10}", "gradients", format_bytes(m.gradient_bytes),
                   format_bytes(s.analytic.gradient_bytes), percent_diff(m.gradient_bytes, s.analytic.gradient_bytes)));
  if (!m.without_gradient.empty()) line(without_gradient_text(m));
  // Offloaded: the state is on the host, the device holds (almost) none of
  // it. Otherwise the few host bytes a step leaves (a CPU scalar, on a GPU)
  // are no optimizer state, and the device's bytes are compared alone.
  const bool offloaded = m.optimizer_host_bytes > m.optimizer_state_bytes;
  line(fmt::format("{:<22} {:>12} {:>12} {:>10}", "optimizer state", format_bytes(m.optimizer_state_bytes),
                   format_bytes(s.analytic.optimizer_state_bytes),
                   offloaded ? "on host" : percent_diff(m.optimizer_state_bytes, s.analytic.optimizer_state_bytes)));
  if (offloaded)
    line(fmt::format("{:<22} {:>12}  (master weights, gradients and state)", "optimizer (host)",
                     format_bytes(m.optimizer_host_bytes)));
  line(fmt::format("{:<22} {:>12}", "buffers", format_bytes(m.buffer_bytes)));
  line(fmt::format("{:<22} {:>12}", "retained activations", format_bytes(r.retained_activation_bytes)));
  // Measured with the event stream (memory_model.cpp, Note [Backward activation peak]).
  const BackwardActivationPeak& activation = r.backward_activation_peak;
  if (activation.live_bytes > 0)
    line(fmt::format("{:<22} {:>12}  (live at backward's activation peak, {} of it gradients made by then)",
                     "backward activations", format_bytes(activation.live_bytes),
                     format_bytes(activation.gradient_bytes)));
  line("");
  for (const std::string& text : peak_composition_lines(r.peak_composition, kPeakSharesListed)) line(text);
  line(fmt::format("largest allocation   {} by {} during {}", format_bytes(r.largest.bytes), r.largest.op,
                   phase_name(r.largest.phase)));
  if (const std::string optimizer = optimizer_text(r.optimizer); !optimizer.empty())
    line(fmt::format("optimizer            {}", optimizer));
  // The scratch of the CPU's kernels; on meta no kernel runs, and the line
  // would say what the CPU held.
  if (const std::string scratch = kernel_scratch_text(r.kernel_scratch); !scratch.empty() && s.device != Device::kMeta)
    line(fmt::format("kernel scratch       {}", scratch));
  if (r.attention) line(fmt::format("attention            {}", attention_text(*r.attention)));
  if (r.dropout) line(fmt::format("dropout              {}", dropout_text(*r.dropout)));
  if (r.autocast_lists == "cuda")
    line(
        "autocast             CUDA's op lists: softmax, log_softmax, layer_norm, sum, exp, pow and the rest of "
        "CUDA's fp32 list run in fp32 here, as on a GPU");
  if (r.autocast_lists == "cpu")
    line(
        "autocast             the CPU's op lists (this libtorch has no CUDA's): softmax and layer_norm stay in the "
        "autocast dtype where a GPU runs them in fp32, so the activations may fall short of a GPU's");
  if (r.skipped_steps > 0)
    line(fmt::format(
        "loss scaling         fp16: GradScaler skipped {} of {} steps' updates for inf/NaN gradients, halving its "
        "scale each time, as a GPU run's first steps do; {}",
        r.skipped_steps, r.steps_run,
        r.measured_step_skipped ? "the measured step was one of them: its optimizer phase holds no update"
                                : "the measured step updated"));
  if (r.workspaces) {
    const WorkspaceRecord& w = *r.workspaces;
    line(fmt::format("workspaces           {}{}", workspace_text(w),
                     w.beside_peaks_bytes() == 0 ? std::string()
                                                 : fmt::format("; with them a CUDA run's step peak is {}",
                                                               format_bytes(r.peak_bytes + w.beside_peaks_bytes()))));
  }
  if (r.cudnn) line(fmt::format("cudnn                {}", cudnn_text(*r.cudnn)));
  if (s.activation_fit) {
    const ActivationFit& f = *s.activation_fit;
    std::vector<std::string> points;
    for (std::size_t i = 0; i < f.micro_batches.size(); ++i)
      points.push_back(fmt::format("{}: {}", f.micro_batches[i], format_bytes(f.retained_bytes[i])));
    line(fmt::format("activation fit       retained = {} + {} x micro-batch  (max residual {:.2f} %; {})",
                     format_bytes(static_cast<int64_t>(f.fit.intercept)),
                     format_bytes(static_cast<int64_t>(f.fit.slope)), 100.0 * f.fit.max_relative_residual,
                     fmt::join(points, ", ")));
  }
  if (r.reserved)
    line(fmt::format(
        "predicted reserved   {} on a CUDA caching allocator ({} of it unallocated at that peak, {} cudaMalloc calls)",
        format_bytes(r.reserved->peak_reserved_bytes), format_bytes(r.reserved->reserved_minus_allocated_bytes),
        r.reserved->segment_allocations));
  if (r.measured_reserved) {
    const MeasuredReserved& m = *r.measured_reserved;
    // The step ran (a failed one's summary stops at its outcome), so its
    // out-of-memory errors were caught inside it: cuDNN runs another engine
    // when a convolution's workspace finds no room (Note [cuDNN calls],
    // probes/memory_tracker.cpp).
    line(fmt::format(
        "measured reserved    {} by the caching allocator{} ({} cudaMalloc calls, {} {}, {} OOMs{})",
        format_bytes(m.peak_reserved_bytes),
        r.reserved && m.peak_reserved_bytes > 0
            ? fmt::format("; predicted {:+.1f} %", 100.0 * (static_cast<double>(r.reserved->peak_reserved_bytes) /
                                                                static_cast<double>(m.peak_reserved_bytes) -
                                                            1.0))
            : std::string(),
        m.segment_allocations, m.num_alloc_retries, m.num_alloc_retries == 1 ? "retry" : "retries", m.num_ooms,
        m.num_ooms > 0 ? std::string(", caught inside the step: cuDNN, for one, runs another, slower engine when a "
                                     "convolution's workspace finds no room")
                       : std::string()));
  }
  if (r.allocatable) {
    const AllocatableRecord& a = *r.allocatable;
    // At the bound the bisection stopped, not the allocator (largest_block.h).
    const bool at_bound = a.bound_bytes > 0 && a.bound_bytes - a.largest_block_bytes < 2 * kMiB;
    line(fmt::format(
        "largest block        {}{} allocatable after the step (bisection{}, {} {}); device free {} of "
        "{}; the step's largest request {}",
        at_bound ? "at least " : "", format_bytes(a.largest_block_bytes), at_bound ? " up to the usable budget" : "",
        a.attempts, a.attempts == 1 ? "try" : "tries", format_bytes(a.device_free_bytes),
        format_bytes(a.device_total_bytes), format_bytes(r.largest.bytes)));
  }
  if (!r.timing.measured)
    line(
        fmt::format("step time            none: the {} device computes shapes, not values, so a step there takes "
                    "no telling time (probe on cpu or cuda for it)",
                    device_name(s.device)));
  else if (const std::optional<DrawnLengths> drawn = drawn_lengths(r); drawn && r.timing.step_seconds.size() > 1)
    line(variable_step_time_text(r, *drawn));
  else
    line(fmt::format(
        "step time            {:.4f} s median of {} timed steps ({}; optimizer step {:.4f} s of it), {:.1f} "
        "samples/s; warm-up {} step, {:.3f} s",
        r.timing.steady_step_seconds, r.timing.step_seconds.size(), r.timing.steady ? "steady" : "not steady",
        r.timing.steady_optimizer_seconds, r.samples_per_second, r.timing.warmup_steps, r.timing.warmup_seconds));
  if (r.step_lengths.size() > 2 && r.step_peak_bytes.size() + 1 == r.step_lengths.size()) line(step_peaks_text(r));
  if (s.sequence) {
    line("");
    out += render_sequence_text(*s.sequence);
    line("");
  }
  if (s.budget_bytes) {
    // The margin is to the usable budget, what autotune and --enforce-budget
    // hold a run to (JobSpec::usable_budget_bytes). On a GPU the allocator's
    // cap is on reserved bytes (probes/cuda_budget.h); on the CPU and on
    // meta the peak counts tensors, so there the margin is no verdict for a
    // GPU: the "budget on CUDA" line is (trial_runner.cpp, Note [The budget
    // on a CUDA target]).
    const int64_t usable = s.usable_budget_bytes.value_or(*s.budget_bytes);
    const bool on_gpu = s.device == Device::kCuda;
    const int64_t margin = usable - budgeted_peak_bytes(r, on_gpu);
    const std::string margin_bytes = format_bytes(margin >= 0 ? margin : -margin);
    const std::string cuda = !on_gpu && r.reserved ? cuda_budget_text(*r.reserved) : std::string();
    const std::string budget = usable == *s.budget_bytes
                                   ? format_bytes(usable)
                                   : fmt::format("{} ({} usable after {:.0f} % headroom)",
                                                 format_bytes(*s.budget_bytes), format_bytes(usable), 100 * s.headroom);
    if (cuda.empty()) {
      line(fmt::format("budget               {}: peak {} ({} {})", budget, budgeted_peak_text(r, on_gpu),
                       margin >= 0 ? "fits with" : "exceeds by", margin_bytes));
    } else {
      line(fmt::format("budget               {}: tensors peak at {}, {} {}", budget, format_bytes(r.peak_bytes),
                       margin_bytes, margin >= 0 ? "under it" : "over it"));
      line(fmt::format("budget on CUDA       {}{}", r.workspaces ? r.workspaces->target + ": " : "", cuda));
    }
  }
  return out;
}

nlohmann::json probe_summary_json(const ProbeSummary& s) {
  nlohmann::json j = {{"job", s.job_path},
                      {"model", s.model_path},
                      {"device", device_name(s.device)},
                      {"report", to_json(s.report)},
                      {"analytic",
                       {{"parameter_bytes", s.analytic.parameter_bytes},
                        {"gradient_bytes", s.analytic.gradient_bytes},
                        {"optimizer_state_bytes", s.analytic.optimizer_state_bytes},
                        {"frozen_parameter_bytes", s.analytic.frozen_parameter_bytes}}}};
  j["budget_bytes"] = json_or_null(s.budget_bytes);
  j["usable_budget_bytes"] = json_or_null(s.usable_budget_bytes);
  j["usable_host_budget_bytes"] = json_or_null(s.usable_host_budget_bytes);
  if (s.activation_fit) {
    const ActivationFit& f = *s.activation_fit;
    j["activation_fit"] = {{"micro_batches", f.micro_batches},
                           {"retained_bytes", f.retained_bytes},
                           {"intercept_bytes", f.fit.intercept},
                           {"bytes_per_sample", f.fit.slope},
                           {"max_relative_residual", f.fit.max_relative_residual}};
  }
  if (s.sequence) j["sequence"] = sequence_fit_json(*s.sequence);
  return j;
}

}  // namespace oomtune
