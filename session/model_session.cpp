#include "session/model_session.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <cstdio>

#include "common/error.h"
#include "compat/torch_compat.h"
#include "session/device_constants.h"
#include "session/embedding_tables.h"
#include "session/forward_arguments.h"
#include "session/model_file.h"

namespace oomtune {
namespace {

/// For a file (or folder) that is something other than TorchScript, the
/// error says what it is and how to export one.
void throw_if_not_torchscript(const std::string& path) {
  const std::string kind = non_torchscript_kind(path);
  if (!kind.empty()) {
    throw ModelError(fmt::format("{}: is {}, not a TorchScript model; {}", path, kind, how_to_export_torchscript()));
  }
}

[[noreturn]] void throw_load_error(const std::string& path, const std::string& message) {
  // "Unknown builtin op: aten::scaled_dot_product_attention." (the sentence's
  // period is not part of the name; an overload name would be: aten::add.Tensor).
  static const std::regex kUnknownOp(R"(Unknown builtin op: ([A-Za-z0-9_:]+(?:\.[A-Za-z0-9_]+)?))");
  std::smatch match;
  if (std::regex_search(message, match, kUnknownOp)) {
    throw ModelError(
        fmt::format("{}: uses operator {}, which the libtorch oomtune was built with ({}) does not have. "
                    "Fix: build oomtune against your own PyTorch (OOMTUNE_TORCH=python ./setup.sh, see README), "
                    "or export the model without it (for Hugging Face models: attn_implementation=\"eager\")",
                    path, match[1].str(), compat::torch_version()));
  }
  throw_if_not_torchscript(path);
  throw ModelError(fmt::format("{}: cannot load the TorchScript model: {}", path, one_line(message)));
}

bool full_errors() {
  const char* value = std::getenv(kFullErrorsVariable);
  return value && *value && std::string_view(value) != "0";
}

}  // namespace

std::string error_text(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e); c10_error && !full_errors())
    return c10_error->what_without_backtrace();
  return e.what();
}

namespace {
// The words that begin an out-of-memory message: oomtune's budget, the
// caching allocator's, the CUDA runtime's and cuBLAS's.
constexpr const char* kOutOfMemoryMarkers[] = {kBudgetMessage, "CUDA out of memory", "CUDA error: out of memory",
                                               "CUBLAS_STATUS_ALLOC_FAILED"};
}  // namespace

bool is_out_of_memory(const std::exception& e) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e)) return true;
  // The TorchScript interpreter rethrows errors from inside a graph as
  // std::runtime_error carrying the original message.
  const std::string text = e.what();
  for (const char* marker : kOutOfMemoryMarkers)
    if (text.find(marker) != std::string::npos) return true;
  return false;
}

std::string out_of_memory_message(const std::exception& e) {
  const std::string text = error_text(e);
  for (const char* marker : kOutOfMemoryMarkers) {
    const auto at = text.find(marker);
    if (at != std::string::npos) return one_line(text.substr(at));
  }
  return one_line(text);
}

namespace {

std::string first_line_of(const std::string& message) {
  std::string line = message.substr(0, message.find('\n'));
  // libtorch appends " (most recent call first)" or exception frames after.
  const auto frames = line.find(" Exception raised from ");
  if (frames != std::string::npos) line = line.substr(0, frames);
  while (!line.empty() && (line.back() == ' ' || line.back() == '\r')) line.pop_back();
  return line;
}

at::Device torch_device(Device device) {
  switch (device) {
    case Device::kCuda:
      return at::Device(at::kCUDA);
    case Device::kMeta:
      return at::Device(at::kMeta);
    default:
      return at::Device(at::kCPU);
  }
}

}  // namespace

