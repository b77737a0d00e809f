#include "job/job_spec.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"
#include "common/json_text.h"
#include "job/job_json.h"

namespace oomtune {
namespace {

const char* kGood = R"(model = "models/gpt.pt"
global_batch = 32
budget = "7.5 GB"
headroom = 0.1

[[inputs]]
name = "input_ids"
shape = ["batch", 64]
dtype = "int64"
range = [0, 1000]

[[inputs]]
name = "targets"
shape = ["batch", 64]
dtype = "int64"
range = [0, 1000]

[loss]
kind = "cross_entropy"
target = "targets"

[optimizer]
kind = "adamw"
lr = 3e-4
)";

std::string error_of(const std::string& text) {
  try {
    parse_job_spec(text, "job.toml", "/jobs");
  } catch (const SpecError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string replace(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return text.replace(at, from.size(), to);
}

TEST(JobSpec, ReadsAGoodSpec) {
  const JobSpec spec = parse_job_spec(kGood, "job.toml", "/jobs");
  EXPECT_EQ(spec.model_path, "/jobs/models/gpt.pt");
  EXPECT_EQ(spec.global_batch, 32);
  EXPECT_EQ(spec.budget_bytes, 7'500'000'000LL);
  EXPECT_EQ(spec.usable_budget_bytes(), 6'750'000'000LL);
  // The host budget takes the same headroom (0.1): 64 GiB less 10 %.
  const JobSpec host = parse_job_spec(
      replace(kGood, "budget = \"7.5 GB\"", "budget = \"7.5 GB\"\nhost_budget = \"64GiB\""), "job.toml", "");
  EXPECT_EQ(host.host_budget_bytes, 64LL << 30);
  EXPECT_EQ(host.usable_host_budget_bytes(), static_cast<int64_t>(0.9 * static_cast<double>(64LL << 30)));
  // The trial's job record carries it; one written before it has none.
  EXPECT_EQ(job_spec_from_json(nlohmann::json::parse(json_text(to_json(host)))).host_budget_bytes, 64LL << 30);
  nlohmann::json older = to_json(spec);
  older.erase("host_budget_bytes");
  EXPECT_FALSE(job_spec_from_json(older).host_budget_bytes.has_value());
  ASSERT_EQ(spec.inputs.size(), 2u);
  EXPECT_EQ(spec.inputs[0].shape, (std::vector<int64_t>{kBatchDim, 64}));
  EXPECT_EQ(spec.inputs[0].batch_axis(), 0u);
  EXPECT_EQ(spec.loss.kind, LossSpec::Kind::kCrossEntropy);
  ASSERT_EQ(spec.model_inputs().size(), 1u);
  EXPECT_EQ(spec.model_inputs()[0]->name, "input_ids");
  EXPECT_DOUBLE_EQ(spec.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(parse_job_spec(replace(kGood, "lr = 3e-4", "lr = 3e-4\nmax_grad_norm = 1.0"), "job.toml", "")
                       .optimizer.max_grad_norm,
                   1.0);
}

TEST(JobSpec, DefaultsArePinned) {
  const JobSpec spec = parse_job_spec(replace(kGood, "budget = \"7.5 GB\"\nheadroom = 0.1\n", ""), "job.toml", "");
  EXPECT_FALSE(spec.budget_bytes.has_value());
  EXPECT_FALSE(spec.host_budget_bytes.has_value());  // the host is not checked
  EXPECT_FALSE(spec.usable_host_budget_bytes().has_value());
  EXPECT_DOUBLE_EQ(spec.headroom, 0.05);
  EXPECT_EQ(spec.device, Device::kCpu);
  EXPECT_EQ(spec.precision, "fp32");
  EXPECT_FALSE(spec.allow_bf16);
  EXPECT_FALSE(spec.allow_adafactor);
  EXPECT_FALSE(spec.allow_remainder);
  EXPECT_EQ(spec.min_micro_batch, 1);
  EXPECT_FALSE(spec.max_micro_batch.has_value());
  EXPECT_EQ(spec.verify_steps, 20);
  EXPECT_DOUBLE_EQ(spec.trial_timeout_seconds, 600);
  EXPECT_FALSE(spec.optimizing_executor);
  EXPECT_EQ(spec.cuda_target, "sm90");
  EXPECT_FALSE(spec.seq_len.has_value());
  EXPECT_FALSE(spec.seq_min.has_value());
  EXPECT_FALSE(spec.has_seq());
  EXPECT_DOUBLE_EQ(spec.optimizer.weight_decay, 0.01);
  EXPECT_DOUBLE_EQ(spec.optimizer.beta2, 0.999);
  // torch.optim's default for CUDA parameters (optimizer.py,
  // _default_to_fused_or_foreach), the target even of a CPU probe.
  EXPECT_EQ(spec.optimizer.implementation, OptimizerImplementation::kForeach);
  EXPECT_DOUBLE_EQ(spec.optimizer.max_grad_norm, 0.0);  // no clipping, as torch.optim alone
  EXPECT_TRUE(std::holds_alternative<std::monostate>(spec.output));
}

TEST(JobSpec, EachBadInputGetsItsExactError) {
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch =")),
            "job.toml:2:15: Error while parsing key-value pair: expected value, saw '\\n'");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_bach = 32")),
            "job.toml:2:1: global_bach: unknown key (did you mean 'global_batch'?; valid: model, inputs, output, "
            "loss, global_batch, remainder, optimizer, precision, allow_bf16, allow_adafactor, device, budget, "
            "host_budget, headroom, min_micro_batch, max_micro_batch, verify_steps, trial_timeout, executor, seed, "
            "trainable, frozen, "
            "frozen_dtype, cuda_target, seq)");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 32\ncuda_target = \"sm70\"")),
            "job.toml:3:15: cuda_target: unknown value 'sm70' (did you mean 'sm75'?; valid: sm75, sm80, sm86, sm89, "
            "sm90, sm100, sm120)");
  EXPECT_EQ(error_of(replace(kGood, "budget = \"7.5 GB\"", "budget = \"7.5 GBs\"")),
            "job.toml:3:10: budget: expected a size such as \"8GiB\", \"7.5 GB\" or \"512MiB\", got '7.5 GBs'");
  EXPECT_EQ(error_of(replace(kGood, "budget = \"7.5 GB\"", "budget = \"7.5 GB\"\nhost_budget = \"-1GiB\"")),
            "job.toml:4:15: host_budget: expected a size such as \"8GiB\", \"7.5 GB\" or \"512MiB\", got '-1GiB'");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 0")),
            "job.toml:2:16: global_batch: must be >= 1, got 0");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = \"32\"")),
            "job.toml:2:16: global_batch: expected an integer, got a string");
  EXPECT_EQ(error_of(replace(kGood, "shape = [\"batch\", 64]\ndtype = \"int64\"\nrange = [0, 1000]\n\n[[inputs]]",
                             "shape = [64, 64]\ndtype = \"int64\"\nrange = [0, 1000]\n\n[[inputs]]")),
            "job.toml:8:9: inputs[0].shape: exactly one dimension must be \"batch\", got 0");
  EXPECT_EQ(
      error_of(replace(kGood, "target = \"targets\"", "target = \"target\"")),
      "job.toml:20:10: loss.target: no input named 'target' (did you mean 'targets'?; valid: input_ids, targets)");
  // A float target would be truncated to class indices without a word.
  EXPECT_EQ(error_of(replace(kGood, "dtype = \"int64\"\nrange = [0, 1000]\n\n[loss]",
                             "dtype = \"float32\"\nrange = [0, 1000]\n\n[loss]")),
            "job.toml:20:10: loss.target: cross_entropy takes class indices: input 'targets' must have dtype int64 or "
            "int32, got float32");
  // A causal language model's labels are its input ids; as the target, they leave forward nothing.
  EXPECT_EQ(error_of(replace(replace(kGood,
                                     "[[inputs]]\nname = \"targets\"\nshape = [\"batch\", 64]\n"
                                     "dtype = \"int64\"\nrange = [0, 1000]\n\n",
                                     ""),
                             "target = \"targets\"", "target = \"input_ids\"")),
            "job.toml:14:10: loss.target: 'input_ids' is the only input, and the target is not passed to forward: "
            "add the model's input beside it (a language model trained on its own tokens: an input of the same "
            "shape, as in examples/hf_gpt2.toml)");
  EXPECT_EQ(error_of(replace(kGood, "kind = \"cross_entropy\"", "kind = \"crossentropy\"")),
            "job.toml:19:8: loss.kind: unknown value 'crossentropy' (did you mean 'cross_entropy'?; valid: "
            "cross_entropy, mse, mean, model_returns_loss)");
  EXPECT_EQ(
      error_of(replace(kGood, "dtype = \"int64\"\nrange = [0, 1000]\n\n[[inputs]]", "dtype = \"int64\"\n\n[[inputs]]")),
      "job.toml:6:1: inputs[0].range: integer inputs need a range = [low, high) (token ids, labels)");
  EXPECT_EQ(error_of(replace(kGood, "headroom = 0.1", "headroom = 1.5")),
            "job.toml:4:12: headroom: must be in [0, 0.9], got 1.5");
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 3e-4\nlearning_rate = 1")),
            "job.toml:25:1: optimizer.learning_rate: unknown key (did you mean 'lr'?; valid: kind, lr, "
            "weight_decay, betas, eps, momentum, implementation, max_grad_norm)");
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 3e-4\nimplementation = \"fuse\"")),
            "job.toml:25:18: optimizer.implementation: unknown value 'fuse' (did you mean 'fused'?; valid: foreach, "
            "fused, single_tensor)");
  EXPECT_EQ(error_of(replace(kGood, "model = \"models/gpt.pt\"\n", "")), "job.toml:1:1: model: missing required key");
  // A first job spec without [loss]: the error lists what to write.
  EXPECT_EQ(error_of(replace(kGood, "[loss]\nkind = \"cross_entropy\"\ntarget = \"targets\"\n", "")),
            "job.toml:1:1: loss: missing required table [loss]: kind = \"cross_entropy\" with target = \"INPUT\" "
            "(class indices), \"mse\" with a target, \"mean\" of the output, or \"model_returns_loss\" "
            "(docs/job_spec.md)");
  EXPECT_EQ(error_of("model = \"a.pt\"\nglobal_batch = [\n"),
            "job.toml:2:18: Error while parsing array: encountered end-of-file");
}

