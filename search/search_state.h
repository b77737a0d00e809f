#pragma once
// The search's state, shared by the files that do its jobs (search.h has
// the rules; each file one job):
//   probe_plan.cpp  the plain probes: sizes, the walk up and down them
//   fit.cpp         the base's lines and each strategy's effect
//   rescue.cpp      plain runs nowhere: the strategies that make it run
//   walk.cpp        the nodes of the tree and their predictions
//   choose.cpp      verification runs and the choice
//   meta_memory.cpp each node's memory measured on the meta device
//   host_budget.cpp optimizer offload's state against the host's memory
//   sentences.cpp   the words of its notes and progress lines
// model_fit.h has the fitting that does not depend on this state. Internal
// to oomtune_search: nothing outside search/ includes this header.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "job/job_spec.h"
#include "probes/probe_report.h"
#include "search/memory_model.h"
#include "search/search.h"
#include "search/strategy_table.h"
#include "strategies/training_config.h"

namespace oomtune::search_detail {

/// The index of backward in per-phase arrays.
inline constexpr auto kBackwardIndex = static_cast<std::size_t>(Phase::kBackward);

/// Checkpointing every detected block (CheckpointPlan::Mode::kAll).
CheckpointPlan checkpoint_every_block();

/// The set holding only `s`.
inline StrategySet just(Strategy s) { return strategy_set({s}); }

/// `c` at `micro_batch`, with as many accumulation steps as the global batch
/// needs (the last micro-batch the remainder).
TrainingConfig with_micro_batch(TrainingConfig c, int64_t micro_batch, int64_t global_batch);

/// COUNT: strategies `c` uses beyond the job's own configuration:
/// accumulation, and each row of the strategy table (search.h, Ties).
std::size_t strategy_count(const TrainingConfig& c, const TrainingConfig& job_base);

/// The plain probes' micro-batches: G/8, G/4 and G/2 of the global batch,
/// within the job's limits, at least two where two exist.
std::vector<int64_t> probe_sizes(const JobSpec& job);

/// Weights that ran out of memory while loading: no micro-batch can help.
bool ran_out_loading(const ProbeReport& r);

/// Two trials that failed the same way, whatever their micro-batch: the
/// same outcome and message, apart from the shapes of forward's arguments
/// that a forward's error begins with (Note [An error that does not depend
/// on the micro-batch], probe_plan.cpp).
bool same_failure(const ProbeReport& a, const ProbeReport& b);

/// A failure every larger micro-batch would repeat: out of memory, or past
/// the trial timeout.
bool fails_larger_too(TrialOutcome outcome);

/// Failed for a reason other than memory (Note [bf16 fallback], fit.cpp).
bool form_failed(const ProbeReport& r);

/// The search over one job: the jobs listed above, each a group of member
/// functions defined in its file.
class Search {
 public:
  Search(const JobSpec& job, TrialRunner& runner, const SearchOptions& options,
         const std::function<void(const std::string&)>& progress);

  /// Probes, fits, walks and verifies (choose.cpp). Throws as search() does.
  SearchResult run();

 private:
  // The plain probes of fit_models, by micro-batch.
  struct PlainProbes {
    std::map<int64_t, ProbeReport> ran, failed;
    // The failure at the smallest micro-batch: its message explains the most.
    // Called when nothing ran, so at least one probe failed (probe_sizes is
    // never empty).
    const ProbeReport& first_failure() const { return failed.begin()->second; }
  };

  // A combination that runs without the rescued base (Note [Rescue]), as
  // probed (a later bf16 fallback does not rename it).
  struct RescueAlternative {
    std::string name;
    TrainingConfig config;
    std::vector<ProbeReport> probes;  // that ran: at the smallest micro-batch, and at twice it
  };

  // probe_plan.cpp
  ProbeReport probe(TrainingConfig config, int64_t micro_batch);
  PlainProbes probe_plain(const std::vector<int64_t>& sizes, PlainProbes p = {});
  ProbeReport plain_at_global_batch();
  bool plain_verified_at_global_batch() const;

