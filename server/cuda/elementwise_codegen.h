// Generates the CUDA C++ source of one fused kernel pair for an elementwise expr::Program,
// for NVRTC. Plain C++: nothing here needs a GPU, so the generator and its compilation are
// tested on machines without one.
//
// This file translates the expression's IR into the per-element function; the kernels
// around it (indexing, 16-byte packs, the grid-stride loops), their helpers and their
// shape are the kernel library's (ElementwiseKernelSource and PlanElementwiseKernel in
// kernels/cuda/kernels.h). Common subexpressions (shared IR nodes) are computed once per
// element.
//
// Per-element semantics are those of server/expression/scalar_ops.h for every op and
// dtype, including the final conversion to `out_dtype` (ops::Convert). Float functions
// run in the operand's precision (sinf for float32, sin for float64). Float + - * / and
// sqrt are emitted as the explicitly rounded intrinsics (__fadd_rn, __dmul_rn, __fsqrt_rn,
// ...), which the compiler never contracts into fused multiply-adds: a*x + y rounds twice,
// as on the CPU, even though the source is compiled with NVRTC's default --fmad=true (so
// that the math library's own code gets its FMAs, as it does under nvcc). It must be
// compiled without fast-math flags (NvrtcCompiler::Options).
#ifndef GPUCOMPUTE_SERVER_CUDA_ELEMENTWISE_CODEGEN_H_
#define GPUCOMPUTE_SERVER_CUDA_ELEMENTWISE_CODEGEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"
#include "server/expression/expression.h"

namespace gpucompute::cuda {

// ElementwiseSignature, kElementwiseThreadsPerBlock, kElementwisePacksPerThread and
// kElementwiseMaxLoadBytesPerIteration: kernels/cuda/kernels.h.

struct ElementwiseSource {
  std::string source;         // CUDA C++ for NVRTC; includes no headers
  std::string vector_kernel;  // kElementwiseVectorKernel: for 16-byte-aligned arrays
  std::string scalar_kernel;  // kElementwiseScalarKernel: for any alignment
  ElementwiseSignature signature;
};

struct StridedElementwiseSource {
  std::string source;  // CUDA C++ for NVRTC; includes no headers
  std::string kernel;  // kElementwiseStridedKernel, or kElementwiseRowsKernel
  ElementwiseSignature signature;
  StridedSpecialization specialization;
};

// The per-element function of `program` converted to `out_dtype`, for any kernel built
// around it (ElementwiseKernelSource, ElementwiseStridedKernelSource,
// ReduceExpressionKernelSource in kernels/cuda/kernels.h): which inputs are arrays, the
// parameters, and the function's body. `kernel` names the kernel template in the header
// comment (empty for the contiguous one).
struct ElementFunction {
  std::vector<int32_t> array_inputs;  // indices into program.inputs(), ascending
  std::vector<DType> array_dtypes;    // parallel to array_inputs
  std::vector<DType> parameter_dtypes;
  bool calls_math_library = false;
  std::string header;  // a comment naming the expression
  std::string body;
};
ElementFunction GenerateElementFunction(const expr::Program& program, DType out_dtype,
                                        absl::string_view kernel = "");

// The source is a function of program.canonical(), out_dtype and `constant_arrays` alone
// (never of parameter values or of the IR's node numbering), so it may be cached under
// those. `out_dtype` may differ from program.result_dtype(); the caller has checked that
// casting is allowed. `constant_arrays`: ElementwiseSignature::array_constant, parallel to
// the program's array inputs, or empty for none.
ElementwiseSource GenerateElementwise(const expr::Program& program, DType out_dtype,
                                      const std::vector<bool>& constant_arrays = {});

// The strided kernel of the same per-element function (kernels/cuda/elementwise/
// strided.cuh.in, or rows.cuh.in where specialization.rows), specialised as `specialization` says
// (its in_steps parallel to the signature's array inputs, which are the program's array inputs in
// order). A function of program.canonical(), out_dtype and the specialisation alone.
StridedElementwiseSource GenerateElementwiseStrided(const expr::Program& program,
                                                    DType out_dtype,
                                                    const StridedSpecialization& specialization);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_ELEMENTWISE_CODEGEN_H_
