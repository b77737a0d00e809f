#pragma once
// The range of each optimizer hyper-parameter oomtune accepts. One rule per
// key, read by the job spec (job/job_spec.cpp), plan.toml
// (recipes/plan_toml.cpp) and validate_plan (recipes/plan.cpp), so that a
// job autotune accepts always gives a plan it can write, and a plan file is
// held to the rules its writer keeps.

#include <string>

namespace oomtune {

class TomlTable;

/// Checks one hyper-parameter, `key` as spelled in the job spec and
/// plan.toml [optimizer] tables:
///   lr            (0, 1000]  a zero rate trains nothing;
///   weight_decay  [0, 1000]
///   betas         [0, 1)     each of (beta1, beta2), as torch.optim.AdamW
///                            requires (torch/optim/adamw.py);
///   eps           (0, 1]     it divides: 0 can make the update infinite;
///   momentum      [0, 1)     SGD; 1 or more never decays;
///   max_grad_norm [0, 1e6]   gradient clipping's max_norm, 0 for none
///                            (torch.nn.utils.clip_grad_norm_ takes any
///                            value; a negative one flips every gradient).
/// Every value must also be finite. Returns "" when `value` is accepted, else
/// the message after "KEY: ", e.g. "must be in (0, 1000], got 0" or
/// "each beta must be in [0, 1), got 1". An unknown `key` is a programming
/// error: std::invalid_argument.
std::string hyper_parameter_problem(const std::string& key, double value);

/// Where read_hyper_parameters stores each value (the job spec and the plan
/// keep them in different structs).
struct HyperParameterFields {
  double* lr;
  double* weight_decay;
  double* beta1;
  double* beta2;
  double* eps;
  double* momentum;
  double* max_grad_norm;
};

/// Reads lr, weight_decay, betas = [beta1, beta2], eps, momentum and
/// max_grad_norm from an [optimizer] table into `fields`; an absent key
/// leaves its field as it is.
/// Other keys are the caller's. Throws SpecError "ORIGIN:LINE:COLUMN:
/// optimizer.KEY: ..." for a wrong type, a non-finite number or a value
/// outside hyper_parameter_problem's range.
void read_hyper_parameters(const TomlTable& table, const HyperParameterFields& fields);

}  // namespace oomtune
