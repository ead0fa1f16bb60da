// The kernels of ReduceAsync (the kernel layer; kernels/cuda/reduce.cu holds the entry
// point and the dispatch that picks among them). Each is a template over an operator of
// kernels/reduce_ops.h and computes, for its share of the outputs,
//   out[o * inner + i] = Finalize(Combine_{r < extent} Convert(in[(o * extent + r) * inner + i], r))
// or a partial accumulator of an extent chunk, which CombinePartialsKernel then merges.
//
// Determinism: which elements each thread combines, in which order, and how threads
// and chunks are merged depend only on the shape and on the launch constants below,
// never on the grid size, the device or timing (work items are distributed by
// grid-stride loops, and every merge is a fixed tree or sequence). So every result is
// bitwise the same run to run, and on any GPU that runs the same binary.
#ifndef GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_KERNELS_CUH_
#define GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_KERNELS_CUH_

#include <cub/block/block_reduce.cuh>

#include <cstdint>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/reduce_ops.h"

namespace gpucompute::cuda::detail {

// Exchanges a value between lanes: a scalar in one or two 32-bit shuffles, an ArgPair
// field by field.
template <typename T>
__device__ __forceinline__ T ShuffleXor(T v, int lane_mask) {
  if constexpr (sizeof(T) < 4) {
    return static_cast<T>(__shfl_xor_sync(0xffffffffu, static_cast<uint32_t>(v), lane_mask));
  } else {
    return __shfl_xor_sync(0xffffffffu, v, lane_mask);  // 4- and 8-byte overloads
  }
}
template <typename T>
__device__ __forceinline__ reduce::ArgPair<T> ShuffleXor(const reduce::ArgPair<T>& v, int lane_mask) {
  return {ShuffleXor(v.value, lane_mask),
          static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, static_cast<long long>(v.row), lane_mask))};
}

// Merges the values of aligned groups of `group` lanes (a power of two <= 32) by a
// butterfly: every lane ends with its group's result, lane 0 of the group in a fixed
// association order. All 32 lanes of the warp must call it.
template <class Op>
__device__ __forceinline__ typename Op::Acc GroupCombine(typename Op::Acc acc, int group) {
  for (int m = group / 2; m > 0; m /= 2) acc = Op::Combine(acc, ShuffleXor(acc, m));
  return acc;
}

template <class Op> struct CombineFn {
  template <typename A>
  __device__ __forceinline__ A operator()(const A& a, const A& b) const { return Op::Combine(a, b); }
};

// ---- inner == 1, short segments (extent <= a few thousand) ----
//
// Segment o is in[o * extent, (o + 1) * extent). A group of `group` consecutive lanes
// owns one segment: lane m combines elements m, m + group, ... in order, then the group
// merges by GroupCombine. Lanes of a warp read neighbouring addresses, and for tiny
// segments (group < 32) one warp covers several adjacent segments, so loads stay
// coalesced without idle lanes.
template <class Op>
__global__ void __launch_bounds__(kBlockThreads)
    SegmentGroupKernel(const typename Op::In* __restrict__ in, int64_t outer, int64_t extent,
                       int group, typename Op::Out* __restrict__ out) {
  using Acc = typename Op::Acc;
  const int64_t groups_per_block = kBlockThreads / group;
  const int member = static_cast<int>(threadIdx.x) & (group - 1);
  for (int64_t first = blockIdx.x * groups_per_block; first < outer;
       first += static_cast<int64_t>(gridDim.x) * groups_per_block) {
    const int64_t o = first + threadIdx.x / group;
    Acc acc = Op::Identity();
    if (o < outer) {
      const typename Op::In* seg = in + o * extent;
      int64_t r = member;
      // Four independent loads in flight per lane, combined in row order.
      for (; r + 3 * group < extent; r += 4 * group) {
        const auto x0 = seg[r];
        const auto x1 = seg[r + group];
        const auto x2 = seg[r + 2 * group];
        const auto x3 = seg[r + 3 * group];
        acc = Op::Combine(acc, Op::Convert(x0, r));
        acc = Op::Combine(acc, Op::Convert(x1, r + group));
        acc = Op::Combine(acc, Op::Convert(x2, r + 2 * group));
        acc = Op::Combine(acc, Op::Convert(x3, r + 3 * group));
      }
      for (; r < extent; r += group) acc = Op::Combine(acc, Op::Convert(seg[r], r));
    }
    acc = GroupCombine<Op>(acc, group);  // uniform loop: the whole warp is here
    if (o < outer && member == 0) out[o] = Op::Finalize(acc, extent);
  }
}

