#pragma once
// ProbeReport: what one trial measured, as a plain record. A trial runs in a
// child process and hands its ProbeReport to the parent as JSON; the search
// and the reports read only these records (DESIGN.md), so they are testable
// from recorded reports without running a model. No libtorch.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "probes/attention_model.h"
#include "probes/dropout_record.h"
#include "probes/largest_block.h"
#include "probes/memory_records.h"

namespace oomtune {

/// How a trial ended. Every outcome is data: none of them ends the search.
enum class TrialOutcome {
  kOk,           ///< the steps ran
  kOutOfMemory,  ///< an allocation passed the budget
  kCrashed,      ///< the child process died by a signal
  kTimeout,      ///< the child process ran past the trial timeout
  kError,        ///< the configuration could not run (message says why)
};

/// "ok", "out_of_memory", "crashed", "timeout", "error".
std::string to_string(TrialOutcome outcome);

/// How a trial held its numbers (strategies/mixed_precision.h picks it from
/// the configuration's precision).
enum class PrecisionForm {
  kUnknown,         ///< not recorded (a report of a trial that did not start)
  kFp32,            ///< fp32 throughout
  kAutocast,        ///< fp32 weights, forward and backward under bf16 or fp16 autocast
  kHalfParameters,  ///< bf16 weights and gradients, fp32 master weights in the optimizer (bf16 fallback)
};

/// "fp32", "autocast", "bf16 parameters, fp32 master"; "" for kUnknown.
std::string to_string(PrecisionForm form);

struct ProbeReport;

/// The outcome, the phase it happened in and its message in one phrase,
/// each said once: "crashed: SIGSEGV during forward" (the message names
/// both), "out_of_memory during backward: <message>", "ok"; then, where a
/// GPU trial wrote its snapshot, " (snapshot: oomtune diagnose PATH)".
std::string outcome_text(const ProbeReport& report);

/// The kernel-scratch line of the probe and autotune reports: "13.19 KiB at
/// most at once, by AddmmBackward0 > aten::mm (1376 allocations); CPU only,
/// not counted toward a CUDA prediction; with it the CPU held 5.52 MiB at
/// most", and the raw bytes counted as tensors where there were any. Empty
/// when there was neither.
std::string kernel_scratch_text(const KernelScratch& scratch);

/// The cuDNN line of the probe report: "81 convolutions (81 backward) and
/// 49 batch norms a step: on CUDA each call may take a workspace that cuDNN
/// sizes at run time (batch norm a reserve space too), not counted here"
/// (probes/memory_tracker.cpp, Note [cuDNN calls]).
std::string cudnn_text(const CudnnCalls& calls);

/// Memory that lives for the whole run, measured on the tracker.
struct StaticMemory {
  int64_t parameter_bytes = 0;        // SUM: trainable parameter storages
  int64_t buffer_bytes = 0;           // SUM: other storages alive after load (buffers, constants)
  int64_t gradient_bytes = 0;         // SUM: .grad storages after backward
  int64_t optimizer_state_bytes = 0;  // SUM: device bytes the first optimizer step left alive
  int64_t optimizer_host_bytes = 0;   // SUM: host bytes the optimizer holds (offload)
  // SUM: frozen parameter storages (the job's trainable / frozen globs,
  // job/parameter_selection.h): no gradient, no optimizer state; in no
  // field above.
  int64_t frozen_parameter_bytes = 0;
  // Trainable parameters the step gave no gradient (their forward does not
  // use them, as a ViT's mask token without a mask): their names, in module
  // order, and their elements. They hold no gradient and, with AdamW, no
  // state, as in eager PyTorch, so the analytic counts are above the
  // measured ones by their bytes.
  std::vector<std::string> without_gradient;
  int64_t without_gradient_count = 0;  // COUNT: elements
};

/// Step timing of a trial.
struct StepTiming {
  int64_t warmup_steps = 0;          // COUNT: steps discarded (allocator and library warm-up)
  double warmup_seconds = 0;         // seconds of those steps
  std::vector<double> step_seconds;  // seconds of each timed step, in order
  // Median of step_seconds; for a job with a length distribution the mean
  // of the drawn steps' (step_seconds[1..]), Note [Variable-length steps].
  double steady_step_seconds = 0;
  // Seconds of each timed step's optimizer phase (from the optimizer hook to
  // the step's end, the device synchronized at both on CUDA), and their
  // median: the part of a step that runs once per optimizer step, however
  // many micro-batches it accumulates (0 in reports that did not time it;
  // with a length distribution the mean, as steady_step_seconds).
  std::vector<double> optimizer_seconds;
  double steady_optimizer_seconds = 0;
  bool steady = false;      // consecutive timed steps agreed within the tolerance (not judged, false, at drawn lengths)
  double tolerance = 0.15;  // relative: |t_i - t_{i-1}| / median
  // False for a trial on the meta device: its kernels compute shapes only,
  // so its seconds say nothing about a step's time; every field above is
  // then empty or zero.
  bool measured = true;
};

/// Prediction of the CUDA caching allocator's reserved bytes from the
/// event stream (allocsim/caching_allocator_sim.h), and whether the
/// allocator serves the step when capped at the budget.
///
/// The figures are those of an uncapped replay: what
/// torch.cuda.max_memory_reserved reads after a run with room to spare. A
/// replay capped at the budget (set_per_process_memory_fraction) runs only
/// when that peak passes the budget: PyTorch then frees its cached
/// segments and retries before it fails (CUDACachingAllocator.cpp, malloc:
/// release_cached_blocks), so the capped run may still serve every request,
/// with flushes (Note [The budget on a CUDA target], trial_runner.cpp).
struct ReservedPrediction {
  int64_t peak_reserved_bytes = 0;             // SUM: uncapped
  int64_t reserved_minus_allocated_bytes = 0;  // SUM: at the reserved peak
  int64_t largest_free_block_bytes = 0;        // SUM: at the reserved peak
  int64_t segment_allocations = 0;             // COUNT: cudaMalloc calls
  bool fits_budget = true;                     // capped at budget_bytes, every request was served
  int64_t budget_bytes = 0;                    // SUM: the cap (the job's usable budget); 0: none given
  int64_t cache_flushes = 0;                   // COUNT: flushes (num_alloc_retries) the capped replay made
  int64_t failed_request_bytes = 0;            // SIZE: the capped replay's first request it could not serve (0: none)
  std::string failed_op;                       // its operator ("aten::mm"), "" when unknown
  Phase failed_phase = Phase::kLoad;           // the phase it was made in
};

/// The CUDA verdict on a budget for a trial that ran on the CPU or on
/// meta: "220.00 MiB reserved (predicted), within the usable 243.20 MiB";
/// over it, how the capped caching allocator fares: "... over the usable
/// 142.50 MiB: capped there the caching allocator runs out of memory at a
/// 8.00 MiB request by aten::mm during backward", or "... serves every
/// request by freeing its cache 3 times (each flush synchronizes the
/// device)". Empty without a cap.
std::string cuda_budget_text(const ReservedPrediction& reserved);

/// The optimizer a trial ran and what its step allocated beyond its state:
/// the probe's named line for the optimizer implementation (strategies/
/// eager_adamw.h, Note [Eager AdamW]).
struct OptimizerRecord {
  std::string name;  // "adamw", "sgd", "adamw8bit", "adafactor" (to_string(OptimizerKind)); "" = not recorded
  // The torch.optim implementation the trial ran, as the user's eager
  // training does: "foreach", "fused", "single_tensor" (job/
  // optimizer_implementation.h); "" for oomtune's own 8-bit AdamW and
  // Adafactor and for offload's libtorch loop on the host, which are not
  // foreach-modelled.
  std::string implementation;
  // SUM: the measured step's optimizer-phase peak above the phase's start
  // (parameters, gradients and state): the step's temporaries (foreach:
  // the whole-list ones; bf16_params: with the masters' fp32 gradients).
  int64_t temporary_bytes = 0;
  // The job's gradient clipping before each update, clip_grad_norm_'s
  // max_norm (strategies/gradient_clipping.h); 0 without. Its scalars and
  // CUDA's foreach-norm scratch are in the optimizer phase's bytes.
  double max_grad_norm = 0;
};

/// The optimizer line of the probe report: "adamw, foreach: 1.25 MiB of
/// temporaries above its state at the step's peak (whole-list:
/// torch._foreach_* over every parameter at once; torch.optim's default on
/// CUDA)"; fused says "one fused kernel in place", single_tensor "one
/// parameter's at a time", an optimizer that is not eager torch.optim "not
/// foreach-modelled"; with gradient clipping it adds "; gradients clipped
/// to norm 1 before the update (clip_grad_norm_)". Empty when not recorded.
std::string optimizer_text(const OptimizerRecord& optimizer);

/// Everything one trial measured.
struct ProbeReport {
  std::string config;                  // to_string(TrainingConfig)
  int64_t micro_batch = 0;             // COUNT
  int64_t accumulation_steps = 0;      // COUNT
  int64_t global_batch = 0;            // COUNT
  int64_t parameter_count = 0;         // COUNT: trainable parameter elements
  int64_t frozen_parameter_count = 0;  // COUNT: frozen parameter elements (job/parameter_selection.h)
  TrialOutcome outcome = TrialOutcome::kOk;
  std::string message;                    // why it did not run (empty when ok)
  bool input_error = false;               // kError caused by the user's input (model file, job, config): exit code 2
  std::optional<Phase> phase_at_failure;  // where an OOM, crash or error happened, if known (JSON: its name, "")
  std::array<PhaseMemory, kNumPhases> phases{};  // of the measured step
  int64_t peak_bytes = 0;                        // SUM: device peak of the measured step
  // SUM: host-pool peak of the steps after the warm-up, on a GPU with the
  // pinned host memory held then (optimizer offload's buffers); what a host
  // budget is compared with (search/host_budget.cpp).
  int64_t host_peak_bytes = 0;
  int64_t steps_run = 0;  // COUNT: optimizer steps completed
  // COUNT: fp16 steps whose update GradScaler skipped for inf/NaN gradients,
  // the warm-up's included (trial/trial_runner.cpp, Note [Skipped fp16
  // steps]); 0 for every other precision and on meta.
  int64_t skipped_steps = 0;
  bool measured_step_skipped = false;  // fp16: the measured step made no update (its optimizer phase holds none)
  // COUNT: tokens, the "seq" length of each step begun, from the warm-up on
  // (step k at [k - 1]; one more than steps_run where a step failed), for a
  // job with a length distribution (JobSpec::seq_lengths): steps 1 and 2 at
  // its max, step k >= 3 at draw_lengths(distribution, n, seed)[k - 3]
  // (trial/trial_runner.cpp, Note [Variable-length steps]). Empty for any
  // other job (JSON: the key absent).
  std::vector<int64_t> step_lengths;
  // SUM: the device peak of each step after the warm-up (step k at [k - 2]),
  // from the recorded events: for a job with a length distribution and
  // events recorded (TrialOptions::record_events); else empty (JSON: absent).
  std::vector<int64_t> step_peak_bytes;
  StaticMemory static_memory;
  OptimizerRecord optimizer;
  int64_t retained_activation_bytes = 0;  // SUM: live after forward+loss minus live before forward
  // Of the measured step's backward, with events recorded (TrialOptions::
  // record_events) and one micro-batch per step; else zero.
  BackwardActivationPeak backward_activation_peak;
  // Of the measured step, with events recorded (TrialOptions::
  // record_events); else empty (JSON: absent).
  PeakComposition peak_composition;
  LargestAllocation largest;
  // Of every step after the warm-up: CPU kernels' own bytes, in no field
  // above (probes/memory_tracker.cpp, Note [Kernel scratch]).
  KernelScratch kernel_scratch;
  StepTiming timing;
  double samples_per_second = 0;  // global batch / steady step seconds
  std::optional<ReservedPrediction> reserved;
  // On a GPU: what the caching allocator itself reserved, beside the
  // prediction above from the same allocations (DevicePhaseMeter).
  std::optional<MeasuredReserved> measured_reserved;
  // On a GPU, after the trial (out of memory or not): the largest block the
  // allocator could still hand out, beside the device's free bytes
  // (probes/largest_block.h).
  std::optional<AllocatableRecord> allocatable;
  // On a GPU, a trial that ran out of memory with TrialOptions::
  // snapshot_path: the allocator's snapshot written there, for `oomtune
  // diagnose` ("" when none was written).
  std::string snapshot_path;
  std::vector<std::string> checkpointed_blocks;
  // A kError where the recompute operator refused a checkpointed block
  // (strategies/recompute_op.h): the block's class ("__torch__.Decoder"),
  // and the checkpointed blocks of the other classes, which a retry may
  // checkpoint alone. Empty otherwise.
  std::string refused_checkpoint_class;
  std::vector<std::string> other_checkpointed_blocks;
  std::string torch_version;
  bool optimizing_executor = false;
  PrecisionForm precision_form = PrecisionForm::kUnknown;  // JSON: to_string(PrecisionForm)
  // Whose op lists a CPU or meta trial's autocast cast by: "cuda" (CUDA's,
  // emulated, as the GPU it answers for; session/cuda_autocast.h) or "cpu"
  // (the CPU's own, on a libtorch without CUDA's lists); empty without
  // autocast or on a GPU.
  std::string autocast_lists;
  // The measured step's scaled_dot_product_attention calls as the CUDA
  // target runs them (probes/attention_model.h); absent when the model has
  // none.
  std::optional<AttentionRecord> attention;
  // The measured step's training-mode dropout calls as CUDA runs them
  // (probes/dropout_record.h); absent when the step made none.
  std::optional<DropoutRecord> dropout;
  // Library workspaces of a CUDA run for that target, not in any peak
  // above; absent where neither attention nor the meta device asked for it.
  std::optional<WorkspaceRecord> workspaces;
  // On the CPU and on meta: the measured step's convolutions and batch
  // norms, whose cuDNN workspaces on the CUDA target are not counted;
  // absent when it made none, and on a GPU (its allocator holds them).
  std::optional<CudnnCalls> cudnn;
};

/// The lengths a trial's drawn steps (k >= 3) ran at (step_lengths from
/// [2] on): how many, the shortest, the longest and their mean (tokens).
struct DrawnLengths {
  std::size_t steps = 0;  // COUNT
  int64_t shortest = 0;   // COUNT: tokens
  int64_t longest = 0;    // COUNT: tokens
  double mean = 0;        // tokens
};

/// The drawn steps of `report`; nullopt when it ran none (fewer than three
/// step_lengths: no distribution, or it failed before step 3).
std::optional<DrawnLengths> drawn_lengths(const ProbeReport& report);

/// JSON with units in the key names (`peak_bytes`, `seconds`).
nlohmann::json to_json(const ProbeReport& report);
/// Reads what to_json wrote. Throws InputError naming the key on a bad record.
ProbeReport probe_report_from_json(const nlohmann::json& json);

}  // namespace oomtune
