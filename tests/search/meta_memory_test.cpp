// Memory from the meta device (search.h, Rules: Memory from meta; Note
// [Memory from meta] in search/meta_memory.cpp), against the fake device
// whose true peak is known exactly (fake_runner.h): each node's
// micro-batch is decided by its own measured peak, not by the lines; the
// real probes only time; a meta run that fails leaves the lines in charge
// and says why. The report's golden file (tests/search/golden/meta.txt)
// was reviewed against the fake's curves.

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/error.h"
#include "fake_runner.h"
#include "report/autotune_report.h"

namespace oomtune {
namespace {

SearchOptions from_meta() {
  SearchOptions options;
  options.memory_from = MemorySource::kMeta;
  return options;
}

// Micro-batch 32 needs 20 MiB more than the plain line through the probes
// at 4, 8 and 16 says (DecisionTree.AVerifiedOutOfMemoryDropsTheCandidateAndGoesOn
// shows the lines' answer: plain 32 x 1 is verified, runs out of memory and
// is dropped). Measured on meta, every node's peak is the true one, so no
// candidate is wrong and no verification runs out of memory.
TEST(MetaMemory, EachNodeIsDecidedByItsOwnMeasuredPeak) {
  FakeRunner fake;
  fake.meta = true;
  fake.extra_at_full_batch = 20 * kMiB;
  const JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  const SearchResult r = run_search(fake, job, from_meta());
  EXPECT_EQ(r.memory_from, MemorySource::kMeta);
  EXPECT_EQ(r.meta_trials, fake.meta_runs);
  const auto budget = static_cast<double>(*job.usable_budget_bytes());
  int measured = 0;
  for (const TrailNode& n : r.trail) {
    SCOPED_TRACE(n.node);
    ASSERT_TRUE(n.meta_peak_bytes.has_value());
    const auto truth = static_cast<double>(fake.true_peak(n.config, job.global_batch));
    EXPECT_EQ(*n.meta_peak_bytes, truth);
    EXPECT_EQ(n.predicted_fit, truth <= budget);
    if (n.config.micro_batch == 32 && !n.config.checkpoint.enabled()) {
      EXPECT_FALSE(n.predicted_fit) << "the lines said it fits; meta measured the 20 MiB";
    }
    if (n.verification) {
      EXPECT_EQ(n.verification->outcome, TrialOutcome::kOk);
    }
    ++measured;
  }
  EXPECT_GT(measured, 5);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_LE(fake.true_peak(r.trail[*r.chosen].config, job.global_batch), *job.usable_budget_bytes());
}

// Each node's micro-batch is the largest of its own that truly fits: the
// next larger valid one (twice it, G = 32) does not, where the node could
// have taken it (accumulation nodes go up to 16, the others to 32).
// Nothing fits at 8 MiB (weights and gradients alone 8 P = 8 MiB): the
// answer names the least peak measured on meta of the least-memory
// combinations at micro-batch 1 x 32, the fake's true peaks: checkpointing
// + offload 8 P + 2 MiB + A / 4 + the gradients alive through accumulation
// 4 P = 4 + 4 + 2 + 2 + 4 = 16 MiB (checkpointing + 8-bit AdamW: + 2 P,
// checkpointing alone: + 8 P), not a node's peak at its own micro-batch.
TEST(MetaMemory, NothingFitsNamesTheLeastMeasuredPeak) {
  FakeRunner fake;
  fake.meta = true;
  const JobSpec job = job_with_budget(8 * kMiB);
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job;
  report.search = run_search(fake, job, from_meta());
  const SearchResult& r = report.search;
  EXPECT_FALSE(r.chosen);
  ASSERT_TRUE(r.smallest_meta_peak_bytes.has_value());
  EXPECT_EQ(*r.smallest_meta_peak_bytes, 16.0 * kMiB);
  EXPECT_EQ(r.smallest_meta_configuration, "checkpointing (all blocks) + optimizer offload, micro-batch 1 x 32");
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("nothing fits: the least memory any configuration needs is 16.00 MiB (measured on meta: "
                      "checkpointing (all blocks) + optimizer offload, micro-batch 1 x 32), the usable budget is "
                      "8.00 MiB"),
            std::string::npos)
      << text;
  EXPECT_EQ(autotune_json(report).at("smallest_meta_peak_bytes"), 16 * kMiB);
}

TEST(MetaMemory, EachNodeTakesTheLargestMicroBatchThatTrulyFits) {
  for (int64_t extra : {int64_t{0}, 3 * kMiB}) {
    SCOPED_TRACE(extra);
    FakeRunner fake;
    fake.meta = true;
    const JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + extra);
    const SearchResult r = run_search(fake, job, from_meta());
    for (const TrailNode& n : r.trail) {
      SCOPED_TRACE(n.node);
      const int64_t b = n.largest_fitting_micro_batch;
      const bool accumulation_node = n.node.find("accumulation") != std::string::npos;
      const bool exact = n.node == "plain" || n.node.rfind("checkpointing (", 0) == 0;  // at 32 or not at all
      const int64_t bound = accumulation_node ? 16 : 32;
      if (b == 0) continue;
      TrainingConfig c = n.config;
      c.micro_batch = b;
      EXPECT_LE(fake.true_peak(c, 32), *job.usable_budget_bytes());
      if (!exact && 2 * b <= bound) {
        c.micro_batch = 2 * b;
        EXPECT_GT(fake.true_peak(c, 32), *job.usable_budget_bytes()) << "micro-batch " << 2 * b << " fits too";
      }
    }
  }
}

