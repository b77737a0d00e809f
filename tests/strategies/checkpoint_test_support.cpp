#include "checkpoint_test_support.h"

#include <unistd.h>

#include "common/remove_tree.h"
#include "support/run_oomtune.h"

namespace oomtune::testing {

std::string example_model(const std::string& name) { return std::string(OOMTUNE_EXAMPLES_DIR) + "/models/" + name; }

std::string test_model(const std::string& name) {
  struct ModelDir {
    std::string path;    // empty when the export failed
    std::string output;  // the script's stdout and stderr
    ~ModelDir() {
      if (!path.empty()) remove_tree(path);
    }
  };
  static const ModelDir dir = [] {
    const std::string out = ::testing::TempDir() + "oomtune_ckpt_models_" + std::to_string(::getpid());
    const RunResult r = run_program(
        std::string("'") + OOMTUNE_PYTHON + "'",
        std::string("'") + OOMTUNE_SOURCE_DIR + "/tests/strategies/make_checkpoint_models.py' '" + out + "'");
    return ModelDir{r.exit_code == 0 ? out : std::string(), r.out + r.err};
  }();
  if (dir.path.empty()) {
    ADD_FAILURE() << "make_checkpoint_models.py failed under " << OOMTUNE_PYTHON << ":\n" << dir.output;
    return std::string();
  }
  return dir.path + "/" + name;
}

Gradients gradients(const torch::jit::Module& module) {
  Gradients grads;
  for (const auto& parameter : module.named_parameters(/*recurse=*/true)) {
    grads[parameter.name] = parameter.value.grad().defined() ? parameter.value.grad().clone() : at::Tensor();
  }
  return grads;
}

void zero_grads(torch::jit::Module& module) {
  for (const auto& parameter : module.parameters(/*recurse=*/true)) parameter.mutable_grad() = at::Tensor();
}

std::vector<c10::IValue> gpt_input(int64_t batch) { return {at::randint(0, kGptVocab, {batch, kGptSeq})}; }

}  // namespace oomtune::testing
