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
//   normal   float32  k=4  (transform v1, NormalTransform::kBoxMullerV1, the default)
//                          Box-Muller in float32 on the pair (w_a, w_b) = (w0, w1) for
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
//   normal   both     k    transform v2 (NormalTransform::kBoxMullerV2): the same words,
//                          u1 and u2 as v1, and
//                            r  = sqrt(-2 ln u1),  (c, s) = (cos, sin)(2 pi u2)
//                            even lane = mean + (stddev * r) * c, odd lane = ... * s
//                          computed by NormalRadius*V2 and CosSinTurn*V2 below: the angle
//                          is reduced exactly (4 u2 = j + y in integers), ln and the
//                          trigonometric functions are fixed polynomials, and every step
//                          is a correctly rounded fma, multiply or square root. Each
//                          standard normal (mean 0, stddev 1) is within 4 ulp of the exact
//                          Box-Muller value of its u1 and u2 (tests/cpu/philox_test.cc
//                          checks every float32 radius and angle, and samples of pairs:
//                          the worst seen are 3.4 ulp for float32 and 3.3 for float64).
//
//   normal   float32  k=4  transform v3 (NormalTransform::kInverseCdfV3): the normal CDF
//                          inverted, one word w_j a lane. With B = ~(2 w_j) mod 2^32 (odd),
//                          t = B 2^-33 in (0, 1/2) is a tail probability and
//                          z = -Phi^-1(t), negated where w_j's top bit is set. It is
//                          computed by NormalFloat32V3 below: B's float32 rounded toward
//                          zero names one of 512 segments (its exponent and next four
//                          bits), X = float32(((2 w_j + 1) << (clz(B) + 5)) mod 2^32) is
//                          the offset from the segment's edge nearer the centre, and
//                          |z| = c0 + X (c1 + X (c2 + X c3)) in three correctly rounded
//                          fmas, c the segment's row of kernels/normal_v3_table.h. Then
//                          out = fma(stddev, z, mean) in float32. Each standard normal is
//                          within 2.1 ulp of -Phi^-1(t) (tests/cpu/normal_v3_test.cc).
//   normal   float64  k=2  transform v3: exactly v2's float64 values (v3 changes float32
//                          only).
//
// Versions: a transform, once published, never changes a bit; a different one is a new
// version. RandomParams (and the API's RandomOp) default to v1, so requests from before
// v2 existed keep their numbers; the clients ask for the newest.
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
// by powers of two, and normals v2 and v3 are exact operations only, so every backend
// produces them bit-identically. Normal v1 goes through logf/sqrtf/cosf/sinf
// (log/sqrt/cos/sin for float64), whose last-bit rounding differs between math libraries
// (glibc vs CUDA's libdevice, which document errors of 1-2 ulp), and a compiler may
// contract mean + stddev * z into a fused multiply-add; v1 normals are therefore
// identical across runs and thread counts of one build, and agree across backends to a
// few ulp only (the conformance suite bounds the difference, and holds the others to
// bitwise equality).
#ifndef GPUCOMPUTE_KERNELS_PHILOX_H_
#define GPUCOMPUTE_KERNELS_PHILOX_H_

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/dtype.h"
#include "kernels/host_device.h"
#include "kernels/normal_v3_table.h"
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

// One round: two 32x32->64-bit products, their high halves mixed into the other words
// with the round's key.
GPUCOMPUTE_HD PhiloxWords PhiloxRound(const PhiloxWords& ctr, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = static_cast<uint64_t>(kPhiloxM0) * ctr.w[0];
  const uint64_t p1 = static_cast<uint64_t>(kPhiloxM1) * ctr.w[2];
  return {{static_cast<uint32_t>(p1 >> 32) ^ ctr.w[1] ^ k0, static_cast<uint32_t>(p1),
           static_cast<uint32_t>(p0 >> 32) ^ ctr.w[3] ^ k1, static_cast<uint32_t>(p0)}};
}

// The key schedule: round r uses key + r * (W0, W1). It depends on the seed alone, so a
// fill computes it once, and a CUDA kernel takes it as a parameter, read straight from
// the constant bank by the xor that uses it.
struct PhiloxRoundKeys {
  uint32_t k[kPhiloxRounds][2];
};

