#pragma once
// Blockwise dynamic quantization: the storage format of 8-bit optimizer
// states (Dettmers et al., "8-bit Optimizers via Block-wise Quantization",
// ICLR 2022, sections 2.1-2.2).
//
// - Saves: a float32 tensor of n elements is held in n bytes of codes plus one
//   float32 absmax per block of kBlockSize elements (about 1.002 bytes/element).
// - Costs: rounding error. Each element becomes absmax * map[code], the map
//   value nearest to element / absmax, so the error per element is at most
//   map_max_error() * absmax of its block (plus float rounding).
// - Cannot apply: to non-float32 or non-CPU tensors (this implementation is a
//   CPU loop; ConfigError otherwise).
//
// Note [Dynamic map]
// Rationale: optimizer states span several orders of magnitude within a block;
//   a linear 8-bit grid would flush the small ones to zero.
// Approach: 256 values that are 10^-k times a linear "fraction" grid, k = 6..0,
//   with more fraction values for larger exponents: bitsandbytes'
//   create_dynamic_map(signed, max_exponent_bits=7, total_bits=8)
//   (bitsandbytes/functional.py). Signed: 127 positive values, their 127
//   negatives, 0 and 1.0 (so the map has +1 but its most negative value is
//   -0.99296875). Unsigned: 254 positive values, 0 and 1.0.
// Limitations: values whose magnitude is below half the smallest non-zero code
//   (about 1e-7 of the block absmax) quantize to zero.
//
// Note [Nearest code]
// Rationale: an 8-step binary search per element, twice per parameter, made
//   the 8-bit step more than 2x slower than fp32 AdamW's.
// Approach: the float bits of |x| (exponent and top 7 mantissa bits) index a
//   bucket; when at most one midpoint between neighbouring map values falls
//   inside any bucket (checked for every bucket at construction), the nearest
//   code is the bucket's code plus one comparison with that midpoint. That
//   comparison is made once per bucket at construction too: the entry holds
//   the position in the bucket (the rest of |x|'s bits) from which x takes
//   the next code, so encoding is one load and an integer comparison. Same
//   result as the binary search (encode_by_search), which is kept as the
//   reference and as the fallback for maps that fail the check.
//   On a CPU with AVX2, encode_scaled does the same eight values at a time
//   by one gather of entries (decode_scaled: one gather of values).
// Limitations: 2 x 16257 four-byte entries (127 KiB) per map.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <vector>

#include <ATen/core/Tensor.h>

namespace oomtune {

/// Number of values in an 8-bit quantization map (2^8).
constexpr int kMapSize = 256;

/// Elements per quantization block; one float32 absmax per block. Source:
/// bitsandbytes' 8-bit optimizers (block size 2048, Dettmers et al. 2022, §2.1).
constexpr int64_t kBlockSize = 2048;

/// Quantization blocks per at::parallel_for task in the blockwise kernels and
/// the fused 8-bit AdamW step: 8 * kBlockSize elements = 64 KiB of float32,
/// enough work to amortize a task, small enough to balance a few cores.
constexpr int64_t kBlocksPerTask = 8;

/// The 256 values of bitsandbytes' dynamic (tree) quantization map, sorted
/// ascending, computed with the same float32 torch operations as
/// bitsandbytes.functional.create_dynamic_map(signed=is_signed). See Note
/// [Dynamic map]. Signed maps lie in [-0.99296875, 1], unsigned in [0, 1].
std::array<float, kMapSize> dynamic_map(bool is_signed);

/// A sorted 256-value map with the lookups quantization needs: value of a code
/// and nearest code of a value. See Note [Nearest code].
class QuantizationMap {
 public:
  /// Builds the lookups. Throws ConfigError unless `values` is sorted
  /// ascending (non-decreasing) and finite.
  explicit QuantizationMap(const std::array<float, kMapSize>& values);

  /// The shared dynamic map, signed (first moment) or unsigned (second moment).
  static const QuantizationMap& dynamic(bool is_signed);

  /// The map's values, sorted ascending.
  const std::array<float, kMapSize>& values() const { return values_; }

  /// Value of `code`.
  float decode(uint8_t code) const { return values_[code]; }

  /// Code of the map value nearest to `x` (x is normalized: usually in
  /// [-1, 1]; values outside saturate to the end codes). A value exactly on
  /// the midpoint of two neighbours takes the upper code. Equal to
  /// encode_by_search(x) for every non-NaN x; NaN gives an unspecified code.
  uint8_t encode(float x) const { return encoder()(x); }

  /// encode() as a small value holding the tables' addresses. In a loop
  /// that stores codes, a local Encoder stays in registers: a uint8_t store
  /// may alias anything, so the map's own members are loaded again after
  /// every one (the 8-bit AdamW step spent most of its time on that).
  class Encoder {
   public:
    uint8_t operator()(float x) const {
      if (!bucket_entry_) return search(midpoints_, x);
      uint32_t bits = 0;
      std::memcpy(&bits, &x, sizeof bits);
      const uint32_t magnitude = bits & 0x7FFFFFFFu;
      const uint32_t negative = bits >> 31;
      const uint32_t key = std::min(magnitude >> kBucketShift, kNumBuckets - 1);
      const uint32_t entry = bucket_entry_[key + negative * kNumBuckets];
      return static_cast<uint8_t>((entry & 0xFFu) + static_cast<uint32_t>(position(magnitude, negative) >= entry >> 8));
    }

