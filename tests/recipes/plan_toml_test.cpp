#include "recipes/plan_toml.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>

#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "job/job_spec.h"
#include "support/scratch_path.h"
#include "tests/recipes/plan_cases.h"

namespace oomtune {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_plan_toml(text, "plan.toml");
  } catch (const SpecError& e) {
    return e.what();
  }
  return "(no error)";
}

const char* const kMinimal = "[config]\nmicro_batch = 4\naccumulation_steps = 2\n";

TEST(PlanToml, DefaultsArePinned) {
  const Plan plan = parse_plan_toml(kMinimal, "plan.toml");
  EXPECT_EQ(plan.config.micro_batch, 4);
  EXPECT_EQ(plan.config.accumulation_steps, 2);
  EXPECT_EQ(plan.global_batch, 8);
  EXPECT_EQ(plan.config.checkpoint.mode, CheckpointPlan::Mode::kNone);
  EXPECT_EQ(plan.config.optimizer, OptimizerKind::kAdamW);
  EXPECT_FALSE(plan.config.offload_optimizer);
  EXPECT_EQ(plan.config.precision, Precision::kFp32);
  EXPECT_EQ(plan.optimizer.lr, 1e-3);
  EXPECT_EQ(plan.optimizer.weight_decay, 0.01);
  EXPECT_EQ(plan.optimizer.beta1, 0.9);
  EXPECT_EQ(plan.optimizer.beta2, 0.999);
  EXPECT_EQ(plan.optimizer.eps, 1e-8);
  EXPECT_EQ(plan.optimizer.momentum, 0.0);
  EXPECT_EQ(plan.optimizer.max_grad_norm, 0.0);  // plans written before the key: no clipping, as then measured
  // Plans written before the key: torch.optim's default on CUDA.
  EXPECT_EQ(plan.optimizer.implementation, OptimizerImplementation::kForeach);
  EXPECT_EQ(plan.device, Device::kCuda);
  EXPECT_FALSE(plan.budget_bytes);
  EXPECT_EQ(plan.headroom, 0.05);
  EXPECT_EQ(plan.model_path, "");
  EXPECT_EQ(plan.job_spec_path, "");
  EXPECT_FALSE(plan.measured_peak_bytes);
  EXPECT_FALSE(plan.predicted_peak_bytes);
  EXPECT_FALSE(plan.measured_samples_per_second);
  EXPECT_FALSE(plan.predicted_samples_per_second);
  EXPECT_TRUE(plan.notes.empty());
  EXPECT_FALSE(plan.parameter_count);  // plans written before [job] parameters
  EXPECT_EQ(plan, plan_for(plan.config));
}

TEST(PlanToml, RoundTripIsExactForEveryGoldenPlan) {
  for (const auto& [name, plan] : testing::golden_plans()) {
    SCOPED_TRACE(name);
    const std::string text = write_plan_toml(plan);
    const Plan back = parse_plan_toml(text, "plan.toml");
    EXPECT_EQ(back, plan);
    EXPECT_EQ(write_plan_toml(back), text);
  }
}

TEST(PlanToml, RoundTripIsExactForAwkwardValues) {
  Plan plan = testing::base_plan(3, 7);
  plan.optimizer.lr = 0.1 + 0.2;      // 0.30000000000000004
  plan.optimizer.weight_decay = 1.0;  // written "1.0", not the integer 1
  plan.optimizer.eps = 1e-300;
  plan.optimizer.beta1 = 0.0;
  plan.optimizer.beta2 = std::nextafter(1.0, 0.0);
  plan.optimizer.momentum = 1.0 / 3.0;
  plan.optimizer.max_grad_norm = 0.1 + 0.7;  // 0.7999999999999999
  plan.headroom = 0.0;
  plan.budget_bytes = std::numeric_limits<int64_t>::max();
  plan.measured_peak_bytes = 0;
  plan.predicted_samples_per_second = 1e20;
  plan.model_path = "C:\\models\\\"quoted\" \xc3\xa9t\xc3\xa9.pt";
  plan.job_spec_path = "jobs/with\ttab\nand newline.toml";
  plan.notes = {"", "a \"quoted\" note", "line one\nline two", "control \x01 char", "# not a comment"};
  plan.config.checkpoint.mode = CheckpointPlan::Mode::kEveryK;
  plan.config.checkpoint.every_k = 3;
  const std::string text = write_plan_toml(plan);
  const Plan back = parse_plan_toml(text, "plan.toml");
  EXPECT_EQ(back, plan) << text;
  EXPECT_EQ(write_plan_toml(back), text);
}

