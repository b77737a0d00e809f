#include "job/length_distribution.h"

#include <algorithm>

#include <fmt/format.h>

#include "common/error.h"
#include "common/text_file.h"

namespace oomtune {
namespace {

/// SplitMix64 (see the header).
class SplitMix64 {
 public:
  explicit SplitMix64(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() {
    std::uint64_t z = (state_ += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  /// Uniform in [0, n), n >= 1: draws past the largest multiple of n are
  /// rejected so every value is equally likely.
  std::uint64_t below(std::uint64_t n) {
    const std::uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    std::uint64_t x = next();
    while (x >= limit) x = next();
    return x % n;
  }

 private:
  std::uint64_t state_;
};

}  // namespace

LengthDistribution LengthDistribution::fixed(int64_t length) {
  LengthDistribution d;
  d.kind = Kind::kFixed;
  d.min = d.max = length;
  return d;
}

LengthDistribution LengthDistribution::uniform(int64_t min, int64_t max) {
  LengthDistribution d;
  d.kind = Kind::kUniform;
  d.min = min;
  d.max = max;
  return d;
}

LengthDistribution LengthDistribution::histogram(std::vector<int64_t> observed) {
  LengthDistribution d;
  d.kind = Kind::kHistogram;
  d.observed = std::move(observed);
  if (!d.observed.empty()) {
    const auto [shortest, longest] = std::minmax_element(d.observed.begin(), d.observed.end());
    d.min = *shortest;
    d.max = *longest;
  }
  return d;
}

std::string describe_lengths(const LengthDistribution& d, const std::string& file) {
  switch (d.kind) {
    case LengthDistribution::Kind::kFixed:
      return fmt::format("{} tokens", d.min);
    case LengthDistribution::Kind::kUniform:
      return fmt::format("uniform over {} to {} tokens", d.min, d.max);
    case LengthDistribution::Kind::kHistogram:
      return fmt::format("the histogram in {} ({} lengths, {} to {} tokens)", file, d.observed.size(), d.min, d.max);
  }
  return "?";
}

std::vector<int64_t> draw_lengths(const LengthDistribution& distribution, int64_t steps, std::uint64_t seed) {
  if (steps < 0) throw InputError(fmt::format("length draw: {} steps", steps));
  using Kind = LengthDistribution::Kind;
  if (distribution.kind == Kind::kHistogram) {
    if (distribution.observed.empty()) throw InputError("length draw: the histogram has no lengths");
    for (int64_t length : distribution.observed)
      if (length < 1) throw InputError(fmt::format("length draw: the histogram holds length {} (>= 1)", length));
  } else {
    if (distribution.min < 1) throw InputError(fmt::format("length draw: min {} (lengths are >= 1)", distribution.min));
    if (distribution.min > distribution.max)
      throw InputError(fmt::format("length draw: min {} > max {}", distribution.min, distribution.max));
  }
  SplitMix64 rng(seed);
  std::vector<int64_t> lengths;
  lengths.reserve(static_cast<std::size_t>(steps));
  for (int64_t s = 0; s < steps; ++s) {
    switch (distribution.kind) {
      case Kind::kFixed:
        lengths.push_back(distribution.min);
        break;
      case Kind::kUniform: {
        const auto span = static_cast<std::uint64_t>(distribution.max - distribution.min) + 1;
        lengths.push_back(distribution.min + static_cast<int64_t>(rng.below(span)));
        break;
      }
      case Kind::kHistogram:
        lengths.push_back(distribution.observed[rng.below(distribution.observed.size())]);
        break;
    }
  }
  return lengths;
}

std::vector<int64_t> read_length_histogram(const std::string& path) {
  const std::string text = read_text_file(path, "length histogram");
  std::vector<int64_t> lengths;
  std::size_t line_number = 0, begin = 0;
  while (begin <= text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line_number;
    std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    const auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos || line[first] == '#') {
      if (end == text.size()) break;
      continue;
    }
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    std::size_t used = 0;
    int64_t value = 0;
    try {
      value = std::stoll(line, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != line.size() || value < 1)
      throw InputError(fmt::format("{}:{}: not a positive integer: '{}'", path, line_number, line));
    lengths.push_back(value);
    if (end == text.size()) break;
  }
  if (lengths.empty()) throw InputError(fmt::format("{}: no lengths (one positive integer per line)", path));
  return lengths;
}

}  // namespace oomtune
