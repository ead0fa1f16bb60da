// ReduceAsync: the entry point and its dispatch. The kernels are in
// kernels/cuda/detail/reduce_kernels.cuh, the operators and their types in
// kernels/reduce_ops.h (shared with the CPU backend).
//
// Paths, by shape [outer, extent, inner]:
//   * inner == 1, extent <= kGroupMaxExtent: SegmentGroupKernel, 1 to 32 lanes per
//     segment. Many short rows (axis -1 of a tall matrix) would leave most of a block
//     idle with one block per row, and segmented CUB would need a block per segment too.
//   * inner == 1, longer segments (this includes the whole-array reduction {1, n, 1}):
//     SegmentBlockKernel, one block per chunk of a segment with 16-byte loads, plus
//     CombinePartialsKernel when a segment has several chunks.
//   * inner > 1: StridedKernel, coalesced across inner, the extent cut into chunks when
//     outer * inner alone cannot fill the GPU, plus CombinePartialsKernel.
//
// Why not cub::DeviceReduce / DeviceSegmentedReduce: (1) the chunking here depends only
// on the shape, so results are bitwise the same on every GPU, whereas CUB's even-share
// grid depends on the SM count (CUB is deterministic only run to run on one device);
// (2) one set of four small kernels per operator serves all three paths, where CUB's
// device-wide dispatch instantiates several kernels and tuning policies per operator and
// per path (40 operators here), which would dominate the build; (3) 16-byte loads of
// every input type, bools included, with the conversion to the accumulator type (float32
// to float64, int to uint64) after the load, which CUB applies only to raw pointers of
// the accumulator's own type.
//
// Determinism: see reduce_kernels.cuh; no atomics are used, every merge order is fixed
// by the shape.
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/reduce_kernels.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/reduce_ops.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

// Launch constants. Changing any of them changes the association order of float sums
// (and so their last bits); results depend on nothing else.
// Segments up to this length take SegmentGroupKernel.
constexpr int64_t kGroupMaxExtent = 4096;
// Elements per lane of SegmentGroupKernel before the group widens (to at most a warp).
constexpr int64_t kGroupElementsPerLane = 8;
// Work items the chunking aims for: four waves of 8 blocks on a 132-SM H100, more than
// enough for any current GPU. A constant, not the SM count, so that the chunking and the
// summation order are the same on every device.
constexpr int64_t kTargetItems = 4096;
// A chunk of a contiguous segment is at least this many elements (32 per thread), so
// partial accumulators add little traffic.
constexpr int64_t kMinChunkElements = 8192;
// A chunk of strided rows gives each thread at least this many rows.
constexpr int64_t kMinRowsPerThread = 64;
// Grid-stride kernels get at most this many blocks per SM.
constexpr int kBlocksPerSm = 32;
// Chunk partials per output above which a warp, then a whole block, merges them.
constexpr int64_t kWarpCombineMinChunks = 64;
constexpr int64_t kBlockCombineMinChunks = 512;

int64_t NextPow2(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

template <class Op>
cudaError_t CombinePartials(const typename Op::Acc* partial, int64_t outputs, int64_t chunks,
                            int64_t output_stride, int64_t chunk_stride, int64_t extent,
                            typename Op::Out* out, cudaStream_t stream) {
  // See CombinePartialsKernel: a block per output for thousands of chunks, a warp per
  // output for many chunks or chunks contiguous per output, else a thread per output.
  int width = 1;
  if (chunks > kBlockCombineMinChunks) {
    width = kBlockThreads;
  } else if (chunk_stride == 1 || chunks > kWarpCombineMinChunks) {
    width = 32;
  }
  const int64_t per_block = kBlockThreads / width;
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      GridStrideBlocks(CeilDiv(outputs, per_block), kBlocksPerSm, &grid));
  CombinePartialsKernel<Op><<<grid, kBlockThreads, 0, stream>>>(
      partial, outputs, chunks, output_stride, chunk_stride, width, extent, out);
  return cudaGetLastError();
}

template <class Op>
cudaError_t ReduceContiguous(const typename Op::In* in, int64_t outer, int64_t extent,
                             typename Op::Out* out, cudaMemPool_t pool, cudaStream_t stream) {
  unsigned grid = 0;
  if (extent <= kGroupMaxExtent) {
    const int group =
        static_cast<int>(NextPow2(std::min<int64_t>(32, CeilDiv(extent, kGroupElementsPerLane))));
    GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
        GridStrideBlocks(CeilDiv(outer, kBlockThreads / group), kBlocksPerSm, &grid));
    SegmentGroupKernel<Op><<<grid, kBlockThreads, 0, stream>>>(in, outer, extent, group, out);
    return cudaGetLastError();
  }

  // Chunks per segment: enough items to fill the GPU, none shorter than kMinChunkElements.
  // Chunk lengths are multiples of 16 elements so that chunks of an aligned segment start
  // 16-byte aligned.
  const int64_t wanted =
      std::min(CeilDiv(kTargetItems, outer), std::max<int64_t>(1, extent / kMinChunkElements));
  const int64_t chunk_len = CeilDiv(CeilDiv(extent, wanted), 16) * 16;
  const int64_t chunks = CeilDiv(extent, chunk_len);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(GridStrideBlocks(outer * chunks, kBlocksPerSm, &grid));
  if (chunks == 1) {
    SegmentBlockKernel<Op>
        <<<grid, kBlockThreads, 0, stream>>>(in, outer, extent, chunk_len, 1, nullptr, out);
    return cudaGetLastError();
  }

  using Acc = typename Op::Acc;
  PoolScratch scratch(pool, stream);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      scratch.Allocate(static_cast<size_t>(outer * chunks) * sizeof(Acc)));
  Acc* partial = static_cast<Acc*>(scratch.get());
  SegmentBlockKernel<Op>
      <<<grid, kBlockThreads, 0, stream>>>(in, outer, extent, chunk_len, chunks, partial, out);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetLastError());
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      CombinePartials<Op>(partial, outer, chunks, chunks, 1, extent, out, stream));
  return scratch.Free();
}