GPUCOMPUTE_HD PhiloxRoundKeys PhiloxRoundKeysFor(PhiloxKey key) {
  PhiloxRoundKeys keys;
  for (int round = 0; round < kPhiloxRounds; ++round) {
    keys.k[round][0] = key.k[0] + static_cast<uint32_t>(round) * kPhiloxW0;
    keys.k[round][1] = key.k[1] + static_cast<uint32_t>(round) * kPhiloxW1;
  }
  return keys;
}

// Philox4x32-10: a bijection of the 128-bit counter for each key.
GPUCOMPUTE_HD PhiloxWords Philox4x32(PhiloxWords ctr, const PhiloxRoundKeys& keys) {
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int round = 0; round < kPhiloxRounds; ++round) {
    ctr = PhiloxRound(ctr, keys.k[round][0], keys.k[round][1]);
  }
  return ctr;
}

GPUCOMPUTE_HD PhiloxWords Philox4x32(PhiloxWords ctr, PhiloxKey key) {
  return Philox4x32(ctr, PhiloxRoundKeysFor(key));
}

GPUCOMPUTE_HD PhiloxKey PhiloxKeyFromSeed(uint64_t seed) {
  return {{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)}};
}

// Block `q` of a fill: counter (q low, q high, 0, 0).
GPUCOMPUTE_HD PhiloxWords PhiloxBlock(const PhiloxRoundKeys& keys, uint64_t q) {
  const PhiloxWords ctr = {{static_cast<uint32_t>(q), static_cast<uint32_t>(q >> 32), 0u, 0u}};
  return Philox4x32(ctr, keys);
}

// Block `q` of a fill with `seed`.
GPUCOMPUTE_HD PhiloxWords PhiloxBlock(uint64_t seed, uint64_t q) {
  return PhiloxBlock(PhiloxRoundKeysFor(PhiloxKeyFromSeed(seed)), q);
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

// ---- Normal transform v2: Box-Muller in fused polynomials, the same bits everywhere. ----
//
// Every step below is exact integer arithmetic, an exact conversion or power-of-two
// scaling, or one correctly rounded fma, multiply, subtraction or square root, each
// spelled out (never `a * b + c`, which a compiler may contract or not), so that the CPU
// and a GPU compute the same bits. No libm call is involved.

// The bits of a float or double as an unsigned integer of its size, and back.
template <typename To, typename From>
GPUCOMPUTE_HD To BitCast(From x) {
  static_assert(sizeof(To) == sizeof(From), "a bit cast keeps the size");
  To y;
  memcpy(&y, &x, sizeof(y));
  return y;
}

GPUCOMPUTE_HD uint32_t FloatBits(float x) { return BitCast<uint32_t>(x); }
GPUCOMPUTE_HD float BitsToFloat(uint32_t bits) { return BitCast<float>(bits); }
GPUCOMPUTE_HD uint64_t DoubleBits(double x) { return BitCast<uint64_t>(x); }
GPUCOMPUTE_HD double BitsToDouble(uint64_t bits) { return BitCast<double>(bits); }

// Correctly rounded a * b + c, a * b and sqrt(a) for T = float or double, never
// contracted with a neighbouring operation.
template <typename T>
GPUCOMPUTE_HD T ExactFma(T a, T b, T c) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(float))
    return __fmaf_rn(a, b, c);
  else
    return __fma_rn(a, b, c);
#else
  if constexpr (sizeof(T) == sizeof(float))
    return fmaf(a, b, c);
  else
    return fma(a, b, c);
#endif
}

template <typename T>
GPUCOMPUTE_HD T ExactMul(T a, T b) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(float))
    return __fmul_rn(a, b);
  else
    return __dmul_rn(a, b);
#else
  return a * b;
#endif
}

template <typename T>
GPUCOMPUTE_HD T ExactSqrt(T a) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == sizeof(float))
    return __fsqrt_rn(a);
  else
    return __dsqrt_rn(a);
#else
  if constexpr (sizeof(T) == sizeof(float))
    return sqrtf(a);
  else
    return sqrt(a);
#endif
}

