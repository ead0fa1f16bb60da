// Normal transform v3 (kernels/philox.h): the normal CDF inverted through the table of
// kernels/normal_v3_table.h. The references here are independent of the table: the
// inverse is found by Newton's method on glibc's long-double erfc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/ops.h"
#include "kernels/philox.h"
#include "tests/support/normal_v3_words.h"

namespace gpucompute {
namespace {

// -Phi^-1(t) for t in (0, 1/2), to long double's precision: bisection, then Newton.
long double InverseTail(long double t) {
  const long double sqrt2 = std::sqrt(2.0L);
  const long double sqrt2pi = std::sqrt(2.0L * 3.14159265358979323846264338327950288L);
  long double lo = 0, hi = 10;
  for (int i = 0; i < 40; ++i) {
    const long double mid = (lo + hi) / 2;
    (std::erfc(mid / sqrt2) / 2 > t ? lo : hi) = mid;
  }
  long double x = (lo + hi) / 2;
  for (int i = 0; i < 4; ++i) {
    x += (std::erfc(x / sqrt2) / 2 - t) * sqrt2pi * std::exp(x * x / 2);
  }
  return x;
}

// The exact standard normal v3 approximates for word w: the tail probability is
// t = b 2^-33 with b = ~(2w) mod 2^32, and the top bit of w is the sign.
long double ExactNormal(uint32_t w) {
  const uint32_t b = ~(w << 1);
  const long double z = InverseTail(std::ldexp(static_cast<long double>(b), -33));
  return (w & 0x80000000u) != 0 ? -z : z;
}

double UlpsFrom(float got, long double want) {
  const float w = std::fabs(static_cast<float>(want));
  const float ulp = std::nextafter(w, INFINITY) - w;
  return static_cast<double>(std::fabs(static_cast<long double>(got) - want) / ulp);
}

constexpr double kMaxUlps = 2.1;

TEST(NormalV3Test, WithinItsBoundOfTheExactInverseAtEverySegmentsEdges) {
  double worst = 0;
  for (uint32_t w : testing::NormalV3SegmentEdgeWords(64)) {
    const float z = NormalFloat32V3(w);
    const double ulps = UlpsFrom(z, ExactNormal(w));
    worst = std::max(worst, ulps);
    ASSERT_LE(ulps, kMaxUlps) << std::hex << "word " << w << std::dec << ": " << z;
  }
  EXPECT_GT(worst, 0.4);  // the comparison sees rounding at all
}

TEST(NormalV3Test, WithinItsBoundOfTheExactInverseOnAStrideOfAllWords) {
  // 2^18 words spread over all 2^32, the stride odd so that every low bit pattern occurs.
  constexpr uint32_t kStride = (1u << 14) + 1;
  uint32_t w = 12345;
  for (int i = 0; i < (1 << 18); ++i, w += kStride) {
    const float z = NormalFloat32V3(w);
    ASSERT_LE(UlpsFrom(z, ExactNormal(w)), kMaxUlps) << std::hex << "word " << w << std::dec
                                                     << ": " << z;
  }
}

TEST(NormalV3Test, TheTopBitIsTheSignAndTheTailsEndAtTheExtremeWords) {
  std::mt19937 rng(20261128);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t w = static_cast<uint32_t>(rng()) & 0x7fffffffu;
    const float z = NormalFloat32V3(w);
    EXPECT_GT(z, 0.0f);
    EXPECT_EQ(NormalFloat32V3(w | 0x80000000u), -z);
  }
  // b = 1 (t = 2^-33), the far tail, and b = 2^32 - 1 (t just under 1/2), the centre.
  EXPECT_NEAR(NormalFloat32V3(0x7fffffffu), 6.3379, 1e-4);
  EXPECT_EQ(NormalFloat32V3(0xffffffffu), -NormalFloat32V3(0x7fffffffu));
  const float centre = NormalFloat32V3(0u);  // t = 1/2 - 2^-33
  EXPECT_GT(centre, 0.0f);
  EXPECT_LE(UlpsFrom(centre, ExactNormal(0u)), kMaxUlps) << centre;
  EXPECT_LT(centre, 3e-10f);
}

TEST(NormalV3Test, ItsPublishedBitsNeverChange) {
  // A version keeps its bits for ever: these pin the table and the arithmetic.
  const std::pair<uint32_t, uint32_t> pinned[] = {
      {0x00000000u, 0x2fa06c99u},  // 2.91809937e-10: t = 1/2 - 2^-33
      {0x7fffffffu, 0x40cad08du},  // 6.33795786: t = 2^-33
      {0x12345678u, 0x3e37812bu},  // 0.179203674
      {0x89abcdefu, 0xbdc239ceu},  // -0.0948368162
      {0x40000000u, 0x3f2cab5cu},  // 0.674489737: t = 1/4 - 2^-33
      {0x7ff00000u, 0x405f2cb8u},  // 3.48710442
  };
  for (const auto& [w, bits] : pinned) {
    EXPECT_EQ(FloatBits(NormalFloat32V3(w)), bits) << std::hex << "word " << w;
  }
}

// The whole fill: lanes are the four words of each Philox block in order, out =
// fma(stddev, z, mean), and float64 v3 is v2's values.
TEST(NormalV3Test, TheFillTakesALaneAWordAndFloat64KeepsV2) {
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.normal_transform = NormalTransform::kInverseCdfV3;
  p.seed = 42;
  p.mean = 3.0;
  p.stddev = 0.5;
  RandomParams v2 = p;
  v2.normal_transform = NormalTransform::kBoxMullerV2;
  for (uint64_t q = 0; q < 1000; ++q) {
    const PhiloxWords b = PhiloxBlock(p.seed, q);
    float out[4];
    Float32Lanes(b, p, out);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(FloatBits(out[j]), FloatBits(std::fma(0.5f, NormalFloat32V3(b.w[j]), 3.0f)));
    }
    double d3[2], d2[2];
    Float64Lanes(b, p, d3);
    Float64Lanes(b, v2, d2);
    EXPECT_EQ(std::memcmp(d3, d2, sizeof(d3)), 0) << q;
  }
}

