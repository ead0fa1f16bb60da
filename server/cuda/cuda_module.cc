// The CUDA backend as a module: libgpucompute_cuda_backend.so, which the server opens
// (server/core/backend_loader.cc) only when it runs on CUDA, so that a server on the CPU backend
// never loads the CUDA runtime, cuBLAS or NVRTC. Its one exported symbol is the function
// below; the link hides everything else (server/cuda/cuda_module.map).
#include <memory>

#include "server/core/backend_module.h"
#include "server/cuda/cuda_backend.h"

namespace gpucompute::cuda {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ServerOptions& options) {
  CudaBackendOptions cuda_options;
  cuda_options.pool_initial_bytes = options.pool_initial_bytes;
  cuda_options.pool_release_threshold_bytes = options.pool_release_threshold_bytes;
  cuda_options.kernel_cache_dir = options.kernel_cache_dir.value_or(DefaultKernelCacheDir());
  return CreateCudaBackend(cuda_options);  // FAILED_PRECONDITION without a GPU
}

constexpr BackendModule kModule = {kBackendModuleAbi, &CudaDeviceCount, &CreateBackend};

}  // namespace
}  // namespace gpucompute::cuda

extern "C" __attribute__((visibility("default"))) const gpucompute::BackendModule*
GpucomputeCudaBackendModule() {
  return &gpucompute::cuda::kModule;
}
