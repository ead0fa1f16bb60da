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
#include <string>
#include <string_view>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"

namespace gpucompute::cuda {

// Sets `count` elements of `dtype` at `dst` to the value whose native representation is
// the low DTypeSize(dtype) bytes of `value_bits`.
cudaError_t FillAsync(void* dst, DType dtype, uint64_t value_bits, int64_t count,
                      cudaStream_t stream);

// dst[i] = i for i < count (the coordinates that index(k) reads).
cudaError_t IotaAsync(int64_t* dst, int64_t count, cudaStream_t stream);

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

// ---- Reductions over any axes of strided arrays (kernels/cuda/reduce_strided.cu) ----
//
// A reduction of the values at every index of `shape` (up to kStridedReduceMaxDims axes)
// over the axes `axes` (sorted, without repeats; all of them for a whole-array
// reduction), one output per index of the other (kept) axes, in C order, of dtype
// ReduceResultDType(kind, value dtype). The values are one strided array's elements, or
// an expression of several (kernels/cuda/reduce_expression.cu). argmin/argmax report the
// C-order position among the reduced axes: along one axis, the index on it; over all of
// them, the flat C-order index.
//
// Order: the plan (PlanStridedReduce) is a function of the shape, the axes and the
// strides' pattern (which axes coalesce, which innermost stride is smaller) alone, never
// of the device, so results are bitwise the same run to run and on every GPU. See
// kernels/cuda/detail/reduce_strided_kernels.cuh for the order each path combines in.

inline constexpr int kStridedReduceMaxDims = 8;

// An array read by a strided reduction: element offsets from `data`, in elements.
struct StridedOperand {
  const void* data = nullptr;
  std::vector<int64_t> strides;  // one per axis of the shape; 0 on broadcast axes
  int64_t offset = 0;
};

enum class StridedReducePath : uint8_t {
  kDense,    // one array laid out as ReduceAsync's [outer, extent, inner]: its kernels
  kRows,     // a warp per output (chunk), lanes along the reduced axes
  kColumns,  // a thread per output (chunk), threads along the kept axes
};

// The iteration space after the kept axes (outermost) and the reduced axes (in C order)
// were each coalesced, and how it is cut into work. For kColumns, the kept axis with the
// smallest strides is moved innermost, so that neighbouring threads read neighbouring
// elements; kept_out_strides keeps the outputs in C order.
struct StridedReducePlan {
  StridedReducePath path = StridedReducePath::kRows;
  ReduceShape dense;  // kDense: ReduceAsync's shape, from operand 0's data + offset
  std::vector<int64_t> kept_shape;
  std::vector<int64_t> kept_out_strides;  // parallel to kept_shape
  std::vector<int64_t> reduced_shape;  // never empty: [1] when nothing is reduced
  // Per operand, parallel to kept_shape / reduced_shape.
  std::vector<std::vector<int64_t>> kept_strides;
  std::vector<std::vector<int64_t>> reduced_strides;
  std::vector<int64_t> offsets;
  int64_t outputs = 1;  // product of kept_shape
  int64_t extent = 1;   // product of reduced_shape
  int64_t chunk_len = 1;
  int64_t chunks = 1;
  double ddof = 0;  // var, std: the caller's
};

// Plans the reduction of `operands` (all indexed over `shape`) over `axes`. kDense only
// when `allow_dense` and there is one operand. cudaErrorInvalidValue for more than
// kStridedReduceMaxDims axes, axes out of range or unsorted, or mismatched strides.
cudaError_t PlanStridedReduce(const std::vector<int64_t>& shape, const std::vector<int32_t>& axes,
                              const std::vector<const StridedOperand*>& operands, bool allow_dense,
                              StridedReducePlan* plan);

// Enqueues a planned reduction (path kRows or kColumns) whose values have `value_dtype`:
// `launch(partial, grid)` enqueues the path's kernel on `grid` blocks of 256 threads (it
// writes the outputs when plan.chunks is 1, else plan.outputs * plan.chunks accumulators
// to `partial`, which this then merges into `out`). Handles empty reductions itself
// (min/max/argmin/argmax of nothing: cudaErrorInvalidValue). The shared dispatch of
// ReduceStridedAsync and the generated reductions of expressions.
using StridedReduceLaunch = cudaError_t (*)(const void* context, void* partial, unsigned grid);
cudaError_t RunStridedReduce(ReduceKind kind, DType value_dtype, const StridedReducePlan& plan,
                             StridedReduceLaunch launch, const void* context, void* out,
                             cudaMemPool_t pool, cudaStream_t stream);

// The reduction of `in` (of dtype `dtype`) over `axes` of `shape` into `out`.
cudaError_t ReduceStridedAsync(ReduceKind kind, DType dtype, const std::vector<int64_t>& shape,
                               const std::vector<int32_t>& axes, const StridedOperand& in,
                               double ddof, void* out, cudaMemPool_t pool, cudaStream_t stream);

// The bytes of the kernel argument StridedReduceGeometry<arrays> (kernels/cuda/detail/
// reduce_strided_kernels.cuh) of a kRows or kColumns plan, for launching generated
// kernels; `arrays` >= the plan's operands (the rest read nothing).
std::vector<uint64_t> StridedReduceGeometryBytes(const StridedReducePlan& plan, int arrays);

// ---- Reductions of expressions (kernels/cuda/reduce_expression.cc) ----
//
// A reduction whose values are an elementwise expression of strided arrays, fused: one
// kernel per (expression, kind), generated from kernels/cuda/elementwise/reduce.cuh.in
// around the expression's per-element function (as ElementwiseKernelSource does) and
// compiled with NVRTC by the server. It runs the kRows / kColumns bodies of the strided
// reductions, so it chunks and combines as ReduceStridedAsync's general paths do.

// extern "C" names of the two kernels of every generated reduction.
inline constexpr char kReduceRowsKernel[] = "gpucompute_reduce_rows";
inline constexpr char kReduceColumnsKernel[] = "gpucompute_reduce_columns";
// Arrays an expression of a fused reduction may read (each adds its strides to the
// kernel's arguments).
inline constexpr int kReduceExpressionMaxArrays = 16;

struct ReduceExpressionSignature {
  ReduceKind kind = ReduceKind::kSum;
  DType value_dtype = DType::kFloat64;  // the expression's result, the reduction's input
  std::vector<int32_t> array_inputs;    // indices into the expression's inputs, ascending
  std::vector<DType> array_dtypes;      // parallel to array_inputs
  std::vector<DType> parameter_dtypes;  // indexed by parameter number
  // The kernels' array slots: at least one, so that an expression of scalars alone
  // still has an iteration space.
  int array_slots() const {
    return array_inputs.empty() ? 1 : static_cast<int>(array_inputs.size());
  }
};

// The CUDA C++ source, for NVRTC, of the kernels kReduceRowsKernel and
// kReduceColumnsKernel: `header` (a comment), the helpers, the per-element function with
// `element_body` (as for ElementwiseKernelSource, returning the value of
// signature.value_dtype), then the kernels.
std::string ReduceExpressionKernelSource(const ReduceExpressionSignature& signature,
                                         std::string_view header, std::string_view element_body);

struct ReduceExpressionKernels {
  cudaKernel_t rows = nullptr;
  cudaKernel_t columns = nullptr;
};

// Enqueues the reduction planned by PlanStridedReduce (allow_dense false) over the
// operands of `arrays` (device pointers in signature order; offsets and strides are the
// plan's), `parameters` holding each parameter's value in the low bytes of a uint64.
cudaError_t ReduceExpressionAsync(const ReduceExpressionSignature& signature,
                                  const ReduceExpressionKernels& kernels,
                                  const StridedReducePlan& plan, const void* const* arrays,
                                  const uint64_t* parameters, void* out, cudaMemPool_t pool,
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

// out[0, n) as RandomParams and kernels/philox.h define: integers, uniforms and normals
// v2 and v3 bit-identical to the CPU backend.
cudaError_t RandomAsync(const RandomParams& params, DType dtype, void* out, int64_t n,
                        cudaStream_t stream);

// The values a fill with `params` writes for Philox blocks whose words the caller
// chooses: block b's four words are words[4b, 4b + 4), and its k values (kernels/philox.h)
// go to out[k b, k b + k), k = ElementsPerCounter(params.distribution, dtype). A fill's
// words come from counters, so only this reaches every input of a transform (every
// float32 radius and angle of normal v2): for tests that hold the device's transforms to
// the CPU's bit for bit. Uniform and normal float32/float64 only, else
// cudaErrorInvalidValue.
cudaError_t RandomLanesForTestingAsync(const RandomParams& params, DType dtype,
                                       const uint32_t* words, int64_t blocks, void* out,
                                       cudaStream_t stream);

// ---- Elementwise expressions (kernels/cuda/elementwise.cu, kernels/cuda/elementwise/) ----
//
// One fused kernel per expression, generated and compiled with NVRTC at run time, in the
// same three layers as above:
//  - kernel: the device source in kernels/cuda/elementwise/ (prelude.cuh, the helpers;
//    contiguous.cuh.in, the kernel template), which ElementwiseKernelSource fills with the
//    per-element body that the server generates from the expression (server/cuda/
//    elementwise_codegen.cc);
//  - dispatch: PlanElementwiseKernel fixes what the source bakes in (pack width and packs
//    per thread); ElementwiseAsync picks the kernel and the grid of each launch;
//  - entry: ElementwiseAsync launches a compiled kernel pair on a stream.
// A kernel template decides how elements are reached (indexing, loads, the loop); the
// per-element function and the helpers are shared, so another way of reaching elements
// (strides, broadcasting) or of combining them (a reduction of the expression) is another
// template beside contiguous.cuh.in over the same Element(), with its own dispatch.

// Threads per block of every elementwise kernel.
inline constexpr int kElementwiseThreadsPerBlock = 256;
// Packs of 16 bytes (of the narrowest array) per thread per grid-stride iteration, at most;
// one for expressions that call math-library functions (sin, exp, pow, ...).
inline constexpr int kElementwisePacksPerThread = 2;
// Fewer packs per iteration when one pack already loads this many bytes or more.
inline constexpr int kElementwiseMaxLoadBytesPerIteration = 128;

// extern "C" names of the two kernels of every generated source.
inline constexpr char kElementwiseVectorKernel[] = "gpucompute_elementwise_vector";
inline constexpr char kElementwiseScalarKernel[] = "gpucompute_elementwise_scalar";

// What a launch must pass, in kernel-argument order:
//   for each k in array_inputs: a const pointer to input k's elements (array_dtypes[k]),
//   the output pointer (out_dtype), n as int64, then
//   for each parameter p in 0..parameter_dtypes.size(): its value, passed as the DType's
//   storage type (bool as one byte 0/1, int32, int64, float, double).
struct ElementwiseSignature {
  std::vector<int32_t> array_inputs;  // indices into the expression's inputs, ascending
  std::vector<DType> array_dtypes;    // parallel to array_inputs
  // Parallel to array_inputs, or empty for none: the inputs that are one element (a 0-d
  // array) rather than n, passed as a pointer to it and read once per thread, as cheaply
  // as a parameter. The kernels' source depends on it (another cache entry).
  std::vector<bool> array_constant;
  DType out_dtype = DType::kFloat64;
  std::vector<DType> parameter_dtypes;  // indexed by parameter number
  // The vectorised kernel's shape.
  int elements_per_pack = 1;  // 16 / (smallest element size among the arrays)
  int packs_per_thread = 1;
  int threads_per_block = kElementwiseThreadsPerBlock;
  // Bytes of kernel arguments a launch passes (pointers, n and parameters, aligned).
  int64_t argument_bytes = 0;
};

// The C++ type of a value of `dtype` inside a generated kernel: bool, gc::i32, gc::i64,
// float or double (the integer names are the prelude's).
const char* ElementwiseValueType(DType dtype);

// Sets signature's elements_per_pack, packs_per_thread, threads_per_block and
// argument_bytes from its dtypes. `calls_math_library`: the expression calls a CUDA
// math-library routine of tens of instructions or more (sin, exp, pow, ...), which makes
// it compute-bound rather than memory-bound.
void PlanElementwiseKernel(bool calls_math_library, ElementwiseSignature* signature);

// The CUDA C++ source, for NVRTC, of the kernel pair kElementwiseVectorKernel and
// kElementwiseScalarKernel of `signature` (planned by PlanElementwiseKernel): `header` (a
// comment, copied first), the helpers, the per-element function, then the kernels. It
// includes no headers.
// `element_body` is the body of the per-element function, without a final newline:
//   ElementwiseValueType(out_dtype) Element(
//       ElementwiseValueType(array_dtypes[a]) x<array_inputs[a]>, ...,
//       ElementwiseValueType(parameter_dtypes[p]) p<p>, ...)
// (arguments named x0, x3, p0, p1, ...), returning the element's value. It may use the
// helpers of kernels/cuda/elementwise/prelude.cuh and NVRTC's math functions. Arrays and
// parameters of dtype bool arrive as bool; the kernels store a bool result as one byte.
std::string ElementwiseKernelSource(const ElementwiseSignature& signature, std::string_view header,
                                    std::string_view element_body);

// A loaded kernel pair of one source (cudaLibraryGetKernel of its two names) and the
// blocks of each resident on one SM, which size the grid.
struct ElementwiseKernelPair {
  cudaKernel_t vector_kernel = nullptr;  // every array 16-byte aligned
  cudaKernel_t scalar_kernel = nullptr;  // any alignment
  int vector_blocks_per_sm = 8;
  int scalar_blocks_per_sm = 8;
};

// How many blocks of `threads` threads of `kernel` fit on one SM at once (registers and
// shared memory decide), for ElementwiseKernelPair; 8 when the runtime cannot tell, whose
// error it then clears.
int ElementwiseBlocksPerSm(cudaKernel_t kernel, int threads);

// out[i] = Element(arrays...[i], parameters...) for i < n: `arrays` holds the
// signature.array_inputs.size() device pointers in signature order, `parameters` the
// signature.parameter_dtypes.size() values, each in the low bytes of a uint64 as its
// storage type (a constant array, signature.array_constant, points to its one element).
// Runs the vectorised kernel when every pointer of n elements is 16-byte aligned, else the
// scalar one, on a grid of a few waves of resident blocks for `sm_count` SMs (the current
// device's). `out` may equal an input of the same element size (in place); other overlaps
// are the caller's to avoid. cudaErrorInvalidValue for n < 0 or sm_count <= 0.
cudaError_t ElementwiseAsync(const ElementwiseSignature& signature,
                             const ElementwiseKernelPair& kernels, const void* const* arrays,
                             void* out, int64_t n, const uint64_t* parameters, int sm_count,
                             cudaStream_t stream);

// ---- Strided elementwise expressions (kernels/cuda/elementwise/strided.cuh.in) ----
//
// The same per-element function over arrays reached through strides (views, broadcast
// operands), in the same three layers: the kernel template strided.cuh.in, filled by
// ElementwiseStridedKernelSource; the dispatch in ElementwiseStridedAsync (the grid, the
// divisors); the entry point ElementwiseStridedAsync. A kernel is specialised on what a
// launch's layouts have in common with others (StridedSpecialization), never on sizes.
// The common 2-D broadcasts (x - m with m a column, a row or 0-d) whose rows are aligned
// whole packs take rows.cuh.in instead, from the same generator and entry point: the
// contiguous kernel's loop per row, without the general kernel's per-pack checks.

// Axes of a strided iteration space, at most.
inline constexpr int kElementwiseMaxDims = 8;
// extern "C" name of the kernel of every generated strided source.
inline constexpr char kElementwiseStridedKernel[] = "gpucompute_elementwise_strided";
// extern "C" name of the kernel of every generated rows source (StridedSpecialization::rows).
inline constexpr char kElementwiseRowsKernel[] = "gpucompute_elementwise_rows";

// How an array steps along the innermost axis (the row).
enum class RowStep : uint8_t {
  kUnit,       // stride 1: vector loads where the row start is 16-byte aligned
  kBroadcast,  // stride 0: one value per row
  kGather,     // any other stride
  kConstant,   // stride 0 on every axis (a 0-d array): one value per thread
  // Unit stride along the next axis out (a transposed view): read through 32 x 32 tiles
  // in shared memory, so that reads and writes both coalesce. Inputs only.
  kTransposed,
};
// Inputs read through tiles, at most, so that the tiles fit the static shared memory
// (32 x 33 elements each); further transposed inputs gather.
inline constexpr int kMaxTiledInputs = 4;

// What a strided kernel is compiled for, besides the expression and the dtypes: the
// number of axes and each array's row step.
struct StridedSpecialization {
  int dims = 1;                    // 1 to kElementwiseMaxDims
  std::vector<RowStep> in_steps;   // parallel to ElementwiseSignature::array_inputs
  RowStep out_step = RowStep::kUnit;  // kUnit or kGather
  // The rows kernel (kernels/cuda/elementwise/rows.cuh.in) instead of the strided one:
  // two axes, inputs kUnit, kBroadcast or kConstant, the output kUnit, every kUnit row
  // start 16-byte aligned and the row a whole number of packs (RowsLayoutsFit). Its
  // threads walk a row's packs with vector loads and stores and no per-pack checks.
  bool rows = false;
  // A short text naming the specialisation, for cache keys and generated comments.
  std::string Name() const;
};

// The row step of an array from its strides over `dims` axes (`is_output`: the output,
// which is never broadcast or tiled: only kUnit or kGather).
RowStep ClassifyRowStep(const int64_t* strides, int dims, bool is_output);

// Bytes of kernel arguments a strided launch passes: the pointers, the layouts (Args in
// strided.cuh.in or rows.cuh.in) and the parameters.
int64_t StridedArgumentBytes(const ElementwiseSignature& signature,
                             const StridedSpecialization& specialization);

// The CUDA C++ source, for NVRTC, of kElementwiseStridedKernel for `signature` (planned by
// PlanElementwiseKernel; its elements_per_pack is the strided kernel's pack) and
// `specialization`, with `header` and `element_body` as for ElementwiseKernelSource. Its
// kernel arguments: the array pointers and the output pointer as for the contiguous
// kernels, then the layouts (by value), then the parameters.
std::string ElementwiseStridedKernelSource(const ElementwiseSignature& signature,
                                           const StridedSpecialization& specialization,
                                           std::string_view header,
                                           std::string_view element_body);

// Division by an invariant divisor: n / d == (umulhi(magic, n) + n) >> shift for every
// 0 <= n < 2^63 (Granlund and Montgomery, 1994), as the strided kernel divides a row
// number by an extent. Host code, so that the arithmetic is tested without a GPU.
struct FastDivisor {
  uint64_t magic = 1;
  int shift = 0;
};
FastDivisor MakeFastDivisor(int64_t d);  // d >= 1
inline int64_t FastDivide(int64_t n, const FastDivisor& divisor) {
  __extension__ typedef unsigned __int128 Uint128;
  const auto u = static_cast<uint64_t>(n);
  const auto high = static_cast<uint64_t>((Uint128{divisor.magic} * u) >> 64);
  return static_cast<int64_t>((high + u) >> divisor.shift);
}

// One array of a strided launch: element idx lies at data + (offset + sum_d idx[d] *
// strides[d]) elements.
struct StridedArray {
  const void* data = nullptr;
  int64_t offset = 0;
  int64_t strides[kElementwiseMaxDims] = {};
};

// Whether layouts of two axes with the row steps of `specialization` (whose `rows` is
// ignored) can take the rows kernel: the conditions StridedSpecialization::rows lists.
// `array_dtypes` and `arrays` are parallel to its in_steps, `shape` has two extents.
bool RowsLayoutsFit(const StridedSpecialization& specialization, const int64_t* shape,
                    const std::vector<DType>& array_dtypes, const StridedArray* arrays,
                    DType out_dtype, const StridedArray& out);

// out[idx] = Element(arrays...[idx], parameters...) for every index idx of `shape`
// (specialization.dims extents, whose product fits int64; an empty shape writes nothing), with
// `arrays` and `parameters` as for ElementwiseAsync and every layout matching the
// specialisation the kernel was compiled for. `kernel` is the loaded
// kElementwiseStridedKernel and `blocks_per_sm` its residency (ElementwiseBlocksPerSm).
// `out` may be an input with the same layout (in place); other overlaps are the caller's
// to avoid. cudaErrorInvalidValue for a bad dims, shape or sm_count.
cudaError_t ElementwiseStridedAsync(const ElementwiseSignature& signature,
                                    const StridedSpecialization& specialization,
                                    cudaKernel_t kernel, int blocks_per_sm, const int64_t* shape,
                                    const StridedArray* arrays, const StridedArray& out,
                                    const uint64_t* parameters, int sm_count,
                                    cudaStream_t stream);

// Launches a kernel that stores through a null pointer, leaving the context with a sticky
// error (cudaErrorIllegalAddress). For tests of the backend's failure handling only.
cudaError_t IllegalAddressForTestingAsync(cudaStream_t stream);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_KERNELS_CUDA_KERNELS_H_