// Values a trial cannot use are refused where they are written, not minutes
// later in a child process (found by tests/fuzz/fuzz_job_files.cpp; each
// case below was accepted before).
TEST(JobSpec, ValuesATrialCannotUseAreRefused) {
  // A NaN beta reached the child as JSON null: "job record: type must be number".
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 3e-4\nbetas = [nan, 0.9]")),
            "job.toml:25:10: optimizer.betas: must be finite, got nan");
  // The plan writer's ranges (job/hyper_parameters.h): with lr = 0 autotune
  // searched, then failed to write its plan.
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 0.0")),
            "job.toml:24:6: optimizer.lr: must be in (0, 1000], got 0");
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 3e-4\neps = 0")),
            "job.toml:25:7: optimizer.eps: must be in (0, 1], got 0");
  EXPECT_EQ(error_of(replace(kGood, "kind = \"adamw\"", "kind = \"sgd\"\nmomentum = 1.0")),
            "job.toml:24:12: optimizer.momentum: must be in [0, 1), got 1");
  // A negative max_norm would flip every gradient (clip_grad_norm_ takes it).
  EXPECT_EQ(error_of(replace(kGood, "lr = 3e-4", "lr = 3e-4\nmax_grad_norm = -1.0")),
            "job.toml:25:17: optimizer.max_grad_norm: must be in [0, 1000000], got -1");
  // Integer bounds go to at::randint as int64: 1e300 became INT64_MIN.
  EXPECT_EQ(error_of(replace(kGood, "range = [0, 1000]", "range = [0, 1e300]")),
            "job.toml:10:9: inputs[0].range: int64 takes bounds in [-9007199254740992, 9007199254740992] "
            "(2^53: exact as the double the range is read as), got [0, 1e+300]");
  EXPECT_EQ(error_of(replace(kGood, "range = [0, 1000]", "range = [0, 999.5]")),
            "job.toml:10:9: inputs[0].range: integer inputs take whole-number bounds, got [0, 999.5]");
  EXPECT_EQ(error_of(replace(replace(kGood, "dtype = \"int64\"", "dtype = \"int32\""), "range = [0, 1000]",
                             "range = [0, 4294967296]")),
            "job.toml:10:9: inputs[0].range: int32 takes bounds in [-2147483648, 2147483648] (high is exclusive), "
            "got [0, 4294967296]");
  EXPECT_EQ(
      error_of(replace(replace(kGood, "dtype = \"int64\"", "dtype = \"bool\""), "range = [0, 1000]", "range = [0, 3]")),
      "job.toml:10:9: inputs[0].range: bool takes bounds in [0, 2] (high is exclusive), got [0, 3]");
  // Float bounds: finite, and values a float32 (float16) holds.
  const std::string floats = replace(kGood, "dtype = \"int64\"", "dtype = \"float16\"");
  EXPECT_EQ(error_of(replace(floats, "range = [0, 1000]", "range = [-inf, 1000]")),
            "job.toml:10:10: inputs[0].range: must be finite, got -inf");
  EXPECT_EQ(error_of(replace(floats, "range = [0, 1000]", "range = [0, 1e5]")),
            "job.toml:10:9: inputs[0].range: float16 takes bounds in [-65504, 65504] (float16's largest finite "
            "value), got [0, 100000]");
  EXPECT_EQ(error_of(replace(floats, "range = [0, 1000]", "range = [-3e38, 3e38]")),
            "job.toml:10:9: inputs[0].range: high - low must be a finite float32, got [-3e+38, 3e+38]");
  // Sizes: the search lists every valid micro-batch up to the global batch,
  // and a trial's input must fit a tensor.
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 1048577")),
            "job.toml:2:16: global_batch: must be at most 1048576 samples per optimizer step on one device, got "
            "1048577");
  EXPECT_EQ(error_of(replace(kGood, "shape = [\"batch\", 64]", "shape = [\"batch\", 4611686018427387904]")),
            "job.toml:8:9: inputs[0].shape: [\"batch\", 4611686018427387904] at the global batch 32 has more bytes "
            "than a tensor can hold");
  // The largest values each rule keeps are accepted.
  const JobSpec edge =
      parse_job_spec(replace(replace(kGood, "global_batch = 32", "global_batch = 1048576"), "lr = 3e-4",
                             "lr = 1000\nweight_decay = 1000\neps = 1\nbetas = [0, 0.999999]"),
                     "job.toml", "");
  EXPECT_EQ(edge.global_batch, 1048576);
  EXPECT_EQ(edge.optimizer.lr, 1000);
  EXPECT_EQ(edge.optimizer.eps, 1);
  EXPECT_EQ(parse_job_spec(replace(kGood, "range = [0, 1000]", "range = [-9007199254740992, 9007199254740992]"),
                           "job.toml", "")
                .inputs[0]
                .high,
            9007199254740992.0);
}

