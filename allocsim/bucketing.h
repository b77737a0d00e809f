#pragma once
// Padding sequence lengths up to buckets (issue #47, item 2): what a data
// loader that pads each batch to a multiple of 64 or to a power of two runs
// instead of the lengths drawn (job/length_distribution.h). Fewer distinct
// lengths mean fewer distinct block sizes for the caching allocator, at the
// cost of the padded tokens' compute. No libtorch.

#include <cstdint>
#include <string>

namespace oomtune::allocsim {

/// How lengths are padded before a step runs.
struct Bucketing {
  enum class Kind {
    kNone,        ///< as drawn
    kMultiple,    ///< up to the next multiple of `multiple`
    kPowerOfTwo,  ///< up to the next power of two
  };
  Kind kind = Kind::kNone;
  int64_t multiple = 1;  ///< COUNT: tokens (kMultiple), >= 1

  /// "as drawn", "padded to a multiple of 128", "padded to a power of two".
  std::string name() const;
};

/// `length` padded by `bucketing`. Throws InputError for length < 1 or a
/// multiple < 1.
int64_t pad_length(int64_t length, const Bucketing& bucketing);

}  // namespace oomtune::allocsim
