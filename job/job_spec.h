#pragma once
// JobSpec: what the user wants trained, read from a job TOML file
// (docs/job_spec.md has the full reference; examples/*.toml are examples).
// No libtorch here: dtypes are names, the session turns them into tensors.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "common/device.h"
#include "job/length_distribution.h"
#include "job/optimizer_implementation.h"
#include "job/parameter_selection.h"

namespace oomtune {

/// The shape dimension that stands for the batch.
constexpr int64_t kBatchDim = -1;
/// The shape dimension that stands for the sequence length ("seq"): the
/// job's `seq` key gives its length (JobSpec::seq_len).
constexpr int64_t kSeqDim = -2;

/// The longest sequence a job may ask for (COUNT, tokens): 2^24, above the
/// context of any model in use, so a mistyped length fails here rather than
/// as an allocation of T² attention scores.
constexpr int64_t kMaxSeqLen = int64_t{1} << 24;

/// The largest global batch a job may ask for (COUNT, samples per optimizer
/// step on one device): the search lists every valid micro-batch up to it,
/// so a mistyped 10^12 would otherwise run out of memory or never end.
/// 2^20, above any per-device batch in common use.
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 20;

/// One named model input (or loss target) generated for a trial.
struct InputSpec {
  std::string name;
  std::vector<int64_t> shape;     // kBatchDim marks the batch dimension (exactly one), kSeqDim the
                                  // sequence length (at most one)
  std::string dtype = "float32";  // float32, float16, bfloat16, float64, int64, int32, bool
  std::optional<double> low;      // range of values for ints: [low, high); floats: normal(0,1) if unset
  std::optional<double> high;
  /// Index of the batch dimension in `shape`.
  std::size_t batch_axis() const;
  /// Whether `shape` names "seq".
  bool has_seq() const;
};

/// Which part of the model's output the loss reads.
/// monostate: the model returns one tensor; string: a dict key ("logits",
/// "loss"); int64: a tuple index.
using OutputSelector = std::variant<std::monostate, std::string, int64_t>;

/// The loss of a training step.
struct LossSpec {
  enum class Kind {
    kCrossEntropy,      ///< cross_entropy(output, target) over the last dim, mean-reduced
    kMse,               ///< mse(output, target), mean-reduced
    kMean,              ///< mean of the output
    kModelReturnsLoss,  ///< the model output (or its "loss" key) is the loss
  };
  Kind kind = Kind::kMean;
  std::string target;  // name of the input used as target (cross_entropy, mse); not passed to forward
};

/// Optimizer named by the job (the baseline the strategies start from).
struct OptimizerSpec {
  std::string kind = "adamw";  // adamw, sgd
  double lr = 1e-3;
  double weight_decay = 0.01;  // AdamW: decoupled; SGD: L2
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double momentum = 0.0;  // SGD only
  // Gradient clipping before each update, torch.nn.utils.clip_grad_norm_'s
  // max_norm (L2 norm over all gradients; strategies/gradient_clipping.h);
  // 0: none, the default.
  double max_grad_norm = 0.0;
  // Which torch.optim implementation the user's training runs (TOML:
  // "foreach", "fused", "single_tensor"); default PyTorch's on CUDA.
  OptimizerImplementation implementation = kDefaultOptimizerImplementation;
};

/// The cuda_target values a job accepts, and the default (an H100).
inline const std::vector<std::string> kCudaTargetNames = {"sm75", "sm80", "sm86", "sm89", "sm90", "sm100", "sm120"};
constexpr const char* kDefaultCudaTargetName = "sm90";

/// A whole job: model, inputs, loss, batch, optimizer, device and budget.
struct JobSpec {
  std::string spec_path;   // the TOML file ("" when built in code)
  std::string model_path;  // absolute or relative to the cwd (resolved from the TOML's folder)
  std::vector<InputSpec>
      inputs;  // forward's arguments (Note [Forward arguments], session/forward_arguments.cpp); and the loss target
  OutputSelector output;
  LossSpec loss;
  int64_t global_batch = 1;  // COUNT: samples per optimizer step
  // The sequence length T of every "seq" dimension (COUNT, tokens): the
  // job's `seq = N`, or with `seq = [min, max]` the max (a step must hold
  // its longest batch); nullopt when no input names "seq". The probe sets it
  // to each length it measures (docs/sequence_length.md).
  std::optional<int64_t> seq_len;
  std::optional<int64_t> seq_min;  // COUNT: with `seq = [min, max]` or a distribution, its min; else nullopt
  // With `seq = { min, max, distribution = "uniform" }` or `seq = {
  // distribution = "histogram", file = "lengths.txt" }` (variable lengths,
  // issue #47 item 2): how each step's length is drawn, with `seed`
  // (job/length_distribution.h); seq_len and seq_min are then its longest
  // and shortest. The trials run their warm-up and measured step at seq_len
  // and every later step at a length drawn from it (trial/trial_runner.cpp,
  // Note [Variable-length steps]; docs/sequence_length.md, "Variable
  // lengths"). nullopt: every step at seq_len.
  std::optional<LengthDistribution> seq_lengths;
  std::string seq_lengths_file;  // the histogram's file (resolved from the TOML's folder), "" for uniform
  bool allow_remainder = false;  // global batch not divisible by the micro-batch: last one smaller
  OptimizerSpec optimizer;
  std::string precision = "fp32";       // fp32, bf16, fp16
  bool allow_bf16 = false;              // the search may switch precision to bf16
  bool allow_adafactor = false;         // the search may swap AdamW for Adafactor (strategies/adafactor.h)
  ParameterSelection trainable;         // trainable / frozen globs, frozen_dtype (job/parameter_selection.h)
  Device device = Device::kCpu;         // TOML: "cpu", "cuda", "meta"
  std::optional<int64_t> budget_bytes;  // memory budget (bytes); required by autotune
  double headroom = 0.05;               // fraction of the budget kept free, in [0, 0.9]
  // Host memory the training process may hold (bytes): optimizer offload's
  // fp32 masters, gradients and state live there (strategies/master_weights.h).
  // nullopt: not checked. The same headroom applies.
  std::optional<int64_t> host_budget_bytes;
  // host_budget_bytes is this machine's memory (default_host_budget), not the job's.
  bool host_budget_is_machines = false;
  int64_t min_micro_batch = 1;             // COUNT: the search never goes below
  std::optional<int64_t> max_micro_batch;  // COUNT: the search never goes above
  int64_t verify_steps = 20;               // COUNT: optimizer steps of a verification run
  double trial_timeout_seconds = 600;      // a trial past this is recorded as a timeout
  bool optimizing_executor = false;        // TorchScript graph-executor optimization (off = eager-like)
  uint64_t seed = 0;
  // The GPU the answers are for (probes/attention_model.h, CudaTarget):
  // TOML "sm75", "sm80", "sm86", "sm89", "sm90", "sm100" or "sm120"; it picks the
  // attention kernel and the cuBLAS workspace size.
  std::string cuda_target = kDefaultCudaTargetName;

