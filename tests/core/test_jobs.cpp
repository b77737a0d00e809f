#include "test_jobs.h"

#include <filesystem>
#include <fstream>

#include "support/build_values.h"
#include "support/scratch_path.h"

namespace oomtune::testing {

std::string test_model(const std::string& name) { return std::string(kTestModels) + "/" + name + ".pt"; }

std::string example_model(const std::string& name) {
  return std::string(OOMTUNE_EXAMPLES_DIR) + "/models/" + name + ".pt";
}

bool exists(const std::string& path) { return std::filesystem::exists(path); }

namespace {

InputSpec input(const std::string& name, std::vector<int64_t> shape, const std::string& dtype,
                std::optional<double> low = std::nullopt, std::optional<double> high = std::nullopt) {
  InputSpec spec;
  spec.name = name;
  spec.shape = std::move(shape);
  spec.dtype = dtype;
  spec.low = low;
  spec.high = high;
  return spec;
}

// A test model taking x [batch, features], trained on the mean of its output.
JobSpec mean_loss_job(const std::string& model, int64_t features, int64_t global_batch) {
  JobSpec job;
  job.model_path = test_model(model);
  job.inputs = {input("x", {kBatchDim, features}, "float32")};
  job.loss.kind = LossSpec::Kind::kMean;
  job.global_batch = global_batch;
  return job;
}

}  // namespace

JobSpec mlp_job(int64_t global_batch, const std::string& optimizer) {
  JobSpec job;
  job.model_path = test_model("mlp");
  job.inputs = {input("x", {kBatchDim, 256}, "float32"), input("labels", {kBatchDim}, "int64", 0, 10)};
  job.loss.kind = LossSpec::Kind::kCrossEntropy;
  job.loss.target = "labels";
  job.global_batch = global_batch;
  job.optimizer.kind = optimizer;
  if (optimizer == "sgd") job.optimizer.momentum = 0.9;
  return job;
}

JobSpec bigmatmul_job(int64_t global_batch) { return mean_loss_job("bigmatmul", 256, global_batch); }

JobSpec amplified_job(const std::string& model, int64_t global_batch) { return mean_loss_job(model, 64, global_batch); }

JobSpec masked_scores_job(int64_t global_batch) { return mean_loss_job("masked_scores_trace", 64, global_batch); }

JobSpec made_in_forward_job(int64_t global_batch) { return mean_loss_job("arange_script", 8, global_batch); }

JobSpec encoder_decoder_job(int64_t global_batch, const std::string& model) {
  return mean_loss_job(model, 64, global_batch);
}

JobSpec gpt_job(int64_t global_batch) {
  JobSpec job;
  job.model_path = example_model("gpt");
  job.inputs = {input("input_ids", {kBatchDim, 64}, "int64", 0, 1000),
                input("targets", {kBatchDim, 64}, "int64", 0, 1000)};
  job.loss.kind = LossSpec::Kind::kCrossEntropy;
  job.loss.target = "targets";
  job.global_batch = global_batch;
  job.optimizer.lr = 3e-4;
  return job;
}

JobSpec resnet18_job(int64_t global_batch) {
  JobSpec job;
  job.model_path = example_model("resnet18");
  job.inputs = {input("images", {kBatchDim, 3, 224, 224}, "float32"), input("labels", {kBatchDim}, "int64", 0, 1000)};
  job.loss.kind = LossSpec::Kind::kCrossEntropy;
  job.loss.target = "labels";
  job.global_batch = global_batch;
  return job;
}

std::string write_temp_file(const std::string& name, const std::string& text) {
  const auto path = scratch_path(name);
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace oomtune::testing
