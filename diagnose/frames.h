#pragma once
// What a stack of Python frames says about an allocation.
//
// Rules (written down for users in docs/diagnose.md):
//   - Frames are classified by package, not by substrings of their path
//     (a virtual environment under ~/torch/ must not make the user's own
//     files PyTorch's):
//       torch:   under a *torch package root*: a directory "P/torch/" whose
//                frames show it holds PyTorch, i.e. P is a site-packages or
//                dist-packages directory and some frame lies in one of
//                PyTorch's subpackages (torch/nn/, torch/autograd/,
//                torch/optim/, ... kTorchSubpackages in frames.cpp), or
//                (a source checkout) some frame is one of PyTorch's own
//                files (torch/nn/modules/module.py, torch/_tensor.py, ...).
//                The roots are found once from the snapshot's own frames.
//       stdlib:  "<frozen ...>", "<string>", or under ".../lib/pythonX.Y/"
//                but not in its site-packages/dist-packages;
//       library: any other file under site-packages/ or dist-packages/;
//       native:  a C/C++ frame, which stacks="all", _record_memory_history's
//                default, records beside the Python ones: addr2line names
//                no file ("??", or "" in a library without a line table),
//                or a C/C++/CUDA/assembly source or header
//                ("python_engine.cpp", "./csu/../csu/libc-start.c"), or the
//                shared library (addr2line off); torch/csrc/profiler/unwind/
//                unwind.cpp, Symbolizer. TorchScript's builtins are "??"
//                too. They name no layer and no call site;
//       generated: code torch.compile generated, inductor's output code
//                in its cache ("/tmp/torchinductor_USER/dc/cdcf...py") or an
//                FX GraphModule's ("<eval_with_key>.5", "fx_generated__HASH.py").
//                It names no layer and no call site: a compiled region's
//                allocations go to the frame that called it (the compiled
//                module's forward, the script's backward line), unless the
//                snapshot carries the model source's stack of the FX node
//                (fx_original_trace: fx_trace.h), whose frames the snapshot
//                model puts right outside the generated one;
//       user:    everything else (the user's scripts and modules, and
//                libraries installed from a source checkout).
//   - *Model code* is a user frame, or a library frame in a model file:
//     a file under a models/ or layers/ directory of its package
//     (transformers/models/*/modeling_*.py, timm/models/, timm/layers/,
//     torchvision/models/, diffusers/models/).
//   - The *layer* of an allocation is its innermost model-code frame (else
//     its innermost user or library frame); the *call site* is the
//     innermost user frame outside the model's forward: outer to the
//     outermost frame named "forward", if there is one (the training
//     script's `loss = model(x)`, `loss.backward()` or `opt.step()` line;
//     the outermost user frame itself is the same `<module>` line for
//     every allocation). Without such a frame, the outermost user frame.
//   - Phase from frames, first match wins (torch paths are relative to the
//     torch package root):
//       optimizer: a frame in torch/optim/ or bitsandbytes/optim/, or a frame
//                  named "step" or "zero_grad" in a user or library file whose
//                  path (inside site-packages for a library) has "optim",
//                  or "step"/"_take_model_step" under deepspeed/ (its engine,
//                  ZeRO optimizers and FusedAdam), or torch/amp/grad_scaler.py
//                  "step";
//       backward:  torch/_tensor.py "backward", torch/autograd/__init__.py
//                  "backward" or "grad", torch/autograd/graph.py
//                  "_engine_run_backward" (backward called on this thread);
//                  torch/utils/checkpoint.py "backward", "unpack_hook" or
//                  "recompute_fn" (recomputation in backward; its
//                  "checkpoint" and "forward" run in forward: a
//                  recomputation's allocations are activations, see
//                  FrameIndex::recomputes); or
//                  torch/autograd/function.py "apply" as the stack's
//                  outermost Python frame (the engine's thread calling a
//                  custom Function's backward; Function.apply in a forward
//                  has Python callers). Other torch/autograd/ frames
//                  (grad_mode's decorators, Function.apply of flash-attn,
//                  bitsandbytes or checkpointing in forward) say nothing;
//       forward:   a frame in torch/nn/modules/ or torch/nn/functional.py, or
//                  a frame named "forward";
//       (native frames count only as backward, where one is a function of
//        torch::autograd::Engine: the autograd engine's thread; a stack of
//        other native frames alone is as a stack without frames)
//       (a backward frame, or a module's call, inner to the innermost
//        optimizer frame is a closure the step runs: Lightning, LBFGS, SAM;
//        Note [A closure inside the optimizer step], frames.cpp)
//       other:     Python frames, but none of the above (data loading, setup);
//       unknown:   no Python frames (none at all: stacks="python" records
//                  none for the autograd engine's C++ thread).
//   - Parameters: a frame named "__init__" or "reset_parameters" under
//     torch/nn/modules/, or "_apply" / "to" / "cuda" in torch/nn/modules/module.py
//     (Module.to(device) copies the weights), or torch/nn/parameter.py. Such a
//     stack's phase is "other" where it would be "forward" (its torch/nn/modules/
//     frames load the model; they do not run it). Also a frame named
//     "__init__" in a library's model file or transformers/pytorch_utils.py
//     in a stack with no frame named "forward": a model built on the device
//     (`with torch.device("cuda"):`) makes its own weights there, as
//     transformers' Conv1D (GPT-2's linear layers) does with
//     `nn.Parameter(torch.empty(nx, nf))`, the tensor made before
//     nn/parameter.py is called (recorded with scripts/record_cpu_snapshot.py).
//     And a model loaded with from_pretrained(..., device_map=...): any frame
//     of transformers/core_model_loading.py (5.x materializes each weight on
//     the device there, `_materialize_copy`, in a thread pool of its own:
//     GPT-2 small's 148 tensors on an H200, 2026-12-04,
//     scripts/record_hf_snapshot.py --pretrained), or 4.x's
//     `_load_state_dict_into_meta_model` in transformers/modeling_utils.py
//     (from its source, not recorded). The pool's threads interleave the
//     weights: their order is not the modules' (Note [Blocks from loaded
//     weights] counts their sizes instead).