// sqrt(a) correctly rounded, as ExactSqrt, for a = +0 or a normal float of at least
// 2^-101: every argument NormalRadiusFloat32V2 takes (+0, or about -2 ln(1 - 2^-24),
// 2^-23, and up). A GPU computes it as __fsqrt_rn's own fast path does, with the
// instructions ptxas emits for that path (an approximate reciprocal square root y, then
// s = a y and one Newton step fma(fma(-s, s, a), y / 2, s)), so the bits are sqrtf's. It
// leaves out the range check, the branch and the slow-path call around them, more than
// half of __fsqrt_rn's instructions, which only an argument below 2^-101, an infinity
// or a NaN needs. y is clamped to 2^24 (it is below 2^12 for every nonzero argument
// here), so that a = +0 gives 0 * 2^24 = +0, not 0 * inf = NaN.
// cuda_kernels_test checks every radius on a GPU against the CPU's sqrtf.
GPUCOMPUTE_HD float RadiusSqrt(float a) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(a));
  y = fminf(y, 0x1.0p+24f);
  const float s = __fmul_rn(a, y);
  return __fmaf_rn(__fmaf_rn(-s, s, a), __fmul_rn(0.5f, y), s);
#else
  return sqrtf(a);
#endif
}

// c[0] + x * (c[1] + x * (... + x * c[N-1])), one fma a step.
template <typename T, int N>
GPUCOMPUTE_HD T Horner(const T (&c)[N], T x) {
  T p = c[N - 1];
#if defined(__CUDA_ARCH__)
#pragma unroll
#endif
  for (int k = N - 2; k >= 0; --k) p = ExactFma(p, x, c[k]);
  return p;
}

// The polynomials, coefficients low degree first: Chebyshev fits (near-minimax) rounded
// to the type.
// With f = m - 1 for m in [sqrt(1/2), sqrt(2)), -2 log1p(f) = -2 f + f^2 * Minus2Log1pTail(f);
// with y in [-1/2, 1/2] and s = y^2, sin(pi y / 2) = y * SinHalfPiOverY(s) and
// cos(pi y / 2) = CosHalfPi(s).
//
// Float32 coefficients are local arrays, folded into immediates that an FFMA takes as
// an operand. A DFMA takes none, so as immediates each float64 coefficient costs two
// uniform moves per use (66 instructions per Philox block, which the fill loop cannot
// hoist: they would need more uniform registers than there are). Device code therefore
// reads them from a __constant__ copy, one 64-bit constant load each; the values are the
// same.
#if defined(__CUDACC__)
#define GPUCOMPUTE_F64_COEFFICIENTS(name, ...)          \
  inline constexpr double name##Host[] = {__VA_ARGS__}; \
  static __constant__ double name##Device[] = {__VA_ARGS__}
#else
#define GPUCOMPUTE_F64_COEFFICIENTS(name, ...) inline constexpr double name##Host[] = {__VA_ARGS__}
#endif
#if defined(__CUDA_ARCH__)
#define GPUCOMPUTE_F64_COEFFICIENTS_OF(name) name##Device
#else
#define GPUCOMPUTE_F64_COEFFICIENTS_OF(name) name##Host
#endif

GPUCOMPUTE_HD float Minus2Log1pTail(float f) {
  const float c[] = {0x1.0p+0f,      -0x1.55554ep-1f, 0x1.000008p-1f, -0x1.99a13p-2f,
                     0x1.5559e6p-2f, -0x1.237a56p-2f, 0x1.fcc1aep-3f, -0x1.e3d33ap-3f,
                     0x1.d962f2p-3f, -0x1.15425cp-3f};
  return Horner(c, f);
}

GPUCOMPUTE_F64_COEFFICIENTS(kMinus2Log1pTailF64, 0x1.0p+0, -0x1.555555555555cp-1,
                            0x1.fffffffffff34p-2, -0x1.999999999772bp-2, 0x1.5555555561dddp-2,
                            -0x1.249249261f2ccp-2, 0x1.fffffff7e955cp-3, -0x1.c71c70c1303cbp-3,
                            0x1.99999a6364b62p-3, -0x1.745d460eacbc4p-3, 0x1.55556c388aeddp-3,
                            -0x1.3b0eda8f5d75cp-3, 0x1.248b2a78bff2p-3, -0x1.115b4daceee38p-3,
                            0x1.00b0e81fd59f4p-3, -0x1.dd3093b701211p-4, 0x1.b635ac30a3dacp-4,
                            -0x1.bb08e0be73d94p-4, 0x1.fc84a09888c57p-4, -0x1.ceab3eecb74d9p-4,
                            0x1.8e8f5f6d78efbp-5);
GPUCOMPUTE_HD double Minus2Log1pTail(double f) {
  return Horner(GPUCOMPUTE_F64_COEFFICIENTS_OF(kMinus2Log1pTailF64), f);
}

