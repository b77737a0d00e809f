#pragma once
// Tables of kinds indexed by their enum: a row is found by its id's value,
// which holds only while the rows are written in the enum's order.

#include <cstddef>

namespace oomtune {

/// True when `rows` has `count` rows and row i's `id` has the value i, so
/// that `rows[static_cast<size_t>(id)]` is the row of `id`. For a
/// static_assert beside the table. Row: any type with an enum member `id`.
template <typename Row, std::size_t N>
constexpr bool rows_follow_ids(const Row (&rows)[N], std::size_t count) {
  if (N != count) return false;
  for (std::size_t i = 0; i < N; ++i) {
    if (static_cast<std::size_t>(rows[i].id) != i) return false;
  }
  return true;
}

}  // namespace oomtune
