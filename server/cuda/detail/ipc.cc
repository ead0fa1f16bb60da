// Shared memory and CUDA IPC for the CUDA backend: pinning mapped shared-memory regions
// for DMA, exportable allocations and their IPC handles, and opening another process's.
#include <cuda.h>  // CUresult and CUdeviceptr only: the driver is reached through the runtime
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/detail/cuda_backend_impl.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda::detail {

absl::Status CudaBackend::PinHostMemory(void* ptr, uint64_t bytes, bool read_only) {
  RETURN_IF_ERROR(CheckHealthy());
  // Portable: pinned for every device's context, whichever device a copy runs on.
  unsigned int flags = cudaHostRegisterPortable;
  if (read_only) flags |= cudaHostRegisterReadOnly;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaHostRegister(ptr, bytes, flags));
  return absl::OkStatus();
}

void CudaBackend::UnpinHostMemory(void* ptr) {
  const cudaError_t error = cudaHostUnregister(ptr);
  if (health().ok()) LogIfFailed(error, "cudaHostUnregister");
}

absl::StatusOr<DeviceMemory> CudaBackend::AllocateExportable(int device, uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(device));
  // cudaMalloc, not the pool: cudaIpcGetMemHandle exports only such allocations.
  void* p = nullptr;
  const cudaError_t error = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
  if (error == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "device ", device, " is out of memory allocating ", bytes, " exportable bytes"));
  }
  RETURN_IF_ERROR(Check(error, "cudaMalloc", __FILE__, __LINE__));
  return DeviceMemory(p, bytes, device, [this, device](void* ptr, uint64_t) {
    // cudaFree waits for the device: every use has been enqueued and is done or will be.
    SwitchDevice(device);
    const cudaError_t freed = cudaFree(ptr);
    if (health().ok()) LogIfFailed(freed, "cudaFree");
  });
}

absl::StatusOr<std::string> CudaBackend::ExportIpcHandle(const DeviceMemory& memory) {
  RETURN_IF_ERROR(CheckHealthy());
  RETURN_IF_ERROR(SetDevice(memory.device()));
  cudaIpcMemHandle_t handle;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR_VIA(Check, cudaIpcGetMemHandle(&handle, memory.data()));
  return std::string(reinterpret_cast<const char*>(&handle), sizeof(handle));
}

namespace {

// The allocation that `ptr` lies in (cuMemGetAddressRange), through the runtime's driver
// entry point, so that nothing links libcuda.
absl::Status AllocationRange(void* ptr, CUdeviceptr* base, size_t* size) {
  using GetAddressRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetAddressRange get_range = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found;
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<GetAddressRange>(fn);
  }();
  if (get_range == nullptr) {
    return absl::FailedPreconditionError(
        "the CUDA driver offers no cuMemGetAddressRange to check an IPC allocation's size");
  }
  if (get_range(base, size, reinterpret_cast<CUdeviceptr>(ptr)) != CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed on an opened IPC allocation");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DeviceMemory> CudaBackend::OpenIpcHandle(int device, absl::string_view handle,
                                                        uint64_t bytes) {
  RETURN_IF_ERROR(CheckDevice(device));
  RETURN_IF_ERROR(CheckHealthy());
  cudaIpcMemHandle_t h;
  if (handle.size() != sizeof(h)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a CUDA IPC handle is ", sizeof(h), " bytes, not ", handle.size()));
  }
  std::memcpy(&h, handle.data(), sizeof(h));
  RETURN_IF_ERROR(SetDevice(device));
  void* p = nullptr;
  const cudaError_t error = cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess);
  if (error != cudaSuccess) {
    // A bad handle is the caller's mistake; Check still marks a sticky error.
    absl::Status s = Check(error, "cudaIpcOpenMemHandle", __FILE__, __LINE__);
    if (IsStickyError(error)) return s;
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open the CUDA IPC handle on device ", device, ": ", s.message()));
  }
  DeviceMemory memory(p, bytes, device, [this, device](void* ptr, uint64_t) {
    SwitchDevice(device);
    const cudaError_t closed = cudaIpcCloseMemHandle(ptr);
    if (health().ok()) LogIfFailed(closed, "cudaIpcCloseMemHandle");
  });
  // The client says how large its allocation is; a copy past its end would fault the
  // server's context, so the driver's word is taken instead.
  CUdeviceptr base = 0;
  size_t size = 0;
  RETURN_IF_ERROR(AllocationRange(p, &base, &size));
  const uint64_t available = size - (reinterpret_cast<CUdeviceptr>(p) - base);
  if (bytes > available) {
    return absl::InvalidArgumentError(absl::StrCat("the CUDA IPC allocation holds ", available,
                                                   " bytes, fewer than the ", bytes,
                                                   " the region would cover"));
  }
  return memory;
}

}  // namespace gpucompute::cuda::detail
