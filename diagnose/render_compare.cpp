// Renderers of a Comparison (compare.h): text, JSON and SVG. They only read it.

#include <algorithm>
#include <cstdlib>
#include <iterator>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/byte_size.h"
#include "common/json_text.h"
#include "diagnose/compare.h"
#include "diagnose/render.h"
#include "diagnose/svg_text.h"

namespace oomtune::diagnose {
namespace {

using nlohmann::json;

/// "+2.00 GiB", "-512.00 MiB", "0 B".
std::string signed_bytes(int64_t bytes) {
  if (bytes == 0) return "0 B";
  return (bytes > 0 ? "+" : "-") + format_bytes(std::abs(bytes));
}

json side_json(const CompareSide& s) {
  return {{"file", s.file},
          {"device", s.device},
          {"other_devices", s.other_devices},
          {"moment", s.moment},
          {"allocated_bytes", s.allocated_bytes},
          {"reserved_bytes", s.reserved_bytes},
          {"reserved_free_bytes", s.reserved_free_bytes},
          {"segments", s.segments},
          {"largest_free_block_bytes", s.largest_free_block_bytes},
          {"ooms", s.ooms}};
}

// SVG geometry: labels left of kCompareLeft (kLabelChars at 11 px sans-serif,
// about 6 px a character), the bars, then a column for "N reserved".
constexpr int kCompareWidth = 1100;
constexpr int kCompareLeft = 300;
constexpr std::size_t kLabelChars = 48;
constexpr int kBarWidth = 680;
constexpr int kBarHeight = 28;
constexpr int kLayerRowHeight = 18;
constexpr size_t kMaxLayerRows = 20;
// Category colours as in the diagnose SVG (Category order), then reserved-but-free.
constexpr const char* kRowColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2",
                                      "#edc948", "#b07aa1", "#9c755f", "#d3d3d3"};
static_assert(std::size(kRowColors) == kNumCompareRows, "kRowColors: one colour per category, then reserved-but-free");

// `label` as one SVG text right-aligned at kCompareLeft: cut in the middle to
// kLabelChars where longer (a call site's file and its function both
// stay), the whole of it in a <title> then.
std::string left_label(const std::string& label, int y, const char* attributes = "") {
  if (label.size() <= kLabelChars)
    return fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\"{}>{}</text>\n", kCompareLeft - 6, y, attributes,
                       svg_escape(label));
  const std::size_t head = (kLabelChars - 3) / 2, tail = kLabelChars - 3 - head;
  return fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\"{}><title>{}</title>{}...{}</text>\n",
                     kCompareLeft - 6, y, attributes, svg_escape(label), svg_escape(label.substr(0, head)),
                     svg_escape(label.substr(label.size() - tail)));
}

}  // namespace

std::string render_compare_text(const Comparison& c) {
  std::string out = "oomtune diagnose --compare\n";
  for (const auto& [tag, side] : {std::pair{"A", &c.before}, std::pair{"B", &c.after}}) {
    // The device where it is not the only one or not device 0 (two ranks' snapshots).
    const std::string device =
        side->device != 0 || side->other_devices > 0
            ? fmt::format("device {}{}, ", side->device,
                          side->other_devices > 0 ? fmt::format(" of {} in the snapshot", side->other_devices + 1) : "")
            : "";
    out += fmt::format("  {}: {} ({}{}; {} out-of-memory event{})\n", tag, side->file, device, side->moment, side->ooms,
                       side->ooms == 1 ? "" : "s");
  }
  out += "\nVerdict (A -> B)\n";
  for (size_t i = 0; i < c.verdicts.size(); ++i) {
    out += fmt::format("  {}. {} [{}]\n", i + 1, c.verdicts[i].sentence, compare_verdict_name(c.verdicts[i].id));
  }
  out += fmt::format("\nWhat changed (a change below {} is not significant)\n", format_bytes(c.significant_bytes));
  out += fmt::format("  {:<22}{:>14}{:>14}{:>14}\n", "", "A", "B", "change");
  for (int r = 0; r < kNumCompareRows; ++r) {
    const int64_t a = c.before_rows[static_cast<size_t>(r)], b = c.after_rows[static_cast<size_t>(r)];
    out += fmt::format("  {:<22}{:>14}{:>14}{:>14}\n", compare_row_name(r), format_bytes(a), format_bytes(b),
                       signed_bytes(b - a));
  }
  const auto bytes_row = [&](const char* name, int64_t a, int64_t b) {
    out += fmt::format("  {:<22}{:>14}{:>14}{:>14}\n", name, format_bytes(a), format_bytes(b), signed_bytes(b - a));
  };
  bytes_row("allocated", c.before.allocated_bytes, c.after.allocated_bytes);
  bytes_row("reserved", c.before.reserved_bytes, c.after.reserved_bytes);
  out += fmt::format("  {:<22}{:>14}{:>14}{:>14}\n", "segments", c.before.segments, c.after.segments,
                     fmt::format("{:+}", c.after.segments - c.before.segments));
  bytes_row("largest free block", c.before.largest_free_block_bytes, c.after.largest_free_block_bytes);
  const char* what = c.group_by == GroupBy::kLayer ? "layer" : "call site";
  out += fmt::format("\nBy {} (largest changes first)\n", what);
  if (c.layers.empty()) out += fmt::format("  no {} changed\n", what);
  for (const LayerChange& l : c.layers) {
    out += fmt::format("  {:>12}  {:<16} {} ({} -> {})\n", signed_bytes(l.change_bytes()), category_name(l.category),
                       l.layer, format_bytes(l.before_bytes), format_bytes(l.after_bytes));
  }
  return out;
}

