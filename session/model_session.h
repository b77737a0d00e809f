#pragma once
// ModelSession: a loaded TorchScript model and the job it trains for.
//
// Rules:
// - Models run with TorchScript graph-executor optimization off unless the
//   job asks for the optimizing executor: off reproduces eager PyTorch's
//   memory within 0.1 % (DESIGN.md, measured on five torchvision models).
// - Load failures become one-line ModelErrors naming the file: missing file,
//   what it is when it is not TorchScript (a state_dict, safetensors, a PT2
//   archive...; model_file.h) and how to export, an operator this libtorch
//   lacks (with the two fixes), anything else with libtorch's first message
//   line.
// - The job's trainable / frozen globs (job/parameter_selection.h) are
//   applied at load: a frozen parameter's requires_grad is off, so
//   parameters() -- what the optimizers, master weights, offload and the
//   static split read -- lists the trainable ones only.

#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/script.h>

#include "job/job_spec.h"
#include "session/batch.h"
#include "session/forward_arguments.h"

namespace oomtune {

/// A TorchScript model loaded for training.
class ModelSession {
 public:
  /// Loads `job.model_path` onto the job's device, in training mode.
  /// Throws ModelError (exit code 2) when the file is missing, is not a
  /// TorchScript archive (naming what it is, see non_torchscript_kind),
  /// uses an operator this libtorch does not have, or when the job's inputs
  /// do not match forward's arguments (Note [Forward arguments]); throws
  /// SpecError when a trainable or frozen glob matches no parameter
  /// (frozen_names), or when the job freezes every parameter.
  explicit ModelSession(const JobSpec& job);

  /// The job this session was loaded for.
  const JobSpec& job() const { return job_; }
  /// The loaded module (training mode, on device()).
  torch::jit::Module& module() { return module_; }
  const torch::jit::Module& module() const { return module_; }
  /// The job's device (CPU, or the current CUDA device), where parameters and inputs live.
  at::Device device() const { return device_; }

  /// Trainable parameters (requires_grad), in module order, each tensor once
  /// (tied weights share one tensor).
  std::vector<at::Tensor> parameters() const;
  /// Number of trainable parameter elements.
  int64_t parameter_count() const;
  /// Frozen parameters (the job's trainable / frozen globs), in module
  /// order, each tensor once; stored as bfloat16 under frozen_dtype = "bf16".
  std::vector<at::Tensor> frozen_parameters() const;
  /// Number of frozen parameter elements.
  int64_t frozen_parameter_count() const;
  /// Every tensor the model holds, each once: parameters (trainable and
  /// frozen), buffers and other tensor attributes of every submodule, and
  /// the tensor constants of its graphs (tensor_constants). What a copy of
  /// the model on a device keeps there; anything else loading left alive
  /// is libtorch's (Note [Loader records] in trial/trial_runner.cpp).
  std::vector<at::Tensor> held_tensors() const;

  /// Runs forward on the batch's model inputs (all but the loss target) and
  /// returns the raw output: by name when the inputs are named as forward's
  /// arguments, else in order, or packed into forward's one dict, tuple or
  /// list argument (Note [Forward arguments]). Throws ModelError
  /// when the model rejects the inputs (dtype, shape), naming the inputs given.
  c10::IValue forward(const Batch& batch);

  /// Moves a CPU batch to the session's device.
  Batch to_device(const Batch& batch) const;

 private:
  /// Turns requires_grad off on the parameters the job freezes (and casts
  /// them to bf16 under frozen_dtype = "bf16"); Note [Frozen parameters].
  void freeze_parameters();

  JobSpec job_;
  torch::jit::Module module_;
  at::Device device_;
  ForwardBinding binding_;  // how forward takes the inputs (Note [Forward arguments])
};

/// Sets TorchScript graph-executor optimization (process-wide). The probe
/// calls it before the first forward.
void set_optimizing_executor(bool enabled);

/// The words every budget out-of-memory message begins with (probes/memory_tracker.cpp).
constexpr const char* kBudgetMessage = "oomtune budget: tried to allocate";

/// True when `e` is an out-of-memory error: c10::OutOfMemoryError, an
/// error the TorchScript interpreter rethrew with such a message, or the
/// device itself out of memory outside the caching allocator: a CUDA
/// runtime call ("CUDA error: out of memory") or cuBLAS creating a handle
/// ("CUBLAS_STATUS_ALLOC_FAILED"), both seen on an H200 shared by several
/// processes (2026-11-29).
bool is_out_of_memory(const std::exception& e);

/// The line of an out-of-memory error that says what was asked for
/// ("oomtune budget: tried to allocate ..." or CUDA's), else its first line.
std::string out_of_memory_message(const std::exception& e);

/// Set in the environment (OOMTUNE_FULL_ERRORS=1; unset or "0": off), the
/// errors below keep everything libtorch said: every line, the TorchScript
/// tracebacks, and the C++ backtrace (which PyTorch 2.x records with
/// TORCH_SHOW_CPP_STACKTRACES=1). For finding which kernel or autograd node
/// failed; a user is shown one line without it.
constexpr const char* kFullErrorsVariable = "OOMTUNE_FULL_ERRORS";

/// The message of `e` without libtorch's C++ backtrace (with it under
/// OOMTUNE_FULL_ERRORS).
std::string error_text(const std::exception& e);

/// The one line of a libtorch error message that says what went wrong: its
/// first line without the C++ stack trace, or, for an error raised inside a
/// TorchScript graph, the cause and the model's source line ("index out of
/// range in self (at model.py:83 in forward)"; model_session.cpp, Note
/// [TorchScript errors]); for an operator without a meta kernel, "aten::OP
/// (at modeling_x.py:NN in forward) has no meta kernel in libtorch VERSION
/// ...", or, for one whose result's size depends on values (nonzero,
/// unique, masked_select, bincount, repeat_interleave by a tensor, item),
/// "aten::OP (at ...): the size of its result depends on the tensor's
/// values, ..." (the model's line where the message has one). Under
/// OOMTUNE_FULL_ERRORS, `message` whole.
std::string one_line(const std::string& message);

/// What to change when a forward or backward failed on a dtype mix that
/// frozen_dtype = "bf16" caused: an operator that CPU autocast does not cast
/// (layer_norm, in libtorch 1.13 and 2.11) met a frozen bf16 weight and fp32
/// activations. Returns "; ..." to append to the error's one line, or ""
/// when `cause` (the one line) names no such mix ("BFloat16", "mixed
/// dtype") or the job keeps frozen parameters in fp32.
std::string frozen_bf16_hint(const JobSpec& job, const std::string& cause);

/// What to change when a value did not fit a tensor's dtype ("value cannot
/// be converted to type c10::BFloat16 without overflow", from masked_fill_
/// or fill_ on the CPU, CUDA and, since meta_kernels.h checks it too, meta):
/// a constant recorded by torch.jit.trace in fp32 (transformers' masks fill
/// with torch.finfo(dtype).min) met bf16 or fp16 activations, which eager
/// code would have filled with their own dtype's minimum. Returns "; ..."
/// to append to the error's one line, or "" for any other cause.
std::string constant_overflow_hint(const std::string& cause);

/// frozen_bf16_hint and constant_overflow_hint together.
std::string dtype_hints(const JobSpec& job, const std::string& cause);

}  // namespace oomtune
