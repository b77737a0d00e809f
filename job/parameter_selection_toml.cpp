#include "job/parameter_selection_toml.h"

#include <string>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "common/closest_name.h"

namespace oomtune {

const char* const kParameterSelectionKeys[3] = {"trainable", "frozen", "frozen_dtype"};

ParameterSelection read_parameter_selection(const TomlTable& table) {
  ParameterSelection selection;
  for (const char* key : {"trainable", "frozen"}) {
    const toml::node* node = table.get(key);
    if (!node) continue;
    if (selection.freezes())
      table.fail(key, fmt::format("give either trainable or frozen, not both ({} is set too)", key_of(selection.rule)));
    const toml::array* array = node->as_array();
    if (!array || array->empty())
      table.fail(key,
                 "expected a non-empty array of globs over parameter names, such as [\"*.lora_A.*\", \"lm_head.*\"]");
    for (const toml::node& glob : *array) {
      if (!glob.is_string() || glob.value<std::string>()->empty())
        table.fail_at(glob.source(), key, "each glob is a non-empty string, such as \"transformer.h.0.*\"");
      selection.globs.push_back(*glob.value<std::string>());
    }
    selection.rule =
        std::string(key) == "trainable" ? ParameterSelection::Rule::kTrainable : ParameterSelection::Rule::kFrozen;
  }
  const std::optional<std::string> dtype = table.string("frozen_dtype");
  if (!dtype) return selection;
  if (*dtype != "fp32" && *dtype != "bf16")
    table.fail("frozen_dtype", fmt::format("unknown value '{}' ({})", *dtype, suggest(*dtype, {"fp32", "bf16"})));
  if (!selection.freezes()) table.fail("frozen_dtype", "freezes nothing: give trainable = [...] or frozen = [...] too");
  selection.frozen_bf16 = *dtype == "bf16";
  return selection;
}

}  // namespace oomtune
