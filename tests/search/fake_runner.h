#pragma once
// A fake device for the search tests: memory and time curves known exactly,
// so every expectation is computed by hand from the curve.

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "common/byte_size.h"  // kMiB
#include "search/search.h"

namespace oomtune {

/// A model with P parameters (fp32) and A bytes of activations per sample:
///   plain peak(b)  = 16 P + 2 MiB + A b          (params 4 P, grads 4 P, AdamW 8 P)
///   checkpointing  : A -> A / 4,   time x 1.6 (all 4 blocks; n blocks: n / 4 of that)
///   8-bit AdamW    : 8 P -> 2 P,   time x 1.1
///   offload        : 8 P -> 0,     time x offload_time_factor (1.5)
///   bf16           : A -> A / 2,   time x 0.9 (autocast and bf16_params alike)
///   accumulation   : + 4 P (gradients alive through later micro-batches)
///   bf16_params    : with bf16_parameters_stored, weights and gradients
///                    2 P each and an fp32 master copy 4 P beside the
///                    optimizer state (offloaded with it); else as fp32
///   time(b)        = 0.01 + 0.002 b seconds per micro-batch (+ the spill below)
class FakeRunner : public TrialRunner {
 public:
  int64_t parameters = 4 * kMiB / 4;  // 4 MiB of fp32 parameters
  int64_t activation_per_sample = 8 * kMiB;
  int64_t extra_at_full_batch = 0;  // a surprise the probes cannot see
  double offload_time_factor = 1.5;
  double eight_bit_time_factor = 1.1;
  int64_t adafactor_state_bytes = 256 * 1024;  // a row and a column per matrix: far below 8-bit's 2 P
  double checkpoint_time_cost = 0.6;           // all 4 blocks: time x (1 + this); below 0 models timing noise
  double time_scale = 1;                       // every time above times this (a model of microseconds per step)
  // Each sample of a micro-batch beyond spill_above costs this many seconds
  // more (a cache the larger micro-batches spill): a time curve that bends
  // where the small probes cannot see it. 0: the line above.
  double spill_seconds_per_sample = 0;
  int64_t spill_above = 16;
  // The optimizer step, once per global batch (Note [Step time]): plain's
  // seconds, and what 8-bit AdamW and offload multiply them by. 0: the
  // probes report no optimizer time, as before it was measured.
  double optimizer_seconds = 0;
  // bf16's factors on a micro-batch's fixed seconds (0.01 s: casts add to
  // them) and on its seconds per sample (0.002 s).
  double bf16_intercept_factor = 0.9;
  double bf16_per_sample_factor = 0.9;
  double eight_bit_optimizer_factor = 1;
  double offload_optimizer_factor = 1;
  // Probes with no strategy run this much slower (timing noise); verifications do not.
  double plain_probe_time_factor = 1;
  // And plain probes at these micro-batches this much slower again.
  std::map<int64_t, double> plain_probe_time_factor_at;
  // Probes whose peak is above this run out of memory in forward (the probes'
  // RAM guard, a multiple of the budget in oomtune); 0: no guard.
  int64_t probe_budget = 0;
  // Probes whose step takes longer than this many seconds run past the
  // trial timeout (a slow model, or a timeout set too short); 0: none do.
  double probe_timeout_seconds = 0;
  // Verification runs whose global batch takes longer than this time out.
  double verify_timeout_seconds = 0;
  // Bytes a verification's later steps add to its peak, which neither a
  // probe nor a meta run sees (DESIGN.md: fitting two steps is not fitting).
  int64_t verification_growth = 0;
  // The share of a micro-batch's activations still live after forward (the
  // probe's retained activations); the rest are backward's temporaries.
  double retained_fraction = 1;
  // Host memory (ProbeReport::host_peak_bytes): the batch, and with offload
  // its fp32 masters, gradients and AdamW state, 16 bytes per parameter
  // (strategies/master_weights.h), plus what its host update allocates, and
  // what a verification's later steps add.
  int64_t host_batch_bytes = 0;
  int64_t offload_host_extra = 0;
  int64_t verification_host_growth = 0;
  bool autocast_crashes = false;        // bf16 autocast dies by SIGSEGV (bf16_params runs)
  bool bf16_parameters_stored = false;  // bf16_params stores 2-byte weights and gradients (see above)
  int64_t fails_at_or_below = 0;        // micro-batches this small raise an error (BatchNorm at 1)
  // Micro-batches this large or larger raise an error that is not about
  // memory (a CUDA kernel's grid past its limit: "invalid configuration
  // argument"); 0: none do.
  int64_t fails_at_or_above = 0;
  // When set, every run fails in the loss with this error about the
  // user's input, the same at every micro-batch (`output` unset for a
  // model that returns a dict). "{micro_batch}" in it is replaced by the
  // run's micro-batch, as a forward's error names its inputs' shapes.
  std::string loss_input_error;
  // The classes of blocks.0 .. blocks.3; a checkpointed block of
  // `refusing_class` modifies its input in place, which the recompute
  // operator refuses at the first forward.
  std::vector<std::string> block_classes = {"__torch__.Encoder", "__torch__.Encoder", "__torch__.Decoder",
                                            "__torch__.Decoder"};
  std::string refusing_class;
  int64_t global_batch = 32;
  // The meta device (TrialRunner::measure_on_meta): off by default, as in a
  // runner without one. It measures the true peak of a configuration on
  // the global batch, no budget, no time; configurations in bf16 fail
  // there when meta_refuses_bf16 (libtorch has no meta autocast), every one
  // with meta_error when that is set (a libtorch before 2.0).
  bool meta = false;
  // When set, each meta run also predicts what a CUDA caching allocator
  // reserves: its peak plus these bytes (the workspaces and cached blocks
  // a real run's ReservedPrediction holds).
  std::optional<int64_t> meta_reserved_extra;
  // The cuBLAS workspaces each meta run reports beside its peak (a CUDA
  // target's; 0: none), which a GPU run's allocated bytes hold.
  int64_t meta_workspace_bytes = 0;
  // When set, the device is a GPU: each probe and verification measures its
  // caching allocator's reserved peak, its tensors' peak plus these bytes,
  // and a verification's cap refuses past the budget what it reserves
  // (probes/cuda_budget.h).
  std::optional<int64_t> gpu_reserved_extra;
  bool meta_refuses_bf16 = false;
  std::string meta_error;
  // When set, the probes run on the meta device too (a job on device =
  // "meta"): each reports no step time (StepTiming::measured false).
  bool probes_on_meta = false;
  int probes = 0;
  int verifications = 0;
  int meta_runs = 0;
  double usable_budget = 0;

