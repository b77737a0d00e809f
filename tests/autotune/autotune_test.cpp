// Acceptance tests for `oomtune autotune` (issue #5): the real binary, end to
// end, on small jobs. Each branch of the search is the answer once, on a
// budget chosen (docs/autotune.md, "Acceptance budgets") so that the branch
// is the only kind of configuration that fits; each test checks the chosen
// config, the exact global batch and that the verified peak is within the
// usable budget. Memory on the CPU backend is deterministic, timing is not:
// the assertions are on what the budget forces, never on which of two
// equally fitting configurations was measured faster.

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "autotune_jobs.h"
#include "support/require_file.h"
#include "support/run_oomtune.h"

namespace oomtune {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// These tests hold the search's lines to their budgets (docs/autotune.md,
// "Acceptance budgets"), so they take memory from the probes; memory from
// the meta device has its own tests (AutotuneMeta below).
const std::string kAutotune = "autotune --memory-from probes ";
using testing::bf16_runs_here;
using testing::exists;
using testing::Gpt;
using testing::gpt_job;
using testing::kSmall;
using testing::kWide;
using testing::last_line;
using testing::model;
using testing::resnet50;
using testing::resnet50_job;
using testing::run_oomtune;
using testing::RunResult;
using testing::slurp;
using testing::TestDir;

json parse_json(const RunResult& r) {
  static int calls = 0;
  std::ofstream(testing::test_dir_path() / ("stdout_" + std::to_string(++calls) + ".json")) << r.out;
  try {
    return json::parse(r.out);
  } catch (const json::exception& e) {
    ADD_FAILURE() << "not JSON: " << e.what() << "\nstdout:\n" << r.out << "\nstderr:\n" << r.err;
    return json::object();
  }
}

/// Checks what every successful autotune must hold, and returns the chosen node.
json check_chosen(const json& report, int64_t global_batch) {
  const json& chosen = report.at("chosen");
  EXPECT_FALSE(chosen.is_null());
  if (chosen.is_null()) return chosen;
  const int64_t micro = chosen.at("micro_batch"), accumulation = chosen.at("accumulation_steps");
  EXPECT_EQ(micro * accumulation, global_batch) << "the global batch stays exact";
  const json& v = chosen.at("verification");
  EXPECT_EQ(v.at("outcome"), "ok");
  EXPECT_EQ(v.at("global_batch"), global_batch) << "verified on the job's global batch";
  EXPECT_EQ(v.at("config"), chosen.at("config"));
  EXPECT_GE(v.at("steps_run").get<int64_t>(), 3) << "verified over the job's verify_steps";
  EXPECT_GT(v.at("peak_bytes").get<int64_t>(), 0);
  EXPECT_LE(v.at("peak_bytes").get<int64_t>(), report.at("usable_budget_bytes").get<int64_t>());
  EXPECT_GT(v.at("samples_per_second").get<double>(), 0);
  EXPECT_LE(report.at("verification_trials").get<int64_t>(), 6);
  return chosen;
}

/// |predicted - measured| / measured of a verified node's peak.
double predicted_peak_error(const json& node) {
  const double predicted = node.at("predicted_peak_bytes").get<double>();
  const double measured = node.at("verification").at("peak_bytes").get<double>();
  return std::abs(predicted - measured) / measured;
}

/// The verified nodes that ran. Which of them is chosen depends on measured
/// times; that they were verified does not where the budget leaves no more
/// candidates than verifications, so byte checks go through these.
std::vector<json> verified_nodes(const json& report) {
  std::vector<json> nodes;
  for (const json& n : report.at("trail"))
    if (n.contains("verification") && n.at("verification").at("outcome") == "ok") nodes.push_back(n);
  return nodes;
}

std::string dump_trail(const json& report) {
  std::string text;
  for (const json& n : report.at("trail"))
    text += n.at("node").get<std::string>() + "  " + n.at("config").get<std::string>() + "  " +
            n.at("note").get<std::string>() + "\n";
  for (const json& n : report.at("notes")) text += "note: " + n.get<std::string>() + "\n";
  return text;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// ---- The six branches.

// Plain fit (ResNet-50): the whole batch fits with nothing changed, and the
// micro-batch the plain fit never probed (8; probes are 1, 2 and 4) is
// predicted within 5 % of its verified peak. Accumulation is ruled out by the
// budget (it keeps a full set of gradients alive: 4 x 2 peaks at 308.52 MiB,
// plain 8 x 1 at 301.68 MiB; 320 MiB leaves 304 MiB usable). At 360 MiB both
// fitted and the choice between them was timing: 4 x 2 won by 16 % in one run
// at one thread (PyPI suite, 2026-11-28) and lost by 37 % in another. The
// offload trial is made to crash (test hook): the search must carry on
// without it (on the CPU backend offload costs almost no time, and it is
// counted no faster than plain: search.h, Rules: Work added).
// Checkpointing the first of 16 blocks costs about 1 % of a step, below
// timing noise: two candidates are verified, plain
// always among them (the simplest), and within the timing tie ratio the
// simplest wins (docs/autotune.md). With one, the times alone decided which
// single candidate ran, and so which peak the test checked.
TEST(Autotune, PlainFitOnResNet50AndHeldBackPrediction) {
  OOMTUNE_REQUIRE_FILE(resnet50());
  const TestDir dir;
  const RunResult r =
      run_oomtune(kAutotune + resnet50_job(dir, 8, "budget = \"320MiB\"") + " --json --max-verifications 2",
                  "OOMTUNE_TEST_FAULT=segv:optimizer:offload=on");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 8);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_EQ(chosen.at("node"), "plain") << dump_trail(report);
  EXPECT_EQ(chosen.at("config"), "micro_batch=8,accum=1,ckpt=none,optimizer=sgd,offload=off,precision=fp32");
  // Held back: the plain line was fitted to probes at smaller micro-batches.
  for (const json& p : report.at("probes")) {
    if (contains(p.at("config").get<std::string>(), "ckpt=none,optimizer=sgd,offload=off")) {
      EXPECT_LT(p.at("micro_batch").get<int64_t>(), 8);
    }
  }
  // Plain, the simplest candidate, is always among those verified
  // (search/choose.cpp, verify_candidates): its bytes are checked whatever
  // the times ranked first.
  const std::vector<json> verified = verified_nodes(report);
  const auto plain =
      std::find_if(verified.begin(), verified.end(), [](const json& n) { return n.at("node") == "plain"; });
  ASSERT_NE(plain, verified.end()) << dump_trail(report);
  EXPECT_LE(predicted_peak_error(*plain), 0.05) << plain->dump();
  // The crashed offload probe is a note, not the end of the search.
  EXPECT_TRUE(contains(dump_trail(report), "optimizer offload: not available (micro-batch") &&
              contains(dump_trail(report), "crashed: SIGSEGV during optimizer"))
      << dump_trail(report);
}

// Checkpointing (small GPT): min_micro_batch = global batch (a user
// constraint) rules out accumulation; the budget is below plain, 8-bit and
// offload at micro-batch 8 and above checkpointing at 8.
TEST(Autotune, CheckpointingWhenOnlyRecomputeFits) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const fs::path emit = dir / "plan";
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 8, "min_micro_batch = 8\nbudget = \"4850KiB\"") +
                                  " --json --emit " + emit.string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 8);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_EQ(chosen.at("micro_batch"), 8);
  EXPECT_TRUE(contains(chosen.at("node").get<std::string>(), "checkpointing")) << dump_trail(report);
  EXPECT_FALSE(contains(chosen.at("config").get<std::string>(), "ckpt=none")) << dump_trail(report);

  // --emit: the plan and every framework's config, the plan's config the chosen one.
  for (const char* name :
       {"plan.toml", "ds_config.json", "hf_training_args.json", "lightning_trainer.json", "accelerate_config.yaml"})
    EXPECT_TRUE(fs::exists(emit / name)) << name;
  EXPECT_EQ(report.at("emitted_files").size(), 5u);
  const RunResult plan = run_oomtune("probe --plan " + (emit / "plan.toml").string() + " --json --no-fit");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_EQ(parse_json(plan).at("report").at("config"), chosen.at("config"));
  EXPECT_TRUE(contains(slurp(emit / "ds_config.json"), "\"gradient_accumulation_steps\": 1"));
}

