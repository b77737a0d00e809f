#include "diagnose/phase_marks.h"

#include <algorithm>
#include <string_view>

namespace oomtune::diagnose {
namespace {

constexpr std::string_view kPrefix = "oomtune:";
constexpr std::string_view kStepPrefix = "Optimizer.step#";  // torch/optim/optimizer.py, profile_hook_step
constexpr std::string_view kStepSuffix = ".step";

// The optimizer class a torch.optim step mark names; "" for any other name.
std::string_view optimizer_step_class(std::string_view name) {
  if (name.size() <= kStepPrefix.size() + kStepSuffix.size() || name.substr(0, kStepPrefix.size()) != kStepPrefix ||
      name.substr(name.size() - kStepSuffix.size()) != kStepSuffix) {
    return {};
  }
  return name.substr(kStepPrefix.size(), name.size() - kStepPrefix.size() - kStepSuffix.size());
}

// The phase a mark names; kUnknown for any other name.
Phase phase_named(std::string_view name) {
  if (!optimizer_step_class(name).empty()) return Phase::kOptimizer;
  if (name.substr(0, kPrefix.size()) != kPrefix) return Phase::kUnknown;
  name.remove_prefix(kPrefix.size());
  if (name == "forward" || name == "loss") return Phase::kForward;
  if (name == "backward") return Phase::kBackward;
  if (name == "optimizer") return Phase::kOptimizer;
  if (name == "load") return Phase::kOther;
  return Phase::kUnknown;
}

}  // namespace

std::vector<PhaseSpan> marked_phase_spans(const std::vector<Annotation>& annotations, int64_t device) {
  std::vector<const Annotation*> marks;
  for (const Annotation& a : annotations)
    if (a.device == device && phase_named(a.name) != Phase::kUnknown) marks.push_back(&a);
  std::stable_sort(marks.begin(), marks.end(),
                   [](const Annotation* a, const Annotation* b) { return a->time_us < b->time_us; });
  std::vector<PhaseSpan> spans;
  bool open = false;
  int nested_steps = 0;  // optimizer step marks opened inside the open one
  for (const Annotation* a : marks) {
    const std::string_view step_class = optimizer_step_class(a->name);
    const bool step = !step_class.empty();
    const bool in_step = open && spans.back().source == MarkSource::kOptimizerStep;
    if (a->stage == "START") {
      if (step && in_step) {
        ++nested_steps;
        continue;
      }
      if (open) spans.back().end_us = a->time_us;
      PhaseSpan span{a->time_us,
                     INT64_MAX,
                     phase_named(a->name),
                     a->name == "oomtune:load",
                     step ? MarkSource::kOptimizerStep : MarkSource::kOomtune,
                     std::string(step_class)};
      spans.push_back(std::move(span));
      open = true;
      nested_steps = 0;
    } else if (a->stage == "END" && open && spans.back().phase == phase_named(a->name)) {
      if (step && in_step && nested_steps > 0) {
        --nested_steps;
        continue;
      }
      spans.back().end_us = a->time_us;
      open = false;
    }
  }
  return spans;
}

bool is_framework_mark(std::string_view name) {
  constexpr std::string_view kOptimizer = "Optimizer.";  // torch/optim/optimizer.py: step and zero_grad
  return name.substr(0, kPrefix.size()) == kPrefix || name.substr(0, kOptimizer.size()) == kOptimizer;
}

const PhaseSpan* span_at(const std::vector<PhaseSpan>& spans, int64_t time_us) {
  // The last span beginning at or before the time.
  auto it = std::upper_bound(spans.begin(), spans.end(), time_us,
                             [](int64_t t, const PhaseSpan& s) { return t < s.begin_us; });
  if (it == spans.begin()) return nullptr;
  --it;
  return time_us < it->end_us ? &*it : nullptr;
}

}  // namespace oomtune::diagnose
