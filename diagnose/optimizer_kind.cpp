#include "diagnose/optimizer_kind.h"

#include <algorithm>
#include <iterator>

namespace oomtune::diagnose {
namespace {

struct OptimizerFile {
  std::string_view path;  // inside the torch package
  OptimizerKind kind;
};

// torch 2.11, torch/optim/ (see optimizer_kind.h).
constexpr OptimizerFile kOptimizers[] = {
    // AdamW is a subclass of Adam in recent torch (2.11's adamw.py holds its
    // __init__ only): its steps run in adam.py, which then names either.
    {"optim/adam.py",
     {"Adam/AdamW", 2, "exp_avg and exp_avg_sq", "max_exp_avg_sq too with amsgrad=True",
      "bitsandbytes.optim.Adam8bit or AdamW8bit", 1, 2, true, false}},
    // Older torch: AdamW's own step and arithmetic.
    {"optim/adamw.py",
     {"AdamW", 2, "exp_avg and exp_avg_sq", "max_exp_avg_sq too with amsgrad=True", "bitsandbytes.optim.AdamW8bit", 1,
      2, true, false}},
    {"optim/nadam.py", {"NAdam", 2, "exp_avg and exp_avg_sq", "", "", 1, 2, false, false}},
    {"optim/radam.py", {"RAdam", 2, "exp_avg and exp_avg_sq", "", "", 1, 2, false, false}},
    {"optim/adamax.py", {"Adamax", 2, "exp_avg and exp_inf", "", "", 1, 1, false, false}},
    {"optim/adadelta.py", {"Adadelta", 2, "square_avg and acc_delta", "", "", 2, 2, false, false}},
    {"optim/rprop.py", {"Rprop", 2, "prev and step_size", "", "", -1, 3, false, false}},
    {"optim/sparse_adam.py", {"SparseAdam", 2, "exp_avg and exp_avg_sq", "", "", -1, -1, false, false}},
    {"optim/rmsprop.py",
     {"RMSprop", 1, "square_avg", "momentum_buffer too with momentum > 0, grad_avg with centered=True",
      "bitsandbytes.optim.RMSprop8bit", 1, 1, false, false}},
    {"optim/sgd.py",
     {"SGD", 1, "momentum_buffer", "only with momentum > 0", "bitsandbytes.optim.SGD8bit", 0, 0, true, true}},
    {"optim/asgd.py", {"ASGD", 1, "ax", "", "", 1, 0, false, false}},
    {"optim/_muon.py", {"Muon", 1, "momentum_buffer", "", "", -1, -1, false, false}},
    {"optim/adagrad.py",
     {"Adagrad", 0, "sum", "made when the optimizer is built", "bitsandbytes.optim.Adagrad8bit", 2, 1, false, false}},
    {"optim/_adafactor.py",
     {"Adafactor", 0, "row_var and col_var, or variance", "factored: a row and a column vector per matrix", "", -1, -1,
      false, false}},
    {"optim/lbfgs.py", {"LBFGS", 0, "a history of history_size steps", "", "", -1, -1, false, false}},
};

}  // namespace

const char* implementation_name(OptimizerImplementation implementation) {
  switch (implementation) {
    case OptimizerImplementation::kForeach:
      return "foreach";
    case OptimizerImplementation::kSingleTensor:
      return "single_tensor";
    case OptimizerImplementation::kFused:
      return "fused";
    case OptimizerImplementation::kUnknown:
      break;
  }
  return "unknown";
}

std::string count_word(int count) {
  static constexpr const char* kWords[] = {"no", "one", "two", "three"};
  return count >= 0 && count <= 3 ? kWords[count] : std::to_string(count);
}

std::string count_states(int states) { return count_word(states) + (states == 1 ? " state" : " states"); }

constexpr OptimizerKind kBitsAndBytes = {
    "bitsandbytes' optimizer", 0, "8-bit or 32-bit states, by its class", "", "", -1, -1, false, false};

const OptimizerKind* library_optimizer(std::string_view path) {
  constexpr std::string_view kDir = "bitsandbytes/optim/";
  return path.substr(0, kDir.size()) == kDir ? &kBitsAndBytes : nullptr;
}

const OptimizerKind* optimizer_of_class(std::string_view name) {
  if (name.empty()) return nullptr;
  if (name.find("8bit") != std::string_view::npos || name.substr(0, 5) == "Paged") return &kBitsAndBytes;
  if (name == "Adam") return torch_optimizer("optim/adam.py");
  for (const OptimizerFile& f : kOptimizers) {
    if (f.kind.name == name) return &f.kind;
  }
  return nullptr;
}

bool is_torch_optim(const OptimizerKind& kind) {
  // By address: equality is defined between any two objects, order only inside one array.
  return std::any_of(std::begin(kOptimizers), std::end(kOptimizers),
                     [&](const OptimizerFile& f) { return &f.kind == &kind; });
}

const OptimizerKind* torch_optimizer(std::string_view path) {
  for (const OptimizerFile& f : kOptimizers) {
    if (f.path == path) return &f.kind;
  }
  return nullptr;
}

}  // namespace oomtune::diagnose