// With the lines right, meta finds the same answer with fewer real trials:
// the plain probes at 4 and 8 only (not 16), each strategy at one size.
TEST(MetaMemory, SameChoiceWithFewerRealProbes) {
  const JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  FakeRunner lines;
  const SearchResult from_lines = run_search(lines, job);
  FakeRunner meta;
  meta.meta = true;
  const SearchResult from_meta_runs = run_search(meta, job, from_meta());
  ASSERT_TRUE(from_lines.chosen && from_meta_runs.chosen);
  EXPECT_EQ(to_string(from_meta_runs.trail[*from_meta_runs.chosen].config),
            to_string(from_lines.trail[*from_lines.chosen].config));
  EXPECT_LT(meta.probes, lines.probes);
  EXPECT_LE(meta.verifications, lines.verifications);
  std::set<int64_t> plain_sizes;
  std::map<std::string, std::set<int64_t>> strategy_sizes;
  for (const ProbeReport& p : from_meta_runs.probes) {
    if (p.config.find("ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain_sizes.insert(p.micro_batch);
    else
      strategy_sizes[p.config.substr(p.config.find(",accum="))].insert(p.micro_batch);
  }
  EXPECT_EQ(plain_sizes, (std::set<int64_t>{4, 8}));
  for (const auto& [config, sizes] : strategy_sizes) EXPECT_EQ(sizes.size(), 1u) << config;
}

// Note [Timing probes on meta]: memory known, the probes time where the
// candidates run. Everything fits at 32 (budget: plain 32 x 1 and 1 MiB),
// and each sample past 16 in a micro-batch costs 0.004 s more: plain 32 x 1
// takes 0.01 + 0.064 + 0.064 = 0.138 s, 16 x 2 takes 2 x 0.042 = 0.084 s,
// the fastest configuration (every strategy multiplies plain's time). The
// plain probes run at 32 (plain's node) and 16 (accumulation's), each
// strategy at 32, so every node's predicted time is its true one; the
// lines' probes at 4, 8 and 16 see no spill and predict 32 x 1 at 0.074 s.
// With one verification run, each search verifies and chooses its fastest
// predicted: meta the truly fastest, the lines plain 32 x 1.
TEST(MetaMemory, TheProbesTimeWhereTheCandidatesRun) {
  const JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  SearchOptions options = from_meta();
  options.max_verifications = 1;
  FakeRunner meta;
  meta.meta = true;
  meta.spill_seconds_per_sample = 0.004;
  const SearchResult r = run_search(meta, job, options);
  ASSERT_EQ(r.memory_from, MemorySource::kMeta);
  std::set<int64_t> plain_sizes;
  std::map<std::string, std::set<int64_t>> strategy_sizes;
  for (const ProbeReport& p : r.probes) {
    if (p.config.find("ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain_sizes.insert(p.micro_batch);
    else
      strategy_sizes[p.config.substr(p.config.find(",accum="))].insert(p.micro_batch);
  }
  EXPECT_EQ(plain_sizes, (std::set<int64_t>{16, 32}));
  EXPECT_EQ(strategy_sizes.size(), 3u) << "checkpointing, 8-bit AdamW, offload";
  for (const auto& [config, sizes] : strategy_sizes) EXPECT_EQ(sizes, (std::set<int64_t>{32})) << config;
  const auto true_seconds = [&](const TrainingConfig& c) {
    return meta.true_seconds(c) * static_cast<double>(c.accumulation_steps) + meta.true_optimizer_seconds(c);
  };
  double fastest = 1e9;
  for (const TrailNode& n : r.trail) {
    SCOPED_TRACE(n.node);
    ASSERT_TRUE(n.predicted_fit);
    EXPECT_NEAR(n.predicted_seconds, true_seconds(n.config), 1e-9);
    fastest = std::min(fastest, true_seconds(n.config));
  }
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(to_string(r.trail[*r.chosen].config),
            "micro_batch=16,accum=2,ckpt=none,optimizer=adamw,offload=off,precision=fp32");
  EXPECT_DOUBLE_EQ(true_seconds(r.trail[*r.chosen].config), fastest);
  EXPECT_DOUBLE_EQ(fastest, 0.084);

  FakeRunner lines;
  lines.spill_seconds_per_sample = 0.004;
  SearchOptions one_verification;
  one_verification.max_verifications = 1;
  const SearchResult from_lines = run_search(lines, job, one_verification);
  ASSERT_TRUE(from_lines.chosen.has_value());
  EXPECT_EQ(to_string(from_lines.trail[*from_lines.chosen].config),
            "micro_batch=32,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32");
  EXPECT_LT(meta.probes, lines.probes);
}

// Note [Plain's verification times it]: plain fits at G on meta, so with
// three verification runs plain 32 x 1 is one of them, and that run is its
// timing point at 32 too: no probe of plain at 32, and no second run of
// it. The line through 16 (a probe) and 32 (the verification) is the
// probes' line, so every node is predicted at its true time as in
// MetaMemory.TheProbesTimeWhereTheCandidatesRun, whose one verification
// slot keeps the probe at 32. Plain 32 x 1 verified within the budget,
// checkpointing (time x 1.6 in the fake) and offload (x 1.5), which only
// add work, cannot beat it: not probed, no node.
TEST(MetaMemory, PlainsVerificationRunIsItsTimingPointAtTheGlobalBatch) {
  const JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  FakeRunner meta;
  meta.meta = true;
  meta.spill_seconds_per_sample = 0.004;
  const SearchResult r = run_search(meta, job, from_meta());
  ASSERT_EQ(r.memory_from, MemorySource::kMeta);
  std::set<int64_t> plain_sizes;
  for (const ProbeReport& p : r.probes)
    if (p.config.find("ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain_sizes.insert(p.micro_batch);
  EXPECT_EQ(plain_sizes, (std::set<int64_t>{16}));
  EXPECT_EQ(r.baseline_micro_batches, (std::vector<int64_t>{16, 32}));
  EXPECT_EQ(r.baseline_verified_micro_batch, 32);
  EXPECT_EQ(meta.verifications, 3);
  EXPECT_EQ(r.verification_trials, 3);
  EXPECT_EQ(meta.probes, 2) << "plain at 16, 8-bit AdamW at 32";
  EXPECT_TRUE(has_note(r,
                       "activation checkpointing: not probed: plain 32 x 1 ran its verification within the budget, "
                       "and recomputation cannot make a step faster than it"))
      << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r,
                       "optimizer offload: not probed: plain 32 x 1 ran its verification within the budget, and an "
                       "optimizer step on the CPU cannot make a step faster than it"))
      << ::testing::PrintToString(r.notes);
  for (const TrailNode& n : r.trail) {
    SCOPED_TRACE(n.node);
    EXPECT_FALSE(n.config.checkpoint.enabled());
    EXPECT_FALSE(n.config.offload_optimizer);
    EXPECT_NEAR(n.predicted_seconds,
                meta.true_seconds(n.config) * static_cast<double>(n.config.accumulation_steps) +
                    meta.true_optimizer_seconds(n.config),
                1e-9);
  }
  const auto plain = std::find_if(r.trail.begin(), r.trail.end(), [](const TrailNode& n) { return n.node == "plain"; });
  ASSERT_NE(plain, r.trail.end());
  ASSERT_TRUE(plain->verification.has_value());
  EXPECT_EQ(plain->verification->steps_run, 20);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(to_string(r.trail[*r.chosen].config),
            "micro_batch=16,accum=2,ckpt=none,optimizer=adamw,offload=off,precision=fp32");
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job;
  report.search = r;
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("(both fitted to the plain runs at micro-batch 16, 32; at 32 its verification run)"),
            std::string::npos)
      << text;
  EXPECT_EQ(autotune_json(report).at("baseline_model").at("verified_micro_batch"), 32);

  // Its later steps grow past the budget, which meta cannot see: plain 32 x
  // 1 is dropped as any failed verification is, not run again, the lines
  // take their point at 32 from a probe after all, and checkpointing and
  // offload are probed.
  FakeRunner growing;
  growing.meta = true;
  growing.spill_seconds_per_sample = 0.004;
  growing.verification_growth = 2 * kMiB;
  const SearchResult dropped = run_search(growing, job, from_meta());
  plain_sizes.clear();
  for (const ProbeReport& p : dropped.probes)
    if (p.config.find("ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain_sizes.insert(p.micro_batch);
  EXPECT_EQ(plain_sizes, (std::set<int64_t>{16, 32}));
  EXPECT_EQ(dropped.baseline_verified_micro_batch, 0);
  EXPECT_TRUE(std::any_of(dropped.trail.begin(), dropped.trail.end(),
                          [](const TrailNode& n) { return n.config.checkpoint.enabled(); }));
  EXPECT_TRUE(std::any_of(dropped.trail.begin(), dropped.trail.end(),
                          [](const TrailNode& n) { return n.config.offload_optimizer; }));
  EXPECT_EQ(growing.verifications, dropped.verification_trials);
  const auto failed =
      std::find_if(dropped.trail.begin(), dropped.trail.end(), [](const TrailNode& n) { return n.node == "plain"; });
  ASSERT_NE(failed, dropped.trail.end());
  ASSERT_TRUE(failed->verification.has_value());
  EXPECT_EQ(failed->verification->outcome, TrialOutcome::kOutOfMemory);
  EXPECT_NE(failed->note.find("the memory model was low: ruled out from micro-batch " +
                              std::to_string(failed->config.micro_batch) + " up"),
            std::string::npos)
      << failed->note;
  ASSERT_TRUE(dropped.chosen.has_value());
  EXPECT_NE(*dropped.chosen, static_cast<std::size_t>(failed - dropped.trail.begin()));
  int verified = 0;
  for (const TrailNode& n : dropped.trail) verified += n.verification && n.verification->outcome == TrialOutcome::kOk;
  EXPECT_EQ(verified, 3) << "three other candidates fill the slots";
  EXPECT_EQ(growing.verifications, 4);
}

// A first meta run that fails (libtorch 1.13 refuses the meta device)
// leaves the whole search to the lines, with the reason in a note: the
// same trail as a search that never asked.
TEST(MetaMemory, AFirstMetaRunThatFailsLeavesTheLinesInCharge) {
  const JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  FakeRunner lines;
  const SearchResult expected = run_search(lines, job);
  FakeRunner refusing;
  refusing.meta = true;
  refusing.meta_error = "job.toml: device = \"meta\" needs libtorch 2.0 or newer (this is 1.13)";
  const SearchResult r = run_search(refusing, job, from_meta());
  EXPECT_EQ(r.memory_from, MemorySource::kProbes);
  EXPECT_EQ(r.meta_trials, 1);
  EXPECT_TRUE(has_note(r,
                       "memory from the probes' lines, not from the meta device: error during forward: job.toml: "
                       "device = \"meta\" needs libtorch 2.0"))
      << ::testing::PrintToString(r.notes);
  ASSERT_EQ(r.trail.size(), expected.trail.size());
  for (std::size_t i = 0; i < r.trail.size(); ++i) {
    EXPECT_EQ(to_string(r.trail[i].config), to_string(expected.trail[i].config));
    EXPECT_FALSE(r.trail[i].meta_peak_bytes.has_value());
  }
  EXPECT_EQ(refusing.probes, lines.probes);
  // A trial's error names the model's path, which the report names already:
  // the note gives the error without it (Search::outcome_of).
  FakeRunner no_kernel;
  no_kernel.meta = true;
  no_kernel.meta_error = "fake.pt: aten::_unique2 has no meta kernel";
  EXPECT_TRUE(has_note(run_search(no_kernel, job, from_meta()),
                       "not from the meta device: error during forward: aten::_unique2 has no meta kernel"));

  FakeRunner without;  // a runner with no meta device at all
  const SearchResult none = run_search(without, job, from_meta());
  EXPECT_EQ(none.memory_from, MemorySource::kProbes);
  EXPECT_EQ(none.meta_trials, 0);
  EXPECT_TRUE(has_note(none, "cannot run on the meta device")) << ::testing::PrintToString(none.notes);
}

// bf16 autocast has no meta kernels in libtorch: the bf16 nodes are
// predicted from the lines, the note names them, the others are measured.
TEST(MetaMemory, ANodeWhoseMetaRunFailsIsPredictedAndNamed) {
  FakeRunner fake;
  fake.meta = true;
  fake.meta_refuses_bf16 = true;
  JobSpec job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  job.allow_bf16 = true;
  const SearchResult r = run_search(fake, job, from_meta());
  EXPECT_EQ(r.memory_from, MemorySource::kMeta);
  int bf16_nodes = 0;
  for (const TrailNode& n : r.trail) {
    SCOPED_TRACE(n.node);
    const bool bf16 = n.config.precision == Precision::kBf16;
    EXPECT_EQ(n.meta_peak_bytes.has_value(), !bf16);
    bf16_nodes += bf16 ? 1 : 0;
  }
  EXPECT_GT(bf16_nodes, 0);
  EXPECT_TRUE(has_note(r, "did not run on the meta device, so their nodes were predicted from the probes' lines"))
      << ::testing::PrintToString(r.notes);
  EXPECT_TRUE(has_note(r, "precision=bf16 (error during forward: autocast: no meta kernels for bfloat16)"))
      << ::testing::PrintToString(r.notes);
  // Plain fits at 8 x 4 at most, so it is timed at 8 and 4 (Note [Timing
  // probes on meta]); each strategy at 8, where its meta peak fits, but
  // bf16, whose meta run fails: at 4, as without meta.
  for (const ProbeReport& p : r.probes) {
    SCOPED_TRACE(p.config);
    const bool bf16 = p.config.find("precision=bf16") != std::string::npos;
    const bool plain = p.config.find("ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos;
    if (!plain) {
      EXPECT_EQ(p.micro_batch, bf16 ? 4 : 8);
    }
  }
}

// The report: a meta peak column beside the predicted one, the chosen
// configuration's meta peak against its verified one, the meta runs among
// the trials; JSON carries the source and each node's meta bytes.
TEST(MetaMemory, TheReportShowsBothNumbers) {
  FakeRunner fake;
  fake.meta = true;
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job_with_budget(plain_peak(8) + 4 * kMiB + kMiB);
  report.search = run_search(fake, report.job, from_meta());
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("meta peak"), std::string::npos) << text;
  EXPECT_NE(text.find(fmt::format("+ {} meta runs (memory only)", fake.meta_runs)), std::string::npos) << text;
  // The fake's meta and verified peaks are the same curve.
  EXPECT_NE(text.find("of the same configuration, the same bytes as the measured one"), std::string::npos) << text;
  // 48 bytes apart (the Hugging Face SDPA fixture's six int64 tensor
  // constants, host memory on meta): the bytes, not "-0.00 %".
  FakeRunner constants = fake;
  constants.verification_growth = 48;
  AutotuneReport off = report;
  off.search = run_search(constants, report.job, from_meta());
  EXPECT_NE(render_autotune_text(off).find("of the same configuration, 48 B under the measured one\n"),
            std::string::npos)
      << render_autotune_text(off);
  const nlohmann::json j = autotune_json(report);
  EXPECT_EQ(j.at("memory_from"), "meta");
  EXPECT_EQ(j.at("meta_trials"), fake.meta_runs);
  const nlohmann::json& chosen = j.at("chosen");
  EXPECT_EQ(chosen.at("meta_peak_bytes").get<int64_t>(), chosen.at("verification").at("peak_bytes").get<int64_t>());
}

// Memory only (a job on device = "meta"): nothing is verified, and the
// simplest configuration measured to fit is chosen. At 2 MiB below plain's
// peak at 32 (fake_runner.h: plain 274 MiB), one strategy at 32 x 1 fits:
// checkpointing 1 of 4 blocks (-48 MiB), all 4 (-192 MiB), 8-bit AdamW
// (-6 MiB) and offload (-8 MiB); accumulation needs two micro-batches. Of
// the four, 8-bit AdamW saves the least: it changes the step the least.
TEST(MetaMemory, MemoryOnlyChoosesTheSimplestMeasuredFitAndVerifiesNothing) {
  FakeRunner fake;
  fake.meta = true;
  SearchOptions options;
  options.memory_only = true;
  const JobSpec job = job_with_budget(plain_peak(32) - 2 * kMiB);
  const SearchResult r = run_search(fake, job, options);
  EXPECT_TRUE(r.memory_only);
  EXPECT_EQ(r.memory_from, MemorySource::kMeta);
  EXPECT_EQ(fake.verifications, 0);
  EXPECT_EQ(r.verification_trials, 0);
  ASSERT_TRUE(r.chosen.has_value());
  const TrailNode& best = r.trail[*r.chosen];
  EXPECT_EQ(to_string(best.config), "micro_batch=32,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_FALSE(best.verification.has_value());
  EXPECT_EQ(*best.meta_peak_bytes, plain_peak(32) - 6 * kMiB);
  EXPECT_NE(best.note.find("chosen by memory alone"), std::string::npos) << best.note;
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job;
  report.search = r;
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("chosen    micro_batch=32,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32  "
                      "(by memory alone: not verified)"),
            std::string::npos)
      << text;
  EXPECT_TRUE(autotune_json(report).at("memory_only").get<bool>());
  // A real meta run also predicts what a CUDA caching allocator reserves
  // (the fake's do not): the choice's GPU view follows its meta peak,
  // with its margin, or how far over the budget the cache would take it.
  EXPECT_EQ(text.find("on a CUDA caching allocator"), std::string::npos) << text;
  const int64_t usable = *job.usable_budget_bytes();
  report.search.trail[*r.chosen].meta_reserved_bytes = usable - 5 * kMiB;
  EXPECT_NE(render_autotune_text(report).find(
                "          on a CUDA caching allocator (sm90): " + format_bytes(usable - 5 * kMiB) +
                " reserved (predicted, cuBLAS workspaces included); margin 5.00 MiB\n"),
            std::string::npos);
  report.search.trail[*r.chosen].meta_reserved_bytes = usable + 3 * kMiB;
  EXPECT_NE(render_autotune_text(report).find("reserved (predicted, cuBLAS workspaces included); 3.00 MiB over the "
                                              "usable budget: the allocator's cache may run out where the tensors "
                                              "fit; verify on the GPU"),
            std::string::npos);
  EXPECT_EQ(autotune_json(report).at("chosen").at("meta_reserved_bytes").get<int64_t>(), usable + 3 * kMiB);

  // A model that does not run on meta at all is an input error here.
  FakeRunner refusing;
  refusing.meta = true;
  refusing.meta_error = "aten::_unique2 has no meta kernel";
  EXPECT_THROW(run_search(refusing, job, options), InputError);
}

// A job on device = "meta" probes on meta too: each probe's progress line
// gives its peak and says it has no step time, not "0.0000 s/step".
TEST(MetaMemory, MetaProbesPrintNoStepTime) {
  FakeRunner fake;
  fake.meta = true;
  fake.probes_on_meta = true;
  SearchOptions options;
  options.memory_only = true;
  const JobSpec job = job_with_budget(plain_peak(32) - 2 * kMiB);
  std::vector<std::string> lines;
  run_search(fake, job, options, [&](const std::string& line) { lines.push_back(line); });
  int probe_lines = 0;
  for (const std::string& line : lines) {
    if (line.rfind("probe  ", 0) != 0) continue;
    ++probe_lines;
    EXPECT_NE(line.find(", no step time (meta)"), std::string::npos) << line;
    EXPECT_EQ(line.find("s/step"), std::string::npos) << line;
  }
  EXPECT_EQ(probe_lines, fake.probes);
  EXPECT_GT(probe_lines, 0);
}

// Note [Memory only]: optimizer offload comes last. With 64 KiB of
// activations per sample, plain 32 x 1 peaks at 18 MiB + 32 x 64 KiB = 20
// MiB; 7 MiB below it, 8-bit AdamW (-6 MiB) and checkpointing all blocks
// (-0.75 x 64 KiB x 32 = -1.5 MiB) do not fit alone, and together (-7.5
// MiB) they do. Offload alone (-8 MiB) fits with one strategy: the fewest
// strategies chose it, as autotune did for LLaMA-7B at 80 GB. It is chosen
// only where nothing without it fits.
TEST(MetaMemory, MemoryOnlyOffloadsOnlyWhereNothingElseFits) {
  SearchOptions options;
  options.memory_only = true;
  const auto search_under = [&](int64_t budget) {
    FakeRunner fake;
    fake.meta = true;
    fake.activation_per_sample = 64 * 1024;
    return run_search(fake, job_with_budget(budget), options);
  };
  const int64_t plain = 20 * kMiB;
  const SearchResult r = search_under(plain - 7 * kMiB);
  ASSERT_TRUE(r.chosen.has_value());
  const TrailNode& best = r.trail[*r.chosen];
  EXPECT_EQ(to_string(best.config), "micro_batch=32,accum=1,ckpt=all,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_EQ(*best.meta_peak_bytes, plain - 7 * kMiB - kMiB / 2);
  EXPECT_EQ(best.note,
            "chosen by memory alone: the simplest measured to fit without optimizer offload, 512.00 KiB below the "
            "budget; not verified (no step time on meta)");
  const auto offload =
      std::find_if(r.trail.begin(), r.trail.end(), [](const TrailNode& n) { return n.node == "optimizer offload"; });
  ASSERT_NE(offload, r.trail.end());
  EXPECT_EQ(*offload->meta_peak_bytes, plain - 8 * kMiB);
  EXPECT_EQ(offload->note,
            "fits (measured on meta) and is simpler, but offloads: the tree's last resort, its PCIe copies and "
            "CPU update cost time per parameter");
  // 8-bit AdamW changes the updates: the report says so, and names the
  // simplest fit that keeps AdamW.
  EXPECT_TRUE(has_note(r,
                       "the chosen configuration trains with adamw8bit instead of the job's adamw (quantized "
                       "optimizer states: close to, not equal to, adamw's updates); the simplest measured to fit "
                       "with adamw is optimizer offload (micro-batch 32 x 1, adamw, offload, fp32; 12.00 MiB on meta)"))
      << ::testing::PrintToString(r.notes);
  // 8.5 MiB below: only configurations that offload fit, and the simplest
  // of them is chosen, said as before.
  const SearchResult tight = search_under(plain - 17 * kMiB / 2);
  ASSERT_TRUE(tight.chosen.has_value());
  EXPECT_EQ(to_string(tight.trail[*tight.chosen].config),
            "micro_batch=32,accum=1,ckpt=all,optimizer=adamw,offload=on,precision=fp32");
  EXPECT_EQ(tight.trail[*tight.chosen].note.find("without optimizer offload"), std::string::npos);
}

// A job on device = "meta" asks what a GPU would do, so its budget caps
// what a CUDA caching allocator reserves (model_fit.h, budget_scale): with
// meta runs that predict 4 MiB reserved above their tensors and the budget
// 1 MiB above plain's tensors at 32, plain 32 x 1 no longer fits, and
// 8-bit AdamW (-6 MiB) is the simplest that does; the same search on a CPU
// job counts tensors and keeps plain. The report gives both figures.
TEST(MetaMemory, AMetaJobsBudgetCapsTheReservedBytesOfACudaRun) {
  SearchOptions options;
  options.memory_only = true;
  JobSpec job = job_with_budget(plain_peak(32) + kMiB);
  const auto search_on = [&](Device device) {
    FakeRunner fake;
    fake.meta = true;
    fake.meta_reserved_extra = 4 * kMiB;
    job.device = device;
    return run_search(fake, job, options);
  };
  const SearchResult cpu = search_on(Device::kCpu);
  EXPECT_FALSE(cpu.budget_on_reserved);
  ASSERT_TRUE(cpu.chosen.has_value());
  EXPECT_EQ(to_string(cpu.trail[*cpu.chosen].config),
            "micro_batch=32,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32");

  const SearchResult r = search_on(Device::kMeta);
  EXPECT_TRUE(r.budget_on_reserved);
  ASSERT_TRUE(r.chosen.has_value());
  const TrailNode& best = r.trail[*r.chosen];
  EXPECT_EQ(to_string(best.config), "micro_batch=32,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_EQ(*best.meta_tensor_peak_bytes, plain_peak(32) - 6 * kMiB);
  EXPECT_EQ(*best.meta_reserved_bytes, plain_peak(32) - 2 * kMiB);
  EXPECT_EQ(*best.meta_peak_bytes, plain_peak(32) - 2 * kMiB) << "the fit's figure is the reserved one";
  const auto plain = std::find_if(r.trail.begin(), r.trail.end(), [](const TrailNode& n) { return n.node == "plain"; });
  ASSERT_NE(plain, r.trail.end());
  EXPECT_FALSE(plain->predicted_fit);
  EXPECT_NE(plain->note.find("measured on meta not to fit: " + format_bytes(plain_peak(32) + 4 * kMiB) +
                             " reserved > budget"),
            std::string::npos)
      << plain->note;
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job;
  report.search = r;
  const std::string text = render_autotune_text(report);
  EXPECT_NE(text.find("          meta peak " + format_bytes(plain_peak(32) - 6 * kMiB) +
                      " of tensors and cuBLAS workspaces\n          on a CUDA caching allocator (sm90): " +
                      format_bytes(plain_peak(32) - 2 * kMiB) +
                      " reserved (predicted, cuBLAS workspaces included); margin 3.00 MiB to the usable budget\n"),
            std::string::npos)
      << text;
  EXPECT_TRUE(autotune_json(report).at("budget_on_reserved").get<bool>());
}

// A CUDA job's chosen configuration, verified on the GPU, sets each of its
// meta run's figures beside the measured one of the same kind: tensors and
// cuBLAS workspaces beside allocated, predicted reserved beside reserved.
// The fake GPU's allocator reserves 3 MiB above its tensors, the meta run
// predicts 4. With 1 MiB of workspaces reported by the meta run (none in
// its peak), the meta figure is 1 MiB over the GPU's, which held them in
// the tensors the fake measures: on an H200 the example GPT's meta run
// said 121.04 MiB of tensors against the GPU's 187.23 MiB allocated,
// "-35.35 %", for want of its 64 MiB of workspaces (2026-11-29).
TEST(MetaMemory, ACudaJobComparesTheMetaRunWithTheGpuRunFigureByFigure) {
  FakeRunner fake;
  fake.meta = true;
  fake.meta_reserved_extra = 4 * kMiB;
  fake.gpu_reserved_extra = 3 * kMiB;
  fake.meta_workspace_bytes = kMiB;
  AutotuneReport report;
  report.job_path = "job.toml";
  report.job = job_with_budget(plain_peak(32) + kMiB);
  report.job.device = Device::kCuda;
  report.search = run_search(fake, report.job, from_meta());
  ASSERT_TRUE(report.search.chosen.has_value());
  const TrailNode& best = report.search.trail[*report.search.chosen];
  ASSERT_TRUE(best.verification && best.meta_tensor_peak_bytes);
  const int64_t tensors = best.verification->peak_bytes;
  EXPECT_EQ(*best.meta_tensor_peak_bytes, tensors + kMiB) << "the fake's meta and GPU runs hold the same tensors";
  EXPECT_EQ(*best.meta_reserved_bytes, tensors + 4 * kMiB);
  const std::string text = render_autotune_text(report);
  EXPECT_NE(
      text.find(fmt::format("          measured peak {} of tensors, {} reserved over 20 steps in a fresh "
                            "process; margin {} to the usable budget\n"
                            "          meta run of the same configuration: {} of tensors and cuBLAS workspaces, "
                            "{:+.2f} % from the measured ones; {} reserved (predicted), {:+.2f} %\n",
                            format_bytes(tensors), format_bytes(tensors + 3 * kMiB),
                            format_bytes(plain_peak(32) + kMiB - tensors - 3 * kMiB), format_bytes(tensors + kMiB),
                            100.0 * kMiB / static_cast<double>(tensors), format_bytes(tensors + 4 * kMiB),
                            100.0 * kMiB / static_cast<double>(tensors + 3 * kMiB))),
      std::string::npos)
      << text;
}

// search/fit.cpp, Note [An error that comes with the size], where memory
// comes from meta: the plain probes time the sizes where the candidates run,
// 16 and 32, and both fail with a kernel's launch-limit error from 16 up
// (the meta runs, which run no kernel, do not). Before, autotune stopped
// there: "fake.pt: the plain configuration could not run at micro-batch
// 16 or 32: CUDA error: invalid configuration argument", a bad input. Now
// the probes go down, 8 and 4 run, the search keeps to 15 or less and
// chooses 8 x 4.
TEST(MetaMemory, TimingProbesThatAllFailForTheirSizeStepDown) {
  FakeRunner fake;
  fake.meta = true;
  fake.fails_at_or_above = 16;
  const SearchResult r = run_search(fake, job_with_budget(plain_peak(32) + kMiB), from_meta());
  std::vector<std::string> plain;
  for (const ProbeReport& p : r.probes)
    if (p.config.find(",ckpt=none,optimizer=adamw,offload=off,precision=fp32") != std::string::npos)
      plain.push_back(std::to_string(p.micro_batch) + " " + to_string(p.outcome));
  EXPECT_EQ(plain, (std::vector<std::string>{"16 error", "32 error", "8 ok", "4 ok"}));
  EXPECT_EQ(r.largest_micro_batch, 8);
  ASSERT_TRUE(r.chosen.has_value());
  EXPECT_EQ(r.trail[*r.chosen].config.micro_batch, 8);
  EXPECT_EQ(r.trail[*r.chosen].config.accumulation_steps, 4);
  EXPECT_TRUE(has_note(r,
                       "micro-batch 16 cannot run (error during forward: CUDA error: invalid configuration "
                       "argument) where 8 ran"));
  EXPECT_FALSE(has_note(r, "not from the meta device")) << "the meta runs ran";
}

}  // namespace
}  // namespace oomtune
