// Device memory of the CUDA backend: allocations from each GPU's stream-ordered pool,
// with small blocks kept for reuse, and the pool's usage and trimming.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda::detail {

absl::StatusOr<DeviceMemory> CudaBackend::Allocate(int device, uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  Device& d = *devices_[device];
  // A small allocation takes a whole block of its size class, so that the block can
  // serve any allocation of that class once freed.
  const uint64_t block_bytes = SmallBlockCache::BlockBytes(bytes);
  // Runs once every use has completed (the executor keeps buffers alive until then), so
  // the block may go to any stream's next allocation, and freeing it in the allocation
  // stream's order is safe.
  auto release = [this, &d, block_bytes](void* ptr, uint64_t) {
    if (block_bytes != 0 && health().ok() && d.small_blocks->Keep(ptr, block_bytes)) return;
    SwitchDevice(d.index);
    const cudaError_t freed = cudaFreeAsync(ptr, d.alloc_stream);
    if (health().ok()) LogIfFailed(freed, "cudaFreeAsync");
  };
  if (block_bytes != 0) {
    if (void* p = d.small_blocks->Take(block_bytes)) {
      return DeviceMemory(p, bytes, device, std::move(release));
    }
  }
  RETURN_IF_ERROR(SetDevice(device));
  void* p = nullptr;
  const uint64_t pool_bytes = block_bytes != 0 ? block_bytes : std::max<uint64_t>(bytes, 1);
  cudaError_t error = cudaMallocFromPoolAsync(&p, pool_bytes, d.pool, d.alloc_stream);
  if (error == cudaErrorMemoryAllocation && d.small_blocks->kept_bytes() > 0) {
    // The kept blocks may be what is missing: give them back to the pool and try again.
    cudaGetLastError();
    FreeSmallBlocks(d);
    error = cudaMallocFromPoolAsync(&p, pool_bytes, d.pool, d.alloc_stream);
  }
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("device ", device, " is out of memory allocating ", bytes,
                     " bytes (pool holds ", MemoryPoolUsage(device).reserved_bytes, " bytes)"));
  }
  RETURN_IF_ERROR(Check(error, "cudaMallocFromPoolAsync", __FILE__, __LINE__));
  // Waiting here orders the allocation before any use on any stream.
  RETURN_IF_ERROR(
      Check(cudaStreamSynchronize(d.alloc_stream), "cudaStreamSynchronize", __FILE__, __LINE__));
  return DeviceMemory(p, bytes, device, std::move(release));
}

void CudaBackend::FreeSmallBlocks(Device& d) {
  for (const auto& [block, block_bytes] : d.small_blocks->TakeAll()) {
    LogIfFailed(cudaFreeAsync(block, d.alloc_stream), "cudaFreeAsync");
  }
}

PoolUsage CudaBackend::MemoryPoolUsage(int device) const {
  PoolUsage usage;
  if (device < 0 || device >= static_cast<int>(devices_.size())) return usage;
  cudaMemPool_t pool = devices_[device]->pool;
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &usage.reserved_bytes);
  cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemCurrent, &usage.used_bytes);
  // Kept small blocks are free to reuse, not in use.
  usage.used_bytes -= std::min(usage.used_bytes, devices_[device]->small_blocks->kept_bytes());
  return usage;
}

absl::StatusOr<PoolUsage> CudaBackend::TrimMemoryPool(int device, uint64_t keep_bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(SetDevice(device));
  Device& d = *devices_[device];
  FreeSmallBlocks(d);
  // Frees still pending in the allocation stream's order would not be released.
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaStreamSynchronize(d.alloc_stream));
  // Nothing to do when the pool holds no more than keep_bytes; the driver would round a
  // huge keep_bytes up to its granularity, overflow, and trim everything.
  if (keep_bytes < MemoryPoolUsage(device).reserved_bytes) {
    GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaMemPoolTrimTo(d.pool, keep_bytes));
  }
  return MemoryPoolUsage(device);
}

}  // namespace gpucompute::cuda::detail