// Micro-batch + accumulation (small GPT, global batch 16), and crash
// isolation end to end: every checkpointing trial crashes (SIGSEGV in
// forward, test hook). Without checkpointing, the budget is below every
// configuration at micro-batch 16 (plain, 8-bit, offload) and above plain at
// 8 x 2, so the answer must accumulate.
TEST(Autotune, AccumulationWhenTheFullBatchDoesNotFitAndCrashesAreData) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 16, "budget = \"9000KiB\"") + " --json",
                                  "OOMTUNE_TEST_FAULT=segv:forward:ckpt=all");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 16);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_LT(chosen.at("micro_batch").get<int64_t>(), 16) << dump_trail(report);
  EXPECT_GT(chosen.at("accumulation_steps").get<int64_t>(), 1);
  EXPECT_TRUE(contains(chosen.at("config").get<std::string>(), "ckpt=none"));
  bool crash_noted = false;
  for (const json& note : report.at("notes"))
    crash_noted |= contains(note.get<std::string>(), "activation checkpointing") &&
                   contains(note.get<std::string>(), "crashed: SIGSEGV during forward");
  EXPECT_TRUE(crash_noted) << dump_trail(report);
}

// A micro-batch too large to run for another reason than memory (a CUDA
// kernel's grid past its limit; test hook "error": every trial at
// micro-batch 16, the global batch, fails in forward with that error):
// autotune keeps below it and trains 8 x 2 (search/fit.cpp, Note [An error
// that comes with the size]). Plain 16 x 1 is its first candidate; where
// memory comes from meta (PyPI build) it fails as plain's early
// verification and as its probe at 16, else as its verification.
TEST(Autotune, AMicroBatchThatFailsForItsSizeIsLeftForTheOneBelow) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 16, "budget = \"64MiB\"") + " --json",
                                  "OOMTUNE_TEST_FAULT=error:forward:micro_batch=16,");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 16);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_EQ(chosen.at("micro_batch").get<int64_t>(), 8) << dump_trail(report);
  EXPECT_EQ(chosen.at("accumulation_steps").get<int64_t>(), 2);
  // The trail keeps the failed run at 16 (plain's verification, or the
  // early one where memory comes from meta); every other node is below.
  int failed_at_16 = 0;
  for (const json& n : report.at("trail")) {
    if (n.contains("verification") && n.at("verification").at("outcome") == "error") {
      EXPECT_EQ(n.at("micro_batch").get<int64_t>(), 16) << dump_trail(report);
      ++failed_at_16;
    } else {
      EXPECT_LE(n.at("micro_batch").get<int64_t>(), 8) << dump_trail(report);
    }
  }
  EXPECT_LE(failed_at_16, 1) << dump_trail(report);
  EXPECT_EQ(report.at("largest_micro_batch").get<int64_t>(), 8);
  bool noted = false;
  for (const json& note : report.at("notes"))
    noted |= contains(note.get<std::string>(),
                      "micro-batch 16 cannot run (error during forward: CUDA error: invalid configuration argument "
                      "(test fault: OOMTUNE_TEST_FAULT)) where 8 ran: an error that comes with the size");
  EXPECT_TRUE(noted) << dump_trail(report);
}

// An autotune --json report's ran_out_in_verification, checked to hold
// every verification run, each out of memory.
const json& expect_every_verification_ran_out(const json& report) {
  const json& ran_out = report.at("ran_out_in_verification");
  EXPECT_EQ(ran_out.size(), report.at("verification_trials").get<std::size_t>());
  for (const json& n : ran_out) EXPECT_EQ(n.at("verification").at("outcome"), "out_of_memory") << n.at("config");
  return ran_out;
}

// Every verification run of the small GPT (G = 16) runs out of memory in
// its optimizer step (test hook "oom", matching "global_batch=16," only:
// no probe fails). autotune walks the tree again one size down
// (search/walk.cpp, Note [Verifications that run out of memory]), those
// runs fail too, and it says that nothing was verified to fit, exit 4:
// configurations predicted to fit remain unrun. Before, it answered
// "nothing fits: the least memory any configuration needs is 1.57 MiB
// (predicted, micro-batch 1), the usable budget is 60.80 MiB", exit 3, with
// a ZeRO table in which one GPU fits.
TEST(Autotune, VerificationsThatAllRunOutOfMemoryAreNotNothingFits) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 16, "budget = \"64MiB\""),
                                  "OOMTUNE_TEST_FAULT=oom:optimizer:global_batch=16,");
  EXPECT_EQ(r.exit_code, 4) << r.err;
  EXPECT_TRUE(contains(r.out, "\nnothing verified to fit: ")) << r.out;
  EXPECT_TRUE(contains(r.out,
                       " predicted to fit ran out of memory in their verification runs of 3 steps (down to "
                       "micro-batch "))
      << r.out;
  EXPECT_TRUE(contains(r.out, " more predicted to fit were not run: --max-verifications N runs more")) << r.out;
  EXPECT_FALSE(contains(r.out, "nothing fits")) << r.out;
  EXPECT_FALSE(contains(r.out, "ZeRO-3")) << r.out;
  EXPECT_TRUE(contains(r.err, "autotune: walk   again below the micro-batches whose verification ran out of memory"))
      << r.err;
  const RunResult j = run_oomtune(kAutotune + gpt_job(dir, kSmall, 16, "budget = \"64MiB\"") + " --json",
                                  "OOMTUNE_TEST_FAULT=oom:optimizer:global_batch=16,");
  EXPECT_EQ(j.exit_code, 4) << j.err;
  const json report = parse_json(j);
  EXPECT_TRUE(report.at("chosen").is_null());
  EXPECT_EQ(report.at("unverified"), json::array());
  expect_every_verification_ran_out(report);
  EXPECT_GT(report.at("candidates_not_run").get<int64_t>(), 0);
}

