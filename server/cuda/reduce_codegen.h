// The fused reductions of expressions on the CUDA backend: the NVRTC source of the
// reduction kernels of one (expression, reduce kind) (ReduceExpressionKernelSource in
// kernels/cuda/kernels.h around elementwise_codegen's per-element function), compiled by
// NVRTC with its disk cache, loaded once and kept in memory for the life of the
// ReduceKernels, and launched through ReduceExpressionAsync. Host code.
#ifndef GPUCOMPUTE_SERVER_CUDA_REDUCE_CODEGEN_H_
#define GPUCOMPUTE_SERVER_CUDA_REDUCE_CODEGEN_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <tuple>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/kernels.h"
#include "kernels/ops.h"
#include "server/core/backend.h"
#include "server/cuda/nvrtc_compiler.h"
#include "server/expression/expression.h"

namespace gpucompute::cuda {

struct ReductionSource {
  std::string source;  // CUDA C++ for NVRTC; includes no headers
  ReduceExpressionSignature signature;
};

// The source is a function of program.canonical() and `kind` alone (scalar values are
// kernel arguments), so it may be cached under those. INVALID_ARGUMENT when the
// expression reads more than kReduceExpressionMaxArrays arrays.
absl::StatusOr<ReductionSource> GenerateReduction(const expr::Program& program, ReduceKind kind);

// One loaded pair of reduction kernels. Owned by the ReduceKernels that returned it.
struct CompiledReduction {
  ReduceExpressionSignature signature;
  cudaLibrary_t library = nullptr;
  ReduceExpressionKernels kernels;
};

class ReduceKernels {
 public:
  // `disk_cache_dir`: where CUBINs persist across restarts; empty for none.
  explicit ReduceKernels(std::string disk_cache_dir) : compiler_(std::move(disk_cache_dir)) {}
  ~ReduceKernels();  // unloads every library
  ReduceKernels(const ReduceKernels&) = delete;
  ReduceKernels& operator=(const ReduceKernels&) = delete;

  // Thread-safe. Finds or builds the kernels of (program.canonical(), kind) for compute
  // capability `arch`. Two first calls for one key may both compile (one result is kept);
  // later calls find it in memory. *compile_seconds: the seconds this call spent building.
  absl::StatusOr<const CompiledReduction*> Get(const expr::Program& program, ReduceKind kind,
                                               int arch, double* compile_seconds);

 private:
  using Key = std::tuple<std::string, ReduceKind, int>;
  NvrtcCompiler compiler_;
  absl::Mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<CompiledReduction>> kernels_ ABSL_GUARDED_BY(mu_);
};

// Enqueues the reduction `reduce` (with a program) of `operands` (the array inputs'
// memory, in program input order) into `out` with the compiled kernels.
absl::Status LaunchReduction(const CompiledReduction& kernels, const StridedReduce& reduce,
                             std::span<const StridedOperand> operands, void* out,
                             cudaMemPool_t pool, cudaStream_t stream);

}  // namespace gpucompute::cuda

#endif  // GPUCOMPUTE_SERVER_CUDA_REDUCE_CODEGEN_H_
