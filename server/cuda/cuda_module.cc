// The CUDA backend as a module: libgpucompute_cuda_backend.so, which the server opens
// (server/core/backend_loader.cc) only when it runs on CUDA, so that a server on the CPU backend
// never loads the CUDA runtime, cuBLAS or NVRTC. Its one exported symbol is the function
// below; the link hides everything else (server/cuda/cuda_module.map).
#include <atomic>
#include <cstdio>
#include <memory>

#include "server/core/backend_module.h"
#include "server/cuda/cuda_backend.h"
#include "server/util/log.h"

namespace gpucompute {
namespace {

// The program's log, from BackendModule::set_log.
std::atomic<LogFunction> program_log{nullptr};

}  // namespace

// The module's Log, which the CUDA backend's code calls: the module links no logger of its
// own (server/util/log.cc is the program's), so every line goes to the program's.
void Log(LogLevel level, absl::string_view message, absl::Span<const LogField> fields) {
  if (const LogFunction log = program_log.load(std::memory_order_acquire); log != nullptr) {
    return log(level, message, fields);
  }
  // Only before the loader has handed its log over, which it does first.
  std::fprintf(stderr, "gpucompute: %.*s\n", static_cast<int>(message.size()), message.data());
}

}  // namespace gpucompute

namespace gpucompute::cuda {
namespace {

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(const ServerOptions& options) {
  CudaBackendOptions cuda_options;
  cuda_options.pool_initial_bytes = options.pool_initial_bytes;
  cuda_options.pool_release_threshold_bytes = options.pool_release_threshold_bytes;
  cuda_options.kernel_cache_dir = options.kernel_cache_dir.value_or(DefaultKernelCacheDir());
  return CreateCudaBackend(cuda_options);  // FAILED_PRECONDITION without a GPU
}

void SetLog(LogFunction log) { program_log.store(log, std::memory_order_release); }

constexpr BackendModule kModule = {kBackendModuleAbi, &CudaDeviceCount, &CreateBackend, &SetLog};

}  // namespace
}  // namespace gpucompute::cuda

extern "C" __attribute__((visibility("default"))) const gpucompute::BackendModule*
GpucomputeCudaBackendModule() {
  return &gpucompute::cuda::kModule;
}
