// SVG with no scripts: tooltips are <title> elements, which browsers show
// on hover without running anything.

#include <algorithm>
#include <iterator>

#include <fmt/format.h>

#include "common/byte_size.h"
#include "diagnose/render.h"
#include "diagnose/svg_text.h"

namespace oomtune::diagnose {
namespace {

constexpr int kWidth = 1000;
constexpr int kLeft = 90;  // room for the y axis labels
constexpr int kPlotWidth = 860;
constexpr int kPlotTop = 50;
constexpr int kPlotHeight = 300;
constexpr int kMapRowHeight = 14;
constexpr int kMaxMapRows = 200;  // segments drawn; the rest are summarised

// Category colours (Category order).
constexpr const char* kColors[] = {"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};
static_assert(std::size(kColors) == kNumCategories, "kColors: one colour per Category");

}  // namespace

std::string render_svg(const Diagnosis& d) {
  const size_t rows = std::min<size_t>(d.segment_map.size(), kMaxMapRows);
  const int map_top = kPlotTop + kPlotHeight + 90;
  const int height = map_top + 30 + static_cast<int>(rows) * kMapRowHeight + 30;
  std::string out;
  out += fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
      "font-family=\"sans-serif\" font-size=\"11\">\n",
      kWidth, height, kWidth, height);
  out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const std::string verdict = d.verdicts.empty() ? "no out-of-memory" : verdict_kind(d.verdicts.front().id).title;
  out += fmt::format("<text x=\"10\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{} — {}</text>\n",
                     svg_escape(d.file), svg_escape(verdict));

