// A trial's report crosses from the child process to the parent as JSON:
// what the CPU tracker and the CUDA counters add to it comes back whole.

#include "probes/probe_report.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

TEST(ProbeReportJson, KernelScratchAndMeasuredReservedRoundTrip) {
  ProbeReport r;
  r.config = "micro_batch=8,accum=1,ckpt=none,optimizer=adamw,offload=off,precision=fp32";
  r.phases[static_cast<std::size_t>(Phase::kBackward)].reserved_peak_bytes = 62914560;
  r.phases[static_cast<std::size_t>(Phase::kForward)].kernel_scratch_peak_bytes = 131200;
  r.kernel_scratch = {131200, 1376, 22790144, "MmBackward0 > aten::mm", 5693466, 700};
  r.measured_reserved = MeasuredReserved{62914560, 52428800, 3, 1, 0};
  const ProbeReport back = probe_report_from_json(to_json(r));
  EXPECT_EQ(back.phases[static_cast<std::size_t>(Phase::kBackward)].reserved_peak_bytes, 62914560);
  EXPECT_EQ(back.phases[static_cast<std::size_t>(Phase::kForward)].kernel_scratch_peak_bytes, 131200);
  const KernelScratch& k = back.kernel_scratch;
  EXPECT_EQ(k.peak_bytes, 131200);
  EXPECT_EQ(k.allocations, 1376);
  EXPECT_EQ(k.allocated_bytes, 22790144);
  EXPECT_EQ(k.op, "MmBackward0 > aten::mm");
  EXPECT_EQ(k.peak_with_scratch_bytes, 5693466);
  EXPECT_EQ(k.raw_bytes_counted, 700);
  ASSERT_TRUE(back.measured_reserved.has_value());
  const MeasuredReserved& m = *back.measured_reserved;
  EXPECT_EQ(m.peak_reserved_bytes, 62914560);
  EXPECT_EQ(m.peak_active_bytes, 52428800);
  EXPECT_EQ(m.segment_allocations, 3);
  EXPECT_EQ(m.num_alloc_retries, 1);
  EXPECT_EQ(m.num_ooms, 0);
  // A CPU trial measures no reserved bytes: none in its JSON, none back.
  r.measured_reserved.reset();
  EXPECT_FALSE(to_json(r).contains("allocatable"));
  EXPECT_FALSE(to_json(r).contains("measured_reserved"));
  EXPECT_FALSE(probe_report_from_json(to_json(r)).measured_reserved.has_value());
}

// Note [cuDNN calls]: the counts come back whole, and the line names each
// kind of call the step made; a convolution's workspace gives way under a
// cap, batch norm's does not.
TEST(ProbeReportJson, TheCudnnCallsRoundTripAndNameWhatIsNotCounted) {
  ProbeReport r;
  r.cudnn = CudnnCalls{81, 80, 49};
  const ProbeReport back = probe_report_from_json(to_json(r));
  ASSERT_TRUE(back.cudnn.has_value());
  EXPECT_EQ(back.cudnn->convolutions, 81);
  EXPECT_EQ(back.cudnn->convolution_backwards, 80);
  EXPECT_EQ(back.cudnn->batch_norms, 49);
  EXPECT_FALSE(probe_report_from_json(to_json(ProbeReport{})).cudnn.has_value());
  EXPECT_EQ(cudnn_text(*back.cudnn),
            "81 convolutions (80 backward) and 49 batch norms a step: on CUDA each call may take a workspace that "
            "cuDNN sizes at run time (batch norm a reserve space too), not counted here; a convolution's that does "
            "not fit makes cuDNN pick an engine that needs less (slower, not out of memory)");
  EXPECT_EQ(cudnn_text(CudnnCalls{1, 1, 0}),
            "1 convolution (1 backward) a step: on CUDA each call may take a workspace that cuDNN sizes at run time, "
            "not counted here; a convolution's that does not fit makes cuDNN pick an engine that needs less (slower, "
            "not out of memory)");
  EXPECT_EQ(cudnn_text(CudnnCalls{0, 0, 3}),
            "3 batch norms a step: on CUDA each call may take a workspace that cuDNN sizes at run time (batch norm a "
            "reserve space too), not counted here");
}

