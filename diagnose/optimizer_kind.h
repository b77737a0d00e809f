#pragma once
// Which torch.optim optimizer a snapshot's optimizer step ran, and what its
// first step allocates: diagnose's optimizer verdict, the first-step need
// (Note [Phase need] rule 2) and the 8-bit recommendation said "Adam/AdamW"
// of every optimizer, so an RMSprop step (one state per parameter) was
// judged against two states per parameter. The optimizer is named by the
// file of its torch/optim/ frames (FrameIndex::optimizer).
//
// The table is read from torch 2.11's torch/optim/*.py: the tensors each
// optimizer's `_init_group` (SGD: its arithmetic, `_single_tensor_sgd` and
// `_multi_tensor_sgd`) makes with `zeros_like`/`full_like`/`clone` per
// parameter on its first step, with default options; one-element states
// (`step`, ASGD's `eta` and `mu`, NAdam's `mu_product`) are not counted.
// The 8-bit classes are bitsandbytes' (bitsandbytes/optim/__init__.py:
// Adam8bit, AdamW8bit, Adagrad8bit, RMSprop8bit, SGD8bit, ...); their
// update_step runs optimizer_update_8bit_blockwise on the parameter and
// its 8-bit states in place (bitsandbytes/optim/optimizer.py), with no
// temporaries of the parameters' size.
// The temporaries of each implementation were measured on torch 2.11 by
// scripts/measure_optimizer_temporaries.py (one first step, default
// options, two sets of parameter shapes): the foreach arithmetic holds
// whole-list temporaries (Adam's `_foreach_sqrt` of every exp_avg_sq, one
// parameter list's bytes), the single-tensor one a parameter's (Adam's
// sqrt and quotient of the largest), the fused kernel none.

#include <cstdint>
#include <string>
#include <string_view>

namespace oomtune::diagnose {

/// How torch.optim runs an optimizer's arithmetic: its frames' function
/// names (_multi_tensor_adam, _single_tensor_adam, _fused_adam). PyTorch's
/// default on CUDA is foreach, unless fused=True is asked for
/// (torch/optim/optimizer.py _default_to_fused_or_foreach).
enum class OptimizerImplementation : uint8_t { kUnknown, kForeach, kSingleTensor, kFused };

/// "foreach", "single_tensor", "fused"; "unknown".
const char* implementation_name(OptimizerImplementation implementation);

/// One torch.optim optimizer.
struct OptimizerKind {
  std::string_view name;  ///< the class: "RMSprop", ...; "Adam/AdamW" for adam.py, which runs both
  /// Full-size states its first step allocates per parameter with default
  /// options (each the parameter's bytes); 0 where the first step makes
  /// none of that size (Adagrad makes its `sum` when the optimizer is built;
  /// Adafactor's factored states; LBFGS keeps a history instead).
  int states_per_parameter;
  /// Those states, for a sentence: "exp_avg and exp_avg_sq".
  std::string_view states;
  /// What options change, for a sentence: "max_exp_avg_sq too with
  /// amsgrad=True"; empty when nothing to say.
  std::string_view options;
  /// The bitsandbytes class with the same update and 8-bit states,
  /// "bitsandbytes.optim.RMSprop8bit" ("... Adam8bit or AdamW8bit" for
  /// adam.py); empty where it has none.
  std::string_view eight_bit;
  /// Temporaries the foreach arithmetic holds above the states at its peak,
  /// in the parameters' bytes (Adam: 1, the square root of every
  /// exp_avg_sq); -1 where not modelled (Rprop's depend on the data).
  int foreach_temporaries;
  /// The same for foreach=False, in the largest parameter's bytes (Adam:
  /// 2, its sqrt and quotient); -1 where not modelled.
  int single_tensor_temporaries;
  /// fused=True runs on CUDA (torch 2.11: Adam, AdamW, SGD; Adagrad's
  /// fused kernel is the CPU's only).
  bool fused_on_cuda;
  /// Its arithmetic (_single_tensor_*, _multi_tensor_*) makes its states,
  /// not _init_group: SGD's momentum buffers (torch 2.11's sgd.py). Its
  /// allocations there are then state, not temporaries
  /// (FrameIndex::runs_optimizer_math).
  bool states_in_arithmetic;
};

/// "no", "one", "two", "three", then digits ("4"), for a sentence.
std::string count_word(int count);

/// "one state", "two states", ..., for a sentence.
std::string count_states(int states);

/// The optimizer defined in `path`, a file inside the torch package
/// ("optim/rmsprop.py"); nullptr for any other file (optimizer.py,
/// lr_scheduler.py, ...).
const OptimizerKind* torch_optimizer(std::string_view path);

/// bitsandbytes' optimizers, for a file under bitsandbytes/optim/ (`path`
/// inside site-packages); nullptr for any other. One kind for all: the
/// frames (optimizer.py's init_state and update_step) do not tell an 8-bit
/// class from a 32-bit one, so no first-step states are estimated, its
/// arithmetic (in-place kernels) makes no temporaries counted, and no 8-bit
/// class is offered: the job runs bitsandbytes already.
const OptimizerKind* library_optimizer(std::string_view path);

/// The optimizer of the class `name` as torch.optim's step mark names it
/// ("Optimizer.step#AdamW.step": "AdamW"; phase_marks.h): torch.optim's
/// class of that name (Adam: adam.py's kind), bitsandbytes' kind for its
/// 8-bit and paged classes ("AdamW8bit", "PagedAdamW"); nullptr for any
/// other (a class of the user's own).
const OptimizerKind* optimizer_of_class(std::string_view name);

/// True for the kinds of torch.optim (torch_optimizer), false for a
/// library's (library_optimizer).
bool is_torch_optim(const OptimizerKind& kind);

}  // namespace oomtune::diagnose
