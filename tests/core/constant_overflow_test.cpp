// A value that does not fit the activations' dtype (model_session.h,
// constant_overflow_hint): a traced fp32 minimum filling bf16 or fp16
// attention scores, which the CPU and CUDA kernels refuse and, through
// oomtune's masked_fill_ (probes/meta_kernels.h), meta too, so that a meta
// trial does not answer for a step the GPU cannot run.

#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "session/model_session.h"
#include "strategies/job_config.h"
#include "strategies/training_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

// The one-line error of a trial of `job` at `precision` that must fail on
// the traced constant ("" when it ran).
std::string overflow_error(JobSpec job, Device device, const char* precision) {
  job.device = device;
  const TrainingConfig config = parse_config_overrides(std::string("precision=") + precision, baseline_config(job));
  try {
    const ProbeReport r = run_trial(job, config, testing::quick_trial());
    return r.outcome == TrialOutcome::kOk ? "" : r.message;
  } catch (const ModelError& e) {
    return e.what();
  }
}

TEST(ConstantOverflow, ATracedFp32MinimumInBf16ScoresFailsWithTheCauseNamed) {
  const JobSpec job = testing::masked_scores_job(2);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  EXPECT_EQ(overflow_error(job, Device::kCpu, "fp32"), "");
  const std::string cpu = overflow_error(job, Device::kCpu, "bf16");
  EXPECT_NE(cpu.find("without overflow"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("torch.finfo(dtype).min"), std::string::npos) << cpu;
  EXPECT_EQ(cpu.find('\n'), std::string::npos) << cpu;
  if (!compat::kMetaDeviceCounted) return;  // meta: PyTorch 2
  EXPECT_EQ(overflow_error(job, Device::kMeta, "fp32"), "");
  for (const char* precision : {"bf16", "fp16"}) {
    const std::string meta = overflow_error(job, Device::kMeta, precision);
    EXPECT_NE(meta.find(std::string("cannot be converted to type c10::") +
                        (precision == std::string("bf16") ? "BFloat16" : "Half")),
              std::string::npos)
        << precision << ": " << meta;
    EXPECT_NE(meta.find("torch.jit.script keeps torch.finfo(x.dtype) a computation"), std::string::npos) << meta;
  }
}

TEST(ConstantOverflow, OtherErrorsGetNoSuchHint) {
  EXPECT_EQ(constant_overflow_hint("index out of range in self"), "");
  EXPECT_NE(constant_overflow_hint("value cannot be converted to type at::BFloat16 without overflow"), "");
}

}  // namespace
}  // namespace oomtune
