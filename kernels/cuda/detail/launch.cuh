// Launch helpers shared by the dispatch layers of kernels/cuda: error propagation, the
// device's SM count, and pool-backed scratch space. Private to kernels/cuda and
// kernels/bench (CUDA translation units only).
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_LAUNCH_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_LAUNCH_CUH_

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.h"

// Evaluates a CUDA runtime call (or an entry point of this library) and returns its
// cudaError_t from the enclosing function when it is not cudaSuccess. Dispatch code is a
// straight line of such calls, so "the first error met" is the one returned. The device
// library's own check: it returns cudaError_t, where the server's
// GPUCOMPUTE_CUDA_RETURN_IF_ERROR (server/cuda/cuda_check.h) returns absl::Status.
#define GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(expr)                                   \
  do {                                                                            \
    const cudaError_t gpucompute_kernel_error_ = (expr);                          \
    if (gpucompute_kernel_error_ != cudaSuccess) return gpucompute_kernel_error_; \
  } while (0)

namespace gpucompute::cuda::detail {

// Every kernel of this library runs blocks of this many threads: 8 warps, so 8 blocks
// fill an SM's 2048 threads on sm_80 and sm_90 when registers allow.
inline constexpr int kBlockThreads = 256;

inline constexpr int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The dtype with the size of T, whose fill writes T's bits (FillAsync of a value's bits).
template <typename T>
constexpr DType SameSizeDType() {
  return sizeof(T) == 1 ? DType::kBool : sizeof(T) == 4 ? DType::kInt32 : DType::kInt64;
}

// Devices whose per-device settings are looked up or made once and remembered; beyond
// these, every call asks again.
inline constexpr int kMaxDevices = 64;

// The current device's SM count, looked up once per device (the attribute query is a
// driver round trip, too slow for every launch). Racing first calls store the same value.
inline cudaError_t SmCount(int* sm_count) {
  static std::atomic<int> cache[kMaxDevices] = {};
  int device = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetDevice(&device));
  if (device >= 0 && device < kMaxDevices) {
    const int cached = cache[device].load(std::memory_order_relaxed);
    if (cached > 0) {
      *sm_count = cached;
      return cudaSuccess;
    }
  }
  int count = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
  if (count <= 0) count = 1;
  if (device >= 0 && device < kMaxDevices) cache[device].store(count, std::memory_order_relaxed);
  *sm_count = count;
  return cudaSuccess;
}

// Blocks for a grid-stride kernel over `work_blocks` blocks' worth of work: enough to
// keep every SM full for several waves, never more than the work. Work is assigned to
// blocks by a grid-stride loop, so the grid size never changes which values are combined
// in which order: results do not depend on it.
inline cudaError_t GridStrideBlocks(int64_t work_blocks, int blocks_per_sm, unsigned* grid) {
  int sm_count = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(SmCount(&sm_count));
  const int64_t cap = static_cast<int64_t>(sm_count) * blocks_per_sm;
  int64_t blocks = work_blocks < cap ? work_blocks : cap;
  if (blocks < 1) blocks = 1;
  *grid = static_cast<unsigned>(blocks);
  return cudaSuccess;
}

// Scratch space from a memory pool, in stream order. Free() gives it back on the same
// stream and reports the status; the destructor does so too if Free() was not called (on
// an early error return), ignoring the status since the first error is already on its way
// to the caller.
class PoolScratch {
 public:
  PoolScratch(cudaMemPool_t pool, cudaStream_t stream) : pool_(pool), stream_(stream) {}
  ~PoolScratch() { (void)Free(); }
  PoolScratch(const PoolScratch&) = delete;
  PoolScratch& operator=(const PoolScratch&) = delete;

  cudaError_t Allocate(size_t bytes) {
    return cudaMallocFromPoolAsync(&ptr_, bytes, pool_, stream_);
  }
  cudaError_t Free() {
    if (ptr_ == nullptr) return cudaSuccess;
    void* p = ptr_;
    ptr_ = nullptr;
    return cudaFreeAsync(p, stream_);
  }
  void* get() const { return ptr_; }

 private:
  cudaMemPool_t pool_;
  cudaStream_t stream_;
  void* ptr_ = nullptr;
};

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_LAUNCH_CUH_