TEST(PlanToml, Bf16ParamsRoundTripsByName) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.precision = Precision::kBf16Params;
  plan.config.offload_optimizer = true;
  const std::string text = write_plan_toml(plan);
  EXPECT_NE(text.find("precision = \"bf16_params\"\n"), std::string::npos) << text;
  EXPECT_EQ(parse_plan_toml(text, "plan.toml"), plan);
}

TEST(PlanToml, WritesTheDocumentedLayout) {
  const std::string text = write_plan_toml(testing::golden_plans()[1].second);
  for (const char* expected :
       {"plan_version = 1\n", "[job]\n", "global_batch = 32  # micro_batch * accumulation_steps, exact\n",
        "budget = 17179869184  # bytes (16.00 GiB)\n", "[config]\n", "micro_batch = 4\n", "accumulation_steps = 8\n",
        "checkpoint = \"all\"\n", "precision = \"bf16\"\n", "[optimizer]\n", "lr = 0.0003\n", "betas = [0.9, 0.95]\n",
        "eps = 1e-08\n", "momentum = 0.0\n", "max_grad_norm = 1.0\n", "[result]\n"})
    EXPECT_NE(text.find(expected), std::string::npos) << expected;
}

// A language model's plan names the length it was verified at; a plan
// without "seq" inputs writes no seq line.
TEST(PlanToml, TheVerifiedSequenceLengthRoundTrips) {
  Plan plan = testing::base_plan(4, 2);
  EXPECT_EQ(write_plan_toml(plan).find("seq ="), std::string::npos);
  plan.seq_len = 2048;
  const std::string text = write_plan_toml(plan);
  EXPECT_NE(text.find("seq = 2048  # tokens per sequence, verified (the longest)\n"), std::string::npos) << text;
  EXPECT_EQ(parse_plan_toml(text, "plan.toml"), plan);
  EXPECT_EQ(error_of(std::string("[job]\nseq = 0\n") + kMinimal).find("plan.toml:2:7: job.seq:"), 0u)
      << error_of(std::string("[job]\nseq = 0\n") + kMinimal);
  EXPECT_EQ(error_of(std::string("[job]\nseq = 20000000\n") + kMinimal),
            "plan.toml:2:7: job.seq: must be in [1, 16777216] tokens, got 20000000");
}

// The trainable parameter count sizes DeepSpeed's ZeRO-2 buckets (Note
// [ZeRO buckets] in recipes/deepspeed_sections.cpp).
TEST(PlanToml, TheParameterCountRoundTrips) {
  Plan plan = testing::base_plan(4, 2);
  plan.parameter_count.reset();
  EXPECT_EQ(write_plan_toml(plan).find("parameters ="), std::string::npos);
  plan.parameter_count = 124'439'808;
  const std::string text = write_plan_toml(plan);
  EXPECT_NE(text.find("parameters = 124439808  # trainable parameter elements (the optimizer's)\n"), std::string::npos)
      << text;
  EXPECT_EQ(parse_plan_toml(text, "plan.toml"), plan);
  EXPECT_EQ(error_of(std::string("[job]\nparameters = 0\n") + kMinimal).find("plan.toml:2:14: job.parameters:"), 0u)
      << error_of(std::string("[job]\nparameters = 0\n") + kMinimal);
}

TEST(PlanToml, BudgetMayBeASizeString) {
  const Plan plan = parse_plan_toml(std::string("[job]\nbudget = \"16GiB\"\n") + kMinimal, "plan.toml");
  EXPECT_EQ(plan.budget_bytes, int64_t{16} << 30);
}

TEST(PlanToml, IntegersAreAcceptedForFloats) {
  const Plan plan = parse_plan_toml(std::string(kMinimal) + "[optimizer]\nlr = 1\nbetas = [0, 0.5]\n", "plan.toml");
  EXPECT_EQ(plan.optimizer.lr, 1.0);
  EXPECT_EQ(plan.optimizer.beta1, 0.0);
}