// The dropout record (probes/dropout_record.h) and whose autocast lists a
// CPU trial used cross from the child whole; a report without them stays
// without them.
TEST(ProbeReportJson, TheDropoutRecordAndTheAutocastListsRoundTrip) {
  ProbeReport r;
  r.dropout = DropoutRecord{9, 3407872, 13631488};
  r.autocast_lists = "cuda";
  const ProbeReport back = probe_report_from_json(to_json(r));
  ASSERT_TRUE(back.dropout.has_value());
  EXPECT_EQ(back.dropout->calls, 9);
  EXPECT_EQ(back.dropout->kept_bytes, 3407872);
  EXPECT_EQ(back.dropout->composite_kept_bytes, 13631488);
  EXPECT_EQ(back.autocast_lists, "cuda");
  EXPECT_EQ(dropout_text(*back.dropout),
            "9 calls, CUDA's fused kernel keeps 1-byte masks: 3.25 MiB of them in the step, summed over its "
            "micro-batches and recomputations (the composite dropout of the CPU and meta would keep 13.00 MiB of "
            "noise)");
  const ProbeReport none = probe_report_from_json(to_json(ProbeReport{}));
  EXPECT_FALSE(none.dropout.has_value());
  EXPECT_EQ(none.autocast_lists, "");
  nlohmann::json broken = to_json(r);
  broken["dropout"].erase("kept_bytes");
  EXPECT_THROW(probe_report_from_json(broken), InputError);
}

// Note [The budget on a CUDA target]: the capped replay's verdict crosses
// from the child whole, and each of its three outcomes reads as what a
// CUDA run would do under the cap.
TEST(ProbeReportJson, TheCudaBudgetVerdictRoundTripsAndSaysWhatTheCapDoes) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  ProbeReport r;
  r.reserved = ReservedPrediction{};
  r.reserved->peak_reserved_bytes = 220 * kMiB;
  r.reserved->segment_allocations = 35;
  r.reserved->budget_bytes = 200 * kMiB;
  r.reserved->fits_budget = false;
  r.reserved->cache_flushes = 1;
  r.reserved->failed_request_bytes = 8 * kMiB;
  r.reserved->failed_op = "aten::mm";
  r.reserved->failed_phase = Phase::kBackward;
  const ProbeReport back = probe_report_from_json(to_json(r));
  ASSERT_TRUE(back.reserved.has_value());
  EXPECT_EQ(back.reserved->peak_reserved_bytes, 220 * kMiB);
  EXPECT_EQ(back.reserved->budget_bytes, 200 * kMiB);
  EXPECT_FALSE(back.reserved->fits_budget);
  EXPECT_EQ(back.reserved->cache_flushes, 1);
  EXPECT_EQ(back.reserved->failed_request_bytes, 8 * kMiB);
  EXPECT_EQ(back.reserved->failed_op, "aten::mm");
  EXPECT_EQ(back.reserved->failed_phase, Phase::kBackward);
  EXPECT_EQ(cuda_budget_text(*back.reserved),
            "220.00 MiB reserved (predicted) is over the usable 200.00 MiB: capped there the caching allocator runs "
            "out of memory at a 8.00 MiB request by aten::mm during backward");
  ReservedPrediction flushed = *back.reserved;
  flushed.fits_budget = true;
  flushed.cache_flushes = 3;
  flushed.failed_request_bytes = 0;
  EXPECT_EQ(cuda_budget_text(flushed),
            "220.00 MiB reserved (predicted) is over the usable 200.00 MiB: capped there the caching allocator serves "
            "every request by freeing its cache 3 times (each flush synchronizes the device and returns every cached "
            "segment)");
  ReservedPrediction within = flushed;
  within.budget_bytes = 243 * kMiB;
  EXPECT_EQ(cuda_budget_text(within), "220.00 MiB reserved (predicted), within the usable 243.00 MiB");
  within.budget_bytes = 0;
  EXPECT_EQ(cuda_budget_text(within), "") << "no budget, no verdict";
  nlohmann::json old = to_json(r);  // a report from before the capped replay
  for (const char* key : {"budget_bytes", "cache_flushes", "failed_request"}) old["reserved"].erase(key);
  EXPECT_EQ(probe_report_from_json(old).reserved->budget_bytes, 0);
}

TEST(ProbeReportJson, TheLargestAllocatableBlockRoundTrips) {
  ProbeReport r;
  r.allocatable = AllocatableRecord{37748736, 81604378624, 85045608448, 15, 254803968};
  const ProbeReport back = probe_report_from_json(to_json(r));
  ASSERT_TRUE(back.allocatable.has_value());
  EXPECT_EQ(back.allocatable->largest_block_bytes, 37748736);
  EXPECT_EQ(back.allocatable->device_free_bytes, 81604378624);
  EXPECT_EQ(back.allocatable->device_total_bytes, 85045608448);
  EXPECT_EQ(back.allocatable->attempts, 15);
  EXPECT_EQ(back.allocatable->bound_bytes, 254803968);
}