  // fit.cpp
  // Whether the parameters fit the usable budget (Note [Parameters alone]).
  enum class ParametersFit {
    kFit,         // as measured
    kAsBf16Only,  // as bf16 parameters only
    kOver,        // in no storage the job allows: result_.parameters_alone says why
  };
  bool fit_models();
  std::string nothing_ran_message(const PlainProbes& plain) const;
  // `text` without its first "MODEL: ": a trial's error names the model's
  // path, which the run's first line and every report already name.
  std::string without_model_path(std::string text) const;
  // outcome_text(r) (probes/probe_report.h) without the model's path.
  std::string outcome_of(const ProbeReport& r) const { return without_model_path(outcome_text(r)); }
  ParametersFit check_parameters(const PlainProbes& plain);
  void store_bf16_parameters(const std::vector<int64_t>& sizes, PlainProbes& plain);
  StrategyEffect probe_effect(const std::string& name, const TrainingConfig& config, const std::vector<int64_t>& sizes,
                              const StepModels& reference);
  StrategyEffect probe_effect(const std::string& name, const TrainingConfig& config,
                              const std::vector<int64_t>& sizes) {
    return probe_effect(name, config, sizes, models_);
  }
  void probe_bf16_with_checkpointing(const std::vector<int64_t>& sizes);
  StrategyEffect probe_checkpointing(const std::vector<int64_t>& sizes);
  StrategyEffect probe_bf16(const std::vector<int64_t>& sizes);
  void raise_min_micro_batch(int64_t size, const ProbeReport& report);
  // Note [An error that comes with the size]
  bool fails_for_its_size(const ProbeReport& report, int64_t size) const;
  void lower_max_micro_batch(int64_t size, const ProbeReport& report, int64_t ceiling);
  void require_a_valid_micro_batch(const std::string& cause) const;

  // rescue.cpp
  bool needs_rescue(const ProbeReport& failure) const;
  std::optional<PlainProbes> rescue(const std::vector<int64_t>& sizes, const PlainProbes& plain);
  TrainingConfig rescue_config(StrategySet strategies) const;
  std::string rescue_label(StrategySet strategies) const { return strategies_label(strategies, context()); }
  bool probes_pair(StrategySet strategies) const;
  void add_rescue_alternative(StrategySet strategies, const ProbeReport& at_smallest, int64_t smallest);
  StepModels rescue_alternative_models(const RescueAlternative& alternative) const;

  // meta_memory.cpp
  void start_meta();
  const ProbeReport* meta_run(const TrainingConfig& c);
  std::optional<double> meta_peak(const TrainingConfig& c);
  std::optional<int64_t> largest_fitting_on_meta(const std::vector<int64_t>& candidates, int64_t predicted,
                                                 const TrainingConfig& config);
  std::vector<int64_t> timing_sizes();
  int64_t strategy_timing_size(const TrainingConfig& config, const std::vector<int64_t>& ran);
  void note_meta_failures();
  void choose_by_memory();

  // walk.cpp
  void walk_tree();
  void walk_again(const std::string& why);
  void add_node(const std::string& tree_name, const TrainingConfig& config, int64_t largest, bool exact = false,
                const StepModels* alternative = nullptr);
  static std::string memory_key(TrainingConfig c);
  // A run of `c` out of memory at `micro_batch`: it fits at no size from
  // there up (smallest_out_of_memory).
  void rule_out_from(const TrainingConfig& c, int64_t micro_batch);
  int64_t smallest_out_of_memory(const TrainingConfig& c) const;
  CheckpointPlan first_blocks(int64_t n) const;
  void note_remainder();