TEST(JobSpec, DtypesTakePyTorchsNames) {
  // torch.long is int64, half float16, ... (the torch.dtype aliases); the
  // spec keeps the canonical name, which the child trial reads back.
  for (const auto& [given, canonical] :
       std::vector<std::pair<std::string, std::string>>{{"long", "int64"},
                                                        {"torch.long", "int64"},
                                                        {"torch.int64", "int64"},
                                                        {"int", "int32"},
                                                        {"half", "float16"},
                                                        {"torch.float", "float32"},
                                                        {"double", "float64"},
                                                        {"torch.bfloat16", "bfloat16"}}) {
    const JobSpec spec =
        parse_job_spec(replace(kGood, "dtype = \"int64\"", "dtype = \"" + given + "\""), "job.toml", "");
    EXPECT_EQ(spec.inputs[0].dtype, canonical) << given;
  }
  EXPECT_EQ(error_of(replace(kGood, "dtype = \"int64\"", "dtype = \"torch.lng\"")),
            "job.toml:9:9: inputs[0].dtype: unknown value 'torch.lng' (did you mean 'int64'?; valid: float32, float16, "
            "bfloat16, float64, int64, int32, bool; PyTorch's names work too: torch.long, half, ...)");
}

TEST(JobSpec, PrecisionBf16ParamsIsAChoice) {
  const std::string text = replace(kGood, "global_batch = 32", "global_batch = 32\nprecision = \"bf16_params\"");
  const JobSpec spec = parse_job_spec(text, "job.toml", "");
  EXPECT_EQ(spec.precision, "bf16_params");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 32\nprecision = \"bf16params\"")),
            "job.toml:3:13: precision: unknown value 'bf16params' (did you mean 'bf16_params'?; valid: fp32, bf16, "
            "fp16, bf16_params)");
}