  /// Inputs passed to forward (all but the loss target), in order.
  std::vector<const InputSpec*> model_inputs() const;
  /// Whether some input names "seq".
  bool has_seq() const;
  /// Every step at `length` tokens (COUNT): seq_len = length, no range or
  /// distribution left. No checks (apply_overrides checks --seq).
  void fix_seq_len(int64_t length);
  /// The budget minus headroom (bytes), or nullopt without a budget.
  std::optional<int64_t> usable_budget_bytes() const;
  /// The host budget minus headroom (bytes), or nullopt without one.
  std::optional<int64_t> usable_host_budget_bytes() const;
};

/// Reads and validates a job TOML file. Relative model paths are resolved
/// against the TOML file's folder.
/// Throws SpecError "FILE:LINE:COLUMN: KEY: what is wrong" for syntax errors,
/// missing or unknown keys (with the closest valid name), wrong types and
/// out-of-range values (among them a global_batch above kMaxGlobalBatch, an
/// input range its dtype cannot hold, an input with more bytes than a tensor
/// can hold at the global batch, optimizer values outside
/// job/hyper_parameters.h's ranges, both `trainable` and `frozen`, an
/// empty glob list, frozen_dtype = "bf16" without bf16 or bf16_params
/// precision; a shape with two "seq" dimensions, a shape naming "seq"
/// without a `seq` key, `seq` without an input naming it, a length < 1 or
/// above kMaxSeqLen, a range with min > max, a distribution table with an
/// unknown key or distribution, a uniform one without min and max, a
/// histogram with min or max or without file; see docs/job_spec.md), and
/// InputError when the file or a histogram file cannot be read (or holds a
/// line that is not a positive integer, or a length above kMaxSeqLen), is binary (a model file: common/text_file.h) or
/// is a plan.toml
/// ("FILE: is a plan ..., not a job spec; run its configuration with oomtune
/// probe --plan FILE").
JobSpec load_job_spec(const std::string& path);

/// Same, from TOML text; `origin` names the source in error messages.
JobSpec parse_job_spec(const std::string& text, const std::string& origin, const std::string& base_dir);

/// Command-line overrides, applied after the file (flags win over the file).
struct JobOverrides {
  std::optional<std::string> budget;       // human size, e.g. "8GiB"
  std::optional<std::string> host_budget;  // human size, e.g. "64GiB"
  std::optional<std::string> device;
  std::optional<int64_t> global_batch;
  std::optional<int64_t> min_micro_batch;
  std::optional<int64_t> max_micro_batch;  // e.g. host RAM of the data loader, CUDA launch limits
  std::optional<int64_t> seq_len;          // COUNT: tokens; replaces `seq` (a range or a distribution becomes
                                           // this one length)
};

/// A CUDA job trains on the machine whose GPU runs its trials: without a
/// host budget of its own (host_budget, --host-budget) it takes
/// `machine_bytes` (common/host_memory.h, machine_memory_bytes), the memory
/// optimizer offload's pinned state must fit there, and marks it
/// (host_budget_is_machines). A CPU or meta job answers for another
/// machine and keeps none. Throws nothing.
void default_host_budget(JobSpec& spec, std::optional<int64_t> machine_bytes);

/// Applies overrides. Throws InputError naming the flag for a bad value
/// (a count below 1, a --batch above kMaxGlobalBatch or one at which an
/// input would have more bytes than a tensor can hold, a --seq outside
/// [1, kMaxSeqLen] or for a job whose inputs name no "seq").
void apply_overrides(JobSpec& spec, const JobOverrides& overrides);

}  // namespace oomtune
