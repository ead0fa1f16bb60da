// The CUDA backend: device memory from a stream-ordered pool per GPU, one persistent CUDA
// stream per Stream, CUDA events for ordering and timing, pinned staging for transfers,
// NVRTC-compiled fused elementwise kernels, cuBLAS gemv and matmul, CUB reductions and Philox
// random fills (kernels/cuda/). Host code: it builds with the host compiler.
#ifndef GPUCOMPUTE_SERVER_CUDA_CUDA_BACKEND_H_
#define GPUCOMPUTE_SERVER_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/core/backend.h"

namespace gpucompute::cuda {

struct CudaBackendOptions {
  // Bytes each device's pool reserves at start, so that the first allocations do not
  // wait for the driver.
  uint64_t pool_initial_bytes = 0;
  // Bytes each pool keeps reserved when memory is freed; UINT64_MAX keeps everything
  // (fastest reuse), 0 returns freed memory to the device at each synchronisation.
  uint64_t pool_release_threshold_bytes = UINT64_MAX;
  // Directory of the compiled-kernel cache that survives restarts; empty disables it.
  std::string kernel_cache_dir;
  // Bytes of pinned host memory kept for staging transfers, per device.
  uint64_t pinned_staging_bytes = 64ull << 20;
  // Bytes of freed small blocks (up to 1 MiB each) each device keeps for reuse, so that
  // small allocations skip the pool's driver call and wait.
  uint64_t small_block_cache_bytes = 64ull << 20;
};

// The number of CUDA devices usable here: 0 without a driver or a GPU.
int CudaDeviceCount();

// A backend over every visible GPU. FAILED_PRECONDITION when there is none.
absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions& options);

// The default kernel cache directory: $GPUCOMPUTE_KERNEL_CACHE, else
// $XDG_CACHE_HOME/gpucompute/kernels, else ~/.cache/gpucompute/kernels.
std::string DefaultKernelCacheDir();

// Makes `backend` (a CUDA backend) hit an illegal address on `device`, a sticky error
// that leaves the backend failed for good. For tests of failure handling only.
absl::Status InjectIllegalAddressForTesting(Backend& backend, int device);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_CUDA_BACKEND_H_
