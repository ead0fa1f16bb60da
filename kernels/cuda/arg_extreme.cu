// Whole-array argmin/argmax of an F-layout matrix in NumPy's C order. Each thread reads
// memory in order (coalesced) and tags every element with its C-order index; candidates
// combine with an order-independent rule (NaN first, then the extreme, ties to the lower
// C-order index), so the answer is the same whatever the grid and thread schedule.
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace gpucompute::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

template <typename T>
struct Candidate {
  T value;
  int64_t index;  // C-order; -1 for none
  bool nan;
};

template <typename T>
__device__ bool IsNan(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return v != v;
  } else {
    return false;
  }
}

// Whether candidate a beats b.
template <typename T>
__device__ bool Better(const Candidate<T>& a, const Candidate<T>& b, bool is_min) {
  if (b.index < 0) return a.index >= 0;
  if (a.index < 0) return false;
  if (a.nan != b.nan) return a.nan;
  if (!a.nan) {
    if (is_min ? a.value < b.value : b.value < a.value) return true;
    if (is_min ? b.value < a.value : a.value < b.value) return false;
  }
  return a.index < b.index;
}

template <typename T>
__device__ Candidate<T> BlockBest(Candidate<T> mine, bool is_min) {
  __shared__ Candidate<T> shared[kThreads];
  shared[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride && Better(shared[threadIdx.x + stride], shared[threadIdx.x], is_min)) {
      shared[threadIdx.x] = shared[threadIdx.x + stride];
    }
    __syncthreads();
  }
  return shared[0];
}

template <typename Stored, typename T>
__global__ void PartialKernel(const Stored* in, int64_t rows, int64_t cols, bool is_min, Candidate<T>* partials) {
  const int64_t n = rows * cols;
  Candidate<T> best{T{}, -1, false};
  for (int64_t m = blockIdx.x * int64_t{kThreads} + threadIdx.x; m < n; m += int64_t{gridDim.x} * kThreads) {
    const T v = static_cast<T>(in[m]);
    const Candidate<T> c{v, (m % rows) * cols + m / rows, IsNan(v)};
    if (Better(c, best, is_min)) best = c;
  }
  const Candidate<T> block = BlockBest(best, is_min);
  if (threadIdx.x == 0) partials[blockIdx.x] = block;
}

template <typename T>
__global__ void FinalKernel(const Candidate<T>* partials, int count, bool is_min, int64_t* out) {
  Candidate<T> best{T{}, -1, false};
  for (int k = threadIdx.x; k < count; k += kThreads) {
    if (Better(partials[k], best, is_min)) best = partials[k];
  }
  const Candidate<T> block = BlockBest(best, is_min);
  if (threadIdx.x == 0) *out = block.index;
}

template <typename Stored, typename T>
cudaError_t Dispatch(bool is_min, const void* in, int64_t rows, int64_t cols, void* out, cudaMemPool_t pool,
                     cudaStream_t stream) {
  const int64_t n = rows * cols;
  const int blocks = static_cast<int>(std::min<int64_t>(kMaxBlocks, std::max<int64_t>(1, (n + kThreads - 1) / kThreads)));
  void* scratch = nullptr;
  cudaError_t error = cudaMallocFromPoolAsync(&scratch, sizeof(Candidate<T>) * blocks, pool, stream);
  if (error != cudaSuccess) return error;
  auto* partials = static_cast<Candidate<T>*>(scratch);
  PartialKernel<Stored, T><<<blocks, kThreads, 0, stream>>>(static_cast<const Stored*>(in), rows, cols, is_min,
                                                            partials);
  error = cudaGetLastError();
  if (error == cudaSuccess) {
    FinalKernel<T><<<1, kThreads, 0, stream>>>(partials, blocks, is_min, static_cast<int64_t*>(out));
    error = cudaGetLastError();
  }
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  return error != cudaSuccess ? error : freed;
}

}  // namespace

cudaError_t ArgExtremeInCOrderAsync(bool is_min, DType dtype, const void* in, int64_t rows, int64_t cols,
                                    void* out, cudaMemPool_t pool, cudaStream_t stream) {
  switch (dtype) {
    case DType::kBool: return Dispatch<uint8_t, int>(is_min, in, rows, cols, out, pool, stream);
    case DType::kInt32: return Dispatch<int32_t, int32_t>(is_min, in, rows, cols, out, pool, stream);
    case DType::kInt64: return Dispatch<int64_t, int64_t>(is_min, in, rows, cols, out, pool, stream);
    case DType::kFloat32: return Dispatch<float, float>(is_min, in, rows, cols, out, pool, stream);
    case DType::kFloat64: return Dispatch<double, double>(is_min, in, rows, cols, out, pool, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace gpucompute::cuda