// As above, at global batch 4, with verifications enough for every
// configuration predicted to fit (19 runs, down to micro-batch 1): none is
// left, so nothing fits, exit 3, said as runs that ran out, not as a
// predicted least memory. No ZeRO/FSDP table, in text or JSON: it came from
// the memory model these runs found low, and before it said that DDP fits
// one GPU.
TEST(Autotune, VerificationsThatAllRunOutDownToTheLastAreNothingFits) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kSmall, 4, "budget = \"64MiB\"") + " --max-verifications 100";
  const RunResult r = run_oomtune(kAutotune + job + " --json", "OOMTUNE_TEST_FAULT=oom:optimizer:global_batch=4,");
  EXPECT_EQ(r.exit_code, 3) << r.err;
  const json report = parse_json(r);
  EXPECT_TRUE(report.at("chosen").is_null());
  EXPECT_EQ(report.at("candidates_not_run"), 0);
  EXPECT_FALSE(report.contains("nothing_fits")) << report.at("nothing_fits").dump();
  const json& ran_out = expect_every_verification_ran_out(report);
  std::set<int64_t> micro_batches;
  for (const json& n : ran_out) micro_batches.insert(n.at("micro_batch").get<int64_t>());
  EXPECT_EQ(micro_batches, (std::set<int64_t>{1, 2, 4}));
  const RunResult t = run_oomtune(kAutotune + job, "OOMTUNE_TEST_FAULT=oom:optimizer:global_batch=4,");
  EXPECT_EQ(t.exit_code, 3) << t.err;
  EXPECT_TRUE(contains(t.out, "\nnothing fits: all " + std::to_string(ran_out.size()) +
                                  " configurations predicted to fit ran out of memory in their verification runs of 3 "
                                  "steps (down to micro-batch 1), and none is left to run: no run got past its first "
                                  "step, "))
      << t.out;
  EXPECT_TRUE(contains(t.out, "\n          no ZeRO/FSDP table: ")) << t.out;
  EXPECT_FALSE(contains(t.out, "ZeRO-3")) << t.out;
  EXPECT_FALSE(contains(t.out, "were not run")) << t.out;
}

// 8-bit AdamW (wide GPT): fp32 AdamW needs 16 bytes per parameter before any
// activation (40 MB) — over the budget at every micro-batch — while 8-bit
// AdamW at 8 x 1 fits. Offload fits wherever 8-bit does and costs no time on
// the CPU backend, so its trial is made to crash (test hook). The plain
// probes (1, 2, 4) all peak in backward at its end, a flat line; 8 x 1
// peaks early in backward, and its peak is predicted from backward's
// activation peak (search/memory_model.cpp, Note [Backward activation
// peak]; before it: 24.85 MiB predicted, 28.85 measured).
TEST(Autotune, EightBitWhenNoAdamWConfigurationFits) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kWide, 8, "budget = \"36MiB\"") + " --json",
                                  "OOMTUNE_TEST_FAULT=segv:optimizer:offload=on");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 8);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_TRUE(contains(chosen.at("config").get<std::string>(), "optimizer=adamw8bit")) << dump_trail(report);
  EXPECT_TRUE(contains(chosen.at("config").get<std::string>(), "offload=off"));
  const int64_t parameter_bytes = 4 * report.at("parameter_count").get<int64_t>();
  EXPECT_GT(4 * parameter_bytes, report.at("usable_budget_bytes").get<int64_t>())
      << "fp32 AdamW's weights, gradients and two states alone are over the budget";
  const std::vector<json> verified = verified_nodes(report);
  EXPECT_EQ(verified.size(), 2u) << "8-bit AdamW, with and without checkpointing\n" << dump_trail(report);
  for (const json& n : verified) EXPECT_LE(predicted_peak_error(n), 0.02) << n.dump();
}

// Optimizer offload (wide GPT): the budget is below every 8-bit AdamW
// configuration and above offload at 8 x 1, whose peak is predicted as
// 8-bit AdamW's is (before Note [Backward activation peak]: 20.05 MiB
// predicted, 24.05 measured).
TEST(Autotune, OffloadWhenEightBitDoesNotFit) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kWide, 8, "budget = \"26.5MiB\"") + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 8);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_TRUE(contains(chosen.at("config").get<std::string>(), "offload=on")) << dump_trail(report);
  EXPECT_EQ(chosen.at("verification").at("static").at("optimizer_state_bytes"), 0)
      << "no optimizer state on the device";
  const std::vector<json> verified = verified_nodes(report);
  EXPECT_EQ(verified.size(), 2u) << "offload, with and without checkpointing\n" << dump_trail(report);
  for (const json& n : verified) EXPECT_LE(predicted_peak_error(n), 0.02) << n.dump();
}

// Every fitting node verified (wide GPT, G = 16, 36 MiB): 8-bit AdamW and
// offload, with and without checkpointing, at micro-batches the probes
// (2, 4, 8 plain; 2, 4 checkpointing; 2 for 8-bit AdamW and offload) never
// ran, several of them accumulated. Memory on the CPU backend is
// deterministic, so each verified peak is checked against its prediction:
// never above it but for the 4 bytes of the scaled loss (an accumulated
// step's backward starts from loss / k, a probe's from the loss itself)
// and at most 1 % below. Measured (2-core CPU, Debian's 1.13): 8-bit AdamW
// 4 x 4 31.039 MiB, + checkpointing 4 x 4 30.022, offload 8 x 2 33.365,
// offload + checkpointing 16 x 1 34.070, each predicted 0 to 4 bytes below
// its run (memory_model.cpp, Note [Backward by gradients]). With one
// accumulating line through the probes at 2, 4 and 8, which meets a large
// pending gradient at 2 and the activations at 8, the first three were
// predicted +4.5 %, +1.9 % and +0.8 % over. Before backward's activation
// lines (Note [Backward activation peak]) 8-bit AdamW was held to 2 x 8
// (33.40 predicted, 29.51 ran); with the accumulating line alone 8-bit
// AdamW + checkpointing 8 x 2 was predicted at 33.07 and ran out of memory.
TEST(Autotune, AccumulatedPeaksArePredictedFromBackwardsActivationLines) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const RunResult r =
      run_oomtune(kAutotune + gpt_job(dir, kWide, 16, "budget = \"36MiB\"") + " --json --max-verifications 20");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  check_chosen(report, 16);
  int verified = 0;
  for (const json& node : report.at("trail")) {
    if (!node.contains("verification") || node.at("verification").is_null()) continue;
    ++verified;
    const json& v = node.at("verification");
    EXPECT_EQ(v.at("outcome"), "ok") << node.dump();
    if (v.at("outcome") != "ok") continue;
    const double predicted = node.at("predicted_peak_bytes").get<double>();
    const double measured = v.at("peak_bytes").get<double>();
    EXPECT_LE(measured, predicted + 4) << node.at("config");
    EXPECT_GE(measured, 0.99 * predicted) << node.at("config");
  }
  EXPECT_EQ(verified, 4) << dump_trail(report);
}

