// Whole-array argmin/argmax of an F-layout matrix in NumPy's C order. Each thread reads
// memory in order (coalesced) and tags every element with its C-order index; candidates
// combine with the argmin/argmax operator of kernels/reduce_ops.h, whose rule (NaN first,
// then the extreme, ties to the lower index) does not depend on the combination order, so
// the answer is the same whatever the grid and thread schedule, and the CPU's.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/reduce_ops.h"

namespace gpucompute::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

template <class Op>
__device__ typename Op::Acc BlockBest(typename Op::Acc mine) {
  __shared__ typename Op::Acc shared[kThreads];
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      shared[threadIdx.x] = Op::Combine(shared[threadIdx.x], shared[threadIdx.x + stride]);
    }
    __syncthreads();
  }
  return shared[0];
}

template <class Op>
__global__ void PartialKernel(const typename Op::In* in, int64_t rows, int64_t cols, typename Op::Acc* partials) {
  const int64_t n = rows * cols;
  typename Op::Acc best = Op::Identity();
  for (int64_t m = blockIdx.x * int64_t{kThreads} + threadIdx.x; m < n; m += int64_t{gridDim.x} * kThreads) {
    best = Op::Combine(best, Op::Convert(in[m], (m % rows) * cols + m / rows));
  }
  const typename Op::Acc block = BlockBest<Op>(best);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

template <class Op>
__global__ void FinalKernel(const typename Op::Acc* partials, int count, int64_t* out) {
  typename Op::Acc best = Op::Identity();
  for (int k = threadIdx.x; k < count; k += kThreads) best = Op::Combine(best, partials[k]);
  const typename Op::Acc block = BlockBest<Op>(best);
  if (threadIdx.x == 0) *out = Op::Finalize(block, count);
}

template <class Op>
cudaError_t Dispatch(const void* in, int64_t rows, int64_t cols, void* out, cudaMemPool_t pool,
                     cudaStream_t stream) {
  using Acc = typename Op::Acc;
  const int64_t n = rows * cols;
  const int blocks =
      static_cast<int>(std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  detail::PoolScratch scratch(pool, stream);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(scratch.Allocate(sizeof(Acc) * blocks));
  auto* partials = static_cast<Acc*>(scratch.get());
  PartialKernel<Op><<<blocks, kThreads, 0, stream>>>(static_cast<const typename Op::In*>(in), rows, cols,
                                                     partials);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetLastError());
  FinalKernel<Op><<<1, kThreads, 0, stream>>>(partials, blocks, static_cast<int64_t*>(out));
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetLastError());
  return scratch.Free();
}

}  // namespace

cudaError_t ArgExtremeInCOrderAsync(bool is_min, DType dtype, const void* in, int64_t rows, int64_t cols,
                                    void* out, cudaMemPool_t pool, cudaStream_t stream) {
  return VisitDType(dtype, [&](auto zero) {
    using Argmin = typename reduce::OpFor<ReduceKind::kArgmin, decltype(zero)>::type;
    using Argmax = typename reduce::OpFor<ReduceKind::kArgmax, decltype(zero)>::type;
    return is_min ? Dispatch<Argmin>(in, rows, cols, out, pool, stream)
                  : Dispatch<Argmax>(in, rows, cols, out, pool, stream);
  });
}

}  // namespace gpucompute::cuda
