// The kernel of RandomAsync (kernels/cuda/random.cu holds the entry point and dispatch).
//
// Element i of the fill is lane i % k of Philox block offset + i / k (kernels/philox.h).
// Each thread computes whole blocks, through the very functions the CPU backend calls
// (Float32Lanes, Float64Lanes, IntegerLanes; normal v1 through the variants below), and
// stores a block's k elements with one vector store. Every element depends only on
// (params, dtype, i): the output is the same for any grid, bitwise identical run to run,
// and for uniforms, integers and normal v2 bitwise identical to the CPU backend (normal
// v1 to a few ulp: CUDA's logf/sincosf differ from glibc's logf/sinf/cosf in the last
// bit, and nvcc contracts mean + stddev * z into an FMA).
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_RANDOM_KERNELS_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_RANDOM_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"

namespace gpucompute::cuda::detail {

// The k elements of one Philox block, aligned so that a store of the whole is one
// 16-byte (8 for int32) vector store.
template <typename T, int kLanes>
struct alignas(sizeof(T) * kLanes) BlockValues {
  T e[kLanes];
};

// Normal v1: Box-Muller as kernels/philox.h defines it (u1, u2 and t = 2pi * u2 computed
// and rounded exactly as BoxMullerFloat32/64 do), but with one sincosf/sincos of t where
// philox.h calls cosf(t) and sinf(t): one range reduction and one quadrant selection for
// both, about 40% fewer instructions than two calls. CUDA documents the same error bound
// for sincosf as for sinf and cosf, so the result stays within a few ulp of the CPU's
// glibc values. t is in [0, 2pi), far below the 105615 (float32) and 2^31-ish (float64)
// at which CUDA switches to Payne-Hanek reduction: that branch is compiled in (with its
// local-memory frame) but never taken, costing one compare.
//
// sincospif(2 * u2) would skip rounding t and its range reduction altogether, but it
// computes cos(2pi * u2) where the CPU computes cos(fl(2pi * u2)): the two differ by up
// to |d cos| <= ulp(t) / 2 = 2^-22 absolute (float32, t in [4, 2pi)), which is r * 2.4e-7
// in z, up to 1.4e-6 for the largest r (5.8). That is within the tests' 2e-6 * (|z| +
// stddev), but near the zeros of cos and sin it is hundreds of ulps of the value, not
// "within rounding" of the CPU's result, so it is not used.
__device__ __forceinline__ void BoxMullerFloat32Fast(uint32_t wa, uint32_t wb, float* z_even,
                                                     float* z_odd) {
  const float u1 = static_cast<float>((wa >> 8) + 1u) * 0x1.0p-24f;
  const float u2 = static_cast<float>(wb >> 8) * 0x1.0p-24f;
  const float r = sqrtf(-2.0f * logf(u1));
  const float t = __fmul_rn(6.28318530717958647692f, u2);  // as the CPU rounds it
  float s, c;
  sincosf(t, &s, &c);
  *z_even = r * c;
  *z_odd = r * s;
}

__device__ __forceinline__ void BoxMullerFloat64Fast(const PhiloxWords& b, double* z_even,
                                                     double* z_odd) {
  const double u1 = static_cast<double>((JoinWords(b.w[0], b.w[1]) >> 11) + 1u) * 0x1.0p-53;
  const double u2 = static_cast<double>(JoinWords(b.w[2], b.w[3]) >> 11) * 0x1.0p-53;
  const double r = sqrt(-2.0 * log(u1));
  const double t = __dmul_rn(6.28318530717958647692, u2);
  double s, c;
  sincos(t, &s, &c);
  *z_even = r * c;
  *z_odd = r * s;
}

template <typename T, Distribution kDist, NormalTransform kTransform>
__device__ __forceinline__ BlockValues<T, ElementsPerCounter(kDist, DTypeOf<T>::value)>
BlockElements(const PhiloxWords& w, const RandomParams& p) {
  constexpr int k = ElementsPerCounter(kDist, DTypeOf<T>::value);
  constexpr bool kNormalV1 =
      kDist == Distribution::kNormal && kTransform == NormalTransform::kBoxMullerV1;
  BlockValues<T, k> v;
  if constexpr (kNormalV1 && DTypeOf<T>::value == DType::kFloat32) {
    const float mean = static_cast<float>(p.mean);
    const float stddev = static_cast<float>(p.stddev);
    float z[4];
    BoxMullerFloat32Fast(w.w[0], w.w[1], &z[0], &z[1]);
    BoxMullerFloat32Fast(w.w[2], w.w[3], &z[2], &z[3]);
#pragma unroll
    for (int j = 0; j < 4; ++j) v.e[j] = mean + stddev * z[j];
  } else if constexpr (kNormalV1) {
    double z0, z1;
    BoxMullerFloat64Fast(w, &z0, &z1);
    v.e[0] = p.mean + p.stddev * z0;
    v.e[1] = p.mean + p.stddev * z1;
  } else if constexpr (DTypeOf<T>::value == DType::kFloat32) {
    Float32Lanes(w, p, v.e);  // uniform, or normal v2: philox.h's own arithmetic
  } else if constexpr (DTypeOf<T>::value == DType::kFloat64) {
    Float64Lanes(w, p, v.e);
  } else {
    int64_t wide[2];
    IntegerLanes(w, p, wide);
    v.e[0] = static_cast<T>(wide[0]);
    v.e[1] = static_cast<T>(wide[1]);
  }
  return v;
}

// The loop of every fill kernel. Thread g (of `threads` a block) computes Philox blocks
// g, g + stride, ... of a fill of n elements, k to a block (block b holds elements
// [b * k, b * k + k)); values(words) gives a block's k elements. Whole blocks of an
// aligned `out` go through the first loop, one 16-byte store each (8 for int32), with the
// counter and the destination advanced in place so that no index is multiplied inside
// it; the last, partial block, or every block of an unaligned `out`, goes element by
// element through the second.
template <typename T, int k, typename Values>
__device__ __forceinline__ void FillBlocks(const PhiloxRoundKeys& keys, uint64_t offset,
                                           T* __restrict__ out, int64_t n, bool vector_store,
                                           uint32_t threads, const Values& values) {
  using Block = BlockValues<T, k>;
  const uint64_t blocks = static_cast<uint64_t>(n / k + (n % k != 0 ? 1 : 0));
  const uint64_t whole = vector_store ? static_cast<uint64_t>(n / k) : 0;
  const uint32_t stride = gridDim.x * threads;
  uint64_t b = static_cast<uint64_t>(blockIdx.x) * threads + threadIdx.x;
  uint64_t q = offset + b;  // wraps modulo 2^64, as the definition says
  Block* dst = reinterpret_cast<Block*>(out) + b;
  for (; b < whole; b += stride, q += stride, dst += stride) {
    *dst = values(PhiloxBlock(keys, q));
  }
  for (; b < blocks; b += stride, q += stride) {
    const Block v = values(PhiloxBlock(keys, q));
    const int64_t first = static_cast<int64_t>(b) * k;
    const int count = n - first < k ? static_cast<int>(n - first) : k;
#pragma unroll
    for (int j = 0; j < k; ++j) {
      if (j < count) out[first + j] = v.e[j];
    }
  }
}

// The key schedule comes precomputed in `keys` (kernel parameters live in the constant
// bank, which the xors read directly), and the distribution and transform are template
// parameters, so the Lanes functions' branches fold away and the uniform kernels carry
// none of Box-Muller's registers.
template <typename T, Distribution kDist, NormalTransform kTransform>
__global__ void __launch_bounds__(kBlockThreads)
    RandomKernel(RandomParams params, PhiloxRoundKeys keys, T* __restrict__ out, int64_t n,
                 bool vector_store) {
  constexpr int k = ElementsPerCounter(kDist, DTypeOf<T>::value);
  static_assert(k > 0, "unsupported distribution and dtype");
  params.distribution = kDist;
  params.normal_transform = kTransform;
  FillBlocks<T, k>(keys, params.offset, out, n, vector_store, blockDim.x,
                   [&](const PhiloxWords& w) { return BlockElements<T, kDist, kTransform>(w, params); });
}

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_RANDOM_KERNELS_CUH_