#include <cstdint>
#include <string>
#include <vector>

#include "diagnose/optimizer_kind.h"
#include "diagnose/snapshot.h"

namespace oomtune::diagnose {

/// Training phase of an allocation or trace event.
enum class Phase : uint8_t { kUnknown, kOther, kForward, kBackward, kOptimizer };
constexpr int kNumPhases = 5;

/// "forward", "backward", "optimizer", "other", "unknown": the JSON's names.
const char* phase_name(Phase phase);

/// The phase as a report's sentences name it: "the forward phase", ...,
/// "code outside forward, backward and the optimizer step" (kOther: model
/// building, data loading, a script's own tensors), "code of no known phase"
/// (kUnknown: no Python frames). Never "the other phase".
const char* phase_prose(Phase phase);

/// What runs a forward without autograd (FrameIndex::inference_kind): the
/// frame that says so, innermost first outside the model's forward.
enum class InferenceKind : uint8_t {
  kNone,
  kNoGrad,               ///< a torch.no_grad()/inference_mode() decorator
  kGenerate,             ///< Hugging Face's generation code (generate())
  kTrainerEvaluation,    ///< Hugging Face Trainer's evaluation or prediction loop
  kLightningEvaluation,  ///< Lightning's evaluation or prediction loop
  kNothingSaved,         ///< no frame: the trace shows the blocks kept nothing (nothing_saved.h)
};

/// "none", "no_grad", "generate", "trainer_evaluation", "lightning_evaluation",
/// "nothing_saved" (JSON).
const char* inference_kind_name(InferenceKind kind);

/// Which package a frame's file belongs to (rules above).
enum class Origin : uint8_t { kUser, kLibrary, kTorch, kStdlib, kNative, kGenerated };

/// "user", "library", "torch", "stdlib", "native", "generated".
const char* origin_name(Origin origin);

/// What retries a function that ran out of memory with a smaller batch
/// (FrameIndex::batch_size_finder; caught_oom.h).
enum class BatchSizeFinder : uint8_t {
  kNone,
  kAccelerate,  ///< accelerate/utils/memory.py: find_executable_batch_size (Trainer's auto_find_batch_size)
  kLightning,   ///< Lightning's tuner/batch_size_scaling.py (BatchSizeFinder, Tuner.scale_batch_size)
};

/// "none", "accelerate", "lightning" (JSON).
const char* batch_size_finder_name(BatchSizeFinder finder);

/// Classifies frames once per distinct frame and stack (snapshots share stacks).
class FrameIndex {
 public:
  explicit FrameIndex(const Snapshot& snapshot);

