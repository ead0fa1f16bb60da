// The reference expression, fused by hand: one read and one write per element, 16-byte
// vector loads and stores (float4 / double2) when both buffers are aligned, a
// grid-stride loop sized from the SM count.
#include "kernels/bench/reference_expression.h"

#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/dtype.h"

namespace gpucompute::cuda {
namespace {

using detail::CeilDiv;
using detail::kBlockThreads;

// The expression in each precision, spelled with the precision's own functions.
__device__ __forceinline__ float Expression(float x) {
  return sqrtf(fabsf(expf(-sinf(x * x)) / (sqrtf(fabsf(x)) * tanhf(x))));
}
__device__ __forceinline__ double Expression(double x) {
  return sqrt(fabs(exp(-sin(x * x)) / (sqrt(fabs(x)) * tanh(x))));
}

// 16 bytes of T.
template <typename T> struct alignas(16) Vector16 {
  T e[16 / sizeof(T)];
};

// Vectors [0, n / kVec) with 16-byte accesses, then the remaining n % kVec elements one
// by one. With `vectorised` false (a misaligned buffer) every element goes one by one.
template <typename T>
__global__ void __launch_bounds__(kBlockThreads)
    ReferenceExpressionKernel(const T* x, T* out, int64_t n,
                              bool vectorised) {
  constexpr int kVec = 16 / sizeof(T);
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t scalar_begin = 0;
  if (vectorised) {
    const int64_t vectors = n / kVec;
    const auto* xv = reinterpret_cast<const Vector16<T>*>(x);
    auto* ov = reinterpret_cast<Vector16<T>*>(out);
    for (int64_t v = tid; v < vectors; v += stride) {
      Vector16<T> a = xv[v];
#pragma unroll
      for (int j = 0; j < kVec; ++j) a.e[j] = Expression(a.e[j]);
      ov[v] = a;
    }
    scalar_begin = vectors * kVec;
  }
  for (int64_t i = scalar_begin + tid; i < n; i += stride) out[i] = Expression(x[i]);
}

template <typename T>
cudaError_t Launch(const void* x, void* out, int64_t n, cudaStream_t stream) {
  // Math-bound per element (sin, exp, tanh, two square roots, a division), so a grid
  // that keeps every SM at full occupancy for a few waves.
  constexpr int kBlocksPerSm = 32;
  const bool vectorised =
      reinterpret_cast<uintptr_t>(x) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 16 == 0;
  const int64_t work = vectorised ? CeilDiv(n, 16 / sizeof(T)) : n;
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      detail::GridStrideBlocks(CeilDiv(work, kBlockThreads), kBlocksPerSm, &grid));
  ReferenceExpressionKernel<T><<<grid, kBlockThreads, 0, stream>>>(
      static_cast<const T*>(x), static_cast<T*>(out), n, vectorised);
  return cudaGetLastError();
}

}  // namespace

cudaError_t ReferenceExpressionAsync(DType dtype, const void* x, void* out, int64_t n,
                                     cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (dtype) {
    case DType::kFloat32: return Launch<float>(x, out, n, stream);
    case DType::kFloat64: return Launch<double>(x, out, n, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace gpucompute::cuda
