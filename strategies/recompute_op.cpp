#include "strategies/recompute_op.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <ATen/core/Generator.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/function.h>
#include <ATen/core/stack.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/library.h>

#include "common/class_name.h"
#include "compat/torch_compat.h"
#include "probes/memory_tracker.h"
#include "session/cuda_autocast.h"
#include "strategies/argument_writes.h"

// Note [Recompute RNG]
// Rationale: a block with dropout draws random masks in its forward. The
// recomputation in backward must draw the same masks, or the gradients belong
// to a different forward than the one whose outputs the loss saw.
// Approach: as torch/utils/checkpoint.py (reentrant variant, preserve_rng_state
// =True) does: before the no-grad forward, save the state of the default CPU
// generator and of the default CUDA generator of each CUDA device among the
// inputs; in backward, save the current states, set the saved ones, recompute,
// and put the current states back (fork_rng), so that the rest of the program
// sees the RNG stream it would have seen without checkpointing. CUDA is found
// at run time (at::globalContext().hasCUDA()), so a CPU-only build compiles
// the same code.
// Limitations: generators other than the default ones (a torch.Generator
// passed into the block) are not saved. A block that draws on a CUDA device
// none of its inputs is on is not covered (PyTorch has the same rule).
// Autocast: whether CPU/CUDA autocast (or CUDA's emulated on CPU and meta
// tensors, session/cuda_autocast.h) was on at the forward, and its dtype,
// are saved and set again for the recomputation (as torch/utils/checkpoint.py
// saves its autocast kwargs), then the backward's settings are put back and
// the cast caches dropped (AutocastFork). Read and set through the compat
// header (the emulation through its own): autocast is on while its key is
// *not* excluded in the thread's dispatch-key TLS, in 1.13 and 2.x alike.

// Note [Recompute on autograd's threads]
// Rationale: CUDA's backward runs on autograd's device threads, not on the
// thread that called backward (CPU and meta run on the caller). The engine
// hands them the caller's ThreadLocalState (grad mode, dispatch keys,
// RecordFunction callbacks), but not the TorchScript graph executor's
// optimize flag, which is thread_local (torch/csrc/jit/python/
// update_graph_executor_opt.cpp) and on by default. So a recomputation run
// there used the profiling executor while the trial's forward used the
// eager-like one (session/model_session.h): from the second step its
// optimized plan put addmm into a prim::DifferentiableGraph, whose symbolic
// backward (AD_mm_backward_mat2) multiplied the bf16 gradient by the fp32
// weight, since the autocast cast happens inside the op. The Hugging Face
// GPT-2 fixture checkpointed in bf16 failed so on an H200 ("expected mat1
// and mat2 to have the same dtype, BFloat16 != float"), and both fixtures
// (eager attention and SDPA) fail so on the CPU when backward runs on
// another thread (tests/core/hf_fixture_test.cpp).
// Approach: the forward saves the flag with the autocast settings; the
// recomputation runs under it (GraphOptimizerEnabledGuard) and restores
// the thread's own afterwards.

// Note [Recomputed outputs are the graph's]
// Rationale: the recomputation's outputs, held in backward's own variables
// while the block's backward ran, lived until it ended; PyTorch's
// checkpoint (use_reentrant=False, what eager training and Hugging Face run)
// frees each recomputed tensor once the backward node that saved it has
// run. On an H200, ResNet-50 checkpointed at micro-batch 32 made eager's
// requests to the byte, yet peaked 98 MiB above it: two 49 MiB tensors
// alive to the block's end, the recomputed last batch norm's output (the
// in-place ReLU's result, saved by ReluBackward0) and the gradient that
// came into the block (device_check.sh --checkpointing, 2026-12-04,
// scripts/compare_step_events.py on the two runs' step events).
// Approach: backward takes the roots' gradient edges and hands the engine
// those edges, dropping its own references to the outputs first; the
// graph's saved variables alone keep them, and free them as they run. On
// the CPU against PyTorch 2.11's checkpoint(use_reentrant=False), ResNet-50
// at micro-batch 8 then peaks at 345.37 MiB of live bytes to eager's 345.31
// (364.68 before; docs/validation.md).
// Limitations: the incoming gradients are released as Note [Incoming
// gradients are the graph's] says.