  /// Phase from the frames alone (kUnknown for a stack without Python
  /// frames, unless an autograd engine frame makes it kBackward).
  Phase phase(StackId stack) const { return stack_phase_[stack]; }
  /// Whether the stack has a Python frame (not only native ones).
  bool has_python_frames(StackId stack) const { return stack_python_[stack] != 0; }
  /// The layer: innermost model-code frame, index into Snapshot::frames, or -1.
  int64_t layer_frame(StackId stack) const { return stack_layer_[stack]; }
  /// The call site: innermost user frame outside the model's forward, or -1.
  int64_t call_frame(StackId stack) const { return stack_call_[stack]; }
  /// The outermost model-code frame named "forward" (the model's forward), or -1.
  int64_t model_forward_frame(StackId stack) const { return stack_model_forward_[stack]; }
  /// True when the stack runs inside torch.utils.checkpoint's checkpoint()
  /// (a frame of torch/utils/checkpoint.py named "checkpoint": the forward
  /// of a checkpointed block, reentrant or not).
  bool checkpointed(StackId stack) const { return stack_checkpointed_[stack] != 0; }
  /// True when the stack reruns a checkpointed block's forward in backward:
  /// a forward frame (rules above) inner to a torch/utils/checkpoint.py
  /// frame named "recompute_fn" or "unpack_hook" (use_reentrant=False) or
  /// "backward" (use_reentrant=True, CheckpointFunction.backward). Its phase
  /// is backward; what it allocates is the block's activations again, not
  /// gradients (the nested backward of a reentrant block has no forward
  /// frame inner to checkpoint.py's).
  bool recomputes(StackId stack) const { return stack_recomputes_[stack] != 0; }
  /// True when the stack runs without autograd, as inference does: a frame
  /// of torch.no_grad()/torch.inference_mode() used as a decorator
  /// ("decorate_context" in torch/utils/_contextlib.py, 2.x, or
  /// torch/autograd/grad_mode.py, 1.13) or of Hugging Face's generation
  /// code (a file under transformers/generation/: `generate` is such a
  /// decorated function) outer to the model's outermost "forward" frame
  /// (anywhere, when there is none). A decorated helper inside a forward
  /// (rotary embeddings) does not count, nor a stack with an optimizer
  /// frame (LBFGS runs its closure through torch.enable_grad()(closure),
  /// whose decorator frame is the same). Also a frame of a training
  /// framework's evaluation or prediction loop, which runs the model under
  /// no_grad: Hugging Face Trainer's evaluation_loop, prediction_loop or
  /// prediction_step (transformers/trainer.py, trainer_seq2seq.py), a file
  /// of Lightning's loops/ named evaluation* or prediction* (validation
  /// inside fit() too). Elsewhere a `with torch.no_grad():` block leaves no
  /// frame, so it is not seen; a training step decorated with
  /// @torch.enable_grad() would read as inference.
  bool inference(StackId stack) const { return stack_inference_[stack] != InferenceKind::kNone; }
  /// Which of those: the innermost such frame outside the model's forward
  /// (generate() is itself a no_grad-decorated function: kGenerate).
  InferenceKind inference_kind(StackId stack) const { return stack_inference_[stack]; }
  /// True when the stack concatenates an evaluation step's outputs onto
  /// those of the steps before it: Hugging Face Trainer keeps every step's
  /// predictions, labels and losses on the device until the loop ends,
  /// or until eval_accumulation_steps moves them to the CPU (a frame of
  /// transformers/trainer_pt_utils.py named "nested_concat").
  bool concatenates_eval_outputs(StackId stack) const { return stack_eval_outputs_[stack] != 0; }
  /// True when the stack stores keys and values in Hugging Face's KV cache
  /// (a frame of transformers/cache_utils.py: DynamicLayer.update's
  /// torch.cat in transformers 5.x), which keeps them across blocks with
  /// or without autograd.
  bool stores_kv_cache(StackId stack) const { return stack_kv_cache_[stack] != 0; }
  /// True when Hugging Face's Trainer runs the stack (a frame of
  /// transformers/trainer.py): its default optimizer is torch's fused
  /// AdamW (optim="adamw_torch_fused" with torch 2.8 or later,
  /// transformers 5.x training_args.py).
  bool runs_hf_trainer(StackId stack) const { return stack_hf_trainer_[stack] != 0; }
  /// True when the stack runs a torch.optim optimizer's arithmetic: a frame
  /// of torch/optim/ named _single_tensor_*, _multi_tensor_* or _fused_*
  /// (_multi_tensor_adam, _single_tensor_rmsprop, ...) of an optimizer
  /// whose states _init_group makes. Their allocations are the step's
  /// temporaries (the foreach implementation, CUDA's default, makes
  /// whole-list ones); SGD makes its momentum buffers in _single_tensor_sgd
  /// and _multi_tensor_sgd (OptimizerKind::states_in_arithmetic), so its
  /// arithmetic stays its state.
  bool runs_optimizer_math(StackId stack) const { return stack_optimizer_math_[stack] != 0; }
  /// The optimizer whose file (torch/optim/rmsprop.py, ...; one kind for
  /// bitsandbytes/optim/, library_optimizer) the stack's innermost such
  /// frame is in; nullptr for none (a stack outside them, an optimizer of
  /// another package).
  const OptimizerKind* optimizer(StackId stack) const { return stack_optimizer_[stack]; }
  /// How the stack runs a torch.optim optimizer's arithmetic (a frame of
  /// torch/optim/ named _multi_tensor_*, _single_tensor_* or _fused_*,
  /// SGD's too); kUnknown outside it.
  OptimizerImplementation optimizer_implementation(StackId stack) const { return stack_implementation_[stack]; }
  /// The innermost frame (index into Snapshot::frames) of a torch.optim
  /// optimizer's lazy state initialisation, a frame of torch/optim/ named
  /// "_init_group" (torch 2.x), or -1. Each source line of it makes one
  /// kind of state for every parameter. Walks the stack on each call.
  int64_t optimizer_init_frame(StackId stack) const;
  /// True when the stack runs torch.nn.functional.embedding (a frame of
  /// torch/nn/functional.py named "embedding"): what it allocates is an
  /// embedding's output.
  bool runs_embedding(StackId stack) const { return stack_embedding_[stack] != 0; }
  /// True when the stack loads a checkpoint's weight onto the device:
  /// from_pretrained's loading frames (the rules above, Parameters).
  bool loads_weights(StackId stack) const;
  /// True when the stack made its tensor under a default device: a frame
  /// of torch/utils/_device.py named "__torch_function__" (the
  /// DeviceContext mode of `with torch.device(...)` and
  /// torch.set_default_device), which puts a tensor made without a device
  /// argument, torch.tensor(0.0) too, on that device.
  bool under_default_device(StackId stack) const;
  /// How many frames of torch's Module._apply (torch/nn/modules/module.py,
  /// "_apply") the stack holds: for a parameter moved with .to() or
  /// .cuda(), one per module from the one moved down to the parameter's
  /// own (_apply recurses into the children), so the parameter's depth in
  /// the model; 0 for one made where it lives. Walks the stack on each call.
  int module_apply_depth(StackId stack) const;
  /// True when the stack runs a convolution: a frame of torch's
  /// nn/modules/conv.py, or (stacks="all") a native frame of cuDNN's
  /// convolution ("cudnn_convolution" or "run_conv_plan" in its name), where
  /// a CUDA run allocates the output and then cuDNN's workspace
  /// (caught_oom.h). Walks the stack on each call.
  bool runs_convolution(StackId stack) const;
  /// True when the stack records a CUDA graph, whose allocations come from
  /// the graph's private memory pool: torch.cuda.graph's capture
  /// (torch/cuda/graphs.py) or torch.compile's CUDA graph trees recording
  /// (torch/_inductor/cudagraph_trees.py). Walks the stack on each call.
  bool captures_cuda_graph(StackId stack) const;
  /// True when the stack is the program's torch.cuda.empty_cache() call
  /// (torch/cuda/memory.py or torch/accelerator/memory.py, "empty_cache"):
  /// the segment_free events emptyCache() records carry its Python stack
  /// (CUDACachingAllocator.cpp, emptyCache: maybeGatherContext(
  /// RecordContext::ALL)) when recorded with context="all", the default;
  /// a flush inside malloc carries the allocating call's. Walks the stack.
  bool calls_empty_cache(StackId stack) const;
  /// The batch-size finder the stack runs under, outermost frames too; kNone
  /// for none. Walks the stack on each call.
  BatchSizeFinder batch_size_finder(StackId stack) const;
  /// True when the stack allocates parameters (see the rules above).
  bool allocates_parameters(StackId stack) const { return stack_params_[stack] != 0; }

