#include "trial/trial_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>
#include <torch/cuda.h>

#include "allocsim/caching_allocator_sim.h"
#include "allocsim/interchangeable_allocations.h"
#include "allocsim/step_events_json.h"
#include "common/atomic_file.h"
#include "common/error.h"
#include "common/json_text.h"
#include "compat/torch_compat.h"
#include "job/length_distribution.h"
#include "probes/backward_activation_peak.h"
#include "probes/cuda_device.h"
#include "probes/device_stream.h"
#include "probes/memory_tracker.h"
#include "probes/meta_kernels.h"
#include "probes/peak_composition.h"
#include "session/batch.h"
#include "session/cuda_autocast.h"
#include "session/model_session.h"
#include "strategies/activation_checkpointing.h"
#include "strategies/attention_op.h"
#include "strategies/dropout_op.h"
#include "strategies/master_weights.h"
#include "strategies/mixed_precision.h"
#include "strategies/recompute_op.h"
#include "strategies/training_step.h"
#include "trial/cublas_workspaces.h"
#include "trial/cuda_measurement.h"

namespace oomtune {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

// The last `pairs` consecutive step times agree within `tolerance` of the median.
bool steady(const std::vector<double>& times, int64_t pairs, double tolerance) {
  if (static_cast<int64_t>(times.size()) < pairs + 1) return false;
  const double m = median(times);
  for (std::size_t i = times.size() - static_cast<std::size_t>(pairs); i < times.size(); ++i)
    if (std::fabs(times[i] - times[i - 1]) > tolerance * m) return false;
  return true;
}

double mean(const std::vector<double>& values, std::size_t first) {
  if (first >= values.size()) return 0;
  double sum = 0;
  for (std::size_t i = first; i < values.size(); ++i) sum += values[i];
  return sum / static_cast<double>(values.size() - first);
}

// Note [Variable-length steps]
// Rationale: with seq = { min, max, distribution } (job/length_distribution.h)
// the steps of a training run differ in length, and so do their peaks and
// times: what must fit is the longest step, what the user waits for is the
// mean step, and the caching allocator sees the lengths in turn.
// Approach: step 1 (warm-up) and step 2 (the measured step: its phases,
// retained activations, backward's peak, --step-events) run at job.seq_len,
// the distribution's max, so the per-phase peaks are those of the step that
// must fit and compare with a fixed-length trial at max. Step k >= 3 runs at
// draw_lengths(distribution, n, job.seed)[k - 3]: its global batch is made
// again at that length in host memory, the previous one freed first (one
// batch at a time, as a data loader hands them out). Every micro-batch of a
// step is a slice of that batch and shares its length: a step is one batch
// padded to its longest and split for accumulation, and so configurations
// with other micro-batches and accumulation steps run the same tokens per
// optimizer step at the same index (a draw per micro-batch would give a
// configuration of more micro-batches other lengths, and their samples/s
// would not compare). The draws depend on the seed and the index alone (a
// shorter draw is a prefix of a longer one), so every trial of a job, each
// probe and each verification, runs the same length at the same step.
// Timing: steps at different lengths take different times, so the early
// stop on consecutive step times agreeing is off: a trial runs 2 +
// max_timed_steps steps (total_steps for a verification), and the step and
// optimizer seconds are the means over the drawn steps (3 on), so
// samples_per_second is their samples over their seconds (a median would
// pick one length's time). `steady` is not judged (false): seconds per
// token is no steady figure either, since attention's T² and the
// optimizer's fixed time make it vary with the length.
// Limitations: a probe times max_timed_steps draws, a small sample of the
// distribution; a verification verify_steps - 2 draws; the search compares
// verifications with verifications (search/choose.cpp), all on the same
// draws. With no drawn step (total_steps 2, or max_timed_steps 0) the time
// is the measured step's, at max.

// The device peak of each step's events[begin, end), live bytes followed
// from the first event (the tracker's stream starts empty). Bytes, one per
// range; the ranges ascend.
std::vector<int64_t> step_device_peaks(const std::vector<TrackedEvent>& events,
                                       const std::vector<std::pair<std::size_t, std::size_t>>& steps) {
  std::vector<int64_t> peaks;
  int64_t live = 0;
  std::size_t i = 0;
  auto apply = [&](const TrackedEvent& e) {
    if (e.pool == MemoryPool::kDevice) live += e.kind == TrackedEvent::Kind::kAlloc ? e.bytes : -e.bytes;
  };
  for (const auto& [begin, end] : steps) {
    for (; i < begin && i < events.size(); ++i) apply(events[i]);
    int64_t peak = live;
    for (; i < end && i < events.size(); ++i) {
      apply(events[i]);
      peak = std::max(peak, live);
    }
    peaks.push_back(peak);
  }
  return peaks;
}

int64_t storage_bytes(const MemoryTracker& tracker, const std::vector<at::Tensor>& tensors) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const at::Tensor& t : tensors) {
    if (!t.defined()) continue;
    const void* data = t.storage().data();
    if (seen.insert(data).second) bytes += tracker.block_bytes(data);
  }
  return bytes;
}

