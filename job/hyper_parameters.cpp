#include "job/hyper_parameters.h"

#include <cmath>
#include <stdexcept>

#include <fmt/format.h>
#include <toml++/toml.h>

#include "common/toml_table.h"

namespace oomtune {
namespace {

struct Range {
  const char* key;
  const char* subject;  // what the message says "must ..."
  double low, high;
  bool low_open, high_open;
};

constexpr Range kRanges[] = {
    {"lr", "must", 0.0, 1e3, true, false},
    {"weight_decay", "must", 0.0, 1e3, false, false},
    {"betas", "each beta must", 0.0, 1.0, false, true},
    {"eps", "must", 0.0, 1.0, true, false},
    {"momentum", "must", 0.0, 1.0, false, true},
    {"max_grad_norm", "must", 0.0, 1e6, false, false},
};

}  // namespace

std::string hyper_parameter_problem(const std::string& key, double value) {
  for (const Range& r : kRanges) {
    if (key != r.key) continue;
    const bool above_low = r.low_open ? value > r.low : value >= r.low;
    const bool below_high = r.high_open ? value < r.high : value <= r.high;
    if (std::isfinite(value) && above_low && below_high) return "";
    return fmt::format("{} be in {}{}, {}{}, got {}", r.subject, r.low_open ? "(" : "[", r.low, r.high,
                       r.high_open ? ")" : "]", value);
  }
  throw std::invalid_argument("hyper_parameter_problem: unknown key " + key);
}

void read_hyper_parameters(const TomlTable& table, const HyperParameterFields& fields) {
  const auto check = [&table](const std::string& key, double value) {
    if (const std::string problem = hyper_parameter_problem(key, value); !problem.empty()) table.fail(key, problem);
    return value;
  };
  for (auto [key, field] :
       {std::pair{"lr", fields.lr}, std::pair{"weight_decay", fields.weight_decay}, std::pair{"eps", fields.eps},
        std::pair{"momentum", fields.momentum}, std::pair{"max_grad_norm", fields.max_grad_norm}})
    if (const auto value = table.number(key)) *field = check(key, *value);
  if (const toml::node* betas = table.get("betas")) {
    const toml::array* array = betas->as_array();
    if (!array || array->size() != 2) table.fail("betas", "expected [beta1, beta2]");
    *fields.beta1 = check("betas", table.number_of((*array)[0], "betas"));
    *fields.beta2 = check("betas", table.number_of((*array)[1], "betas"));
  }
}

}  // namespace oomtune