// Nothing fits (wide GPT): the budget is above the parameters (9.98 MB) but
// below weights + gradients (20 MB), which every configuration keeps on the
// device: exit 3 and the ZeRO table.
TEST(Autotune, NothingFitsGivesTheZeroTable) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kWide, 8, "budget = \"16MiB\"");
  const RunResult r = run_oomtune(kAutotune + job + " --json");
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const json report = parse_json(r);
  EXPECT_TRUE(report.at("chosen").is_null());
  const json& zero = report.at("nothing_fits");
  EXPECT_EQ(zero.at("parameters"), 2496000);
  ASSERT_EQ(zero.at("rows").size(), 6u) << zero.dump(2);  // DDP, ZeRO-1/2/3, FSDP SHARD_GRAD_OP / FULL_SHARD
  const json& ddp = zero.at("rows")[0];
  const json& zero3 = zero.at("rows")[3];
  EXPECT_EQ(ddp.at("strategy"), "DDP (ZeRO-0)");
  EXPECT_EQ(zero3.at("strategy"), "ZeRO-3");
  EXPECT_TRUE(ddp.at("min_gpus").is_null()) << "DDP replicates everything: no number of GPUs helps";
  // ZeRO-3 shards weights, gradients and the 16 bytes/parameter of AdamW
  // (ZeRO paper) over the GPUs: some N fits, at less per GPU than DDP.
  EXPECT_LT(zero3.at("per_gpu").at("total").get<int64_t>(), ddp.at("per_gpu").at("total").get<int64_t>());
  ASSERT_FALSE(zero3.at("min_gpus").is_null());
  EXPECT_GT(zero3.at("min_gpus").get<int64_t>(), 1);
  EXPECT_GT(report.at("smallest_predicted_peak_bytes").get<int64_t>(), report.at("usable_budget_bytes").get<int64_t>());
  for (const json& n : report.at("trail")) EXPECT_FALSE(n.contains("verification")) << "nothing is verified";

  const RunResult text = run_oomtune(kAutotune + job);
  EXPECT_EQ(text.exit_code, 3);
  EXPECT_TRUE(contains(text.out, "nothing fits")) << text.out;
  EXPECT_TRUE(contains(text.out, "ZeRO-3")) << text.out;
}

// A budget too tight for the first probe (small GPT, G = 64: plain probes at
// 8, 16 and 32). At 1.3 MiB the probes' RAM guard is 4 x 1.235 = 4.94 MiB and
// plain micro-batch 8 needs 6.18 MiB (4 needs 4.05 MiB): the probes step down to 4 and 2
// (halving) instead of trying 16 and 32, and the answer is "nothing fits",
// exit 3, not exit 2 ("could not run at micro-batch 8") as before.
TEST(Autotune, ABudgetTooTightForTheFirstProbeStepsDown) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 64, "budget = \"1.3MiB\"") + " --json");
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const json report = parse_json(r);
  std::vector<std::string> plain;
  for (const json& p : report.at("probes"))
    if (contains(p.at("config").get<std::string>(), ",ckpt=none,optimizer=adamw,offload=off,"))
      plain.push_back(std::to_string(p.at("micro_batch").get<int64_t>()) + " " + p.at("outcome").get<std::string>());
  EXPECT_EQ(plain, (std::vector<std::string>{"8 out_of_memory", "4 ok", "2 ok"}));
  EXPECT_EQ(report.at("baseline_model").at("micro_batches"), json({2, 4}));
  EXPECT_FALSE(report.at("nothing_fits").is_null());
}

// Plain out of memory at every micro-batch (Note [Rescue] in
// search/rescue.cpp): gpt_wide with AdamW at 10.1 MiB (9.59 MiB
// usable, just above the 9.52 MiB of parameters) probes under a 38.38 MiB
// guard, and plain at micro-batch 1 needs weights, gradients and two AdamW
// moments (4 x 9.52 MiB) plus its activations. The least-memory combination
// (checkpointing + offload) runs there, checkpointing alone does not, 8-bit
// AdamW does: the search builds on it and answers "nothing fits" with the
// ZeRO table (weights + gradients alone are 19.04 MiB), exit 3. Before, this
// was exit 2 ("the plain configuration could not run at micro-batch 1").
TEST(Autotune, PlainOutOfMemoryAtEveryMicroBatchBuildsOnTheSimplestStrategyThatRuns) {
  OOMTUNE_REQUIRE_FILE(model(kWide.name));
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kWide, 8, "budget = \"10.1MiB\"") + " --json");
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const json report = parse_json(r);
  std::vector<std::string> probes;
  for (const json& p : report.at("probes"))
    probes.push_back(std::to_string(p.at("micro_batch").get<int64_t>()) + " " + p.at("config").get<std::string>() +
                     " " + p.at("outcome").get<std::string>());
  ASSERT_GE(probes.size(), 5u);
  EXPECT_EQ(probes[0], "1 micro_batch=1,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32 out_of_memory");
  EXPECT_EQ(probes[1], "1 micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=on,precision=fp32 ok");
  EXPECT_EQ(probes[2], "1 micro_batch=1,accum=1,ckpt=all,optimizer=adamw,offload=off,precision=fp32 out_of_memory");
  EXPECT_EQ(probes[3], "1 micro_batch=1,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32 ok");
  EXPECT_EQ(report.at("baseline_model").at("configuration"), "8-bit AdamW");
  EXPECT_TRUE(report.at("least_memory_failure").is_null());
  EXPECT_TRUE(contains(report.at("notes")[0].get<std::string>(),
                       "plain ran out of memory at every micro-batch down to 1 (oomtune budget: tried to allocate"))
      << dump_trail(report);
  for (const json& n : report.at("trail")) {
    const std::string config = n.at("config");
    EXPECT_TRUE(contains(config, "optimizer=adamw8bit") || contains(config, "offload=on")) << dump_trail(report);
    EXPECT_FALSE(n.at("predicted_fit").get<bool>()) << dump_trail(report);
  }
  EXPECT_FALSE(report.at("nothing_fits").is_null());
}

