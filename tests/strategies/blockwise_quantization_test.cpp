// Blockwise dynamic quantization: the map as bitsandbytes defines it, the
// nearest-code search, and the round-trip error bound of Dettmers et al. 2022.

#include "strategies/blockwise_quantization.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "common/error.h"

namespace oomtune {
namespace {

// Slack for float32 rounding in x / absmax and code * absmax: a normalized
// value is off by at most ~1 ulp of 1, which can move it across a midpoint by
// that much, and the dequantized product is off by at most 1 ulp.
constexpr double kRoundingSlack = 4 * FLT_EPSILON;

TEST(DynamicMap, SignedHasBitsandbytesShape) {
  const auto map = dynamic_map(/*is_signed=*/true);
  ASSERT_EQ(map.size(), 256u);
  EXPECT_TRUE(std::is_sorted(map.begin(), map.end()));
  EXPECT_EQ(std::adjacent_find(map.begin(), map.end()), map.end()) << "duplicate values";
  // create_dynamic_map(signed=True) appends 0 and 1.0 to 127 means and their
  // 127 negatives, so the map has +1 but its smallest value is the negative
  // of the largest mean: linspace(0.1, 1, 65) -> 1 - 0.9 / 128.
  EXPECT_EQ(map[255], 1.0f);
  EXPECT_EQ(map[127], 0.0f);
  EXPECT_NEAR(map[0], -(1.0 - 0.9 / 128), 1e-7);
  EXPECT_NEAR(map[254], 1.0 - 0.9 / 128, 1e-7);
  // Smallest positive: mean of linspace(0.1, 1, 2) times 1e-6.
  EXPECT_NEAR(map[128], 0.55e-6, 1e-12);
  // Symmetric apart from +1: every negative value has its positive twin.
  for (int k = 0; k < 127; ++k) {
    EXPECT_EQ(map[k], -map[254 - k]) << "k=" << k;
  }
  // Decade i (values in (10^(i-7), 10^(i-6))) holds 2^i positive values.
  for (int i = 0; i < 7; ++i) {
    const double lo = std::pow(10.0, i - 7);
    const double hi = std::pow(10.0, i - 6);
    const auto count = std::count_if(map.begin(), map.end() - 1, [&](float v) { return v > lo && v < hi; });
    EXPECT_EQ(count, 1 << i) << "decade " << i;
  }
}

TEST(DynamicMap, UnsignedHasBitsandbytesShape) {
  const auto map = dynamic_map(/*is_signed=*/false);
  ASSERT_EQ(map.size(), 256u);
  EXPECT_TRUE(std::is_sorted(map.begin(), map.end()));
  EXPECT_EQ(std::adjacent_find(map.begin(), map.end()), map.end()) << "duplicate values";
  EXPECT_EQ(map[0], 0.0f);
  EXPECT_EQ(map[255], 1.0f);
  // Smallest positive: first mean of linspace(0.1, 1, 3) times 1e-6.
  EXPECT_NEAR(map[1], 0.325e-6, 1e-12);
  // Largest below 1: last mean of linspace(0.1, 1, 129).
  EXPECT_NEAR(map[254], 1.0 - 0.9 / 256, 1e-7);
  // Decade i holds 2^(i+1) values (one more fraction bit than signed).
  for (int i = 0; i < 7; ++i) {
    const double lo = std::pow(10.0, i - 7);
    const double hi = std::pow(10.0, i - 6);
    const auto count = std::count_if(map.begin(), map.end() - 1, [&](float v) { return v > lo && v < hi; });
    EXPECT_EQ(count, 2 << i) << "decade " << i;
  }
}

TEST(QuantizationMap, MaxErrorIsHalfTheWidestFractionStep) {
  // The widest gaps are in the top decade: 0.9/64 (signed), 0.9/128 (unsigned);
  // the ends of the range are exactly half such a gap from the end values.
  EXPECT_NEAR(QuantizationMap::dynamic(true).max_error(), 0.9 / 128, 1e-7);
  EXPECT_NEAR(QuantizationMap::dynamic(false).max_error(), 0.9 / 256, 1e-7);
}

TEST(QuantizationMap, EncodeFindsTheNearestValue) {
  at::manual_seed(1);
  for (bool is_signed : {true, false}) {
    const QuantizationMap& map = QuantizationMap::dynamic(is_signed);
    const auto& values = map.values();
    const at::Tensor xs = is_signed ? at::rand({20000}) * 2 - 1 : at::rand({20000});
    const float* x = xs.data_ptr<float>();
    for (int64_t i = 0; i < xs.numel(); ++i) {
      double best = std::numeric_limits<double>::infinity();
      for (float v : values) best = std::min(best, std::fabs(static_cast<double>(v) - x[i]));
      const double got = std::fabs(static_cast<double>(map.decode(map.encode(x[i]))) - x[i]);
      ASSERT_LE(got, best + FLT_EPSILON) << "x=" << x[i] << " signed=" << is_signed;
    }
    // Every map value encodes to itself; out-of-range values saturate.
    for (int k = 0; k < kMapSize; ++k) EXPECT_EQ(map.decode(map.encode(values[k])), values[k]);
    EXPECT_EQ(map.encode(2.0f), 255);
    EXPECT_EQ(map.encode(-2.0f), 0);
  }
  EXPECT_EQ(QuantizationMap::dynamic(true).decode(QuantizationMap::dynamic(true).zero_code()), 0.0f);
  EXPECT_EQ(QuantizationMap::dynamic(false).zero_code(), 0);
}

// Note [Nearest code]: the bucket lookup must give the binary search's code
// for every float; checked at every bucket edge (and one ulp either side) and
// at random magnitudes from 1e-12 to 10, both signs.
void expect_encode_matches_search(const QuantizationMap& map) {
  auto check = [&](float x) {
    ASSERT_EQ(map.encode(x), map.encode_by_search(x)) << "x=" << x;
    ASSERT_EQ(map.encode(-x), map.encode_by_search(-x)) << "x=" << -x;
  };
  for (uint32_t bits = 0; bits <= 0x40000000u; bits += 1u << 16) {
    float x = 0;
    std::memcpy(&x, &bits, sizeof x);
    check(x);
    check(std::nextafter(x, 0.0f));
    check(std::nextafter(x, 2.0f));
  }
  at::manual_seed(2);
  const at::Tensor xs = at::pow(10.0, at::rand({200000}, at::kDouble) * 13 - 12).to(at::kFloat);
  const float* x = xs.data_ptr<float>();
  for (int64_t i = 0; i < xs.numel(); ++i) check(x[i]);
  // Every float but NaN equally likely by its bits: any place in any
  // bucket, the clamped magnitudes above 1.0 and both infinities among them.
  const at::Tensor random_bits = at::randint(0, int64_t{0x7F800000} + 1, {200000}, at::kLong);
  const int64_t* random_bit = random_bits.data_ptr<int64_t>();
  for (int64_t i = 0; i < random_bits.numel(); ++i) {
    const auto bits = static_cast<uint32_t>(random_bit[i]);
    float y = 0;
    std::memcpy(&y, &bits, sizeof y);
    check(y);
  }
  for (float v : map.values()) check(v);
  for (size_t k = 0; k + 1 < map.values().size(); ++k) {
    const float mid = 0.5f * (map.values()[k] + map.values()[k + 1]);
    check(mid);
    check(std::nextafter(mid, -2.0f));
    check(std::nextafter(mid, 2.0f));
  }
}

// A linear map with steps of 2/255, which fits the buckets.
std::array<float, kMapSize> linear_values() {
  std::array<float, kMapSize> linear{};
  for (int k = 0; k < kMapSize; ++k) linear[k] = -1.0f + 2.0f * k / 255;
  return linear;
}

// The linear map with three values 1e-4 apart near 1: two midpoints in one
// bucket, so it uses the search.
std::array<float, kMapSize> crowded_values() {
  std::array<float, kMapSize> crowded = linear_values();
  crowded[252] = crowded[254] - 2e-4f;
  crowded[253] = crowded[254] - 1e-4f;
  return crowded;
}

TEST(QuantizationMap, InfinitiesSaturateToTheEndCodes) {
  for (bool is_signed : {true, false}) {
    const QuantizationMap& map = QuantizationMap::dynamic(is_signed);
    EXPECT_EQ(map.encode(std::numeric_limits<float>::infinity()), kMapSize - 1) << "signed=" << is_signed;
    EXPECT_EQ(map.encode_by_search(std::numeric_limits<float>::infinity()), kMapSize - 1);
    EXPECT_EQ(map.encode(-std::numeric_limits<float>::infinity()), 0) << "signed=" << is_signed;
    EXPECT_EQ(map.encode_by_search(-std::numeric_limits<float>::infinity()), 0);
  }
}

TEST(QuantizationMap, BucketLookupEqualsBinarySearch) {
  for (bool is_signed : {true, false}) {
    const QuantizationMap& map = QuantizationMap::dynamic(is_signed);
    EXPECT_TRUE(map.uses_buckets()) << "signed=" << is_signed;
    expect_encode_matches_search(map);
  }
  // A linear map with steps of 2/255 fits the buckets too; one with three
  // values 1e-4 apart near 1 (two midpoints in one bucket) does not, and
  // falls back to the search.
  const QuantizationMap linear_map(linear_values());
  EXPECT_TRUE(linear_map.uses_buckets());
  expect_encode_matches_search(linear_map);
  const QuantizationMap crowded_map(crowded_values());
  EXPECT_FALSE(crowded_map.uses_buckets());
  expect_encode_matches_search(crowded_map);
}

// encode_scaled (eight at a time by gathers on an AVX2 CPU, as CI's are)
// against encode of each product: every bucket edge and one ulp either side,
// both signs, the map's values and midpoints, infinities and random
// magnitudes, at three scales, from aligned and unaligned starts, with
// tails of 1-7 values.
TEST(QuantizationMap, EncodeScaledEqualsEncodeOfEachProduct) {
  std::vector<float> xs;
  for (uint32_t bits = 0; bits <= 0x40000000u; bits += 1u << 16) {
    float x = 0;
    std::memcpy(&x, &bits, sizeof x);
    for (float y : {x, std::nextafter(x, 0.0f), std::nextafter(x, 2.0f)}) {
      xs.push_back(y);
      xs.push_back(-y);
    }
  }
  at::manual_seed(3);
  const at::Tensor random = at::pow(10.0, at::rand({20001}, at::kDouble) * 14 - 12).to(at::kFloat) *
                            (at::randint(0, 2, {20001}, at::kFloat) * 2 - 1);
  xs.insert(xs.end(), random.data_ptr<float>(), random.data_ptr<float>() + random.numel());
  xs.push_back(std::numeric_limits<float>::infinity());
  xs.push_back(-std::numeric_limits<float>::infinity());
  const QuantizationMap linear_map(linear_values()), crowded_map(crowded_values());
  for (const QuantizationMap* map :
       {&QuantizationMap::dynamic(true), &QuantizationMap::dynamic(false), &linear_map, &crowded_map}) {
    std::vector<float> with_map = xs;
    for (float v : map->values()) with_map.insert(with_map.end(), {v, std::nextafter(v, 2.0f)});
    for (size_t k = 0; k + 1 < map->midpoints().size(); ++k) {  // the last is NaN
      const float m = map->midpoints()[k];
      with_map.insert(with_map.end(), {m, std::nextafter(m, -2.0f), std::nextafter(m, 2.0f)});
    }
    ASSERT_NE(with_map.size() % 8, 0u) << "a tail for the scalar loop";
    for (float scale : {1.0f, 1.0f / 3.7f, 0.0f}) {
      for (size_t offset : {0, 1, 5}) {
        const float* x = with_map.data() + offset;
        const int64_t n = static_cast<int64_t>(with_map.size() - offset);
        std::vector<uint8_t> codes(static_cast<size_t>(n), 0);
        map->encode_scaled(x, scale, codes.data(), n);
        for (int64_t j = 0; j < n; ++j)
          ASSERT_EQ(codes[static_cast<size_t>(j)], map->encode(x[j] * scale))
              << "x=" << x[j] << " scale=" << scale << " j=" << j << " uses_buckets=" << map->uses_buckets();
      }
    }
  }
}

// decode_scaled (eight at a time by a gather on an AVX2 CPU) against decode
// of each code times the scale: every code, from aligned and unaligned
// starts, with tails.
TEST(QuantizationMap, DecodeScaledEqualsDecodeOfEachCode) {
  std::vector<uint8_t> codes;
  for (int round = 0; round < 3; ++round)
    for (int k = 0; k < kMapSize; ++k) codes.push_back(static_cast<uint8_t>((k * 97 + round) % kMapSize));
  codes.push_back(255);
  for (bool is_signed : {true, false}) {
    const QuantizationMap& map = QuantizationMap::dynamic(is_signed);
    for (float scale : {1.0f, 0.37f, 0.0f}) {
      for (size_t offset : {0, 3}) {
        const int64_t n = static_cast<int64_t>(codes.size() - offset);
        std::vector<float> out(static_cast<size_t>(n), -1.0f);
        map.decode_scaled(codes.data() + offset, scale, out.data(), n);
        for (int64_t j = 0; j < n; ++j) {
          const uint8_t code = codes[offset + static_cast<size_t>(j)];
          ASSERT_EQ(out[static_cast<size_t>(j)], map.decode(code) * scale) << "code " << int{code};
        }
      }
    }
  }
}

TEST(QuantizationMap, RejectsUnsortedValues) {
  std::array<float, kMapSize> values = dynamic_map(true);
  std::swap(values[3], values[4]);
  EXPECT_THROW(QuantizationMap{values}, ConfigError);
}

// Quantizes x, checks shapes, and checks every block's max error against
// map.max_error() * absmax. Returns sum |x - x'| / sum |x|.
double round_trip(const at::Tensor& x, const QuantizationMap& map) {
  const QuantizedTensor q = quantize_blockwise(x, map);
  const int64_t n = x.numel();
  const int64_t blocks = (n + kBlockSize - 1) / kBlockSize;
  EXPECT_EQ(q.codes.scalar_type(), at::kByte);
  EXPECT_EQ(q.codes.sizes(), x.sizes());
  EXPECT_EQ(q.absmax.scalar_type(), at::kFloat);
  EXPECT_EQ(q.absmax.numel(), blocks);
  const at::Tensor back = dequantize_blockwise(q, map);
  EXPECT_EQ(back.sizes(), x.sizes());
  const at::Tensor flat = x.reshape({-1});
  const at::Tensor err = (back.reshape({-1}) - flat).abs();
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t lo = b * kBlockSize;
    const int64_t hi = std::min(n, lo + kBlockSize);
    const double absmax = flat.slice(0, lo, hi).abs().max().item<double>();
    EXPECT_FLOAT_EQ(q.absmax[b].item<float>(), static_cast<float>(absmax));
    const double bound = (map.max_error() + kRoundingSlack) * absmax;
    EXPECT_LE(err.slice(0, lo, hi).max().item<double>(), bound) << "block " << b;
  }
  return err.sum().item<double>() / flat.abs().sum().item<double>();
}

TEST(BlockwiseQuantization, SignedRoundTripOfNormalData) {
  at::manual_seed(0);
  // Sizes: one partial block, whole blocks, whole blocks plus a tail, 3-D.
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{{5}, {3 * 2048}, {10000}, {7, 33, 50}}) {
    const at::Tensor x = at::randn(shape) * 0.01;
    const double rel = round_trip(x, QuantizationMap::dynamic(true));
    // L1 error relative to L1 norm. Normal data over its block absmax
    // (~3.5 sigma) lies mostly in [0.1, 1], where the step is 0.9/64 = 0.014
    // and the mean error a quarter step, 0.0035, against a mean |x| / absmax
    // of ~0.23: ~1.5 %, less where the finer lower decades hold the data.
    // Measured 0.6-1.3 % for these shapes (seed 0).
    EXPECT_LT(rel, 0.02) << "numel " << x.numel();
  }
}

