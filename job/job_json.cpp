#include "job/job_json.h"

#include <cstdint>
#include <string>

#include <fmt/format.h>

#include "common/error.h"
#include "common/json_text.h"
#include "common/utf8.h"

namespace oomtune {
namespace {

// A path byte for byte: a JSON string when it is UTF-8, else the array of
// its byte values (a JSON string must be UTF-8, and a file name need not be).
nlohmann::json path_json(const std::string& path) {
  if (is_valid_utf8(path)) return path;
  nlohmann::json bytes = nlohmann::json::array();
  for (const char c : path) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

std::string path_from_json(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  std::string path;
  for (const auto& byte : j) path.push_back(static_cast<char>(byte.get<uint8_t>()));
  return path;
}

std::optional<double> read_optional(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return j.at(key).get<double>();
}

// The distribution of a variable-length job; a histogram travels as its
// file, which the child reads again (a dataset's lengths can be millions).
nlohmann::json seq_lengths_json(const JobSpec& job) {
  if (!job.seq_lengths) return nullptr;
  if (job.seq_lengths->kind == LengthDistribution::Kind::kHistogram)
    return {{"distribution", "histogram"}, {"file", path_json(job.seq_lengths_file)}};
  return {{"distribution", "uniform"}, {"min", job.seq_lengths->min}, {"max", job.seq_lengths->max}};
}

void read_seq_lengths(const nlohmann::json& j, JobSpec& job) {
  if (!j.contains("seq_lengths") || j.at("seq_lengths").is_null()) return;
  const nlohmann::json& d = j.at("seq_lengths");
  if (d.at("distribution").get<std::string>() == "histogram") {
    job.seq_lengths_file = path_from_json(d.at("file"));
    job.seq_lengths = LengthDistribution::histogram(read_length_histogram(job.seq_lengths_file));
  } else {
    job.seq_lengths = LengthDistribution::uniform(d.at("min").get<int64_t>(), d.at("max").get<int64_t>());
  }
}

}  // namespace

nlohmann::json to_json(const JobSpec& job) {
  nlohmann::json inputs = nlohmann::json::array();
  for (const InputSpec& in : job.inputs)
    inputs.push_back({{"name", in.name},
                      {"shape", in.shape},
                      {"dtype", in.dtype},
                      {"low", json_or_null(in.low)},
                      {"high", json_or_null(in.high)}});
  nlohmann::json output = nullptr;
  if (const auto* key = std::get_if<std::string>(&job.output)) output = *key;
  if (const auto* index = std::get_if<int64_t>(&job.output)) output = *index;
  const OptimizerSpec& o = job.optimizer;
  return {{"spec_path", path_json(job.spec_path)},
          {"model_path", path_json(job.model_path)},
          {"inputs", inputs},
          {"output", output},
          {"loss", {{"kind", static_cast<int>(job.loss.kind)}, {"target", job.loss.target}}},
          {"global_batch", job.global_batch},
          {"seq_len", json_or_null(job.seq_len)},
          {"seq_min", json_or_null(job.seq_min)},
          {"seq_lengths", seq_lengths_json(job)},
          {"allow_remainder", job.allow_remainder},
          {"optimizer",
           {{"kind", o.kind},
            {"lr", o.lr},
            {"weight_decay", o.weight_decay},
            {"beta1", o.beta1},
            {"beta2", o.beta2},
            {"eps", o.eps},
            {"momentum", o.momentum},
            {"max_grad_norm", o.max_grad_norm},
            {"implementation", to_string(o.implementation)}}},
          {"precision", job.precision},
          {"allow_bf16", job.allow_bf16},
          {"allow_adafactor", job.allow_adafactor},
          {"trainable",
           {{"rule", static_cast<int>(job.trainable.rule)},
            {"globs", job.trainable.globs},
            {"frozen_bf16", job.trainable.frozen_bf16}}},
          {"device", device_name(job.device)},
          {"budget_bytes", json_or_null(job.budget_bytes)},
          {"host_budget_bytes", json_or_null(job.host_budget_bytes)},
          {"headroom", job.headroom},
          {"min_micro_batch", job.min_micro_batch},
          {"max_micro_batch", json_or_null(job.max_micro_batch)},
          {"verify_steps", job.verify_steps},
          {"trial_timeout_seconds", job.trial_timeout_seconds},
          {"optimizing_executor", job.optimizing_executor},
          {"seed", job.seed},
          {"cuda_target", job.cuda_target}};
}

JobSpec job_spec_from_json(const nlohmann::json& j) {
  try {
    JobSpec job;
    job.spec_path = path_from_json(j.at("spec_path"));
    job.model_path = path_from_json(j.at("model_path"));
    for (const auto& in : j.at("inputs")) {
      InputSpec spec;
      spec.name = in.at("name").get<std::string>();
      spec.shape = in.at("shape").get<std::vector<int64_t>>();
      spec.dtype = in.at("dtype").get<std::string>();
      spec.low = read_optional(in, "low");
      spec.high = read_optional(in, "high");
      job.inputs.push_back(std::move(spec));
    }
    const auto& output = j.at("output");
    if (output.is_string())
      job.output = output.get<std::string>();
    else if (output.is_number_integer())
      job.output = output.get<int64_t>();
    job.loss.kind = static_cast<LossSpec::Kind>(j.at("loss").at("kind").get<int>());
    job.loss.target = j.at("loss").at("target").get<std::string>();
    job.global_batch = j.at("global_batch").get<int64_t>();
    if (j.contains("seq_len") && !j.at("seq_len").is_null()) job.seq_len = j.at("seq_len").get<int64_t>();
    if (j.contains("seq_min") && !j.at("seq_min").is_null()) job.seq_min = j.at("seq_min").get<int64_t>();
    read_seq_lengths(j, job);
    job.allow_remainder = j.at("allow_remainder").get<bool>();
    const auto& o = j.at("optimizer");
    job.optimizer = {o.at("kind").get<std::string>(),    o.at("lr").get<double>(),
                     o.at("weight_decay").get<double>(), o.at("beta1").get<double>(),
                     o.at("beta2").get<double>(),        o.at("eps").get<double>(),
                     o.at("momentum").get<double>(),     o.at("max_grad_norm").get<double>()};
    const std::string implementation = o.at("implementation").get<std::string>();
    const auto named_implementation = optimizer_implementation_from_name(implementation);
    if (!named_implementation)
      throw InputError(fmt::format("job record: unknown optimizer implementation '{}'", implementation));
    job.optimizer.implementation = *named_implementation;
    job.precision = j.at("precision").get<std::string>();
    job.allow_bf16 = j.at("allow_bf16").get<bool>();
    job.allow_adafactor = j.at("allow_adafactor").get<bool>();
    const auto& trainable = j.at("trainable");
    job.trainable.rule = static_cast<ParameterSelection::Rule>(trainable.at("rule").get<int>());
    job.trainable.globs = trainable.at("globs").get<std::vector<std::string>>();
    job.trainable.frozen_bf16 = trainable.at("frozen_bf16").get<bool>();
    const std::string device = j.at("device").get<std::string>();
    const std::optional<Device> named_device = device_from_name(device);
    if (!named_device) throw InputError(fmt::format("job record: unknown device '{}'", device));
    job.device = *named_device;
    if (!j.at("budget_bytes").is_null()) job.budget_bytes = j.at("budget_bytes").get<int64_t>();
    // A record written before the host budget has none.
    if (j.contains("host_budget_bytes") && !j.at("host_budget_bytes").is_null())
      job.host_budget_bytes = j.at("host_budget_bytes").get<int64_t>();
    job.headroom = j.at("headroom").get<double>();
    job.min_micro_batch = j.at("min_micro_batch").get<int64_t>();
    if (!j.at("max_micro_batch").is_null()) job.max_micro_batch = j.at("max_micro_batch").get<int64_t>();
    job.verify_steps = j.at("verify_steps").get<int64_t>();
    job.trial_timeout_seconds = j.at("trial_timeout_seconds").get<double>();
    job.optimizing_executor = j.at("optimizing_executor").get<bool>();
    job.seed = j.at("seed").get<uint64_t>();
    job.cuda_target = j.value("cuda_target", std::string(kDefaultCudaTargetName));
    return job;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(fmt::format("job record: {}", e.what()));
  }
}

}  // namespace oomtune