std::string render_compare_json(const Comparison& c) {
  json j;
  j["before"] = side_json(c.before);
  j["after"] = side_json(c.after);
  j["significant_bytes"] = c.significant_bytes;
  j["group_by"] = group_by_name(c.group_by);
  json rows = json::array();
  for (int r = 0; r < kNumCompareRows; ++r) {
    const int64_t a = c.before_rows[static_cast<size_t>(r)], b = c.after_rows[static_cast<size_t>(r)];
    rows.push_back({{"name", compare_row_name(r)}, {"before_bytes", a}, {"after_bytes", b}, {"change_bytes", b - a}});
  }
  j["categories"] = rows;
  json layers = json::array();
  for (const LayerChange& l : c.layers) {
    layers.push_back({{"layer", l.layer},
                      {"category", category_name(l.category)},
                      {"before_bytes", l.before_bytes},
                      {"after_bytes", l.after_bytes},
                      {"change_bytes", l.change_bytes()}});
  }
  j["layers"] = layers;
  json verdicts = json::array();
  for (const CompareVerdict& v : c.verdicts) {
    verdicts.push_back(
        {{"id", compare_verdict_name(v.id)}, {"sentence", v.sentence}, {"change_bytes", v.change_bytes}});
  }
  j["verdicts"] = verdicts;
  return json_text(j, 1) + "\n";
}

std::string render_compare_svg(const Comparison& c) {
  const size_t layer_rows = std::min(c.layers.size(), kMaxLayerRows);
  const int layers_top = 190;
  const int height = layers_top + 30 + static_cast<int>(layer_rows) * kLayerRowHeight + 20;
  std::string out = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n",
      kCompareWidth, height, kCompareWidth, height);
  out += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
                     svg_escape(c.verdicts.front().sentence));
  // Two stacked bars on one scale: categories, then reserved-but-free (the bar's end is reserved).
  const int64_t scale_max = std::max<int64_t>({1, c.before.allocated_bytes + c.before.reserved_free_bytes,
                                               c.after.allocated_bytes + c.after.reserved_free_bytes});
  const double per_byte = static_cast<double>(kBarWidth) / static_cast<double>(scale_max);
  int y = 45;
  for (const auto& [side, rows] : {std::pair{&c.before, &c.before_rows}, std::pair{&c.after, &c.after_rows}}) {
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kCompareLeft - 6, y + 12,
                       side == &c.before ? "A (before)" : "B (after)");
    out += left_label(side->moment, y + 25, " fill=\"#666\"");
    double x = kCompareLeft;
    for (int r = 0; r < kNumCompareRows; ++r) {
      const int64_t bytes = std::max<int64_t>(0, (*rows)[static_cast<size_t>(r)]);
      const double w = static_cast<double>(bytes) * per_byte;
      if (bytes > 0) {
        out += fmt::format(
            "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{}: {}"
            "</title></rect>\n",
            x, y, w, kBarHeight, kRowColors[r], compare_row_name(r), format_bytes(bytes));
      }
      x += w;
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\">{} reserved</text>\n", kCompareLeft + kBarWidth + 6, y + 18,
                       format_bytes(side->reserved_bytes));
    y += kBarHeight + 22;
  }
  int lx = 10;  // eight entries: from the left edge, they end before the width
  for (int r = 0; r < kNumCompareRows; ++r) {
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}"
        "</text>\n",
        lx, y, kRowColors[r], lx + 14, y + 9, compare_row_name(r));
    lx += 110;
  }
  // Layer changes: bars right of the axis grow, left of it shrink.
  out += fmt::format("<text x=\"10\" y=\"{}\" font-weight=\"bold\">By {}, B - A (largest changes first)</text>\n",
                     layers_top, c.group_by == GroupBy::kLayer ? "layer" : "call site");
  int64_t largest = 1;
  for (size_t i = 0; i < layer_rows; ++i) largest = std::max(largest, std::abs(c.layers[i].change_bytes()));
  const int axis = kCompareLeft + kBarWidth / 2;
  const double half = static_cast<double>(kBarWidth) / 2 - 10;
  for (size_t i = 0; i < layer_rows; ++i) {
    const LayerChange& l = c.layers[i];
    const int row_y = layers_top + 12 + static_cast<int>(i) * kLayerRowHeight;
    const double w =
        std::max(1.0, static_cast<double>(std::abs(l.change_bytes())) / static_cast<double>(largest) * half);
    out += left_label(l.layer, row_y + 11);
    out += fmt::format(
        "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{} {}: {} -> {}"
        "</title></rect>\n",
        l.change_bytes() >= 0 ? axis : axis - w, row_y, w, kLayerRowHeight - 4,
        kRowColors[static_cast<size_t>(l.category)], svg_escape(l.layer), signed_bytes(l.change_bytes()),
        format_bytes(l.before_bytes), format_bytes(l.after_bytes));
  }
  if (layer_rows > 0) {
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n", axis, layers_top + 8, axis,
                       layers_top + 12 + static_cast<int>(layer_rows) * kLayerRowHeight);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace oomtune::diagnose
