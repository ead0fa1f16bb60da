// Tests of kernels/philox.h: the generator against Random123's known answers, and the
// fill definition (counters, lanes, transforms) against values computed by hand, so
// that any drift in the public contract fails here.
#include "kernels/philox.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace gpucompute {
namespace {

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t expected[4];
};

// Known-answer vectors for philox4x32 with 10 rounds. The first three are the
// "philox4x32 10" lines of Random123's tests/kat_vectors
// (https://github.com/DEShawResearch/random123, tests/kat_vectors; columns CTR[4] KEY[2]
// EXPECTED[4]). The rest are "philox4x32 10" lines of Random123's generated
// examples/kat_vectors, as mirrored in github.com/girving/random123-manual
// (examples/kat_vectors at commit 61e8479252c42f0f8c0490dec55237d7c01bf509), chosen to
// exercise each counter and key word on its own.
constexpr Kat kKats[] = {
    {{0x00000000, 0x00000000, 0x00000000, 0x00000000},
     {0x00000000, 0x00000000},
     {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
    {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
     {0xffffffff, 0xffffffff},
     {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
    {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
     {0xa4093822, 0x299f31d0},
     {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    {{0x00000001, 0x00000000, 0x00000000, 0x00000000},
     {0x00000001, 0x00000000},
     {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093}},
    {{0x00000000, 0x00000000, 0x00000000, 0x00000001},
     {0x00000001, 0x00000000},
     {0x127bee41, 0x1e047488, 0x48842b20, 0x0a393496}},
    {{0x00000000, 0x00000001, 0x00000000, 0x00000000},
     {0x00000000, 0x00000001},
     {0x532f1322, 0x36c890fb, 0x6504b937, 0x07bbfef7}},
    {{0x00000000, 0x00000000, 0x00000001, 0x00000000},
     {0x00000000, 0x00000001},
     {0x7f6c13ff, 0x114b2447, 0x0550eced, 0xea1fc805}},
    {{0x00000000, 0xffffffff, 0x00000000, 0x00000000},
     {0x00000000, 0xffffffff},
     {0x5f9c47aa, 0x19861d86, 0xff2be81d, 0x4c7db17e}},
    {{0xa4093822, 0x299f31d0, 0x082efa98, 0xec4e6c89},
     {0x00000000, 0x80000000},
     {0xaa74e81c, 0xc9ddb97b, 0x2c2cd881, 0x9390c78d}},
};

TEST(PhiloxTest, KnownAnswerVectors) {
  for (const Kat& kat : kKats) {
    const PhiloxWords ctr = {{kat.ctr[0], kat.ctr[1], kat.ctr[2], kat.ctr[3]}};
    const PhiloxWords out = Philox4x32(ctr, PhiloxKey{{kat.key[0], kat.key[1]}});
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(out.w[j], kat.expected[j])
          << "ctr " << std::hex << kat.ctr[0] << " " << kat.ctr[1] << " " << kat.ctr[2] << " "
          << kat.ctr[3] << " word " << j;
    }
  }
}

// Seed and block index map to (low word, high word) of the key and counter.
TEST(PhiloxTest, SeedAndCounterWordOrder) {
  auto expect_block = [](uint64_t seed, uint64_t q, const uint32_t(&expected)[4]) {
    const PhiloxWords b = PhiloxBlock(seed, q);
    for (int j = 0; j < 4; ++j) EXPECT_EQ(b.w[j], expected[j]) << "seed " << seed << " q " << q;
  };
  expect_block(0, 0, kKats[0].expected);
  expect_block(1, 1, kKats[3].expected);
  expect_block(uint64_t{1} << 32, uint64_t{1} << 32, kKats[5].expected);
  expect_block(0xffffffff00000000u, 0xffffffff00000000u, kKats[7].expected);
}

TEST(PhiloxTest, ElementsPerCounterAndCountersUsed) {
  static_assert(ElementsPerCounter(Distribution::kUniform, DType::kFloat32) == 4);
  static_assert(ElementsPerCounter(Distribution::kUniform, DType::kFloat64) == 2);
  static_assert(ElementsPerCounter(Distribution::kNormal, DType::kFloat32) == 4);
  static_assert(ElementsPerCounter(Distribution::kNormal, DType::kFloat64) == 2);
  static_assert(ElementsPerCounter(Distribution::kIntegers, DType::kInt32) == 2);
  static_assert(ElementsPerCounter(Distribution::kIntegers, DType::kInt64) == 2);
  EXPECT_EQ(ElementsPerCounter(Distribution::kUniform, DType::kInt32), 0);
  EXPECT_EQ(ElementsPerCounter(Distribution::kNormal, DType::kInt64), 0);
  EXPECT_EQ(ElementsPerCounter(Distribution::kIntegers, DType::kFloat32), 0);
  EXPECT_EQ(ElementsPerCounter(Distribution::kIntegers, DType::kFloat64), 0);
  EXPECT_EQ(ElementsPerCounter(Distribution::kUniform, DType::kBool), 0);
  EXPECT_EQ(ElementsPerCounter(Distribution::kIntegers, DType::kBool), 0);

  EXPECT_EQ(CountersUsed(Distribution::kUniform, DType::kFloat32, 0), 0u);
  EXPECT_EQ(CountersUsed(Distribution::kUniform, DType::kFloat32, 1), 1u);
  EXPECT_EQ(CountersUsed(Distribution::kUniform, DType::kFloat32, 4), 1u);
  EXPECT_EQ(CountersUsed(Distribution::kUniform, DType::kFloat32, 5), 2u);
  EXPECT_EQ(CountersUsed(Distribution::kNormal, DType::kFloat32, 1 << 20), 1u << 18);
  EXPECT_EQ(CountersUsed(Distribution::kUniform, DType::kFloat64, 3), 2u);
  EXPECT_EQ(CountersUsed(Distribution::kNormal, DType::kFloat64, 4), 2u);
  EXPECT_EQ(CountersUsed(Distribution::kIntegers, DType::kInt32, 3), 2u);
  EXPECT_EQ(CountersUsed(Distribution::kIntegers, DType::kInt64, 7), 4u);
  EXPECT_EQ(CountersUsed(Distribution::kIntegers, DType::kFloat32, 7), 0u);
  EXPECT_EQ(
      CountersUsed(Distribution::kUniform, DType::kFloat32, std::numeric_limits<int64_t>::max()),
      uint64_t{1} << 61);
}

// The block of seed 0, counter 0 is the first KAT vector:
// w = 6627e8d5 e169c58d bc57ac4c 9b00dbd8.
constexpr uint32_t kW[4] = {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8};

RandomParams Params(Distribution dist) {
  RandomParams p;
  p.distribution = dist;
  p.seed = 0;
  p.offset = 0;
  return p;
}

TEST(PhiloxTest, UniformFloat32Transform) {
  const RandomParams p = Params(Distribution::kUniform);
  // (w >> 8) * 2^-24: 0x6627e8 = 6694888, 0xe169c5 = 14772677, 0xbc57ac = 12343212,
  // 0x9b00db = 10158299.
  const float expected[4] = {6694888.0f / 16777216.0f, 14772677.0f / 16777216.0f,
                             12343212.0f / 16777216.0f, 10158299.0f / 16777216.0f};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(UniformFloat32(kW[i]), expected[i]);
    EXPECT_EQ(RandomElement<float>(p, i), expected[i]) << i;
  }
  // Seed 1, block 1 is the KAT ctr (1, 0, 0, 0), key (1, 0) -> ac08141b dfc5ccbe 79c07a47
  // a7f66093: elements 4..7 at offset 0 and elements 0..3 at offset 1.
  RandomParams seeded = p;
  seeded.seed = 1;
  const uint32_t block1[4] = {0xac08141b, 0xdfc5ccbe, 0x79c07a47, 0xa7f66093};
  for (int j = 0; j < 4; ++j) {
    const float expected_j = static_cast<float>(block1[j] >> 8) / 16777216.0f;
    EXPECT_EQ(RandomElement<float>(seeded, 4 + j), expected_j) << j;
    seeded.offset = 1;
    EXPECT_EQ(RandomElement<float>(seeded, j), expected_j) << j;
    seeded.offset = 0;
  }
  // Extremes: [0, 1) exactly.
  EXPECT_EQ(UniformFloat32(0), 0.0f);
  EXPECT_EQ(UniformFloat32(0xffffffffu), 1.0f - 0x1.0p-24f);
  EXPECT_EQ(UniformFloat32(0xff), 0.0f);  // the low 8 bits are dropped
}

TEST(PhiloxTest, UniformFloat64Transform) {
  const RandomParams p = Params(Distribution::kUniform);
  // Lane 0: (0xe169c58d6627e8d5 >> 11) * 2^-53; lane 1: (0x9b00dbd8bc57ac4c >> 11) * 2^-53.
  const double expected[2] = {static_cast<double>(0xe169c58d6627e8d5u >> 11) * 0x1.0p-53,
                              static_cast<double>(0x9b00dbd8bc57ac4cu >> 11) * 0x1.0p-53};
  EXPECT_EQ(expected[0], 0x1.c2d38b1acc4fdp-1);
  EXPECT_EQ(expected[1], 0x1.3601b7b178af5p-1);
  for (int i = 0; i < 2; ++i) EXPECT_EQ(RandomElement<double>(p, i), expected[i]) << i;
  EXPECT_EQ(UniformFloat64(0, 0), 0.0);
  EXPECT_EQ(UniformFloat64(0xffffffffu, 0xffffffffu), 1.0 - 0x1.0p-53);
}

TEST(PhiloxTest, IntegersTransform) {
  RandomParams p = Params(Distribution::kIntegers);
  // low + floor(x * (high - low) / 2^64) with x = 0xe169c58d6627e8d5 and 0x9b00dbd8bc57ac4c,
  // evaluated with exact big-integer arithmetic.
  p.low = -5;
  p.high = 1000;
  EXPECT_EQ(RandomElement<int64_t>(p, 0), 879);
  EXPECT_EQ(RandomElement<int64_t>(p, 1), 603);
  EXPECT_EQ(RandomElement<int32_t>(p, 0), 879);
  EXPECT_EQ(RandomElement<int32_t>(p, 1), 603);
  p.low = std::numeric_limits<int64_t>::min();
  p.high = std::numeric_limits<int64_t>::max();
  EXPECT_EQ(RandomElement<int64_t>(p, 0), int64_t{7019358705328580820});
  EXPECT_EQ(RandomElement<int64_t>(p, 1), int64_t{1945796762943335499});
  p.low = std::numeric_limits<int32_t>::min();
  p.high = std::numeric_limits<int32_t>::max();
  EXPECT_EQ(RandomElement<int32_t>(p, 0), 1634321804);
  EXPECT_EQ(RandomElement<int32_t>(p, 1), 453041112);
  // The ends of the range: x = 0 gives low, x = 2^64 - 1 gives high - 1.
  EXPECT_EQ(IntegerInRange(0, 0, -7, 3), -7);
  EXPECT_EQ(IntegerInRange(0xffffffffu, 0xffffffffu, -7, 3), -5);
  EXPECT_EQ(IntegerInRange(0xffffffffu, 0xffffffffu, std::numeric_limits<int64_t>::min(),
                           IntegerRange(std::numeric_limits<int64_t>::min(),
                                        std::numeric_limits<int64_t>::max())),
            std::numeric_limits<int64_t>::max() - 1);
}

// Box-Muller reference in float64 from the same uniforms; the float32 transform must
// agree to float32 rounding (a few ulp).
TEST(PhiloxTest, NormalTransforms) {
  RandomParams p = Params(Distribution::kNormal);
  const double kPi = 3.14159265358979323846;
  for (int pair = 0; pair < 2; ++pair) {
    const double u1 = ((kW[2 * pair] >> 8) + 1) * 0x1.0p-24;
    const double u2 = (kW[2 * pair + 1] >> 8) * 0x1.0p-24;
    const double r = std::sqrt(-2.0 * std::log(u1));
    EXPECT_NEAR(RandomElement<float>(p, 2 * pair), r * std::cos(2 * kPi * u2), 1e-6);
    EXPECT_NEAR(RandomElement<float>(p, 2 * pair + 1), r * std::sin(2 * kPi * u2), 1e-6);
  }
  // Lane 0 = r cos, lane 1 = r sin, from 53-bit uniforms of (w0, w1) and (w2, w3).
  const double u1 = ((0xe169c58d6627e8d5u >> 11) + 1) * 0x1.0p-53;
  const double u2 = (0x9b00dbd8bc57ac4cu >> 11) * 0x1.0p-53;
  const double r = std::sqrt(-2.0 * std::log(u1));
  EXPECT_NEAR(RandomElement<double>(p, 0), r * std::cos(2 * kPi * u2), 1e-14);
  EXPECT_NEAR(RandomElement<double>(p, 1), r * std::sin(2 * kPi * u2), 1e-14);
  EXPECT_NEAR(RandomElement<double>(p, 0), -0.39766753844418223, 1e-14);
  EXPECT_NEAR(RandomElement<double>(p, 1), -0.310395478801738, 1e-14);

  // mean + stddev * z.
  RandomParams shifted = p;
  shifted.mean = 3.0;
  shifted.stddev = 0.5;
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(RandomElement<float>(shifted, i), 3.0f + 0.5f * RandomElement<float>(p, i));
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_DOUBLE_EQ(RandomElement<double>(shifted, i), 3.0 + 0.5 * RandomElement<double>(p, i));
  }
  // u1 = 1 (all ones) gives r = 0; u1 = 2^-24 (all zeros) gives the largest radius.
  float z0, z1;
  BoxMullerFloat32(0xffffffffu, 0, &z0, &z1);
  EXPECT_EQ(z0, 0.0f);
  BoxMullerFloat32(0, 0, &z0, &z1);
  EXPECT_NEAR(z0, std::sqrt(-2.0 * std::log(0x1.0p-24)), 1e-5);
  EXPECT_TRUE(std::isfinite(z0));
}

// ---- Normal transform v2 ----

constexpr long double kPiL = 3.141592653589793238462643383279502884L;

// The exact Box-Muller pair r cos(2 pi u2), r sin(2 pi u2) with r = sqrt(-2 ln u1), in
// long double (64-bit significand). The angle is reduced exactly, 4 u2 = j + y with j the
// nearest integer, so that values near the zeros of cos and sin keep their relative
// accuracy.
void ExactBoxMuller(long double u1, long double u2, long double* even, long double* odd) {
  const long double r = std::sqrt(-2 * std::log(u1));
  const long double t = 4 * u2;
  const long double j = std::nearbyint(t);
  const long double c = std::cos(kPiL / 2 * (t - j)), s = std::sin(kPiL / 2 * (t - j));
  switch (static_cast<int>(j) & 3) {
    case 0:
      *even = r * c, *odd = r * s;
      break;
    case 1:
      *even = -r * s, *odd = r * c;
      break;
    case 2:
      *even = -r * c, *odd = -r * s;
      break;
    default:
      *even = r * s, *odd = -r * c;
      break;
  }
}

// The exact pair of v2 for a Philox block, from the definition's u1 and u2.
void ExactPairFloat32(uint32_t wa, uint32_t wb, long double* even, long double* odd) {
  ExactBoxMuller(((wa >> 8) + 1) * 0x1.0p-24L, (wb >> 8) * 0x1.0p-24L, even, odd);
}

void ExactPairFloat64(const PhiloxWords& b, long double* even, long double* odd) {
  const uint64_t x1 = ((uint64_t{b.w[1]} << 32) | b.w[0]) >> 11;
  const uint64_t x2 = ((uint64_t{b.w[3]} << 32) | b.w[2]) >> 11;
  ExactBoxMuller((x1 + 1) * 0x1.0p-53L, x2 * 0x1.0p-53L, even, odd);
}

// |got - want| in units of T's ulp at |want| (the spacing of T's values in [2^e, 2^e+1)
// that holds |want|).
template <typename T>
double UlpsFrom(T got, long double want) {
  int exponent = 0;
  std::frexp(std::fabs(want), &exponent);
  long double ulp = std::ldexp(1.0L, exponent - std::numeric_limits<T>::digits);
  ulp = std::max<long double>(ulp, std::numeric_limits<T>::denorm_min());
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

// The bound kernels/philox.h states for v2's standard normals.
constexpr double kNormalV2MaxUlps = 4;

RandomParams NormalV2(double mean = 0, double stddev = 1) {
  RandomParams p = Params(Distribution::kNormal);
  p.normal_transform = NormalTransform::kBoxMullerV2;
  p.mean = mean;
  p.stddev = stddev;
  return p;
}

TEST(PhiloxTest, NormalV1StaysTheDefault) {
  static_assert(RandomParams{}.normal_transform == NormalTransform::kBoxMullerV1);
  // The v1 values of seed 0, block 0 (NormalTransforms above checks them in detail).
  EXPECT_NEAR(RandomElement<double>(Params(Distribution::kNormal), 0), -0.39766753844418223, 1e-14);
}

TEST(PhiloxTest, NormalV2KnownAnswers) {
  // Seed 0, block 0: the words kW. Lanes (0, 1) come from (w0, w1), lanes (2, 3) from
  // (w2, w3); float64 takes all four words for its two lanes.
  long double want[4];
  ExactPairFloat32(kW[0], kW[1], &want[0], &want[1]);
  ExactPairFloat32(kW[2], kW[3], &want[2], &want[3]);
  for (int i = 0; i < 4; ++i) {
    const float got = RandomElement<float>(NormalV2(), i);
    EXPECT_LE(UlpsFrom(got, want[i]), kNormalV2MaxUlps) << "lane " << i << " " << got;
  }
  const PhiloxWords block = {{kW[0], kW[1], kW[2], kW[3]}};
  ExactPairFloat64(block, &want[0], &want[1]);
  EXPECT_NEAR(static_cast<double>(want[0]), -0.39766753844418223, 1e-14);  // v1's, to 1e-14
  for (int i = 0; i < 2; ++i) {
    const double got = RandomElement<double>(NormalV2(), i);
    EXPECT_LE(UlpsFrom(got, want[i]), kNormalV2MaxUlps) << "lane " << i << " " << got;
  }
  // mean + (stddev * r) * cos: one more rounding of the product and one of the sum.
  for (int i = 0; i < 2; ++i) {
    const double got = RandomElement<double>(NormalV2(3, 0.5), i);
    EXPECT_NEAR(got, 3 + 0.5 * static_cast<double>(want[i]), 8 * 0x1.0p-52 * 4);
  }
  // The published bits: v2 is frozen, so these never change (a change is a v3).
  const uint32_t float32_bits[4] = {0x3f7dbb30u, 0xbf6cb6b3u, 0xbf1e1ba1u, 0xbef6d1aau};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(FloatBits(RandomElement<float>(NormalV2(), i)), float32_bits[i]) << "lane " << i;
  }
  const uint64_t float64_bits[2] = {0xbfd973628c131c05u, 0xbfd3dd84ff91e709u};
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(DoubleBits(RandomElement<double>(NormalV2(), i)), float64_bits[i]) << "lane " << i;
  }
}

// The edges of the inputs: u1 = 1 (r = 0), u1 = 2^-24 or 2^-53 (the largest radius),
// angles on the quadrant boundaries and at the nearest-quadrant switch (y = +-1/2).
TEST(PhiloxTest, NormalV2Edges) {
  float even, odd;
  NormalPairFloat32V2(0xffffffffu, 0, 0.0f, 1.0f, &even, &odd);
  EXPECT_EQ(even, 0.0f);
  EXPECT_EQ(odd, 0.0f);
  for (uint32_t wb : {0u, 0x40000000u, 0x80000000u, 0xc0000000u, 0x20000000u, 0x1fffff00u,
                      0xffffff00u, 0x00000100u}) {
    long double want_even, want_odd;
    ExactPairFloat32(0, wb, &want_even, &want_odd);
    NormalPairFloat32V2(0, wb, 0.0f, 1.0f, &even, &odd);
    EXPECT_LE(UlpsFrom(even, want_even), kNormalV2MaxUlps) << std::hex << wb;
    EXPECT_LE(UlpsFrom(odd, want_odd), kNormalV2MaxUlps) << std::hex << wb;
    // Exact zeros of cos and sin come out as zeros, not as rounding noise.
    if (want_even == 0) {
      EXPECT_EQ(even, 0.0f) << std::hex << wb;
    }
    if (want_odd == 0) {
      EXPECT_EQ(odd, 0.0f) << std::hex << wb;
    }
  }
  EXPECT_NEAR(NormalRadiusFloat32V2(0), std::sqrt(48 * std::log(2.0)), 1e-6);
  EXPECT_NEAR(NormalRadiusFloat64V2(0, 0), std::sqrt(106 * std::log(2.0)), 1e-14);
  EXPECT_EQ(NormalRadiusFloat64V2(0xffffffffu, 0xffffffffu), 0.0);
}

// Every float32 radius and angle (2^24 of each, all there are) within the bound's share,
// and the float64 ones and whole pairs of both on a sample.
TEST(PhiloxTest, NormalV2WithinStatedUlps) {
  double worst_radius = 0, worst_cos = 0, worst_sin = 0;
  for (uint32_t v = 0; v < (1u << 24) - 1; v += 3) {
    const long double u1 = (v + 1) * 0x1.0p-24L;
    worst_radius = std::max(worst_radius,
                            UlpsFrom(NormalRadiusFloat32V2(v << 8), std::sqrt(-2 * std::log(u1))));
    long double c, s;
    ExactBoxMuller(std::exp(-0.5L), v * 0x1.0p-24L, &c, &s);  // r = 1
    float got_c, got_s;
    CosSinTurnFloat32V2(v << 8, &got_c, &got_s);
    if (c != 0) worst_cos = std::max(worst_cos, UlpsFrom(got_c, c));
    if (s != 0) worst_sin = std::max(worst_sin, UlpsFrom(got_s, s));
  }
  EXPECT_LE(worst_radius, 1.5);
  EXPECT_LE(worst_cos, 2);
  EXPECT_LE(worst_sin, 2);

  double worst32 = 0, worst64 = 0;
  for (uint64_t q = 0; q < (1u << 18); ++q) {
    const PhiloxWords b = PhiloxBlock(0x5eed, q);
    long double want[2];
    float got32[4];
    Float32Lanes(b, NormalV2(), got32);
    for (int pair = 0; pair < 2; ++pair) {
      ExactPairFloat32(b.w[2 * pair], b.w[2 * pair + 1], &want[0], &want[1]);
      for (int j = 0; j < 2; ++j) {
        if (want[j] != 0) worst32 = std::max(worst32, UlpsFrom(got32[2 * pair + j], want[j]));
      }
    }
    double got64[2];
    Float64Lanes(b, NormalV2(), got64);
    ExactPairFloat64(b, &want[0], &want[1]);
    for (int j = 0; j < 2; ++j) {
      if (want[j] != 0) worst64 = std::max(worst64, UlpsFrom(got64[j], want[j]));
    }
  }
  EXPECT_LE(worst32, kNormalV2MaxUlps);
  EXPECT_LE(worst64, kNormalV2MaxUlps);
}

// Mean, variance and the fraction beyond 4 sigma of 2^22 draws against N(0, 1)'s. Each
// bound is at least 6 standard errors wide: a correct generator fails it with probability
// below 1e-8, while a transform that is off by a few percent anywhere fails it.
template <typename T>
void ExpectStandardNormalStatistics() {
  constexpr int64_t kDraws = int64_t{1} << 22;
  constexpr int k = std::is_same_v<T, float> ? 4 : 2;
  RandomParams p = NormalV2();
  p.seed = 0x0ddba11;
  const PhiloxRoundKeys keys = PhiloxRoundKeysFor(PhiloxKeyFromSeed(p.seed));
  double sum = 0, sum2 = 0;
  int64_t beyond4 = 0;
  for (int64_t q = 0; q < kDraws / k; ++q) {
    T v[k];
    if constexpr (k == 4) {
      Float32Lanes(PhiloxBlock(keys, q), p, v);
    } else {
      Float64Lanes(PhiloxBlock(keys, q), p, v);
    }
    for (T x : v) {
      sum += x;
      sum2 += static_cast<double>(x) * x;
      beyond4 += std::fabs(x) > 4;
    }
  }
  const double mean = sum / kDraws;
  const double variance = sum2 / kDraws - mean * mean;
  EXPECT_LE(std::fabs(mean), 6 / std::sqrt(static_cast<double>(kDraws)));  // sd 1/sqrt(N)
  EXPECT_LE(std::fabs(variance - 1), 6 * std::sqrt(2.0 / kDraws));         // sd sqrt(2/N)
  // P(|Z| > 4) = erfc(4 / sqrt(2)) = 6.334e-5: 265.7 expected, Poisson sd 16.3.
  const double expected = std::erfc(4 / std::sqrt(2.0)) * kDraws;
  EXPECT_LE(std::fabs(static_cast<double>(beyond4) - expected), 6 * std::sqrt(expected))
      << beyond4 << " beyond 4 sigma, " << expected << " expected";
}

TEST(PhiloxTest, NormalV2Statistics) {
  ExpectStandardNormalStatistics<float>();
  ExpectStandardNormalStatistics<double>();
}

// Element i of a fill lives in block offset + i / k only: a fill at offset o equals the
// tail of a fill at offset 0 starting at element o * k.
template <typename T>
void ExpectOffsetIsTail(RandomParams p, int k) {
  p.seed = 0x0123456789abcdefu;
  const uint64_t o = 37;
  for (uint64_t i = 0; i < 64; ++i) {
    RandomParams at_offset = p;
    at_offset.offset = o;
    p.offset = 0;
    const T tail = RandomElement<T>(p, o * k + i);
    const T shifted = RandomElement<T>(at_offset, i);
    EXPECT_EQ(std::memcmp(&tail, &shifted, sizeof(T)), 0) << "element " << i;
  }
  // Counters wrap modulo 2^64: element k of a fill at offset 2^64 - 1 is element 0 of
  // a fill at offset 0.
  RandomParams last = p;
  last.offset = std::numeric_limits<uint64_t>::max();
  p.offset = 0;
  const T wrapped = RandomElement<T>(last, k);
  const T first = RandomElement<T>(p, 0);
  EXPECT_EQ(std::memcmp(&wrapped, &first, sizeof(T)), 0);
  // Different seeds give different blocks.
  RandomParams other = p;
  other.seed = p.seed + 1;
  int same = 0;
  for (uint64_t i = 0; i < 16; ++i) same += RandomElement<T>(other, i) == RandomElement<T>(p, i);
  EXPECT_LT(same, 4);
}

TEST(PhiloxTest, OffsetSelectsCounters) {
  RandomParams p;
  p.distribution = Distribution::kUniform;
  ExpectOffsetIsTail<float>(p, 4);
  ExpectOffsetIsTail<double>(p, 2);
  p.distribution = Distribution::kNormal;
  ExpectOffsetIsTail<float>(p, 4);
  ExpectOffsetIsTail<double>(p, 2);
  p.normal_transform = NormalTransform::kBoxMullerV2;
  ExpectOffsetIsTail<float>(p, 4);
  ExpectOffsetIsTail<double>(p, 2);
  p.distribution = Distribution::kIntegers;
  p.low = -1000000;
  p.high = 1000000;
  ExpectOffsetIsTail<int32_t>(p, 2);
  ExpectOffsetIsTail<int64_t>(p, 2);
}

// The per-block functions and the per-element function agree lane by lane, and lanes
// come from the documented words.
TEST(PhiloxTest, LanesOfOneBlock) {
  RandomParams p;
  p.seed = 0xfeedface12345678u;
  p.offset = 1000;
  p.distribution = Distribution::kUniform;
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + 2);
  float f[4];
  Float32Lanes(b, p, f);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(f[j], static_cast<float>(b.w[j] >> 8) * 0x1.0p-24f);
    EXPECT_EQ(RandomElement<float>(p, 8 + j), f[j]);
  }
  double d[2];
  Float64Lanes(b, p, d);
  EXPECT_EQ(d[0], UniformFloat64(b.w[0], b.w[1]));
  EXPECT_EQ(d[1], UniformFloat64(b.w[2], b.w[3]));
  EXPECT_EQ(RandomElement<double>(p, 4), d[0]);
  EXPECT_EQ(RandomElement<double>(p, 5), d[1]);
  p.distribution = Distribution::kIntegers;
  p.low = 10;
  p.high = 20;
  int64_t v[2];
  IntegerLanes(b, p, v);
  EXPECT_EQ(v[0], 10 + static_cast<int64_t>(MulHi64(JoinWords(b.w[0], b.w[1]), 10)));
  EXPECT_EQ(v[1], 10 + static_cast<int64_t>(MulHi64(JoinWords(b.w[2], b.w[3]), 10)));
  EXPECT_EQ(RandomElement<int64_t>(p, 4), v[0]);
  EXPECT_EQ(RandomElement<int32_t>(p, 5), v[1]);
}

TEST(PhiloxTest, MulHi64) {
  EXPECT_EQ(MulHi64(0, 0), 0u);
  EXPECT_EQ(MulHi64(uint64_t{1} << 32, uint64_t{1} << 32), 1u);
  EXPECT_EQ(MulHi64(~uint64_t{0}, ~uint64_t{0}), ~uint64_t{0} - 1);
  EXPECT_EQ(MulHi64(0x8000000000000000u, 3), 1u);
}

}  // namespace
}  // namespace gpucompute