  // host_budget.cpp (Note [Host budget])
  // Host bytes offload keeps for `trainable_parameters` (fp32 masters,
  // gradients, the job optimizer's state); nullopt when not counted.
  std::optional<int64_t> offload_host_bytes(int64_t trainable_parameters) const;
  // Whether offload's host bytes fit the usable host budget (true without
  // one, or without a count); notes the first refusal.
  bool offload_fits_host(int64_t trainable_parameters);
  // Whether `r` held more on the host than the usable host budget.
  bool over_host_budget(const ProbeReport& r) const;
  // A trial of `config` that ran but held too much on the host becomes an
  // out-of-memory; without offload, an InputError (no strategy helps).
  void hold_to_host_budget(ProbeReport& r, const TrainingConfig& config) const;

  // choose.cpp
  bool fits_budget(const ProbeReport& r) const;
  int64_t budgeted(const ProbeReport& r) const;
  // Rules: The optimizer step alone (search.h): counts verified node i
  // (in `speed`, samples/s) by its optimizer step against the same
  // configuration with the job's optimizer, where both are verified.
  void count_optimizer_step_alone(std::size_t i, const std::vector<std::size_t>& simplest_first,
                                  std::map<std::size_t, double>& speed);
  ProbeReport verify(const TrainingConfig& config);
  // Verifies the candidates and chooses. Returns how the tree is walked
  // again, where a run calls for it (nothing is chosen then): a candidate
  // failed for its micro-batch (Note [An error that comes with the size],
  // fit.cpp) or ran out of memory (Note [Verifications that run out of
  // memory], walk.cpp).
  std::optional<std::string> verify_candidates();

  void note_optimizer_change(const std::string& alternative);

  // What the strategies' rows turn on in this search.
  StrategyContext context() const { return {checkpoint_all_, bf16_form_, job_base_.optimizer}; }

  JobSpec job_;  // a copy: a micro-batch that cannot run raises min_micro_batch or lowers max_micro_batch
  TrialRunner& runner_;
  SearchOptions options_;
  std::function<void(const std::string&)> progress_;
  TrainingConfig base_;            // what the plain probes run: the job's configuration, or a rescued one
  TrainingConfig job_base_;        // the job's own configuration: strategies are counted against it
  StrategySet rescue_strategies_;  // the strategies base_ adds to the job's (Note [Rescue]); none: plain
  std::vector<RescueAlternative> rescue_alternatives_;  // Note [Rescue]
  StepModels models_;
  std::map<int64_t, double> plain_seconds_;                   // forward, loss and backward of one micro-batch
  std::map<std::string, int64_t> out_of_memory_at_;           // memory_key -> smallest micro-batch whose probe ran out
  ProbeReport last_failure_;                                  // the last strategy probe that failed
  CheckpointPlan checkpoint_all_ = checkpoint_every_block();  // what "all blocks" checkpoints
  std::string checkpoint_label_ = "all blocks";               // names checkpoint_all_ in node names
  Precision bf16_form_ = Precision::kBf16;                    // kBf16Params after a fallback
  bool meta_ = false;                                         // nodes' memory from meta (Note [Memory from meta])
  std::map<std::string, ProbeReport> meta_runs_;              // to_string(config) -> its meta run
  // Plain at the global batch is timed by its own verification run (Note
  // [Plain's verification times it], meta_memory.cpp).
  bool plain_verification_times_g_ = false;
  bool offload_barred_noted_ = false;  // offload_fits_host's note, once
  // to_string(config) -> its verification run: plain G x 1's while probing,
  // and every one before a walk again (Note [An error that comes with the
  // size]). A configuration is never verified twice.
  std::map<std::string, ProbeReport> verified_;
  int64_t largest_ran_micro_batch_ = 0;      // COUNT: the largest micro-batch a probe or verification ran at
  std::set<std::string> candidates_before_;  // to_string(config) of the candidates of the walks before this one
  // The most verification runs in all, set by the first walk again: the
  // runs so far plus max_verifications (Note [Verifications that run out of
  // memory], walk.cpp).
  std::optional<int64_t> verification_cap_;
  SearchResult result_;
};

}  // namespace oomtune::search_detail
