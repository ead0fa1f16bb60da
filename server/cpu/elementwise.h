// The CPU backend's elementwise evaluator: runs a compiled expr::Program over host arrays.
// It is the reference every other backend's elementwise results are checked against.
#ifndef GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_
#define GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_

#include <cstdint>
#include <span>

#include "kernels/dtype.h"
#include "server/cpu/thread_pool.h"
#include "server/expression/expression.h"

namespace gpucompute::cpu {

// Evaluates `program` for elements [0, n), in parallel on `pool`.
//
// inputs[k] points at n elements of program.inputs()[k]'s dtype when that input is an
// array, and is ignored (may be null) when it is a scalar; inputs.size() must equal
// program.inputs().size(). The result is converted to `out_dtype` with C++ static_cast
// semantics (to bool: != 0) and written to the n elements at `out`. `out` may be one of
// the inputs (x = x + 1); any other overlap with an input is also handled, through a
// temporary copy.
//
// Every element is computed on its own, by the same operations in the same order, so the
// result does not depend on the thread count or on how the range is split.
void EvaluateElementwise(const expr::Program& program, std::span<const void* const> inputs,
                         void* out, DType out_dtype, int64_t n, ThreadPool& pool);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_
