#pragma once
// Human byte sizes, parsed and printed only at the edges of the program.
// Inside, bytes are int64_t.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace oomtune {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

/// Parses "8GiB", "7.5 GB", "512MiB", "1.5e9", "4096", "2 TiB" into bytes.
/// IEC suffixes (KiB, MiB, GiB, TiB) are powers of 1024; SI suffixes (kB/KB,
/// MB, GB, TB) powers of 1000; "B" or no suffix means bytes. Case of the
/// suffix is ignored except that "b" alone is not accepted as bits.
/// Returns nullopt on anything else (negative, empty, unknown suffix,
/// overflow past int64). Fractions are rounded down to whole bytes.
std::optional<int64_t> parse_byte_size(std::string_view text);

/// Bytes in IEC units with two decimals: "1.88 GiB", "512.00 MiB", "900 B".
std::string format_bytes(int64_t bytes);

}  // namespace oomtune
