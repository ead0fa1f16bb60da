// The CPU backend's elementwise evaluator: runs a compiled expr::Program over host arrays.
// It is the reference every other backend's elementwise results are checked against.
#ifndef GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_
#define GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_

#include <cstdint>
#include <span>

#include "kernels/dtype.h"
#include "server/arrays/strided_layout.h"
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
// result does not depend on the thread count or on how the range is split. The range is
// one axis: index(k) must name it (k is 0 or -1) and reads i.
void EvaluateElementwise(const expr::Program& program, std::span<const void* const> inputs,
                         void* out, DType out_dtype, int64_t n, ThreadPool& pool);

// An array operand of EvaluateElementwiseStrided: element i lies at `data` plus
// layout offset(i) elements. Null data stands for a scalar input.
struct StridedArray {
  const void* data = nullptr;
  StridedLayout layout;
};

// As EvaluateElementwise over strided arrays: out at out_layout(i) = program(inputs at
// their layout(i)) for every index i of out_layout's shape, which every input layout has
// too (broadcast axes with stride 0). Works along the last axis (the caller coalesces the
// layouts so that it is as long as can be): each input's row is read in place when its
// stride is 1 and gathered into a block otherwise (a transposed input, contiguous along
// the axis before, a tile of rows at a time), and the result is scattered when the
// output's stride is not 1. `out` may share memory with an input only where their layouts
// are the same (x += 1 through a view); out_layout must not broadcast.
//
// Per element it computes exactly what EvaluateElementwise does, and the split over the
// pool depends on the shape alone, so results do not depend on the thread count.
// index(k) reads the coordinate along axis k of out_layout, which the caller must not
// have coalesced away (-ndim <= k < ndim).
void EvaluateElementwiseStrided(const expr::Program& program,
                                std::span<const StridedArray> inputs, void* out,
                                const StridedLayout& out_layout, DType out_dtype,
                                ThreadPool& pool);

}  // namespace gpucompute::cpu

#endif  // GPUCOMPUTE_SERVER_CPU_ELEMENTWISE_H_
