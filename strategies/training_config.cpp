#include "strategies/training_config.h"

#include <algorithm>
#include <charconv>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)

#include "common/closest_name.h"
#include "common/error.h"

namespace oomtune {
namespace {

// Digits only, and within int64 (strtoll took " 5" and "+5" and clamped
// 99999999999999999999 to its maximum without a word).
int64_t parse_positive(const std::string& key, const std::string& value) {
  int64_t number = 0;
  const char* end = value.data() + value.size();
  const auto [stop, error] = std::from_chars(value.data(), end, number);
  if (value.empty() || error != std::errc() || stop != end || number < 1)
    throw ConfigError(fmt::format("config: {} must be a whole number >= 1, got '{}'", key, value));
  return number;
}

bool parse_switch(const std::string& key, const std::string& value) {
  if (value == "on" || value == "true" || value == "1") return true;
  if (value == "off" || value == "false" || value == "0") return false;
  throw ConfigError(fmt::format("config: {} must be on or off, got '{}'", key, value));
}

// Every part, empty ones included: "a++b" is {"a", "", "b"}, "a+" is {"a", ""}.
std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts(1);
  for (char c : text) {
    if (c == separator)
      parts.emplace_back();
    else
      parts.back() += c;
  }
  return parts;
}

}  // namespace

bool CheckpointPlan::operator==(const CheckpointPlan& other) const {
  return mode == other.mode && every_k == other.every_k && first_n == other.first_n && paths == other.paths;
}

bool TrainingConfig::operator==(const TrainingConfig& other) const {
  return micro_batch == other.micro_batch && accumulation_steps == other.accumulation_steps &&
         checkpoint == other.checkpoint && optimizer == other.optimizer &&
         offload_optimizer == other.offload_optimizer && precision == other.precision;
}

std::string to_string(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW:
      return "adamw";
    case OptimizerKind::kAdamW8bit:
      return "adamw8bit";
    case OptimizerKind::kSgd:
      return "sgd";
    case OptimizerKind::kAdafactor:
      return "adafactor";
  }
  return "?";
}

std::string to_string(Precision precision) {
  switch (precision) {
    case Precision::kFp32:
      return "fp32";
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kBf16Params:
      return "bf16_params";
  }
  return "?";
}

std::string to_string(const CheckpointPlan& plan) {
  switch (plan.mode) {
    case CheckpointPlan::Mode::kNone:
      return "none";
    case CheckpointPlan::Mode::kAll:
      return "all";
    case CheckpointPlan::Mode::kEveryK:
      return fmt::format("every:{}", plan.every_k);
    case CheckpointPlan::Mode::kFirstN:
      return fmt::format("first:{}", plan.first_n);
    case CheckpointPlan::Mode::kPaths:
      return fmt::format("paths:{}", fmt::join(plan.paths, "+"));
  }
  return "?";
}

int64_t offload_host_bytes_per_parameter(OptimizerKind offloaded, bool momentum) {
  constexpr int64_t kMaster = 4, kGradient = 4;  // fp32 each
  if (offloaded == OptimizerKind::kSgd) return kMaster + kGradient + (momentum ? 4 : 0);
  return kMaster + kGradient + 8;  // AdamW's two fp32 moments
}

std::string to_string(const TrainingConfig& config) {
  return fmt::format("micro_batch={},accum={},ckpt={},optimizer={},offload={},precision={}", config.micro_batch,
                     config.accumulation_steps, to_string(config.checkpoint), to_string(config.optimizer),
                     config.offload_optimizer ? "on" : "off", to_string(config.precision));
}

OptimizerKind parse_optimizer(const std::string& text) {
  if (text == "adamw") return OptimizerKind::kAdamW;
  if (text == "adamw8bit") return OptimizerKind::kAdamW8bit;
  if (text == "sgd") return OptimizerKind::kSgd;
  if (text == "adafactor") return OptimizerKind::kAdafactor;
  throw ConfigError(
      fmt::format("unknown optimizer '{}' ({})", text, suggest(text, {"adamw", "adamw8bit", "sgd", "adafactor"})));
}

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::kFp32;
  if (text == "bf16") return Precision::kBf16;
  if (text == "fp16") return Precision::kFp16;
  if (text == "bf16_params") return Precision::kBf16Params;
  throw ConfigError(
      fmt::format("unknown precision '{}' ({})", text, suggest(text, {"fp32", "bf16", "fp16", "bf16_params"})));
}

CheckpointPlan parse_checkpoint_plan(const std::string& text) {
  CheckpointPlan plan;
  const auto colon = text.find(':');
  const std::string head = text.substr(0, colon);
  const std::string tail = colon == std::string::npos ? "" : text.substr(colon + 1);
  if ((head == "none" || head == "off") && colon == std::string::npos) return plan;
  if ((head == "all" || head == "auto" || head == "on") && colon == std::string::npos) {
    plan.mode = CheckpointPlan::Mode::kAll;
  } else if (head == "every") {
    plan.mode = CheckpointPlan::Mode::kEveryK;
    plan.every_k = parse_positive("ckpt every:k", tail);
  } else if (head == "first") {
    plan.mode = CheckpointPlan::Mode::kFirstN;
    plan.first_n = parse_positive("ckpt first:n", tail);
  } else if (head == "paths") {
    plan.mode = CheckpointPlan::Mode::kPaths;
    plan.paths = split(tail, '+');
    if (tail.empty()) throw ConfigError("config: ckpt paths: needs at least one path, e.g. paths:blocks.0");
    // An empty path would not survive to_string and back ("a++" reads as "a+").
    if (std::find(plan.paths.begin(), plan.paths.end(), "") != plan.paths.end())
      throw ConfigError(fmt::format("config: ckpt paths: empty path in '{}' (write paths:A+B)", text));
  } else {
    throw ConfigError(fmt::format("unknown checkpoint plan '{}' ({})", text,
                                  suggest(head, {"none", "all", "auto", "every:K", "first:N", "paths:A+B"})));
  }
  return plan;
}

TrainingConfig parse_config_overrides(const std::string& text, TrainingConfig base) {
  static const std::vector<std::string> kKeys = {"micro_batch", "accum",   "accumulation_steps", "ckpt",
                                                 "optimizer",   "offload", "precision"};
  for (const std::string& item : split(text, ',')) {
    if (item.empty()) continue;
    const auto equals = item.find('=');
    if (equals == std::string::npos) throw ConfigError(fmt::format("config: '{}' is not key=value", item));
    const std::string key = item.substr(0, equals);
    const std::string value = item.substr(equals + 1);
    if (key == "micro_batch")
      base.micro_batch = parse_positive(key, value);
    else if (key == "accum" || key == "accumulation_steps")
      base.accumulation_steps = parse_positive(key, value);
    else if (key == "ckpt")
      base.checkpoint = parse_checkpoint_plan(value);
    else if (key == "optimizer")
      base.optimizer = parse_optimizer(value);
    else if (key == "offload")
      base.offload_optimizer = parse_switch(key, value);
    else if (key == "precision")
      base.precision = parse_precision(value);
    else
      throw ConfigError(fmt::format("config: unknown key '{}' ({})", key, suggest(key, kKeys)));
  }
  return base;
}

}  // namespace oomtune