// Note [TorchScript errors]
// An error raised inside a TorchScript graph reaches C++ as (libtorch 1.13
// and 2.x; torch/csrc/jit/runtime/interpreter.cpp, handleError):
//   The following operation failed in the TorchScript interpreter.
//   Traceback of TorchScript, serialized code (most recent call last):
//     File "code/__torch__.py", line 18, in forward
//     ...
//   Traceback of TorchScript, original code (most recent call last):
//     File "/home/me/model.py", line 83, in forward          (scripted)
//   or
//   /site-packages/torch/nn/functional.py(2567): embedding   (traced:
//   .../transformers/models/gpt2/modeling_gpt2.py(576): forward  innermost
//   ...                                                          first)
//   RuntimeError: index out of range in self
// The first line says nothing. The cause is the last "SomethingError: "
// line; the place is the innermost frame of the original code outside
// torch's own package: the user's model, or the transformers file it came
// from. Without such a frame, no place is given.
std::string frozen_bf16_hint(const JobSpec& job, const std::string& cause) {
  // libtorch 1.13: "expected scalar type Float but found BFloat16"; 2.11:
  // "mixed dtype (CPU): expect parameter to have scalar type of Float".
  if (!job.trainable.frozen_bf16 ||
      (cause.find("BFloat16") == std::string::npos && cause.find("mixed dtype") == std::string::npos))
    return "";
  return fmt::format(
      "; the frozen parameters are stored in bf16 (frozen_dtype = \"bf16\") and an operator that CPU autocast "
      "does not cast in libtorch {} (layer_norm) met one of them with fp32 activations: freeze only the linear "
      "layers in bf16, or keep the frozen parameters in fp32 (frozen_dtype = \"fp32\")",
      compat::torch_version());
}

std::string constant_overflow_hint(const std::string& cause) {
  if (cause.find("cannot be converted to type") == std::string::npos ||
      cause.find("without overflow") == std::string::npos)
    return "";
  return "; a value of the model's graph does not fit the activations' dtype, on a GPU either: torch.jit.trace "
         "records what eager code computes from a tensor's dtype (transformers' masks fill with "
         "torch.finfo(dtype).min) as a constant of the dtype it traced in; export the model "
         "so that the value follows the dtype (torch.jit.script keeps torch.finfo(x.dtype) a computation), or train "
         "in fp32";
}

std::string dtype_hints(const JobSpec& job, const std::string& cause) {
  return frozen_bf16_hint(job, cause) + constant_overflow_hint(cause);
}

