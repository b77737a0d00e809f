#include "allocsim/allocsim_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <vector>

#include "common/closest_name.h"
#include "common/error.h"

namespace oomtune::allocsim {

namespace rules = alloc_rules;

namespace {

constexpr int64_t kMB = int64_t{1} << 20;  // PyTorch's kMB: the unit of *_mb options

/// ConfigTokenizer: ',', ':', '[' and ']' are tokens of their own; spaces are
/// dropped (c10/core/AllocatorConfig.h).
std::vector<std::string> tokenize(std::string_view text) {
  std::vector<std::string> tokens;
  std::string current;
  for (char c : text) {
    if (c == ',' || c == ':' || c == '[' || c == ']') {
      if (!current.empty()) tokens.push_back(std::move(current));
      current.clear();
      tokens.emplace_back(1, c);
    } else if (c != ' ') {
      current += c;
    }
  }
  if (!current.empty()) tokens.push_back(std::move(current));
  return tokens;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text), tokens_(tokenize(text)) {}

  rules::AllocatorConfig parse() {
    rules::AllocatorConfig config;
    while (i_ < tokens_.size()) {
      const std::string key = tokens_[i_++];
      if (key == "max_split_size_mb") {
        config.max_split_size = mib_at_least_20(key);
      } else if (key == "max_non_split_rounding_mb") {
        config.max_non_split_rounding_size = mib_at_least_20(key);
      } else if (key == "garbage_collection_threshold") {
        expect(":", key);
        const double value = number(key);
        if (!(value > 0.0 && value < 1.0)) {
          fail(key, "a number in (0.0, 1.0)", tokens_[i_ - 1]);
        }
        config.garbage_collection_threshold = value;
      } else if (key == "roundup_power2_divisions") {
        parse_divisions(config, key);
      } else if (key == "expandable_segments") {
        expect(":", key);
        config.expandable_segments = boolean(key);
      } else if (is_ignored(key)) {
        skip_value(key);
      } else {
        throw ConfigError(fmt::format("allocator config '{}': unknown key '{}' ({})", std::string(text_), key,
                                      suggest(key, known_keys())));
      }
      if (i_ < tokens_.size()) expect(",", key);
    }
    return config;
  }

 private:
  static const std::vector<std::string>& known_keys() {
    static const std::vector<std::string> kKeys = {"max_split_size_mb",
                                                   "max_non_split_rounding_mb",
                                                   "garbage_collection_threshold",
                                                   "roundup_power2_divisions",
                                                   "expandable_segments",
                                                   "backend",
                                                   "release_lock_on_cudamalloc",
                                                   "pinned_use_cuda_host_register",
                                                   "pinned_num_register_threads",
                                                   "pinned_use_background_threads",
                                                   "graph_capture_record_stream_reuse",
                                                   "per_process_memory_fraction",
                                                   "pinned_reserve_segment_size_mb",
                                                   "expandable_segments_handle_type"};
    return kKeys;
  }

  static bool is_ignored(const std::string& key) {
    const auto& keys = known_keys();
    return std::find(keys.begin() + 5, keys.end(), key) != keys.end();
  }

  [[noreturn]] void fail(const std::string& key, std::string_view expected, std::string_view got) const {
    throw ConfigError(
        fmt::format("allocator config '{}': {} expects {}, got '{}'", std::string(text_), key, expected, got));
  }

  const std::string& next(const std::string& key, std::string_view expected) {
    if (i_ >= tokens_.size()) fail(key, expected, "end of text");
    return tokens_[i_++];
  }

  void expect(std::string_view token, const std::string& key) {
    const std::string& got = next(key, fmt::format("'{}'", token));
    if (got != token) fail(key, fmt::format("'{}'", token), got);
  }

  int64_t integer(const std::string& key) {
    const std::string& token = next(key, "a non-negative integer");
    errno = 0;
    char* end = nullptr;
    const unsigned long long value = std::strtoull(token.c_str(), &end, 10);
    if (token.empty() || token[0] == '-' || *end != '\0' || errno == ERANGE) {
      fail(key, "a non-negative integer", token);
    }
    return static_cast<int64_t>(std::min<unsigned long long>(value, INT64_MAX));
  }

  double number(const std::string& key) {
    const std::string& token = next(key, "a number");
    char* end = nullptr;
    const double value = std::strtod(token.c_str(), &end);
    if (token.empty() || *end != '\0') fail(key, "a number", token);
    return value;
  }