template <class Op>
cudaError_t ReduceStrided(const typename Op::In* in, int64_t outer, int64_t extent, int64_t inner,
                          typename Op::Out* out, cudaMemPool_t pool, cudaStream_t stream) {
  const int tile = static_cast<int>(std::min<int64_t>(inner, kBlockThreads));
  const int fold = kBlockThreads / tile;
  const int64_t tiles = CeilDiv(inner, tile);
  // Row chunks: enough items to fill the GPU, each giving every thread at least
  // kMinRowsPerThread rows.
  const int64_t wanted = std::max<int64_t>(
      1, std::min(CeilDiv(kTargetItems, outer * tiles), extent / (kMinRowsPerThread * fold)));
  const int64_t rows_per_chunk = CeilDiv(extent, wanted);
  const int64_t chunks = CeilDiv(extent, rows_per_chunk);
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(GridStrideBlocks(outer * tiles * chunks, kBlocksPerSm, &grid));
  const int fold_pow2 = static_cast<int>(NextPow2(fold));
  if (chunks == 1) {
    StridedKernel<Op><<<grid, kBlockThreads, 0, stream>>>(
        in, outer, extent, inner, tile, fold, fold_pow2, tiles, rows_per_chunk, 1, nullptr, out);
    return cudaGetLastError();
  }

  using Acc = typename Op::Acc;
  const int64_t outputs = outer * inner;
  PoolScratch scratch(pool, stream);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      scratch.Allocate(static_cast<size_t>(outputs * chunks) * sizeof(Acc)));
  Acc* partial = static_cast<Acc*>(scratch.get());
  StridedKernel<Op><<<grid, kBlockThreads, 0, stream>>>(
      in, outer, extent, inner, tile, fold, fold_pow2, tiles, rows_per_chunk, chunks, partial, out);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetLastError());
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      CombinePartials<Op>(partial, outputs, chunks, 1, outputs, extent, out, stream));
  return scratch.Free();
}

template <class Op>
cudaError_t Dispatch(const void* in_bytes, const ReduceShape& shape, void* out_bytes,
                     cudaMemPool_t pool, cudaStream_t stream) {
  using Out = typename Op::Out;
  const auto* in = static_cast<const typename Op::In*>(in_bytes);
  auto* out = static_cast<Out*>(out_bytes);
  const int64_t outer = shape.outer;
  const int64_t extent = shape.extent;
  const int64_t inner = shape.inner;
  if (outer <= 0 || inner <= 0) return cudaSuccess;
  if (extent <= 0) {
    // Empty sums, products, means and norms: 0, 1, NaN and 0, computed by the same host
    // expression as on the CPU so that even the NaN's bits agree.
    const Out value = Op::Finalize(Op::Identity(), 0);
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(Out));
    return FillAsync(out, SameSizeDType<Out>(), bits, outer * inner, stream);
  }
  if (inner == 1) return ReduceContiguous<Op>(in, outer, extent, out, pool, stream);
  return ReduceStrided<Op>(in, outer, extent, inner, out, pool, stream);
}

}  // namespace
}  // namespace detail

cudaError_t ReduceAsync(ReduceKind kind, DType in_dtype, const void* in, const ReduceShape& shape,
                        void* out, cudaMemPool_t pool, cudaStream_t stream) {
  if (shape.f_order_rows != 0 || !IsShapeReduceKind(kind)) return cudaErrorInvalidValue;
  const bool selects = kind == ReduceKind::kMin || kind == ReduceKind::kMax ||
                       kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax;
  // Min, max, argmin and argmax of nothing are undefined; the caller rejects them.
  if (selects && shape.extent <= 0 && shape.outer > 0 && shape.inner > 0) {
    return cudaErrorInvalidValue;
  }
  return VisitDType(in_dtype, [&](auto zero) {
    return reduce::VisitReduceOp<decltype(zero), /*kShapeKindsOnly=*/true>(kind, [&](auto op) {
      return detail::Dispatch<decltype(op)>(in, shape, out, pool, stream);
    });
  });
}

}  // namespace gpucompute::cuda