// Note [Incoming gradients are the graph's]
// Rationale: the gradients that come into a block were held to the end of
// its backward, by the list the engine's execute() reads them from (and, as
// in PyTorch's reentrant checkpoint, by the backward's own argument); eager's
// checkpoint(use_reentrant=False) frees each once the block's first node
// that takes it has run, where that node makes a new gradient of it (a
// ResNet bottleneck's last ReLU; a transformer block's residual add passes
// it on, and eager keeps it too). So ResNet-50 checkpointed on meta held
// 5.2, 11.3 and 6.3 MiB more live bytes at micro-batch 8, 16, 32 than eager
// on an H200 less its transient requests; now none (docs/validation.md).
// Approach: backward takes its gradients by reference, moving them out of
// the list the Function's node passed (which in 2.11 holds the engine's own
// references), and hands them to execute() in a shared list that a pre-hook
// on each root's node empties when the engine calls it: by then its input
// buffer holds them, and they go as that node's inputs go.
// Limitations: with libtorch 1.13 the node's apply copies the gradients and
// keeps its argument to the end of backward (compat::
// kCustomFunctionGetsItsGradients), so the gradient stays held there, as
// before. A node that the engine does not run keeps its gradient in the list
// to the end of execute().

// Note [Checkpoint anchor]
// Rationale: a torch::autograd::Function whose tensor inputs all have
// requires_grad=False is left out of the autograd graph, so its backward never
// runs and the block's parameters get no gradients (PyTorch's reentrant
// checkpoint warns "None of the inputs have requires_grad=True" for this).
// This happens when a block is fed data directly (the first block of a
// model whose input is a float image).
// Approach: when no input requires grad, an empty leaf tensor with
// requires_grad=True is passed as an extra input; the Function is then part
// of the graph and its backward (which returns no gradient for the anchor)
// recomputes the block and fills the parameter gradients.
// Limitations: none known; the anchor holds 0 bytes.