TEST(JobSpec, OverridesWinAndCheckTheirValues) {
  JobSpec spec = parse_job_spec(kGood, "job.toml", "");
  JobOverrides given;
  given.budget = "512MiB";
  given.device = "cuda";
  given.global_batch = 8;
  apply_overrides(spec, given);
  EXPECT_EQ(spec.budget_bytes, 512LL << 20);
  EXPECT_EQ(spec.device, Device::kCuda);
  EXPECT_EQ(spec.global_batch, 8);
  JobOverrides bad_budget;
  bad_budget.budget = "lots";
  EXPECT_THROW(apply_overrides(spec, bad_budget), InputError);
  JobOverrides host;
  host.host_budget = "32GiB";
  apply_overrides(spec, host);
  EXPECT_EQ(spec.host_budget_bytes, 32LL << 30);
  JobOverrides bad_device;
  bad_device.device = "tpu";
  EXPECT_THROW(apply_overrides(spec, bad_device), InputError);
  JobOverrides bounds;
  bounds.min_micro_batch = 2;
  bounds.max_micro_batch = 4;
  apply_overrides(spec, bounds);
  EXPECT_EQ(spec.min_micro_batch, 2);
  EXPECT_EQ(spec.max_micro_batch, 4);
  const auto message = [&](const JobOverrides& o) {
    try {
      apply_overrides(spec, o);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  JobOverrides below;
  below.min_micro_batch = 8;  // above the max of 4 already applied
  EXPECT_EQ(message(below), "--min-micro-batch: max_micro_batch 4 is below min_micro_batch 8");
  JobOverrides zero;
  zero.max_micro_batch = 0;
  EXPECT_EQ(message(zero), "--max-micro-batch: must be >= 1, got 0");
  // A CUDA job trains where its trials run: the machine's memory is its
  // host budget unless it gives one; a CPU or meta job answers for another.
  JobSpec cuda = parse_job_spec(kGood, "job.toml", "");
  cuda.device = Device::kCuda;
  default_host_budget(cuda, int64_t{128} << 30);
  EXPECT_EQ(cuda.host_budget_bytes, int64_t{128} << 30);
  EXPECT_TRUE(cuda.host_budget_is_machines);
  JobSpec given_host = cuda;
  given_host.host_budget_bytes = int64_t{64} << 30;
  given_host.host_budget_is_machines = false;
  default_host_budget(given_host, int64_t{128} << 30);
  EXPECT_EQ(given_host.host_budget_bytes, int64_t{64} << 30);
  EXPECT_FALSE(given_host.host_budget_is_machines);
  for (Device other : {Device::kCpu, Device::kMeta}) {
    JobSpec elsewhere = parse_job_spec(kGood, "job.toml", "");
    elsewhere.device = other;
    default_host_budget(elsewhere, int64_t{128} << 30);
    EXPECT_FALSE(elsewhere.host_budget_bytes.has_value());
  }
  JobSpec unknown = parse_job_spec(kGood, "job.toml", "");
  unknown.device = Device::kCuda;
  default_host_budget(unknown, std::nullopt);
  EXPECT_FALSE(unknown.host_budget_bytes.has_value());
  JobOverrides no_host;
  no_host.host_budget = "0GiB";
  EXPECT_EQ(message(no_host), "--host-budget: expected a size such as 8GiB, 7.5GB or 512MiB, got '0GiB'");
  JobOverrides huge;
  huge.global_batch = kMaxGlobalBatch + 1;
  EXPECT_EQ(message(huge), "--batch: must be at most 1048576 samples per optimizer step on one device, got 1048577");
  JobSpec wide = parse_job_spec(replace(kGood, "shape = [\"batch\", 64]", "shape = [\"batch\", 1099511627776]"),
                                "job.toml", "");  // 2^40 elements a sample: 2^48 bytes at batch 32
  JobOverrides more;
  more.global_batch = 1 << 20;  // 2^60 elements: more bytes than int64 counts
  try {
    apply_overrides(wide, more);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "--batch: inputs[0] 'input_ids': [\"batch\", 1099511627776] at the global batch 1048576 "
                 "has more bytes than a tensor can hold");
  }
  EXPECT_EQ(wide.global_batch, 32);  // unchanged by the refused flag
}

TEST(JobSpec, MissingFileIsAnInputError) {
  try {
    load_job_spec("/nonexistent/job.toml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "/nonexistent/job.toml: cannot open the job spec: No such file or directory");
    EXPECT_EQ(e.exit_code(), 2);
  }
}

TEST(JobSpec, AFolderIsNotAJobSpec) {
  // An ifstream reads a folder as an empty file; the error must not be a
  // confusing "model: missing required key".
  const std::string folder = ::testing::TempDir();
  try {
    load_job_spec(folder);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), folder + ": is a folder, not a job spec");
  }
}

