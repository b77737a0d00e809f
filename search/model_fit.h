#pragma once
// Fitting the memory model (memory_model.h) to probe reports: a probe's
// bytes against the budget, backward's activation lines, a strategy's
// effect as its lines' difference from the base's. No trial runs here; the
// search (search_state.h) decides what to probe and calls these.

#include <array>
#include <string>
#include <vector>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "search/memory_model.h"

namespace oomtune {

/// The factor that turns a probe's allocated bytes into bytes against the
/// budget: for a CUDA target the caching allocator's reserved / allocated
/// ratio (a job runs out of memory when it cannot reserve more, not when
/// live tensors reach the budget): measured where the trial ran on the GPU
/// (ProbeReport::measured_reserved), else predicted from its events with
/// the cuBLAS workspaces and no cap (ReservedPrediction). The target is
/// CUDA for device = "cuda" and for device = "meta", whose jobs ask what a
/// GPU would do and have no device of their own to fit; 1 for "cpu", whose
/// counting allocator enforces allocated bytes (docs/autotune.md, "The
/// budget on each device").
double budget_scale(const ProbeReport& r, const JobSpec& job);

/// True where `job`'s budget caps a CUDA caching allocator's reserved
/// bytes, so budget_scale turns allocated bytes into reserved ones: device
/// "cuda" or "meta".
bool budget_on_reserved(const JobSpec& job);

/// Bytes: what the budget is held against in a run that finished: where
/// the budget caps reserved bytes (`on_reserved`, budget_on_reserved) and
/// the run measured them on the GPU (ProbeReport::measured_reserved), the
/// caching allocator's reserved peak, since the cap refuses a segment, not
/// a tensor (probes/cuda_budget.h); the tensors' step peak
/// (ProbeReport::peak_bytes) otherwise.
int64_t budgeted_peak_bytes(const ProbeReport& r, bool on_reserved);

/// That peak in words: "130.00 MiB" where it is the tensors', "130.00 MiB
/// of tensors, 140.00 MiB reserved" where it is the reserved bytes.
std::string budgeted_peak_text(const ProbeReport& r, bool on_reserved);

/// Bytes: a probe's peak per phase, indexed by Phase, against the budget
/// (budget_scale); zero outside kStepPhases.
std::array<double, kNumPhases> phase_peaks_of(const ProbeReport& r, const JobSpec& job);

/// The mean of a non-empty `values`.
double mean_of(const std::vector<double>& values);

/// Fits `m`'s backward activation lines (StepModels::backward_activation,
/// accumulating_backward and the gradient bytes) to `probes`, their bytes
/// against the budget; with one probe, of slopes `first_fallback` and
/// `later_fallback` (bytes per sample). Leaves them unmeasured when a probe
/// did not measure them (no event stream). memory_model.cpp, Note [Backward
/// activation peak]. Also fits its lines by gradients made
/// (StepModels::backward_levels, Note [Backward by gradients]) where
/// every probe measured as many levels, else leaves them empty; with one
/// probe of the slopes of `level_fallback`'s lines where it has as many
/// levels, else of `first_fallback` and `later_fallback`.
void fit_backward_activation(StepModels& m, const std::vector<const ProbeReport*>& probes, const JobSpec& job,
                             double first_fallback, double later_fallback,
                             const std::vector<LevelLines>* level_fallback = nullptr);

/// The first of those lines in the tensors' bytes (no budget_scale), as
/// SearchResult::baseline_peak counts them: what the report shows beside
/// it. A zero line when a probe did not measure it.
BatchLine backward_activation_of_tensors(const std::vector<const ProbeReport*>& probes, double fallback);

/// Seconds: of a probe's step, the micro-batch's part, without the
/// optimizer step (memory_model.cpp, Note [Step time]).
double forward_backward_seconds(const ProbeReport& r);

/// Lines whose forward, loss and backward slopes are r's retained
/// activations per sample (bytes per sample), intercepts 0: the slope of a
/// line through r alone (a lower bound: backward's temporaries grow with
/// the micro-batch too).
PhaseLines retained_slopes(const ProbeReport& r);

/// A line's effect against the base's: the shift of its intercept (bytes)
/// and the ratio of its slope (1 where the base's slope is not positive, never
/// below 0).
LineEffect line_effect(const BatchLine& own, const BatchLine& base);

}  // namespace oomtune
