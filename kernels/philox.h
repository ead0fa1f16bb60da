// Philox4x32-10 and the per-element transforms that define every random fill.
//
// Header-only and usable from host C++ and CUDA device code alike, so that the CPU
// backend and a CUDA kernel produce the same numbers by calling the same functions.
//
// The generator is Random123's philox4x32 with 10 rounds (Salmon et al., "Parallel
// random numbers: as easy as 1, 2, 3", SC'11): multipliers 0xD2511F53 and 0xCD9E8D57,
// Weyl key increments 0x9E3779B9 and 0xBB67AE85. tests/cpu/philox_test.cc checks it against
// Random123's known-answer vectors.
//
// ---------------------------------------------------------------------------------
// The fill definition (public API contract; backends and clients rely on it)
// ---------------------------------------------------------------------------------
// A fill of n elements of dtype D with RandomParams p writes out[i], 0 <= i < n, as
// follows. Let k = ElementsPerCounter(p.distribution, D) and
//
//   key     = (seed & 0xffffffff, seed >> 32)                        (two 32-bit words)
//   q       = p.offset + i / k   (64-bit unsigned arithmetic, wraps modulo 2^64)
//   counter = (q & 0xffffffff, q >> 32, 0, 0)                        (four 32-bit words)
//   (w0, w1, w2, w3) = Philox4x32-10(counter, key)
//
// and out[i] is lane j = i % k of that block:
//
//   uniform  float32  k=4  (w_j >> 8) * 2^-24                               in [0, 1)
//   uniform  float64  k=2  (((w_{2j+1} << 32) | w_{2j}) >> 11) * 2^-53       in [0, 1)
//   normal   float32  k=4  Box-Muller in float32 on the pair (w_a, w_b) = (w0, w1) for
//                          lanes 0 and 1, (w2, w3) for lanes 2 and 3:
//                            u1 = ((w_a >> 8) + 1) * 2^-24                  in (0, 1]
//                            u2 = (w_b >> 8) * 2^-24                        in [0, 1)
//                            r  = sqrtf(-2 * logf(u1)), t = 2pi * u2 (float32)
//                            z  = r * cosf(t) for the even lane, r * sinf(t) for the odd
//                          out = float(mean) + float(stddev) * z, in float32.
//   normal   float64  k=2  the same in float64 with 53-bit uniforms:
//                            u1 = ((((w1 << 32) | w0) >> 11) + 1) * 2^-53   in (0, 1]
//                            u2 = (((w3 << 32) | w2) >> 11) * 2^-53         in [0, 1)
//                          lane 0 = mean + stddev * r*cos(t), lane 1 = ... r*sin(t).
//   integers int32/   k=2  x = (w_{2j+1} << 32) | w_{2j}, range = high - low as uint64
//            int64         (exact even for low = INT64_MIN, high = INT64_MAX), and
//                          out = low + floor(x * range / 2^64)              in [low, high)
//                          (Lemire's multiply-shift without rejection: every value
//                          has floor or ceil of 2^64 / range preimages x, so its
//                          probability is 1/range within a relative error below
//                          range / 2^64, e.g. 2^-32 for ranges below 2^32).
//
// Uniform is defined for float outputs only and integers for int32/int64 outputs only;
// ElementsPerCounter returns 0 for the other combinations and callers reject them.
// For int32 output the caller guarantees that low and high fit in int32.
//
// Consequences of the definition: a fill at offset o of n elements equals elements
// [o*k, o*k + n) of a fill at offset 0 (the counter is the only position), and a fill
// consumes CountersUsed(dist, dtype, n) = ceil(n / k) counters, so a client that
// advances offset by that amount never reuses a block.
//
// Determinism: uniforms and integers are exact integer arithmetic plus multiplications
// by powers of two, so every backend produces them bit-identically. Normals go through
// logf/sqrtf/cosf/sinf (log/sqrt/cos/sin for float64), whose last-bit rounding differs
// between math libraries (glibc vs CUDA's libdevice, which document errors of 1-2 ulp),
// and a compiler may contract mean + stddev * z into a fused multiply-add; normals are
// therefore identical across runs and thread counts of one build, and agree across
// backends to a few ulp only (uniforms and integers are equal across backends; the
// conformance suite bounds the normals' difference).
#ifndef GPUCOMPUTE_KERNELS_PHILOX_H_
#define GPUCOMPUTE_KERNELS_PHILOX_H_

#include <math.h>
#include <stdint.h>