// `oomtune probe model.pt` (a model or a snapshot where the job spec
// belongs) names what the file is and what to pass instead, rather than a
// TOML syntax error at the first binary byte. Magic numbers: PKWARE
// APPNOTE.TXT 4.3.7 (zip), Lib/pickle.py PROTO (pickle protocol 4).
TEST(JobSpec, ABinaryFileIsNamedForWhatItIs) {
  const std::string instead =
      ", not a job spec; autotune and probe read a TOML job spec that names the model file, its inputs, loss and "
      "optimizer (examples/gpt.toml; README \"Your own model\")";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("PK\x03\x04\x14\x00\x00\x00", 8), "a zip archive (a TorchScript model or a torch.save file?)"},
      {std::string("\x80\x04\x95\x10\x00\x00\x00", 7), "a Python pickle (a memory snapshot or a torch.save file?)"},
      {std::string("model = \"m.pt\"\n\x00\x01", 17), "a binary file"},
  };
  const std::string path = ::testing::TempDir() + "oomtune_binary_job_" + std::to_string(::getpid());
  for (const auto& [bytes, kind] : cases) {
    SCOPED_TRACE(kind);
    std::ofstream(path, std::ios::binary) << bytes;
    try {
      load_job_spec(path);
      FAIL();
    } catch (const InputError& e) {
      EXPECT_EQ(std::string(e.what()), path + ": is " + kind + instead);
    }
  }
  std::remove(path.c_str());
}

// trainable / frozen globs and frozen_dtype (job/parameter_selection.h):
// read as written; whether each glob matches a parameter is the session's
// check (tests/core/frozen_parameters_test.cpp).
TEST(JobSpec, TrainableOrFrozenGlobsAreRead) {
  EXPECT_FALSE(parse_job_spec(kGood, "job.toml", "").trainable.freezes());
  const JobSpec lora = parse_job_spec(
      replace(kGood, "headroom = 0.1", "headroom = 0.1\ntrainable = [\"*.lora_A.*\", \"*.lora_B.*\"]"), "job.toml", "");
  EXPECT_EQ(lora.trainable.rule, ParameterSelection::Rule::kTrainable);
  EXPECT_EQ(lora.trainable.globs, (std::vector<std::string>{"*.lora_A.*", "*.lora_B.*"}));
  EXPECT_FALSE(lora.trainable.frozen_bf16);
  const JobSpec frozen = parse_job_spec(replace(kGood, "headroom = 0.1",
                                                "headroom = 0.1\nfrozen = [\"blocks.0.*\"]\nfrozen_dtype = \"bf16\"\n"
                                                "precision = \"bf16\""),
                                        "job.toml", "");
  EXPECT_EQ(frozen.trainable.rule, ParameterSelection::Rule::kFrozen);
  EXPECT_EQ(frozen.trainable.globs, (std::vector<std::string>{"blocks.0.*"}));
  EXPECT_TRUE(frozen.trainable.frozen_bf16);
  // The trial child gets them in the job record.
  EXPECT_EQ(job_spec_from_json(nlohmann::json::parse(json_text(to_json(frozen)))).trainable, frozen.trainable);
}

