// RandomAsync: the entry point and its dispatch; the kernel is in
// detail/random_kernels.cuh. One kernel per (dtype, distribution, normal transform) the
// fill defines: eight.
//
// Determinism: element i depends only on (params, dtype, i), never on the launch, so the
// fill is bitwise identical run to run; uniforms, integers and normal v2 are also bitwise
// identical to the CPU backend (see kernels/philox.h).
#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/random_kernels.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

// Philox is ALU work (10 rounds of two 32x32->64-bit multiplies per block), so the grid
// is sized to keep every SM at full occupancy: 8 resident 256-thread blocks, 4 waves.
constexpr int kRandomBlocksPerSm = 32;

template <typename T, Distribution kDist,
          NormalTransform kTransform = NormalTransform::kBoxMullerV1>
cudaError_t RandomDispatch(const RandomParams& params, void* out_bytes, int64_t n,
                           cudaStream_t stream) {
  constexpr int k = ElementsPerCounter(kDist, DTypeOf<T>::value);
  T* out = static_cast<T*>(out_bytes);
  const bool vector_store = reinterpret_cast<uintptr_t>(out) % (sizeof(T) * k) == 0;
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      GridStrideBlocks(CeilDiv(CeilDiv(n, k), kBlockThreads), kRandomBlocksPerSm, &grid));
  const PhiloxRoundKeys keys = PhiloxRoundKeysFor(PhiloxKeyFromSeed(params.seed));
  RandomKernel<T, kDist, kTransform>
      <<<grid, kBlockThreads, 0, stream>>>(params, keys, out, n, vector_store);
  return cudaGetLastError();
}

template <typename T>
cudaError_t NormalDispatch(const RandomParams& params, void* out, int64_t n, cudaStream_t stream) {
  switch (params.normal_transform) {
    case NormalTransform::kBoxMullerV1:
      return RandomDispatch<T, Distribution::kNormal, NormalTransform::kBoxMullerV1>(params, out, n,
                                                                                     stream);
    case NormalTransform::kBoxMullerV2:
      return RandomDispatch<T, Distribution::kNormal, NormalTransform::kBoxMullerV2>(params, out, n,
                                                                                     stream);
  }
  return cudaErrorInvalidValue;  // a transform this build does not know
}

}  // namespace
}  // namespace detail

cudaError_t RandomAsync(const RandomParams& params, DType dtype, void* out, int64_t n,
                        cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  switch (params.distribution) {
    case Distribution::kUniform:
      if (dtype == DType::kFloat32) {
        return detail::RandomDispatch<float, Distribution::kUniform>(params, out, n, stream);
      }
      if (dtype == DType::kFloat64) {
        return detail::RandomDispatch<double, Distribution::kUniform>(params, out, n, stream);
      }
      break;
    case Distribution::kNormal:
      if (dtype == DType::kFloat32) return detail::NormalDispatch<float>(params, out, n, stream);
      if (dtype == DType::kFloat64) return detail::NormalDispatch<double>(params, out, n, stream);
      break;
    case Distribution::kIntegers:
      if (params.low >= params.high) break;  // an empty range
      if (dtype == DType::kInt32) {
        return detail::RandomDispatch<int32_t, Distribution::kIntegers>(params, out, n, stream);
      }
      if (dtype == DType::kInt64) {
        return detail::RandomDispatch<int64_t, Distribution::kIntegers>(params, out, n, stream);
      }
      break;
  }
  // Combinations the fill does not define (ElementsPerCounter == 0); the caller rejects
  // them before getting here.
  return cudaErrorInvalidValue;
}

}  // namespace gpucompute::cuda
