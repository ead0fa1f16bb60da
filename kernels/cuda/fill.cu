// FillAsync: the entry point and its dispatch; the kernel is in detail/fill_kernels.cuh.
// Only the element size matters, so three instantiations serve every dtype. IotaAsync:
// 0, 1, ..., count - 1 as int64.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/detail/fill_kernels.cuh"
#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

// Blocks per SM of the grid-stride fill: a few waves of resident blocks.
constexpr int kFillBlocksPerSm = 32;

template <typename T>
cudaError_t FillDispatch(void* dst_bytes, uint64_t value_bits, int64_t count, cudaStream_t stream) {
  T* dst = static_cast<T*>(dst_bytes);
  T value;
  std::memcpy(&value, &value_bits, sizeof(T));  // the low bytes (little-endian)
  uint4 pattern;
  T* lanes = reinterpret_cast<T*>(&pattern);
  for (size_t j = 0; j < sizeof(uint4) / sizeof(T); ++j) lanes[j] = value;

  const uintptr_t address = reinterpret_cast<uintptr_t>(dst);
  // Elements before the first 16-byte boundary; all of them if dst is not even
  // element-aligned, so that no vector store is misaligned.
  int64_t head = count;
  if (address % sizeof(T) == 0) {
    head = std::min<int64_t>(count, static_cast<int64_t>(((16 - address % 16) % 16) / sizeof(T)));
  }
  const int64_t vectors = (count - head) / (16 / sizeof(T));
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(GridStrideBlocks(
      CeilDiv(std::max<int64_t>(vectors, head), kBlockThreads), kFillBlocksPerSm, &grid));
  FillKernel<T><<<grid, kBlockThreads, 0, stream>>>(dst, count, head, value, pattern);
  return cudaGetLastError();
}

__global__ void __launch_bounds__(kBlockThreads) IotaKernel(int64_t* dst, int64_t count) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = i;
  }
}

}  // namespace
}  // namespace detail

cudaError_t FillAsync(void* dst, DType dtype, uint64_t value_bits, int64_t count,
                      cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  switch (DTypeSize(dtype)) {
    case 1:
      return detail::FillDispatch<uint8_t>(dst, value_bits, count, stream);
    case 4:
      return detail::FillDispatch<uint32_t>(dst, value_bits, count, stream);
    case 8:
      return detail::FillDispatch<uint64_t>(dst, value_bits, count, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t IotaAsync(int64_t* dst, int64_t count, cudaStream_t stream) {
  if (count <= 0) return cudaSuccess;
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(detail::GridStrideBlocks(
      detail::CeilDiv(count, detail::kBlockThreads), detail::kFillBlocksPerSm, &grid));
  detail::IotaKernel<<<grid, detail::kBlockThreads, 0, stream>>>(dst, count);
  return cudaGetLastError();
}

}  // namespace gpucompute::cuda
