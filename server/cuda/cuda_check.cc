#include "server/cuda/cuda_check.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "server/util/log.h"

namespace gpucompute::cuda {
namespace {

absl::Status Failure(bool out_of_memory, const char* call, const char* name,
                     const char* description, const char* file, int line) {
  std::string message = absl::StrCat(call, " failed with ", name);
  if (description != nullptr) absl::StrAppend(&message, " (", description, ")");
  absl::StrAppend(&message, " at ", file, ":", line);
  if (out_of_memory) return absl::ResourceExhaustedError(std::move(message));
  return absl::InternalError(std::move(message));
}

void LogFailure(const char* call, const char* name, const char* description) {
  Log(LogLevel::kError, absl::StrCat(call, " failed"),
      {{"error", name}, {"description", description}});
}

}  // namespace

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
  return Failure(error == cudaErrorMemoryAllocation, call, cudaGetErrorName(error),
                 cudaGetErrorString(error), file, line);
}

absl::Status CudaStatus(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return Failure(status == CUBLAS_STATUS_ALLOC_FAILED, call, cublasGetStatusName(status),
                 cublasGetStatusString(status), file, line);
}

absl::Status CudaStatus(nvrtcResult result, const char* call, const char* file, int line) {
  if (result == NVRTC_SUCCESS) return absl::OkStatus();
  // NVRTC has names only ("NVRTC_ERROR_INVALID_OPTION"), no descriptions.
  return Failure(result == NVRTC_ERROR_OUT_OF_MEMORY, call, nvrtcGetErrorString(result), nullptr,
                 file, line);
}

void LogIfFailed(cudaError_t error, const char* call) {
  if (error != cudaSuccess) LogFailure(call, cudaGetErrorName(error), cudaGetErrorString(error));
}

void LogIfFailed(cublasStatus_t status, const char* call) {
  if (status != CUBLAS_STATUS_SUCCESS)
    LogFailure(call, cublasGetStatusName(status), cublasGetStatusString(status));
}

}  // namespace gpucompute::cuda
