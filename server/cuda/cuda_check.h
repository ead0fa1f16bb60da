// The one place CUDA runtime and cuBLAS error codes become absl::Status.
#ifndef GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_
#define GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace gpucompute::cuda {

// Errors after which the CUDA context is unusable: every later call in the process
// fails too, and results computed since the fault cannot be trusted.
bool IsStickyError(cudaError_t error);

// OK for cudaSuccess. Otherwise a status naming the call, the site and the error:
// RESOURCE_EXHAUSTED for out-of-memory, INTERNAL for everything else (a failed CUDA call
// is the server's problem, never the caller's). Clears the thread's last-error state of
// a non-sticky error, so that it does not resurface in an unrelated later check.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);

// For destructors, which cannot return a status: logs a failed call on stderr.
void LogIfFailed(cudaError_t error, const char* call);

}  // namespace gpucompute::cuda

// Evaluates a CUDA runtime call; on failure returns its status from the enclosing function.
#define GPUCOMPUTE_CUDA_RETURN_IF_ERROR(call)                                                  \
  do {                                                                                          \
    const cudaError_t gpucompute_cuda_error_ = (call);                                          \
    if (gpucompute_cuda_error_ != cudaSuccess) {                                                \
      return ::gpucompute::cuda::CudaStatus(gpucompute_cuda_error_, #call, __FILE__, __LINE__); \
    }                                                                                           \
  } while (false)

#endif  // GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_
