#include "search/model_fit.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>

#include "common/byte_size.h"

namespace oomtune {
namespace {

// Whether every probe measured backward's activation peak (it needs the
// event stream).
bool measured_backward_activation(const std::vector<const ProbeReport*>& probes) {
  return !probes.empty() && std::all_of(probes.begin(), probes.end(), [](const ProbeReport* r) {
    return r->backward_activation_peak.live_bytes > 0;
  });
}

// The caching allocator's reserved peak, where the run measured one on the
// GPU.
std::optional<int64_t> measured_reserved_peak(const ProbeReport& r) {
  if (r.measured_reserved && r.measured_reserved->peak_reserved_bytes > 0)
    return r.measured_reserved->peak_reserved_bytes;
  return std::nullopt;
}

}  // namespace

bool budget_on_reserved(const JobSpec& job) { return job.device != Device::kCpu; }

int64_t budgeted_peak_bytes(const ProbeReport& r, bool on_reserved) {
  const std::optional<int64_t> reserved = measured_reserved_peak(r);
  return on_reserved && reserved ? *reserved : r.peak_bytes;
}

std::string budgeted_peak_text(const ProbeReport& r, bool on_reserved) {
  const int64_t budgeted = budgeted_peak_bytes(r, on_reserved);
  if (budgeted == r.peak_bytes) return format_bytes(r.peak_bytes);
  return fmt::format("{} of tensors, {} reserved", format_bytes(r.peak_bytes), format_bytes(budgeted));
}

double budget_scale(const ProbeReport& r, const JobSpec& job) {
  if (!budget_on_reserved(job) || r.peak_bytes <= 0) return 1;
  // What the GPU's allocator reserved beats what the simulator predicts.
  if (const std::optional<int64_t> reserved = measured_reserved_peak(r))
    return static_cast<double>(*reserved) / static_cast<double>(r.peak_bytes);
  if (r.reserved) return static_cast<double>(r.reserved->peak_reserved_bytes) / static_cast<double>(r.peak_bytes);
  return 1;
}

std::array<double, kNumPhases> phase_peaks_of(const ProbeReport& r, const JobSpec& job) {
  const double scale = budget_scale(r, job);
  std::array<double, kNumPhases> peaks{};
  for (Phase p : kStepPhases)
    peaks[static_cast<std::size_t>(p)] = scale * static_cast<double>(r.phases[static_cast<std::size_t>(p)].peak_bytes);
  return peaks;
}

double mean_of(const std::vector<double>& values) {
  double sum = 0;
  for (double v : values) sum += v;
  return sum / static_cast<double>(values.size());
}

namespace {

// Backward's lines by gradients made (Note [Backward by gradients]), each
// probe's bytes multiplied by `scale`, where every probe measured as many
// levels; with one probe of the slopes of `fallback` where it has as many
// levels, else of `live_slope` and `accumulating_slope`.
void fit_levels(StepModels& m, const std::vector<const ProbeReport*>& probes, const std::vector<double>& scale,
                const std::vector<LevelLines>* fallback, double live_slope, double accumulating_slope) {
  m.backward_levels.clear();
  const std::size_t count = probes.front()->backward_activation_peak.by_gradients.size();
  for (const ProbeReport* r : probes)
    if (r->backward_activation_peak.by_gradients.size() != count) return;
  const bool own_fallback = fallback != nullptr && fallback->size() == count;
  std::vector<int64_t> sizes;
  for (const ProbeReport* r : probes) sizes.push_back(r->micro_batch);
  for (std::size_t k = 0; k < count; ++k) {
    std::vector<double> live, accumulating, gradients;
    for (std::size_t j = 0; j < probes.size(); ++j) {
      const GradientLevel& level = probes[j]->backward_activation_peak.by_gradients[k];
      live.push_back(scale[j] * static_cast<double>(level.live_bytes));
      accumulating.push_back(scale[j] * static_cast<double>(level.accumulating_bytes));
      gradients.push_back(scale[j] * static_cast<double>(level.gradient_bytes));
    }
    const LevelLines* other = own_fallback ? &(*fallback)[k] : nullptr;
    m.backward_levels.push_back(
        {fit_batch_line(sizes, live, other ? other->live.slope : live_slope),
         fit_batch_line(sizes, accumulating, other ? other->accumulating.slope : accumulating_slope),
         mean_of(gradients)});
  }
}

// fit_backward_activation with each probe's bytes multiplied by scale(probe).
template <typename Scale>
void fit_backward_lines(StepModels& m, const std::vector<const ProbeReport*>& probes, const Scale& scale_of,
                        double first_fallback, double later_fallback, const std::vector<LevelLines>* level_fallback) {
  m.backward_activation_measured = measured_backward_activation(probes);
  if (!m.backward_activation_measured) return;
  std::vector<double> scales;
  std::vector<int64_t> sizes;
  std::vector<double> first, later, gradients;
  for (const ProbeReport* r : probes) {
    const double scale = scale_of(*r);
    scales.push_back(scale);
    const BackwardActivationPeak& a = r->backward_activation_peak;
    sizes.push_back(r->micro_batch);
    first.push_back(scale * static_cast<double>(a.live_bytes));
    later.push_back(scale * static_cast<double>(a.accumulating_bytes));
    gradients.push_back(scale * static_cast<double>(a.gradient_bytes));
  }
  m.backward_activation = fit_batch_line(sizes, first, first_fallback);
  m.accumulating_backward = fit_batch_line(sizes, later, later_fallback);
  m.backward_activation_gradient_bytes = mean_of(gradients);
  fit_levels(m, probes, scales, level_fallback, first_fallback, later_fallback);
}

}  // namespace

void fit_backward_activation(StepModels& m, const std::vector<const ProbeReport*>& probes, const JobSpec& job,
                             double first_fallback, double later_fallback,
                             const std::vector<LevelLines>* level_fallback) {
  fit_backward_lines(
      m, probes, [&](const ProbeReport& r) { return budget_scale(r, job); }, first_fallback, later_fallback,
      level_fallback);
}

BatchLine backward_activation_of_tensors(const std::vector<const ProbeReport*>& probes, double fallback) {
  StepModels m;
  fit_backward_lines(
      m, probes, [](const ProbeReport&) { return 1.0; }, fallback, fallback, nullptr);
  return m.backward_activation;
}

double forward_backward_seconds(const ProbeReport& r) {
  return std::max(0.0, r.timing.steady_step_seconds - r.timing.steady_optimizer_seconds);
}

PhaseLines retained_slopes(const ProbeReport& r) {
  PhaseLines lines{};
  for (Phase p : {Phase::kForward, Phase::kLoss, Phase::kBackward})
    lines[static_cast<std::size_t>(p)].slope =
        static_cast<double>(r.retained_activation_bytes) / static_cast<double>(r.micro_batch);
  return lines;
}

LineEffect line_effect(const BatchLine& own, const BatchLine& base) {
  return LineEffect{own.intercept - base.intercept, base.slope > 0 ? std::max(0.0, own.slope / base.slope) : 1};
}

}  // namespace oomtune
