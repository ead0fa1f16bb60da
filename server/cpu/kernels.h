// The CPU backend's compute kernels: reductions, gemv and random fills. Each runs on
// host memory, parallelised with a ThreadPool, and gives the reference results that
// every other backend is checked against.
#ifndef GPUCOMPUTE_SERVER_CPU_KERNELS_H_
#define GPUCOMPUTE_SERVER_CPU_KERNELS_H_

#include <cstdint>
#include <span>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "server/arrays/strided_layout.h"
#include "server/cpu/thread_pool.h"
#include "server/expression/expression.h"

namespace gpucompute::cpu {

// out[o * inner + i] = reduce_{r < extent} in[(o * extent + r) * inner + i], for
// o < shape.outer and i < shape.inner. `in` has dtype `in_dtype`, `out` has
// ReduceResultDType(kind, in_dtype). extent must be >= 1 (the caller rejects empty
// reductions of min, max, argmin and argmax). Argmin and argmax write the position r
// (int64) of the first extreme; NaN counts as the extreme, as in NumPy. `kind` is one of
// kShapeReduceKinds (kernels/ops.h); the others go through ReduceStrided only.
// Deterministic: the summation order depends only on the shape, never on the thread
// count. Float sums, means and norms accumulate in float64 over fixed blocks.
void Reduce(ReduceKind kind, DType in_dtype, const void* in, const ReduceShape& shape, void* out,
            ThreadPool& pool);

// An array a strided reduction reads: host memory and where its elements lie in it.
// Null data stands for a scalar input of the program.
struct StridedOperand {
  const void* data = nullptr;
  StridedLayout layout;
};

// Backend::ReduceStrided (server/core/backend.h) on host memory: out[k] for each index k
// of the kept axes of `shape` (those not in `axes`, in C order) reduces the values over
// the axes in `axes` (sorted, distinct). The values are program(inputs) of dtype
// `dtype`, or without a program inputs[0]'s elements (of dtype `dtype`); each input's
// layout has `shape`. Out has ReduceResultDType(kind, dtype); any kind.
// Deterministic: each output combines its values in an order fixed by the shape and the
// axes alone, never by the thread count or the inputs' strides (see reduce_strided.cc).
void ReduceStrided(ReduceKind kind, DType dtype, const expr::Program* program,
                   std::span<const StridedOperand> inputs, std::span<const int64_t> shape,
                   std::span<const int32_t> axes, double ddof, void* out, ThreadPool& pool);

// y = alpha * op(A) * x + beta * y, BLAS semantics: A is rows x cols, stored row-major
// (layout C) or column-major (layout F); op(A) is A or its transpose. All of A, x and y
// have dtype `dtype` (float32 or float64). When beta == 0, y is not read (NaN in y does
// not propagate). Deterministic: every y element is summed in a fixed order.
void Gemv(DType dtype, const GemvShape& shape, double alpha, const void* a, const void* x,
          double beta, void* y, ThreadPool& pool);

// Fills out[0, n) as RandomParams and kernels/philox.h define. Bit-identical across
// runs and thread counts.
void Random(const RandomParams& params, DType dtype, void* out, int64_t n, ThreadPool& pool);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_KERNELS_H_