  ProbeReport probe(const TrainingConfig& c) override {
    ++probes;
    ProbeReport r = run(c, c.micro_batch, false);
    if (probes_on_meta) {
      r.timing = {};
      r.timing.measured = false;
      r.samples_per_second = 0;
    }
    return r;
  }
  ProbeReport verify(const TrainingConfig& c) override {
    ++verifications;
    return run(c, global_batch, true);
  }
  std::optional<ProbeReport> measure_on_meta(const TrainingConfig& c) override {
    if (!meta) return std::nullopt;
    ++meta_runs;
    const int64_t guard = probe_budget, size_limit = fails_at_or_above;
    probe_budget = 0;
    fails_at_or_above = 0;  // a device kernel's limit: meta runs no kernel
    ProbeReport r = run(c, global_batch, false);
    probe_budget = guard;
    fails_at_or_above = size_limit;
    r.timing = {};
    r.samples_per_second = 0;
    r.steps_run = 2;
    r.measured_reserved.reset();  // no allocator measures on meta
    if (meta_workspace_bytes > 0) {
      r.workspaces = WorkspaceRecord{};
      r.workspaces->cublas_bytes = meta_workspace_bytes;
      r.workspaces->cublas_workspaces = 1;
    }
    if (meta_reserved_extra && r.outcome == TrialOutcome::kOk) {
      r.reserved = ReservedPrediction{};
      r.reserved->peak_reserved_bytes = r.peak_bytes + *meta_reserved_extra;
    }
    const std::string error = !meta_error.empty() ? meta_error
                              : meta_refuses_bf16 && c.precision == Precision::kBf16
                                  ? "autocast: no meta kernels for bfloat16"
                                  : "";
    if (!error.empty() && r.outcome == TrialOutcome::kOk) {
      r.outcome = TrialOutcome::kError;
      r.phase_at_failure = Phase::kForward;
      r.message = error;
    }
    return r;
  }

  // The model has 4 blocks; checkpointing n of them saves n / 4 of the
  // checkpointing saving and costs n / 4 of its time.
  static double checkpointed_fraction(const TrainingConfig& c) {
    return static_cast<double>(checkpointed(c).size()) / 4;
  }

  static std::vector<std::string> checkpointed(const TrainingConfig& c) {
    const std::vector<std::string> blocks = {"blocks.0", "blocks.1", "blocks.2", "blocks.3"};
    switch (c.checkpoint.mode) {
      case CheckpointPlan::Mode::kAll:
        return blocks;
      case CheckpointPlan::Mode::kFirstN:
        return {blocks.begin(), blocks.begin() + c.checkpoint.first_n};
      case CheckpointPlan::Mode::kPaths:
        return c.checkpoint.paths;
      default:
        return {};
    }
  }

  int64_t activation_bytes(const TrainingConfig& c) const {
    double a = static_cast<double>(activation_per_sample);
    a *= 1 - 0.75 * checkpointed_fraction(c);
    if (c.precision != Precision::kFp32) a /= 2;
    return static_cast<int64_t>(a) * c.micro_batch;
  }