#include "kernels/dtype.h"
#include "kernels/host_device.h"
#include "kernels/ops.h"

namespace gpucompute {

inline constexpr uint32_t kPhiloxM0 = 0xD2511F53u;
inline constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;
inline constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // golden ratio
inline constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // sqrt(3) - 1
inline constexpr int kPhiloxRounds = 10;

// Four 32-bit words: a counter going in, or a block of random bits coming out.
struct PhiloxWords {
  uint32_t w[4];
};

struct PhiloxKey {
  uint32_t k[2];
};

// Philox4x32-10: a bijection of the 128-bit counter for each key.
GPUCOMPUTE_HD PhiloxWords Philox4x32(PhiloxWords ctr, PhiloxKey key) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key.k[0] += kPhiloxW0;
      key.k[1] += kPhiloxW1;
    }
    const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr.w[0];
    const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr.w[2];
    const PhiloxWords next = {{
        static_cast<uint32_t>(p1 >> 32) ^ ctr.w[1] ^ key.k[0],
        static_cast<uint32_t>(p1),
        static_cast<uint32_t>(p0 >> 32) ^ ctr.w[3] ^ key.k[1],
        static_cast<uint32_t>(p0),
    }};
    ctr = next;
  }
  return ctr;
}

GPUCOMPUTE_HD PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
}

// Block `q` of a fill with `seed`: counter (q low, q high, 0, 0).
GPUCOMPUTE_HD PhiloxWords PhiloxBlock(uint64_t seed, uint64_t q) {
  const PhiloxWords ctr = {{static_cast<uint32_t>(q), static_cast<uint32_t>(q >> 32), 0u, 0u}};
  return Philox4x32(ctr, PhiloxKeyFromSeed(seed));
}

// Elements of `dtype` drawn from one Philox block, or 0 where the fill does not support
// the combination (uniform integers, integers as floats, bool outputs).
GPUCOMPUTE_HD constexpr int ElementsPerCounter(Distribution dist, DType dtype) {
  switch (dist) {
    case Distribution::kUniform:
    case Distribution::kNormal:
      return dtype == DType::kFloat32 ? 4 : dtype == DType::kFloat64 ? 2 : 0;
    case Distribution::kIntegers:
      return (dtype == DType::kInt32 || dtype == DType::kInt64) ? 2 : 0;
  }
  return 0;
}

// Philox counters consumed by a fill of n >= 0 elements: ceil(n / k); 0 if unsupported.
GPUCOMPUTE_HD constexpr uint64_t CountersUsed(Distribution dist, DType dtype, int64_t n) {
  const int k = ElementsPerCounter(dist, dtype);
  if (k == 0 || n <= 0) return 0;
  return static_cast<uint64_t>(n / k) + (n % k != 0 ? 1u : 0u);
}

// ---- Per-word transforms. Each is exact except the Box-Muller functions. ----

GPUCOMPUTE_HD uint64_t JoinWords(uint32_t lo, uint32_t hi) {
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

// (w >> 8) * 2^-24 in [0, 1): the top 24 bits, every value exactly representable.
GPUCOMPUTE_HD float UniformFloat32(uint32_t w) { return static_cast<float>(w >> 8) * 0x1.0p-24f; }

// (x >> 11) * 2^-53 in [0, 1) with x = (hi << 32) | lo.
GPUCOMPUTE_HD double UniformFloat64(uint32_t lo, uint32_t hi) {
  return static_cast<double>(JoinWords(lo, hi) >> 11) * 0x1.0p-53;
}

// Two standard normals from two words, in float32. u1 is in (0, 1] so the log is finite.
GPUCOMPUTE_HD void BoxMullerFloat32(uint32_t wa, uint32_t wb, float* z_even, float* z_odd) {
  const float u1 = static_cast<float>((wa >> 8) + 1u) * 0x1.0p-24f;
  const float u2 = static_cast<float>(wb >> 8) * 0x1.0p-24f;
  const float r = sqrtf(-2.0f * logf(u1));
  const float t = 6.28318530717958647692f * u2;
  *z_even = r * cosf(t);
  *z_odd = r * sinf(t);
}

// Two standard normals from four words, in float64.
GPUCOMPUTE_HD void BoxMullerFloat64(const PhiloxWords& b, double* z_even, double* z_odd) {
  const double u1 = static_cast<double>((JoinWords(b.w[0], b.w[1]) >> 11) + 1u) * 0x1.0p-53;
  const double u2 = static_cast<double>(JoinWords(b.w[2], b.w[3]) >> 11) * 0x1.0p-53;
  const double r = sqrt(-2.0 * log(u1));
  const double t = 6.28318530717958647692 * u2;
  *z_even = r * cos(t);
  *z_odd = r * sin(t);
}

// high - low as an unsigned 64-bit count, exact for any low < high.
GPUCOMPUTE_HD uint64_t IntegerRange(int64_t low, int64_t high) {
  return static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
}

// The high 64 bits of the 128-bit product a * b.
GPUCOMPUTE_HD uint64_t MulHi64(uint64_t a, uint64_t b) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(a, b);
#else
  __extension__ typedef unsigned __int128 Uint128;
  return static_cast<uint64_t>((static_cast<Uint128>(a) * b) >> 64);
#endif
}