TEST(BlockwiseQuantization, UnsignedRoundTripOfSquares) {
  at::manual_seed(0);
  const at::Tensor g = at::randn({5 * 2048 + 17});
  const at::Tensor v = g * g * 1e-4;  // like a second moment
  const double rel = round_trip(v, QuantizationMap::dynamic(false));
  EXPECT_LT(rel, 0.02);  // as above: the unsigned map's steps are half as wide
}

TEST(BlockwiseQuantization, ZeroBlockStaysZeroAndConstantBlocksAreExact) {
  at::Tensor x = at::zeros({3 * 2048});
  x.slice(0, 2048, 4096).fill_(0.5f);
  x.slice(0, 4096, 6144).fill_(-0.25f);
  const QuantizationMap& map = QuantizationMap::dynamic(true);
  const QuantizedTensor q = quantize_blockwise(x, map);
  EXPECT_EQ(q.absmax[0].item<float>(), 0.0f);
  EXPECT_EQ(q.absmax[1].item<float>(), 0.5f);
  EXPECT_EQ(q.absmax[2].item<float>(), 0.25f);
  const at::Tensor back = dequantize_blockwise(q, map);
  EXPECT_TRUE(at::equal(back.slice(0, 0, 4096), x.slice(0, 0, 4096)));
  // The signed map has +1 but not -1 (Note [Dynamic map]): a block's most
  // negative element, when it sets the absmax, comes back as -0.99296875 of it.
  EXPECT_TRUE(at::allclose(back.slice(0, 4096), at::full({2048}, -0.25f * (1 - 0.9f / 128))));
}

TEST(BlockwiseQuantization, RejectsWrongInputs) {
  const QuantizationMap& map = QuantizationMap::dynamic(true);
  EXPECT_THROW(quantize_blockwise(at::zeros({10}, at::kDouble), map), ConfigError);
  EXPECT_THROW(quantize_blockwise(at::zeros({10}), map, 0), ConfigError);
  QuantizedTensor q = quantize_blockwise(at::zeros({5000}), map);
  q.absmax = at::zeros({2});
  EXPECT_THROW(dequantize_blockwise(q, map), ConfigError);
}

}  // namespace
}  // namespace oomtune
