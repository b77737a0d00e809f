#pragma once
// The search: walk the decision tree (activation checkpointing → micro-batch
// size → gradient accumulation → 8-bit optimizer → CPU offload → bf16),
// predict each node's peak memory and time from probe trials, then verify
// the fastest predicted configurations by real runs and choose the fastest
// verified one.
//
// Rules:
// - Probes: the plain configuration at up to three micro-batch sizes
//   (G/8, G/4, G/2 of the global batch G), each strategy at one or two.
//   Probes measure; they are not the answer (the budget there is a RAM
//   guard only). A plain probe that runs out of memory or past the trial
//   timeout ends the walk up (a larger micro-batch needs more of both);
//   when fewer than two sizes ran, the walk goes down from the smallest,
//   halving to the job's minimum, until two have run (if the smaller ones
//   fail for their size, the second is bisected between the one that ran
//   and the smallest that failed for memory or time), so a budget too tight
//   for G/8 still gets lines with a slope and a "nothing fits" answer or a
//   small micro-batch. When nothing ran before a timeout, it goes up from
//   the job's minimum instead and stops at the next timeout: each costs
//   the whole trial_timeout. A strategy whose larger probe fails for memory
//   or time after the smaller ran is fitted to the smaller with the plain
//   slope (over-predicting larger micro-batches), not dropped.
// - Runs out of memory: a verification over the budget rules its
//   configuration out at that micro-batch and above; the tree is walked
//   again one size down, up to max_verifications more runs (walk.cpp, Note
//   [Verifications that run out of memory]).
// - Size errors: an error (not memory, not the user's input) at a
//   micro-batch above every one that ran keeps the search below it; a
//   verification's walks the tree again (fit.cpp, Note [An error that comes
//   with the size]).
// - Parameters alone: every strategy keeps the weights on the device, so
//   parameters whose cheapest storage the job allows (bf16 parameters, 2
//   bytes each, when bf16 is allowed) exceed the usable budget end the
//   search before the strategies are probed (but checkpointing, once, for
//   the ZeRO table's activations): nothing fits one GPU
//   (SearchResult::parameters_alone, exit kExitNothingFits and the
//   ZeRO/FSDP table), not a bad input. Where only the bf16 parameters fit,
//   bf16 is tried as bf16 parameters from the start (fit.cpp, Note
//   [Parameters alone]).
// - Rescue: when plain runs out of memory at every micro-batch down to the
//   smallest, the strategies are probed there, the least-memory combination
//   first (checkpointing all blocks + optimizer offload + bf16 when
//   allowed): out of memory too is a measured "nothing fits"
//   (SearchResult::least_memory_failure); else the simplest combination
//   that runs replaces plain as the base the walk builds on; the other
//   combinations of as many strategies that run there are nodes of their
//   own, each fitted to its probes there and at twice that micro-batch, as
//   is 8-bit AdamW + bf16 when the base is checkpointing or offload
//   (rescue.cpp, Note [Rescue]).
// - One point: a base that ran at one micro-batch only takes the slope of
//   its retained activations per sample (a lower bound), and a probe out of
//   memory at micro-batch s rules its configuration out at s and above (the
//   probes' guard is at least the budget).
// - Pairs: 8-bit AdamW + bf16 and offload + bf16 (each also with
//   checkpointing) are predicted from the single strategies' measured
//   effects, added; no probe of their own (walk.cpp, Note [Pairs]), but
//   bf16 with checkpointing, probed at the strategies' sizes where the
//   lines measured both (memory_model.cpp, Note [bf16 with checkpointing]).
// - Step time: a node's seconds are its micro-batches' forward, loss and
//   backward (a line in the micro-batch) plus one optimizer step, each
//   measured apart in the probes; a strategy probed at two sizes scales
//   that line's intercept and slope apart (memory_model.cpp, Note [Step
//   time]).
// - Every node that is predicted to fit is a candidate; candidates are
//   ranked by predicted seconds per global batch ("fastest, not first").
// - Balanced split: a node whose largest fitting micro-batch b* needs
//   k = ceil(G / b*) micro-batches runs the smallest valid micro-batch that
//   still needs only k (G = 16, b* = 11: 8 x 2, not 11 + 5). The time model
//   predicts the same seconds for both (k per-micro-batch costs plus G
//   samples); the balanced one has more margin, no small remainder, and was
//   measured faster on 2 CPU threads (bench/search: 11 + 5 ran 0.91x of
//   10 + 6). The node keeps b* for the report.
// - Ties: verified candidates within kTimingTieRatio of the fastest measured
//   one count as equally fast; of those, the one with the fewest strategies
//   wins (then the larger margin): each strategy is a moving part (8-bit
//   moments change the numerics, offload needs host memory and PCIe,
//   checkpointing recomputes), worth nothing when it buys no speed.
// - Work added: a strategy that only adds work (StrategyRow::only_adds_work:
//   checkpointing recomputes, offload moves the optimizer step to the CPU)
//   cannot make a step faster than the same configuration without it. A
//   probe measured faster predicts it at no less than 1x; a verified run
//   measured faster than a verified run of the same configuration without
//   it counts at that run's speed (timing noise: on the CPU backend
//   offload's host is the device's own memory); and where plain G x 1 is
//   verified within the budget before the strategies are probed, such a
//   strategy is not probed at all.
// - The optimizer step alone: a strategy that changes only the optimizer's
//   kind (8-bit AdamW, Adafactor) runs the same forward and backward. A
//   verified run of it counts at the seconds outside the optimizer step of
//   a verified run of the same configuration with the job's optimizer plus
//   its own optimizer step, each timed apart (StepTiming::
//   steady_optimizer_seconds): the example GPT on a 2-core CPU ran 8-bit
//   AdamW 8 % faster than plain with a slower optimizer step (6.1 against
//   5.9 ms of ~0.3 s), and chose it. Not where a step was not timed or a
//   run's caching allocator retried (num_alloc_retries: a run at its cap
//   stalls in forward and backward too, which saving memory can spare).
// - The simplest fitting candidate (fewest strategies) is always verified,
//   in the last of the verification slots if not ranked higher: the
//   reference the strategies must beat.
// - The top candidates are verified by a run of the job's verify_steps in a
//   fresh process under the budget (DESIGN.md: fitting two steps is not
//   fitting). A verified run that goes out of memory means the model was
//   wrong: the candidate is dropped with a note, the search goes on, and
//   the tree is walked again below it (see Runs out of memory).
// - Budget test: on CUDA the predicted reserved bytes of the caching
//   allocator (allocsim/caching_allocator_sim.h, replaying each probe's
//   allocation stream), elsewhere the allocated peak.
// - Memory from meta (SearchOptions::memory_from, Note [Memory from meta]
//   in meta_memory.cpp): where the runner can run a configuration on the meta
//   device, each node's micro-batch is chosen by the peaks measured there,
//   at that micro-batch and with its accumulation, not by the lines; the
//   real probes then only time and verify: plain at two sizes, each
//   strategy at one, placed where the candidates run (plain at G and at
//   the accumulation node's micro-batch when plain fits at G: Note [Timing
//   probes on meta], meta_memory.cpp), so the ranking that picks the
//   candidates to verify rests on times measured at their own sizes. Plain
//   at G is timed by its own verification run, and once that fits the
//   budget checkpointing is not probed: it cannot beat a verified plain
//   G x 1 (Note [Plain's verification times it], meta_memory.cpp). The
//   first meta run tells whether meta works for the model; when it does
//   not, the search says why in a note and predicts from the probes' lines.
// - bf16: when a bf16-autocast probe fails for a reason other than memory
//   (TorchScript's autocast crashes on some models), bf16 is tried as bf16
//   parameters with fp32 master weights; SearchResult::notes says which
//   form ran and why (search/fit.cpp, Note [bf16 fallback]).
// - The global batch stays exact: micro-batch × accumulation steps = G.
// - No number in the result is untested without saying so: predictions are
//   labelled predicted, measurements come from ProbeReports.
// No libtorch: trials come through the TrialRunner interface, so the search
// is tested with a fake runner whose memory curve is known exactly.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "search/memory_model.h"
#include "strategies/training_config.h"

