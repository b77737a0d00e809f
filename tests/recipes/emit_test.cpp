// emit_all() as a library, and `oomtune emit` end to end through a binary:
// the test driver (tests/recipes/emit_driver_commands.cpp: main.cpp with
// only the emit row) always, and the real oomtune binary once its command
// table has the emit row.

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest.h>

#include "common/atomic_file.h"
#include "common/error.h"
#include "recipes/plan_toml.h"
#include "recipes/recipes.h"
#include "support/build_values.h"
#include "tests/recipes/plan_cases.h"

namespace oomtune {
namespace {

namespace fs = std::filesystem;

std::string read_text(const fs::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::stringstream buffer;
  buffer << file.rdbuf();
  return buffer.str();
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

class TempDir {
 public:
  TempDir() {
    // A parameterized test is named "Name/param": flattened, so that the
    // destructor removes the whole folder, not only a "param" subfolder.
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::replace(name.begin(), name.end(), '/', '_');
    path_ = fs::temp_directory_path() / ("oomtune_emit_test_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

Plan golden(const std::string& name) {
  for (const auto& [case_name, plan] : testing::golden_plans())
    if (case_name == name) return plan;
  throw std::runtime_error("no golden plan " + name);
}

// ------------------------------------------------------------ library

TEST(EmitAll, WritesEveryFileIntoANewFolder) {
  TempDir tmp;
  const Plan plan = golden("ckpt_bf16_accum");
  const fs::path out = tmp.path() / "nested" / "out";
  const auto emitted = emit_all(plan, out.string());
  ASSERT_EQ(emitted.size(), recipe_writers().size());
  for (std::size_t i = 0; i < emitted.size(); ++i) {
    const RecipeWriter& writer = recipe_writers()[i];
    EXPECT_EQ(emitted[i].writer, writer.name);
    EXPECT_EQ(emitted[i].path, (out / writer.file_name).string());
    EXPECT_EQ(emitted[i].notes, writer.notes(plan));
    EXPECT_EQ(read_text(emitted[i].path), writer.write(plan));
  }
  EXPECT_EQ(files_in(out), (std::vector<std::string>{"accelerate_config.yaml", "ds_config.json",
                                                     "hf_training_args.json", "lightning_trainer.json", "plan.toml"}));
}

TEST(EmitAll, ChosenFormatsOnlyPlusWhatTheyReferTo) {
  TempDir tmp;
  emit_all(golden("ckpt_bf16_accum"), (tmp.path() / "a").string(), {"hf", "plan", "hf"});
  EXPECT_EQ(files_in(tmp.path() / "a"), (std::vector<std::string>{"hf_training_args.json", "plan.toml"}));
  // Under offload the HF args name ds_config.json, so it is written too.
  emit_all(golden("offload_bf16"), (tmp.path() / "b").string(), {"hf"});
  EXPECT_EQ(files_in(tmp.path() / "b"), (std::vector<std::string>{"ds_config.json", "hf_training_args.json"}));
  // Accelerate's deepspeed_config_file names it too; Lightning's strategy
  // carries its DeepSpeed config inline.
  emit_all(golden("offload_bf16"), (tmp.path() / "c").string(), {"lightning", "accelerate"});
  EXPECT_EQ(files_in(tmp.path() / "c"),
            (std::vector<std::string>{"accelerate_config.yaml", "ds_config.json", "lightning_trainer.json"}));
  emit_all(golden("sgd_offload_cpu"), (tmp.path() / "d").string(), {"lightning"});
  EXPECT_EQ(files_in(tmp.path() / "d"), (std::vector<std::string>{"lightning_trainer.json"}));
}

TEST(EmitAll, BadInputWritesNothing) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  try {
    emit_all(golden("fp32_adamw"), out.string(), {"deepspeeed"});
    FAIL() << "no error";
  } catch (const InputError& e) {
    EXPECT_STREQ(e.what(),
                 "unknown format 'deepspeeed' (did you mean 'deepspeed'?; valid: all, plan, deepspeed, hf, "
                 "lightning, accelerate)");
  }
  EXPECT_THROW(emit_all(golden("fp32_adamw"), out.string(), {}), InputError);
  Plan broken = golden("fp32_adamw");
  broken.global_batch = 31;
  EXPECT_THROW(emit_all(broken, out.string()), ConfigError);
  broken = golden("fp32_adamw");
  broken.optimizer.lr = -1;
  EXPECT_THROW(emit_all(broken, out.string()), ConfigError);
  EXPECT_FALSE(fs::exists(out));
}

TEST(EmitAll, OutputFolderThatIsAFileIsAnOutputError) {
  TempDir tmp;
  const fs::path file = tmp.path() / "a_file";
  write_file_atomically(file.string(), "x");
  EXPECT_THROW(emit_all(golden("fp32_adamw"), file.string()), OutputError);
  EXPECT_THROW(emit_all(golden("fp32_adamw"), (file / "sub").string()), OutputError);
}

// A folder where one file goes (found by the audit: the folder ended half
// old, half new): nothing is written, the old files stay as they were.
TEST(EmitAll, AFolderInTheWayOfOneFileWritesNothing) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  emit_all(golden("fp32_adamw"), out.string());
  const std::string old_plan = read_text((out / "plan.toml").string());
  fs::remove(out / "lightning_trainer.json");
  fs::create_directories(out / "lightning_trainer.json");
  try {
    emit_all(golden("ckpt_bf16_accum"), out.string());
    FAIL() << "no error";
  } catch (const OutputError& e) {
    EXPECT_NE(std::string(e.what()).find("lightning_trainer.json: cannot write it: a folder has that name"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read_text((out / "plan.toml").string()), old_plan);
  EXPECT_THROW(require_emit_folder(out.string()), OutputError);
  EXPECT_NO_THROW(require_emit_folder((tmp.path() / "not" / "yet").string()));
  EXPECT_FALSE(fs::exists(tmp.path() / "not"));  // the check creates nothing
}

TEST(RecipeWriters, TableIsConsistent) {
  std::vector<std::string> names, files;
  for (const auto& writer : recipe_writers()) {
    names.emplace_back(writer.name);
    files.emplace_back(writer.file_name);
    EXPECT_NE(std::string(writer.help), "");
    EXPECT_EQ(&find_recipe_writer(writer.name), &writer);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"plan", "deepspeed", "hf", "lightning", "accelerate"}));
  EXPECT_EQ(files, (std::vector<std::string>{"plan.toml", "ds_config.json", "hf_training_args.json",
                                             "lightning_trainer.json", "accelerate_config.yaml"}));
}

// ------------------------------------------------------------ end to end

struct ProcessResult {
  int code = -1;
  std::string out;
  std::string err;
};

ProcessResult run(const std::string& binary, const std::string& args, const fs::path& scratch) {
  const fs::path out = scratch / "stdout.txt";
  const fs::path err = scratch / "stderr.txt";
  const std::string command = "'" + binary + "' " + args + " > '" + out.string() + "' 2> '" + err.string() + "'";
  const int status = std::system(command.c_str());
  ProcessResult result;
  result.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  result.out = read_text(out);
  result.err = read_text(err);
  fs::remove(out);
  fs::remove(err);
  return result;
}

class EmitCommand : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    binary_ = GetParam() == "driver" ? testing::kEmitDriver : testing::kOomtuneBinary;
    ASSERT_TRUE(fs::exists(binary_)) << binary_ << " is not built";
    if (GetParam() == "oomtune" && run(binary_, "emit --list", fs::temp_directory_path()).code != 0)
      FAIL() << "oomtune emit --list failed: no emit row in src/commands.cpp?";
  }
  std::string binary_;
};

TEST_P(EmitCommand, WritesFilesEqualToTheGoldens) {
  TempDir tmp;
  for (const auto& [name, plan] : testing::golden_plans()) {
    SCOPED_TRACE(name);
    const fs::path out = tmp.path() / name;
    const ProcessResult r =
        run(binary_, "emit '" + (testing::kGoldenDir / name / "plan.toml").string() + "' --out '" + out.string() + "'",
            tmp.path());
    ASSERT_EQ(r.code, 0) << r.err;
    std::string expected_stdout;
    for (const auto& writer : recipe_writers()) {
      expected_stdout += "wrote " + (out / writer.file_name).string() + "\n";
      EXPECT_EQ(read_text(out / writer.file_name), read_text(testing::kGoldenDir / name / writer.file_name))
          << writer.name;
    }
    EXPECT_EQ(r.out, expected_stdout);
  }
}

TEST_P(EmitCommand, FormatSelectsFilesAndNotesGoToStderr) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  const ProcessResult r = run(binary_,
                              "emit '" + (testing::kGoldenDir / "offload_bf16/plan.toml").string() + "' --out '" +
                                  out.string() + "' --format hf",
                              tmp.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(files_in(out), (std::vector<std::string>{"ds_config.json", "hf_training_args.json"}));
  EXPECT_NE(r.err.find("emit: hf: note: optimizer offload is not a TrainingArguments feature"), std::string::npos)
      << r.err;
}

// A note that several files carry (offload measured on the CPU targets a
// GPU: deepspeed, hf, lightning and accelerate all say so) is printed once,
// after the files, naming the writers; each other note once with its own.
TEST_P(EmitCommand, ANoteSeveralFilesCarryIsPrintedOnce) {
  TempDir tmp;
  const fs::path out = tmp.path() / "out";
  const ProcessResult r =
      run(binary_,
          "emit '" + (testing::kGoldenDir / "sgd_offload_cpu/plan.toml").string() + "' --out '" + out.string() + "'",
          tmp.path());
  ASSERT_EQ(r.code, 0) << r.err;
  const std::string offload = "note: optimizer offload runs through DeepSpeed, which trains on a GPU";
  const std::size_t at = r.err.find(offload);
  ASSERT_NE(at, std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(offload, at + 1), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("emit: deepspeed, hf, lightning, accelerate: " + offload), std::string::npos) << r.err;
  // Every line is one note; none repeats.
  std::set<std::string> lines;
  std::istringstream in(r.err);
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.rfind("emit: ", 0), 0u) << line;
    EXPECT_TRUE(lines.insert(line.substr(line.find(": note: "))).second) << line;
  }
  // The files keep their own notes: the offload one in each.
  EXPECT_NE(read_text(out / "hf_training_args.json").find("optimizer offload runs through DeepSpeed"),
            std::string::npos);
  EXPECT_NE(read_text(out / "accelerate_config.yaml").find("optimizer offload runs through DeepSpeed"),
            std::string::npos);
}

