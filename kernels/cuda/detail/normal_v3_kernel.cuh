// The float32 fill of normal transform v3 (kernels/philox.h defines it; kernels/cuda/random.cu
// dispatches here). Float64 v3 is v2's arithmetic and runs RandomKernel.
//
// Each value is one table row (16 bytes) and three fmas, so the row loads must cost next to
// nothing. The 512 rows (8 KiB) are staged in shared memory eight times over, interleaved
// so that copy c of every row sits in the 16-byte bank group c: lane l reads copy l % 8.
// A 16-byte shared load is served a quarter warp (8 lanes) at a time, and those 8 lanes
// then read 8 different bank groups whatever rows they want: no bank conflict, ever. That
// is 64 KiB of dynamic shared memory a block, so blocks are 1024 threads, two to an SM,
// looping over the fill.
//
// Per value: the segment's row from the exponent bits of float32(b) toward zero (one
// conversion and a shift), the offset X (a multiply-add, a leading-zero count, a shift and
// a conversion), three fmas and the sign. With the standard normal (mean 0, stddev 1) the
// last fma(stddev, z, mean) is z itself (z is never 0) and is left out.
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_NORMAL_V3_KERNEL_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_NORMAL_V3_KERNEL_CUH_

#include <atomic>
#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/random_kernels.cuh"
#include "kernels/ops.h"
#include "kernels/philox.h"

namespace gpucompute::cuda::detail {

inline constexpr int kNormalV3Threads = 1024;
inline constexpr int kNormalV3BlocksPerSm = 2;
inline constexpr int kNormalV3Copies = 8;  // one per 16-byte bank group
inline constexpr int kNormalV3SharedBytes =
    kNormalV3Segments * kNormalV3Copies * static_cast<int>(sizeof(NormalV3Row));

// One value, its row read from this lane's copy: `lane_rows` is the shared-memory address
// of copy (lane % 8) of row 0.
template <bool kStandard>
__device__ __forceinline__ float NormalV3Value(uint32_t w, uint32_t lane_rows, float mean,
                                               float stddev) {
  const NormalV3Point at = NormalV3Locate(w);
  NormalV3Row r;
  asm("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
      : "=f"(r.c[0]), "=f"(r.c[1]), "=f"(r.c[2]), "=f"(r.c[3])
      : "r"(lane_rows + at.row * static_cast<uint32_t>(kNormalV3Copies * sizeof(NormalV3Row))));
  const float z = NormalFloat32V3(w, r, at.x);
  return kStandard ? z : __fmaf_rn(stddev, z, mean);
}

template <bool kStandard>
__device__ __forceinline__ BlockValues<float, 4> NormalV3Block(const PhiloxWords& w,
                                                               uint32_t lane_rows, float mean,
                                                               float stddev) {
  return {{NormalV3Value<kStandard>(w.w[0], lane_rows, mean, stddev),
           NormalV3Value<kStandard>(w.w[1], lane_rows, mean, stddev),
           NormalV3Value<kStandard>(w.w[2], lane_rows, mean, stddev),
           NormalV3Value<kStandard>(w.w[3], lane_rows, mean, stddev)}};
}

// The table staged, then RandomKernel's loop (FillBlocks) over the blocks.
template <bool kStandard>
__global__ void __launch_bounds__(kNormalV3Threads, kNormalV3BlocksPerSm)
    NormalV3Kernel(RandomParams params, PhiloxRoundKeys keys, float* __restrict__ out, int64_t n,
                   bool vector_store) {
  extern __shared__ NormalV3Row rows[];  // [row][copy]
  for (int i = threadIdx.x; i < kNormalV3Segments * kNormalV3Copies; i += kNormalV3Threads) {
    rows[i] = kNormalV3Float32Device[i / kNormalV3Copies];
  }
  __syncthreads();
  const uint32_t lane_rows = static_cast<uint32_t>(__cvta_generic_to_shared(rows)) +
                             (threadIdx.x % kNormalV3Copies) * sizeof(NormalV3Row);
  const float mean = static_cast<float>(params.mean);
  const float stddev = static_cast<float>(params.stddev);
  FillBlocks<float, 4>(keys, params.offset, out, n, vector_store, kNormalV3Threads,
                       [&](const PhiloxWords& w) {
                         return NormalV3Block<kStandard>(w, lane_rows, mean, stddev);
                       });
}

// Lets NormalV3Kernel<kStandard> have its shared memory, above the 48 KiB a block gets
// unasked. The setting belongs to the function on the current device and lasts, so it is
// made once per device, as SmCount's lookup is (a driver call, too slow for every
// launch); racing first calls both make it, which is harmless.
template <bool kStandard>
cudaError_t AllowNormalV3SharedMemory() {
  static std::atomic<bool> allowed[kMaxDevices] = {};
  int device = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetDevice(&device));
  const bool remembered = device >= 0 && device < kMaxDevices;
  if (remembered && allowed[device].load(std::memory_order_relaxed)) return cudaSuccess;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaFuncSetAttribute(
      NormalV3Kernel<kStandard>, cudaFuncAttributeMaxDynamicSharedMemorySize,
      kNormalV3SharedBytes));
  if (remembered) allowed[device].store(true, std::memory_order_relaxed);
  return cudaSuccess;
}

// Launches the fill of n > 0 float32 normals (v3) on `stream`.
inline cudaError_t LaunchNormalV3(const RandomParams& params, float* out, int64_t n,
                                  cudaStream_t stream) {
  const bool standard = params.mean == 0.0 && params.stddev == 1.0;
  const auto kernel = standard ? NormalV3Kernel<true> : NormalV3Kernel<false>;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(standard ? AllowNormalV3SharedMemory<true>()
                                             : AllowNormalV3SharedMemory<false>());
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      GridStrideBlocks(CeilDiv(CeilDiv(n, 4), kNormalV3Threads), kNormalV3BlocksPerSm, &grid));
  const bool vector_store = reinterpret_cast<uintptr_t>(out) % sizeof(BlockValues<float, 4>) == 0;
  kernel<<<grid, kNormalV3Threads, kNormalV3SharedBytes, stream>>>(
      params, PhiloxRoundKeysFor(PhiloxKeyFromSeed(params.seed)), out, n, vector_store);
  return cudaGetLastError();
}

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_NORMAL_V3_KERNEL_CUH_