  /// Where frame `frame` (index into Snapshot::frames) lives.
  Origin origin(int64_t frame) const { return frame_origin_[static_cast<size_t>(frame)]; }
  /// Whether any native frame names a C++ function ("::" in its name): a
  /// stacks="all" snapshot. TorchScript's builtins are native frames too
  /// ("??", "dropout"), which stacks="python" records for a scripted model.
  bool has_cpp_frames() const { return has_cpp_; }
  /// Whether any frame is code torch.compile generated (rules above).
  bool has_generated_frames() const { return has_generated_; }
  /// The torch package roots found ("/venv/lib/python3.12/site-packages/torch/"), in order found.
  const std::vector<std::string>& torch_roots() const { return torch_roots_; }

  /// "file.py:35 in forward" for a frame index; "(no user frame)" for -1.
  std::string describe(int64_t frame) const;

 private:
  const Snapshot& snapshot_;
  std::vector<std::string> torch_roots_;
  std::vector<Origin> frame_origin_;
  std::vector<uint8_t> frame_init_group_;      // a torch/optim/ frame named _init_group
  std::vector<uint8_t> frame_module_apply_;    // torch/nn/modules/module.py's _apply
  std::vector<uint8_t> frame_default_device_;  // torch/utils/_device.py's __torch_function__
  std::vector<uint8_t> frame_loads_weights_;   // from_pretrained's loading (rules above)
  std::vector<uint8_t> frame_convolution_;     // runs_convolution
  std::vector<uint8_t> frame_graph_capture_;   // captures_cuda_graph
  std::vector<uint8_t> frame_empty_cache_;     // calls_empty_cache
  std::vector<BatchSizeFinder> frame_batch_size_finder_;
  std::vector<Phase> stack_phase_;
  std::vector<int64_t> stack_layer_;
  std::vector<int64_t> stack_call_;
  std::vector<int64_t> stack_model_forward_;
  std::vector<uint8_t> stack_params_;
  std::vector<uint8_t> stack_python_;
  std::vector<uint8_t> stack_checkpointed_;
  std::vector<uint8_t> stack_recomputes_;
  std::vector<InferenceKind> stack_inference_;
  std::vector<uint8_t> stack_eval_outputs_;
  std::vector<uint8_t> stack_kv_cache_;
  std::vector<uint8_t> stack_hf_trainer_;
  std::vector<uint8_t> stack_embedding_;
  std::vector<uint8_t> stack_optimizer_math_;
  std::vector<const OptimizerKind*> stack_optimizer_;
  std::vector<OptimizerImplementation> stack_implementation_;
  bool has_cpp_ = false;
  bool has_generated_ = false;
};

}  // namespace oomtune::diagnose
