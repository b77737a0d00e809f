#include "recipes/recipes.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/atomic_file.h"
#include "common/closest_name.h"
#include "common/error.h"
#include "recipes/plan_toml.h"

namespace oomtune {
namespace {

constexpr const char* kAllFormats = "all";
constexpr const char* kDeepSpeedFile = "ds_config.json";

std::vector<std::string> no_notes(const Plan&) { return {}; }

/// A writer needs ds_config.json when its notes send the reader there, as
/// HF's `deepspeed` key does under offload; the notes are the one place
/// that says so.
template <std::vector<std::string> (*Notes)(const Plan&)>
std::vector<std::string> needs_deepspeed_file_if_noted(const Plan& plan) {
  for (const auto& note : Notes(plan))
    if (note.find(kDeepSpeedFile) != std::string::npos) return {"deepspeed"};
  return {};
}

std::vector<std::string> needs_nothing(const Plan&) { return {}; }

std::vector<std::string> format_names() {
  std::vector<std::string> names = {kAllFormats};
  for (const auto& writer : recipe_writers()) names.emplace_back(writer.name);
  return names;
}

}  // namespace

const std::vector<RecipeWriter>& recipe_writers() {
  static const std::vector<RecipeWriter> kWriters = {
      {"plan", kPlanFileName, "the plan itself, for `oomtune probe --plan` and `oomtune emit`", write_plan_toml,
       no_notes, needs_nothing},
      {"deepspeed", kDeepSpeedFile, "DeepSpeed config JSON (deepspeed.initialize(config=...))", write_deepspeed_config,
       deepspeed_notes, needs_nothing},
      {"hf", "hf_training_args.json", "Hugging Face TrainingArguments keyword arguments", write_hf_training_args,
       hf_notes, needs_deepspeed_file_if_noted<hf_notes>},
      {"lightning", "lightning_trainer.json", "PyTorch Lightning Trainer kwargs, DataModule batch size, optimizer",
       write_lightning_trainer, lightning_notes, needs_deepspeed_file_if_noted<lightning_notes>},
      {"accelerate", "accelerate_config.yaml", "Hugging Face Accelerate config (accelerate launch --config_file)",
       write_accelerate_config, accelerate_notes, needs_deepspeed_file_if_noted<accelerate_notes>},
  };
  return kWriters;
}

const RecipeWriter& find_recipe_writer(const std::string& name) {
  for (const auto& writer : recipe_writers())
    if (name == writer.name) return writer;
  throw InputError(fmt::format("unknown format '{}' ({})", name, suggest(name, format_names())));
}

std::vector<const RecipeWriter*> select_recipe_writers(const std::vector<std::string>& formats, const Plan& plan) {
  if (formats.empty()) throw InputError(fmt::format("no format chosen (valid: {})", fmt::join(format_names(), ", ")));
  std::vector<std::string> wanted;
  for (const auto& name : formats) {
    if (name == kAllFormats) {
      for (const auto& writer : recipe_writers()) wanted.emplace_back(writer.name);
    } else {
      wanted.push_back(find_recipe_writer(name).name);
    }
  }
  // Close over needs() (one level is enough: the DeepSpeed writer needs nothing).
  const std::vector<std::string> chosen = wanted;
  for (const auto& name : chosen)
    for (const auto& needed : find_recipe_writer(name).needs(plan)) wanted.push_back(needed);
  std::vector<const RecipeWriter*> selected;
  for (const auto& writer : recipe_writers())
    if (std::find(wanted.begin(), wanted.end(), writer.name) != wanted.end()) selected.push_back(&writer);
  return selected;
}

void require_emit_folder(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::path existing = fs::absolute(dir, error);
  while (!fs::exists(existing, error) && existing.has_parent_path() && existing != existing.parent_path())
    existing = existing.parent_path();
  if (!fs::is_directory(existing, error)) {
    throw OutputError(fmt::format("{}: cannot write into it: {} is not a folder", dir, existing.string()));
  }
  if (::access(existing.c_str(), W_OK | X_OK) != 0) {
    throw OutputError(fmt::format("{}: cannot write into it: {}: {}", dir, existing.string(), std::strerror(errno)));
  }
  for (const RecipeWriter& writer : recipe_writers()) {
    const fs::path file = fs::path(dir) / writer.file_name;
    if (fs::is_directory(file, error))
      throw OutputError(fmt::format("{}: cannot write it: a folder has that name", file.string()));
  }
}

std::vector<EmittedFile> emit_all(const Plan& plan, const std::string& dir, const std::vector<std::string>& formats) {
  // Validate and render everything before touching the disk.
  validate_plan(plan);
  const std::vector<const RecipeWriter*> writers = select_recipe_writers(formats, plan);
  struct Rendered {
    const RecipeWriter* writer;
    std::string path;
    std::string contents;
  };
  std::vector<Rendered> rendered;
  for (const RecipeWriter* writer : writers)
    rendered.push_back({writer, (std::filesystem::path(dir) / writer->file_name).string(), writer->write(plan)});

  // Nothing is written unless every file can be: no folder left half old, half new.
  require_emit_folder(dir);
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw OutputError(fmt::format("{}: cannot create the output folder: {}", dir, error.message()));
  if (!std::filesystem::is_directory(dir, error))
    throw OutputError(fmt::format("{}: cannot write into it: not a folder", dir));

  std::vector<EmittedFile> emitted;
  for (const Rendered& file : rendered) {
    write_file_atomically(file.path, file.contents);
    emitted.push_back({file.writer->name, file.path, file.writer->notes(plan)});
  }
  return emitted;
}

}  // namespace oomtune
