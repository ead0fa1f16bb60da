// The host-side entry points of the CUDA kernels (kernels/cuda/*.cu, the only code built
// by nvcc). Plain C++ over the CUDA runtime's types: no gRPC, no protobuf, no absl.
//
// Every entry point enqueues work on `stream` (the last argument) and returns without
// waiting; the result is the first CUDA error met, cudaSuccess otherwise (GemvAsync, which
// calls cuBLAS, reports a GemvStatus). Scratch space comes from `pool`
// (cudaMallocFromPoolAsync on the same stream) and is always given back on that stream,
// also on error.
#ifndef GPUCOMPUTE_KERNELS_CUDA_KERNELS_H_
#define GPUCOMPUTE_KERNELS_CUDA_KERNELS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace gpucompute::cuda {

// Sets `count` elements of `dtype` at `dst` to the value whose native representation is
// the low DTypeSize(dtype) bytes of `value_bits`.
cudaError_t FillAsync(void* dst, DType dtype, uint64_t value_bits, int64_t count,
                      cudaStream_t stream);

// The reduction of server/cpu/kernels.h (cpu::Reduce), same semantics and result dtype:
// out[o * inner + i] = reduce_{r < extent} in[(o * extent + r) * inner + i].
// shape.f_order_rows must be 0 (the backend handles that case).
cudaError_t ReduceAsync(ReduceKind kind, DType in_dtype, const void* in, const ReduceShape& shape,
                        void* out, cudaMemPool_t pool, cudaStream_t stream);

// The C-order index (int64, written to *out) of the first minimum (is_min) or maximum of
// an F-layout rows x cols array, as numpy.argmin/argmax of it give; NaN counts as the
// extreme. Reads memory in its own order; the answer does not depend on the grid.
cudaError_t ArgExtremeInCOrderAsync(bool is_min, DType dtype, const void* in, int64_t rows,
                                    int64_t cols, void* out, cudaMemPool_t pool,
                                    cudaStream_t stream);

// What GemvAsync reports: the first call that failed, with the CUDA error or the cuBLAS
// status it returned (the other stays at success), and the call's name; ok() when none did.
struct GemvStatus {
  cudaError_t cuda = cudaSuccess;
  cublasStatus_t cublas = CUBLAS_STATUS_SUCCESS;
  const char* call = "";
  bool ok() const { return cuda == cudaSuccess && cublas == CUBLAS_STATUS_SUCCESS; }
};

// y = alpha * op(A) x + beta * y for float32 or float64 (else cudaErrorInvalidValue), A
// stored as `shape` says (kernels/ops.h); y has shape.transpose ? cols : rows elements.
// An empty sum gives y = beta * y, and y is not read when beta is 0. `cublas` is the
// caller's handle in host pointer mode, used by one thread at a time (the caller's lock);
// its stream becomes `stream`. Deterministic run to run: no atomics.
GemvStatus GemvAsync(cublasHandle_t cublas, DType dtype, const GemvShape& shape, double alpha,
                     const void* a, const void* x, double beta, void* y, cudaStream_t stream);

// out[0, n) as RandomParams and kernels/philox.h define: integers and uniforms
// bit-identical to the CPU backend.
cudaError_t RandomAsync(const RandomParams& params, DType dtype, void* out, int64_t n,
                        cudaStream_t stream);

// Launches a kernel that stores through a null pointer, leaving the context with a sticky
// error (cudaErrorIllegalAddress). For tests of the backend's failure handling only.
cudaError_t IllegalAddressForTestingAsync(cudaStream_t stream);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_KERNELS_CUDA_KERNELS_H_