GPUCOMPUTE_HD float SinHalfPiOverY(float s) {
  const float c[] = {0x1.921fb6p+0f, -0x1.4abbbap-1f, 0x1.465ec4p-4f, -0x1.2d9b4p-8f};
  return Horner(c, s);
}

GPUCOMPUTE_F64_COEFFICIENTS(kSinHalfPiOverYF64, 0x1.921fb54442d18p+0, -0x1.4abbce625be41p-1,
                            0x1.466bc677587f8p-4, -0x1.32d2cce2e5b19p-8, 0x1.50782fda12d96p-13,
                            -0x1.e30071afc3e59p-19, 0x1.e3f38399551bfp-25);
GPUCOMPUTE_HD double SinHalfPiOverY(double s) {
  return Horner(GPUCOMPUTE_F64_COEFFICIENTS_OF(kSinHalfPiOverYF64), s);
}

GPUCOMPUTE_HD float CosHalfPi(float s) {
  const float c[] = {0x1.0p+0f, -0x1.3bd3ccp+0f, 0x1.03c1dcp-2f, -0x1.55c57ap-6f, 0x1.d9c2e8p-11f};
  return Horner(c, s);
}

GPUCOMPUTE_F64_COEFFICIENTS(kCosHalfPiF64, 0x1.0p+0, -0x1.3bd3cc9be45dep+0, 0x1.03c1f081b5aacp-2,
                            -0x1.55d3c7e3c90f8p-6, 0x1.e1f5068355e15p-11, -0x1.a6d1ec7906c2p-16,
                            0x1.f9cc41140bb6p-22, -0x1.b264ba152378ap-28);
GPUCOMPUTE_HD double CosHalfPi(double s) {
  return Horner(GPUCOMPUTE_F64_COEFFICIENTS_OF(kCosHalfPiF64), s);
}

// -2 ln 2 = hi + lo, with hi short enough that e * hi is exact for every exponent e used.
inline constexpr float kMinus2Ln2HiFloat32 = -0x1.62e4p+0f;
inline constexpr float kMinus2Ln2LoFloat32 = -0x1.7f7d1cp-19f;
inline constexpr double kMinus2Ln2HiFloat64 = -0x1.62e42feep+0;
inline constexpr double kMinus2Ln2LoFloat64 = -0x1.a39ef35793c76p-32;

// r = sqrt(-2 ln u1) for u1 = x * 2^-24, x = (wa >> 8) + 1 in [1, 2^24] (v1's u1).
// x = 2^e * m with m in [sqrt(1/2), sqrt(2)) is read off the bits of float(x) (exact),
// so ln u1 = (e - 24) ln 2 + log1p(m - 1) with m - 1 exact and small.
GPUCOMPUTE_HD float NormalRadiusFloat32V2(uint32_t wa) {
  const uint32_t bits = FloatBits(static_cast<float>((wa >> 8) + 1u));
  const uint32_t e = (bits - 0x3f3504f3u) >> 23;  // bits >= 1.0f's, so no borrow
  const float f = BitsToFloat(bits - (e << 23)) - 1.0f;
  const float minus2_log1p = ExactFma(ExactMul(f, f), Minus2Log1pTail(f), -2.0f * f);
  const float scale = static_cast<float>(static_cast<int32_t>(e) - 24);
  return RadiusSqrt(
      ExactFma(scale, kMinus2Ln2HiFloat32, ExactFma(scale, kMinus2Ln2LoFloat32, minus2_log1p)));
}

// The same for float64: x = (((w1 << 32) | w0) >> 11) + 1 in [1, 2^53], u1 = x * 2^-53.
GPUCOMPUTE_HD double NormalRadiusFloat64V2(uint32_t w0, uint32_t w1) {
  const uint64_t bits = DoubleBits(static_cast<double>((JoinWords(w0, w1) >> 11) + 1u));
  const uint64_t e = (bits - 0x3fe6a09e667f3bcdu) >> 52;
  const double f = BitsToDouble(bits - (e << 52)) - 1.0;
  const double minus2_log1p = ExactFma(ExactMul(f, f), Minus2Log1pTail(f), -2.0 * f);
  const double scale = static_cast<double>(static_cast<int64_t>(e) - 53);
  return ExactSqrt(
      ExactFma(scale, kMinus2Ln2HiFloat64, ExactFma(scale, kMinus2Ln2LoFloat64, minus2_log1p)));
}

