// The kernel of FillAsync (kernels/cuda/fill.cu holds the entry point and dispatch).
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_FILL_KERNELS_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_FILL_KERNELS_CUH_

#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"

namespace gpucompute::cuda::detail {

// Writes `value` to dst[0, count). The body uses 16-byte stores of `pattern` (value
// repeated), grid-stride; the `head` elements before the first 16-byte boundary (all of
// them when dst is not element-aligned) and the elements after the last are written one
// by one.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    FillKernel(T* __restrict__ dst, int64_t count, int64_t head, T value, uint4 pattern) {
  constexpr int64_t kVec = 16 / sizeof(T);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t vectors = (count - head) / kVec;
  const int64_t tail = head + vectors * kVec;
  for (int64_t i = tid; i < head; i += stride) dst[i] = value;
  if (tid < count - tail) dst[tail + tid] = value;
  uint4* body = reinterpret_cast<uint4*>(dst + head);
  for (int64_t v = tid; v < vectors; v += stride) body[v] = pattern;
}

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_FILL_KERNELS_CUH_
