#include "recipes/plan_toml.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (fmt 11 moved it here; fmtlib/fmt #4058)
#include <toml++/toml.h>

#include "common/byte_size.h"
#include "common/closest_name.h"
#include "common/error.h"
#include "common/text_file.h"
#include "common/toml_table.h"
#include "job/hyper_parameters.h"
#include "job/job_spec.h"
#include "job/parameter_selection_toml.h"

namespace oomtune {
namespace {

const std::vector<std::string> kTopKeys = {"plan_version", "notes", "job", "config", "optimizer", "result"};
const std::vector<std::string> kJobKeys = {"spec",         "model",    "device",    "global_batch",
                                           "budget",       "headroom", "trainable", "frozen",
                                           "frozen_dtype", "seq",      "parameters"};
const std::vector<std::string> kConfigKeys = {"micro_batch", "accumulation_steps", "checkpoint",
                                              "optimizer",   "offload_optimizer",  "precision"};
const std::vector<std::string> kOptimizerKeys = {"lr",       "weight_decay",   "betas",        "eps",
                                                 "momentum", "implementation", "max_grad_norm"};
const std::vector<std::string> kResultKeys = {"measured_peak_bytes", "predicted_peak_bytes",
                                              "measured_samples_per_second", "predicted_samples_per_second",
                                              "measured_host_peak_bytes"};

// ---------------------------------------------------------------- writing

/// A TOML basic string: quotes, backslashes and control characters escaped
/// (TOML 1.0 "String"); other UTF-8 passes through.
std::string quote(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f)
          out += fmt::format("\\u{:04X}", c);
        else
          out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

/// A TOML float in shortest round-trip form ("0.001", "1e-08", "2.0"): fmt's
/// default double format, with ".0" added where it would read as an integer.
std::string float_text(double value) {
  std::string text = fmt::format("{}", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";  // 'n': inf / nan never reach here
  return text;
}

// ---------------------------------------------------------------- reading

/// One TOML table of the plan (errors say ORIGIN:LINE:COLUMN: KEY).
using PlanTable = TomlTable;

// The plan's required integers.
int64_t required_integer(const PlanTable& table, const std::string& key, int64_t min_value) {
  if (!table.get(key)) table.missing(key);
  return *table.integer(key, min_value);
}

void read_job(const PlanTable& job, Plan& plan, bool& has_global_batch) {
  job.reject_unknown(kJobKeys);
  plan.job_spec_path = job.string("spec").value_or("");
  plan.model_path = job.string("model").value_or("");
  const std::string device = job.string("device").value_or(std::string(device_name(plan.device)));
  const std::optional<Device> named = device_from_name(device);
  if (!named || *named == Device::kMeta)
    job.fail("device", fmt::format("unknown value '{}' ({})", device,
                                   suggest(device, device_names({Device::kCpu, Device::kCuda}))));
  plan.device = *named;
  if (auto batch = job.integer("global_batch", 1)) {
    plan.global_batch = *batch;
    has_global_batch = true;
  }
  if (const toml::node* budget = job.get("budget")) {
    if (budget->is_integer()) {
      plan.budget_bytes = *job.integer("budget", 1);
    } else if (budget->is_string()) {
      const std::string text = *budget->value<std::string>();
      auto bytes = parse_byte_size(text);
      if (!bytes || *bytes <= 0)
        job.fail("budget", fmt::format("expected bytes or a size such as \"16GiB\" or \"7.5 GB\", got '{}'", text));
      plan.budget_bytes = *bytes;
    } else {
      job.fail("budget",
               fmt::format("expected bytes (an integer) or a size string, got {}", PlanTable::type_name(*budget)));
    }
  }
  if (auto headroom = job.number("headroom")) {
    if (*headroom < 0.0 || *headroom > 0.9) job.fail("headroom", fmt::format("must be in [0, 0.9], got {}", *headroom));
    plan.headroom = *headroom;
  }
  plan.trainable = read_parameter_selection(job);
  if (auto seq = job.integer("seq", 1)) {
    if (*seq > kMaxSeqLen) job.fail("seq", fmt::format("must be in [1, {}] tokens, got {}", kMaxSeqLen, *seq));
    plan.seq_len = *seq;
  }
  plan.parameter_count = job.integer("parameters", 1);
}

void read_config(const PlanTable& config, Plan& plan) {
  config.reject_unknown(kConfigKeys);
  TrainingConfig& c = plan.config;
  c.micro_batch = required_integer(config, "micro_batch", 1);
  c.accumulation_steps = required_integer(config, "accumulation_steps", 1);
  // The training_config.h parsers throw ConfigError with the value and the
  // closest name; here the message also gets the file position and key.
  auto parse = [&](const std::string& key, auto parser) {
    const std::string text = *config.string(key);
    try {
      return parser(text);
    } catch (const ConfigError& e) {
      config.fail(key, e.what());
    }
  };
  if (config.get("checkpoint")) c.checkpoint = parse("checkpoint", parse_checkpoint_plan);
  if (config.get("optimizer")) c.optimizer = parse("optimizer", parse_optimizer);
  if (config.get("precision")) c.precision = parse("precision", parse_precision);
  c.offload_optimizer = config.boolean("offload_optimizer").value_or(false);
}

void read_optimizer(const PlanTable& table, Plan& plan) {
  table.reject_unknown(kOptimizerKeys);
  OptimizerHyperParameters& o = plan.optimizer;
  read_hyper_parameters(table, {&o.lr, &o.weight_decay, &o.beta1, &o.beta2, &o.eps, &o.momentum, &o.max_grad_norm});
  // Absent from plans written before the key (issue #46): PyTorch's default.
  if (const auto name = table.string("implementation")) {
    const auto implementation = optimizer_implementation_from_name(*name);
    if (!implementation)
      table.fail("implementation",
                 fmt::format("unknown value '{}' ({})", *name, suggest(*name, optimizer_implementation_names())));
    o.implementation = *implementation;
  }
}

void read_result(const PlanTable& result, Plan& plan) {
  result.reject_unknown(kResultKeys);
  plan.measured_peak_bytes = result.integer("measured_peak_bytes", 0);
  plan.predicted_peak_bytes = result.integer("predicted_peak_bytes", 0);
  plan.measured_host_peak_bytes = result.integer("measured_host_peak_bytes", 0);
  for (auto [key, field] : {std::pair{"measured_samples_per_second", &plan.measured_samples_per_second},
                            std::pair{"predicted_samples_per_second", &plan.predicted_samples_per_second}}) {
    *field = result.number(key);
    if (*field && **field < 0.0) result.fail(key, fmt::format("must be >= 0, got {}", **field));
  }
}

void read_notes(const PlanTable& top, Plan& plan) {
  const toml::node* notes = top.get("notes");
  if (!notes) return;
  const toml::array* array = notes->as_array();
  if (!array) top.fail("notes", fmt::format("expected an array of strings, got {}", PlanTable::type_name(*notes)));
  for (std::size_t i = 0; i < array->size(); ++i) {
    const toml::node& note = (*array)[i];
    if (!note.is_string())
      top.fail_at(note.source(), fmt::format("notes[{}]", i),
                  fmt::format("expected a string, got {}", PlanTable::type_name(note)));
    plan.notes.emplace_back(*note.value<std::string>());
  }
}

}  // namespace

std::string write_plan_toml(const Plan& plan) {
  validate_plan(plan);
  std::string out;
  auto line = [&out](const std::string& text) { out += text + "\n"; };
  line("# oomtune plan: the training configuration autotune chose (docs/recipes.md).");
  line("# Run it back: oomtune probe --plan plan.toml");
  line("# Framework configs: oomtune emit plan.toml --out DIR");
  line(fmt::format("plan_version = {}", kPlanVersion));
  if (plan.notes.empty()) {
    line("notes = []");
  } else {
    line("notes = [");
    for (const auto& note : plan.notes) line(fmt::format("  {},", quote(note)));
    line("]");
  }

  line("");
  line("[job]");
  if (!plan.job_spec_path.empty()) line(fmt::format("spec = {}", quote(plan.job_spec_path)));
  if (!plan.model_path.empty()) line(fmt::format("model = {}", quote(plan.model_path)));
  line(fmt::format("device = {}", quote(std::string(device_name(plan.device)))));
  line(fmt::format("global_batch = {}  # micro_batch * accumulation_steps, exact", plan.global_batch));
  if (plan.budget_bytes)
    line(fmt::format("budget = {}  # bytes ({})", *plan.budget_bytes, format_bytes(*plan.budget_bytes)));
  line(fmt::format("headroom = {}", float_text(plan.headroom)));
  if (plan.seq_len) line(fmt::format("seq = {}  # tokens per sequence, verified (the longest)", *plan.seq_len));
  if (plan.parameter_count)
    line(fmt::format("parameters = {}  # trainable parameter elements (the optimizer's)", *plan.parameter_count));
  if (plan.trainable.freezes()) {
    std::vector<std::string> globs;
    for (const std::string& glob : plan.trainable.globs) globs.push_back(quote(glob));
    line(fmt::format("{} = [{}]  # globs over parameter names; the rest frozen (the job's)",
                     key_of(plan.trainable.rule), fmt::join(globs, ", ")));
    if (plan.trainable.frozen_bf16) line("frozen_dtype = \"bf16\"");
  }

  const TrainingConfig& c = plan.config;
  line("");
  line("[config]");
  line(fmt::format("micro_batch = {}", c.micro_batch));
  line(fmt::format("accumulation_steps = {}", c.accumulation_steps));
  line(fmt::format("checkpoint = {}", quote(to_string(c.checkpoint))));
  line(fmt::format("optimizer = {}", quote(to_string(c.optimizer))));
  line(fmt::format("offload_optimizer = {}", c.offload_optimizer ? "true" : "false"));
  line(fmt::format("precision = {}", quote(to_string(c.precision))));

  const OptimizerHyperParameters& o = plan.optimizer;
  line("");
  line("[optimizer]");
  line(fmt::format("lr = {}", float_text(o.lr)));
  line(fmt::format("weight_decay = {}", float_text(o.weight_decay)));
  line(fmt::format("betas = [{}, {}]", float_text(o.beta1), float_text(o.beta2)));
  line(fmt::format("eps = {}", float_text(o.eps)));
  line(fmt::format("momentum = {}", float_text(o.momentum)));
  line(fmt::format("max_grad_norm = {}", float_text(o.max_grad_norm)));
  line(fmt::format("implementation = {}", quote(to_string(o.implementation))));

  if (plan.measured_peak_bytes || plan.predicted_peak_bytes || plan.measured_samples_per_second ||
      plan.predicted_samples_per_second || plan.measured_host_peak_bytes) {
    line("");
    line("[result]");
    if (plan.measured_peak_bytes)
      line(fmt::format("measured_peak_bytes = {}  # {}", *plan.measured_peak_bytes,
                       format_bytes(*plan.measured_peak_bytes)));
    if (plan.predicted_peak_bytes)
      line(fmt::format("predicted_peak_bytes = {}  # {}", *plan.predicted_peak_bytes,
                       format_bytes(*plan.predicted_peak_bytes)));
    if (plan.measured_samples_per_second)
      line(fmt::format("measured_samples_per_second = {}", float_text(*plan.measured_samples_per_second)));
    if (plan.predicted_samples_per_second)
      line(fmt::format("predicted_samples_per_second = {}", float_text(*plan.predicted_samples_per_second)));
    if (plan.measured_host_peak_bytes)
      line(fmt::format("measured_host_peak_bytes = {}  # {} on the host (optimizer offload)",
                       *plan.measured_host_peak_bytes, format_bytes(*plan.measured_host_peak_bytes)));
  }
  return out;
}

Plan parse_plan_toml(const std::string& text, const std::string& origin) {
  const toml::table root = parse_toml(text, origin);
  // A job spec (job/job_spec.h) names a model at the top, a plan in [job].
  if (root.contains("model") && !root.contains("config"))
    throw InputError(
        fmt::format("{}: is a job spec, not a plan; a plan is the plan.toml that oomtune autotune {} "
                    "--emit DIR writes into DIR (emit and probe --plan read it)",
                    origin, origin));
  PlanTable top(root, origin, "");
  top.reject_unknown(kTopKeys);
  if (auto version = top.integer("plan_version", 1); version && *version != kPlanVersion)
    top.fail("plan_version", fmt::format("this oomtune reads version {}, got {}", kPlanVersion, *version));

  Plan plan;
  read_notes(top, plan);
  const toml::table* config = top.table("config");
  if (!config) top.fail_at(root.source(), "config", "missing required table [config]");
  const PlanTable config_table(*config, origin, "config");
  read_config(config_table, plan);
  const std::optional<int64_t> product = samples_per_step(plan.config);
  if (!product) config_table.fail("accumulation_steps", samples_per_step_overflow(plan.config));
  plan.global_batch = *product;
  bool has_global_batch = false;
  if (const toml::table* job = top.table("job")) {
    PlanTable table(*job, origin, "job");
    read_job(table, plan, has_global_batch);
    if (has_global_batch && plan.global_batch != *product)
      table.fail("global_batch",
                 fmt::format("must equal config.micro_batch * config.accumulation_steps = {} * {} = {} "
                             "(frameworks cannot express a smaller last micro-batch), got {}",
                             plan.config.micro_batch, plan.config.accumulation_steps, *product, plan.global_batch));
  }
  if (const toml::table* optimizer = top.table("optimizer"))
    read_optimizer(PlanTable(*optimizer, origin, "optimizer"), plan);
  if (const toml::table* result = top.table("result")) read_result(PlanTable(*result, origin, "result"), plan);
  return plan;
}

Plan read_plan_toml(const std::string& path) {
  return parse_plan_toml(read_text_file(path, "plan file", "a plan is the plan.toml that autotune --emit DIR writes"),
                         path);
}

}  // namespace oomtune