// ---- inner == 1, long segments (and the whole-array reduction, outer == 1) ----
//
// Work item (o, c) is chunk c of segment o: elements [c * chunk_len, min(extent, (c + 1) *
// chunk_len)). One block reduces it with 16-byte vector loads: the elements before the
// first 16-byte boundary (head) and after the last (tail) are read one by one. Thread t
// combines, in order, head element t, vectors t, t + 256, ..., and tail element t; the
// block then merges with cub::BlockReduce (a fixed tree). With one chunk per segment the
// block writes the output, otherwise partial[o * chunks + c].
template <class Op>
__global__ void __launch_bounds__(kBlockThreads)
    SegmentBlockKernel(const typename Op::In* __restrict__ in, int64_t outer, int64_t extent,
                       int64_t chunk_len, int64_t chunks, typename Op::Acc* __restrict__ partial,
                       typename Op::Out* __restrict__ out) {
  using In = typename Op::In;
  using Acc = typename Op::Acc;
  constexpr int kVec = static_cast<int>(16 / sizeof(In));
  union Vector {
    uint4 bits;
    In e[kVec];
  };
  using BlockReduce = cub::BlockReduce<Acc, kBlockThreads>;
  __shared__ typename BlockReduce::TempStorage temp;

  const int t = static_cast<int>(threadIdx.x);
  const int64_t items = outer * chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t o = item / chunks;
    const int64_t begin = (item - o * chunks) * chunk_len;
    const int64_t len = min(extent - begin, chunk_len);
    const In* p = in + o * extent + begin;

    const uintptr_t address = reinterpret_cast<uintptr_t>(p);
    int64_t head = len;  // all scalar if p is not even element-aligned
    if (address % sizeof(In) == 0) {
      head = min(len, static_cast<int64_t>(((16 - address % 16) % 16) / sizeof(In)));
    }
    const int64_t vectors = (len - head) / kVec;
    const int64_t tail = head + vectors * kVec;

    Acc acc = Op::Identity();
    if (t < head) acc = Op::Convert(p[t], begin + t);
    const uint4* vp = reinterpret_cast<const uint4*>(p + head);
    const int64_t row0 = begin + head;
    int64_t v = t;
    // Four independent 16-byte loads in flight per thread before any is combined (64
    // bytes; with 8 resident blocks, 128 KB per SM), which float32 needs to reach the
    // copy's bandwidth. Each load has an accumulator of its own, so that the combines
    // form four independent dependency chains instead of one 4 * kVec long: one chain of
    // dependent float64 adds per element would bound the loop by the adder's latency.
    // The four merge in a fixed tree at the end, so the order is still fixed.
    Acc lane_acc[4] = {acc, Op::Identity(), Op::Identity(), Op::Identity()};
    for (; v + 3 * kBlockThreads < vectors; v += 4 * kBlockThreads) {
      Vector x[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) x[u].bits = vp[v + u * kBlockThreads];
#pragma unroll
      for (int u = 0; u < 4; ++u) {
        const int64_t row = row0 + (v + u * kBlockThreads) * kVec;
#pragma unroll
        for (int j = 0; j < kVec; ++j) lane_acc[u] = Op::Combine(lane_acc[u], Op::Convert(x[u].e[j], row + j));
      }
    }
    acc = Op::Combine(Op::Combine(lane_acc[0], lane_acc[1]), Op::Combine(lane_acc[2], lane_acc[3]));
    for (; v < vectors; v += kBlockThreads) {
      Vector a;
      a.bits = vp[v];
#pragma unroll
      for (int j = 0; j < kVec; ++j) acc = Op::Combine(acc, Op::Convert(a.e[j], row0 + v * kVec + j));
    }
    if (tail + t < len) acc = Op::Combine(acc, Op::Convert(p[tail + t], begin + tail + t));

    const Acc total = BlockReduce(temp).Reduce(acc, CombineFn<Op>{});
    if (t == 0) {
      if (chunks == 1) {
        out[o] = Op::Finalize(total, extent);
      } else {
        partial[item] = total;
      }
    }
    __syncthreads();  // temp is reused by the next item
  }
}

