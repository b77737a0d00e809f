#include "strategies/blockwise_quantization.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

// encode_scaled and decode_scaled have AVX2 paths, chosen at run time, where
// GCC's (or clang's) x86-64 intrinsics and target attributes exist.
#if defined(__x86_64__) && defined(__GNUC__)
#define OOMTUNE_AVX2_PATHS 1
#include <immintrin.h>
#else
#define OOMTUNE_AVX2_PATHS 0
#endif

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include "common/error.h"

namespace oomtune {
namespace {

// create_dynamic_map's defaults (bitsandbytes/functional.py):
// max_exponent_bits=7, total_bits=8.
constexpr int kMaxExponentBits = 7;
constexpr int kTotalBits = 8;

void check_float_cpu(const at::Tensor& x, const char* what) {
  if (!x.defined() || x.scalar_type() != at::kFloat || !x.device().is_cpu()) {
    throw ConfigError(
        std::string("quantize_blockwise: ") + what + " must be a defined float32 CPU tensor, got " +
        (x.defined() ? std::string(x.toString()) + " on " + x.device().str() : std::string("an undefined tensor")));
  }
}

void check_block_size(int64_t block_size) {
  if (block_size < 1) {
    throw ConfigError("quantize_blockwise: block_size must be >= 1, got " + std::to_string(block_size));
  }
}

}  // namespace

std::array<float, kMapSize> dynamic_map(bool is_signed) {
  // Mirrors create_dynamic_map line by line, with the same float32 torch ops
  // (linspace, add, div, mul by a double scalar), so the values are bit-equal.
  std::vector<float> data;
  data.reserve(kMapSize);
  const int non_sign_bits = kTotalBits - 1;  // bitsandbytes: "(1 if signed else 1)"
  auto append = [&data](const at::Tensor& t) {
    const float* p = t.data_ptr<float>();
    data.insert(data.end(), p, p + t.numel());
  };
  for (int i = 0; i < kMaxExponentBits; ++i) {
    const int64_t fraction_items = is_signed ? (int64_t{1} << (i + non_sign_bits - kMaxExponentBits)) + 1
                                             : (int64_t{1} << (i + non_sign_bits - kMaxExponentBits + 1)) + 1;
    const at::Tensor boundaries = at::linspace(0.1, 1, fraction_items, at::kFloat);
    const at::Tensor means = (boundaries.slice(0, 0, fraction_items - 1) + boundaries.slice(0, 1)) / 2.0;
    const double scale = std::pow(10.0, -(kMaxExponentBits - 1) + i);
    append((means * scale).contiguous());
    if (is_signed) append((means * (-scale)).contiguous());
  }
  // additional_items = 2^(non_sign_bits - max_exponent_bits) - 1 = 0 here.
  data.push_back(0.0f);
  data.push_back(1.0f);
  if (data.size() != static_cast<size_t>(kMapSize)) {
    throw Error("dynamic_map: expected " + std::to_string(kMapSize) + " values, got " + std::to_string(data.size()));
  }
  std::sort(data.begin(), data.end());
  std::array<float, kMapSize> values{};
  std::copy(data.begin(), data.end(), values.begin());
  return values;
}

QuantizationMap::QuantizationMap(const std::array<float, kMapSize>& values) : values_(values) {
  for (int k = 0; k < kMapSize; ++k) {
    if (!std::isfinite(values_[k])) {
      throw ConfigError("QuantizationMap: value " + std::to_string(k) + " is not finite");
    }
    if (k > 0 && values_[k] < values_[k - 1]) {
      throw ConfigError("QuantizationMap: values must be sorted ascending, got " + std::to_string(values_[k - 1]) +
                        " before " + std::to_string(values_[k]) + " at index " + std::to_string(k));
    }
  }
  for (int k = 0; k + 1 < kMapSize; ++k) {
    midpoints_[k] = 0.5f * (values_[k] + values_[k + 1]);
  }
  // No x is >= it: the last bucket's code, 255 for values >= 1.0, stays 255
  // at x = +inf too (with +inf here, 255 + 1 wrapped to code 0).
  midpoints_[kMapSize - 1] = std::numeric_limits<float>::quiet_NaN();
  int best = 0;
  for (int k = 1; k < kMapSize; ++k) {
    if (std::fabs(values_[k]) < std::fabs(values_[best])) best = k;
  }
  zero_code_ = static_cast<uint8_t>(best);

  // Note [Nearest code]: one bucket code per magnitude range [lo, hi), valid
  // if at most one midpoint lies in the range (x in [lo, hi) or (-hi, -lo]).
  const float* mid_begin = midpoints_.data();
  const float* mid_end = midpoints_.data() + kMapSize - 1;  // the finite midpoints
  auto count_le = [&](float x) {                            // midpoints <= x
    return static_cast<int>(std::upper_bound(mid_begin, mid_end, x) - mid_begin);
  };
  auto count_lt = [&](float x) {  // midpoints < x
    return static_cast<int>(std::lower_bound(mid_begin, mid_end, x) - mid_begin);
  };
  auto from_bits = [](uint32_t bits) {
    float f = 0;
    std::memcpy(&f, &bits, sizeof f);
    return f;
  };
  // The x at `position` in bucket `key` of the sign `negative` (1: x < 0).
  auto x_at = [&](uint32_t key, uint32_t negative, uint32_t at) {
    return from_bits(negative << 31 | key << kBucketShift | position(at, negative));
  };
  // The first position at which x in the bucket steps up to code e + 1,
  // midpoints_[e] <= x (kPositionMask + 1: none). In one bucket x grows with
  // its position and the comparison is monotone in x, so halving finds it.
  // The last bucket also takes every magnitude above it (the key is clamped
  // there): its step must then be the same all the way to infinity.
  auto threshold = [&](int e, uint32_t key, uint32_t negative) -> std::optional<uint32_t> {
    const float mid = midpoints_[e];
    if (key + 1 == kNumBuckets) {
      const float infinity = (negative ? -1.0f : 1.0f) * std::numeric_limits<float>::infinity();
      const bool up = mid <= x_at(key, negative, 0);
      if ((mid <= x_at(key, negative, kPositionMask)) != up || (mid <= infinity) != up) return std::nullopt;
      return up ? 0 : kPositionMask + 1;
    }
    uint32_t first = 0, past = kPositionMask + 1;
    while (first < past) {
      const uint32_t at = first + (past - first) / 2;
      if (mid <= x_at(key, negative, at))
        past = at;
      else
        first = at + 1;
    }
    return first;
  };
  bucket_entry_.assign(2 * kNumBuckets, 0);
  use_buckets_ = true;
  for (uint32_t key = 0; key < kNumBuckets && use_buckets_; ++key) {
    const float lo = from_bits(key << kBucketShift);
    const float hi =
        key + 1 == kNumBuckets ? std::numeric_limits<float>::infinity() : from_bits((key + 1) << kBucketShift);
    // Positive x in [lo, hi): code = #midpoints <= x.
    const int c_pos = count_le(lo);
    const int crossed_pos = count_lt(hi) - c_pos;
    // Negative x in (-hi, -lo]: code = #midpoints <= x.
    const int c_neg = count_le(-lo);
    const int crossed_neg = c_neg - count_le(-hi);
    if (crossed_pos > 1 || crossed_neg > 1) {
      use_buckets_ = false;
      break;
    }
    const int e_pos = c_pos;
    const int e_neg = std::max(c_neg - 1, 0);
    const std::optional<uint32_t> t_pos = threshold(e_pos, key, 0);
    const std::optional<uint32_t> t_neg = threshold(e_neg, key, 1);
    if (!t_pos || !t_neg) {
      use_buckets_ = false;
      break;
    }
    bucket_entry_[key] = static_cast<uint32_t>(e_pos) | *t_pos << 8;
    bucket_entry_[kNumBuckets + key] = static_cast<uint32_t>(e_neg) | *t_neg << 8;
  }
  if (!use_buckets_) bucket_entry_.clear();
}

#if OOMTUNE_AVX2_PATHS
namespace {

// QuantizationMap::encode_scaled, eight values at a time (the caller checked
// for AVX2): Encoder::operator() on vectors, one gather of the buckets'
// entries. The sign bit selects the negative half of the table.
__attribute__((target("avx2"))) void encode_scaled_avx2(const uint32_t* bucket_entry, uint32_t num_buckets,
                                                        int bucket_shift, const float* x, float scale, uint8_t* codes,
                                                        int64_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  const __m256i magnitude_mask = _mm256_set1_epi32(0x7FFFFFFF);
  const __m256i last_bucket = _mm256_set1_epi32(static_cast<int>(num_buckets - 1));
  const __m256i negative_half = _mm256_set1_epi32(static_cast<int>(num_buckets));
  const __m256i position_mask = _mm256_set1_epi32(static_cast<int>((1u << bucket_shift) - 1));
  const __m256i low_byte = _mm256_set1_epi32(0xFF);
  const __m256i one = _mm256_set1_epi32(1);
  const __m128i shift = _mm_cvtsi32_si128(bucket_shift);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256i bits = _mm256_castps_si256(_mm256_mul_ps(_mm256_loadu_ps(x + j), s));
    const __m256i magnitude = _mm256_and_si256(bits, magnitude_mask);
    const __m256i negative = _mm256_srai_epi32(bits, 31);  // all ones where x < 0
    __m256i key = _mm256_min_epu32(_mm256_srl_epi32(magnitude, shift), last_bucket);
    key = _mm256_add_epi32(key, _mm256_and_si256(negative, negative_half));
    const __m256i entry = _mm256_i32gather_epi32(reinterpret_cast<const int*>(bucket_entry), key, 4);
    const __m256i position = _mm256_and_si256(_mm256_xor_si256(magnitude, negative), position_mask);
    // All ones (-1) where the position is below the threshold: e there.
    const __m256i below = _mm256_cmpgt_epi32(_mm256_srli_epi32(entry, 8), position);
    const __m256i code = _mm256_add_epi32(_mm256_add_epi32(_mm256_and_si256(entry, low_byte), one), below);
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + j), _mm_packus_epi16(words, words));
  }
}