TEST(JobSpec, EachBadSelectionGetsItsExactError) {
  const auto with = [](const std::string& lines) { return error_of(replace(kGood, "headroom = 0.1", lines)); };
  EXPECT_EQ(with("trainable = [\"*.lora_A.*\"]\nfrozen = [\"blocks.0.*\"]"),
            "job.toml:5:10: frozen: give either trainable or frozen, not both (trainable is set too)");
  EXPECT_EQ(with("trainable = []"),
            "job.toml:4:13: trainable: expected a non-empty array of globs over parameter names, such as "
            "[\"*.lora_A.*\", \"lm_head.*\"]");
  EXPECT_EQ(with("frozen = \"blocks.0.*\""),
            "job.toml:4:10: frozen: expected a non-empty array of globs over parameter names, such as "
            "[\"*.lora_A.*\", \"lm_head.*\"]");
  EXPECT_EQ(with("frozen = [\"blocks.0.*\", \"\"]"),
            "job.toml:4:25: frozen: each glob is a non-empty string, such as \"transformer.h.0.*\"");
  EXPECT_EQ(with("frozen_dtype = \"bf16\""),
            "job.toml:4:16: frozen_dtype: freezes nothing: give trainable = [...] or frozen = [...] too");
  EXPECT_EQ(with("frozen = [\"blocks.0.*\"]\nfrozen_dtype = \"int8\""),
            "job.toml:5:16: frozen_dtype: unknown value 'int8' (did you mean 'fp32'?; valid: fp32, bf16)");
  EXPECT_EQ(with("frozen = [\"blocks.0.*\"]\nfrozen_dtype = \"bf16\""),
            "job.toml:5:16: frozen_dtype: \"bf16\" needs precision = \"bf16\" or \"bf16_params\", got \"fp32\": in "
            "fp32 a bf16 frozen weight meets float32 activations, which matmul refuses");
}

// A sequence dimension (issue #47): "seq" in a shape takes the job's `seq`
// length; a range runs at its max.
std::string seq_job(const std::string& seq_line) {
  std::string text = kGood;
  for (int i = 0; i < 2; ++i) text = replace(text, "shape = [\"batch\", 64]", "shape = [\"batch\", \"seq\"]");
  return replace(text, "global_batch = 32", "global_batch = 32" + seq_line);
}

TEST(JobSpec, ASeqDimensionTakesTheJobsLength) {
  const JobSpec fixed = parse_job_spec(seq_job("\nseq = 2048"), "job.toml", "");
  EXPECT_EQ(fixed.inputs[0].shape, (std::vector<int64_t>{kBatchDim, kSeqDim}));
  EXPECT_TRUE(fixed.has_seq());
  EXPECT_EQ(fixed.seq_len, 2048);
  EXPECT_FALSE(fixed.seq_min.has_value());
  EXPECT_EQ(fixed.inputs[0].low, 0);  // token ids keep their [low, high)
  EXPECT_EQ(fixed.inputs[0].high, 1000);
  const JobSpec range = parse_job_spec(seq_job("\nseq = [512, 4096]"), "job.toml", "");
  EXPECT_EQ(range.seq_len, 4096);
  EXPECT_EQ(range.seq_min, 512);
  // The child trial gets the length with the job.
  const JobSpec sent = job_spec_from_json(nlohmann::json::parse(json_text(to_json(range))));
  EXPECT_EQ(sent.seq_len, 4096);
  EXPECT_EQ(sent.seq_min, 512);
  EXPECT_EQ(sent.inputs[1].shape, (std::vector<int64_t>{kBatchDim, kSeqDim}));
  const JobSpec none = job_spec_from_json(nlohmann::json::parse(json_text(to_json(parse_job_spec(kGood, "j", "")))));
  EXPECT_FALSE(none.seq_len.has_value());
  // --seq replaces the length, a range by one length.
  JobSpec overridden = range;
  JobOverrides seq;
  seq.seq_len = 1024;
  apply_overrides(overridden, seq);
  EXPECT_EQ(overridden.seq_len, 1024);
  EXPECT_FALSE(overridden.seq_min.has_value());
  JobSpec plain = parse_job_spec(kGood, "job.toml", "");
  EXPECT_THROW(apply_overrides(plain, seq), InputError);  // no input names "seq"
  seq.seq_len = 0;
  EXPECT_THROW(apply_overrides(overridden, seq), InputError);
  seq.seq_len = kMaxSeqLen + 1;
  EXPECT_THROW(apply_overrides(overridden, seq), InputError);
}

