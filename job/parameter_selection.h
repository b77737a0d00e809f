#pragma once
// Which of a model's parameters train: the job's `trainable` or `frozen`
// globs over the parameter names as the TorchScript module lists them
// (torch::jit::Module::named_parameters, the names
// `torch.jit.load(f).named_parameters()` prints: "blocks.0.attn.qkv.weight",
// or for a PEFT model traced whole
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight").
//
// Rules (issue #47 item 3):
// - Frozen parameters get no gradient and no optimizer state. The session
//   turns their requires_grad off when it loads the model
//   (session/model_session.cpp), and everything that counts gradients and
//   optimizer state counts the trainable parameters the session lists
//   (ModelSession::parameters): the optimizers, 8-bit AdamW, offload and
//   master weights, the static split of a probe, the ZeRO/FSDP table.
// - A glob that matches no parameter is an error that lists the nearest
//   names: a misspelt glob would otherwise train everything, or nothing.
// - frozen_dtype = "bf16" stores the frozen parameters in bfloat16 (2 bytes
//   an element instead of 4); only under bf16 autocast or bf16 parameters,
//   where every operator that reads a weight casts it (in fp32 a bf16 weight
//   meets fp32 activations and the matmul refuses the mix).
// No libtorch here.

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace oomtune {

/// The job's choice of trainable parameters.
struct ParameterSelection {
  enum class Rule {
    kAll,        ///< every parameter trains (neither key is given)
    kTrainable,  ///< only the parameters a glob names train (`trainable = [...]`)
    kFrozen,     ///< every parameter trains but those a glob names (`frozen = [...]`)
  };
  Rule rule = Rule::kAll;
  std::vector<std::string> globs;  // non-empty unless rule is kAll
  bool frozen_bf16 = false;        // frozen_dtype = "bf16": frozen parameters stored as bfloat16

  /// Whether any parameter may be frozen (a rule other than kAll).
  bool freezes() const { return rule != Rule::kAll; }
  bool operator==(const ParameterSelection& other) const;
  bool operator!=(const ParameterSelection& other) const { return !(*this == other); }
};

/// "trainable", "frozen" (the job-spec key of the rule), "" for kAll.
std::string key_of(ParameterSelection::Rule rule);

/// Whether `name` matches `glob` as a whole (fnmatch without character
/// classes): `*` stands for any run of characters, dots included
/// ("*.lora_A.*" matches "model.layers.0.q_proj.lora_A.default.weight"),
/// `?` for one character; everything else stands for itself, case
/// sensitive.
bool glob_matches(std::string_view glob, std::string_view name);

/// The `count` names nearest to `glob`, nearest first (ties in the order of
/// `names`), by edit distance where `*` and `?` match as in glob_matches at
/// no cost, and a missing leading or trailing `*` costs one edit:
/// "*.lora_a.*" is one edit from "...lora_A.default.weight", "lm_head.*"
/// one from "base_model.model.lm_head.weight".
std::vector<std::string> nearest_names(std::string_view glob, const std::vector<std::string>& names, std::size_t count);

/// For each of `names` (a model's parameter names), whether `selection`
/// freezes it: under kTrainable those no glob matches, under kFrozen those a
/// glob matches, under kAll none. Throws SpecError "WHERE: trainable glob
/// 'G' matches no parameter of MODEL (nearest: a, b, c)" for a glob that
/// matches no name.
std::vector<bool> frozen_names(const ParameterSelection& selection, const std::vector<std::string>& names,
                               const std::string& where, const std::string& model);

}  // namespace oomtune
