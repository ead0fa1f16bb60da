// The kernel of RandomAsync (kernels/cuda/random.cu holds the entry point and dispatch).
//
// Element i of the fill is lane i % k of Philox block offset + i / k (kernels/philox.h).
// Each thread computes whole blocks, through the very functions the CPU backend calls
// (Float32Lanes, Float64Lanes, IntegerLanes), and stores a block's k elements with one
// vector store. Every element depends only on (params, dtype, i): the output is the same
// for any grid, bitwise identical run to run, and for uniforms and integers bitwise
// identical to the CPU backend (normals to a few ulp: CUDA's logf/sinf/cosf differ from
// glibc's in the last bit, and nvcc contracts mean + stddev * z into an FMA).
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
template <typename T, int kLanes> struct alignas(sizeof(T) * kLanes) BlockValues {
  T e[kLanes];
};

template <typename T, Distribution kDist>
__device__ __forceinline__ BlockValues<T, ElementsPerCounter(kDist, DTypeOf<T>::value)>
BlockElements(const PhiloxWords& w, const RandomParams& p) {
  constexpr int k = ElementsPerCounter(kDist, DTypeOf<T>::value);
  BlockValues<T, k> v;
  if constexpr (DTypeOf<T>::value == DType::kFloat32) {
    Float32Lanes(w, p, v.e);
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

// Thread g computes blocks g, g + stride, ... of the fill (block b holds elements
// [b * k, b * k + k)). `vector_store` says out is aligned to a whole block; the last,
// partial block is always stored element by element.
template <typename T, Distribution kDist>
__global__ void __launch_bounds__(kBlockThreads)
    RandomKernel(RandomParams params, T* __restrict__ out, int64_t n, bool vector_store) {
  constexpr int k = ElementsPerCounter(kDist, DTypeOf<T>::value);
  static_assert(k > 0, "unsupported distribution and dtype");
  // A compile-time distribution, so the Lanes functions' branch on it folds away and the
  // uniform kernels carry none of Box-Muller's registers.
  params.distribution = kDist;
  const uint64_t blocks = static_cast<uint64_t>(n / k + (n % k != 0 ? 1 : 0));
  const uint64_t full_blocks = static_cast<uint64_t>(n / k);
  const uint64_t stride = static_cast<uint64_t>(gridDim.x) * blockDim.x;
  for (uint64_t b = static_cast<uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x; b < blocks;
       b += stride) {
    const BlockValues<T, k> v = BlockElements<T, kDist>(PhiloxBlock(params.seed, params.offset + b), params);
    T* dst = out + b * k;
    if (vector_store && b < full_blocks) {
      *reinterpret_cast<BlockValues<T, k>*>(dst) = v;
    } else {
      const int count = b < full_blocks ? k : static_cast<int>(n - static_cast<int64_t>(b) * k);
#pragma unroll
      for (int j = 0; j < k; ++j) {
        if (j < count) dst[j] = v.e[j];
      }
    }
  }
}

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_RANDOM_KERNELS_CUH_