  bool boolean(const std::string& key) {
    const std::string& token = next(key, "True or False");
    if (token == "True" || token == "true") return true;
    if (token == "False" || token == "false") return false;
    fail(key, "True or False", token);
  }

  /// parseMaxSplitSize(): MiB, at least kLargeBuffer / kMB (20), clamped.
  int64_t mib_at_least_20(const std::string& key) {
    expect(":", key);
    const int64_t value = integer(key);
    if (value < rules::kLargeBuffer / kMB) fail(key, "a size in MiB >= 20", tokens_[i_ - 1]);
    return std::min(value, rules::kNoMaxSplitSize / kMB) * kMB;
  }

  /// parseRoundUpPower2Divisions().
  void parse_divisions(rules::AllocatorConfig& config, const std::string& key) {
    expect(":", key);
    auto& divisions = config.roundup_power2_divisions;
    auto check_divisions = [&](int64_t value) {
      if (value != 0 && !rules::is_power_of_two(value)) {
        fail(key, "divisions that are a power of 2 (or 0)", std::to_string(value));
      }
      return value;
    };
    if (i_ < tokens_.size() && tokens_[i_] == "[") {
      ++i_;
      bool first_value = true;
      std::size_t last_index = 0;
      while (i_ < tokens_.size() && tokens_[i_] != "]") {
        const std::string boundary = tokens_[i_++];
        expect(":", key);
        const int64_t value = check_divisions(integer(key));
        if (boundary == ">") {
          std::fill(divisions.begin() + static_cast<std::ptrdiff_t>(last_index + 1), divisions.end(), value);
        } else {
          char* end = nullptr;
          const long long mib = std::strtoll(boundary.c_str(), &end, 10);
          if (boundary.empty() || *end != '\0' || !rules::is_power_of_two(mib)) {
            fail(key, "an interval start in MiB that is a power of 2, or '>'", boundary);
          }
          std::size_t index = static_cast<std::size_t>(rules::floor_log2(mib));
          index = std::min(index, divisions.size() - 1);
          if (first_value) {
            std::fill(divisions.begin(), divisions.begin() + static_cast<std::ptrdiff_t>(index), value);
            first_value = false;
          }
          divisions[index] = value;
          last_index = index;
        }
        if (i_ < tokens_.size() && tokens_[i_] != "]") expect(",", key);
      }
      if (i_ >= tokens_.size()) fail(key, "a closing ']'", "end of text");
      ++i_;  // ']'
    } else {
      const int64_t value = integer(key);
      if (!rules::is_power_of_two(value)) {
        fail(key, "divisions that are a power of 2", std::to_string(value));
      }
      divisions.fill(value);
    }
  }

  void skip_value(const std::string& key) {
    expect(":", key);
    if (i_ < tokens_.size() && tokens_[i_] == "[") {
      while (i_ < tokens_.size() && tokens_[i_] != "]") ++i_;
      if (i_ >= tokens_.size()) fail(key, "a closing ']'", "end of text");
      ++i_;
    } else {
      next(key, "a value");
    }
  }

  std::string_view text_;
  std::vector<std::string> tokens_;
  std::size_t i_ = 0;
};

}  // namespace

rules::AllocatorConfig parse_alloc_conf(std::string_view text) { return Parser(text).parse(); }

std::string format_alloc_conf(const rules::AllocatorConfig& config) {
  const rules::AllocatorConfig defaults;
  std::vector<std::string> parts;
  if (config.max_split_size != defaults.max_split_size) {
    parts.push_back(fmt::format("max_split_size_mb:{}", config.max_split_size / kMB));
  }
  if (config.max_non_split_rounding_size != defaults.max_non_split_rounding_size) {
    parts.push_back(fmt::format("max_non_split_rounding_mb:{}", config.max_non_split_rounding_size / kMB));
  }
  if (config.roundup_power2_divisions != defaults.roundup_power2_divisions) {
    std::vector<std::string> entries;
    for (std::size_t i = 0; i < config.roundup_power2_divisions.size(); ++i) {
      entries.push_back(fmt::format("{}:{}", int64_t{1} << i, config.roundup_power2_divisions[i]));
    }
    parts.push_back(fmt::format("roundup_power2_divisions:[{}]", fmt::join(entries, ",")));
  }
  if (config.garbage_collection_threshold != defaults.garbage_collection_threshold) {
    parts.push_back(fmt::format("garbage_collection_threshold:{}", config.garbage_collection_threshold));
  }
  if (config.expandable_segments) parts.push_back("expandable_segments:True");
  return fmt::format("{}", fmt::join(parts, ","));
}

}  // namespace oomtune::allocsim