  // ---- timeline
  int64_t y_max = 1;
  for (const auto& p : d.timeline) y_max = std::max({y_max, p.reserved_bytes, p.allocated_bytes});
  const int64_t x_min = d.timeline.empty() ? 0 : d.timeline.front().event_index;
  const int64_t x_max = d.timeline.empty() ? 1 : std::max(d.timeline.back().event_index, x_min + 1);
  auto x_of = [&](int64_t i) {
    return kLeft + static_cast<double>(i - x_min) / static_cast<double>(x_max - x_min) * kPlotWidth;
  };
  auto y_of = [&](int64_t bytes) {
    return kPlotTop + kPlotHeight - static_cast<double>(bytes) / static_cast<double>(y_max) * kPlotHeight;
  };
  out += fmt::format(
      "<text x=\"{}\" y=\"{}\" font-weight=\"bold\">Allocated by category and reserved, over trace "
      "events</text>\n",
      kLeft, kPlotTop - 8);
  out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"#999\"/>\n", kLeft,
                     kPlotTop, kPlotWidth, kPlotHeight);
  for (int k = 0; k <= 4; ++k) {
    const int64_t v = y_max * k / 4;
    out += fmt::format("<text x=\"{}\" y=\"{:.1f}\" text-anchor=\"end\">{}</text>\n", kLeft - 4, y_of(v) + 4,
                       format_bytes(v));
  }
  if (!d.timeline.empty()) {
    // Stacked areas, bottom category first.
    std::vector<int64_t> base(d.timeline.size(), 0);
    for (int c = 0; c < kNumCategories; ++c) {
      std::string upper, lower;
      for (size_t i = 0; i < d.timeline.size(); ++i) {
        const auto& p = d.timeline[i];
        const int64_t top = base[i] + std::max<int64_t>(0, p.by_category[static_cast<size_t>(c)]);
        upper += fmt::format("{:.1f},{:.1f} ", x_of(p.event_index), y_of(top));
      }
      for (size_t i = d.timeline.size(); i-- > 0;) {
        lower += fmt::format("{:.1f},{:.1f} ", x_of(d.timeline[i].event_index), y_of(base[i]));
      }
      for (size_t i = 0; i < d.timeline.size(); ++i) {
        base[i] += std::max<int64_t>(0, d.timeline[i].by_category[static_cast<size_t>(c)]);
      }
      out += fmt::format("<polygon points=\"{}{}\" fill=\"{}\" fill-opacity=\"0.85\"><title>{}</title></polygon>\n",
                         upper, lower, kColors[c], category_name(static_cast<Category>(c)));
    }
    std::string line;
    for (const auto& p : d.timeline) line += fmt::format("{:.1f},{:.1f} ", x_of(p.event_index), y_of(p.reserved_bytes));
    out += fmt::format(
        "<polyline points=\"{}\" fill=\"none\" stroke=\"black\" stroke-width=\"1.5\"><title>reserved"
        "</title></polyline>\n",
        line);
  }
  for (const OomReport& o : d.ooms) {
    const double x = x_of(o.event_index);
    out += fmt::format(
        "<line x1=\"{:.1f}\" y1=\"{}\" x2=\"{:.1f}\" y2=\"{}\" stroke=\"red\" stroke-width=\"2\" "
        "stroke-dasharray=\"4 2\"><title>out of memory: {} requested, {} allocated, {} reserved"
        "</title></line>\n",
        x, kPlotTop, x, kPlotTop + kPlotHeight, format_bytes(o.requested_bytes), format_bytes(o.allocated_bytes),
        format_bytes(o.reserved_bytes));
    out += fmt::format("<text x=\"{:.1f}\" y=\"{}\" fill=\"red\" text-anchor=\"end\">OOM {}</text>\n", x - 2,
                       kPlotTop + 12, format_bytes(o.requested_bytes));
  }
  // Legend.
  int lx = kLeft;
  const int ly = kPlotTop + kPlotHeight + 25;
  for (int c = 0; c < kNumCategories; ++c) {
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"10\" height=\"10\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{}"
        "</text>\n",
        lx, ly - 9, kColors[c], lx + 14, ly, category_name(static_cast<Category>(c)));
    lx += 125;
  }
  out += fmt::format(
      "<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/><text x=\"{}\" y=\"{}\">reserved"
      "</text>\n",
      lx, ly - 4, lx + 12, ly - 4, lx + 16, ly);

  // ---- segment map
  out += fmt::format(
      "<text x=\"10\" y=\"{}\" font-weight=\"bold\">Segment map {} ({} segments; grey = free, "
      "hatched = freed but pending, dashed outline = a private pool)</text>\n",
      map_top, svg_escape(d.map_moment), d.segment_map.size());
  int64_t largest = 1;
  for (const auto& s : d.segment_map) largest = std::max(largest, s.size);
  out +=
      "<defs><pattern id=\"pending\" width=\"4\" height=\"4\" patternUnits=\"userSpaceOnUse\">"
      "<path d=\"M0,4 L4,0\" stroke=\"#666\"/></pattern></defs>\n";
  for (size_t r = 0; r < rows; ++r) {
    const SegmentView& s = d.segment_map[r];
    const int y = map_top + 12 + static_cast<int>(r) * kMapRowHeight;
    const double scale = static_cast<double>(kPlotWidth) / static_cast<double>(largest);
    out +=
        fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{}</text>\n", kLeft - 4, y + 10, format_bytes(s.size));
    out += fmt::format(
        "<rect x=\"{}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"#ddd\" stroke=\"{}\" "
        "stroke-width=\"{}\"{}><title>segment 0x{:x}, {} ({} pool{}{}{})</title></rect>\n",
        kLeft, y, std::max(1.0, static_cast<double>(s.size) * scale), kMapRowHeight - 3,
        s.private_pool ? "#000" : "#888", s.private_pool ? "1" : "0.5",
        s.private_pool ? " stroke-dasharray=\"3,2\"" : "", s.address, format_bytes(s.size),
        s.is_large ? "large" : "small", s.is_expandable ? ", expandable" : "",
        s.private_pool ? "; a private memory pool: CUDA graphs or a torch.cuda.MemPool" : "",
        s.stream != 0 ? "; " + stream_text(s.stream) : "");
    for (const auto& b : s.blocks) {
      out += fmt::format(
          "<rect x=\"{:.1f}\" y=\"{}\" width=\"{:.1f}\" height=\"{}\" fill=\"{}\"><title>{} {}"
          "</title></rect>\n",
          kLeft + static_cast<double>(b.offset) * scale, y, std::max(0.5, static_cast<double>(b.size) * scale),
          kMapRowHeight - 3, b.allocated ? kColors[static_cast<size_t>(b.category)] : "url(#pending)",
          format_bytes(b.size), b.allocated ? category_name(b.category) : "pending free");
    }
  }
  if (d.segment_map.size() > rows) {
    out += fmt::format("<text x=\"{}\" y=\"{}\">... {} more segments</text>\n", kLeft,
                       map_top + 24 + static_cast<int>(rows) * kMapRowHeight, d.segment_map.size() - rows);
  }
  out += "</svg>\n";
  return out;
}

}  // namespace oomtune::diagnose