namespace {

// The innermost frame of the original code outside torch's own package in a
// TorchScript interpreter error (Note [TorchScript errors]), as
// "FILE:LINE in FUNCTION"; "" without one. `cause` gets the last
// "SomethingError: " line's message.
std::string model_frame(const std::string& message, std::string* cause) {
  static const std::regex kCause(R"(^[A-Za-z_][A-Za-z0-9_.]*(Error|Exception): (.*)$)");
  static const std::regex kScriptedFrame(R"re(^\s*File "([^"]+)", line (\d+), in (\S+))re");
  static const std::regex kTracedFrame(R"(^(\S+)\((\d+)\): (\S+)$)");
  std::istringstream lines(message);
  std::string line;
  std::deque<std::string> frames;  // original code, outermost first
  bool original = false;
  std::smatch match;
  while (std::getline(lines, line)) {
    if (line.rfind("Traceback of TorchScript", 0) == 0) original = line.find("original code") != std::string::npos;
    if (std::regex_search(line, match, kCause)) {
      *cause = match[2].str();
      continue;
    }
    const bool scripted = std::regex_search(line, match, kScriptedFrame);
    if (!original || (!scripted && !std::regex_search(line, match, kTracedFrame))) continue;
    if (match[1].str().find("-packages/torch/") != std::string::npos) continue;  // site- or dist-packages
    std::string frame = fmt::format("{}:{} in {}", std::filesystem::path(match[1].str()).filename().string(),
                                    match[2].str(), match[3].str());
    if (scripted)
      frames.push_back(std::move(frame));
    else
      frames.push_front(std::move(frame));
  }
  return frames.empty() ? "" : frames.back();
}

// Operators whose result's size is computed from the input's values, so no
// meta kernel can make it: PyTorch's fake tensors give such a size as an
// unbacked symbol (torch/_subclasses/fake_impls.py), which an eager meta
// tensor cannot hold. A model that calls them cannot run on meta whatever
// kernels oomtune adds. _local_scalar_dense is Tensor.item().
bool data_dependent(const std::string& op) {
  static const std::unordered_set<std::string> kOps = {"aten::nonzero",
                                                       "aten::masked_select",
                                                       "aten::_unique",
                                                       "aten::_unique2",
                                                       "aten::unique_dim",
                                                       "aten::unique_consecutive",
                                                       "aten::bincount",
                                                       "aten::repeat_interleave.Tensor",
                                                       "aten::_local_scalar_dense",
                                                       "aten::argwhere"};
  return kOps.count(op) > 0;
}

}  // namespace

std::string one_line(const std::string& message) {
  if (full_errors()) return message;
  static const std::string kInterpreter = "The following operation failed in the TorchScript interpreter.";
  std::string cause;
  const std::string frame = message.rfind(kInterpreter, 0) == 0 ? model_frame(message, &cause) : "";
  const std::string at = frame.empty() ? "" : fmt::format(" (at {})", frame);
  // The dispatcher's NotImplementedError for an operator without a meta
  // kernel is one long paragraph listing every backend the operator has.
  // PyTorch 2.11 words it "aten::OP: attempted to run this operator with
  // Meta tensors, but there was no fake impl or Meta kernel registered".
  static const std::regex kNoMetaKernel(
      R"((?:Could not run '([A-Za-z0-9_:.]+)' with arguments from the 'Meta' backend)|)"
      R"((?:([A-Za-z0-9_:.]+): attempted to run this operator with Meta tensors))");
  std::smatch no_meta;
  if (std::regex_search(message, no_meta, kNoMetaKernel)) {
    const std::string op = no_meta[1].matched ? no_meta[1].str() : no_meta[2].str();
    if (data_dependent(op))
      return fmt::format(
          "{}{}: the size of its result depends on the tensor's values, which the meta device does not have, so "
          "this model cannot run there; probe it on cpu",
          op, at);
    return fmt::format(
        "{}{} has no meta kernel in libtorch {} (nor among oomtune's, probes/meta_kernels.h), so this model cannot "
        "run on the meta device; probe it on cpu",
        op, at, compat::torch_version());
  }
  if (cause.empty()) return first_line_of(message);
  if (frame.empty()) return first_line_of(cause);
  return fmt::format("{}{}", first_line_of(cause), at);
}

namespace {

// Replaces every parameter and buffer that is not on meta by a meta tensor
// of its shape and dtype (module.to(meta) refuses: set_data cannot change a
// CPU tensor's type to meta's). A tensor in two slots (tied weights) stays
// one tensor. The CPU weights are freed when the loaded file's are.
void move_to_meta(torch::jit::Module& module) {
  std::unordered_map<const c10::TensorImpl*, at::Tensor> moved;
  for (torch::jit::Module m : module.modules()) {
    std::vector<std::pair<std::string, at::Tensor>> slots;
    for (const auto& p : m.named_parameters(/*recurse=*/false)) slots.emplace_back(p.name, p.value);
    for (const auto& b : m.named_buffers(/*recurse=*/false)) slots.emplace_back(b.name, b.value);
    for (const auto& [name, tensor] : slots) {
      if (!tensor.defined() || tensor.is_meta()) continue;
      auto [at, added] = moved.emplace(tensor.unsafeGetTensorImpl(), at::Tensor());
      if (added) at->second = tensor.detach().to(at::kMeta).requires_grad_(tensor.requires_grad());
      m.setattr(name, at->second);
    }
  }
}

}  // namespace

void set_optimizing_executor(bool enabled) { torch::jit::setGraphExecutorOptimize(enabled); }

ModelSession::ModelSession(const JobSpec& job) : job_(job), device_(torch_device(job.device)) {
  const std::string& path = job_.model_path;
  if (!std::filesystem::exists(path)) throw ModelError(fmt::format("{}: no such model file", path));
  if (::access(path.c_str(), R_OK) != 0)
    throw ModelError(fmt::format("{}: cannot read the model file: {}", path, std::strerror(errno)));
  if (!is_zip_archive(path)) {
    throw_if_not_torchscript(path);
    throw ModelError(fmt::format("{}: not a TorchScript archive; {}", path, how_to_export_torchscript()));
  }
  if (const std::string cut = truncated_zip(path); !cut.empty())
    throw ModelError(
        fmt::format("{}: is {}: the file was truncated (an interrupted copy, download or save?); copy "
                    "or export it again",
                    path, cut));
  if (job_.device == Device::kCuda && !at::hasCUDA())
    throw ModelError(fmt::format("{}: device = \"cuda\" but this oomtune/libtorch ({}) has no CUDA device",
                                 job_.spec_path.empty() ? path : job_.spec_path, compat::torch_version()));
  try {
    // On meta, the file loads where it was saved and its parameters and
    // buffers move to meta after: loading onto meta would move the graph's
    // tensor constants too, and a traced model's scalar constants (the 2 of
    // `x.shape[-1] // 2` in a Hugging Face Llama's rotate_half) would lose
    // their values, so shapes computed from them would be garbage.
    module_ = device_.is_meta() ? torch::jit::load(path) : torch::jit::load(path, device_);
    if (device_.is_meta()) {
      move_to_meta(module_);
      retarget_cpu_device_constants(module_, device_);
    }
  } catch (const c10::Error& e) {
    throw_load_error(path, e.what_without_backtrace());
  } catch (const std::exception& e) {
    throw_load_error(path, e.what());
  }
  // A file saved from a model built under torch.device("meta") holds shapes
  // without weights and loads on meta whatever device it is asked for.
  if (!device_.is_meta()) {
    for (const at::Tensor& p : module_.parameters()) {
      if (!p.is_meta()) continue;
      throw ModelError(
          fmt::format("{}: holds meta tensors, shapes without weights (a model built under "
                      "torch.device(\"meta\")): probe it with device = \"meta\" (--device meta)",
                      path));
    }
  }
  module_.train(true);
  binding_ = bind_forward_arguments(module_.get_method("forward").function().getSchema(), job_,
                                    job_.spec_path.empty() ? job_.model_path : job_.spec_path);
  freeze_parameters();
  if (device_.is_cuda()) {
    // A file traced on the CPU: its constant devices go where the eager
    // model's `device=x.device` would put them, and the user is told.
    const std::vector<DeviceConstant> found = find_cpu_device_constants(module_);
    retarget_cpu_device_constants(module_, device_);
    fmt::print(stderr, "{}", device_constant_note(path, found, device_));
  }
}

std::vector<at::Tensor> ModelSession::parameters() const {
  // Tied weights (a Hugging Face lm_head sharing the token embedding) are
  // one tensor in two slots: list it once, or the optimizer would keep two
  // states for it and update it twice.
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module_.parameters())
    if (p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

int64_t ModelSession::parameter_count() const {
  int64_t count = 0;
  for (const at::Tensor& p : parameters()) count += p.numel();
  return count;
}

std::vector<at::Tensor> ModelSession::frozen_parameters() const {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const at::Tensor& p : module_.parameters())
    if (!p.requires_grad() && seen.insert(p.unsafeGetTensorImpl()).second) out.push_back(p);
  return out;
}

int64_t ModelSession::frozen_parameter_count() const {
  int64_t count = 0;
  for (const at::Tensor& p : frozen_parameters()) count += p.numel();
  return count;
}

std::vector<at::Tensor> ModelSession::held_tensors() const {
  std::vector<at::Tensor> out;
  std::unordered_set<const c10::TensorImpl*> seen;
  for (const auto& attribute : module_.named_attributes(/*recurse=*/true)) {
    if (!attribute.value.isTensor()) continue;
    const at::Tensor& t = attribute.value.toTensor();
    if (t.defined() && seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  }
  for (const at::Tensor& t : tensor_constants(module_))
    if (seen.insert(t.unsafeGetTensorImpl()).second) out.push_back(t);
  return out;
}

// Note [Frozen parameters]
// The globs match the names torch::jit::Module::named_parameters lists
// (recursive, "blocks.0.attn.qkv.weight"). A tensor under two names (tied
// weights: an lm_head sharing the token embedding) is one parameter: under
// `trainable` it trains when any of its names matches, under `frozen` it is
// frozen when any of its names matches -- the names the user wrote win.
// requires_grad off is all freezing takes: autograd then makes no gradient
// for it (PyTorch, torch/csrc/autograd/engine.cpp: no AccumulateGrad node
// for a leaf without requires_grad), and every optimizer is built from
// parameters(), which skips it, so it gets no state. A parameter exported
// frozen (requires_grad already off in the file) stays frozen whatever the
// job says: this is the only place that changes requires_grad.
void ModelSession::freeze_parameters() {
  const ParameterSelection& selection = job_.trainable;
  if (!selection.freezes()) return;
  std::vector<std::string> names;
  std::vector<at::Tensor> tensors;
  for (const auto& named : module_.named_parameters(/*recurse=*/true)) {
    names.push_back(named.name);
    tensors.push_back(named.value);
  }
  const std::string where = job_.spec_path.empty() ? job_.model_path : job_.spec_path;
  const std::vector<bool> frozen = frozen_names(selection, names, where, job_.model_path);
  const bool by_any_frozen_name = selection.rule == ParameterSelection::Rule::kFrozen;
  std::unordered_map<const c10::TensorImpl*, bool> freeze;  // per tensor, over its names
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    auto [it, first] = freeze.emplace(tensors[i].unsafeGetTensorImpl(), frozen[i]);
    if (!first) it->second = by_any_frozen_name ? (it->second || frozen[i]) : (it->second && frozen[i]);
  }
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : tensors) {
    if (!freeze.at(p.unsafeGetTensorImpl()) || !p.requires_grad()) continue;
    at::Tensor tensor = p;
    tensor.set_requires_grad(false);
    // set_data keeps the TensorImpl the module's slot holds; the fp32
    // storage is freed once nothing else holds it.
    if (selection.frozen_bf16 && tensor.is_floating_point()) tensor.set_data(tensor.to(at::kBFloat16));
  }
  if (parameters().empty())
    throw SpecError(fmt::format("{}: {} = [{}] leaves no trainable parameter in {}", where, key_of(selection.rule),
                                fmt::join(selection.globs, ", "), job_.model_path));
}

Batch ModelSession::to_device(const Batch& batch) const {
  // On CPU the copy is real too: the micro-batch then counts as device
  // memory, as `x.to("cuda")` would on a GPU.
  Batch out = batch;
  for (at::Tensor& t : out.tensors) t = device_.is_cpu() ? t.clone(at::MemoryFormat::Contiguous) : t.to(device_);
  return out;
}

c10::IValue ModelSession::forward(const Batch& batch) {
  ForwardCall call = make_forward_call(binding_, batch, job_.loss.target);
  try {
    return module_.get_method("forward")(std::move(call.args), call.kwargs);
  } catch (const std::exception& e) {
    // Out of memory is a trial result, not a model error.
    if (is_out_of_memory(e)) throw;
    const std::string cause = one_line(error_text(e));
    throw ModelError(fmt::format("{}: forward({}) failed: {}{}{}", job_.model_path,
                                 describe_forward_call(binding_, batch, call), cause, dtype_hints(job_, cause),
                                 embedding_hint(embedding_tables(module_), job_, batch, call.inputs, cause)));
  }
}

}  // namespace oomtune