/// Autotune of the small GPT (G = 8, 64 MiB, `extra` job lines, `flags`)
/// with plain forced out of memory at every micro-batch (test fault), so
/// that checkpointing rescues it; checks that it did. Returns the JSON
/// report (empty after a failure) and puts the configurations of the
/// probes that ran in `ran`.
json rescued_small_gpt(const TestDir& dir, const std::string& extra, const std::string& flags,
                       std::set<std::string>& ran) {
  const std::string job = gpt_job(dir, kSmall, 8, "budget = \"64MiB\"" + extra);
  const RunResult r = run_oomtune(kAutotune + job + " --json" + flags,
                                  "OOMTUNE_TEST_FAULT=oom:forward:ckpt=none,optimizer=adamw,offload=off,");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  if (r.exit_code != 0) return json::object();
  const json report = parse_json(r);
  if (report.empty()) return report;
  EXPECT_EQ(report.at("baseline_model").at("configuration"), "checkpointing (all blocks)") << dump_trail(report);
  for (const json& p : report.at("probes"))
    if (p.at("outcome") == "ok") ran.insert(p.at("config").get<std::string>());
  return report;
}

// Plain runs out of memory in every trial (test hook "oom": the trial throws
// the allocator's out-of-memory error; its text matches plain's config
// only), so checkpointing all blocks, the first single strategy that runs,
// becomes the base. 8-bit AdamW alone and offload alone, which do not
// recompute, are probed at 1 and 2 without it and are nodes of their own,
// fitted to those probes: both fit the budget at 8 x 1.
TEST(Autotune, RescueAlternativesWithoutTheBaseAreProbedAndPredicted) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  const TestDir dir;
  std::set<std::string> ran;
  const json report = rescued_small_gpt(dir, "", "", ran);
  if (report.empty()) return;
  for (const char* config : {"micro_batch=1,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32",
                             "micro_batch=2,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32",
                             "micro_batch=1,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=fp32",
                             "micro_batch=2,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=fp32"})
    EXPECT_EQ(ran.count(config), 1u) << config;
  std::map<std::string, std::string> alternatives;
  for (const json& n : report.at("trail")) {
    const std::string node = n.at("node");
    if (node != "8-bit AdamW" && node != "optimizer offload") continue;
    alternatives[node] = n.at("config");
    EXPECT_TRUE(n.at("predicted_fit").get<bool>()) << dump_trail(report);
  }
  EXPECT_EQ(alternatives["8-bit AdamW"],
            "micro_batch=8,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=fp32");
  EXPECT_EQ(alternatives["optimizer offload"],
            "micro_batch=8,accum=1,ckpt=none,optimizer=adamw,offload=on,precision=fp32");
  check_chosen(report, 8);
}

// The rescue above with bf16 allowed: the fault also makes bf16 alone run
// out (its configuration names the job's optimizer without offload), and
// 8-bit AdamW + bf16, which neither recomputes nor offloads, is probed
// without checkpointing at 1 and 2 and becomes a node of its own. Every
// fitting node is verified, so its prediction meets its real run (8 x 1:
// 4.49 MiB predicted and measured on the 2-core CPU).
TEST(Autotune, ARescueProbes8bitAdamWWithBf16WithoutTheBase) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  if (!bf16_runs_here()) GTEST_SKIP() << "bf16 does not run at this kernel level (DNNL_MAX_CPU_ISA below AVX-512)";
  const TestDir dir;
  std::set<std::string> ran;
  const json report = rescued_small_gpt(dir, "\nallow_bf16 = true", " --max-verifications 20", ran);
  if (report.empty()) return;
  for (const char* config : {"micro_batch=1,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=bf16",
                             "micro_batch=2,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=bf16"})
    EXPECT_EQ(ran.count(config), 1u) << config;
  const json* pair = nullptr;
  for (const json& n : report.at("trail"))
    if (n.at("node") == "8-bit AdamW + bf16") pair = &n;
  ASSERT_NE(pair, nullptr) << dump_trail(report);
  EXPECT_EQ(pair->at("config"), "micro_batch=8,accum=1,ckpt=none,optimizer=adamw8bit,offload=off,precision=bf16");
  ASSERT_TRUE(pair->contains("verification")) << dump_trail(report);
  const double predicted = pair->at("predicted_peak_bytes").get<double>();
  const double measured = pair->at("verification").at("peak_bytes").get<double>();
  EXPECT_LE(std::abs(predicted - measured) / measured, 0.1) << predicted << " vs " << measured;
  EXPECT_FALSE(report.at("chosen").is_null()) << dump_trail(report);
}

// Verification runs that end without a measurement prove nothing about
// memory. Every verification run crashes here (test hook: "global_batch=16,"
// names the runs on the job's global batch; the probes run one micro-batch
// of at most 8 per step): the answer is "not verified", exit 4, with every
// verified candidate listed, and no "nothing fits" or ZeRO table, which
// before this told the user to shard a model that fits many times over.
TEST(Autotune, VerificationsThatAllCrashAreNotNothingFits) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  const TestDir dir;
  const std::string job = gpt_job(dir, kSmall, 16, "budget = \"64MiB\"");
  const std::string fault = "OOMTUNE_TEST_FAULT=segv:forward:global_batch=16,";
  const RunResult r = run_oomtune(kAutotune + job + " --json --max-verifications 1", fault);
  ASSERT_EQ(r.exit_code, 4) << r.err;
  const json report = parse_json(r);
  EXPECT_TRUE(report.at("chosen").is_null());
  EXPECT_FALSE(report.contains("nothing_fits"));
  for (const json& p : report.at("probes")) EXPECT_EQ(p.at("outcome"), "ok") << p.at("config");
  const json& unverified = report.at("unverified");
  ASSERT_GE(unverified.size(), 1u);
  EXPECT_EQ(unverified.size(), report.at("verification_trials").get<std::size_t>());
  for (const json& n : unverified) {
    EXPECT_EQ(n.at("verification").at("outcome"), "crashed");
    EXPECT_TRUE(n.at("predicted_fit").get<bool>());
  }

  const RunResult text = run_oomtune(kAutotune + job + " --max-verifications 1", fault);
  EXPECT_EQ(text.exit_code, 4);
  EXPECT_TRUE(contains(text.out, "\nnot verified: the verification run")) << text.out;
  EXPECT_TRUE(contains(text.out, " crashed), so whether")) << text.out;
  EXPECT_FALSE(contains(text.out, "nothing fits")) << text.out;
  EXPECT_FALSE(contains(text.out, "ZeRO-3")) << text.out;
}

