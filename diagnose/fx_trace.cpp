#include "diagnose/fx_trace.h"

#include <algorithm>
#include <cstdint>
#include <string>

namespace oomtune::diagnose {
namespace {

constexpr std::string_view kFilePrefix = "File \"";
constexpr std::string_view kLineInfix = "\", line ";
constexpr std::string_view kNameInfix = ", in ";

/// One `File "PATH", line N, in NAME` line (leading spaces allowed), or false.
bool parse_frame_line(std::string_view line, Frame* frame) {
  const size_t start = line.find_first_not_of(' ');
  if (start == std::string_view::npos || line.substr(start, kFilePrefix.size()) != kFilePrefix) return false;
  line.remove_prefix(start + kFilePrefix.size());
  // A path may hold `", line ` itself: the last one before the number ends it.
  const size_t path_end = line.rfind(kLineInfix);
  if (path_end == std::string_view::npos) return false;
  std::string_view rest = line.substr(path_end + kLineInfix.size());
  int64_t number = 0;
  size_t digits = 0;
  while (digits < rest.size() && rest[digits] >= '0' && rest[digits] <= '9') {
    number = number * 10 + (rest[digits] - '0');
    if (number >= (int64_t{1} << 31)) return false;
    ++digits;
  }
  if (digits == 0 || rest.substr(digits, kNameInfix.size()) != kNameInfix) return false;
  std::string_view name = rest.substr(digits + kNameInfix.size());
  while (!name.empty() && (name.back() == '\r' || name.back() == ' ')) name.remove_suffix(1);
  frame->filename = std::string(line.substr(0, path_end));
  frame->name = std::string(name);
  frame->line = number;
  return !frame->filename.empty() && !frame->name.empty();
}

}  // namespace

std::vector<Frame> frames_of_fx_trace(std::string_view text) {
  std::vector<Frame> outermost_first;
  while (!text.empty()) {
    const size_t end = std::min(text.find('\n'), text.size());
    Frame f;
    if (parse_frame_line(text.substr(0, end), &f)) outermost_first.push_back(std::move(f));
    text.remove_prefix(std::min(end + 1, text.size()));
  }
  std::vector<Frame> out;
  const size_t keep = std::min(outermost_first.size(), kMaxFxTraceFrames);
  for (size_t i = 0; i < keep; ++i) out.push_back(std::move(outermost_first[outermost_first.size() - 1 - i]));
  return out;
}

bool is_fx_generated_file(std::string_view filename) {
  // torch/fx/graph_module.py: f"{FX_GRAPH_MODULE_FILE_PREFIX}_{hash}.py", FX_GRAPH_MODULE_FILE_PREFIX = "fx_generated_"
  constexpr std::string_view kPrefix = "fx_generated_";
  return filename.substr(0, kPrefix.size()) == kPrefix && filename.find('/') == std::string_view::npos;
}

}  // namespace oomtune::diagnose
