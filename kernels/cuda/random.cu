// RandomAsync: the entry point and its dispatch; the kernels are in
// detail/random_kernels.cuh and, for float32 normals of transform v3, in
// detail/normal_v3_kernel.cuh. One kernel per (dtype, distribution, normal transform) the
// fill defines, float64 v3 sharing v2's. RandomLanesForTestingAsync runs the same
// per-block code on words a test chooses.
//
// Determinism: element i depends only on (params, dtype, i), never on the launch, so the
// fill is bitwise identical run to run; uniforms, integers and normal v2 are also bitwise
// identical to the CPU backend (see kernels/philox.h), as are normals v3.
#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/normal_v3_kernel.cuh"
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
    case NormalTransform::kInverseCdfV3:
      if constexpr (DTypeOf<T>::value == DType::kFloat32) {
        return LaunchNormalV3(params, static_cast<float*>(out), n, stream);
      } else {  // float64 v3 is v2's values
        return RandomDispatch<T, Distribution::kNormal, NormalTransform::kBoxMullerV2>(params, out,
                                                                                       n, stream);
      }
  }
  return cudaErrorInvalidValue;  // a transform this build does not know
}

// RandomLanesForTestingAsync: a thread per block of caller-chosen words, through the
// fill kernel's own BlockElements, so the values are the ones a fill writes.
template <typename T, NormalTransform kTransform>
__global__ void __launch_bounds__(kBlockThreads)
    RandomLanesKernel(RandomParams params, const PhiloxWords* __restrict__ words, int64_t blocks,
                      BlockValues<T, ElementsPerCounter(Distribution::kNormal,
                                                        DTypeOf<T>::value)>* __restrict__ out) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  params.normal_transform = kTransform;
  if (params.distribution == Distribution::kNormal) {
    out[b] = BlockElements<T, Distribution::kNormal, kTransform>(words[b], params);
  } else {
    out[b] = BlockElements<T, Distribution::kUniform, kTransform>(words[b], params);
  }
}

template <typename T>
cudaError_t RandomLanesDispatch(const RandomParams& params, const uint32_t* words, int64_t blocks,
                                void* out, cudaStream_t stream) {
  const auto* w = reinterpret_cast<const PhiloxWords*>(words);
  using Block = BlockValues<T, ElementsPerCounter(Distribution::kNormal, DTypeOf<T>::value)>;
  auto* o = static_cast<Block*>(out);
  const int64_t grid = CeilDiv(blocks, kBlockThreads);
  if (grid > 0x7fffffff) return cudaErrorInvalidValue;
  if (params.normal_transform == NormalTransform::kInverseCdfV3) {
    RandomLanesKernel<T, NormalTransform::kInverseCdfV3>
        <<<static_cast<unsigned>(grid), kBlockThreads, 0, stream>>>(params, w, blocks, o);
  } else if (params.normal_transform == NormalTransform::kBoxMullerV2) {
    RandomLanesKernel<T, NormalTransform::kBoxMullerV2>
        <<<static_cast<unsigned>(grid), kBlockThreads, 0, stream>>>(params, w, blocks, o);
  } else {
    RandomLanesKernel<T, NormalTransform::kBoxMullerV1>
        <<<static_cast<unsigned>(grid), kBlockThreads, 0, stream>>>(params, w, blocks, o);
  }
  return cudaGetLastError();
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

cudaError_t RandomLanesForTestingAsync(const RandomParams& params, DType dtype,
                                       const uint32_t* words, int64_t blocks, void* out,
                                       cudaStream_t stream) {
  if (blocks <= 0) return cudaSuccess;
  if (params.distribution != Distribution::kUniform &&
      params.distribution != Distribution::kNormal) {
    return cudaErrorInvalidValue;
  }
  if (dtype == DType::kFloat32) {
    return detail::RandomLanesDispatch<float>(params, words, blocks, out, stream);
  }
  if (dtype == DType::kFloat64) {
    return detail::RandomLanesDispatch<double>(params, words, blocks, out, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpucompute::cuda
