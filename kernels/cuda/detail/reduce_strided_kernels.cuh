// The kernels of a reduction over any axes of strided arrays (the kernel layer of
// ReduceStridedAsync in kernels/cuda/reduce_strided.cu, and of the NVRTC-generated
// reductions of expressions, kernels/cuda/reduce_expression.cu). Each is a template over
// an operator of kernels/reduce_ops.h, the number of arrays read, and a Load functor that
// turns the arrays' element offsets at one index into the value reduced: one array's
// element for a plain reduction, the expression's Element(...) for a fused one. Both
// kinds of reduction run these same bodies, so they chunk and combine alike.
//
// The iteration space, as the host planned it (StridedReduceGeometry): the kept axes
// (the output's, outermost, C order) and the reduced axes (C order among themselves, as
// in the input), each coalesced. Output o combines the `extent` values of the reduced
// index space in C order: r = 0 .. extent - 1, cut into `chunks` chunks of `chunk_len`.
//
// Combination order (a function of the geometry and the constants of the dispatch alone,
// never of the grid, the SM count or timing, so results are bitwise the same run to run
// and on every GPU):
//   * RowReduce (a warp per (output, chunk)): lane l combines r = begin + l, begin + l +
//     32, ... in increasing order, the 32 lanes then merge by a fixed butterfly;
//   * ColumnReduce (a thread per (output, chunk)): the thread combines its chunk's r in
//     increasing order;
//   * MergeChunks: chunk partials of an output combine as CombinePartials does: a lane
//     (of a warp, or a thread of a block for many chunks) takes chunks l, l + width, ...
//     in order, then a fixed butterfly or shared-memory tree.
// argmin/argmax see r, the C-order position among the reduced axes: along one axis, the
// index on it; over all axes, the flat C-order index.
//
// Device code that nvcc compiles (included by the .cu files) and that NVRTC compiles too
// (embedded into every generated reduction, without its #include, after the embedded
// kernels/reduce_ops.h); it uses only `long long` and the operators' own types.
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_STRIDED_KERNELS_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_STRIDED_KERNELS_CUH_

#include "kernels/reduce_ops.h"  // NVRTC sources embed it ahead of this file instead

namespace gpucompute::cuda::detail {

// At most this many axes of each kind after coalescing (the service allows 8 in all).
constexpr int kStridedMaxDims = 8;
// Threads per block of every kernel here, and the blocks that must fit on an SM at once
// (at most 64 registers a thread): the gathers need many loads in flight.
constexpr int kStridedThreads = 256;
constexpr int kStridedMinBlocksPerSm = 4;

// The iteration space of one strided reduction of kArrays arrays; a kernel argument,
// declared __grid_constant__ by the kernels, which pass it on by reference: otherwise
// taking its address would copy its hundreds of bytes to every thread's local memory.
// Strides and offsets in elements; input a's element at (kept index k, reduced index r) is
// at offsets[a] + sum kept_strides[a][d] * k_d + sum reduced_strides[a][d] * r_d.
template <int kArrays>
struct StridedReduceGeometry {
  int kept_ndim = 0;
  int reduced_ndim = 0;  // at least 1
  long long kept_shape[kStridedMaxDims] = {};
  long long reduced_shape[kStridedMaxDims] = {};
  // The output's C-order stride of each kept axis: the plan may order the kept axes
  // otherwise (the one with the smallest input stride innermost, for kColumns).
  long long kept_out_strides[kStridedMaxDims] = {};
  long long kept_strides[kArrays][kStridedMaxDims] = {};
  long long reduced_strides[kArrays][kStridedMaxDims] = {};
  long long offsets[kArrays] = {};
  long long outputs = 1;    // product of kept_shape
  long long extent = 1;     // product of reduced_shape
  long long chunk_len = 1;  // values of one chunk (the last may be shorter)
  long long chunks = 1;     // with more than one, kernels write partials, not outputs
  double ddof = 0;          // var, std
};

#if defined(__CUDACC__)

// The element offsets of every array at work index o (the kept index decoded in the
// plan's order), and the output's position of that kept index, which it returns.
template <int kArrays>
__device__ __forceinline__ long long KeptOffsets(const StridedReduceGeometry<kArrays>& g,
                                                 long long o, long long* off) {
#pragma unroll
  for (int a = 0; a < kArrays; ++a) off[a] = g.offsets[a];
  long long position = 0;
  for (int d = g.kept_ndim - 1; d >= 0; --d) {
    // The outermost digit is what is left: no 64-bit division for it.
    const long long q = d > 0 ? o / g.kept_shape[d] : 0;
    const long long k = o - q * g.kept_shape[d];
    o = q;
    position += k * g.kept_out_strides[d];
#pragma unroll
    for (int a = 0; a < kArrays; ++a) off[a] += k * g.kept_strides[a][d];
  }
  return position;
}

// A position r in the reduced index space: its innermost digit and every array's element
// offset there.
template <int kArrays>
struct ReducedCursor {
  long long inner;  // the innermost digit
  long long off[kArrays];

