#include "allocsim/bucketing.h"

#include <fmt/format.h>

#include "common/error.h"

namespace oomtune::allocsim {

std::string Bucketing::name() const {
  switch (kind) {
    case Kind::kNone:
      return "as drawn";
    case Kind::kMultiple:
      return fmt::format("padded to a multiple of {}", multiple);
    case Kind::kPowerOfTwo:
      return "padded to a power of two";
  }
  return "?";
}

int64_t pad_length(int64_t length, const Bucketing& bucketing) {
  if (length < 1) throw InputError(fmt::format("padding: length {} (lengths are >= 1)", length));
  switch (bucketing.kind) {
    case Bucketing::Kind::kNone:
      return length;
    case Bucketing::Kind::kMultiple:
      if (bucketing.multiple < 1) throw InputError(fmt::format("padding: multiple {} (>= 1)", bucketing.multiple));
      return (length + bucketing.multiple - 1) / bucketing.multiple * bucketing.multiple;
    case Bucketing::Kind::kPowerOfTwo: {
      int64_t padded = 1;
      while (padded < length) padded *= 2;
      return padded;
    }
  }
  return length;
}

}  // namespace oomtune::allocsim
