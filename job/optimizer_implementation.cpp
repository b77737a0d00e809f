#include "job/optimizer_implementation.h"

namespace oomtune {

std::string to_string(OptimizerImplementation implementation) {
  switch (implementation) {
    case OptimizerImplementation::kForeach:
      return "foreach";
    case OptimizerImplementation::kFused:
      return "fused";
    case OptimizerImplementation::kSingleTensor:
      return "single_tensor";
  }
  return "foreach";
}

const std::vector<std::string>& optimizer_implementation_names() {
  static const std::vector<std::string> kNames = {"foreach", "fused", "single_tensor"};
  return kNames;
}

std::optional<OptimizerImplementation> optimizer_implementation_from_name(const std::string& name) {
  for (OptimizerImplementation implementation :
       {OptimizerImplementation::kForeach, OptimizerImplementation::kFused, OptimizerImplementation::kSingleTensor})
    if (to_string(implementation) == name) return implementation;
  return std::nullopt;
}

}  // namespace oomtune
