#include "server/cuda/reduce_codegen.h"

#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/cuda/cuda_check.h"
#include "server/cuda/elementwise_codegen.h"
#include "server/cuda/elementwise_kernels.h"
#include "server/util/status_macros.h"

namespace gpucompute::cuda {

absl::StatusOr<ReductionSource> GenerateReduction(const expr::Program& program, ReduceKind kind) {
  const DType value_dtype = program.result_dtype();
  ElementFunction element = GenerateElementFunction(program, value_dtype);
  if (element.array_inputs.size() > static_cast<size_t>(kReduceExpressionMaxArrays)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a reduction of an expression reads at most ", kReduceExpressionMaxArrays,
        " arrays; this one reads ", element.array_inputs.size(),
        ". Compute part of it into a buffer first."));
  }
  ReductionSource result;
  ReduceExpressionSignature& sig = result.signature;
  sig.kind = kind;
  sig.value_dtype = value_dtype;
  sig.array_inputs = std::move(element.array_inputs);
  sig.array_dtypes = std::move(element.array_dtypes);
  sig.parameter_dtypes = std::move(element.parameter_dtypes);
  const std::string header =
      absl::StrCat(element.header, "// reduced by ", ReduceKindName(kind), "\n");
  result.source = ReduceExpressionKernelSource(sig, header, element.body);
  return result;
}

ReduceKernels::~ReduceKernels() {
  absl::MutexLock lock(&mu_);
  for (auto& [key, kernel] : kernels_) {
    const cudaError_t error = cudaLibraryUnload(kernel->library);
    // At process exit the runtime may already be gone, taking the libraries with it.
    if (error != cudaErrorCudartUnloading) LogIfFailed(error, "cudaLibraryUnload of a reduction");
  }
}

absl::StatusOr<const CompiledReduction*> ReduceKernels::Get(const expr::Program& program,
                                                            ReduceKind kind, int arch,
                                                            double* compile_seconds) {
  if (compile_seconds != nullptr) *compile_seconds = 0;
  Key key{program.canonical(), kind, arch};
  {
    absl::MutexLock lock(&mu_);
    if (auto it = kernels_.find(key); it != kernels_.end()) return it->second.get();
  }
  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(ReductionSource generated, GenerateReduction(program, kind));
  ASSIGN_OR_RETURN(const std::string cubin, compiler_.Compile(generated.source, arch));
  auto kernel = std::make_unique<CompiledReduction>();
  kernel->signature = std::move(generated.signature);
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(cudaLibraryLoadData(&kernel->library, cubin.data(), nullptr,
                                                      nullptr, 0, nullptr, nullptr, 0));
  const cudaError_t rows =
      cudaLibraryGetKernel(&kernel->kernels.rows, kernel->library, kReduceRowsKernel);
  const cudaError_t columns =
      cudaLibraryGetKernel(&kernel->kernels.columns, kernel->library, kReduceColumnsKernel);
  if (rows != cudaSuccess || columns != cudaSuccess) {
    cudaLibraryUnload(kernel->library);
    return CudaStatus(rows != cudaSuccess ? rows : columns, "cudaLibraryGetKernel", __FILE__,
                      __LINE__);
  }
  if (compile_seconds != nullptr) {
    *compile_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = kernels_.try_emplace(std::move(key), std::move(kernel));
  if (!inserted) cudaLibraryUnload(kernel->library);  // another call built it first; kept
  return it->second.get();
}

absl::Status LaunchReduction(const CompiledReduction& kernels, const StridedReduce& reduce,
                             std::span<const StridedOperand> operands, void* out,
                             cudaMemPool_t pool, cudaStream_t stream) {
  const ReduceExpressionSignature& sig = kernels.signature;
  if (operands.size() != sig.array_inputs.size()) {
    return absl::InternalError(absl::StrCat("the reduction's expression reads ",
                                            sig.array_inputs.size(), " arrays, but ",
                                            operands.size(), " were given"));
  }
  std::vector<const StridedOperand*> planned;
  std::vector<const void*> arrays;
  for (const StridedOperand& operand : operands) {
    planned.push_back(&operand);
    arrays.push_back(operand.data);
  }
  // An expression of scalars alone still iterates over the shape: one array slot that
  // reads nothing.
  const StridedOperand none{nullptr, std::vector<int64_t>(reduce.shape.size(), 0), 0};
  if (planned.empty()) planned.push_back(&none);
  StridedReducePlan plan;
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(PlanStridedReduce(reduce.shape, reduce.axes, planned, false, &plan));
  plan.ddof = reduce.ddof;
  ASSIGN_OR_RETURN(const std::vector<uint64_t> parameters,
                   KernelParameters(*reduce.program, sig.parameter_dtypes));
  GPUCOMPUTE_CUDA_RETURN_IF_ERROR(ReduceExpressionAsync(sig, kernels.kernels, plan, arrays.data(),
                                                        parameters.data(), out, pool, stream));
  return absl::OkStatus();
}

}  // namespace gpucompute::cuda
