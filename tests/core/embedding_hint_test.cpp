// A forward whose index runs past an embedding table says which tables the
// model has and how long its inputs are: a sequence past the model's
// positions, or token ids past its vocabulary. The rows are the exporters':
// examples/export_models.py (gpt.pt: vocabulary 1000, 64 positions;
// gpt_seq.pt: 1024 positions) and the shared GPT-2 files' README
// (vocabulary 1000, n_positions 128).

#include "session/embedding_tables.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <torch/script.h>

#include "common/error.h"
#include "quick_trial.h"
#include "strategies/job_config.h"
#include "support/require_file.h"
#include "test_jobs.h"
#include "trial/trial_runner.h"

namespace oomtune {
namespace {

std::string shared_gpt2() { return std::string(OOMTUNE_SHARED_DIR) + "/fixtures/torchscript/hf_gpt2_eager_trace.pt"; }

std::vector<std::pair<std::string, int64_t>> rows_of(const std::string& path) {
  std::vector<std::pair<std::string, int64_t>> rows;
  for (const EmbeddingTable& t : embedding_tables(torch::jit::load(path))) rows.emplace_back(t.name, t.rows);
  return rows;
}

// The error of one step of `job`, "" when it runs.
std::string forward_error(const JobSpec& job) {
  try {
    run_trial(job, baseline_config(job), testing::one_timed_step());
  } catch (const ModelError& e) {
    return e.what();
  }
  return "";
}

TEST(EmbeddingTables, AreTheModulesNnEmbeddingsWithTheirRows) {
  OOMTUNE_REQUIRE_FILE(testing::example_model("gpt"));
  using Rows = std::vector<std::pair<std::string, int64_t>>;
  EXPECT_EQ(rows_of(testing::example_model("gpt")), (Rows{{"tok_emb", 1000}, {"pos_emb", 64}}));
  EXPECT_EQ(rows_of(testing::example_model("resnet18")), Rows{});
  OOMTUNE_REQUIRE_FILE(shared_gpt2());
  // Traced by PyTorch 2.11: the classes are mangled (___torch_mangle_324.Embedding).
  EXPECT_EQ(rows_of(shared_gpt2()), (Rows{{"transformer.wte", 1000}, {"transformer.wpe", 128}}));
}

TEST(EmbeddingHint, ASequencePastThePositionsNamesTheTablesAndTheInputs) {
  JobSpec job = testing::gpt_job(4);
  job.model_path = shared_gpt2();
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.output = std::string("logits");
  for (InputSpec& input : job.inputs) input.shape[1] = 200;
  const std::string error = forward_error(job);
  EXPECT_NE(error.find("failed: index out of range in self (at modeling_gpt2.py:576 in forward); an index ran past "
                       "the rows of an embedding table (a sequence longer than the model's positions, or token ids "
                       "past its vocabulary); nn.Embedding tables: transformer.wte (1000 rows), transformer.wpe (128 "
                       "rows); integer inputs: input_ids (values in [0, 1000), 200 long)"),
            std::string::npos)
      << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << "one line";
  // The loss target is not passed to forward, so it is not listed.
  EXPECT_EQ(error.find("targets ("), std::string::npos) << error;
}

TEST(EmbeddingHint, TokenIdsPastTheVocabularyShowTheirRange) {
  JobSpec job = testing::gpt_job(4);
  OOMTUNE_REQUIRE_FILE(job.model_path);
  job.inputs[0].high = 1500;
  const std::string error = forward_error(job);
  EXPECT_NE(error.find("index out of range in self"), std::string::npos) << error;
  EXPECT_NE(error.find("nn.Embedding tables: tok_emb (1000 rows), pos_emb (64 rows); integer inputs: input_ids "
                       "(values in [0, 1500), 64 long)"),
            std::string::npos)
      << error;
}

// The example GPT slices its position table to the input's length, so a
// longer input fails on a shape mismatch that names the table's 1024 rows.
TEST(EmbeddingHint, AShapeMismatchAtATablesRowsNamesThatTable) {
  JobSpec job = testing::gpt_job(2);
  job.model_path = testing::example_model("gpt_seq");
  OOMTUNE_REQUIRE_FILE(job.model_path);
  for (InputSpec& input : job.inputs) input.shape[1] = 1100;
  const std::string error = forward_error(job);
  EXPECT_NE(error.find("must match the size of tensor b (1024)"), std::string::npos) << error;
  EXPECT_NE(error.find("; 1024 is the number of rows of the model's nn.Embedding pos_emb and input_ids is 1100 "
                       "long: the sequence may be longer than the model's positions"),
            std::string::npos)
      << error;
}

// The rules alone, on a made batch: other causes get no hint.
TEST(EmbeddingHint, OtherCausesGetNone) {
  JobSpec job = testing::gpt_job(2);
  Batch batch;
  batch.names = {"input_ids", "targets"};
  batch.tensors = {at::zeros({2, 100}, at::kLong), at::zeros({2, 100}, at::kLong)};
  batch.batch_axes = {0, 0};
  batch.size = 2;
  const std::vector<EmbeddingTable> tables = {{"tok_emb", 1000}, {"pos_emb", 64}};
  const std::vector<std::size_t> forward_inputs = {0};
  EXPECT_EQ(embedding_hint(tables, job, batch, forward_inputs,
                           "mat1 and mat2 shapes cannot be multiplied (2x64 and "
                           "32x8)"),
            "");
  // A number that is a table's rows, but no input is longer than it.
  EXPECT_EQ(embedding_hint(tables, job, batch, forward_inputs, "size of tensor a (1000) must match (3)"), "");
  // No table, or no integer input passed to forward: nothing to name.
  EXPECT_EQ(embedding_hint({}, job, batch, forward_inputs, "index out of range in self"), "");
  EXPECT_EQ(embedding_hint(tables, job, batch, {}, "index out of range in self"), "");
  // A CUDA kernel's assert is the same check.
  EXPECT_NE(embedding_hint(tables, job, batch, forward_inputs, "CUDA error: device-side assert triggered")
                .find("input_ids (values in [0, 1000), 100 long)"),
            std::string::npos);
  // A number too large for int64 is no table's rows.
  EXPECT_EQ(embedding_hint(tables, job, batch, forward_inputs, "size (99999999999999999999999) must match (64)"),
            "; 64 is the number of rows of the model's nn.Embedding pos_emb and input_ids is 100 long: the sequence "
            "may be longer than the model's positions");
}

}  // namespace
}  // namespace oomtune