  // Bytes of the weights (and of the gradients): 4 P, or 2 P as stored bf16 parameters.
  int64_t weight_bytes(const TrainingConfig& c) const {
    return bf16_parameters_stored && c.precision == Precision::kBf16Params ? 2 * parameters : 4 * parameters;
  }

  int64_t true_peak(const TrainingConfig& c) const {
    int64_t state = 8 * parameters;
    if (c.optimizer == OptimizerKind::kAdamW8bit) state = 2 * parameters;
    if (c.optimizer == OptimizerKind::kAdafactor) state = adafactor_state_bytes;
    if (weight_bytes(c) < 4 * parameters) state += 4 * parameters;  // the fp32 master copy
    if (c.offload_optimizer) state = 0;
    double a = static_cast<double>(activation_per_sample);
    a *= 1 - 0.75 * checkpointed_fraction(c);
    if (c.precision != Precision::kFp32) a /= 2;
    int64_t peak = 2 * weight_bytes(c) + state + 2 * kMiB + static_cast<int64_t>(a) * c.micro_batch;
    if (c.micro_batch == global_batch) peak += extra_at_full_batch;
    return peak;
  }

  // With accumulation the gradients (4 P) stay alive through the next
  // micro-batch, on top of that micro-batch's own peak.
  int64_t true_peak(const TrainingConfig& c, int64_t global) const {
    return true_peak(c) + (global > c.micro_batch ? weight_bytes(c) : 0);
  }

  double true_seconds(const TrainingConfig& c) const {
    const bool bf16 = c.precision != Precision::kFp32;
    double t = 0.01 * (bf16 ? bf16_intercept_factor : 1) +
               0.002 * static_cast<double>(c.micro_batch) * (bf16 ? bf16_per_sample_factor : 1) +
               spill_seconds_per_sample * static_cast<double>(std::max<int64_t>(0, c.micro_batch - spill_above));
    t *= 1 + checkpoint_time_cost * checkpointed_fraction(c);
    if (c.optimizer == OptimizerKind::kAdamW8bit) t *= eight_bit_time_factor;
    if (c.offload_optimizer) t *= offload_time_factor;
    return t * time_scale;
  }

  double true_optimizer_seconds(const TrainingConfig& c) const {
    double t = optimizer_seconds;
    if (c.optimizer == OptimizerKind::kAdamW8bit) t *= eight_bit_optimizer_factor;
    if (c.offload_optimizer) t *= offload_optimizer_factor;
    return t * time_scale;
  }