// low + floor(x * range / 2^64) with x = (hi << 32) | lo; in [low, low + range).
// Unsigned arithmetic, so low + offset cannot overflow as a signed sum would.
GPUCOMPUTE_HD int64_t IntegerInRange(uint32_t lo, uint32_t hi, int64_t low, uint64_t range) {
  return static_cast<int64_t>(static_cast<uint64_t>(low) + MulHi64(JoinWords(lo, hi), range));
}

// ---- Whole blocks: every lane of one Philox block, as the fill writes them. ----

// The 4 float32 values of block `b` (uniform or normal).
GPUCOMPUTE_HD void Float32Lanes(const PhiloxWords& b, const RandomParams& p, float out[4]) {
  if (p.distribution == Distribution::kNormal) {
    const float mean = static_cast<float>(p.mean);
    const float stddev = static_cast<float>(p.stddev);
    float z[4];
    BoxMullerFloat32(b.w[0], b.w[1], &z[0], &z[1]);
    BoxMullerFloat32(b.w[2], b.w[3], &z[2], &z[3]);
    for (int j = 0; j < 4; ++j) out[j] = mean + stddev * z[j];
  } else {
    for (int j = 0; j < 4; ++j) out[j] = UniformFloat32(b.w[j]);
  }
}

// The 2 float64 values of block `b` (uniform or normal).
GPUCOMPUTE_HD void Float64Lanes(const PhiloxWords& b, const RandomParams& p, double out[2]) {
  if (p.distribution == Distribution::kNormal) {
    double z0, z1;
    BoxMullerFloat64(b, &z0, &z1);
    out[0] = p.mean + p.stddev * z0;
    out[1] = p.mean + p.stddev * z1;
  } else {
    out[0] = UniformFloat64(b.w[0], b.w[1]);
    out[1] = UniformFloat64(b.w[2], b.w[3]);
  }
}

// The 2 integers of block `b`, in [p.low, p.high); requires p.low < p.high.
GPUCOMPUTE_HD void IntegerLanes(const PhiloxWords& b, const RandomParams& p, int64_t out[2]) {
  const uint64_t range = IntegerRange(p.low, p.high);
  out[0] = IntegerInRange(b.w[0], b.w[1], p.low, range);
  out[1] = IntegerInRange(b.w[2], b.w[3], p.low, range);
}

// Element i of a fill of T (float, double, int32_t or int64_t) with params `p`, computed
// on its own: what a one-thread-per-element kernel calls. p.distribution must be one
// that ElementsPerCounter accepts for T.
template <typename T>
GPUCOMPUTE_HD T RandomElement(const RandomParams& p, uint64_t i) {
  // dtype.h's IsFloat and IsInteger are host-only, so they are spelled out here.
  constexpr DType kDType = DTypeOf<T>::value;
  constexpr bool kInteger = kDType == DType::kInt32 || kDType == DType::kInt64;
  static_assert(kInteger || kDType == DType::kFloat32 || kDType == DType::kFloat64,
                "no random fill of bool");
  constexpr int k =
      ElementsPerCounter(kInteger ? Distribution::kIntegers : Distribution::kUniform, kDType);
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + i / k);
  const int lane = static_cast<int>(i % k);
  if constexpr (kDType == DType::kFloat32) {
    float v[4];
    Float32Lanes(b, p, v);
    return v[lane];
  } else if constexpr (kDType == DType::kFloat64) {
    double v[2];
    Float64Lanes(b, p, v);
    return v[lane];
  } else {
    int64_t v[2];
    IntegerLanes(b, p, v);
    return static_cast<T>(v[lane]);
  }
}

}  // namespace gpucompute

#endif  // GPUCOMPUTE_KERNELS_PHILOX_H_
