#pragma once
// Argument writes: a block's forward that modifies a Tensor argument in place
// or changes a List[Tensor] argument, found in its TorchScript graph before
// anything runs.
//
// Activation checkpointing must refuse such a block (the recompute operator
// checks it at run time, strategies/recompute_op.h): its recomputation would
// start from the modified values, or lose a Tensor it added to the list.
// Finding the write in the graph lets `oomtune probe` and autotune refuse the
// block's class before the first step, naming the user's line.
//
// Rules (only writes that every run of the forward makes, so that a block
// refused here is one the operator would refuse):
// - The arguments watched are the forward's Tensor, Optional[Tensor],
//   List[Tensor] and Tuple[Tensor, ...] arguments, and what certainly aliases
//   them: a view (aten::view, transpose, select, slice, ... ; not reshape,
//   contiguous or to, which may copy), an element of the list or tuple.
// - A write is an operator whose schema marks that argument as written
//   (`Tensor(a!)`: aten::mul_, aten::relu_, aten::copy_, aten::append, ...;
//   FunctionSchema alias annotations, aten/src/ATen/native/README.md).
// - Only nodes that always run count: the forward's top level, the taken
//   branch of a prim::If whose condition is a constant (F.relu(x,
//   inplace=True) reached through nn.ReLU's forward), and the methods and
//   functions it calls with a watched argument (prim::CallMethod,
//   prim::CallFunction), followed the same way.
// - The first iteration of a prim::Loop that certainly runs once (a known
//   trip count >= 1, `for i in range(2)`, or a `while` whose first condition
//   is a constant true): its top-level nodes, with the loop's inputs as the
//   carried values. The compiler puts what follows a `break` or `continue`
//   under a prim::If (torch/csrc/jit/frontend/exit_transforms.cpp), so such
//   a write counts only when its branch is known. The loop's outputs are not
//   watched: after the first iteration they may be new Tensors.
// - Other loops and branches decided at run time are not looked at; the
//   operator still checks those.

#include <optional>
#include <string>

#include <torch/csrc/jit/api/function_impl.h>

namespace oomtune {

/// What the refusal of a block that modifies a Tensor argument in place says
/// the user can do; shared by the graph check and the recompute operator.
extern const char* const kInPlaceAdvice;

/// What the refusal of a block that changes its List[Tensor] argument says.
extern const char* const kListAdvice;

/// One write to an argument of a forward, found in its graph.
struct ArgumentWrite {
  std::string argument;  // the forward's argument written: "x", "xs"
  bool list = false;     // true: the List[Tensor] itself changed (append, pop, ...); false: a Tensor's data
  std::string op;        // the writing operator: "aten::mul_", "aten::append"
  std::string source;    // "model.py:12:8": the forward's line that writes, or calls what writes; "" if unknown
};

/// The first write to a watched argument that every run of `method` (a
/// block's forward, or the overload its call site calls) makes; nullopt when
/// none is certain. `method` is a TorchScript method whose first input is
/// self. Throws nothing: methods without a graph are not looked into.
std::optional<ArgumentWrite> certain_argument_write(const torch::jit::Function& method);

/// "modifies its argument x in place (aten::mul_ at model.py:12:8), so its
/// recomputation would start from the modified values; make that ..." or
/// "changes its List[Tensor] argument xs (aten::append at ...); a
/// checkpointed block must return ...": the middle and end of a refusal.
std::string describe(const ArgumentWrite& write);

}  // namespace oomtune