// QuantizationMap::decode_scaled, eight codes at a time (the caller checked
// for AVX2).
__attribute__((target("avx2"))) void decode_scaled_avx2(const float* values, const uint8_t* codes, float scale,
                                                        float* out, int64_t n) {
  const __m256 s = _mm256_set1_ps(scale);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256i index = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + j)));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(_mm256_i32gather_ps(values, index, 4), s));
  }
}

bool cpu_has_avx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

}  // namespace
#endif

void QuantizationMap::encode_scaled(const float* x, float scale, uint8_t* codes, int64_t n) const {
  int64_t j = 0;
#if OOMTUNE_AVX2_PATHS
  if (use_buckets_ && cpu_has_avx2()) {
    const int64_t whole = n - n % 8;
    encode_scaled_avx2(bucket_entry_.data(), kNumBuckets, kBucketShift, x, scale, codes, whole);
    j = whole;
  }
#endif
  const Encoder encode = encoder();
  for (; j < n; ++j) codes[j] = encode(x[j] * scale);
}

void QuantizationMap::decode_scaled(const uint8_t* codes, float scale, float* out, int64_t n) const {
  int64_t j = 0;
#if OOMTUNE_AVX2_PATHS
  if (cpu_has_avx2()) {
    j = n - n % 8;
    decode_scaled_avx2(values_.data(), codes, scale, out, j);
  }
#endif
  for (; j < n; ++j) out[j] = values_[codes[j]] * scale;
}

