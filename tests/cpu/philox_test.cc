// Tests of kernels/philox.h: the generator against Random123's known answers, and the
// fill definition (counters, lanes, transforms) against values computed by hand, so
// that any drift in the public contract fails here.
#include "kernels/philox.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
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