TEST(JobSpec, EachBadSeqGetsItsExactError) {
  EXPECT_EQ(error_of(replace(
                seq_job("\nseq = 64"),
                "shape = [\"batch\", \"seq\"]\ndtype = \"int64\"\nrange = [0, 1000]\n\n[[inputs]]\nname = \"targets\"",
                "shape = [\"batch\", \"seq\", \"seq\"]\ndtype = \"int64\"\nrange = [0, 1000]\n\n[[inputs]]\nname = "
                "\"targets\"")),
            "job.toml:9:26: inputs[0].shape: at most one dimension may be \"seq\" (one sequence length per input), got "
            "a second");
  EXPECT_EQ(error_of(seq_job("")),
            "job.toml:8:9: inputs[0].shape: names \"seq\" but the job gives no length: add seq = N (tokens) or seq = "
            "[min, max]");
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 32\nseq = 64")),
            "job.toml:3:7: seq: no input names \"seq\" in its shape (e.g. shape = [\"batch\", \"seq\"]), so no length "
            "to set");
  EXPECT_EQ(error_of(seq_job("\nseq = [4096, 512]")),
            "job.toml:3:7: seq: [min, max] needs min <= max, got [4096, 512]");
  EXPECT_EQ(error_of(seq_job("\nseq = [0, 512]")), "job.toml:3:8: seq: must be in [1, 16777216] tokens, got 0");
  EXPECT_EQ(error_of(seq_job("\nseq = 0")), "job.toml:3:7: seq: must be in [1, 16777216] tokens, got 0");
  EXPECT_EQ(error_of(seq_job("\nseq = 20000000")), "job.toml:3:7: seq: must be in [1, 16777216] tokens, got 20000000");
  EXPECT_EQ(error_of(seq_job("\nseq = [1, 2, 3]")), "job.toml:3:7: seq: expected [min, max], got 3 values");
  EXPECT_EQ(error_of(seq_job("\nseq = \"long\"")),
            "job.toml:3:7: seq: expected a whole number of tokens, [min, max] or { min = ..., max = ... }");
}

// Variable lengths (issue #47 item 2): a table draws each step's length;
// the step must hold the longest, so seq_len is its max.
TEST(JobSpec, ASeqDistributionSpansItsLengths) {
  const JobSpec uniform =
      parse_job_spec(seq_job("\nseq = { min = 256, max = 1024, distribution = \"uniform\" }"), "job.toml", "");
  ASSERT_TRUE(uniform.seq_lengths.has_value());
  EXPECT_EQ(uniform.seq_lengths->kind, LengthDistribution::Kind::kUniform);
  EXPECT_EQ(uniform.seq_len, 1024);
  EXPECT_EQ(uniform.seq_min, 256);
  // "uniform" is the default distribution.
  EXPECT_EQ(parse_job_spec(seq_job("\nseq = { min = 8, max = 9 }"), "job.toml", "").seq_lengths->max, 9);
  const JobSpec sent = job_spec_from_json(nlohmann::json::parse(json_text(to_json(uniform))));
  ASSERT_TRUE(sent.seq_lengths.has_value());
  EXPECT_EQ(draw_lengths(*sent.seq_lengths, 16, 5), draw_lengths(*uniform.seq_lengths, 16, 5));

  // A histogram file beside the job, named relative to it.
  const std::string folder = ::testing::TempDir() + "oomtune_seq_hist_" + std::to_string(::getpid());
  std::filesystem::create_directories(folder);
  std::ofstream(folder + "/lengths.txt") << "# tokens per sample\n300\n700\n512\n";
  const JobSpec histogram = parse_job_spec(seq_job("\nseq = { distribution = \"histogram\", file = \"lengths.txt\" }"),
                                           folder + "/job.toml", folder);
  ASSERT_TRUE(histogram.seq_lengths.has_value());
  EXPECT_EQ(histogram.seq_lengths->observed, (std::vector<int64_t>{300, 700, 512}));
  EXPECT_EQ(histogram.seq_min, 300);
  EXPECT_EQ(histogram.seq_len, 700);
  EXPECT_EQ(histogram.seq_lengths_file, folder + "/lengths.txt");
  // The child reads the file again: the same lengths, the same draws.
  const JobSpec received = job_spec_from_json(nlohmann::json::parse(json_text(to_json(histogram))));
  ASSERT_TRUE(received.seq_lengths.has_value());
  EXPECT_EQ(received.seq_lengths->observed, histogram.seq_lengths->observed);
  EXPECT_EQ(received.seq_len, 700);

  // --seq fixes the length: no distribution is left.
  JobSpec overridden = histogram;
  JobOverrides seq;
  seq.seq_len = 600;
  apply_overrides(overridden, seq);
  EXPECT_FALSE(overridden.seq_lengths.has_value());
  EXPECT_EQ(overridden.seq_lengths_file, "");

  // A file with a bad line or no lengths is the file's error.
  std::ofstream(folder + "/lengths.txt") << "300\nlong\n";
  try {
    parse_job_spec(seq_job("\nseq = { distribution = \"histogram\", file = \"lengths.txt\" }"), "job.toml", folder);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), folder + "/lengths.txt:2: not a positive integer: 'long'");
  }
  std::ofstream(folder + "/lengths.txt") << "300\n20000000\n";
  try {
    parse_job_spec(seq_job("\nseq = { distribution = \"histogram\", file = \"lengths.txt\" }"), "job.toml", folder);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()), folder +
                                         "/lengths.txt: holds length 20000000, above the longest a job may ask "
                                         "for (16777216 tokens)");
  }
  std::filesystem::remove_all(folder);
}

