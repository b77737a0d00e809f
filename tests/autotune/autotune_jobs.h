#pragma once
// The jobs of the autotune acceptance tests and the folder each test writes
// them to: the small GPTs of the autotune_models fixture and the example
// ResNet-50 on 32x32 images (tests/autotune/CMakeLists.txt).

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "support/run_oomtune.h"

namespace oomtune::testing {

namespace fs = std::filesystem;

/// The folder of the running test: "oomtune_autotune_<pid>_<test>" in the
/// temporary directory ('/' of a parameterized test's name as '_').
inline fs::path test_dir_path() {
  std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::replace(name.begin(), name.end(), '/', '_');
  return fs::temp_directory_path() / ("oomtune_autotune_" + std::to_string(getpid()) + "_" + name);
}

// A fresh folder per test (ctest runs the tests of this file in parallel),
// removed when the test passes; kept when it fails, or always when
// OOMTUNE_KEEP_TEST_FILES is set, with each command's stdout in it.
class TestDir {
 public:
  TestDir() : path_(test_dir_path()) {
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TestDir() {
    if (!::testing::Test::HasFailure() && !std::getenv("OOMTUNE_KEEP_TEST_FILES")) fs::remove_all(path_);
  }
  TestDir(const TestDir&) = delete;
  TestDir& operator=(const TestDir&) = delete;
  operator const fs::path&() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

inline std::string model(const std::string& name) { return std::string(kAutotuneModels) + "/" + name + "/gpt.pt"; }
inline std::string resnet50() { return std::string(OOMTUNE_EXAMPLES_DIR) + "/models/resnet50.pt"; }
inline bool exists(const std::string& path) { return fs::exists(path); }

/// The GPT models of the autotune_models fixture (tests/autotune/CMakeLists.txt),
/// or another next-token model at `file`.
struct Gpt {
  std::string name;
  int64_t seq = 0;
  int64_t vocab = 0;
  std::string file;  // empty: model(name)
};
inline const Gpt kSmall{"gpt_small", 32, 512, ""};  // 167,680 parameters; activations dominate
inline const Gpt kWide{"gpt_wide", 16, 8192, ""};   // 2,496,000 parameters; AdamW state dominates

/// A next-token GPT job. `extra` lines go at the top level (budget, bounds).
inline std::string gpt_job(const fs::path& dir, const Gpt& gpt, int64_t global_batch, const std::string& extra,
                           const std::string& optimizer = "kind = \"adamw\"\nlr = 3e-4") {
  const std::string tokens = "shape = [\"batch\", " + std::to_string(gpt.seq) + "]\ndtype = \"int64\"\nrange = [0, " +
                             std::to_string(gpt.vocab) + "]\n";
  const fs::path path = dir / (gpt.name + ".toml");
  std::ofstream(path) << "model = \"" << (gpt.file.empty() ? model(gpt.name) : gpt.file)
                      << "\"\nglobal_batch = " << global_batch
                      << "\ndevice = \"cpu\"\nverify_steps = 3\ntrial_timeout = 120\n"
                      << extra << "\n\n[[inputs]]\nname = \"input_ids\"\n"
                      << tokens << "\n[[inputs]]\nname = \"targets\"\n"
                      << tokens << "\n[loss]\nkind = \"cross_entropy\"\ntarget = \"targets\"\n\n[optimizer]\n"
                      << optimizer << "\n";
  return path.string();
}

/// ResNet-50 (examples/export_models.py) on 32x32 images, SGD with momentum
/// as in examples/resnet50.toml: a step takes well under a second. SGD runs
/// single_tensor (foreach=False): the budgets of these searches were set
/// for one decayed gradient at a time in the optimizer step; foreach, the
/// default, holds all of them at once (+97.5 MiB, 4 bytes per parameter;
/// strategies/eager_sgd.h), which moves every node's optimizer phase by the
/// same amount and leaves what the searches test unchanged.
inline std::string resnet50_job(const fs::path& dir, int64_t global_batch, const std::string& extra) {
  const fs::path path = dir / "resnet50.toml";
  std::ofstream(path) << "model = \"" << resnet50() << "\"\nglobal_batch = " << global_batch
                      << "\ndevice = \"cpu\"\nverify_steps = 3\ntrial_timeout = 120\n"
                      << extra << R"(

[[inputs]]
name = "images"
shape = ["batch", 3, 32, 32]

[[inputs]]
name = "labels"
shape = ["batch"]
dtype = "int64"
range = [0, 1000]

[loss]
kind = "cross_entropy"
target = "labels"

[optimizer]
kind = "sgd"
lr = 0.1
momentum = 0.9
weight_decay = 1e-4
implementation = "single_tensor"
)";
  return path.string();
}

/// Whether bf16 autocast runs at this process's kernel level: a level
/// capped by DNNL_MAX_CPU_ISA below AVX-512 cannot (oneDNN: "could not
/// create a primitive descriptor iterator") where libtorch routes bf16 to
/// oneDNN. Asked once per process, with a probe of the small GPT.
inline bool bf16_runs_here() {
  static const bool runs = [] {
    const fs::path dir = fs::temp_directory_path() / ("oomtune_bf16_check_" + std::to_string(getpid()));
    fs::create_directories(dir);
    const RunResult r = run_oomtune("probe " + gpt_job(dir, kSmall, 1, "") + " --config precision=bf16 --no-fit");
    fs::remove_all(dir);
    return r.exit_code == 0;
  }();
  return runs;
}

}  // namespace oomtune::testing