   private:
    friend class QuantizationMap;
    Encoder(const uint32_t* bucket_entry, const float* midpoints)
        : bucket_entry_(bucket_entry), midpoints_(midpoints) {}
    const uint32_t* bucket_entry_;  // nullptr: the map uses the search
    const float* midpoints_;
  };
  /// codes[j] = encode(x[j] * scale) for 0 <= j < n: the same codes to the
  /// bit (a float multiply, then the same comparisons). On a CPU with AVX2
  /// (checked once, at run time) and a map that uses buckets, eight values
  /// at a time, by one gather of the buckets' entries: the encoding was
  /// most of the 8-bit AdamW step (bench/adamw8bit). `x` and `codes` may
  /// not overlap.
  void encode_scaled(const float* x, float scale, uint8_t* codes, int64_t n) const;

  /// out[j] = decode(codes[j]) * scale for 0 <= j < n, the same floats to
  /// the bit; on a CPU with AVX2, eight at a time by a gather from the
  /// values. `codes` and `out` may not overlap.
  void decode_scaled(const uint8_t* codes, float scale, float* out, int64_t n) const;

  /// This map's Encoder; valid while the map lives.
  Encoder encoder() const { return Encoder(use_buckets_ ? bucket_entry_.data() : nullptr, midpoints_.data()); }

  /// The reference nearest-code search: the number of midpoints between
  /// neighbouring values that are <= x, by branch-free halving (8 steps).
  uint8_t encode_by_search(float x) const { return search(midpoints_.data(), x); }

  /// True when encode() uses the bucket table (see Note [Nearest code]); false
  /// for maps with neighbours closer than a bucket, which use the search.
  bool uses_buckets() const { return use_buckets_; }

  /// midpoints()[k] = (values()[k] + values()[k + 1]) / 2 for k < 255, and
  /// NaN at 255, which no x is >= : encode(x) is the number of midpoints
  /// <= x (255 at most, for x >= 1.0 up to +inf).
  const std::array<float, kMapSize>& midpoints() const { return midpoints_; }

  /// Code of the value nearest to 0 (the code of zero if the map has one).
  uint8_t zero_code() const { return zero_code_; }

  /// Largest distance from a point of [-1, 1] (signed map, values()[0] < 0)
  /// or [0, 1] (unsigned) to its nearest map value: half the largest gap
  /// between neighbours, or the distance from an end of the range to the
  /// nearest end value, whichever is larger. Times a block's absmax, it
  /// bounds the quantization error of that block (Dettmers et al. 2022, §2.1).
  double max_error() const;

 private:
  // Note [Nearest code]: buckets keep 7 mantissa bits of |x|, so a bucket is
  // at most 2^-7 of its values wide (2^-8 of 1.0 just below 1.0), narrower
  // than the dynamic maps' steps (>= 0.9/128 near 1.0 for the unsigned map).
  static constexpr int kBucketMantissaBits = 7;
  static constexpr int kBucketShift = 23 - kBucketMantissaBits;  // float32: 23 mantissa bits
  // Buckets of magnitudes up to 1.0f (bits 0x3F800000); larger ones share the last.
  static constexpr uint32_t kNumBuckets = (0x3F800000u >> kBucketShift) + 1;
  // The bits of |x| below its bucket's key.
  static constexpr uint32_t kPositionMask = (1u << kBucketShift) - 1;

  // Where x lies in its bucket, growing with x: the bits of |x| below the
  // key, flipped for negative x (a larger magnitude is a smaller x there).
  static uint32_t position(uint32_t magnitude, uint32_t negative) {
    return (magnitude ^ (0u - negative)) & kPositionMask;
  }

  // encode_by_search over `midpoints` (kMapSize of them, the last +inf).
  static uint8_t search(const float* midpoints, float x) {
    int i = 0;
    for (int half = kMapSize / 2; half >= 1; half /= 2) {
      i += static_cast<int>(midpoints[i + half - 1] <= x) * half;
    }
    return static_cast<uint8_t>(i);
  }

  std::array<float, kMapSize> values_{};
  // midpoints_[k] = (values_[k] + values_[k + 1]) / 2; midpoints_[255] = NaN.
  std::array<float, kMapSize> midpoints_{};
  // Per bucket (positive magnitudes, then negative): in bits 0-7 the code e
  // such that the nearest code of any x in the bucket is e + (midpoints_[e]
  // <= x), and above them the threshold t (0 to kPositionMask + 1) such that
  // midpoints_[e] <= x exactly where position(x) >= t: the comparison
  // with the midpoint, made once per bucket here (Note [Nearest code]).
  std::vector<uint32_t> bucket_entry_;
  bool use_buckets_ = false;
  uint8_t zero_code_ = 0;
};

/// A tensor quantized blockwise: codes[i] is element i's code; absmax[b] is
/// the largest |x| in block b (elements [b*block_size, (b+1)*block_size)).
struct QuantizedTensor {
  at::Tensor codes;   ///< uint8, the original shape (numel elements)
  at::Tensor absmax;  ///< float32, shape {ceil(numel / block_size)}
};

/// Number of blocks of `block_size` elements that cover `numel` elements:
/// ceil(numel / block_size).
int64_t num_blocks(int64_t numel, int64_t block_size = kBlockSize);

/// Quantizes a float32 CPU tensor of any shape blockwise (row-major element
/// order): per block, absmax = max |x|, code = map.encode(x / absmax); a block
/// of zeros gets absmax 0 and the zero code. Throws ConfigError if `x` is not
/// a float32 CPU tensor or block_size < 1.
QuantizedTensor quantize_blockwise(const at::Tensor& x, const QuantizationMap& map, int64_t block_size = kBlockSize);

/// Inverse of quantize_blockwise: a float32 tensor of the codes' shape with
/// element i = map.decode(codes[i]) * absmax[i / block_size]. Throws
/// ConfigError if codes is not uint8 on CPU or absmax has the wrong length.
at::Tensor dequantize_blockwise(const QuantizedTensor& q, const QuantizationMap& map, int64_t block_size = kBlockSize);

}  // namespace oomtune