  // Positions the cursor at r, from the offsets `base` of the output's kept index.
  __device__ __forceinline__ void Seek(const StridedReduceGeometry<kArrays>& g,
                                       const long long* base, long long r) {
#pragma unroll
    for (int a = 0; a < kArrays; ++a) off[a] = base[a];
    const int last = g.reduced_ndim - 1;
    for (int d = last; d >= 0; --d) {
      const long long q = d > 0 ? r / g.reduced_shape[d] : 0;
      const long long k = r - q * g.reduced_shape[d];
      r = q;
      if (d == last) inner = k;
#pragma unroll
      for (int a = 0; a < kArrays; ++a) off[a] += k * g.reduced_strides[a][d];
    }
  }

};

// Merges the accumulators of the aligned groups of `width` lanes (a power of two up to
// 32) by a butterfly; lane 0 of each group ends with its group's result in a fixed order.
// Any accumulator type: it moves as 32-bit words.
template <typename Acc>
__device__ __forceinline__ Acc ShuffleXorAny(const Acc& v, int lane_mask) {
  constexpr int kWords = (sizeof(Acc) + 3) / 4;
  union {
    Acc value;
    unsigned int words[kWords];
  } in, out;
  in.value = v;
#pragma unroll
  for (int w = 0; w < kWords; ++w) out.words[w] = __shfl_xor_sync(0xffffffffu, in.words[w], lane_mask);
  return out.value;
}

template <class Op>
__device__ __forceinline__ typename Op::Acc WarpCombine(typename Op::Acc acc) {
  for (int m = 16; m > 0; m /= 2) acc = Op::Combine(acc, ShuffleXorAny(acc, m));
  return acc;
}

// Values a thread loads before it combines any of them: enough bytes in flight per SM
// to cover the memory's latency at full bandwidth.
constexpr int kStridedUnroll = 8;

// Combines, in increasing order, the values at r = first, first + step, ... < end of one
// output (kept offsets `base`), starting from `acc`. The positions are visited a row of
// the innermost reduced axis at a time: along a row the offsets only add, and loads are
// issued kStridedUnroll at a time before they combine (in order); between rows the
// position is decoded again.
template <class Op, int kArrays, class Load>
__device__ __forceinline__ typename Op::Acc CombineStrided(const StridedReduceGeometry<kArrays>& g,
                                                           const Load& load, const long long* base,
                                                           long long first, long long end,
                                                           long long step, typename Op::Acc acc) {
  using In = typename Op::In;
  const int last = g.reduced_ndim - 1;
  const long long inner_extent = g.reduced_shape[last];
  long long moves[kArrays];
#pragma unroll
  for (int a = 0; a < kArrays; ++a) moves[a] = step * g.reduced_strides[a][last];
  ReducedCursor<kArrays> cursor;
  for (long long r = first; r < end;) {
    cursor.Seek(g, base, r);
    // Positions left on this row, and before `end`.
    long long count = (inner_extent - cursor.inner + step - 1) / step;
    const long long before_end = (end - r + step - 1) / step;
    count = count < before_end ? count : before_end;
    long long j = 0;
    for (; j + kStridedUnroll <= count; j += kStridedUnroll) {
      In x[kStridedUnroll];
#pragma unroll
      for (int u = 0; u < kStridedUnroll; ++u) {
        long long off[kArrays];
#pragma unroll
        for (int a = 0; a < kArrays; ++a) off[a] = cursor.off[a] + (j + u) * moves[a];
        x[u] = load(off);
      }
#pragma unroll
      for (int u = 0; u < kStridedUnroll; ++u) {
        acc = Op::Combine(acc, Op::Convert(x[u], r + (j + u) * step));
      }
    }
    for (; j < count; ++j) {
      long long off[kArrays];
#pragma unroll
      for (int a = 0; a < kArrays; ++a) off[a] = cursor.off[a] + j * moves[a];
      acc = Op::Combine(acc, Op::Convert(load(off), r + j * step));
    }
    r += count * step;
  }
  return acc;
}

template <int kArrays>
__device__ __forceinline__ long long ChunkEnd(const StridedReduceGeometry<kArrays>& g,
                                              long long c) {
  const long long end = (c + 1) * g.chunk_len;
  return end < g.extent ? end : g.extent;
}

// The result for output `position`, or with several chunks its partial of chunk c: at
// partial[position * chunks + c] (kRows: an output's partials together) or
// partial[c * outputs + position] (kColumns: a chunk's partials together).
template <class Op, int kArrays>
__device__ __forceinline__ void Store(const StridedReduceGeometry<kArrays>& g,
                                      const typename Op::Acc& acc, long long position,
                                      long long c, bool rows, typename Op::Acc* partial,
                                      typename Op::Out* out) {
  if (g.chunks == 1) {
    out[position] = reduce::Finish<Op>(acc, g.extent, g.ddof);
  } else {
    partial[rows ? position * g.chunks + c : c * g.outputs + position] = acc;
  }
}

// A warp per work item (o, c), item = o * chunks + c; lanes stride the chunk by 32, so a
// warp reads 32 neighbouring positions of the reduced space at a time: coalesced where
// the innermost reduced axis has unit stride. Writes output o's position, or its partial.
template <class Op, int kArrays, class Load>
__device__ __forceinline__ void RowReduce(const StridedReduceGeometry<kArrays>& g, const Load& load,
                                          typename Op::Acc* partial, typename Op::Out* out) {
  using Acc = typename Op::Acc;
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const long long warps = static_cast<long long>(gridDim.x) * (kStridedThreads / 32);
  const long long items = g.outputs * g.chunks;
  for (long long item = static_cast<long long>(blockIdx.x) * (kStridedThreads / 32) +
                        threadIdx.x / 32;
       item < items; item += warps) {
    const long long o = item / g.chunks;
    const long long c = item - o * g.chunks;
    long long base[kArrays];
    const long long position = KeptOffsets(g, o, base);
    Acc acc = CombineStrided<Op>(g, load, base, c * g.chunk_len + lane, ChunkEnd(g, c), 32,
                                 Op::Identity());
    acc = WarpCombine<Op>(acc);
    if (lane == 0) Store<Op>(g, acc, position, c, /*rows=*/true, partial, out);
  }
}

// A thread per work item (o, c), item = c * outputs + o: neighbouring threads take
// neighbouring outputs, coalesced where the innermost kept axis (of the plan's order) has
// unit stride. Writes output o's position, or its partial.
template <class Op, int kArrays, class Load>
__device__ __forceinline__ void ColumnReduce(const StridedReduceGeometry<kArrays>& g,
                                             const Load& load, typename Op::Acc* partial,
                                             typename Op::Out* out) {
  using Acc = typename Op::Acc;
  const long long threads = static_cast<long long>(gridDim.x) * kStridedThreads;
  const long long items = g.outputs * g.chunks;
  for (long long item = static_cast<long long>(blockIdx.x) * kStridedThreads + threadIdx.x;
       item < items; item += threads) {
    const long long c = item / g.outputs;
    const long long o = item - c * g.outputs;
    long long base[kArrays];
    const long long position = KeptOffsets(g, o, base);
    const Acc acc =
        CombineStrided<Op>(g, load, base, c * g.chunk_len, ChunkEnd(g, c), 1, Op::Identity());
    Store<Op>(g, acc, position, c, /*rows=*/false, partial, out);
  }
}

// out[j] = Finalize(partial[j * output_stride + c * chunk_stride] over c in chunk order,
// extent), by a block per output (width kStridedThreads: lane t takes chunks t, t + 256,
// ..., then a shared-memory tree) or a warp per output (width 32, then the butterfly).
template <class Op>
__device__ __forceinline__ void MergeChunks(const typename Op::Acc* __restrict__ partial,
                                            long long outputs, long long chunks,
                                            long long output_stride, long long chunk_stride,
                                            int width, long long extent, double ddof,
                                            typename Op::Out* __restrict__ out) {
  using Acc = typename Op::Acc;
  const int t = static_cast<int>(threadIdx.x);
  const int lane = t % width;
  const long long per_block = kStridedThreads / width;
  __shared__ Acc tree[kStridedThreads];
  for (long long first = static_cast<long long>(blockIdx.x) * per_block; first < outputs;
       first += static_cast<long long>(gridDim.x) * per_block) {
    const long long j = first + t / width;
    Acc acc = Op::Identity();
    if (j < outputs) {
      long long c = lane;
      // Four loads in flight before they combine, in order: partials are L2 reads.
      for (; c + 3 * width < chunks; c += 4 * width) {
        Acc x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) x[u] = partial[j * output_stride + (c + u * width) * chunk_stride];
#pragma unroll
        for (int u = 0; u < 4; ++u) acc = Op::Combine(acc, x[u]);
      }
      for (; c < chunks; c += width) acc = Op::Combine(acc, partial[j * output_stride + c * chunk_stride]);
    }
    if (width == 32) {
      acc = WarpCombine<Op>(acc);
    } else {
      tree[t] = acc;
      __syncthreads();
      for (int h = kStridedThreads / 2; h > 0; h /= 2) {
        if (t < h) tree[t] = Op::Combine(tree[t], tree[t + h]);
        __syncthreads();
      }
      acc = tree[0];
      __syncthreads();  // tree is reused by the next output
    }
    if (j < outputs && lane == 0) out[j] = reduce::Finish<Op>(acc, extent, ddof);
  }
}

#endif  // defined(__CUDACC__)

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_STRIDED_KERNELS_CUH_
