// Generates the CUDA C++ source of one fused kernel for an elementwise expr::Program, for
// NVRTC. Plain C++: nothing here needs the CUDA runtime or a GPU, so the generator and its
// compilation are tested on machines without one.
//
// The generated source holds two kernels with the same arguments and the same per-element
// code (so they produce identical results):
//  - a vectorised one, for when every array pointer (inputs and output) is 16-byte
//    aligned: each thread handles packs of `elements_per_pack` consecutive elements, every
//    array of a pack moved with 16-byte loads and stores, `packs_per_thread` packs per
//    grid-stride iteration, all of an iteration's loads issued before its math; it also
//    handles the last n % elements_per_pack elements;
//  - a scalar one, for any alignment: one element per thread per grid-stride iteration.
// Each input element is read once and each output element written once, whatever the
// expression; common subexpressions (shared IR nodes) are computed once per element.
// Every element is computed by the same operations whatever the grid, the alignment or
// the kernel that runs it, so results are deterministic.
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

#include "kernels/dtype.h"
#include "server/expression/expression.h"

namespace gpucompute::cuda {

// Tuning constants of the generated kernels (see elementwise_codegen.cc for why).
inline constexpr int kElementwiseThreadsPerBlock = 256;
// Packs of 16 bytes (of the narrowest array) per thread per grid-stride iteration, at most;
// one for expressions that call math-library functions (sin, exp, pow, ...).
inline constexpr int kElementwisePacksPerThread = 2;
// Fewer packs per iteration when one pack already loads this many bytes or more.
inline constexpr int kElementwiseMaxLoadBytesPerIteration = 128;

// What a launch must pass, in kernel-argument order:
//   for each k in array_inputs: a const pointer to input k's elements (array_dtypes[k]),
//   the output pointer (out_dtype), n as int64, then
//   for each parameter p in 0..parameter_dtypes.size(): its value, passed as the DType's
//   storage type (bool as one byte 0/1, int32, int64, float, double).
struct ElementwiseSignature {
  std::vector<int32_t> array_inputs;  // indices into Program::inputs(), ascending
  std::vector<DType> array_dtypes;    // parallel to array_inputs
  DType out_dtype = DType::kFloat64;
  std::vector<DType> parameter_dtypes;  // indexed by Node::parameter
  // The vectorised kernel's shape.
  int elements_per_pack = 1;  // 16 / (smallest element size among the arrays)
  int packs_per_thread = 1;
  int threads_per_block = kElementwiseThreadsPerBlock;
  // Bytes of kernel arguments a launch passes (pointers, n and parameters, aligned).
  int64_t argument_bytes = 0;
};

struct ElementwiseSource {
  std::string source;         // CUDA C++ for NVRTC; includes no headers
  std::string vector_kernel;  // extern "C" name of the 16-byte-aligned kernel
  std::string scalar_kernel;  // extern "C" name of the any-alignment kernel
  ElementwiseSignature signature;
};

// The source is a function of program.canonical() and out_dtype alone (never of parameter
// values or of the IR's node numbering), so it may be cached under those. `out_dtype` may differ
// from program.result_dtype(); the caller has checked that casting is allowed.
ElementwiseSource GenerateElementwise(const expr::Program& program, DType out_dtype);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_ELEMENTWISE_CODEGEN_H_
