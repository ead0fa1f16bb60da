// Matmul on the CPU backend: the system's BLAS (OpenBLAS), one call per tile of C.
#ifndef GPUCOMPUTE_SERVER_CPU_MATMUL_H_
#define GPUCOMPUTE_SERVER_CPU_MATMUL_H_

#include "absl/status/status.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {

// Opens the system's OpenBLAS (once; later calls return the first one's result), set to
// one thread per call. FAILED_PRECONDITION when it is not installed.
absl::Status LoadOpenBlas();

// C[b] = alpha * A[b] @ B[b] + beta * C[b] as Backend::Matmul defines it, for float32 or
// float64 `dtype`; a, b and c are the operands' memory (the layouts' offsets count from
// them). Runs on `pool`: C is cut into tiles whose size depends on the shape alone, and
// each tile is one single-threaded BLAS call over the whole of k, so every element is
// computed by the same call, in the same order, whatever the thread count: bitwise the
// same run to run and across thread counts on one machine (OpenBLAS picks its kernels
// by the processor, so another processor may round differently). LoadOpenBlas must have
// succeeded.
void Matmul(DType dtype, const MatmulShape& shape, double alpha, const void* a, const void* b,
            double beta, void* c, ThreadPool& pool);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_MATMUL_H_