TEST(PlanToml, ErrorsNameFileLineColumnAndKey) {
  EXPECT_EQ(error_of("[config\n"), "plan.toml:1:8: Error while parsing table header: expected ']', saw '\\n'");
  EXPECT_EQ(error_of("plan_version = 1\n"), "plan.toml:1:1: config: missing required table [config]");
  EXPECT_EQ(error_of("[config]\nmicro_batch = 4\n"), "plan.toml:1:1: config.accumulation_steps: missing required key");
  EXPECT_EQ(error_of(std::string(kMinimal) + "micro_bach = 3\n"),
            "plan.toml:4:1: config.micro_bach: unknown key (did you mean 'micro_batch'?; valid: micro_batch, "
            "accumulation_steps, checkpoint, optimizer, offload_optimizer, precision)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[resutl]\n"),
            "plan.toml:4:2: resutl: unknown key (did you mean 'result'?; valid: plan_version, notes, job, config, "
            "optimizer, result)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nlearning_rate = 0.1\n"),
            "plan.toml:5:1: optimizer.learning_rate: unknown key (did you mean 'lr'?; valid: lr, weight_decay, "
            "betas, eps, momentum, implementation, max_grad_norm)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nimplementation = \"single\"\n"),
            "plan.toml:5:18: optimizer.implementation: unknown value 'single' (did you mean 'single_tensor'?; valid: "
            "foreach, fused, single_tensor)");
  EXPECT_EQ(error_of("[config]\nmicro_batch = \"4\"\naccumulation_steps = 2\n"),
            "plan.toml:2:15: config.micro_batch: expected an integer, got a string");
  EXPECT_EQ(error_of("[config]\nmicro_batch = 0\naccumulation_steps = 2\n"),
            "plan.toml:2:15: config.micro_batch: must be >= 1, got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "optimizer = \"adam8bit\"\n"),
            "plan.toml:4:13: config.optimizer: unknown optimizer 'adam8bit' (did you mean 'adamw8bit'?; valid: "
            "adamw, adamw8bit, sgd, adafactor)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "precision = \"bf61\"\n"),
            "plan.toml:4:13: config.precision: unknown precision 'bf61' (did you mean 'bf16'?; valid: fp32, bf16, "
            "fp16, bf16_params)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "offload_optimizer = \"yes\"\n"),
            "plan.toml:4:21: config.offload_optimizer: expected true or false, got a string");
  EXPECT_EQ(error_of(std::string("[job]\nglobal_batch = 10\n") + kMinimal),
            "plan.toml:2:16: job.global_batch: must equal config.micro_batch * config.accumulation_steps = 4 * 2 "
            "= 8 (frameworks cannot express a smaller last micro-batch), got 10");
  EXPECT_EQ(error_of(std::string("[job]\ndevice = \"gpu\"\n") + kMinimal),
            "plan.toml:2:10: job.device: unknown value 'gpu' (did you mean 'cpu'?; valid: cpu, cuda)");
  EXPECT_EQ(error_of(std::string("[job]\nbudget = \"16 gigs\"\n") + kMinimal),
            "plan.toml:2:10: job.budget: expected bytes or a size such as \"16GiB\" or \"7.5 GB\", got '16 gigs'");
  EXPECT_EQ(error_of(std::string("[job]\nheadroom = 0.95\n") + kMinimal),
            "plan.toml:2:12: job.headroom: must be in [0, 0.9], got 0.95");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nbetas = [0.9]\n"),
            "plan.toml:5:9: optimizer.betas: expected [beta1, beta2]");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nbetas = [0.9, 1.0]\n"),
            "plan.toml:5:9: optimizer.betas: each beta must be in [0, 1), got 1");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nlr = 0\n"),
            "plan.toml:5:6: optimizer.lr: must be in (0, 1000], got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nweight_decay = 1001\n"),
            "plan.toml:5:16: optimizer.weight_decay: must be in [0, 1000], got 1001");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\neps = 0.0\n"),
            "plan.toml:5:7: optimizer.eps: must be in (0, 1], got 0");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nbetas = [nan, 0.9]\n"),
            "plan.toml:5:10: optimizer.betas: must be finite, got nan");
  // micro_batch * accumulation_steps is the global batch: past int64 it
  // would wrap (signed overflow) instead of failing.
  EXPECT_EQ(error_of("[config]\nmicro_batch = 4611686018427387904\naccumulation_steps = 2\n"),
            "plan.toml:3:22: config.accumulation_steps: micro_batch * accumulation_steps = 4611686018427387904 * 2 "
            "does not fit int64");
  // An empty submodule path would not survive writing ("a++" reads back as "a+").
  EXPECT_EQ(error_of(std::string(kMinimal) + "checkpoint = \"paths:blocks.0++\"\n"),
            "plan.toml:4:14: config.checkpoint: config: ckpt paths: empty path in 'paths:blocks.0++' (write "
            "paths:A+B)");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[optimizer]\nlr = inf\n"),
            "plan.toml:5:6: optimizer.lr: must be finite, got inf");
  EXPECT_EQ(error_of("plan_version = 2\n" + std::string(kMinimal)),
            "plan.toml:1:16: plan_version: this oomtune reads version 1, got 2");
  EXPECT_EQ(error_of("notes = [\"ok\", 3]\n" + std::string(kMinimal)),
            "plan.toml:1:16: notes[1]: expected a string, got an integer");
  EXPECT_EQ(error_of(std::string(kMinimal) + "[result]\nmeasured_peak_bytes = -1\n"),
            "plan.toml:5:23: result.measured_peak_bytes: must be >= 0, got -1");
}

