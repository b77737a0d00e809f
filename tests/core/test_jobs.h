#pragma once
// Job specs for the core tests' models (tests/core/make_test_models.py) and
// the example models (examples/export_models.py).

#include <string>

#include "job/job_spec.h"
#include "trial/trial_options.h"

namespace oomtune::testing {

/// Path of a test model: kTestModels/<name>.pt.
std::string test_model(const std::string& name);
/// Path of an example model: OOMTUNE_EXAMPLES_DIR/models/<name>.pt.
std::string example_model(const std::string& name);
/// True when the file exists (tests fail otherwise: support/require_file.h).
bool exists(const std::string& path);

/// mlp.pt: x [batch, 256] float, labels [batch] in [0, 10), cross_entropy.
JobSpec mlp_job(int64_t global_batch, const std::string& optimizer = "adamw");
/// bigmatmul.pt: x [batch, 256], loss = mean of the output.
JobSpec bigmatmul_job(int64_t global_batch);
/// amplified_1e3.pt or amplified_inf.pt (fc(x) times a factor, for fp16's
/// loss scaling): x [batch, 64], loss = mean of the output.
JobSpec amplified_job(const std::string& model, int64_t global_batch);
/// masked_scores_trace.pt (attention scores masked with a traced fp32
/// minimum): x [batch, 64], loss = mean of the output.
JobSpec masked_scores_job(int64_t global_batch);
/// arange_script.pt (an embedding of positions added to x: no matrix
/// product): x [batch, 8], loss = mean of the output.
JobSpec made_in_forward_job(int64_t global_batch);
/// encoder_decoder.pt (or `model`, encoder_decoder_branch): x [batch, 64],
/// loss = mean of the output.
JobSpec encoder_decoder_job(int64_t global_batch, const std::string& model = "encoder_decoder");
/// The example GPT: tokens [batch, 64] in [0, 1000), next-token cross_entropy.
JobSpec gpt_job(int64_t global_batch);
/// The example ResNet-18 (torchvision): images [batch, 3, 224, 224], labels
/// [batch] in [0, 1000), cross_entropy.
JobSpec resnet18_job(int64_t global_batch);

/// A trial with as few timed steps as steady timing allows (1, at most 2):
/// the byte figures the tests check come from the measured step.
inline TrialOptions quick_trial() {
  TrialOptions options;
  options.min_timed_steps = 1;
  options.max_timed_steps = 2;
  return options;
}

/// Writes `text` to `name` in this process's scratch folder
/// (support/scratch_path.h) and returns its path.
std::string write_temp_file(const std::string& name, const std::string& text);

}  // namespace oomtune::testing