const QuantizationMap& QuantizationMap::dynamic(bool is_signed) {
  static const QuantizationMap kSigned(dynamic_map(true));
  static const QuantizationMap kUnsigned(dynamic_map(false));
  return is_signed ? kSigned : kUnsigned;
}

double QuantizationMap::max_error() const {
  double worst = 0.0;
  for (int k = 0; k + 1 < kMapSize; ++k) {
    worst = std::max(worst, (static_cast<double>(values_[k + 1]) - values_[k]) / 2.0);
  }
  const double range_low = values_[0] < 0.0f ? -1.0 : 0.0;
  worst = std::max(worst, static_cast<double>(values_[0]) - range_low);
  worst = std::max(worst, 1.0 - static_cast<double>(values_[kMapSize - 1]));
  return worst;
}

int64_t num_blocks(int64_t numel, int64_t block_size) {
  check_block_size(block_size);
  return (numel + block_size - 1) / block_size;
}

QuantizedTensor quantize_blockwise(const at::Tensor& x, const QuantizationMap& map, int64_t block_size) {
  check_float_cpu(x, "x");
  const int64_t numel = x.numel();
  const int64_t blocks = num_blocks(numel, block_size);
  const at::Tensor src = x.contiguous();
  QuantizedTensor q;
  q.codes = at::empty(x.sizes(), x.options().dtype(at::kByte));
  q.absmax = at::empty({blocks}, x.options().dtype(at::kFloat));
  const float* in = src.data_ptr<float>();
  uint8_t* codes = q.codes.data_ptr<uint8_t>();
  float* absmax = q.absmax.data_ptr<float>();
  at::parallel_for(0, blocks, kBlocksPerTask, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = b * block_size;
      const int64_t hi = std::min(numel, lo + block_size);
      float amax = 0.0f;
      for (int64_t j = lo; j < hi; ++j) amax = std::max(amax, std::fabs(in[j]));
      absmax[b] = amax;
      if (!(amax > 0.0f)) {
        std::fill(codes + lo, codes + hi, map.zero_code());
        continue;
      }
      map.encode_scaled(in + lo, 1.0f / amax, codes + lo, hi - lo);
    }
  });
  return q;
}

at::Tensor dequantize_blockwise(const QuantizedTensor& q, const QuantizationMap& map, int64_t block_size) {
  if (!q.codes.defined() || q.codes.scalar_type() != at::kByte || !q.codes.device().is_cpu()) {
    throw ConfigError("dequantize_blockwise: codes must be a uint8 CPU tensor");
  }
  check_float_cpu(q.absmax, "absmax");
  const int64_t numel = q.codes.numel();
  const int64_t blocks = num_blocks(numel, block_size);
  if (q.absmax.numel() != blocks) {
    throw ConfigError("dequantize_blockwise: absmax must have ceil(" + std::to_string(numel) + " / " +
                      std::to_string(block_size) + ") = " + std::to_string(blocks) + " elements, got " +
                      std::to_string(q.absmax.numel()));
  }
  const at::Tensor codes_c = q.codes.contiguous();
  const at::Tensor absmax_c = q.absmax.contiguous();
  at::Tensor out = at::empty(q.codes.sizes(), q.absmax.options());
  const uint8_t* codes = codes_c.data_ptr<uint8_t>();
  const float* absmax = absmax_c.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, blocks, kBlocksPerTask, [&](int64_t first, int64_t last) {
    for (int64_t b = first; b < last; ++b) {
      const int64_t lo = b * block_size;
      const int64_t hi = std::min(numel, lo + block_size);
      map.decode_scaled(codes + lo, absmax[b], dst + lo, hi - lo);
    }
  });
  return out;
}

}  // namespace oomtune
