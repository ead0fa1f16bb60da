// The one place where CUDA runtime, cuBLAS and NVRTC results become absl::Status, for all
// host code (server/cuda/, and the tests and benchmark that call CUDA directly). The
// device library, kernels/cuda, keeps cudaError_t: GPUCOMPUTE_KERNEL_RETURN_IF_ERROR in
// kernels/cuda/detail/launch.cuh.
#ifndef GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_
#define GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <nvrtc.h>

#include "absl/status/status.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {

// Errors after which the CUDA context is unusable: every later call in the process
// fails too, and results computed since the fault cannot be trusted.
bool IsStickyError(cudaError_t error);

// OK for success. Otherwise a status naming the call, the error and the site, as
// "<call> failed with <error name> (<description>) at <file>:<line>":
// RESOURCE_EXHAUSTED for out-of-memory (cudaErrorMemoryAllocation,
// CUBLAS_STATUS_ALLOC_FAILED, NVRTC_ERROR_OUT_OF_MEMORY), INTERNAL for everything else (a
// failed library call is the server's problem, never the caller's). The CUDA runtime form
// clears the thread's last-error state of a non-sticky error, so that it does not
// resurface in an unrelated later check.
absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line);
absl::Status CudaStatus(cublasStatus_t status, const char* call, const char* file, int line);
absl::Status CudaStatus(nvrtcResult result, const char* call, const char* file, int line);

// For destructors, which cannot return a status: logs a failed call (server/util/log.h).
void LogIfFailed(cudaError_t error, const char* call);
void LogIfFailed(cublasStatus_t status, const char* call);

}  // namespace gpucompute::cuda

// Evaluates a CUDA runtime, cuBLAS or NVRTC call; when it fails, returns CudaStatus of
// it (call text, file and line included) from the enclosing function.
#define GPUCOMPUTE_CUDA_RETURN_IF_ERROR(call) \
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(::gpucompute::cuda::CudaStatus, call)

// The same through `check`, a function of CudaStatus's arguments that returns its status
// and may act on it too: the CUDA backend's Check also marks the backend failed on a
// sticky error.
#define GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(check, call) \
  RETURN_IF_ERROR(check((call), #call, __FILE__, __LINE__))

#endif  // GPUCOMPUTE_SERVER_CUDA_CUDA_CHECK_H_