// ---- bf16 fallback (issue #10, item 6).

// TorchScript's bf16 autocast crashes on some models (a scripted ViT-B/16
// died by SIGSEGV on an H100). Here every bf16-autocast trial is made to
// crash (test hook; "precision=bf16," names autocast, not bf16_params): the
// search must probe bf16 as bf16 parameters with fp32 master weights, say
// so, and carry on. The budget fits everything, so which configuration wins
// is a matter of timing and not asserted.
TEST(Autotune, Bf16FallsBackToBf16ParametersWhenAutocastCrashes) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  if (!bf16_runs_here()) GTEST_SKIP() << "bf16 does not run at this kernel level (DNNL_MAX_CPU_ISA below AVX-512)";
  const TestDir dir;
  const RunResult r = run_oomtune(
      kAutotune + gpt_job(dir, kSmall, 8, "budget = \"64MiB\"\nallow_bf16 = true") + " --json --max-verifications 1",
      "OOMTUNE_TEST_FAULT=segv:forward:precision=bf16,");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  EXPECT_TRUE(contains(dump_trail(report),
                       "bf16: autocast failed (crashed: SIGSEGV during forward), so bf16 runs "
                       "as bf16 parameters with fp32 master weights"))
      << dump_trail(report);
  int autocast_crashes = 0, bf16_params_ok = 0, with_checkpointing = 0;
  for (const json& p : report.at("probes")) {
    const std::string config = p.at("config");
    if (contains(config + ",", "precision=bf16,")) {
      EXPECT_EQ(p.at("outcome"), "crashed") << config;
      ++autocast_crashes;
    }
    if (contains(config, "precision=bf16_params") && p.at("outcome") == "ok") {
      EXPECT_EQ(p.at("precision_form"), "bf16 parameters, fp32 master");
      ++(contains(config, "ckpt=all") ? with_checkpointing : bf16_params_ok);
    }
  }
  EXPECT_EQ(autocast_crashes, 1);
  EXPECT_EQ(bf16_params_ok, 2) << "both bf16 probe sizes, in the fallback form";
  EXPECT_EQ(with_checkpointing, 2) << "bf16 with checkpointing (Note [bf16 with checkpointing]), in that form too";
  bool node = false;
  for (const json& n : report.at("trail"))
    node = node || (n.at("node") == "bf16 parameters" && contains(n.at("config"), "precision=bf16_params"));
  EXPECT_TRUE(node) << dump_trail(report);
}

// Pairs of strategies (Note [Pairs] in search/walk.cpp): 8-bit AdamW or
// offload with bf16 are predicted from effects each measured alone, with
// no probe of their own; bf16 with checkpointing from the pair's effect on
// checkpointing's lines, probed at the sizes of the strategies' probes
// (Note [bf16 with checkpointing], memory_model.cpp). Every fitting node is
// verified here, so each prediction meets its real run (small GPT, 8 x 1).
// Measured on the 2-core CPU: every node with all blocks or none
// checkpointed to the byte, checkpointing included (Note [Backward by
// gradients]: at 1 and 2 its backward peaks at its end, at 8 while
// recomputing the first block; before, 4.7 % short); bf16 with checkpointing
// 3.0 % short before the pair's probe; accumulation with checkpointing,
// 4 x 2, +1.8 % over before the levels bounded its later micro-batch. On
// PyTorch 2 (CUDA's autocast
// lists) 8-bit AdamW + bf16 and offload + bf16 +0.7 % and +0.8 % over: the
// effects overlap (Note [Pairs]).
TEST(Autotune, PairsOfStrategiesArePredictedFromTheirEffects) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  if (!bf16_runs_here()) GTEST_SKIP() << "bf16 does not run at this kernel level (DNNL_MAX_CPU_ISA below AVX-512)";
  const TestDir dir;
  const RunResult r = run_oomtune(kAutotune + gpt_job(dir, kSmall, 8, "budget = \"64MiB\"\nallow_bf16 = true") +
                                  " --json --max-verifications 20");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  int bf16_with_checkpointing = 0;
  for (const json& p : report.at("probes")) {
    const std::string config = p.at("config");
    const bool eight_bit = contains(config, "optimizer=adamw8bit"), offload = contains(config, "offload=on");
    EXPECT_FALSE((eight_bit || offload) && !contains(config, "precision=fp32")) << "a pair was probed: " << config;
    if (contains(config, "ckpt=all") && contains(config + ",", "precision=bf16,")) ++bf16_with_checkpointing;
  }
  EXPECT_EQ(bf16_with_checkpointing, 2) << "bf16 with checkpointing, at the two sizes of its strategies' probes";
  int pairs = 0;
  for (const json& n : report.at("trail")) {
    const std::string node = n.at("node");
    if (!n.contains("verification")) {
      EXPECT_FALSE(n.at("predicted_fit").get<bool>()) << node << " fits and was not verified";
      continue;
    }
    const double predicted = n.at("predicted_peak_bytes").get<double>();
    const double measured = n.at("verification").at("peak_bytes").get<double>();
    EXPECT_GE(predicted, measured * (1 - 0.005)) << node << ": " << predicted << " vs " << measured;
    EXPECT_LE(predicted, measured * (contains(node, "accumulation") ? 1.03 : 1.01))
        << node << ": " << predicted << " vs " << measured;
    if (contains(node, " + bf16")) ++pairs;
  }
  EXPECT_EQ(pairs, 4) << "8-bit AdamW and offload with bf16, each also with checkpointing\n" << dump_trail(report);
}

// Checkpointing part of the blocks (Note [Part of the blocks checkpointed],
// memory_model.cpp): the small GPT at 8 x 1 needs 6.18 MiB plain, 4.06 with
// both blocks checkpointed; under 5.6 MiB (5.32 usable) the walk takes the
// first of the two. Its backward peaks as plain's does, with every
// activation of the block left held: 4.943 MiB measured on the 2-core CPU,
// predicted to the byte from its levels; half of checkpointing's effect on
// backward's activation line, which moves from that moment to a
// recomputation, predicted 5.022 (+1.6 %).
TEST(Autotune, FirstBlocksCheckpointedArePredictedFromTheLevels) {
  OOMTUNE_REQUIRE_FILE(model(kSmall.name));
  const TestDir dir;
  const RunResult r =
      run_oomtune(kAutotune + gpt_job(dir, kSmall, 8, "budget = \"5.6MiB\"") + " --json --max-verifications 20");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json* first = nullptr;
  for (const json& n : report.at("trail"))
    if (n.at("node") == "checkpointing (first 1 of 2 blocks)") first = &n;
  ASSERT_NE(first, nullptr) << dump_trail(report);
  ASSERT_TRUE(first->contains("verification")) << dump_trail(report);
  const double predicted = first->at("predicted_peak_bytes").get<double>();
  const double measured = first->at("verification").at("peak_bytes").get<double>();
  EXPECT_GE(predicted, measured * (1 - 0.005)) << dump_trail(report);
  EXPECT_LE(predicted, measured * 1.005) << dump_trail(report);
}