TEST_P(EmitCommand, BadPlanIsOneLineExit2AndNothingWritten) {
  TempDir tmp;
  const fs::path bad = tmp.path() / "bad.toml";
  write_file_atomically(bad.string(), "[config]\nmicro_batch = 4\naccumulation_steps = 2\nmicro_bach = 3\n");
  const fs::path out = tmp.path() / "out";
  ProcessResult r = run(binary_, "emit '" + bad.string() + "' --out '" + out.string() + "'", tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.out, "");
  EXPECT_EQ(r.err, "oomtune: " + bad.string() +
                       ":4:1: config.micro_bach: unknown key (did you mean 'micro_batch'?; valid: micro_batch, "
                       "accumulation_steps, checkpoint, optimizer, offload_optimizer, precision)\n");
  EXPECT_FALSE(fs::exists(out));

  r = run(binary_, "emit '" + (tmp.path() / "missing.toml").string() + "' --out '" + out.string() + "'", tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "oomtune: " + (tmp.path() / "missing.toml").string() +
                       ": cannot open the plan file: No such file or directory\n");
  EXPECT_FALSE(fs::exists(out));

  r = run(binary_,
          "emit '" + (testing::kGoldenDir / "fp32_adamw/plan.toml").string() + "' --out '" + out.string() +
              "' --format deepspeed,lightnin",
          tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err,
            "oomtune: unknown format 'lightnin' (did you mean 'lightning'?; valid: all, plan, deepspeed, hf, "
            "lightning, accelerate)\n");
  EXPECT_FALSE(fs::exists(out));

  r = run(binary_, "emit '" + (testing::kGoldenDir / "fp32_adamw/plan.toml").string() + "'", tmp.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_EQ(r.err, "oomtune: emit: missing --out DIR (the folder to write into)\n");
}

TEST_P(EmitCommand, ListPrintsTheWriterTable) {
  TempDir tmp;
  const ProcessResult r = run(binary_, "emit --list", tmp.path());
  ASSERT_EQ(r.code, 0) << r.err;
  for (const auto& writer : recipe_writers()) {
    EXPECT_NE(r.out.find(writer.name), std::string::npos);
    EXPECT_NE(r.out.find(writer.file_name), std::string::npos);
    EXPECT_NE(r.out.find(writer.help), std::string::npos);
  }
  const ProcessResult help = run(binary_, "emit --help", tmp.path());
  EXPECT_EQ(help.code, 0);
  EXPECT_NE(help.out.find("accelerate_config.yaml"), std::string::npos) << help.out;
}

INSTANTIATE_TEST_SUITE_P(recipes, EmitCommand, ::testing::Values("driver", "oomtune"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace oomtune
