#include "diagnose/frames.h"

#include <map>
#include <string_view>

#include <fmt/format.h>

#include "diagnose/fx_trace.h"

namespace oomtune::diagnose {
namespace {

// PyTorch's subpackages: a "torch/" directory under site-packages holding one
// of these is the torch package (torch/__init__.py of PyTorch 2.11 imports them).
constexpr std::string_view kTorchSubpackages[] = {"nn/",        "autograd/", "optim/",       "utils/",
                                                  "cuda/",      "amp/",      "distributed/", "_dynamo/",
                                                  "_inductor/", "fx/",       "_functorch/",  "_subclasses/",
                                                  "_refs/",     "_prims/",   "_decomp/",     "_higher_order_ops/",
                                                  "ao/",        "jit/",      "nested/",      "sparse/",
                                                  "backends/",  "profiler/", "export/",      "func/"};
// Files only PyTorch has: a "torch/" directory outside site-packages (a
// source checkout) is the torch package when a frame lies in one of these.
constexpr std::string_view kTorchOwnFiles[] = {
    "nn/modules/module.py", "nn/functional.py",     "nn/parameter.py",   "_tensor.py",         "_ops.py",
    "autograd/__init__.py", "autograd/function.py", "autograd/graph.py", "optim/optimizer.py", "utils/checkpoint.py"};
constexpr std::string_view kPackageDirs[] = {"site-packages/", "dist-packages/"};

bool starts_with(std::string_view text, std::string_view prefix) { return text.substr(0, prefix.size()) == prefix; }

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

bool has(std::string_view text, std::string_view part) { return text.find(part) != std::string_view::npos; }

std::string_view basename(std::string_view path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string_view::npos ? path : path.substr(slash + 1);
}

/// A "torch/" directory a frame's file lies in, and whether the frame says it is PyTorch's.
struct TorchCandidate {
  size_t root_end = std::string_view::npos;  ///< index just past "torch/"
  bool confirmed = false;
};

/// The innermost "torch/" directory of `file` (at its start or after a '/')
/// that is followed by one of PyTorch's subpackages or own files.
TorchCandidate torch_candidate(std::string_view file) {
  TorchCandidate c;
  for (size_t at = file.rfind("torch/"); at != std::string_view::npos;
       at = at == 0 ? std::string_view::npos : file.rfind("torch/", at - 1)) {
    if (at > 0 && file[at - 1] != '/') continue;
    const std::string_view rest = file.substr(at + 6);
    bool own = false;
    for (std::string_view f : kTorchOwnFiles) own = own || rest == f;
    bool sub = own;
    for (std::string_view s : kTorchSubpackages) sub = sub || starts_with(rest, s);
    if (!sub) continue;
    const std::string_view parent = file.substr(0, at);
    bool in_packages = false;
    for (std::string_view p : kPackageDirs) in_packages = in_packages || ends_with(parent, p);
    c.root_end = at + 6;
    c.confirmed = own || in_packages;
    return c;
  }
  return c;
}

/// Python standard library: "<frozen ...>", "<string>", ".../lib/pythonX.Y/..." but not its site- or dist-packages.
bool is_stdlib(std::string_view file) {
  if (starts_with(file, "<frozen") || file == "<string>") return true;
  for (size_t at = file.find("/lib/python"); at != std::string_view::npos; at = file.find("/lib/python", at + 1)) {
    size_t i = at + 11;
    size_t digits = 0;
    while (i < file.size() && ((file[i] >= '0' && file[i] <= '9') || file[i] == '.')) ++i, ++digits;
    if (digits == 0 || i >= file.size() || file[i] != '/') continue;
    const std::string_view rest = file.substr(i + 1);
    for (std::string_view p : kPackageDirs) {
      if (starts_with(rest, p)) return false;
    }
    return true;
  }
  return false;
}

/// The path inside site-packages/dist-packages ("transformers/models/bert/modeling_bert.py").
std::string_view library_path(std::string_view file) {
  size_t best = std::string_view::npos;
  for (std::string_view p : kPackageDirs) {
    const size_t at = file.rfind(p);
    if (at != std::string_view::npos && (best == std::string_view::npos || at + p.size() > best)) best = at + p.size();
  }
  return best == std::string_view::npos ? file : file.substr(best);
}

/// Code torch.compile generated: inductor's output code in its cache
/// directory ("/tmp/torchinductor_USER/dc/cdcf....py", torch/_inductor/
/// runtime/cache_dir_utils.py) or an FX GraphModule's ("<eval_with_key>.5",
/// or "fx_generated__HASH.py" with enrich_profiler_metadata: fx_trace.h;
/// torch/fx/graph_module.py).
bool is_generated(std::string_view file) {
  return starts_with(file, "<eval_with_key>") || starts_with(file, "torchinductor_") || has(file, "/torchinductor_") ||
         is_fx_generated_file(file);
}

/// A C/C++ frame of a stacks="all" snapshot (rules in frames.h): addr2line
/// names no file ("??", or "" in a library without a line table), or a
/// C/C++/CUDA/assembly source or header, or (addr2line off) the shared
/// library itself. Not by "does not end in .py": a script run without its
/// extension is Python.
bool is_native(std::string_view file) {
  if (file.empty() || file == "??" || has(file, ".so.")) return true;
  static constexpr std::string_view kNativeSuffixes[] = {".c",  ".cc",  ".cpp", ".cxx", ".c++", ".h",
                                                         ".hh", ".hpp", ".hxx", ".cu",  ".cuh", ".S",
                                                         ".s",  ".asm", ".tcc", ".inl", ".ipp", ".so"};
  for (std::string_view suffix : kNativeSuffixes)
    if (ends_with(file, suffix)) return true;
  return false;
}

/// A library file that defines a model's layers (see the rules in frames.h):
/// transformers/models/bert/modeling_bert.py, timm/models/vision_transformer.py,
/// timm/layers/mlp.py, torchvision/models/resnet.py, diffusers/models/... (not
/// transformers' shared modeling_utils.py, whose `to` moves any model).
bool is_model_file(std::string_view inside_library) {
  return has(inside_library, "/models/") || has(inside_library, "/layers/");
}

/// A frame as the rules see it: its origin and its path inside its package.
struct FrameClass {
  Origin origin = Origin::kUser;
  std::string_view path;  ///< inside the torch root for torch frames, inside site-packages for libraries
};

Phase phase_of_frame(const Frame& f, const FrameClass& c) {
  if (c.origin == Origin::kNative) return has(f.name, "torch::autograd::Engine::") ? Phase::kBackward : Phase::kUnknown;
  const std::string_view p = c.path;
  const bool torch = c.origin == Origin::kTorch;
  // User and library files: the path (inside site-packages for a library) names an optimizer.
  const bool optim_named = !torch && has(p, "optim");
  // DeepSpeed's engine.step and its optimizers (deepspeed/ops/adam/,
  // runtime/zero/), torch.amp's GradScaler.step and unscale_ and gradient
  // clipping (torch.nn.utils.clip_grad_norm_, which HF Trainer and
  // Accelerate call between the last backward and the step) name no
  // "optim": oomtune's optimizer phase begins after the last backward.
  const bool optimizer_step = (c.origin == Origin::kLibrary && starts_with(p, "deepspeed/") &&
                               (f.name == "step" || f.name == "_take_model_step")) ||
                              (torch && p == "amp/grad_scaler.py" && (f.name == "step" || f.name == "unscale_")) ||
                              (torch && p == "nn/utils/clip_grad.py");
  if ((torch && starts_with(p, "optim/")) || (c.origin == Origin::kLibrary && starts_with(p, "bitsandbytes/optim/")) ||
      ((f.name == "step" || f.name == "zero_grad") && optim_named) || optimizer_step) {
    return Phase::kOptimizer;
  }
  if (torch &&
      ((p == "_tensor.py" && f.name == "backward") ||
       (p == "autograd/__init__.py" && (f.name == "backward" || f.name == "grad")) ||
       (p == "autograd/graph.py" && f.name == "_engine_run_backward") ||
       (p == "utils/checkpoint.py" && (f.name == "backward" || f.name == "unpack_hook" || f.name == "recompute_fn")))) {
    return Phase::kBackward;
  }
  if ((torch && (starts_with(p, "nn/modules/") || p == "nn/functional.py")) || f.name == "forward") {
    return Phase::kForward;
  }
  return Phase::kOther;
}

/// A training framework's evaluation or prediction loop, which runs the
/// model without autograd: Hugging Face Trainer's evaluation_loop,
/// prediction_loop and prediction_step (transformers/trainer.py and
/// trainer_seq2seq.py; prediction_step runs the forward under
/// `with torch.no_grad():`, which leaves no frame) and Lightning's
/// evaluation and prediction loops (lightning/pytorch/loops/evaluation_loop.py,
/// prediction_loop.py in 2.x; pytorch_lightning/loops/epoch/evaluation_epoch_loop.py
/// and the like in 1.x), which run under loops/utilities.py _no_grad_context.
/// Checked against the stacks of transformers 5.24's Trainer.evaluate() and
/// Lightning 2.6's validation inside fit(), recorded on the CPU.
InferenceKind evaluation_loop(const Frame& f, const FrameClass& c) {
  if (c.origin != Origin::kLibrary) return InferenceKind::kNone;
  const std::string_view p = c.path;
  if (p == "transformers/trainer.py" || p == "transformers/trainer_seq2seq.py")
    return f.name == "evaluation_loop" || f.name == "prediction_loop" || f.name == "prediction_step"
               ? InferenceKind::kTrainerEvaluation
               : InferenceKind::kNone;
  if (!starts_with(p, "lightning/pytorch/loops/") && !starts_with(p, "pytorch_lightning/loops/"))
    return InferenceKind::kNone;
  const std::string_view file = basename(p);
  return starts_with(file, "evaluation") || starts_with(file, "prediction") ? InferenceKind::kLightningEvaluation
                                                                            : InferenceKind::kNone;
}

/// Hugging Face Trainer's concatenation of each evaluation step's outputs
/// onto those of the steps before (transformers/trainer_pt_utils.py
/// nested_concat, called by EvalLoopContainer.add in evaluation_loop, or by
/// evaluation_loop itself before transformers 4.40).
bool frame_concatenates_eval_outputs(const Frame& f, const FrameClass& c) {
  return c.origin == Origin::kLibrary && c.path == "transformers/trainer_pt_utils.py" && f.name == "nested_concat";
}

/// Hugging Face's from_pretrained loading a checkpoint's weights onto the
/// device (frames.h, Parameters).
bool frame_loads_weights(const Frame& f, const FrameClass& c) {
  return c.origin == Origin::kLibrary &&
         (c.path == "transformers/core_model_loading.py" ||
          (c.path == "transformers/modeling_utils.py" && f.name == "_load_state_dict_into_meta_model"));
}

/// A convolution's frame (FrameIndex::runs_convolution): torch's Conv*d
/// modules, or cuDNN's convolution in a stacks="all" snapshot
/// (aten/src/ATen/native/cudnn/Conv_v8.cpp: raw_cudnn_convolution_*,
/// run_conv_plan).
bool frame_runs_convolution(const Frame& f, const FrameClass& c) {
  if (c.origin == Origin::kTorch) return c.path == "nn/modules/conv.py";
  return c.origin == Origin::kNative && (has(f.name, "cudnn_convolution") || has(f.name, "run_conv_plan"));
}

/// A batch-size finder's frame: accelerate's find_executable_batch_size
/// (accelerate/utils/memory.py, whose inner `decorator` catches the error
/// and halves the batch) or Lightning's batch-size scaling
/// (lightning/pytorch/tuner/batch_size_scaling.py, pytorch_lightning/ in
/// 1.x).
BatchSizeFinder frame_batch_size_finder(const FrameClass& c) {
  if (c.origin != Origin::kLibrary) return BatchSizeFinder::kNone;
  if (c.path == "accelerate/utils/memory.py") return BatchSizeFinder::kAccelerate;
  if (c.path == "lightning/pytorch/tuner/batch_size_scaling.py" ||
      c.path == "pytorch_lightning/tuner/batch_size_scaling.py")
    return BatchSizeFinder::kLightning;
  return BatchSizeFinder::kNone;
}

/// torch's own frames that allocate parameters (frames.h, Parameters).
bool frame_allocates_parameters(const Frame& f, const FrameClass& c) {
  if (c.origin != Origin::kTorch) return false;
  const std::string_view p = c.path;
  if (p == "nn/parameter.py") return true;
  if (starts_with(p, "nn/modules/") && (f.name == "__init__" || f.name == "reset_parameters")) return true;
  return p == "nn/modules/module.py" && (f.name == "_apply" || f.name == "to" || f.name == "cuda");
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kUnknown:
      return "unknown";
    case Phase::kOther:
      return "other";
    case Phase::kForward:
      return "forward";
    case Phase::kBackward:
      return "backward";
    case Phase::kOptimizer:
      return "optimizer";
  }
  return "unknown";
}

const char* phase_prose(Phase phase) {
  switch (phase) {
    case Phase::kUnknown:
      return "code of no known phase";
    case Phase::kOther:
      return "code outside forward, backward and the optimizer step";
    case Phase::kForward:
      return "the forward phase";
    case Phase::kBackward:
      return "the backward phase";
    case Phase::kOptimizer:
      return "the optimizer phase";
  }
  return "code of no known phase";
}

const char* inference_kind_name(InferenceKind kind) {
  switch (kind) {
    case InferenceKind::kNone:
      return "none";
    case InferenceKind::kNoGrad:
      return "no_grad";
    case InferenceKind::kGenerate:
      return "generate";
    case InferenceKind::kTrainerEvaluation:
      return "trainer_evaluation";
    case InferenceKind::kLightningEvaluation:
      return "lightning_evaluation";
    case InferenceKind::kNothingSaved:
      return "nothing_saved";
  }
  return "none";
}

const char* origin_name(Origin origin) {
  switch (origin) {
    case Origin::kUser:
      return "user";
    case Origin::kLibrary:
      return "library";
    case Origin::kTorch:
      return "torch";
    case Origin::kStdlib:
      return "stdlib";
    case Origin::kNative:
      return "native";
    case Origin::kGenerated:
      return "generated";
  }
  return "user";
}

const char* batch_size_finder_name(BatchSizeFinder finder) {
  switch (finder) {
    case BatchSizeFinder::kNone:
      return "none";
    case BatchSizeFinder::kAccelerate:
      return "accelerate";
    case BatchSizeFinder::kLightning:
      return "lightning";
  }
  return "none";
}

FrameIndex::FrameIndex(const Snapshot& snapshot) : snapshot_(snapshot) {
  const std::vector<Frame>& frames = snapshot.frames;
  // The torch package roots, from the frames themselves.
  std::map<std::string, bool> roots;  // root -> confirmed
  for (const Frame& f : frames) {
    const TorchCandidate c = torch_candidate(f.filename);
    if (c.root_end == std::string_view::npos) continue;
    bool& confirmed = roots[f.filename.substr(0, c.root_end)];
    confirmed = confirmed || c.confirmed;
  }
  for (const auto& [root, confirmed] : roots) {
    if (confirmed) torch_roots_.push_back(root);
  }

  std::vector<FrameClass> cls(frames.size());
  frame_origin_.assign(frames.size(), Origin::kUser);
  std::vector<uint8_t> model_code(frames.size());
  std::vector<Phase> frame_phase(frames.size());
  std::vector<uint8_t> params(frames.size());
  std::vector<uint8_t> grad_decorator(frames.size());    // torch's grad-mode decorator (no_grad, inference_mode)
  std::vector<uint8_t> generation(frames.size());        // Hugging Face's generation code
  std::vector<InferenceKind> evaluation(frames.size());  // an evaluation loop's kind, or kNone
  std::vector<uint8_t> eval_outputs(frames.size());      // concatenates_eval_outputs
  std::vector<uint8_t> kv_cache(frames.size());          // stores_kv_cache
  std::vector<uint8_t> hf_trainer(frames.size());        // runs_hf_trainer
  std::vector<uint8_t> embedding(frames.size());         // runs_embedding
  frame_init_group_.assign(frames.size(), 0);
  frame_module_apply_.assign(frames.size(), 0);
  frame_default_device_.assign(frames.size(), 0);
  frame_loads_weights_.assign(frames.size(), 0);
  frame_convolution_.assign(frames.size(), 0);
  frame_graph_capture_.assign(frames.size(), 0);
  frame_empty_cache_.assign(frames.size(), 0);
  frame_batch_size_finder_.assign(frames.size(), BatchSizeFinder::kNone);
  std::vector<uint8_t> model_init(frames.size());              // a library model's __init__ (frames.h, Parameters)
  std::vector<uint8_t> optimizer_math(frames.size());          // runs_optimizer_math
  std::vector<const OptimizerKind*> optimizer(frames.size());  // optimizer
  std::vector<OptimizerImplementation> implementation(frames.size());  // optimizer_implementation
  for (size_t i = 0; i < frames.size(); ++i) {
    const std::string_view file = frames[i].filename;
    FrameClass& c = cls[i];
    c.path = file;
    bool torch = false;
    for (const std::string& root : torch_roots_) {
      if (starts_with(file, root) && (!torch || root.size() > file.size() - c.path.size())) {
        torch = true;
        c.path = file.substr(root.size());
      }
    }
    if (is_generated(file)) {
      c.origin = Origin::kGenerated;
      has_generated_ = true;
    } else if (is_native(file)) {
      c.origin = Origin::kNative;
      has_cpp_ = has_cpp_ || has(frames[i].name, "::");
    } else if (torch) {
      c.origin = Origin::kTorch;
    } else if (is_stdlib(file)) {
      c.origin = Origin::kStdlib;
    } else if (has(file, kPackageDirs[0]) || has(file, kPackageDirs[1])) {
      c.origin = Origin::kLibrary;
      c.path = library_path(file);
    }
    frame_origin_[i] = c.origin;
    model_code[i] = c.origin == Origin::kUser || (c.origin == Origin::kLibrary && is_model_file(c.path));
    frame_phase[i] = phase_of_frame(frames[i], c);
    frame_loads_weights_[i] = frame_loads_weights(frames[i], c);
    frame_convolution_[i] = frame_runs_convolution(frames[i], c);
    frame_graph_capture_[i] =
        c.origin == Origin::kTorch && (c.path == "cuda/graphs.py" || c.path == "_inductor/cudagraph_trees.py");
    frame_empty_cache_[i] = c.origin == Origin::kTorch && frames[i].name == "empty_cache" &&
                            (c.path == "cuda/memory.py" || c.path == "accelerator/memory.py");
    frame_batch_size_finder_[i] = frame_batch_size_finder(c);
    params[i] = frame_loads_weights_[i] || frame_allocates_parameters(frames[i], c);
    frame_module_apply_[i] =
        c.origin == Origin::kTorch && c.path == "nn/modules/module.py" && frames[i].name == "_apply";
    frame_default_device_[i] =
        c.origin == Origin::kTorch && c.path == "utils/_device.py" && frames[i].name == "__torch_function__";
    grad_decorator[i] = c.origin == Origin::kTorch && frames[i].name == "decorate_context" &&
                        (c.path == "utils/_contextlib.py" || c.path == "autograd/grad_mode.py");
    generation[i] = c.origin == Origin::kLibrary && starts_with(c.path, "transformers/generation/");
    evaluation[i] = evaluation_loop(frames[i], c);
    eval_outputs[i] = frame_concatenates_eval_outputs(frames[i], c);
    kv_cache[i] = c.origin == Origin::kLibrary && c.path == "transformers/cache_utils.py";
    hf_trainer[i] = c.origin == Origin::kLibrary && c.path == "transformers/trainer.py";
    embedding[i] = c.origin == Origin::kTorch && c.path == "nn/functional.py" && frames[i].name == "embedding";
    model_init[i] = c.origin == Origin::kLibrary && frames[i].name == "__init__" &&
                    (is_model_file(c.path) || c.path == "transformers/pytorch_utils.py");
    if (c.origin == Origin::kTorch && starts_with(c.path, "optim/")) {
      const std::string_view name = frames[i].name;
      frame_init_group_[i] = name == "_init_group";
      implementation[i] = starts_with(name, "_multi_tensor_")    ? OptimizerImplementation::kForeach
                          : starts_with(name, "_single_tensor_") ? OptimizerImplementation::kSingleTensor
                          : starts_with(name, "_fused_")         ? OptimizerImplementation::kFused
                                                                 : OptimizerImplementation::kUnknown;
    }
    optimizer[i] = c.origin == Origin::kTorch     ? torch_optimizer(c.path)
                   : c.origin == Origin::kLibrary ? library_optimizer(c.path)
                                                  : nullptr;
    optimizer_math[i] =
        implementation[i] != OptimizerImplementation::kUnknown && !(optimizer[i] && optimizer[i]->states_in_arithmetic);
  }

  const size_t n = snapshot.stacks.size();
  stack_phase_.assign(n, Phase::kUnknown);
  stack_layer_.assign(n, -1);
  stack_call_.assign(n, -1);
  stack_model_forward_.assign(n, -1);
  stack_params_.assign(n, 0);
  stack_python_.assign(n, 0);
  stack_checkpointed_.assign(n, 0);
  stack_recomputes_.assign(n, 0);
  stack_inference_.assign(n, InferenceKind::kNone);
  stack_eval_outputs_.assign(n, 0);
  stack_kv_cache_.assign(n, 0);
  stack_hf_trainer_.assign(n, 0);
  stack_embedding_.assign(n, 0);
  stack_optimizer_math_.assign(n, 0);
  stack_optimizer_.assign(n, nullptr);
  stack_implementation_.assign(n, OptimizerImplementation::kUnknown);
  auto outside_torch = [&](uint32_t f) {
    return frame_origin_[f] == Origin::kUser || frame_origin_[f] == Origin::kLibrary;
  };
  for (size_t s = 1; s < n; ++s) {
    const auto& stack = snapshot.stacks[s];
    if (stack.empty()) continue;
    Phase best = Phase::kUnknown;
    // Note [A closure inside the optimizer step]
    // Lightning's automatic optimization, LBFGS and SAM run forward and
    // backward in the closure the optimizer's step calls (torch.optim's
    // AdamW.step: `loss = closure()`), so torch/optim/ frames lie outer to
    // them. Backward or forward frames inner to the innermost optimizer
    // frame are the closure's phase; otherwise the optimizer wins.
    Phase inner_to_optimizer = Phase::kUnknown;  // the best phase met before any optimizer frame
    bool optimizer_seen = false;
    size_t outermost_forward = SIZE_MAX;  // position in the stack
    bool forward_inner = false;           // a forward frame met so far (inner to frame k)
    bool builds_model = false;            // a library model's __init__ frame
    for (size_t k = 0; k < stack.size(); ++k) {
      const uint32_t f = stack[k];
      const Phase p = frame_phase[f];
      if (frame_origin_[f] != Origin::kNative) stack_python_[s] = 1;
      if (frame_origin_[f] == Origin::kTorch && cls[f].path == "utils/checkpoint.py") {
        const std::string_view name = frames[f].name;
        if (name == "checkpoint") stack_checkpointed_[s] = 1;
        if (forward_inner && (name == "recompute_fn" || name == "unpack_hook" || name == "backward"))
          stack_recomputes_[s] = 1;
      }
      forward_inner = forward_inner || p == Phase::kForward;
      // Priority: optimizer > backward > forward > other > unknown.
      if (p == Phase::kOptimizer || (p == Phase::kBackward && best != Phase::kOptimizer) ||
          (p == Phase::kForward && (best == Phase::kOther || best == Phase::kUnknown)) ||
          (p == Phase::kOther && best == Phase::kUnknown)) {
        best = p;
      }
      if (!optimizer_seen) {  // frames come innermost first
        if (p == Phase::kOptimizer)
          optimizer_seen = true;
        else if (p == Phase::kBackward)
          inner_to_optimizer = p;
        // A module's call, not torch.nn.functional, which optimizers call too.
        else if (p == Phase::kForward && inner_to_optimizer != Phase::kBackward &&
                 !(frame_origin_[f] == Origin::kTorch && cls[f].path == "nn/functional.py"))
          inner_to_optimizer = p;
      }
      if (params[f]) stack_params_[s] = 1;
      builds_model = builds_model || model_init[f];
      if (eval_outputs[f]) stack_eval_outputs_[s] = 1;
      if (kv_cache[f]) stack_kv_cache_[s] = 1;
      if (hf_trainer[f]) stack_hf_trainer_[s] = 1;
      if (embedding[f]) stack_embedding_[s] = 1;
      if (optimizer_math[f]) stack_optimizer_math_[s] = 1;
      if (optimizer[f] && !stack_optimizer_[s]) stack_optimizer_[s] = optimizer[f];  // the innermost
      if (implementation[f] != OptimizerImplementation::kUnknown) stack_implementation_[s] = implementation[f];
      if (frames[f].name == "forward" && frame_origin_[f] != Origin::kNative) {
        outermost_forward = k;
        if (model_code[f]) stack_model_forward_[s] = f;
      }
    }
    if (optimizer_seen && (inner_to_optimizer == Phase::kForward || inner_to_optimizer == Phase::kBackward))
      best = inner_to_optimizer;  // Note [A closure inside the optimizer step]
    if (builds_model && outermost_forward == SIZE_MAX) stack_params_[s] = 1;
    // The engine calls a custom Function's backward (BackwardCFunction.apply
    // in torch/autograd/function.py) from C++: on its device thread that is
    // the outermost Python frame. Function.apply in a forward has callers.
    for (size_t k = stack.size(); k-- > 0;) {
      const uint32_t f = stack[k];
      if (frame_origin_[f] == Origin::kNative) continue;
      if (frame_origin_[f] == Origin::kTorch && cls[f].path == "autograd/function.py" && frames[f].name == "apply" &&
          best != Phase::kOptimizer)
        best = Phase::kBackward;
      break;
    }
    // Moving or creating weights (Module.to, a layer's __init__) is loading, not the forward pass.
    stack_phase_[s] = stack_params_[s] && best == Phase::kForward ? Phase::kOther : best;
    // Layer: innermost model code, else innermost user or library frame.
    for (uint32_t f : stack) {
      if (model_code[f]) {
        stack_layer_[s] = f;
        break;
      }
    }
    for (size_t k = 0; k < stack.size() && stack_layer_[s] < 0; ++k) {
      if (outside_torch(stack[k])) stack_layer_[s] = stack[k];
    }
    // Call site: innermost user frame outer to the model's forward; else the outermost user frame.
    const size_t from = outermost_forward == SIZE_MAX ? 0 : outermost_forward + 1;
    for (size_t k = from; k < stack.size(); ++k) {
      if (frame_origin_[stack[k]] == Origin::kUser) {
        stack_call_[s] = stack[k];
        break;
      }
    }
    // The decorator is enable_grad's too: LBFGS's step (decorated with
    // no_grad) runs its closure through torch.enable_grad()(closure), so a
    // stack with an optimizer frame is a training step's.
    for (size_t k = from; k < stack.size() && stack_inference_[s] == InferenceKind::kNone; ++k) {
      const uint32_t f = stack[k];
      stack_inference_[s] = generation[f]                           ? InferenceKind::kGenerate
                            : evaluation[f] != InferenceKind::kNone ? evaluation[f]
                            : grad_decorator[f] && !optimizer_seen  ? InferenceKind::kNoGrad
                                                                    : InferenceKind::kNone;
    }
    for (size_t k = stack.size(); k-- > 0 && stack_call_[s] < 0;) {
      if (frame_origin_[stack[k]] == Origin::kUser) stack_call_[s] = stack[k];
    }
  }
}

int64_t FrameIndex::optimizer_init_frame(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_init_group_[f]) return f;
  }
  return -1;
}