// ---- Bad inputs: exit 2 and one clear line.

// Parameter elements of examples/export_models.py's GPT: token and
// position embeddings, per block two LayerNorms, qkv and proj (with bias)
// and the 4x MLP (with bias), the final LayerNorm and the head (no bias).
int64_t gpt_parameters(int64_t vocab, int64_t d, int64_t layers, int64_t seq) {
  const int64_t block = 2 * (2 * d) + (d * 3 * d + 3 * d) + (d * d + d) + (d * 4 * d + 4 * d) + (4 * d * d + d);
  return vocab * d + seq * d + layers * block + 2 * d + d * vocab;
}

// Budget below the parameters alone (issue #46 item 5): not a bad input
// but the answer "nothing fits one GPU" with the ZeRO/FSDP table, exit 3.
// SGD without momentum keeps the probes (run at 4x the budget as a RAM
// guard) under the guard, so the search compares the measured parameters
// (gpt_wide: 2 blocks, d = 128, vocabulary 8192, 2,496,000 fp32
// parameters, 9,984,000 B = 9.52 MiB) with the usable budget, 9,463,398 B
// (9.02 MiB). ZeRO-3 / FULL_SHARD fit from 3 GPUs (2 x 9,984,000 / 3 B plus
// the measured activations, 29.15 KiB on the machine that wrote this).
// The table's numbers from the ZeRO paper's formulas (recipes/
// zero_estimate.h) with SGD's bytes per parameter: w = 4, g = 4, K = 0.
TEST(Autotune, BudgetBelowTheParametersAloneIsNothingFitsOneGpu) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kWide, 8, "budget = \"9.5MiB\"", "kind = \"sgd\"\nlr = 0.1");
  const RunResult r = run_oomtune(kAutotune + job + " --json");
  ASSERT_EQ(r.exit_code, 3) << r.err;
  const json report = parse_json(r);
  const int64_t parameters = gpt_parameters(8192, 128, 2, 16);
  ASSERT_EQ(parameters, 2'496'000);
  const int64_t weights = 4 * parameters;
  const auto usable = static_cast<int64_t>(9.5 * 1024 * 1024 * (1.0 - 0.05));  // 5 % headroom
  EXPECT_EQ(report.at("usable_budget_bytes"), usable);
  EXPECT_TRUE(report.at("chosen").is_null());
  EXPECT_EQ(report.at("trail"), json::array());
  EXPECT_EQ(report.at("parameters_alone"),
            "the parameters alone (9.52 MiB) exceed the usable budget (9.02 MiB, after 5 % headroom): no single-GPU "
            "configuration holds them (every strategy keeps the weights on the device)");
  // Plain's probes, then checkpointing once for the table's activations.
  const json& probes = report.at("probes");
  ASSERT_GE(probes.size(), 2u);
  for (std::size_t i = 0; i + 1 < probes.size(); ++i)
    EXPECT_TRUE(
        contains(probes[i].at("config").get<std::string>(), ",ckpt=none,optimizer=sgd,offload=off,precision=fp32"))
        << probes[i].at("config");
  EXPECT_TRUE(
      contains(probes.back().at("config").get<std::string>(), ",ckpt=all,optimizer=sgd,offload=off,precision=fp32"))
      << probes.back().at("config");
  const json& zero = report.at("nothing_fits");
  EXPECT_EQ(zero.at("parameters"), parameters);
  EXPECT_EQ(zero.at("gpus"), 8);
  EXPECT_EQ(zero.at("budget_bytes"), usable);
  const int64_t activations = zero.at("activation_bytes");
  EXPECT_GT(activations, 0) << "plain's measured activations at micro-batch 1";
  ASSERT_EQ(zero.at("rows").size(), 6u);
  // DDP: Ψ(w + g + K) unsharded = 8 Ψ plus activations, over the budget at any N.
  const json& ddp = zero.at("rows")[0];
  EXPECT_EQ(ddp.at("per_gpu").at("weights"), weights);
  EXPECT_EQ(ddp.at("per_gpu").at("gradients"), weights);
  EXPECT_EQ(ddp.at("per_gpu").at("optimizer_state"), 0);
  EXPECT_EQ(ddp.at("per_gpu").at("total"), 2 * weights + activations);
  EXPECT_EQ(ddp.at("fits"), false);
  EXPECT_TRUE(ddp.at("min_gpus").is_null());
  // ZeRO-3: Ψ(w + g)/N per GPU; at N = 8, 1,248,000 B each; the smallest
  // N with 2 ceil(4 Ψ / N) + activations within the budget.
  const json& zero3 = zero.at("rows")[3];
  EXPECT_EQ(zero3.at("strategy"), "ZeRO-3");
  EXPECT_EQ(zero3.at("per_gpu").at("weights"), weights / 8);
  EXPECT_EQ(zero3.at("per_gpu").at("gradients"), weights / 8);
  int64_t n = 1;
  while (2 * ((weights + n - 1) / n) + activations > usable) ++n;
  EXPECT_EQ(zero3.at("min_gpus"), n);
  EXPECT_EQ(zero.at("fewest_gpus"), n) << "ZeRO-3 and FULL_SHARD shard the most";
  EXPECT_EQ(zero.at("rows")[5].at("min_gpus"), n);

  const RunResult text = run_oomtune(kAutotune + job);
  EXPECT_EQ(text.exit_code, 3) << text.err;
  EXPECT_TRUE(contains(text.out,
                       "\nnothing fits one GPU: the parameters alone (9.52 MiB) exceed the usable budget "
                       "(9.02 MiB, after 5 % headroom)"))
      << text.out;
  EXPECT_TRUE(contains(text.out, "\nFSDP FULL_SHARD ")) << text.out;
  EXPECT_TRUE(contains(text.out, "the fewest GPUs that fit: " + std::to_string(n) + " (ZeRO-3, FSDP FULL_SHARD)"))
      << text.out;
}

