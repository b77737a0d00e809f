// libFuzzer target: any bytes as a job spec and as a plan.toml, the two TOML
// files users write or edit by hand. The only acceptable failure is an
// oomtune::Error (a clear one-line message); crashes, sanitizer reports,
// other exceptions and huge allocations are bugs. A file that is accepted
// must also be usable, or the user learns otherwise only minutes later:
// - a job spec keeps every value inside the range the trials can run
//   (finite numbers, input ranges a tensor of its dtype can hold) and
//   crosses to a child trial unchanged (to_json, text, job_spec_from_json);
// - a plan passes validate_plan, writes back to TOML that reads as the same
//   Plan (plan_toml.h promises this), and every framework writer renders it,
//   the JSON ones as valid JSON.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/json_text.h"
#include "job/job_json.h"
#include "job/job_spec.h"
#include "recipes/plan_toml.h"
#include "recipes/recipes.h"

namespace {

[[noreturn]] void bug(const std::string& what, const std::string& detail) {
  std::fprintf(stderr, "%s\n%s\n", what.c_str(), detail.c_str());
  std::abort();
}

bool in(double value, double low, double high) { return std::isfinite(value) && value >= low && value <= high; }

// What an accepted job spec promises the trials, written out independently of
// the reader: each check names the failure a trial would otherwise hit.
std::string job_problem(const oomtune::JobSpec& job) {
  using namespace oomtune;
  if (job.global_batch < 1 || job.min_micro_batch < 1 || job.verify_steps < 3) return "a count below its minimum";
  if (job.max_micro_batch && *job.max_micro_batch < job.min_micro_batch) return "max_micro_batch < min_micro_batch";
  if (job.budget_bytes && *job.budget_bytes <= 0) return "budget <= 0";
  if (!in(job.headroom, 0.0, 0.9)) return "headroom outside [0, 0.9]";
  if (!in(job.trial_timeout_seconds, 1.0, 86400.0)) return "trial_timeout outside [1, 86400]";
  const OptimizerSpec& o = job.optimizer;
  // The plan writer's rules (recipes/plan.cpp validate_plan): a job that
  // breaks them runs the whole search and then cannot be emitted.
  if (!(in(o.lr, 0.0, 1e3) && o.lr > 0.0)) return "lr outside (0, 1000]";
  if (!in(o.weight_decay, 0.0, 1e3)) return "weight_decay outside [0, 1000]";
  if (!(in(o.beta1, 0.0, 1.0) && o.beta1 < 1.0 && in(o.beta2, 0.0, 1.0) && o.beta2 < 1.0))
    return "a beta outside [0, 1)";
  if (!(in(o.eps, 0.0, 1.0) && o.eps > 0.0)) return "eps outside (0, 1]";
  if (!(in(o.momentum, 0.0, 1.0) && o.momentum < 1.0)) return "momentum outside [0, 1)";
  if (!in(o.max_grad_norm, 0.0, 1e6)) return "max_grad_norm outside [0, 1e6]";
  // The sequence length (job/job_spec.h, kSeqDim): given exactly when an
  // input names it, within [1, kMaxSeqLen], a range's min not above it.
  if (job.has_seq() != job.seq_len.has_value()) return "a \"seq\" dimension and the seq key disagree";
  if (job.seq_len && (*job.seq_len < 1 || *job.seq_len > kMaxSeqLen)) return "seq outside [1, kMaxSeqLen]";
  if (job.seq_min && (!job.seq_len || *job.seq_min < 1 || *job.seq_min > *job.seq_len)) return "a seq range min > max";
  // A distribution of lengths spans exactly [seq_min, seq_len].
  if (job.seq_lengths && (job.seq_lengths->min != job.seq_min || job.seq_lengths->max != job.seq_len))
    return "a seq distribution that is not [seq_min, seq_len]";
  for (const InputSpec& input : job.inputs) {
    int batch_dims = 0, seq_dims = 0;
    double elements = 1;  // per sample; a double cannot overflow here
    for (int64_t dim : input.shape) {
      if (dim == kBatchDim) {
        ++batch_dims;
      } else if (dim == kSeqDim) {
        ++seq_dims;
        elements *= static_cast<double>(job.seq_len.value_or(1));
      } else if (dim < 1) {
        return "a dimension below 1";
      } else {
        elements *= static_cast<double>(dim);
      }
    }
    if (batch_dims != 1) return "not exactly one batch dimension";
    if (seq_dims > 1) return "two \"seq\" dimensions in one shape";
    if (elements * 8 > static_cast<double>(std::numeric_limits<int64_t>::max()))
      return "one sample's bytes do not fit int64 (torch: 'Storage size calculation overflowed')";
    if (input.low.has_value() != input.high.has_value()) return "a range with one bound";
    if (!input.low) continue;
    const double low = *input.low, high = *input.high;
    if (!(std::isfinite(low) && std::isfinite(high) && low < high)) return "a range that is not finite low < high";
    if (input.dtype == "int64" || input.dtype == "int32" || input.dtype == "bool") {
      // at::randint(low, high) takes int64 bounds: exact and inside the dtype.
      const double limit = input.dtype == "int32" ? 2147483648.0 : input.dtype == "bool" ? 2.0 : 9007199254740992.0;
      const double floor = input.dtype == "bool" ? 0.0 : -limit;
      if (low != std::trunc(low) || high != std::trunc(high)) return "an integer input with a fractional bound";
      if (low < floor || high > limit) return "an integer range its dtype cannot hold";
    } else {
      // uniform_ runs in float32 (session/batch.cpp), then converts.
      const double limit = input.dtype == "float16" ? 65504.0 : std::numeric_limits<float>::max();
      if (std::fabs(low) > limit || std::fabs(high) > limit || !std::isfinite(high - low))
        return "a float range its dtype cannot hold";
    }
  }
  return "";
}

void check_job_spec(const std::string& text) {
  oomtune::JobSpec job;
  try {
    job = oomtune::parse_job_spec(text, "fuzz.toml", "");
  } catch (const oomtune::Error&) {
    return;
  }
  if (const std::string problem = job_problem(job); !problem.empty()) bug("accepted job spec: " + problem, text);
  const std::string sent = oomtune::json_text(oomtune::to_json(job));
  std::string received;
  try {
    received = oomtune::json_text(oomtune::to_json(oomtune::job_spec_from_json(nlohmann::json::parse(sent))));
  } catch (const std::exception& e) {
    bug(std::string("the child could not read the job: ") + e.what(), sent);
  }
  if (received != sent) bug("the job changed on its way to the child", sent + "\n---\n" + received);
}

void check_plan(const std::string& text) {
  oomtune::Plan plan;
  try {
    plan = oomtune::parse_plan_toml(text, "fuzz.toml");
  } catch (const oomtune::Error&) {
    return;
  }
  std::string written;
  try {
    oomtune::validate_plan(plan);
    written = oomtune::write_plan_toml(plan);
    const oomtune::Plan read_back = oomtune::parse_plan_toml(written, "written.toml");
    if (read_back != plan)
      bug("plan.toml does not round-trip",
          written + "\n--- read back and written again\n" + oomtune::write_plan_toml(read_back));
    for (const oomtune::RecipeWriter& writer : oomtune::recipe_writers()) {
      const std::string file = writer.write(plan);
      (void)writer.notes(plan);
      const std::string name = writer.file_name;
      if (name.size() > 5 && name.compare(name.size() - 5, 5, ".json") == 0) (void)nlohmann::json::parse(file);
    }
  } catch (const std::exception& e) {
    bug(std::string("an accepted plan failed later: ") + e.what(), text + "\n---\n" + written);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check_job_spec(text);
  check_plan(text);
  return 0;
}
