#include "diagnose/phase_marks.h"

#include <algorithm>
#include <string_view>

namespace oomtune::diagnose {
namespace {

constexpr std::string_view kPrefix = "oomtune:";

// The phase an oomtune mark names; kUnknown for any other name.
Phase phase_named(std::string_view name) {
  if (name.substr(0, kPrefix.size()) != kPrefix) return Phase::kUnknown;
  name.remove_prefix(kPrefix.size());
  if (name == "forward" || name == "loss") return Phase::kForward;
  if (name == "backward") return Phase::kBackward;
  if (name == "optimizer") return Phase::kOptimizer;
  if (name == "load") return Phase::kOther;
  return Phase::kUnknown;
}

}  // namespace

std::vector<PhaseSpan> oomtune_phase_spans(const std::vector<Annotation>& annotations, int64_t device) {
  std::vector<const Annotation*> marks;
  for (const Annotation& a : annotations)
    if (a.device == device && phase_named(a.name) != Phase::kUnknown) marks.push_back(&a);
  std::stable_sort(marks.begin(), marks.end(),
                   [](const Annotation* a, const Annotation* b) { return a->time_us < b->time_us; });
  std::vector<PhaseSpan> spans;
  bool open = false;
  for (const Annotation* a : marks) {
    if (a->stage == "START") {
      if (open) spans.back().end_us = a->time_us;
      spans.push_back({a->time_us, INT64_MAX, phase_named(a->name), a->name == "oomtune:load"});
      open = true;
    } else if (a->stage == "END" && open && spans.back().phase == phase_named(a->name)) {
      spans.back().end_us = a->time_us;
      open = false;
    }
  }
  return spans;
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
