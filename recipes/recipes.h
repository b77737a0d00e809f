#pragma once
// The recipes: one writer per training framework, each a pure function from
// a Plan to the text of one file, registered in one table (recipe_writers())
// that drives both `oomtune emit` dispatch and its --help/--list text.
//
// Rules every writer keeps (USERS.md, docs/recipes.md):
// - The global batch is exact: micro-batch and gradient accumulation appear
//   in every file (as a key where the framework has one, else as a comment
//   or note saying where it goes).
// - A setting the framework cannot express is written in its nearest
//   faithful form plus a note saying what is missing; nothing is dropped
//   silently. writer.notes(plan) returns the same notes the file carries.
// - Written for one GPU, as the plan was measured. On N GPUs keep the global
//   batch by dividing the accumulation steps by N.

#include <string>
#include <vector>

#include "recipes/plan.h"

namespace oomtune {

/// One row of the writer table (ninja's kTools[] shape).
struct RecipeWriter {
  const char* name;                        ///< --format value: "plan", "deepspeed", "hf", "lightning", "accelerate"
  const char* file_name;                   ///< file written into the output folder, e.g. "ds_config.json"
  const char* help;                        ///< one line for --help and --list
  std::string (*write)(const Plan& plan);  ///< the file's contents
  std::vector<std::string> (*notes)(const Plan& plan);  ///< what the file could not express
  /// Other writers whose files this one refers to (HF's `deepspeed` key names
  /// ds_config.json); emit writes them too.
  std::vector<std::string> (*needs)(const Plan& plan);
};

/// All writers, in the order `oomtune emit --list` prints them.
const std::vector<RecipeWriter>& recipe_writers();

/// The writer called `name`. Throws InputError "unknown format 'X' (did you
/// mean 'Y'?; valid: all, plan, ...)".
const RecipeWriter& find_recipe_writer(const std::string& name);

/// The writers for a --format selection: "all" means every writer; names
/// may repeat; writers named by a chosen writer's needs() are added. Table
/// order, no duplicates. Throws InputError for an unknown name or an empty
/// selection.
std::vector<const RecipeWriter*> select_recipe_writers(const std::vector<std::string>& formats, const Plan& plan);

/// One file emit_all wrote.
struct EmittedFile {
  std::string writer;              // the writer's name
  std::string path;                // DIR/file_name
  std::vector<std::string> notes;  // the writer's notes for this plan
};

/// Checks, without creating anything, that emit_all could write into `dir`:
/// the nearest folder that exists on its path is writable, `dir` is a
/// folder if it exists, and no file a writer would write there is taken by
/// a folder. Throws OutputError naming the path otherwise. autotune calls it
/// before its search, so that --emit cannot fail only after it.
void require_emit_folder(const std::string& dir);

/// Writes the selected files for `plan` into `dir` (created, with parents,
/// if missing). Everything is validated and rendered in memory first, so a
/// bad plan or format throws (ConfigError / InputError) before any folder or
/// file is made; then each file is written atomically (write_file_atomically).
/// Throws OutputError naming the path when the folder cannot be made or a
/// file cannot be written. `autotune --emit DIR` calls this with {"all"}.
std::vector<EmittedFile> emit_all(const Plan& plan, const std::string& dir,
                                  const std::vector<std::string>& formats = {"all"});

// ---- The writers. Each docstring cites the page its keys come from.

/// DeepSpeed `ds_config.json`. Keys from the DeepSpeed Configuration JSON
/// reference, https://www.deepspeed.ai/docs/config-json/ , checked against
/// deepspeed/runtime/{constants,config,engine}.py and runtime/zero/ (DeepSpeed
/// 0.16.4 and 0.19.6): batch size
/// (train_batch_size = train_micro_batch_size_per_gpu *
/// gradient_accumulation_steps * GPUs, written for one GPU),
/// gradient_clipping (the job's max_grad_norm, 0.0 for none, as measured;
/// the default became 1.0 in DeepSpeed 0.19.3), optimizer
/// (type "AdamW"/"SGD" with torch's params), torch_autocast {enabled, dtype}
/// for bf16 / fp16 autocast (DeepSpeed 0.17.2 and later; fp32 weights),
/// bf16.enabled for bf16_params, zero_optimization.stage (0, or 2 with
/// offload_optimizer {device cpu, pin_memory true} and reduce /
/// allgather_bucket_size sized to the plan's parameters:
/// deepspeed_sections.h), for SGD under offload
/// zero_allow_untested_optimizer true and zero_force_ds_cpu_optimizer false,
/// and activation_checkpointing.
/// Notes go in a top-level "oomtune_notes" array, which DeepSpeed ignores
/// (it reads only the keys it knows).
std::string write_deepspeed_config(const Plan& plan);
/// The notes ds_config.json carries for `plan`: what it could not express, one line each.
std::vector<std::string> deepspeed_notes(const Plan& plan);

/// Hugging Face `TrainingArguments` keyword arguments, as
/// {"training_args": {...}, "notes": [...]}; use
/// TrainingArguments(output_dir=..., **json.load(f)["training_args"]).
/// Keys from https://huggingface.co/docs/transformers/main_classes/trainer#transformers.TrainingArguments
/// (checked against src/transformers/training_args.py, 4.x and 5.x):
/// per_device_train_batch_size, gradient_accumulation_steps,
/// gradient_checkpointing, optim ("adamw_torch", "adamw_bnb_8bit", "sgd"),
/// learning_rate, weight_decay, adam_beta1/2, adam_epsilon, max_grad_norm
/// (the job's, 0 for no clipping, as measured; the Trainer's default is 1.0),
/// lr_scheduler_type ("constant", as measured), bf16, fp16 (false for
/// autocast under DeepSpeed, where ds_config.json's torch_autocast does it)
/// and deepspeed (the path of ds_config.json: the Trainer's only way to
/// offload optimizer state, https://huggingface.co/docs/transformers/deepspeed).
std::string write_hf_training_args(const Plan& plan);
/// The notes hf_training_args.json carries for `plan`: what it could not express, one line each.
std::vector<std::string> hf_notes(const Plan& plan);

/// PyTorch Lightning `Trainer` keyword arguments plus what lives elsewhere, as
/// {"trainer": {...}, "datamodule": {"batch_size": N}, "optimizer": {...},
/// "notes": [...]}. Keys from https://lightning.ai/docs/pytorch/stable/common/trainer.html
/// (checked against src/lightning/pytorch/trainer/trainer.py and
/// strategies/deepspeed.py):
/// accelerator, devices, precision ("32-true", "bf16-mixed", "16-mixed"),
/// accumulate_grad_batches, gradient_clip_val with gradient_clip_algorithm
/// "norm" (the job's clipping; under DeepSpeed the config's
/// gradient_clipping instead), strategy ("auto", or under DeepSpeed
/// {"class": "lightning.pytorch.strategies.DeepSpeedStrategy", "kwargs":
/// {"config": {...}}} for the script to build: no registered name gives
/// ZeRO stage 0, sized buckets or torch_autocast,
/// https://lightning.ai/docs/pytorch/stable/advanced/model_parallel/deepspeed.html).
/// The Trainer has no batch size: the DataModule's DataLoader holds it, and
/// configure_optimizers() builds the optimizer.
std::string write_lightning_trainer(const Plan& plan);
/// The notes lightning_trainer.json carries for `plan`: what it could not express, one line each.
std::vector<std::string> lightning_notes(const Plan& plan);

/// Hugging Face Accelerate config YAML (what `accelerate config` writes, read
/// by `accelerate launch --config_file`). Keys from
/// https://huggingface.co/docs/accelerate/package_reference/cli and
/// https://huggingface.co/docs/accelerate/usage_guides/deepspeed :
/// compute_environment, distributed_type ('NO' or DEEPSPEED), mixed_precision
/// ('no', 'bf16', 'fp16'; none under DeepSpeed), use_cpu, num_machines,
/// num_processes and deepspeed_config {deepspeed_config_file:
/// 'ds_config.json', zero3_init_flag} (the inline keys drop
/// gradient_clipping 0.0 and cannot say the buckets or torch_autocast; the
/// job's clipping without DeepSpeed is a note: the script calls
/// accelerator.clip_grad_norm_),
/// checked against
/// src/accelerate/commands/config/{config_args,cluster}.py and
/// utils/dataclasses.py (DeepSpeedPlugin). Accelerate rejects unknown
/// top-level keys, so notes are YAML comments.
std::string write_accelerate_config(const Plan& plan);
/// The notes accelerate_config.yaml carries for `plan`: what it could not express, one line each.
std::vector<std::string> accelerate_notes(const Plan& plan);

}  // namespace oomtune