// ---- inner > 1 (strided) ----
//
// A block owns a tile of `tile` consecutive inner positions (tile = min(inner, 256)) of
// one outer index and a chunk of rows. Thread t takes column t % tile and every `fold`-th
// row from row r0 + t / tile, with fold = 256 / tile: a warp reads consecutive addresses,
// even for narrow inner. The `fold` accumulators of a column then merge in shared memory
// by a fixed tree. Work item ((o * tiles + tile_index) * chunks + c); with one chunk the
// block writes the output, otherwise partial[c * outer * inner + o * inner + i].
template <class Op>
__global__ void __launch_bounds__(kBlockThreads)
    StridedKernel(const typename Op::In* __restrict__ in, int64_t outer, int64_t extent,
                  int64_t inner, int tile, int fold, int fold_pow2, int64_t tiles,
                  int64_t rows_per_chunk, int64_t chunks, typename Op::Acc* __restrict__ partial,
                  typename Op::Out* __restrict__ out) {
  using Acc = typename Op::Acc;
  __shared__ Acc lanes[kBlockThreads];
  const int t = static_cast<int>(threadIdx.x);
  const int s = t / tile;
  const int col = t - s * tile;
  const int64_t items = outer * tiles * chunks;
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    const int64_t c = item % chunks;
    const int64_t tile_index = (item / chunks) % tiles;
    const int64_t o = item / chunks / tiles;
    const int64_t i = tile_index * tile + col;
    const int64_t r0 = c * rows_per_chunk;
    const int64_t r1 = min(extent, r0 + rows_per_chunk);

    Acc acc = Op::Identity();
    if (s < fold && i < inner) {
      const typename Op::In* column = in + o * extent * inner + i;
      int64_t r = r0 + s;
      for (; r + 3 * fold < r1; r += 4 * fold) {
        const auto x0 = column[r * inner];
        const auto x1 = column[(r + fold) * inner];
        const auto x2 = column[(r + 2 * fold) * inner];
        const auto x3 = column[(r + 3 * fold) * inner];
        acc = Op::Combine(acc, Op::Convert(x0, r));
        acc = Op::Combine(acc, Op::Convert(x1, r + fold));
        acc = Op::Combine(acc, Op::Convert(x2, r + 2 * fold));
        acc = Op::Combine(acc, Op::Convert(x3, r + 3 * fold));
      }
      for (; r < r1; r += fold) acc = Op::Combine(acc, Op::Convert(column[r * inner], r));
    }
    if (fold > 1) {
      lanes[t] = acc;
      __syncthreads();
      for (int h = fold_pow2 / 2; h > 0; h /= 2) {
        if (s < h && s + h < fold) lanes[t] = Op::Combine(lanes[t], lanes[t + h * tile]);
        __syncthreads();
      }
      acc = lanes[t];
    }
    if (s == 0 && i < inner) {
      const int64_t j = o * inner + i;
      if (chunks == 1) {
        out[j] = Op::Finalize(acc, extent);
      } else {
        partial[c * outer * inner + j] = acc;
      }
    }
    if (fold > 1) __syncthreads();  // lanes is reused by the next item
  }
}