namespace oomtune {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

/// The block's arguments apart from self, as the call site passed them, split
/// so that autograd sees the Tensors: `tensors` in order, and `layout` holding
/// every argument with None in each Tensor's place, an empty list in each
/// List[Tensor]'s and an empty tuple in each tuple of Tensors'. `places` gives,
/// per tensor, its argument's index and its index in that list or tuple (-1
/// for a Tensor argument). Other arguments (None for an Optional[Tensor], a
/// bool, an int, a tuple of ints) pass through unchanged.
struct BlockArguments {
  c10::List<c10::IValue> layout{c10::AnyType::get()};
  c10::List<int64_t> places;  // argument index, element index (or -1), per tensor
  std::vector<at::Tensor> tensors;
};

bool is_tensor_tuple(const c10::IValue& value) {
  if (!value.isTuple()) return false;
  const auto& elements = value.toTupleRef().elements();
  return !elements.empty() &&
         std::all_of(elements.begin(), elements.end(), [](const c10::IValue& e) { return e.isTensor(); });
}

BlockArguments split_arguments(c10::ArrayRef<c10::IValue> arguments) {
  BlockArguments split;
  const auto add = [&split](int64_t argument, int64_t element, const at::Tensor& tensor) {
    split.places.push_back(argument);
    split.places.push_back(element);
    split.tensors.push_back(tensor);
  };
  for (const auto& argument : arguments) {
    const auto index = static_cast<int64_t>(split.layout.size());
    if (argument.isTensor()) {
      add(index, -1, argument.toTensor());
      split.layout.push_back(c10::IValue());
    } else if (argument.isTensorList()) {
      const auto list = argument.toTensorList();
      for (size_t i = 0; i < list.size(); ++i) add(index, static_cast<int64_t>(i), list.get(i));
      split.layout.push_back(c10::List<at::Tensor>());
    } else if (is_tensor_tuple(argument)) {
      const auto& elements = argument.toTupleRef().elements();
      for (size_t i = 0; i < elements.size(); ++i) add(index, static_cast<int64_t>(i), elements[i].toTensor());
      split.layout.push_back(c10::ivalue::Tuple::create(std::vector<c10::IValue>{}));
    } else {
      split.layout.push_back(argument);
    }
  }
  return split;
}

/// The block's TorchScript class without the "(of Python compilation unit
/// at: 0x...)" that repr_str() appends.
std::string class_name(const c10::ivalue::Object& block) {
  const auto& name = block.type()->name();
  return name ? name->qualifiedName() : block.type()->repr_str();
}

/// The call's arguments rebuilt from `layout` with `tensors` put back into
/// their `places`; every List[Tensor] is a new list, so nothing the caller
/// did to its list after the call shows in a recomputation, and every tuple
/// of Tensors a new tuple.
std::vector<c10::IValue> join_arguments(const c10::List<c10::IValue>& layout, const c10::List<int64_t>& places,
                                        at::TensorList tensors) {
  TORCH_CHECK(places.size() == 2 * tensors.size(), kCheckpointOpName, ": ", tensors.size(), " tensors for ",
              places.size() / 2, " tensor places");
  std::vector<c10::IValue> arguments;
  arguments.reserve(layout.size());
  for (size_t i = 0; i < layout.size(); ++i) {
    const c10::IValue value = layout.get(i);
    arguments.push_back(value.isTensorList() ? c10::IValue(c10::List<at::Tensor>()) : value);
  }
  std::vector<std::vector<c10::IValue>> tuples(layout.size());
  for (size_t t = 0; t < tensors.size(); ++t) {
    const auto index = static_cast<size_t>(places.get(2 * t));
    c10::IValue& argument = arguments.at(index);
    if (places.get(2 * t + 1) < 0) {
      argument = tensors[t];
    } else if (argument.isTensorList()) {
      argument.toTensorList().push_back(tensors[t]);
    } else {
      tuples[index].emplace_back(tensors[t]);
    }
  }
  for (size_t i = 0; i < tuples.size(); ++i) {
    if (!tuples[i].empty()) arguments[i] = c10::ivalue::Tuple::create(std::move(tuples[i]));
  }
  return arguments;
}

/// The block's `method` (forward, or an overload of it such as forward__0),
/// called as prim::CallMethod would: self first, then `arguments`. Returns its
/// output flattened to Tensors.
std::vector<at::Tensor> run_method(const c10::intrusive_ptr<c10::ivalue::Object>& block, const std::string& method,
                                   std::vector<c10::IValue> arguments) {
  torch::jit::Stack stack;
  stack.reserve(arguments.size() + 1);
  stack.emplace_back(block);
  for (auto& argument : arguments) stack.push_back(std::move(argument));
  block->type()->getMethod(method).run(stack);
  TORCH_CHECK(stack.size() == 1, kCheckpointOpName, ": ", method, " of ", class_name(*block), " left ", stack.size(),
              " values on the stack, expected 1");
  const c10::IValue& out = stack.back();
  std::vector<at::Tensor> outputs;
  if (out.isTensor()) {
    outputs.push_back(out.toTensor());
  } else if (out.isTuple()) {
    for (const auto& element : out.toTupleRef().elements()) {
      TORCH_CHECK(element.isTensor(), kCheckpointOpName, ": ", method, " of ", class_name(*block),
                  " returned a tuple with a ", element.tagKind(), ", expected only Tensors");
      outputs.push_back(element.toTensor());
    }
  } else {
    TORCH_CHECK(false, kCheckpointOpName, ": ", method, " of ", class_name(*block), " returned a ", out.tagKind(),
                ", expected a Tensor or a tuple of Tensors");
  }
  return outputs;
}

/// Default generator states at one moment (Note [Recompute RNG]).
struct RngState {
  at::Tensor cpu;
  std::vector<std::pair<c10::DeviceIndex, at::Tensor>> cuda;
};

at::Generator default_generator(c10::Device device) { return at::globalContext().defaultGenerator(device); }

at::Tensor get_state(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state(at::Generator generator, const at::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

std::vector<c10::DeviceIndex> cuda_devices(at::TensorList inputs) {
  std::vector<c10::DeviceIndex> devices;
  if (!at::globalContext().hasCUDA()) return devices;
  for (const auto& input : inputs) {
    if (!input.defined() || !input.is_cuda()) continue;
    const auto index = input.device().index();
    bool seen = false;
    for (auto d : devices) seen = seen || d == index;
    if (!seen) devices.push_back(index);
  }
  return devices;
}

RngState capture_rng(const std::vector<c10::DeviceIndex>& devices) {
  // The states are CPU tensors (5056 bytes for the CPU generator, 16 for a
  // CUDA one): host memory under CUDA, so not the device's in a CPU trial.
  HostMemoryScope host;
  RngState state;
  state.cpu = get_state(default_generator(c10::Device(c10::kCPU)));
  for (auto index : devices) {
    state.cuda.emplace_back(index, get_state(default_generator(c10::Device(c10::kCUDA, index))));
  }
  return state;
}

void restore_rng(const RngState& state) {
  set_state(default_generator(c10::Device(c10::kCPU)), state.cpu);
  for (const auto& [index, tensor] : state.cuda) {
    set_state(default_generator(c10::Device(c10::kCUDA, index)), tensor);
  }
}

/// Sets `saved` for its lifetime and restores the states found at
/// construction afterwards (torch.random.fork_rng).
class RngFork {
 public:
  explicit RngFork(const RngState& saved) {
    std::vector<c10::DeviceIndex> devices;
    for (const auto& entry : saved.cuda) devices.push_back(entry.first);
    outer_ = capture_rng(devices);
    restore_rng(saved);
  }
  ~RngFork() { restore_rng(outer_); }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  RngState outer_;
};

/// Autocast's settings at one moment, per device: on or off, and the dtype.
struct AutocastState {
  bool cpu = false;
  at::ScalarType cpu_dtype = at::kBFloat16;
  bool cuda = false;
  at::ScalarType cuda_dtype = at::kHalf;
  bool emulated = false;  // CUDA's, on CPU and meta tensors (session/cuda_autocast.h)
  at::ScalarType emulated_dtype = at::kBFloat16;

  bool any() const { return cpu || cuda || emulated; }
};

AutocastState current_autocast() {
  return {compat::cpu_autocast_enabled(), compat::cpu_autocast_dtype(),     compat::cuda_autocast_enabled(),
          compat::cuda_autocast_dtype(),  emulated_cuda_autocast_enabled(), emulated_cuda_autocast_dtype()};
}

void set_autocast(const AutocastState& state) {
  compat::set_cpu_autocast(state.cpu, state.cpu_dtype);
  compat::set_cuda_autocast(state.cuda, state.cuda_dtype);
  if (state.emulated || emulated_cuda_autocast_enabled())
    set_emulated_cuda_autocast(state.emulated, state.emulated_dtype);
}

/// Keeps `state` in the autograd context for backward, and reads it back.
void save_autocast(AutogradContext* ctx, const AutocastState& state) {
  ctx->saved_data["autocast_cpu"] = state.cpu;
  ctx->saved_data["autocast_cpu_dtype"] = static_cast<int64_t>(state.cpu_dtype);
  ctx->saved_data["autocast_cuda"] = state.cuda;
  ctx->saved_data["autocast_cuda_dtype"] = static_cast<int64_t>(state.cuda_dtype);
  ctx->saved_data["autocast_emulated"] = state.emulated;
  ctx->saved_data["autocast_emulated_dtype"] = static_cast<int64_t>(state.emulated_dtype);
}

AutocastState saved_autocast(AutogradContext* ctx) {
  return {ctx->saved_data["autocast_cpu"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["autocast_cpu_dtype"].toInt()),
          ctx->saved_data["autocast_cuda"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["autocast_cuda_dtype"].toInt()),
          ctx->saved_data["autocast_emulated"].toBool(),
          static_cast<at::ScalarType>(ctx->saved_data["autocast_emulated_dtype"].toInt())};
}

/// Sets `inner` for its lifetime and puts the settings found at construction
/// back afterwards. Leaving autocast (on inside, off outside) drops its cast
/// cache, as torch.autocast's __exit__ does at nesting level 0: the cache
/// holds lower-precision copies of the weights, which would otherwise stay
/// alive and be reused, stale, after the optimizer step.
class AutocastFork {
 public:
  explicit AutocastFork(const AutocastState& inner) : outer_(current_autocast()), inner_(inner) {
    set_autocast(inner_);
  }
  ~AutocastFork() {
    set_autocast(outer_);
    if (inner_.any() && !outer_.any()) {
      compat::clear_autocast_cache();
      clear_emulated_cuda_autocast_cache();
    }
  }
  AutocastFork(const AutocastFork&) = delete;
  AutocastFork& operator=(const AutocastFork&) = delete;

 private:
  AutocastState outer_;
  AutocastState inner_;
};

/// Drops `grads`[index], a root's gradient, as the root's node is about to
/// run: the engine has handed it over to that node's inputs by then (Note
/// [Incoming gradients are the graph's]). Roots that share a node give it
/// one hook each.
class ReleaseRootGradient final : public torch::autograd::FunctionPreHook {
 public:
  ReleaseRootGradient(std::shared_ptr<variable_list> grads, size_t index) : grads_(std::move(grads)), index_(index) {}
  variable_list operator()(const variable_list& inputs) override {
    (*grads_)[index_].reset();
    return inputs;
  }

 private:
  std::shared_ptr<variable_list> grads_;
  size_t index_;
};

/// Forward under no-grad keeping only the inputs; backward recomputes.
struct RecomputeFunction : public torch::autograd::Function<RecomputeFunction> {
  // `method` names the forward (or an overload of it) that the call site
  // called. `layout` and `places` are BlockArguments' (the non-Tensor
  // arguments pass through autograd as IValues). `call` holds the arguments
  // as the call site passed them: the forward runs on them, so a List[Tensor]
  // is the caller's own list; only the recomputation rebuilds it.
  // `anchor` is an empty tensor, a leaf requiring grad when no input does
  // (Note [Checkpoint anchor]).
  static variable_list forward(AutogradContext* ctx, c10::IValue block, c10::IValue method, c10::IValue layout,
                               c10::IValue places, c10::IValue call, at::TensorList inputs, const at::Tensor& anchor) {
    (void)anchor;
    const auto devices = cuda_devices(inputs);
    RngState rng = capture_rng(devices);  // Note [Recompute RNG]
    c10::List<bool> requires_grad;
    c10::List<int64_t> device_list;
    c10::List<at::Tensor> cuda_states;
    for (const auto& input : inputs) requires_grad.push_back(input.defined() && input.requires_grad());
    for (const auto& [index, state] : rng.cuda) {
      device_list.push_back(index);
      cuda_states.push_back(state);
    }
    ctx->saved_data["block"] = block;
    ctx->saved_data["method"] = method;
    ctx->saved_data["layout"] = layout;
    ctx->saved_data["places"] = places;
    ctx->saved_data["requires_grad"] = requires_grad;
    ctx->saved_data["cpu_rng"] = rng.cpu;
    ctx->saved_data["cuda_devices"] = device_list;
    ctx->saved_data["cuda_rng"] = cuda_states;
    save_autocast(ctx, current_autocast());  // Note [Recompute RNG], autocast
    // Note [Recompute on autograd's threads]
    ctx->saved_data["optimize"] = torch::jit::getGraphExecutorOptimize();
    ctx->save_for_backward(inputs.vec());
    return run_method(block.toObject(), method.toStringRef(), call.toListRef().vec());
  }

  // `grad_outputs` by reference: the list the autograd Function's node
  // passes holds the engine's own references (Note [Incoming gradients are
  // the graph's]).
  static variable_list backward(AutogradContext* ctx, variable_list& grad_outputs) {
    const auto saved = ctx->get_saved_variables();
    const auto requires_grad = ctx->saved_data["requires_grad"].toBoolList();
    RngState rng;
    rng.cpu = ctx->saved_data["cpu_rng"].toTensor();
    const auto devices = ctx->saved_data["cuda_devices"].toIntList();
    const auto cuda_states = ctx->saved_data["cuda_rng"].toTensorList();
    for (size_t i = 0; i < devices.size(); ++i) {
      rng.cuda.emplace_back(static_cast<c10::DeviceIndex>(devices.get(i)), cuda_states.get(i));
    }

    std::vector<at::Tensor> detached;
    detached.reserve(saved.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      at::Tensor input = saved[i].defined() ? saved[i].detach() : saved[i];
      if (input.defined() && requires_grad.get(i)) input.requires_grad_(true);
      detached.push_back(input);
    }

    std::vector<at::Tensor> outputs;
    {
      RngFork fork(rng);  // Note [Recompute RNG]
      AutocastFork autocast(saved_autocast(ctx));
      torch::jit::GraphOptimizerEnabledGuard executor(ctx->saved_data["optimize"].toBool());
      at::AutoGradMode enable_grad(true);
      outputs = run_method(
          ctx->saved_data["block"].toObject(), ctx->saved_data["method"].toStringRef(),
          join_arguments(ctx->saved_data["layout"].toList(), ctx->saved_data["places"].toIntList(), detached));
    }
    TORCH_CHECK(outputs.size() == grad_outputs.size(), kCheckpointOpName, ": recomputation returned ", outputs.size(),
                " outputs, the forward returned ", grad_outputs.size());

    // Note [Recomputed outputs are the graph's]
    torch::autograd::edge_list roots;
    const auto root_grads = std::make_shared<variable_list>();
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && grad_outputs[i].defined()) {
        roots.push_back(torch::autograd::impl::gradient_edge(outputs[i]));
        root_grads->push_back(std::move(grad_outputs[i]));
      }
    }
    outputs.clear();
    grad_outputs.clear();
    if (!roots.empty()) {
      for (size_t i = 0; i < roots.size(); ++i)  // Note [Incoming gradients are the graph's]
        roots[i].function->add_pre_hook(std::make_unique<ReleaseRootGradient>(root_grads, i));
      torch::autograd::Engine::get_default_engine().execute(roots, *root_grads, /*keep_graph=*/false,
                                                            /*create_graph=*/false, /*accumulate_grad=*/true);
    }

    // One gradient per forward argument after ctx, a TensorList's counted
    // per tensor; none for the non-Tensor ones and the anchor.
    variable_list grads(5);  // block, method, layout, places, call
    grads.reserve(detached.size() + 6);
    for (const auto& input : detached) {
      grads.push_back(input.defined() && input.requires_grad() ? input.grad() : at::Tensor());
    }
    grads.emplace_back();  // anchor
    return grads;
  }
};

// The class of the block check_arguments_kept refused last, kept outside the
// error: the TorchScript interpreter rethrows the op's c10::Error with its
// own text, so no type or field of ours survives the throw.
std::mutex g_refusal_mutex;
std::optional<std::string> g_refused_class;

void note_refusal(const c10::ivalue::Object& block) {
  const std::lock_guard<std::mutex> lock(g_refusal_mutex);
  g_refused_class = unmangled_name(class_name(block));
}

/// Refuses a checkpointed forward that changed what its recomputation will
/// start from, rather than give wrong gradients: a Tensor it put into a
/// List[Tensor] argument was made under no-grad and has no path to the
/// block's parameters; a Tensor argument it modified in place (its version
/// counter moved, as autograd's saved-variable check reads it) holds the
/// modified values, so the recomputation would run on other inputs than the
/// forward did. `before` and `versions` are the arguments' Tensors and their
/// versions before the forward.
void check_arguments_kept(const c10::ivalue::Object& block, const std::string& method, const BlockArguments& before,
                          const std::vector<int64_t>& versions, const c10::IValue& arguments) {
  const BlockArguments after = split_arguments(arguments.toListRef());
  bool unchanged = after.tensors.size() == before.tensors.size();
  for (size_t i = 0; unchanged && i < after.tensors.size(); ++i) {
    unchanged = after.tensors[i].is_same(before.tensors[i]);
  }
  if (!unchanged) note_refusal(block);
  TORCH_CHECK(unchanged, kCheckpointOpName, ": ", method, " of ", class_name(block),
              " changed its List[Tensor] argument (", before.tensors.size(), " tensors before the call, ",
              after.tensors.size(), " after); ", kListAdvice);
  for (size_t i = 0; i < before.tensors.size(); ++i) {
    const at::Tensor& input = before.tensors[i];
    if (!input.defined() || input._version() == versions[i]) continue;
    const auto& schema = block.type()->getMethod(method).getSchema();
    const auto argument = static_cast<size_t>(before.places.get(2 * i)) + 1;  // after self
    const int64_t element = before.places.get(2 * i + 1);
    note_refusal(block);
    TORCH_CHECK(false, kCheckpointOpName, ": ", method, " of ", class_name(block), " modified its argument ",
                schema.arguments().at(argument).name(), element < 0 ? "" : "[" + std::to_string(element) + "]",
                " in place, so its recomputation would start from the modified values; ", kInPlaceAdvice);
  }
}

std::vector<at::Tensor> checkpoint_or_call(const c10::intrusive_ptr<c10::ivalue::Object>& block,
                                           const std::string& method, const c10::IValue& arguments, bool checkpoint) {
  if (!checkpoint || !at::GradMode::is_enabled()) return run_method(block, method, arguments.toListRef().vec());
  BlockArguments split = split_arguments(arguments.toListRef());
  bool any_requires_grad = false;
  for (const auto& input : split.tensors) {
    any_requires_grad = any_requires_grad || (input.defined() && input.requires_grad());
  }
  // Note [Checkpoint anchor]. Always a defined tensor: custom Function inputs
  // record their device, which an undefined tensor does not have.
  at::Tensor anchor = at::empty({0});
  if (!any_requires_grad) anchor.requires_grad_(true);
  std::vector<int64_t> versions;
  versions.reserve(split.tensors.size());
  for (const auto& input : split.tensors) versions.push_back(input.defined() ? input._version() : 0);
  std::vector<at::Tensor> outputs =
      RecomputeFunction::apply(c10::IValue(block), c10::IValue(method), c10::IValue(split.layout),
                               c10::IValue(split.places), arguments, at::TensorList(split.tensors), anchor);
  check_arguments_kept(*block, method, split, versions, arguments);
  return outputs;
}

void checkpoint_kernel(const c10::OperatorHandle& /*op*/, torch::jit::Stack* stack) {
  const c10::IValue arguments = torch::jit::pop(*stack);
  const c10::IValue method = torch::jit::pop(*stack);
  c10::IValue block = torch::jit::pop(*stack);
  TORCH_CHECK(block.isObject(), kCheckpointOpName, ": expected a module object, got ", block.tagKind());
  auto object = block.toObject();
  std::vector<at::Tensor> outputs =
      checkpoint_or_call(object, method.toStringRef(), arguments, checkpoint_flag(*object));
  c10::List<at::Tensor> list;
  list.reserve(outputs.size());
  for (auto& output : outputs) list.push_back(std::move(output));
  torch::jit::push(*stack, std::move(list));
}

}  // namespace