TEST(JobSpec, EachBadSeqDistributionGetsItsExactError) {
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 1, max = 2, distributon = \"uniform\" }")),
            "job.toml:3:27: seq.distributon: unknown key (did you mean 'distribution'?; valid: min, max, distribution, "
            "file)");
  EXPECT_EQ(
      error_of(seq_job("\nseq = { min = 1, max = 2, distribution = \"normal\" }")),
      "job.toml:3:42: seq.distribution: unknown value 'normal' (did you mean 'uniform'?; valid: uniform, histogram)");
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 256 }")),
            "job.toml:3:7: seq.max: missing: a uniform distribution needs min and max (tokens), e.g. { min = 256, "
            "max = 1024 }");
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 1024, max = 256 }")),
            "job.toml:3:15: seq.min: needs min <= max, got min = 1024, max = 256");
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 0, max = 256 }")),
            "job.toml:3:15: seq.min: must be in [1, 16777216] tokens, got 0");
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 1, max = 2.5 }")),
            "job.toml:3:24: seq.max: expected a whole number of tokens");
  EXPECT_EQ(error_of(seq_job("\nseq = { min = 1, max = 2, file = \"l.txt\" }")),
            "job.toml:3:34: seq.file: a uniform distribution reads no file; use distribution = \"histogram\"");
  EXPECT_EQ(error_of(seq_job("\nseq = { distribution = \"histogram\" }")),
            "job.toml:3:7: seq.file: missing: a histogram reads its lengths from a file of one integer per line");
  EXPECT_EQ(error_of(seq_job("\nseq = { distribution = \"histogram\", file = \"l.txt\", max = 9 }")),
            "job.toml:3:59: seq.max: a histogram's lengths come from its file; leave out min and max (or trim the "
            "file)");
}

// The trial child gets the job as JSON: a job in a folder whose name is not
// UTF-8 (a Latin-1 "mémoire") must reach it byte for byte, or the child
// cannot open the model.
TEST(JobSpec, JsonCarriesPathsByteForByte) {
  JobSpec job = parse_job_spec(kGood, "/data/m\xE9moire/job.toml", "/data/m\xE9moire");
  ASSERT_EQ(job.model_path, "/data/m\xE9moire/models/gpt.pt");
  const nlohmann::json sent = nlohmann::json::parse(json_text(to_json(job)));
  EXPECT_TRUE(sent.at("model_path").is_array());  // not a string: it is not UTF-8
  const JobSpec received = job_spec_from_json(sent);
  EXPECT_EQ(received.model_path, job.model_path);
  EXPECT_EQ(received.cuda_target, job.cuda_target);
  EXPECT_EQ(received.spec_path, job.spec_path);
  // UTF-8 paths stay strings.
  job.model_path = "/data/m\xC3\xA9moire/gpt.pt";
  EXPECT_EQ(to_json(job).at("model_path"), "/data/m\xC3\xA9moire/gpt.pt");
}

TEST(JobSpec, TheOptimizerImplementationIsReadAndCarried) {
  for (const OptimizerImplementation implementation :
       {OptimizerImplementation::kForeach, OptimizerImplementation::kFused, OptimizerImplementation::kSingleTensor}) {
    const std::string name = to_string(implementation);
    const JobSpec job =
        parse_job_spec(replace(kGood, "lr = 3e-4", "lr = 3e-4\nimplementation = \"" + name + "\""), "job.toml", "");
    EXPECT_EQ(job.optimizer.implementation, implementation) << name;
    EXPECT_EQ(job_spec_from_json(to_json(job)).optimizer.implementation, implementation) << name;
  }
  nlohmann::json sent = to_json(parse_job_spec(kGood, "job.toml", ""));
  sent["optimizer"]["implementation"] = "vectorized";
  try {
    job_spec_from_json(sent);
    ADD_FAILURE() << "an unknown implementation in a job record was accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "job record: unknown optimizer implementation 'vectorized'");
  }
}

TEST(JobSpec, TheDeviceIsWrittenByItsName) {
  for (const Device device : {Device::kCpu, Device::kCuda, Device::kMeta})
    EXPECT_EQ(device_from_name(device_name(device)), device) << device_name(device);
  EXPECT_EQ(device_name(Device::kCuda), "cuda");
  EXPECT_EQ(device_from_name("CUDA"), std::nullopt);
  const JobSpec cuda =
      parse_job_spec(replace(kGood, "global_batch = 32", "global_batch = 32\ndevice = \"cuda\""), "job.toml", "");
  EXPECT_EQ(cuda.device, Device::kCuda);
  nlohmann::json sent = to_json(cuda);
  EXPECT_EQ(sent.at("device"), "cuda");
  EXPECT_EQ(job_spec_from_json(sent).device, Device::kCuda);
  sent["device"] = "gpu";
  try {
    job_spec_from_json(sent);
    ADD_FAILURE() << "an unknown device in a job record was accepted";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(), "job record: unknown device 'gpu'");
  }
  EXPECT_EQ(error_of(replace(kGood, "global_batch = 32", "global_batch = 32\ndevice = \"gpu\"")),
            "job.toml:3:10: device: unknown value 'gpu' (did you mean 'cpu'?; valid: cpu, cuda, meta)");
  EXPECT_EQ(parse_job_spec(replace(kGood, "global_batch = 32", "global_batch = 32\ndevice = \"meta\""), "job.toml", "")
                .device,
            Device::kMeta);
}

}  // namespace
}  // namespace oomtune