// ---- merging chunk partials ----
//
// out[j] = Finalize(partial[j * output_stride + 0 * chunk_stride] (+) ... (+) chunk
// chunks - 1), each output merged by a group of `width` threads:
//   * 1: one thread combines all chunks of an output in order (few chunks, neighbouring
//     threads reading neighbouring outputs);
//   * 32: lane l of a warp combines chunks l, l + 32, ... in order and the warp merges by a
//     butterfly (many chunks per output, or chunks contiguous per output);
//   * kBlockThreads: thread t combines chunks t, t + 256, ... in order and the block merges
//     by cub::BlockReduce (thousands of chunks for a few outputs, as in a whole-array
//     reduction: 16 loads per thread instead of 128 per lane of one warp).
// Every order is fixed by (chunks, width), so results depend on the shape alone.

// Member `first` of a group of `step` threads: the partials of chunks first, first + step,
// ... of the output at `base`, combined in that order. Four loads are issued before any
// is combined, since the partials are latency-bound L2 reads.
template <class Op>
__device__ __forceinline__ typename Op::Acc CombineChunks(const typename Op::Acc* __restrict__ partial,
                                                         int64_t base, int64_t first, int64_t chunks,
                                                         int64_t step, int64_t chunk_stride) {
  using Acc = typename Op::Acc;
  Acc acc = Op::Identity();
  int64_t c = first;
  for (; c + 3 * step < chunks; c += 4 * step) {
    Acc x[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) x[u] = partial[base + (c + u * step) * chunk_stride];
#pragma unroll
    for (int u = 0; u < 4; ++u) acc = Op::Combine(acc, x[u]);
  }
  for (; c < chunks; c += step) acc = Op::Combine(acc, partial[base + c * chunk_stride]);
  return acc;
}

template <class Op>
__global__ void __launch_bounds__(kBlockThreads)
    CombinePartialsKernel(const typename Op::Acc* __restrict__ partial, int64_t outputs,
                          int64_t chunks, int64_t output_stride, int64_t chunk_stride, int width,
                          int64_t extent, typename Op::Out* __restrict__ out) {
  using Acc = typename Op::Acc;
  using BlockReduce = cub::BlockReduce<Acc, kBlockThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  const int t = static_cast<int>(threadIdx.x);
  if (width == kBlockThreads) {
    for (int64_t j = blockIdx.x; j < outputs; j += gridDim.x) {
      const Acc acc = CombineChunks<Op>(partial, j * output_stride, t, chunks, kBlockThreads, chunk_stride);
      const Acc total = BlockReduce(temp).Reduce(acc, CombineFn<Op>{});
      if (t == 0) out[j] = Op::Finalize(total, extent);
      __syncthreads();  // temp is reused by the next output
    }
  } else if (width == 32) {
    constexpr int kWarps = kBlockThreads / 32;
    const int lane = t % 32;
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * kWarps + t / 32; j < outputs;
         j += static_cast<int64_t>(gridDim.x) * kWarps) {
      Acc acc = CombineChunks<Op>(partial, j * output_stride, lane, chunks, 32, chunk_stride);
      acc = GroupCombine<Op>(acc, 32);
      if (lane == 0) out[j] = Op::Finalize(acc, extent);
    }
  } else {
    for (int64_t j = static_cast<int64_t>(blockIdx.x) * kBlockThreads + t; j < outputs;
         j += static_cast<int64_t>(gridDim.x) * kBlockThreads) {
      Acc acc = partial[j * output_stride];
      for (int64_t c = 1; c < chunks; ++c) {
        acc = Op::Combine(acc, partial[j * output_stride + c * chunk_stride]);
      }
      out[j] = Op::Finalize(acc, extent);
    }
  }
}

}  // namespace gpucompute::cuda::detail

#endif  // GPUCOMPUTE_KERNELS_CUDA_DETAIL_REDUCE_KERNELS_CUH_