// Note [Skipped fp16 steps]
// Rationale: under fp16, GradScaler skips the update of a step whose scaled
// gradients hold an inf or a NaN and halves its scale (2^16 at first), and
// a run's first steps often overflow. A skipped step makes no optimizer
// state (AdamW's comes with the first update) and no update temporaries: a
// warm-up that skipped left the measured step to make the state, and a
// measured step that skipped measured no update at all. (A fused optimizer,
// which GradScaler hands the scale, runs its kernel on every step and makes
// the state on the first, skipped or not; its update allocates nothing, so
// the same rule measures the same bytes for it.)
// Approach: the warm-up repeats until a step updates, as a GPU run's first
// steps do, and counts the skipped ones (ProbeReport::skipped_steps); after
// kMaxSkippedWarmups in a row (the scale down to 2^-7) the model does not
// train in fp16 and the trial says so. A later skipped step is counted, and
// the measured step's is reported (ProbeReport::measured_step_skipped).
// Meta has no values to overflow: it never skips.
constexpr int64_t kMaxSkippedWarmups = 24;

// Note [Loader records]
// Loading a TorchScript file reads each record of its archive through the
// CPU allocator (caffe2::serialize::PyTorchStreamReader::getRecord). A
// tensor's record becomes its storage; of the others the module keeps some
// alive for good: its code and debug records (the .debug_pkl source ranges
// behind "at model.py:83 in forward", which name the exporting machine's
// paths). That is libtorch's host memory on every device, no part of what
// training allocates, yet counted it was a CPU trial's "buffers" and part
// of every peak, and a meta trial's host line, by a size that depends on
// where the file was exported (the LoRA fixture's host line on meta: 192.96
// KiB here, 200.22 KiB from a checkout at a longer path). After loading,
// every block made since that backs no tensor the model holds is forgotten.
// So are the records read and freed during the load: a GPU's caching
// allocator never sees them (the loader reads into host memory and copies
// the tensors to the device), and in the event stream that predicted
// reserved bytes replay, they took the small pool's first segment (the
// example GPT under bf16 autocast: 2 MiB more reserved on the CPU than on
// meta, whose loader reads on the CPU, which a meta trial counts as host).
void forget_loader_records(MemoryTracker& tracker, const MemoryTracker::Mark& before_load,
                           const ModelSession& session) {
  std::unordered_set<const void*> held;
  for (const at::Tensor& t : session.held_tensors()) held.insert(t.storage().data());
  tracker.forget_blocks_since(before_load, held);
}

std::vector<at::Tensor> gradients(const ModelSession& session) {
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : session.parameters()) grads.push_back(p.grad());
  return grads;
}

// The trainable parameters without a gradient after backward, by name (the
// module's, first name of a tied tensor), and their elements.
void record_parameters_without_gradient(const ModelSession& session, StaticMemory& memory) {
  std::unordered_set<const c10::TensorImpl*> missing;
  for (const at::Tensor& p : session.parameters())
    if (!p.grad().defined()) missing.insert(p.unsafeGetTensorImpl());
  if (missing.empty()) return;
  for (const auto& named : session.module().named_parameters(/*recurse=*/true)) {
    if (missing.erase(named.value.unsafeGetTensorImpl()) == 0) continue;
    memory.without_gradient.push_back(named.name);
    memory.without_gradient_count += named.value.numel();
  }
}