TEST(AutotuneInputs, MicroBatchThatDoesNotDivideTheGlobalBatch) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const RunResult r =
      run_oomtune("probe " + gpt_job(dir, kSmall, 8, "budget = \"64MiB\"") + " --config micro_batch=3 --no-fit");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const std::string line = last_line(r.err);
  EXPECT_TRUE(contains(line, "3")) << line;
  EXPECT_TRUE(contains(line, "remainder = \"last_smaller\"")) << line;
}

// remainder = "last_smaller" with --emit: global batch 15, micro-batches up
// to 4, a budget every node fits at 4, so the chosen configuration runs
// 4 x 3 + 3. No framework config (nor plan.toml) takes a smaller last
// micro-batch: the report is printed whole, nothing is written, and the
// error after it says which global batches would do (exit 2). Before, the
// plan's validation threw before the report: a whole search lost.
TEST(AutotuneInputs, ARemainderPlanIsReportedButNotEmitted) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const fs::path emit = dir / "configs";
  const RunResult r = run_oomtune(
      kAutotune + gpt_job(dir, kSmall, 15, "remainder = \"last_smaller\"\nmax_micro_batch = 4\nbudget = \"256MiB\"") +
      " --json --emit " + emit.string());
  EXPECT_EQ(r.exit_code, 2) << r.err;
  const json report = parse_json(r);
  ASSERT_TRUE(report.contains("chosen")) << r.out;
  const json& chosen = report.at("chosen");
  ASSERT_FALSE(chosen.is_null()) << dump_trail(report);
  EXPECT_EQ(chosen.at("micro_batch"), 4) << dump_trail(report);
  EXPECT_EQ(chosen.at("accumulation_steps"), 4);
  EXPECT_EQ(chosen.at("verification").at("outcome"), "ok");
  EXPECT_TRUE(report.at("emitted_files").empty());
  EXPECT_TRUE(!fs::exists(emit) || fs::is_empty(emit));
  EXPECT_TRUE(contains(r.err,
                       "autotune: note: remainder = \"last_smaller\": --emit writes the configs only if the "
                       "chosen micro-batch divides the global batch 15"))
      << r.err;
  EXPECT_EQ(last_line(r.err), "oomtune: --emit " + emit.string() +
                                  ": nothing written: the chosen configuration runs the global batch 15 as 4 x 3 + 3 "
                                  "(remainder = \"last_smaller\"), and every framework config (and plan.toml) takes "
                                  "equal micro-batches; a global batch that 4 divides (12 or 16) gives one");
}

TEST(AutotuneInputs, UnknownStrategyNamesTheClosestValidOne) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kSmall, 8, "budget = \"64MiB\"");
  RunResult r = run_oomtune("probe " + job + " --config optimizer=lion --no-fit");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(last_line(r.err), "lion")) << r.err;
  EXPECT_TRUE(contains(last_line(r.err), "did you mean")) << r.err;
  r = run_oomtune("probe " + job + " --config optimiser=adamw --no-fit");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_TRUE(contains(last_line(r.err), "did you mean 'optimizer'")) << r.err;
}

TEST(AutotuneInputs, AutotuneWithoutABudget) {
  OOMTUNE_REQUIRE_FILE(model("gpt_small"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kSmall, 8, "");
  const RunResult r = run_oomtune(kAutotune + job + " --json");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(last_line(r.err),
            "oomtune: " + job + ": autotune needs a memory budget: set budget = \"8GiB\" or pass --budget");
}

// Memory from the meta device (the default; search.h, Rules: Memory from
// meta). The wide GPT at 26.5 MiB (OffloadWhenEightBitDoesNotFit): with
// libtorch 2 every node's peak is measured on meta at its own micro-batch,
// the verified peaks agree with it within 1 % (a CPU run also holds the
// graphs' tensor constants: tests/core/meta_device_test.cpp), the plain probes
// run at two sizes instead of three and each strategy at one, and the
// choice is the one the budget forces (offload). With libtorch 1.13 no meta
// run is tried (no child spent on it) and the lines decide, saying why.
TEST(AutotuneMeta, EachNodeIsMeasuredOnMetaAndTheProbesOnlyTime) {
  OOMTUNE_REQUIRE_FILE(model("gpt_wide"));
  const TestDir dir;
  const std::string job = gpt_job(dir, kWide, 8, "budget = \"26.5MiB\"");
  const RunResult r = run_oomtune("autotune " + job + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const json report = parse_json(r);
  const json chosen = check_chosen(report, 8);
  ASSERT_FALSE(chosen.is_null());
  EXPECT_TRUE(contains(chosen.at("config").get<std::string>(), "offload=on")) << dump_trail(report);
  if (!testing::kMetaCounted) {
    EXPECT_EQ(report.at("memory_from"), "probes");
    EXPECT_EQ(report.at("meta_trials"), 0);
    EXPECT_TRUE(contains(report.at("notes")[0].get<std::string>(), "memory from the probes' lines: device = \"meta\""))
        << report.at("notes").dump(2);
    EXPECT_TRUE(contains(report.at("notes")[0].get<std::string>(), "libtorch 2")) << report.at("notes").dump(2);
    return;
  }
  EXPECT_EQ(report.at("memory_from"), "meta");
  EXPECT_GT(report.at("meta_trials").get<int64_t>(), 0);
  for (const json& n : report.at("trail")) EXPECT_FALSE(n.at("meta_peak_bytes").is_null()) << n.dump();
  for (const json& n : verified_nodes(report)) {
    const double meta = n.at("meta_peak_bytes").get<double>();
    const double measured = n.at("verification").at("peak_bytes").get<double>();
    EXPECT_LE(std::abs(meta - measured) / measured, 0.01) << n.dump();
  }
  std::set<int64_t> plain_sizes;
  std::map<std::string, std::set<int64_t>> strategy_sizes;
  for (const json& p : report.at("probes")) {
    const std::string config = p.at("config");
    if (contains(config, "ckpt=none,optimizer=adamw,offload=off,precision=fp32"))
      plain_sizes.insert(p.at("micro_batch").get<int64_t>());
    else
      strategy_sizes[config.substr(config.find(",accum="))].insert(p.at("micro_batch").get<int64_t>());
  }
  // Plain fits at no micro-batch (its AdamW state alone passes the budget),
  // so meta places no timing probe where a plain candidate runs: G/8 and
  // G/4, not G/2 (Note [Timing probes on meta]).
  EXPECT_EQ(plain_sizes, (std::set<int64_t>{1, 2})) << "G = 8: G/8 and G/4, not G/2";
  for (const auto& [config, sizes] : strategy_sizes) EXPECT_EQ(sizes.size(), 1u) << config;
}

}  // namespace
}  // namespace oomtune
