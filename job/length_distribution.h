#pragma once
// The sequence lengths of a run whose batches vary in length (issue #47,
// item 2): drawn from a distribution with a seed, the same on every machine.
// The job's `seq = { min, max, distribution }` (job/job_spec.h) is one; the
// trials and the caching-allocator replay (allocsim/length_replay.h) draw
// from it. Padding to buckets is allocsim/bucketing.h.
//
// Rules:
// - The generator is SplitMix64 (Steele, Lea, Flood: "Fast splittable
//   pseudorandom number generators", OOPSLA 2014; the constants of Vigna's
//   splitmix64.c) with rejection sampling for a uniform integer: the
//   standard library's distributions differ between implementations, and a
//   length drawn here must be the same on every CI machine.
// - A histogram is the lengths observed in a dataset (one per line of a
//   file); a draw picks one of them uniformly, i.e. from their empirical
//   distribution.
// No libtorch.

#include <cstdint>
#include <string>
#include <vector>

namespace oomtune {

/// Where the lengths of a run come from.
struct LengthDistribution {
  enum class Kind {
    kFixed,      ///< every step at `min` (== max)
    kUniform,    ///< uniform over the integers in [min, max]
    kHistogram,  ///< one of `observed`, each equally likely
  };
  Kind kind = Kind::kFixed;
  int64_t min = 1;                ///< COUNT: tokens, the shortest (a histogram's: of `observed`)
  int64_t max = 1;                ///< COUNT: tokens, >= min, the longest
  std::vector<int64_t> observed;  ///< COUNT: tokens per sequence (histogram)

  static LengthDistribution fixed(int64_t length);
  static LengthDistribution uniform(int64_t min, int64_t max);
  static LengthDistribution histogram(std::vector<int64_t> observed);
};

/// The distribution in words: "uniform over 256 to 1024 tokens", "the
/// histogram in FILE (N lengths, 12 to 1024 tokens)" (`file` the
/// histogram's path), or "512 tokens".
std::string describe_lengths(const LengthDistribution& distribution, const std::string& file);

/// `steps` lengths drawn from `distribution` with `seed`. Throws InputError
/// for steps < 0, a length < 1, min > max, or an empty histogram.
std::vector<int64_t> draw_lengths(const LengthDistribution& distribution, int64_t steps, std::uint64_t seed);

/// The lengths of a histogram file: one positive integer per line (blank
/// lines and lines starting with '#' skipped). Throws InputError
/// "PATH:LINE: not a positive integer: 'TEXT'", or "PATH: no lengths".
std::vector<int64_t> read_length_histogram(const std::string& path);

}  // namespace oomtune