TEST(PlanToml, ErrorsAreInputErrorsWithExitCode2) {
  try {
    parse_plan_toml("[config]\n", "p.toml");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.exit_code(), kExitBadInput);
  }
}

TEST(PlanToml, ReadNamesAMissingFile) {
  try {
    read_plan_toml("/nonexistent/plan.toml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/plan.toml: cannot open the plan file: No such file or directory");
  }
  const std::string folder = std::filesystem::temp_directory_path().string();
  try {
    read_plan_toml(folder);
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), folder + ": is a folder, not a plan file");
  }
}

// The two TOML files trade places easily (autotune reads job.toml, emit
// reads plan.toml): each reader names the other file and the command that
// takes it, rather than "unknown key" at its first table.
TEST(PlanToml, AJobSpecAndAPlanAreToldApart) {
  const Plan plan = testing::golden_plans()[0].second;
  ASSERT_EQ(plan.job_spec_path, "examples/gpt.toml");
  try {
    parse_job_spec(write_plan_toml(plan), "out/plan.toml", "out");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "out/plan.toml: is a plan (autotune --emit writes one), not a job spec; run its configuration with "
              "oomtune probe --plan out/plan.toml, or tune again from the job spec it names: examples/gpt.toml");
  }
  try {
    parse_plan_toml("model = \"m.pt\"\nglobal_batch = 8\n", "job.toml");
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()),
              "job.toml: is a job spec, not a plan; a plan is the plan.toml that oomtune autotune job.toml --emit "
              "DIR writes into DIR (emit and probe --plan read it)");
  }
}

TEST(PlanToml, ReadFromAFile) {
  const std::string path = testing::scratch_path("plan.toml").string();
  const Plan plan = testing::golden_plans()[3].second;
  write_file_atomically(path, write_plan_toml(plan));
  EXPECT_EQ(read_plan_toml(path), plan);
}

TEST(PlanValidation, AdafactorWithOffloadIsRefused) {
  Plan plan = testing::base_plan(4, 2);
  plan.config.optimizer = OptimizerKind::kAdafactor;
  plan.config.offload_optimizer = true;
  try {
    write_plan_toml(plan);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), std::string("plan: config.offload_optimizer: ") + kAdafactorOffloadProblem);
  }
}

TEST(PlanValidation, WriterRejectsAPlanThatBreaksTheGlobalBatch) {
  Plan plan = testing::base_plan(4, 2);
  plan.global_batch = 9;
  try {
    write_plan_toml(plan);
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "plan: job.global_batch: must equal micro_batch * accumulation_steps = 4 * 2 = 8 (frameworks "
                 "cannot express a smaller last micro-batch), got 9");
  }
}

}  // namespace
}  // namespace oomtune