// cos and sin of (pi / 2) * (j + y) for a quadrant j (any integer) and y in [-1/2, 1/2].
template <typename T>
GPUCOMPUTE_HD void CosSinQuarterTurns(uint32_t j, T y, T* cos_t, T* sin_t) {
  const T s = ExactMul(y, y);
  const T sin_y = ExactMul(y, SinHalfPiOverY(s));
  const T cos_y = CosHalfPi(s);
  // A quarter turn maps (cos, sin) to (-sin, cos).
  const T a = (j & 1u) != 0 ? sin_y : cos_y;
  const T b = (j & 1u) != 0 ? cos_y : sin_y;
  *cos_t = ((j + 1u) & 2u) != 0 ? -a : a;
  *sin_t = (j & 2u) != 0 ? -b : b;
}

// cos and sin of 2 pi u2 for v1's u2 = (wb >> 8) * 2^-24: 4 u2 = j + y with j the
// nearest integer, found exactly in integers, so no angle is ever rounded.
// y = (t mod 2^22) * 2^-22 - 1/2 is read off as the float 1 + (t mod 2^22) * 2^-22, built
// from bits, less 3/2: exact, and no integer-to-float conversion.
GPUCOMPUTE_HD void CosSinTurnFloat32V2(uint32_t wb, float* cos_t, float* sin_t) {
  const uint32_t t = (wb >> 8) + (1u << 21);  // 4 u2 * 2^22, plus a half
  const float y = BitsToFloat(0x3f800000u | ((t & 0x3fffffu) << 1)) - 1.5f;
  CosSinQuarterTurns(t >> 22, y, cos_t, sin_t);
}

// The same for float64's u2 = (((w3 << 32) | w2) >> 11) * 2^-53.
GPUCOMPUTE_HD void CosSinTurnFloat64V2(uint32_t w2, uint32_t w3, double* cos_t, double* sin_t) {
  const uint64_t t = (JoinWords(w2, w3) >> 11) + (uint64_t{1} << 50);
  const double y = BitsToDouble(0x3ff0000000000000u | ((t & ((uint64_t{1} << 51) - 1)) << 1)) - 1.5;
  CosSinQuarterTurns(static_cast<uint32_t>(t >> 51), y, cos_t, sin_t);
}

// Two normals of v2 from a pair of words (float32) or a whole block (float64):
// mean + (stddev * r) * cos(2 pi u2) and the same with sin, each with one rounding.
GPUCOMPUTE_HD void NormalPairFloat32V2(uint32_t wa, uint32_t wb, float mean, float stddev,
                                       float* even, float* odd) {
  const float radius = ExactMul(stddev, NormalRadiusFloat32V2(wa));
  float c, s;
  CosSinTurnFloat32V2(wb, &c, &s);
  *even = ExactFma(radius, c, mean);
  *odd = ExactFma(radius, s, mean);
}

GPUCOMPUTE_HD void NormalPairFloat64V2(const PhiloxWords& b, double mean, double stddev,
                                       double* even, double* odd) {
  const double radius = ExactMul(stddev, NormalRadiusFloat64V2(b.w[0], b.w[1]));
  double c, s;
  CosSinTurnFloat64V2(b.w[2], b.w[3], &c, &s);
  *even = ExactFma(radius, c, mean);
  *odd = ExactFma(radius, s, mean);
}

// ---- Normal transform v3 (float32): the normal CDF inverted, one word a value. ----
//
// As v2, every step is exact integer arithmetic, an exact or explicitly rounded
// conversion, or a correctly rounded fma, so the CPU and a GPU compute the same bits.

// The rows of kernels/normal_v3_table.h. Device code reads a __device__ copy (the fill
// kernel stages it in shared memory; kernels/cuda/detail/normal_v3_kernel.cuh).
inline constexpr NormalV3Row kNormalV3Float32[kNormalV3Segments] = {GPUCOMPUTE_NORMAL_V3_ROWS};
#if defined(__CUDACC__)
static __device__ const NormalV3Row kNormalV3Float32Device[kNormalV3Segments] = {
    GPUCOMPUTE_NORMAL_V3_ROWS};
#endif

GPUCOMPUTE_HD const NormalV3Row& NormalV3RowOf(uint32_t row) {
#if defined(__CUDA_ARCH__)
  return kNormalV3Float32Device[row];
#else
  return kNormalV3Float32[row];
#endif
}