namespace oomtune {

/// Runs trials for the search (child processes in oomtune; a fake in tests).
class TrialRunner {
 public:
  virtual ~TrialRunner() = default;
  /// Measures `config` with the global batch set to config.micro_batch (one
  /// micro-batch per step). Short run; the budget is not the job's.
  virtual ProbeReport probe(const TrainingConfig& config) = 0;
  /// Runs `config` on the job's global batch for the job's verify_steps
  /// steps, under the job's usable budget, in a fresh process.
  virtual ProbeReport verify(const TrainingConfig& config) = 0;
  /// Measures `config`'s memory on the meta device: the job's global batch
  /// in config.accumulation_steps micro-batches of config.micro_batch, one
  /// warm-up and one measured step, no budget, no timing
  /// (trial/trial_runner.h). Its outcome is kError when meta cannot run the
  /// model (an operator without a meta kernel: the message says which). nullopt: this runner has no meta device
  /// (no_meta_device_reason says why).
  virtual std::optional<ProbeReport> measure_on_meta(const TrainingConfig& config) {
    (void)config;
    return std::nullopt;
  }
  /// Why measure_on_meta answers nullopt, as the end of the search's note
  /// "memory from the probes' lines: ...".
  virtual std::string no_meta_device_reason() const { return "trials here cannot run on the meta device"; }
};

/// Where the search takes each node's memory from.
enum class MemorySource {
  kProbes,  ///< lines fitted to the probes, predicted at each micro-batch
  kMeta,    ///< measured on the meta device at each node's own micro-batch (TrialRunner::measure_on_meta)
};

/// "probes" / "meta".
std::string to_string(MemorySource source);

/// One node of the decision trail.
struct TrailNode {
  std::string node;  // "plain", "checkpointing (selective)", ...
  TrainingConfig config;
  int64_t largest_fitting_micro_batch = 0;  // COUNT: b* predicted to fit with these strategies (0: none)
  double predicted_peak_bytes = 0;          // SUM (predicted from the lines)
  // SUM: the peak measured on the meta device at config's micro-batch and
  // accumulation, against the budget (model_fit.h, budget_scale: for a CUDA
  // target, device "cuda" or "meta", its predicted reserved bytes); what
  // the fit was decided on when set (MemorySource::kMeta).
  std::optional<double> meta_peak_bytes;
  // SUM: that meta run's peak of tensors plus the cuBLAS workspaces a CUDA
  // run allocates beside them (the target's, WorkspaceRecord): what a CUDA
  // run's allocated bytes measure; unset without a meta run.
  std::optional<int64_t> meta_tensor_peak_bytes;
  // SUM: what a CUDA caching allocator would reserve for that meta run, as
  // its simulator predicts from the run's allocations with the job's cuBLAS
  // workspaces (trial/cublas_workspaces.h); unset without a meta run.
  std::optional<int64_t> meta_reserved_bytes;
  // SUM: that meta run's host peak (ProbeReport::host_peak_bytes: optimizer
  // offload's fp32 masters, gradients and state); unset without a meta run.
  std::optional<int64_t> meta_host_peak_bytes;
  double predicted_seconds = 0;  // seconds per global batch (predicted)
  bool predicted_fit = false;
  std::optional<ProbeReport> verification;  // set when verified by a real run
  std::string note;                         // why chosen or rejected
};

/// What the search found.
struct SearchResult {
  int64_t usable_budget_bytes = 0;                   // SUM: budget minus headroom
  std::vector<ProbeReport> probes;                   // every probe trial, in order
  std::vector<TrailNode> trail;                      // the decision tree, in walk order
  std::optional<std::size_t> chosen;                 // index into trail
  std::vector<std::string> notes;                    // strategies unavailable, models corrected, ...
  int64_t verification_trials = 0;                   // COUNT: real runs beyond the probes
  MemorySource memory_from = MemorySource::kProbes;  // where the nodes' memory came from (after any fallback)
  int64_t meta_trials = 0;                           // COUNT: runs on the meta device (memory only; none real)
  bool memory_only = false;                          // chosen by memory alone, unverified (SearchOptions::memory_only)
  // The budget was compared with a CUDA caching allocator's reserved bytes
  // (measured, or predicted from the trials' events): device "cuda" or
  // "meta"; with a "cpu" job's allocated bytes otherwise (budget_scale).
  bool budget_on_reserved = false;
  int64_t parameter_count = 0;         // COUNT: trainable parameter elements
  int64_t frozen_parameter_count = 0;  // COUNT: frozen parameter elements (job/parameter_selection.h)
  BatchLine baseline_peak;             // tensors' bytes vs micro-batch (of baseline_name)
  // Bytes vs micro-batch at backward's activation peak (of baseline_name),
  // tensors' bytes as baseline_peak (not against the budget):
  // where it passes baseline_peak, the peak follows it (memory_model.cpp,
  // Note [Backward activation peak]).
  BatchLine baseline_backward_activation;
  BatchLine baseline_seconds;             // seconds of one micro-batch's forward, loss, backward (of baseline_name)
  double baseline_optimizer_seconds = 0;  // seconds of its optimizer step, once per global batch (0: not timed)
  std::vector<int64_t> baseline_micro_batches;  // the probes both lines were fitted to (empty: none ran)
  // The one of baseline_micro_batches that was not a probe but plain's
  // verification run (Note [Plain's verification times it] in
  // search/meta_memory.cpp); 0: every one was a probe.
  int64_t baseline_verified_micro_batch = 0;
  StaticMemory static_memory;                // of the baseline's probe (or plain's failed one)
  std::string baseline_name = "plain";       // what the baseline lines describe: plain, or the rescued base
  double smallest_predicted_peak_bytes = 0;  // the least memory any node needs (at smallest_micro_batch)
  // Memory from meta and no node fits: the least peak measured on meta of
  // the combinations smallest_predicted_peak_bytes predicts (every block
  // checkpointed, bf16, and each optimizer row or none, at
  // smallest_micro_batch), and which one with its micro-batch x
  // accumulation; what "nothing fits" names in place of the prediction.
  std::optional<double> smallest_meta_peak_bytes;
  std::string smallest_meta_configuration;
  // Measured "nothing fits": plain and the least-memory combination of
  // strategies both ran out at smallest_micro_batch (Note [Rescue] in
  // rescue.cpp); the trail is empty. Empty when not measured.
  std::string least_memory_failure;
  // "Nothing fits one GPU" before the strategies are probed: the parameters
  // alone, in the cheapest storage the job allows, exceed the usable budget,
  // or loading the weights ran out of memory (fit.cpp, Note [Parameters
  // alone]); why, as one sentence; the trail is empty. parameter_count,
  // frozen_parameter_count and static_memory come from the trial that
  // measured the parameters (the meta run when no probe got past loading; 0
  // when none did), the baseline lines from plain's probes when any ran, and
  // probes holds one of checkpointing every block (for the ZeRO table's
  // activations) when plain ran. Empty otherwise.
  std::string parameters_alone;
  int64_t smallest_micro_batch = 0;  // the smallest micro-batch the search used (0: none valid)
  // The largest micro-batch the search used: the global batch or
  // max_micro_batch, lower after one failed for its size (fit.cpp, Note
  // [An error that comes with the size]); 0 when the walk did not run.
  int64_t largest_micro_batch = 0;
};

/// Verified samples/s at or above this fraction of the fastest verified run
/// count as a tie, broken by simplicity (see Rules). Repeated runs of one
/// configuration spread wider than this on a shared 2-core machine
/// (bench/search: 151-170 samples/s for one configuration), so a smaller
/// difference is not evidence of speed; choosing within the band costs at
/// most 3 %.
inline constexpr double kTimingTieRatio = 0.97;

/// Options of the search.
struct SearchOptions {
  int64_t max_verifications = 3;        // COUNT: real runs of top candidates (more only to replace failures)
  int64_t max_extra_verifications = 3;  // COUNT: further runs when verified candidates fail
  // kMeta: measure each node on the meta device where the runner can
  // (falls back to kProbes with a note where it cannot).
  MemorySource memory_from = MemorySource::kProbes;
  // The runner's trials all run on the meta device (a job on device =
  // "meta", e.g. a model exported without its weights): memory only, no
  // step time, nothing verified. Implies kMeta; the choice is the simplest
  // configuration measured to fit (Note [Memory only], meta_memory.cpp),
  // SearchResult::memory_only says so.
  bool memory_only = false;
};

/// Walks the tree for `job` (its usable budget is required). `progress`
/// receives one line per trial and decision. Parameters alone over the
/// budget are a result (SearchResult::parameters_alone), not an error.
/// Throws InputError when the job has no budget, when the plain
/// configuration runs at no micro-batch down to the job's minimum for a
/// reason other than memory (the message names the smallest micro-batch
/// tried and that trial's message), or when plain runs out of memory there
/// and no combination of strategies runs while the least-memory one failed
/// for a reason other than memory; with SearchOptions::memory_only, also
/// when the model does not run on the meta device (the message says why).
SearchResult search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
                    const std::function<void(const std::string&)>& progress);

/// The candidates whose verification run ended for a reason other than
/// memory (timeout, crash, error), in trail order. When the search chose
/// nothing and this is not empty, "nothing fits" is unproven: those
/// candidates were predicted to fit and their memory was never measured
/// (autotune then says so and exits kExitUnverified, not kExitNothingFits).
std::vector<const TrailNode*> unverified_candidates(const SearchResult& result);

/// The candidates whose verification ran over the budget (out of memory,
/// or a run that finished above it), in trail order: the memory model was
/// low for them (walk.cpp, Note [Verifications that run out of memory]).
std::vector<const TrailNode*> ran_out_candidates(const SearchResult& result);

/// COUNT: the distinct configurations predicted to fit that no verification
/// ran (the verification budget was spent first).
std::size_t candidates_not_run(const SearchResult& result);

/// Micro-batch sizes the search may use for `job`: divisors of the global
/// batch (all sizes when remainder = "last_smaller"), within the job's
/// min/max micro-batch, ascending.
std::vector<int64_t> valid_micro_batches(const JobSpec& job);

}  // namespace oomtune