// The addresses of the gradients' storages, as the tracker records blocks.
std::unordered_set<uint64_t> gradient_blocks(const ModelSession& session) {
  std::unordered_set<uint64_t> blocks;
  for (const at::Tensor& g : gradients(session))
    if (g.defined()) blocks.insert(reinterpret_cast<uint64_t>(g.storage().data()));
  return blocks;
}

// Replays the trial's device allocations events[0, end) through the CUDA
// caching-allocator simulator: what a GPU would have reserved for the same
// run, whichever order the CPU's kernels made equal-size blocks in
// (allocsim/interchangeable_allocations.h). A CUDA trial's events are the
// allocator's own (`device_order`): replayed as they came, its prediction
// checks the simulator against the allocator's measured figures. The
// step-events file and the length model keep the recorded order: the model
// pairs the events of runs at several lengths by position, and a reordering
// that depends on which sizes happen to be equal at one length would break
// that pairing.
// On the CPU and on meta, `workspaces` are the cuBLAS workspaces a CUDA
// run would allocate beside the tensors (cublas_workspaces.h); a CUDA
// trial's events hold them already.
//
// Note [The budget on a CUDA target]
// Rationale: a trial on the CPU or on meta stands in for a CUDA run, whose
// budget caps what the caching allocator reserves, cuBLAS workspaces and
// cached free blocks included, not the tensors alone. Replayed with the cap
// from the start, a request that does not fit is skipped and the replay
// goes on, so its reserved peak stays under the cap whatever the step
// needs: the GPT example at a 150 MiB budget (142.50 MiB usable) showed
// 142.00 MiB predicted reserved while its tensors and workspaces alone
// held 194.79 MiB.
// Approach: the figures come from a replay with no cap; only when its peak
// passes the budget does a capped replay run, which frees the cache and
// retries as PyTorch does, and says whether every request was served, how
// many flushes that took, or the first request that failed.
ReservedPrediction predict_reserved(const std::vector<TrackedEvent>& events, std::size_t end,
                                    std::optional<int64_t> budget_bytes, const CublasCalls& workspaces,
                                    int64_t workspace_bytes, int64_t lt_workspace_bytes,
                                    const std::vector<std::string>& op_names, bool device_order) {
  // The workspaces' requests carry a name of their own: a capped replay
  // that fails at one says what asked for it, not "(unknown)".
  std::vector<std::string> names = op_names;
  const auto workspace_op = static_cast<uint32_t>(names.size());
  names.emplace_back("cuBLAS (its handle's workspace)");  // and cuBLASLt's
  // Two statements: the call moves `end`, and an argument list would not
  // say whether device_stream reads it before or after.
  const std::vector<TrackedEvent> with_workspaces =
      with_cublas_workspaces(events, workspaces, workspace_bytes, lt_workspace_bytes, workspace_op, end);
  std::vector<allocsim::AllocEvent> stream = device_stream(with_workspaces, 0, end, &names);
  if (!device_order) allocsim::order_interchangeable_allocations(stream);
  const allocsim::SimResult sim = allocsim::replay(stream, allocsim::SimOptions{});
  ReservedPrediction prediction;
  prediction.peak_reserved_bytes = sim.peak_reserved_bytes;
  prediction.reserved_minus_allocated_bytes = sim.fragmentation_at_peak_bytes;
  prediction.largest_free_block_bytes = sim.largest_free_block_at_peak_bytes;
  prediction.segment_allocations = sim.num_device_alloc;
  prediction.budget_bytes = budget_bytes.value_or(0);
  // Note [The budget on a CUDA target]
  if (prediction.budget_bytes > 0 && sim.peak_reserved_bytes > prediction.budget_bytes) {
    allocsim::SimOptions capped;
    capped.budget_bytes = prediction.budget_bytes;
    const allocsim::SimResult under = allocsim::replay(stream, capped);
    prediction.fits_budget = !under.oom;
    prediction.cache_flushes = under.num_alloc_retries;
    if (under.oom) {
      const allocsim::OomRecord& failed = under.ooms.front();
      prediction.failed_request_bytes = failed.requested_bytes;
      prediction.failed_op = failed.op;
      prediction.failed_phase = stream[static_cast<std::size_t>(failed.event_index)].phase;
    }
  }
  return prediction;
}

