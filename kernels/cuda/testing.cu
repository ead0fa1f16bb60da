// IllegalAddressForTestingAsync: a deliberate fault, for tests of the backend's handling
// of a context that a kernel has broken.
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace gpucompute::cuda {
namespace {

// The address is near null, never mapped, so the store faults; volatile keeps the
// compiler from dropping it.
__global__ void StoreToBogusAddressKernel() {
  *reinterpret_cast<volatile int*>(static_cast<uintptr_t>(0x10)) = 1;
}

}  // namespace

cudaError_t IllegalAddressForTestingAsync(cudaStream_t stream) {
  StoreToBogusAddressKernel<<<1, 1, 0, stream>>>();
  // The launch itself succeeds; the fault surfaces (as cudaErrorIllegalAddress, sticky)
  // at the next synchronisation.
  return cudaGetLastError();
}

}  // namespace gpucompute::cuda