// Chi-square of 2^22 standard normals of a fill against the normal CDF, in 128 bins of
// equal probability, and the share of the tails beyond 3 and 5 sigma.
TEST(NormalV3Test, AFillIsNormallyDistributed) {
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.normal_transform = NormalTransform::kInverseCdfV3;
  p.seed = 0x5eed;
  constexpr int kBins = 128;
  constexpr int64_t kValues = int64_t{1} << 22;
  std::vector<double> edges(kBins - 1);
  for (int i = 1; i < kBins; ++i) {
    const long double t = static_cast<long double>(i) / kBins;  // P(z < edge) = t
    edges[i - 1] = static_cast<double>(t < 0.5L ? -InverseTail(t) : InverseTail(1 - t));
  }
  std::vector<int64_t> counts(kBins, 0);
  int64_t beyond3 = 0, beyond5 = 0;
  for (int64_t q = 0; q < kValues / 4; ++q) {
    float out[4];
    Float32Lanes(PhiloxBlock(p.seed, static_cast<uint64_t>(q)), p, out);
    for (float z : out) {
      ++counts[std::upper_bound(edges.begin(), edges.end(), static_cast<double>(z)) -
               edges.begin()];
      beyond3 += std::fabs(z) > 3;
      beyond5 += std::fabs(z) > 5;
    }
  }
  const double expected = static_cast<double>(kValues) / kBins;
  double chi2 = 0;
  for (int64_t c : counts) chi2 += (c - expected) * (c - expected) / expected;
  // 127 degrees of freedom: the 0.1% and 99.9% points are about 84 and 181.
  EXPECT_GT(chi2, 84.0);
  EXPECT_LT(chi2, 181.0);
  // P(|z| > 3) = 0.0026998, P(|z| > 5) = 5.733e-7: 11324 and 2.4 expected.
  EXPECT_NEAR(static_cast<double>(beyond3), 0.0026998 * kValues, 5 * std::sqrt(11324.0));
  EXPECT_LE(beyond5, 12);
}

}  // namespace
}  // namespace gpucompute