 private:
  ProbeReport run(const TrainingConfig& c, int64_t global, bool enforce) {
    ProbeReport r;
    r.config = to_string(c);
    r.micro_batch = c.micro_batch;
    r.global_batch = global;
    r.parameter_count = parameters;
    r.static_memory.parameter_bytes = weight_bytes(c);
    r.static_memory.gradient_bytes = weight_bytes(c);
    r.peak_bytes = true_peak(c, global) + (enforce ? verification_growth : 0);
    r.host_peak_bytes = host_batch_bytes + (c.offload_optimizer ? 16 * parameters + offload_host_extra : 0) +
                        (enforce ? verification_host_growth : 0);
    // Backward holds the peak; forward is everything but the gradients; the
    // optimizer phase holds no activations.
    r.phases[static_cast<std::size_t>(Phase::kBackward)].peak_bytes = r.peak_bytes;
    r.phases[static_cast<std::size_t>(Phase::kForward)].peak_bytes = r.peak_bytes - weight_bytes(c);
    r.phases[static_cast<std::size_t>(Phase::kLoss)].peak_bytes = r.peak_bytes - weight_bytes(c);
    r.phases[static_cast<std::size_t>(Phase::kOptimizer)].peak_bytes =
        true_peak(c, c.micro_batch) - activation_bytes(c);
    r.retained_activation_bytes = static_cast<int64_t>(retained_fraction * static_cast<double>(activation_bytes(c)));
    r.checkpointed_blocks = checkpointed(c);
    for (const std::string& path : r.checkpointed_blocks) {
      if (block_classes.at(static_cast<std::size_t>(path.back() - '0')) != refusing_class) continue;
      r.outcome = TrialOutcome::kError;
      r.phase_at_failure = Phase::kForward;
      r.message = "oomtune::checkpoint: forward of " + refusing_class + " modified its argument x in place";
      r.refused_checkpoint_class = refusing_class;
      for (const std::string& other : r.checkpointed_blocks)
        if (block_classes.at(static_cast<std::size_t>(other.back() - '0')) != refusing_class)
          r.other_checkpointed_blocks.push_back(other);
      return r;
    }
    if (autocast_crashes && c.precision == Precision::kBf16) {
      r.outcome = TrialOutcome::kCrashed;
      r.message = "crashed: SIGSEGV during forward";
      return r;
    }
    if (!loss_input_error.empty()) {
      r.outcome = TrialOutcome::kError;
      r.input_error = true;
      r.phase_at_failure = Phase::kLoss;
      r.message = loss_input_error;
      static const std::string kMicroBatch = "{micro_batch}";
      for (auto at = r.message.find(kMicroBatch); at != std::string::npos; at = r.message.find(kMicroBatch, at))
        r.message.replace(at, kMicroBatch.size(), std::to_string(c.micro_batch));
      return r;
    }
    if (c.micro_batch <= fails_at_or_below) {
      r.outcome = TrialOutcome::kError;
      r.phase_at_failure = Phase::kForward;
      r.message = "Expected more than 1 value per channel when training";
      return r;
    }
    if (fails_at_or_above > 0 && c.micro_batch >= fails_at_or_above) {
      r.outcome = TrialOutcome::kError;
      r.phase_at_failure = Phase::kForward;
      r.message = "CUDA error: invalid configuration argument";
      return r;
    }
    if (gpu_reserved_extra) {
      r.measured_reserved = MeasuredReserved{};
      r.measured_reserved->peak_reserved_bytes = r.peak_bytes + *gpu_reserved_extra;
    }
    const int64_t capped = gpu_reserved_extra ? r.peak_bytes + *gpu_reserved_extra : r.peak_bytes;
    if ((enforce && capped > usable_budget) || (!enforce && probe_budget > 0 && r.peak_bytes > probe_budget)) {
      r.outcome = TrialOutcome::kOutOfMemory;
      r.phase_at_failure = Phase::kForward;
      r.message = "oomtune budget: tried to allocate";
      return r;
    }
    const int64_t steps = (global + c.micro_batch - 1) / c.micro_batch;
    const double optimizer = true_optimizer_seconds(c);
    const double seconds = true_seconds(c) * static_cast<double>(steps) + optimizer;
    const double limit = enforce ? verify_timeout_seconds : probe_timeout_seconds;
    if (limit > 0 && seconds > limit) {
      r.outcome = TrialOutcome::kTimeout;
      r.message = "timeout: no result after 600 s";
      return r;
    }
    r.timing.steady_step_seconds = seconds;
    r.timing.steady_optimizer_seconds = optimizer;
    const bool plain = checkpointed(c).empty() && c.optimizer == OptimizerKind::kAdamW && !c.offload_optimizer &&
                       c.precision == Precision::kFp32;
    if (!enforce && plain) {
      r.timing.steady_step_seconds *= plain_probe_time_factor;
      if (const auto at = plain_probe_time_factor_at.find(c.micro_batch); at != plain_probe_time_factor_at.end())
        r.timing.steady_step_seconds *= at->second;
    }
    r.samples_per_second = static_cast<double>(global) / r.timing.steady_step_seconds;
    r.steps_run = enforce ? 20 : 3;
    return r;
  }
};

inline JobSpec job_with_budget(int64_t budget_bytes) {
  JobSpec job;
  job.model_path = "fake.pt";
  job.global_batch = 32;
  job.budget_bytes = budget_bytes;
  job.headroom = 0;
  job.optimizer.kind = "adamw";
  return job;
}

inline SearchResult run_search(
    FakeRunner& fake, const JobSpec& job, const SearchOptions& options = {},
    const std::function<void(const std::string&)>& progress = [](const std::string&) {}) {
  fake.usable_budget = static_cast<double>(*job.usable_budget_bytes());
  return search(job, fake, options, progress);
}

/// True when one of the search's notes contains `part`.
inline bool has_note(const SearchResult& result, const std::string& part) {
  return std::any_of(result.notes.begin(), result.notes.end(),
                     [&](const std::string& note) { return note.find(part) != std::string::npos; });
}

// A base that runs at one micro-batch only: activations 24 MiB per sample
// and guard = budget = kOnePointBudget (a GPU whose whole memory is the
// budget). Plain needs 42 MiB at 1; checkpointing (18 + 6 b MiB) runs at 1
// (24 MiB) and is rescued, but runs out at 4 (42) and 2 (30).
inline constexpr int64_t kOnePointBudget = 29 * kMiB;
inline FakeRunner one_point_base_fake() {
  FakeRunner fake;
  fake.activation_per_sample = 24 * kMiB;
  fake.probe_budget = kOnePointBudget;
  return fake;
}

// With the defaults (P = 1 Mi parameters, A = 8 MiB):
// plain peak(b) = 16 MiB + 2 MiB + 8 MiB b.
inline int64_t plain_peak(int64_t b) { return 18 * kMiB + 8 * kMiB * b; }

}  // namespace oomtune