// The number of leading zero bits of x != 0.
GPUCOMPUTE_HD uint32_t LeadingZeros(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return static_cast<uint32_t>(__clz(x));
#else
  return static_cast<uint32_t>(__builtin_clz(x));
#endif
}

// x as a float32 rounded toward zero, and to nearest (ties to even).
GPUCOMPUTE_HD float Uint32ToFloatTowardZero(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint2float_rz(x);
#else
  // Bits past the 24 a float32 holds are dropped first; the conversion is then exact.
  const uint32_t zeros = LeadingZeros(x | 1u);
  const uint32_t extra = zeros < 8 ? 8 - zeros : 0;
  return static_cast<float>(x >> extra << extra);
#endif
}

GPUCOMPUTE_HD float Uint32ToFloatNearest(uint32_t x) {
#if defined(__CUDA_ARCH__)
  return __uint2float_rn(x);
#else
  return static_cast<float>(x);  // the default rounding mode: to nearest, ties to even
#endif
}

// Where word w falls: the table row of its segment and its offset X in the segment.
struct NormalV3Point {
  uint32_t row;
  float x;
};

// b = ~(2w) and (2w + 1) << 5 are written as multiply-adds modulo 2^32 (the same values):
// a GPU runs those on its FMA pipe, while shifts and logic ops share the integer pipe
// with Philox's xors, which is the fill's busiest.
GPUCOMPUTE_HD NormalV3Point NormalV3Locate(uint32_t w) {
  // ~(2w) = 2 b' + 1, b' the low 31 bits of ~w: odd, never 0.
  const uint32_t b = w * 0xfffffffeu + 0xffffffffu;
  // The exponent and the next four bits of float32(b) toward zero: (e << 4) | m, e >= 127.
  const uint32_t row = (FloatBits(Uint32ToFloatTowardZero(b)) >> 19) - (127u << 4);
  // (2w + 1) << (clz(b) + 5), as ((2w + 1) << 5) << clz(b): two shifts of at most 31 bits,
  // 0 where their sum reaches 32, i.e. for segments of a single b.
  const uint32_t from_edge = (w * 64u + 32u) << LeadingZeros(b);
  return {row, Uint32ToFloatNearest(from_edge)};
}

// The standard normal of word w, given its segment's row and offset.
GPUCOMPUTE_HD float NormalFloat32V3(uint32_t w, const NormalV3Row& r, float x) {
  const float magnitude =
      ExactFma(ExactFma(ExactFma(r.c[3], x, r.c[2]), x, r.c[1]), x, r.c[0]);  // > 0
  return BitsToFloat(FloatBits(magnitude) | (w & 0x80000000u));
}

GPUCOMPUTE_HD float NormalFloat32V3(uint32_t w) {
  const NormalV3Point at = NormalV3Locate(w);
  return NormalFloat32V3(w, NormalV3RowOf(at.row), at.x);
}

// ---- Whole blocks: every lane of one Philox block, as the fill writes them. ----

// The 4 float32 values of block `b` (uniform or normal).
GPUCOMPUTE_HD void Float32Lanes(const PhiloxWords& b, const RandomParams& p, float out[4]) {
  const float mean = static_cast<float>(p.mean);  // normals
  const float stddev = static_cast<float>(p.stddev);
  if (p.distribution == Distribution::kNormal &&
      p.normal_transform == NormalTransform::kInverseCdfV3) {
    for (int j = 0; j < 4; ++j) out[j] = ExactFma(stddev, NormalFloat32V3(b.w[j]), mean);
  } else if (p.distribution == Distribution::kNormal &&
             p.normal_transform == NormalTransform::kBoxMullerV2) {
    NormalPairFloat32V2(b.w[0], b.w[1], mean, stddev, &out[0], &out[1]);
    NormalPairFloat32V2(b.w[2], b.w[3], mean, stddev, &out[2], &out[3]);
  } else if (p.distribution == Distribution::kNormal) {
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
  if (p.distribution == Distribution::kNormal &&
      (p.normal_transform == NormalTransform::kBoxMullerV2 ||
       p.normal_transform == NormalTransform::kInverseCdfV3)) {
    NormalPairFloat64V2(b, p.mean, p.stddev, &out[0], &out[1]);
  } else if (p.distribution == Distribution::kNormal) {
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