bool is_tensor_argument_type(const c10::TypePtr& type) {
  const auto is_tensor = [](const c10::TypePtr& t) { return t->kind() == c10::TypeKind::TensorType; };
  if (is_tensor(type)) return true;
  if (const auto optional = type->cast<c10::OptionalType>()) return is_tensor(optional->getElementType());
  if (const auto list = type->cast<c10::ListType>()) return is_tensor(list->getElementType());
  if (const auto tuple = type->cast<c10::TupleType>())
    return !tuple->elements().empty() && std::all_of(tuple->elements().begin(), tuple->elements().end(), is_tensor);
  return false;
}

std::optional<std::string> take_refused_block_class() {
  const std::lock_guard<std::mutex> lock(g_refusal_mutex);
  std::optional<std::string> refused;
  refused.swap(g_refused_class);
  return refused;
}

TORCH_LIBRARY_FRAGMENT(oomtune, m) {
  m.def(torch::schema("oomtune::checkpoint(Any block, str method, Any[] inputs) -> Tensor[]",
                      c10::AliasAnalysisKind::CONSERVATIVE),
        torch::CppFunction::makeFromBoxedFunction<&checkpoint_kernel>());
}

void ensure_recompute_op_registered() {
  const auto handle = c10::Dispatcher::singleton().findSchema({kCheckpointOpName, ""});
  TORCH_CHECK(handle.has_value(), kCheckpointOpName, " is not registered (recompute_op.cpp was not linked)");
}

bool checkpoint_flag(const c10::ivalue::Object& block) {
  const auto slot = block.type()->findAttributeSlot(kCheckpointFlag);
  if (!slot || *slot >= block.slots().size()) return false;
  const c10::IValue& value = block.getSlot(*slot);
  return value.isBool() && value.toBool();
}

}  // namespace oomtune