bool FrameIndex::loads_weights(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_loads_weights_[f]) return true;
  }
  return false;
}

bool FrameIndex::runs_convolution(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_convolution_[f]) return true;
  }
  return false;
}

bool FrameIndex::captures_cuda_graph(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_graph_capture_[f]) return true;
  }
  return false;
}

bool FrameIndex::calls_empty_cache(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_empty_cache_[f]) return true;
  }
  return false;
}

BatchSizeFinder FrameIndex::batch_size_finder(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_batch_size_finder_[f] != BatchSizeFinder::kNone) return frame_batch_size_finder_[f];
  }
  return BatchSizeFinder::kNone;
}

bool FrameIndex::under_default_device(StackId stack) const {
  for (uint32_t f : snapshot_.stack(stack)) {
    if (frame_default_device_[f]) return true;
  }
  return false;
}

int FrameIndex::module_apply_depth(StackId stack) const {
  int depth = 0;
  for (uint32_t f : snapshot_.stack(stack)) depth += frame_module_apply_[f];
  return depth;
}

std::string FrameIndex::describe(int64_t frame) const {
  if (frame < 0) return "(no user frame)";
  const Frame& f = snapshot_.frames[static_cast<size_t>(frame)];
  return fmt::format("{}:{} in {}", basename(f.filename), f.line, f.name);
}

}  // namespace oomtune::diagnose
