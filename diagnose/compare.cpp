#include "diagnose/compare.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "common/id_table.h"

namespace oomtune::diagnose {
namespace {

constexpr int64_t kMinSignificantBytes = kMiB;  // below this a change is noise
constexpr double kSignificantShare = 0.01;      // ... or below 1% of the larger side's allocated bytes
constexpr int64_t kAppearedRatio = 100;         // "appeared": the other side has less than 1% of it
constexpr double kRatioTolerance = 0.05;        // x2.0 within 5% reads "doubled"
constexpr int kReservedFreeRow = kNumCategories;

struct CompareVerdictKind {
  CompareVerdictId id;
  const char* name;
};

constexpr CompareVerdictKind kCompareVerdicts[] = {
    {CompareVerdictId::kOptimizerStateAppeared, "optimizer_state_appeared"},
    {CompareVerdictId::kOptimizerStateGone, "optimizer_state_gone"},
    {CompareVerdictId::kGradientsAppeared, "gradients_appeared"},
    {CompareVerdictId::kGradientsGone, "gradients_gone"},
    {CompareVerdictId::kActivationsGrew, "activations_grew"},
    {CompareVerdictId::kActivationsShrank, "activations_shrank"},
    {CompareVerdictId::kParametersGrew, "parameters_grew"},
    {CompareVerdictId::kParametersShrank, "parameters_shrank"},
    {CompareVerdictId::kReservedFreeGrew, "reserved_free_grew"},
    {CompareVerdictId::kReservedFreeShrank, "reserved_free_shrank"},
    {CompareVerdictId::kTemporariesChanged, "temporaries_changed"},
    {CompareVerdictId::kUnattributedChanged, "unattributed_changed"},
    {CompareVerdictId::kEvalOutputsChanged, "eval_outputs_changed"},
    {CompareVerdictId::kNoChange, "no_change"},
};

// The rows follow the enum, so a kind is found by its value.
static_assert(rows_follow_ids(kCompareVerdicts, static_cast<size_t>(CompareVerdictId::kNoChange) + 1),
              "kCompareVerdicts: one row per CompareVerdictId, in order");

/// The largest gap between live blocks of any segment: a free block.
int64_t largest_free_block(const std::vector<SegmentView>& segments) {
  int64_t largest = 0;
  for (const SegmentView& s : segments) {
    int64_t at = 0;
    for (const auto& b : s.blocks) {
      largest = std::max(largest, b.offset - at);
      at = std::max(at, b.offset + b.size);
    }
    largest = std::max(largest, s.size - at);
  }
  return largest;
}

CompareSide side_of(const Diagnosis& d, const std::vector<SiteBytes>** sites) {
  CompareSide s;
  s.file = d.file;
  s.device = d.trace.device;
  s.other_devices = static_cast<int64_t>(d.other_devices.size());
  s.ooms = static_cast<int64_t>(d.ooms.size());
  if (!d.ooms.empty()) {
    const OomReport& o = d.ooms.back();
    s.moment = "at the last out-of-memory";
    s.allocated_bytes = o.allocated_bytes;
    s.reserved_bytes = o.reserved_bytes;
    s.by_category = o.live_by_category;
    *sites = &d.oom_sites;
  } else {
    s.moment = "at the peak";
    s.allocated_bytes = d.peak.allocated_bytes;
    s.reserved_bytes = d.peak.reserved_bytes;
    s.by_category = d.peak.by_category;
    *sites = &d.peak.sites;
  }
  s.reserved_free_bytes = s.reserved_bytes - s.allocated_bytes;
  s.segments = static_cast<int64_t>(d.segment_map.size());
  s.largest_free_block_bytes = largest_free_block(d.segment_map);
  return s;
}

/// "the micro-batch or the sequence length doubled" for a ratio B/A of activations.
std::string why_activations(double ratio) {
  if (std::abs(ratio - 2.0) <= kRatioTolerance * 2.0) return "the micro-batch or the sequence length doubled";
  if (std::abs(ratio - 0.5) <= kRatioTolerance * 0.5) return "the micro-batch or the sequence length halved";
  if (ratio > 1.0) return "the micro-batch or the sequence length grew (attention scores grow with its square)";
  return "a smaller micro-batch or sequence, or activation checkpointing";
}

}  // namespace

const char* compare_row_name(int row) {
  return row == kReservedFreeRow ? "reserved_free" : category_name(static_cast<Category>(row));
}

const char* compare_verdict_name(CompareVerdictId id) { return kCompareVerdicts[static_cast<size_t>(id)].name; }

Comparison compare(const Diagnosis& before, const Diagnosis& after, int top) {
  Comparison c;
  const std::vector<SiteBytes>* before_sites = nullptr;
  const std::vector<SiteBytes>* after_sites = nullptr;
  c.group_by = before.group_by;
  c.before = side_of(before, &before_sites);
  c.after = side_of(after, &after_sites);
  for (int r = 0; r < kNumCategories; ++r) {
    c.before_rows[static_cast<size_t>(r)] = c.before.by_category[static_cast<size_t>(r)];
    c.after_rows[static_cast<size_t>(r)] = c.after.by_category[static_cast<size_t>(r)];
  }
  c.before_rows[kReservedFreeRow] = c.before.reserved_free_bytes;
  c.after_rows[kReservedFreeRow] = c.after.reserved_free_bytes;
  c.significant_bytes = std::max<int64_t>(
      kMinSignificantBytes, std::llround(kSignificantShare * static_cast<double>(std::max(c.before.allocated_bytes,
                                                                                          c.after.allocated_bytes))));

  // Layers, matched by their description.
  std::map<std::string, LayerChange> layers;
  for (const SiteBytes& s : *before_sites) {
    LayerChange& l = layers[s.site];
    l.layer = s.site;
    l.before_bytes += s.bytes;
    l.category = s.category;
  }
  for (const SiteBytes& s : *after_sites) {
    LayerChange& l = layers[s.site];
    l.layer = s.site;
    if (s.bytes >= l.before_bytes) l.category = s.category;
    l.after_bytes += s.bytes;
  }
  for (auto& [name, l] : layers) {
    if (l.change_bytes() != 0) c.layers.push_back(l);
  }
  std::stable_sort(c.layers.begin(), c.layers.end(), [](const LayerChange& a, const LayerChange& b) {
    return std::abs(a.change_bytes()) > std::abs(b.change_bytes());
  });

  auto row_change = [&](int r) { return c.after_rows[static_cast<size_t>(r)] - c.before_rows[static_cast<size_t>(r)]; };
  auto significant = [&](int64_t bytes) { return std::abs(bytes) >= c.significant_bytes; };
  auto add = [&](CompareVerdictId id, int64_t change, std::string sentence) {
    c.verdicts.push_back(CompareVerdict{id, std::move(sentence), change});
  };
  const auto row = [&](std::array<int64_t, kNumCompareRows>& rows, Category k) { return rows[static_cast<size_t>(k)]; };

  // Appeared or gone: optimizer state, gradients.
  struct Presence {
    Category category;
    CompareVerdictId appeared, gone;
    const char* after_what;
  };
  for (const Presence& p : {Presence{Category::kOptimizerState, CompareVerdictId::kOptimizerStateAppeared,
                                     CompareVerdictId::kOptimizerStateGone, "the first optimizer step"},
                            Presence{Category::kGradients, CompareVerdictId::kGradientsAppeared,
                                     CompareVerdictId::kGradientsGone, "a backward pass"}}) {
    const int64_t a = row(c.before_rows, p.category), b = row(c.after_rows, p.category);
    std::string name = category_name(p.category);
    std::replace(name.begin(), name.end(), '_', ' ');
    if (significant(b) && a * kAppearedRatio < b) {
      // The optimizer the frames name, and its states against the parameters (AdamW's fp32 states: 2.00 x).
      const OptimizerKind* optimizer = after.optimizer;
      const int64_t params_after = row(c.after_rows, Category::kParameters);
      const std::string kind = p.category != Category::kOptimizerState || !optimizer ||
                                       optimizer->states_per_parameter == 0 || params_after <= 0
                                   ? ""
                                   : fmt::format(" ({} keeps {} per parameter; here {:.2f} x the parameters' bytes)",
                                                 optimizer->name, count_states(optimizer->states_per_parameter),
                                                 static_cast<double>(b) / static_cast<double>(params_after));
      add(p.appeared, b - a,
          fmt::format("{} appeared ({}): this snapshot is after {}{}", name, format_bytes(b), p.after_what, kind));
    } else if (significant(a) && b * kAppearedRatio < a) {
      add(p.gone, b - a,
          fmt::format("{} is gone ({} before): this snapshot is before {}, or it was freed", name, format_bytes(a),
                      p.after_what));
    }
  }

  // Activations, named by the layer whose activations changed most.
  const int64_t act_a = row(c.before_rows, Category::kActivations), act_b = row(c.after_rows, Category::kActivations);
  if (significant(act_b - act_a)) {
    const auto layer = std::find_if(c.layers.begin(), c.layers.end(),
                                    [](const LayerChange& l) { return l.category == Category::kActivations; });
    const std::string where = layer == c.layers.end() ? "" : fmt::format(" in {}", layer->layer);
    const std::string layer_change =
        layer == c.layers.end()
            ? ""
            : fmt::format(" {} {}", act_b > act_a ? "grew" : "shrank", format_bytes(std::abs(layer->change_bytes())));
    if (act_a == 0) {
      add(CompareVerdictId::kActivationsGrew, act_b - act_a,
          fmt::format("activations appeared ({}){}: this snapshot holds a forward pass", format_bytes(act_b), where));
    } else {
      const double ratio = static_cast<double>(act_b) / static_cast<double>(act_a);
      add(act_b > act_a ? CompareVerdictId::kActivationsGrew : CompareVerdictId::kActivationsShrank, act_b - act_a,
          fmt::format("activations{}{} ({} -> {} in all, x{:.2f}): {}", where, layer_change, format_bytes(act_a),
                      format_bytes(act_b), ratio, why_activations(ratio)));
    }
  }
  const int64_t params = row_change(static_cast<int>(Category::kParameters));
  if (significant(params)) {
    add(params > 0 ? CompareVerdictId::kParametersGrew : CompareVerdictId::kParametersShrank, params,
        fmt::format("parameters {} {} ({} -> {}): another or a {} model, or weights {}", params > 0 ? "grew" : "shrank",
                    format_bytes(std::abs(params)), format_bytes(row(c.before_rows, Category::kParameters)),
                    format_bytes(row(c.after_rows, Category::kParameters)), params > 0 ? "bigger" : "smaller",
                    params > 0 ? "copied twice" : "no longer copied twice"));
  }
  const int64_t holes = row_change(kReservedFreeRow);
  if (significant(holes)) {
    add(holes > 0 ? CompareVerdictId::kReservedFreeGrew : CompareVerdictId::kReservedFreeShrank, holes,
        fmt::format("reserved but free {} {} ({} -> {}) with {:+} segments; the largest free block {}: {}",
                    holes > 0 ? "grew" : "shrank", format_bytes(std::abs(holes)),
                    format_bytes(c.before.reserved_free_bytes), format_bytes(c.after.reserved_free_bytes),
                    c.after.segments - c.before.segments,
                    c.before.largest_free_block_bytes == c.after.largest_free_block_bytes
                        ? fmt::format("stayed {}", format_bytes(c.after.largest_free_block_bytes))
                        : fmt::format("went from {} to {}", format_bytes(c.before.largest_free_block_bytes),
                                      format_bytes(c.after.largest_free_block_bytes)),
                    holes > 0 ? "more memory sits in holes (fragmentation; expandable_segments)"
                              : "fewer holes (less fragmentation)"));
  }
  const int64_t temps = row_change(static_cast<int>(Category::kTemporaries));
  if (significant(temps)) {
    add(CompareVerdictId::kTemporariesChanged, temps,
        fmt::format("temporaries alive then {} {}", temps > 0 ? "grew" : "shrank", format_bytes(std::abs(temps))));
  }
  const int64_t other = row_change(static_cast<int>(Category::kUnattributed));
  if (significant(other)) {
    add(CompareVerdictId::kUnattributedChanged, other,
        fmt::format("bytes outside forward, backward and the optimizer (allocated before recording began, or kept "
                    "by the script) {} {}",
                    other > 0 ? "grew" : "shrank", format_bytes(std::abs(other))));
  }
  const int64_t eval = row_change(static_cast<int>(Category::kEvalOutputs));
  if (significant(eval)) {
    add(CompareVerdictId::kEvalOutputsChanged, eval,
        fmt::format("evaluation outputs kept on the device (Hugging Face Trainer's, before they go to the CPU) {} "
                    "{}: {}",
                    eval > 0 ? "grew" : "shrank", format_bytes(std::abs(eval)),
                    eval > 0 ? "more evaluation steps accumulated, or larger outputs a step"
                             : "fewer evaluation steps accumulated (eval_accumulation_steps), or smaller outputs"));
  }
  std::stable_sort(c.verdicts.begin(), c.verdicts.end(), [](const CompareVerdict& a, const CompareVerdict& b) {
    return std::abs(a.change_bytes) > std::abs(b.change_bytes);
  });
  if (c.verdicts.empty()) {
    add(CompareVerdictId::kNoChange, c.after.allocated_bytes - c.before.allocated_bytes,
        fmt::format("no significant difference: every category within {}", format_bytes(c.significant_bytes)));
  }
  if (top >= 0 && c.layers.size() > static_cast<size_t>(top)) c.layers.resize(static_cast<size_t>(top));
  return c;
}

}  // namespace oomtune::diagnose
