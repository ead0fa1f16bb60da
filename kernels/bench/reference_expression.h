// The benchmark's reference expression as a hand-written, nvcc-compiled CUDA kernel:
// the yardstick against which the runtime-compiled (NVRTC) elementwise kernel is timed.
#ifndef GPUCOMPUTE_KERNELS_BENCH_REFERENCE_EXPRESSION_H_
#define GPUCOMPUTE_KERNELS_BENCH_REFERENCE_EXPRESSION_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/dtype.h"

namespace gpucompute::cuda {

// out[i] = sqrt(abs(exp(-sin(x[i] * x[i])) / (sqrt(abs(x[i])) * tanh(x[i])))) for
// 0 <= i < n, in the precision of `dtype` (float32: sinf, expf, ...; float64: sin, exp,
// ...; IEEE division and square root, no fast-math). x and out may be the same buffer.
// Enqueues on `stream` and returns the launch status; cudaErrorInvalidValue for other
// dtypes.
cudaError_t ReferenceExpressionAsync(DType dtype, const void* x, void* out, int64_t n,
                                     cudaStream_t stream);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_KERNELS_BENCH_REFERENCE_EXPRESSION_H_