// The bytes of the device allocations alive when events[begin] happens that
// events[begin, end) does not free (weights, buffers, optimizer state, and
// gradients that zero_grad keeps), in the order they were made. A free in
// the range names an allocation from before it unless the range itself
// made that address first (addresses are reused).
std::vector<int64_t> persistent_bytes(const std::vector<TrackedEvent>& events, std::size_t begin, std::size_t end) {
  std::unordered_map<uint64_t, std::size_t> live;  // address -> index of its alloc
  for (std::size_t i = 0; i < begin && i < events.size(); ++i) {
    const TrackedEvent& e = events[i];
    if (e.pool != MemoryPool::kDevice) continue;
    if (e.kind == TrackedEvent::Kind::kAlloc)
      live[e.address] = i;
    else
      live.erase(e.address);
  }
  std::unordered_set<uint64_t> made_in_range;
  for (std::size_t i = begin; i < end && i < events.size(); ++i) {
    const TrackedEvent& e = events[i];
    if (e.pool != MemoryPool::kDevice) continue;
    if (e.kind == TrackedEvent::Kind::kAlloc)
      made_in_range.insert(e.address);
    else if (made_in_range.erase(e.address) == 0)
      live.erase(e.address);  // carried in: freed by the step
  }
  std::vector<std::size_t> order;
  for (const auto& [address, index] : live) order.push_back(index);
  std::sort(order.begin(), order.end());
  std::vector<int64_t> bytes;
  for (std::size_t index : order) bytes.push_back(events[index].bytes);
  return bytes;
}

// Writes the device events [begin, end) (the measured step) and the
// allocations alive throughout it as a step-events file
// (allocsim/step_events_json.h), atomically.
void write_step_events(const std::string& path, const std::vector<TrackedEvent>& events, std::size_t begin,
                       std::size_t end, const std::vector<std::string>& op_names) {
  const allocsim::StepEvents step{device_stream(events, begin, end, &op_names), persistent_bytes(events, begin, end)};
  write_file_atomically(path, json_text(allocsim::step_events_json(step)) + "\n");
}

// A configuration that cannot be applied to this model (a ConfigError's
// case, exit 2): the blocks of `refused_class` cannot be checkpointed. The
// report names the class and the chosen blocks a retry can checkpoint instead.
void refuse_checkpoint(ProbeReport& report, const std::string& message, Phase phase, const std::string& refused_class,
                       const std::vector<std::string>& other_blocks) {
  report.outcome = TrialOutcome::kError;
  report.input_error = true;
  report.message = one_line(message);
  report.phase_at_failure = phase;
  report.refused_checkpoint_class = refused_class;
  report.other_checkpointed_blocks = other_blocks;
}

}  // namespace

void require_cuda_trial(const JobSpec& job) {
  if (job.device != Device::kCuda) return;
  const std::string job_name = job.spec_path.empty() ? job.model_path : job.spec_path;
#ifdef OOMTUNE_WITH_CUDA
  const std::string problem = cuda_device_problem(read_cuda_device_facts());
  if (!problem.empty()) throw InputError(fmt::format("{}: device = \"cuda\", but {}", job_name, problem));
#else
  // The command refuses it first (require_device_support); a request made
  // by hand reaches here.
  throw InputError(
      fmt::format("{}: device = \"cuda\", but this trial module is built against libtorch {} without "
                  "CUDA; build against PyTorch with CUDA (OOMTUNE_TORCH=pypi ./setup.sh)",
                  job_name, compat::torch_version()));
#endif
}

void require_meta_trial(const JobSpec& job) {
  if (job.device != Device::kMeta || compat::kMetaDeviceCounted) return;
  throw InputError(
      fmt::format("{}: {}", job.spec_path.empty() ? job.model_path : job.spec_path, compat::meta_device_problem()));
}

