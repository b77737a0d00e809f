// The host budget: optimizer offload moves the optimizer's memory to the
// host, whose RAM is finite too (Note [Host budget]).

#include "search/search_state.h"

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "search/sentences.h"

namespace oomtune::search_detail {

// Note [Host budget]
// Rationale: optimizer offload trades device memory for host memory: the
// fp32 master weights, their gradients and the optimizer state (AdamW: 4 +
// 4 + 8 = 16 bytes per trainable parameter, pinned on a GPU machine;
// offload_host_bytes_per_parameter in strategies/training_config.h, as
// DeepSpeed counts it).
// A 7B model needs 112 GB there: a configuration that fits the GPU and not
// the host's RAM fails to pin its buffers or is killed by the OS, after
// the search called it the answer (USERS.md: users want the host's limits
// noted).
// Approach: with a host budget (job spec host_budget, --host-budget; a
// CUDA job without one takes this machine's memory, default_host_budget in
// job/job_spec.h; the job's headroom applies),
// - offload is not tried where its state alone, counted from the plain
//   probes' trainable parameters, exceeds the usable host budget: not
//   probed, not in the rescue's least-memory combination, a note says why;
// - a trial whose measured host peak (ProbeReport::host_peak_bytes: the
//   batch, offload's buffers and its update's temporaries; pinned memory
//   on CUDA) exceeds it ran out of host memory: a probe's strategy drops,
//   a verification does not fit;
// - a host budget that a configuration without offload exceeds (its
//   inputs alone) is an input error: no strategy lowers it.
// Limitations: the trials hold their inputs on the host and nothing of a
// data loader (its workers, prefetched and pinned batches) or of the
// Python process: leave room for them in the budget. DeepSpeed's CPU Adam
// updates in place where oomtune's host update may allocate a temporary
// per parameter: the measured peak is what oomtune's own step held.

std::optional<int64_t> Search::offload_host_bytes(int64_t trainable_parameters) const {
  if (trainable_parameters <= 0) return std::nullopt;  // not measured: the trials will say
  return trainable_parameters * offload_host_bytes_per_parameter(job_base_.optimizer, job_.optimizer.momentum > 0);
}

bool Search::offload_fits_host(int64_t trainable_parameters) {
  const std::optional<int64_t> usable = job_.usable_host_budget_bytes();
  const std::optional<int64_t> needs = offload_host_bytes(trainable_parameters);
  if (!usable || !needs || *needs <= *usable) return true;
  if (!offload_barred_noted_) {
    result_.notes.push_back(fmt::format(
        "optimizer offload: not tried: its fp32 master weights, gradients and {} state for {} trainable parameters "
        "take {} of host memory, over the usable host budget ({}, after {:.0f} % headroom)",
        job_.optimizer.kind, trainable_parameters, format_bytes(*needs), format_bytes(*usable), 100 * job_.headroom));
    offload_barred_noted_ = true;
  }
  return false;
}

bool Search::over_host_budget(const ProbeReport& r) const {
  const std::optional<int64_t> usable = job_.usable_host_budget_bytes();
  return usable && r.host_peak_bytes > *usable;
}

void Search::hold_to_host_budget(ProbeReport& r, const TrainingConfig& config) const {
  if (r.outcome != TrialOutcome::kOk || !over_host_budget(r)) return;
  // Without offload the host holds the trial's inputs before they are
  // copied: a budget below them is the job's error, which no strategy the
  // search turns on lowers.
  if (!config.offload_optimizer)
    throw InputError(fmt::format(
        "{}: host_budget: the usable host budget ({}) is below the {} that {} held on the host without optimizer "
        "offload (its inputs, before they are copied to the device): raise it or leave it out",
        job_.spec_path.empty() ? job_.model_path : job_.spec_path, format_bytes(*job_.usable_host_budget_bytes()),
        format_bytes(r.host_peak_bytes), describe(config)));
  r.outcome = TrialOutcome::kOutOfMemory;
  r.phase_at_failure.reset();
  r.message = fmt::format("host memory: the trial held {} on the host at its peak, over the usable host budget ({})",
                          format_bytes(r.host_peak_bytes), format_bytes(*job_.usable_host_budget_bytes()));
}

}  // namespace oomtune::search_detail