// A GPU trial that ran out of memory names the snapshot it wrote wherever
// its outcome is said (the autotune trail, the probe's report), and the
// path crosses from the child in the JSON.
TEST(ProbeReportJson, AWrittenSnapshotIsNamedWithTheOutcome) {
  ProbeReport r;
  r.outcome = TrialOutcome::kOutOfMemory;
  r.phase_at_failure = Phase::kOptimizer;
  r.message = "CUDA out of memory. Tried to allocate 16.00 MiB";
  EXPECT_EQ(outcome_text(r), "out_of_memory during optimizer: CUDA out of memory. Tried to allocate 16.00 MiB");
  EXPECT_FALSE(to_json(r).contains("snapshot"));
  r.snapshot_path = "oomtune-snapshots/gpt-3-32x1.pickle";
  EXPECT_EQ(outcome_text(r),
            "out_of_memory during optimizer: CUDA out of memory. Tried to allocate 16.00 MiB (snapshot: oomtune "
            "diagnose oomtune-snapshots/gpt-3-32x1.pickle)");
  EXPECT_EQ(probe_report_from_json(to_json(r)).snapshot_path, "oomtune-snapshots/gpt-3-32x1.pickle");
}

TEST(ProbeReportJson, TheOptimizerLineRoundTripsAndNamesItsImplementation) {
  ProbeReport r;
  r.optimizer = {"adamw", "foreach", 1310720};
  const ProbeReport back = probe_report_from_json(to_json(r));
  EXPECT_EQ(back.optimizer.name, "adamw");
  EXPECT_EQ(back.optimizer.implementation, "foreach");
  EXPECT_EQ(back.optimizer.temporary_bytes, 1310720);
  EXPECT_EQ(optimizer_text(r.optimizer),
            "adamw, foreach: 1.25 MiB of temporaries above its state at the step's peak (whole-list: "
            "torch._foreach_* over every parameter at once; torch.optim's default on CUDA)");
  EXPECT_EQ(optimizer_text({"adamw8bit", "", 4096}),
            "adamw8bit: 4.00 KiB of temporaries above its state at the step's peak (oomtune's own loop; not "
            "foreach-modelled)");
  EXPECT_EQ(optimizer_text({"sgd", "", 0}),
            "sgd: 0 B of temporaries above its state at the step's peak (offload: libtorch's loop on the host; not "
            "foreach-modelled)");
  // Gradient clipping: the job's max_norm round-trips and ends the line.
  r.optimizer.max_grad_norm = 0.5;
  EXPECT_EQ(probe_report_from_json(to_json(r)).optimizer.max_grad_norm, 0.5);
  EXPECT_EQ(optimizer_text({"sgd", "fused", 0, 1.0}),
            "sgd, fused: 0 B of temporaries above its state at the step's peak (one fused kernel in place; step "
            "counts on the device); gradients clipped to norm 1 before the update (clip_grad_norm_)");
  nlohmann::json unclipped = to_json(r);
  unclipped["optimizer"].erase("max_grad_norm");  // reports recorded before clipping
  EXPECT_EQ(probe_report_from_json(unclipped).optimizer.max_grad_norm, 0.0);
  // Reports recorded before the line have none.
  nlohmann::json old = to_json(r);
  old.erase("optimizer");
  EXPECT_EQ(probe_report_from_json(old).optimizer.name, "");
  EXPECT_EQ(optimizer_text(probe_report_from_json(old).optimizer), "");
}

TEST(ProbeReportJson, ThePhaseAtFailureIsAPhaseWrittenByItsName) {
  ProbeReport r;
  r.outcome = TrialOutcome::kOutOfMemory;
  r.message = "tried to allocate 2048 bytes";
  r.phase_at_failure = Phase::kBackward;
  const nlohmann::json j = to_json(r);
  EXPECT_EQ(j.at("phase_at_failure"), "backward");
  EXPECT_EQ(probe_report_from_json(j).phase_at_failure, Phase::kBackward);
  EXPECT_EQ(outcome_text(r), "out_of_memory during backward: tried to allocate 2048 bytes");
  r.phase_at_failure.reset();
  EXPECT_EQ(to_json(r).at("phase_at_failure"), "");
  EXPECT_FALSE(probe_report_from_json(to_json(r)).phase_at_failure.has_value());
  nlohmann::json bad = j;
  bad["phase_at_failure"] = "backwards";
  try {
    probe_report_from_json(bad);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown phase_at_failure 'backwards'"), std::string::npos) << e.what();
  }
}

TEST(ProbeReportJson, ThePrecisionFormIsWrittenByItsName) {
  const std::pair<PrecisionForm, const char*> forms[] = {
      {PrecisionForm::kUnknown, ""},
      {PrecisionForm::kFp32, "fp32"},
      {PrecisionForm::kAutocast, "autocast"},
      {PrecisionForm::kHalfParameters, "bf16 parameters, fp32 master"}};
  for (const auto& [form, name] : forms) {
    ProbeReport r;
    r.precision_form = form;
    const nlohmann::json j = to_json(r);
    EXPECT_EQ(j.at("precision_form"), name);
    EXPECT_EQ(probe_report_from_json(j).precision_form, form) << name;
  }
  nlohmann::json bad = to_json(ProbeReport{});
  bad["precision_form"] = "bf16";
  EXPECT_THROW(probe_report_from_json(bad), InputError);
}

}  // namespace
}  // namespace oomtune