ProbeReport run_trial(const JobSpec& job, const TrainingConfig& requested, const TrialOptions& options) {
  require_cuda_trial(job);
  require_meta_trial(job);
  ProbeReport report;
  if (options.device_check_only) return report;
  const bool meta = job.device == Device::kMeta;
  const TrainingConfig config = normalize_config(requested, job);
  report.config = to_string(config);
  report.micro_batch = config.micro_batch;
  report.accumulation_steps = config.accumulation_steps;
  report.global_batch = job.global_batch;
  report.torch_version = compat::torch_version();
  report.optimizing_executor = job.optimizing_executor;
  report.precision_form = precision_form(config.precision);
  // Autocast on CPU and meta tensors is CUDA's, emulated, where this
  // libtorch has CUDA's lists (session/cuda_autocast.h); meta needs
  // libtorch 2 (require_meta_trial), which has them.
  if (autocast_dtype(config.precision) && job.device != Device::kCuda)
    report.autocast_lists = cuda_autocast_available() ? "cuda" : "cpu";
  report.optimizer.name = to_string(config.optimizer);
  if (const auto implementation = eager_implementation(config, job.optimizer))
    report.optimizer.implementation = to_string(*implementation);
  report.optimizer.max_grad_norm = job.optimizer.max_grad_norm;
  report.timing.tolerance = options.timing_tolerance;
  set_optimizing_executor(job.optimizing_executor);

  TrackerOptions tracker_options;
  const bool cuda = job.device == Device::kCuda;
  // The job's target (validated by the job reader): its cuBLAS workspace size.
  const CudaTarget cuda_target = cuda_target_from_name(job.cuda_target).value_or(CudaTarget{});
  if (options.enforce_budget && !cuda) tracker_options.budget_bytes = job.usable_budget_bytes();
  tracker_options.record_events = options.record_events;
  tracker_options.count_meta = meta;
  tracker_options.device_feed = cuda;
  if (meta) install_meta_kernels();
  MemoryTracker tracker(tracker_options);
  // On a GPU the caching allocator is capped at the budget and read per
  // phase; its blocks reach the tracker (trial/cuda_measurement.h).
  const std::unique_ptr<CudaMeasurement> device =
      cuda ? CudaMeasurement::start(
                 tracker, options.enforce_budget ? std::optional<int64_t>(job.usable_budget_bytes()) : std::nullopt,
                 !options.snapshot_path.empty())
           : nullptr;
  Phase current_phase = Phase::kLoad;
  std::vector<CheckpointedBlock> checkpointed;
  take_refused_block_class();  // none left over from an earlier trial in this process
  // Kernels run asynchronously on CUDA: the optimizer phase's time starts
  // once the backward queued before it has finished.
  Clock::time_point optimizer_start;
  // Phase boundaries of the memory records: the tracker's, and on a GPU
  // the allocator's counters too.
  auto begin_phase = [&](Phase phase) {
    tracker.begin_phase(phase);
    if (device) device->begin_phase(phase);
  };
  auto end_phase = [&] {
    tracker.end_phase();
    if (device) device->end_phase();
  };
  auto enter = [&](Phase phase) {
    current_phase = phase;
    if (phase == Phase::kOptimizer) {
      if (cuda) torch::cuda::synchronize();
      optimizer_start = Clock::now();
    }
    if (options.on_phase) options.on_phase(phase);
  };
  try {
    enter(Phase::kLoad);
    begin_phase(Phase::kLoad);
    const int64_t live_before_load = tracker.live_bytes();
    const MemoryTracker::Mark before_load = tracker.mark();
    ModelSession session(job);
    forget_loader_records(tracker, before_load, session);
    report.parameter_count = session.parameter_count();
    report.frozen_parameter_count = session.frozen_parameter_count();
    report.static_memory.parameter_bytes = storage_bytes(tracker, session.parameters());
    report.static_memory.frozen_parameter_bytes = storage_bytes(tracker, session.frozen_parameters());
    report.static_memory.buffer_bytes = tracker.live_bytes() - live_before_load - report.static_memory.parameter_bytes -
                                        report.static_memory.frozen_parameter_bytes;

    Batch batch;
    {
      HostMemoryScope host;
      batch = make_batch(job, job.global_batch, job.seed);
    }
    // Host bytes: the CPU allocator's, and on a GPU the pinned ones too
    // (offload's state lives there, from CUDA's host allocator).
    auto host_bytes = [&] {
      return tracker.live_bytes(MemoryPool::kHost) + (device ? device->pinned_host_bytes() : 0);
    };
    const int64_t host_before_optimizer = host_bytes();
    const int64_t live_before_step = tracker.live_bytes();
    TrainingStep step(session, config);
    checkpointed = step.checkpointed_blocks();
    report.checkpointed_blocks = paths_of(checkpointed);
    // bf16_params replaces the parameter and buffer storages with bf16 ones
    // and keeps fp32 masters on the device: measure the split again. The
    // device masters are optimizer state; other forms change nothing here.
    const MasterWeightOptimizer* master = step.master_weights();
    const int64_t device_master_bytes =
        master && master->placement() == MasterPlacement::kDevice ? storage_bytes(tracker, master->masters()) : 0;
    const int64_t parameter_bytes = storage_bytes(tracker, session.parameters());
    const int64_t frozen_bytes = storage_bytes(tracker, session.frozen_parameters());
    report.static_memory.buffer_bytes += tracker.live_bytes() - live_before_step - device_master_bytes -
                                         (parameter_bytes - report.static_memory.parameter_bytes) -
                                         (frozen_bytes - report.static_memory.frozen_parameter_bytes);
    report.static_memory.parameter_bytes = parameter_bytes;
    report.static_memory.frozen_parameter_bytes = frozen_bytes;

    // Step 1: warm-up; creates the optimizer state.
    int64_t live_before_update = 0;
    auto warmup_hook = [&](Phase phase) {
      enter(phase);
      begin_phase(phase);
      if (phase == Phase::kOptimizer) {
        report.static_memory.gradient_bytes = storage_bytes(tracker, gradients(session));
        record_parameters_without_gradient(session, report.static_memory);
        live_before_update = tracker.live_bytes() - report.static_memory.gradient_bytes - device_master_bytes;
      }
    };
    // fp16: the warm-up runs until a step updates (Note [Skipped fp16 steps]).
    auto start = Clock::now();
    for (;;) {
      if (job.seq_lengths) report.step_lengths.push_back(*job.seq_len);  // Note [Variable-length steps]
      const bool skipped = step.run(batch, warmup_hook).skipped;
      end_phase();
      ++report.timing.warmup_steps;
      report.steps_run = report.timing.warmup_steps;
      if (!skipped) break;
      if (++report.skipped_steps == kMaxSkippedWarmups)
        throw ModelError(fmt::format(
            "{}: fp16: the gradients of the first {} steps held an inf or a NaN at every loss scale GradScaler "
            "tried, from {:g} down to 2^{}: no step updated the parameters; the model does not train in fp16 "
            "(bf16 keeps fp32's range)",
            job.model_path, kMaxSkippedWarmups, DynamicLossScaler::kInitScale, 16 - kMaxSkippedWarmups + 1));
    }
    report.timing.warmup_seconds = seconds_since(start);
    report.static_memory.optimizer_state_bytes = tracker.live_bytes() - live_before_update;
    report.static_memory.optimizer_host_bytes = host_bytes() - host_before_optimizer;

    // Step 2: the measured step. Later steps: timing only.
    tracker.reset_statistics();
    if (device) device->reset_statistics();
    take_attention_record();  // the warm-up's calls
    take_dropout_record();
    int64_t live_at_forward = -1, live_at_backward = 0;
    bool retained_done = false;
    // Backward's events (one micro-batch: the range holds its backward only)
    // and the gradients it made, for its activation peak.
    std::size_t backward_begin = 0, backward_end = 0;
    // The measured step's events, for --step-events.
    std::size_t measured_begin = 0, measured_end = 0;
    std::unordered_set<uint64_t> new_gradients;
    auto measured_hook = [&](Phase phase) {
      enter(phase);
      begin_phase(phase);
      if (phase == Phase::kForward && live_at_forward < 0) live_at_forward = tracker.live_bytes();
      if (phase == Phase::kBackward && !retained_done) {
        live_at_backward = tracker.live_bytes();
        report.retained_activation_bytes = live_at_backward - live_at_forward;
        backward_begin = tracker.event_count();
        retained_done = true;
      }
      if (phase == Phase::kOptimizer) {
        backward_end = tracker.event_count();
        new_gradients = gradient_blocks(session);
      }
    };
    auto timing_hook = [&](Phase phase) { enter(phase); };
    // Steps 3.. at drawn lengths, each step's events for its peak (Note
    // [Variable-length steps]).
    const bool variable = job.seq_lengths.has_value();
    // On meta, the steps whose allocations a CPU trial's reserved bytes are
    // predicted from (below): no time to wait for.
    const int64_t max_steps = options.total_steps > 0 ? options.total_steps
                              : meta && !variable     ? 2 + options.min_timed_steps
                                                      : 2 + options.max_timed_steps;
    const std::vector<int64_t> drawn =
        variable ? draw_lengths(*job.seq_lengths, std::max<int64_t>(0, max_steps - 2), job.seed)
                 : std::vector<int64_t>{};
    JobSpec at_length = job;
    std::vector<std::pair<std::size_t, std::size_t>> step_events;
    // Predicted reserved bytes replay the steps every run of this trial
    // makes: how many more timing adds until it is steady depends on the
    // machine's noise, and a cache that fragments step by step would make
    // the prediction depend on it too.
    const bool timing_decides = options.total_steps <= 0 && !variable && !meta;
    const int64_t replayed_steps = timing_decides ? std::min(max_steps, 2 + options.min_timed_steps) : max_steps;
    std::size_t replay_end = 0;
    for (int64_t index = 2; index <= max_steps; ++index) {
      if (index >= 3 && variable && drawn[static_cast<std::size_t>(index - 3)] != *at_length.seq_len) {
        at_length.seq_len = drawn[static_cast<std::size_t>(index - 3)];
        HostMemoryScope host;
        batch = Batch{};
        batch = make_batch(at_length, job.global_batch, job.seed);
      }
      if (variable) {
        report.step_lengths.push_back(*at_length.seq_len);
        step_events.emplace_back(tracker.event_count(), 0);
      }
      start = Clock::now();
      bool skipped = false;
      if (index == 2) {
        measured_begin = tracker.event_count();
        skipped = report.measured_step_skipped = step.run(batch, measured_hook).skipped;
        measured_end = tracker.event_count();
      } else
        skipped = step.run(batch, timing_hook).skipped;
      report.skipped_steps += skipped ? 1 : 0;
      if (cuda) torch::cuda::synchronize();
      report.timing.optimizer_seconds.push_back(seconds_since(optimizer_start));
      report.timing.step_seconds.push_back(seconds_since(start));
      report.steps_run = report.timing.warmup_steps + index - 1;
      if (index <= replayed_steps) replay_end = tracker.event_count();
      if (variable) step_events.back().second = tracker.event_count();
      if (index == 2) {
        end_phase();
        for (std::size_t p = 0; p < kNumPhases; ++p)
          report.phases[p] = device ? device->phase(static_cast<Phase>(p)) : tracker.phase(static_cast<Phase>(p));
        const PhaseMemory& update = report.phases[static_cast<std::size_t>(Phase::kOptimizer)];
        report.optimizer.temporary_bytes = update.peak_bytes - update.start_bytes;
        report.largest = tracker.largest();
        const AttentionRecord attention = take_attention_record();
        if (attention.total_calls() > 0) report.attention = attention;
        if (const DropoutRecord dropout = take_dropout_record(); dropout.calls > 0) report.dropout = dropout;
        // cuDNN's calls on the CPU and on meta (Note [cuDNN calls]).
        if (const CudnnCalls cudnn = tracker.cudnn_calls(); cudnn.any() && !cuda) report.cudnn = cudnn;
        // On the CPU and on meta the cuBLAS workspaces a CUDA run of the
        // step's matmuls holds are stated for the job's target; a CUDA
        // trial's allocator holds them already (its line comes with
        // attention only).
        if (attention.total_calls() > 0 || !cuda)
          report.workspaces =
              workspaces_for(cuda_target, tracker.cublas_calls(),
                             attention.calls[static_cast<std::size_t>(AttentionKernel::kCudnn)] > 0, cuda);
      }
      const auto timed = static_cast<int64_t>(report.timing.step_seconds.size());
      if (timing_decides && timed >= options.min_timed_steps + 1 &&
          steady(report.timing.step_seconds, options.min_timed_steps, options.timing_tolerance))
        break;
    }
    take_attention_record();  // the later steps' calls: no trial after this one meets them
    take_dropout_record();
    // Peaks cover every step after the warm-up: a later step that grows
    // shows here (DESIGN.md: fitting two steps is not fitting).
    report.peak_bytes = tracker.peak_bytes();
    if (device) {  // the allocator's own figures: its rounding included, what a GPU budget compares with
      device->end_phase();
      report.peak_bytes = device->peak_bytes();
      report.measured_reserved = device->measured_reserved();
    }
    // On a GPU offload's buffers are pinned, from CUDA's host allocator, and
    // kept from the warm-up on: what it holds now it held at the peak.
    report.host_peak_bytes = tracker.peak_bytes(MemoryPool::kHost) + (device ? device->pinned_host_bytes() : 0);
    report.kernel_scratch = tracker.kernel_scratch();
    if (variable) {  // the means over the drawn steps (Note [Variable-length steps])
      const std::size_t first = report.timing.step_seconds.size() > 1 ? 1 : 0;
      report.timing.steady = false;
      report.timing.steady_step_seconds = mean(report.timing.step_seconds, first);
      report.timing.steady_optimizer_seconds = mean(report.timing.optimizer_seconds, first);
    } else {
      report.timing.steady = steady(report.timing.step_seconds, options.min_timed_steps, options.timing_tolerance);
      report.timing.steady_step_seconds = median(report.timing.step_seconds);
      report.timing.steady_optimizer_seconds = median(report.timing.optimizer_seconds);
    }
    if (report.timing.steady_step_seconds > 0)
      report.samples_per_second = static_cast<double>(job.global_batch) / report.timing.steady_step_seconds;
    if (meta) {
      const double tolerance = report.timing.tolerance;
      report.timing = StepTiming{};
      report.timing.tolerance = tolerance;
      report.timing.measured = false;
      report.samples_per_second = 0;
    }
    if (options.record_events) {
      const std::vector<TrackedEvent> events = tracker.events();
      const std::vector<std::string> op_names = tracker.op_names();
      report.reserved =
          predict_reserved(events, replay_end, job.usable_budget_bytes(), cuda ? CublasCalls{} : tracker.cublas_calls(),
                           cublas_workspace_bytes(cuda_target), cublaslt_workspace_bytes(cuda_target), op_names,
                           /*device_order=*/cuda);
      if (variable) report.step_peak_bytes = step_device_peaks(events, step_events);
      if (!options.step_events_path.empty())
        write_step_events(options.step_events_path, events, measured_begin, measured_end, op_names);
      report.peak_composition = find_peak_composition(events, measured_begin, measured_end, op_names);
      if (config.accumulation_steps == 1 && backward_end > backward_begin)
        report.backward_activation_peak =
            find_backward_activation_peak(events, backward_begin, backward_end, live_at_backward, new_gradients);
    }
  } catch (const CheckpointRefused& e) {
    // Found in the graph before the step ran (strategies/argument_writes.h).
    report.checkpointed_blocks = e.chosen_blocks();
    refuse_checkpoint(report, e.what(), current_phase, e.block_class(), e.other_blocks());
    return report;
  } catch (const std::exception& e) {
    if (!is_out_of_memory(e)) {
      // Or refused by the recompute operator at the block's first call.
      const std::optional<std::string> refused = take_refused_block_class();
      if (!refused) throw;
      refuse_checkpoint(report, error_text(e), current_phase, *refused,
                        blocks_of_other_classes(checkpointed, *refused));
      return report;
    }
    report.outcome = TrialOutcome::kOutOfMemory;
    report.message = out_of_memory_message(e);
    if (device) {
      report.message += "; " + device->allocator_state();
      report.measured_reserved = device->measured_reserved();
      if (!options.snapshot_path.empty()) {
        try {  // the out-of-memory is the result; a snapshot that cannot be written only loses the snapshot
          device->write_snapshot(options.snapshot_path);
          report.snapshot_path = options.snapshot_path;
        } catch (const std::exception& written) {
          report.message += fmt::format("; no snapshot: {}", written.what());
        }
      }
    }
    report.phase_at_failure = current_phase;
    report.peak_bytes = std::max(report.peak_bytes, tracker.peak_bytes());
    report.kernel_scratch = tracker.kernel_scratch();
  }
  // Allocates and frees on the GPU: after every record above is read.
  // Within the budget only, and none without one (probes/largest_block.h).
  if (const std::optional<int64_t> usable = job.usable_budget_bytes(); device && usable)
    report.allocatable = device->allocatable(*usable);
  return report;
}

}  // namespace oomtune
