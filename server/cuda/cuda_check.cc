#include "server/cuda/cuda_check.h"

#include <cstdio>

#include "absl/strings/str_cat.h"

namespace gpucompute::cuda {

bool IsStickyError(cudaError_t error) {
  switch (error) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorLaunchTimeout:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

absl::Status CudaStatus(cudaError_t error, const char* call, const char* file, int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  if (!IsStickyError(error)) cudaGetLastError();
  std::string message = absl::StrCat(call, " failed with ", cudaGetErrorName(error), " (",
                                     cudaGetErrorString(error), ") at ", file, ":", line);
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(std::move(message));
  return absl::InternalError(std::move(message));
}

void LogIfFailed(cudaError_t error, const char* call) {
  if (error == cudaSuccess) return;
  std::fprintf(stderr, "gpucompute: %s failed: %s (%s)\n", call, cudaGetErrorName(error), cudaGetErrorString(error));
}

}  // namespace gpucompute::cuda
