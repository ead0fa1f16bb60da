// ReduceStridedAsync: the entry point, the plan and the dispatch of reductions over any
// axes of strided arrays. The kernels are in kernels/cuda/detail/reduce_strided_kernels.cuh
// (shared with the NVRTC-generated reductions of expressions), the operators in
// kernels/reduce_ops.h.
//
// The plan permutes the kept (output) axes outermost and the reduced axes innermost, each
// group in its own C order, drops extent-1 axes and merges neighbours that every operand
// steps over as over one axis. Then, by the strides' pattern:
//   * kDense: one array that is exactly ReduceAsync's [outer, extent, inner] from some
//     offset (a C-contiguous array reduced over its last, first or middle axes, or a
//     contiguous block of one): ReduceAsync's kernels, 16-byte loads and all.
//   * kRows: no kept axes, or an innermost reduced stride no larger than any kept one
//     (row reductions, whole arrays): a warp per output and chunk, coalesced along
//     unit-stride rows.
//   * kColumns: otherwise (column reductions): a thread per output and chunk, the kept
//     axis of smallest stride innermost so that neighbouring threads read neighbouring
//     elements, the reduced range cut into chunks when the outputs alone cannot fill the
//     GPU.
// Both general paths gather through any strides (negative, 0 for broadcast) with fixed
// chunking, and merge chunk partials with MergeChunks.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "kernels/cuda/detail/launch.cuh"
#include "kernels/cuda/detail/reduce_strided_kernels.cuh"
#include "kernels/cuda/kernels.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/reduce_ops.h"

namespace gpucompute::cuda {
namespace detail {
namespace {

// Plan constants. Changing any of them changes the association order of float sums (and
// so their last bits); results depend on nothing else. Constants, not the SM count, so
// that the chunking is the same on every device.
// kRows: warps the chunking aims for (a few waves of 8 blocks of 8 warps on a 132-SM
// H100), and the fewest values of a chunk (256 per lane).
constexpr int64_t kRowTargetWarps = 8192;
constexpr int64_t kRowMinChunk = 8192;
// kColumns: threads the chunking aims for (about a wave of 2048 threads on 132 SMs), and
// the fewest values per thread of a chunk.
constexpr int64_t kColumnTargetThreads = 262144;
constexpr int64_t kColumnMinChunk = 64;
// Chunks per output above which a block, not a warp, merges an output's partials.
constexpr int64_t kBlockMergeMinChunks = 512;
// Grid-stride kernels get at most this many blocks per SM.
constexpr int kBlocksPerSm = 32;

// One axis of a group: its extent and every operand's stride on it.
struct Axis {
  int64_t extent;
  std::vector<int64_t> strides;
};

// Merges neighbours (outer a, inner b) where every operand's stride on a is b's extent
// times its stride on b; drops extent-1 axes. C order within the group is kept.
std::vector<Axis> Coalesce(std::vector<Axis> axes) {
  std::vector<Axis> out;
  for (Axis& axis : axes) {
    if (axis.extent == 1) continue;
    if (!out.empty()) {
      Axis& prev = out.back();
      bool merge = true;
      for (size_t a = 0; a < axis.strides.size(); ++a) {
        merge = merge && prev.strides[a] == axis.strides[a] * axis.extent;
      }
      if (merge) {
        prev.extent *= axis.extent;
        prev.strides = axis.strides;
        continue;
      }
    }
    out.push_back(std::move(axis));
  }
  return out;
}

// kDense when one operand's coalesced layout is [outer, extent, inner] of ReduceAsync.
bool MatchDense(const std::vector<Axis>& kept, const std::vector<Axis>& reduced,
                ReduceShape* shape) {
  if (reduced.size() != 1 || kept.size() > 2) return false;
  const int64_t extent = reduced[0].extent;
  const int64_t stride = reduced[0].strides[0];
  size_t outer_axes = kept.size();
  int64_t inner = 1;
  if (!kept.empty() && kept.back().strides[0] == 1 && stride == kept.back().extent) {
    inner = kept.back().extent;
    --outer_axes;
  } else if (stride != 1) {
    return false;
  }
  int64_t outer = 1;
  if (outer_axes == 2) return false;
  if (outer_axes == 1) {
    if (kept[0].strides[0] != extent * inner) return false;
    outer = kept[0].extent;
  }
  *shape = ReduceShape{outer, extent, inner};
  return true;
}

int64_t AbsSum(const std::vector<int64_t>& v) {
  int64_t sum = 0;
  for (int64_t x : v) sum += std::llabs(x);
  return sum;
}

template <class Op>
__global__ void __launch_bounds__(kStridedThreads)
    MergeChunksKernel(const typename Op::Acc* __restrict__ partial, long long outputs,
                      long long chunks, long long output_stride, long long chunk_stride, int width,
                      long long extent, double ddof, typename Op::Out* __restrict__ out) {
  MergeChunks<Op>(partial, outputs, chunks, output_stride, chunk_stride, width, extent, ddof, out);
}

// A plain reduction's value: one array's element.
template <typename In>
struct ArrayLoad {
  const In* data;
  __device__ __forceinline__ In operator()(const long long* off) const { return data[off[0]]; }
};

template <class Op>
__global__ void __launch_bounds__(kStridedThreads, kStridedMinBlocksPerSm)
    RowKernel(const __grid_constant__ StridedReduceGeometry<1> g, ArrayLoad<typename Op::In> load,
              typename Op::Acc* __restrict__ partial, typename Op::Out* __restrict__ out) {
  RowReduce<Op>(g, load, partial, out);
}

template <class Op>
__global__ void __launch_bounds__(kStridedThreads, kStridedMinBlocksPerSm)
    ColumnKernel(const __grid_constant__ StridedReduceGeometry<1> g,
                 ArrayLoad<typename Op::In> load,
                 typename Op::Acc* __restrict__ partial, typename Op::Out* __restrict__ out) {
  ColumnReduce<Op>(g, load, partial, out);
}

template <class Op>
cudaError_t Run(const StridedReducePlan& plan, StridedReduceLaunch launch, const void* context,
                void* out_bytes, cudaMemPool_t pool, cudaStream_t stream) {
  using Acc = typename Op::Acc;
  using Out = typename Op::Out;
  auto* out = static_cast<Out*>(out_bytes);
  if (plan.outputs <= 0) return cudaSuccess;
  if (plan.extent <= 0) {
    // Empty sums, products, means and norms: computed by the same host expression as on
    // the CPU, so that even a NaN's bits agree.
    const Out value = reduce::Finish<Op>(Op::Identity(), 0, plan.ddof);
    uint64_t bits = 0;
    std::memcpy(&bits, &value, sizeof(Out));
    return FillAsync(out, SameSizeDType<Out>(), bits, plan.outputs, stream);
  }
  const int64_t items = plan.outputs * plan.chunks;
  const int64_t per_block = plan.path == StridedReducePath::kRows ? kStridedThreads / 32
                                                                  : kStridedThreads;
  unsigned grid = 0;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      GridStrideBlocks(CeilDiv(items, per_block), kBlocksPerSm, &grid));
  if (plan.chunks == 1) return launch(context, nullptr, grid);

  PoolScratch scratch(pool, stream);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(scratch.Allocate(static_cast<size_t>(items) * sizeof(Acc)));
  Acc* partial = static_cast<Acc*>(scratch.get());
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(launch(context, partial, grid));
  // kRows writes partial[o * chunks + c], kColumns partial[c * outputs + o].
  const bool rows = plan.path == StridedReducePath::kRows;
  const int64_t output_stride = rows ? plan.chunks : 1;
  const int64_t chunk_stride = rows ? 1 : plan.outputs;
  const int width = plan.chunks >= kBlockMergeMinChunks ? kStridedThreads : 32;
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      GridStrideBlocks(CeilDiv(plan.outputs, kStridedThreads / width), kBlocksPerSm, &grid));
  MergeChunksKernel<Op><<<grid, kStridedThreads, 0, stream>>>(
      partial, plan.outputs, plan.chunks, output_stride, chunk_stride, width, plan.extent, plan.ddof, out);
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(cudaGetLastError());
  return scratch.Free();
}

// The plain reduction's launch context.
struct PlainContext {
  StridedReduceGeometry<1> geometry;
  const void* data;
  void* out;
  StridedReducePath path;
  cudaStream_t stream;
};

template <class Op>
cudaError_t LaunchPlain(const void* context, void* partial, unsigned grid) {
  const auto& c = *static_cast<const PlainContext*>(context);
  const ArrayLoad<typename Op::In> load{static_cast<const typename Op::In*>(c.data)};
  auto* acc = static_cast<typename Op::Acc*>(partial);
  auto* out = static_cast<typename Op::Out*>(c.out);
  if (c.path == StridedReducePath::kRows) {
    RowKernel<Op><<<grid, kStridedThreads, 0, c.stream>>>(c.geometry, load, acc, out);
  } else {
    ColumnKernel<Op><<<grid, kStridedThreads, 0, c.stream>>>(c.geometry, load, acc, out);
  }
  return cudaGetLastError();
}

bool Selects(ReduceKind kind) {
  return kind == ReduceKind::kMin || kind == ReduceKind::kMax || kind == ReduceKind::kArgmin ||
         kind == ReduceKind::kArgmax;
}

}  // namespace
}  // namespace detail

cudaError_t PlanStridedReduce(const std::vector<int64_t>& shape, const std::vector<int32_t>& axes,
                              const std::vector<const StridedOperand*>& operands, bool allow_dense,
                              StridedReducePlan* plan) {
  using detail::Axis;
  const size_t ndim = shape.size();
  if (ndim > kStridedReduceMaxDims || operands.empty()) return cudaErrorInvalidValue;
  for (const StridedOperand* operand : operands) {
    if (operand->strides.size() != ndim) return cudaErrorInvalidValue;
  }
  std::vector<bool> reduced_axis(ndim, false);
  for (size_t i = 0; i < axes.size(); ++i) {
    if (axes[i] < 0 || static_cast<size_t>(axes[i]) >= ndim || (i > 0 && axes[i] <= axes[i - 1])) {
      return cudaErrorInvalidValue;
    }
    reduced_axis[axes[i]] = true;
  }
  std::vector<Axis> kept;
  std::vector<Axis> reduced;
  for (size_t d = 0; d < ndim; ++d) {
    Axis axis{shape[d], {}};
    for (const StridedOperand* operand : operands) axis.strides.push_back(operand->strides[d]);
    (reduced_axis[d] ? reduced : kept).push_back(std::move(axis));
  }
  StridedReducePlan p;
  for (const Axis& axis : kept) p.outputs *= axis.extent;
  for (const Axis& axis : reduced) p.extent *= axis.extent;
  kept = detail::Coalesce(std::move(kept));
  reduced = detail::Coalesce(std::move(reduced));
  if (reduced.empty()) reduced.push_back(Axis{1, std::vector<int64_t>(operands.size(), 0)});
  // The outputs' C-order strides of the coalesced kept axes.
  std::vector<int64_t> out_strides(kept.size(), 1);
  for (int d = static_cast<int>(kept.size()) - 2; d >= 0; --d) {
    out_strides[d] = out_strides[d + 1] * kept[d + 1].extent;
  }
  for (const StridedOperand* operand : operands) p.offsets.push_back(operand->offset);

  if (allow_dense && operands.size() == 1 && detail::MatchDense(kept, reduced, &p.dense)) {
    p.path = StridedReducePath::kDense;
  } else if (kept.empty()) {
    p.path = StridedReducePath::kRows;
  } else {
    // Rows unless some kept axis has smaller strides than the innermost reduced one; then
    // columns, threads along that kept axis.
    size_t finest = 0;
    for (size_t d = 1; d < kept.size(); ++d) {
      if (detail::AbsSum(kept[d].strides) < detail::AbsSum(kept[finest].strides)) finest = d;
    }
    p.path = detail::AbsSum(reduced.back().strides) <= detail::AbsSum(kept[finest].strides)
                 ? StridedReducePath::kRows
                 : StridedReducePath::kColumns;
    if (p.path == StridedReducePath::kColumns) {
      std::rotate(kept.begin() + finest, kept.begin() + finest + 1, kept.end());
      std::rotate(out_strides.begin() + finest, out_strides.begin() + finest + 1,
                  out_strides.end());
    }
  }
  p.kept_out_strides = out_strides;
  p.kept_strides.assign(operands.size(), {});
  p.reduced_strides.assign(operands.size(), {});
  for (const Axis& axis : kept) {
    p.kept_shape.push_back(axis.extent);
    for (size_t a = 0; a < operands.size(); ++a) p.kept_strides[a].push_back(axis.strides[a]);
  }
  for (const Axis& axis : reduced) {
    p.reduced_shape.push_back(axis.extent);
    for (size_t a = 0; a < operands.size(); ++a) p.reduced_strides[a].push_back(axis.strides[a]);
  }

  // Chunks: enough work items to fill any current GPU, none shorter than the path's least.
  const bool rows = p.path == StridedReducePath::kRows;
  const int64_t target = rows ? detail::kRowTargetWarps : detail::kColumnTargetThreads;
  const int64_t least = rows ? detail::kRowMinChunk : detail::kColumnMinChunk;
  if (p.outputs > 0 && p.extent > 0) {
    const int64_t wanted = std::max<int64_t>(
        1, std::min(detail::CeilDiv(target, p.outputs), p.extent / least));
    p.chunk_len = detail::CeilDiv(p.extent, wanted);
    p.chunks = detail::CeilDiv(p.extent, p.chunk_len);
  }
  *plan = std::move(p);
  return cudaSuccess;
}

std::vector<uint64_t> StridedReduceGeometryBytes(const StridedReducePlan& plan, int arrays) {
  // StridedReduceGeometry<arrays>: two ints in one word, then 8-byte fields in order.
  std::vector<uint64_t> w;
  w.push_back(static_cast<uint32_t>(plan.kept_shape.size()) |
              static_cast<uint64_t>(static_cast<uint32_t>(plan.reduced_shape.size())) << 32);
  auto dims = [&](const std::vector<int64_t>& v) {
    for (int d = 0; d < kStridedReduceMaxDims; ++d) {
      w.push_back(static_cast<uint64_t>(d < static_cast<int>(v.size()) ? v[d] : 0));
    }
  };
  auto per_array = [&](const std::vector<std::vector<int64_t>>& strides) {
    const std::vector<int64_t> none;
    for (int a = 0; a < arrays; ++a) dims(a < static_cast<int>(strides.size()) ? strides[a] : none);
  };
  dims(plan.kept_shape);
  dims(plan.reduced_shape);
  dims(plan.kept_out_strides);
  per_array(plan.kept_strides);
  per_array(plan.reduced_strides);
  for (int a = 0; a < arrays; ++a) {
    w.push_back(static_cast<uint64_t>(a < static_cast<int>(plan.offsets.size()) ? plan.offsets[a] : 0));
  }
  for (int64_t v : {plan.outputs, plan.extent, plan.chunk_len, plan.chunks}) {
    w.push_back(static_cast<uint64_t>(v));
  }
  uint64_t ddof_bits = 0;
  std::memcpy(&ddof_bits, &plan.ddof, sizeof(ddof_bits));
  w.push_back(ddof_bits);
  return w;
}

// The layout StridedReduceGeometryBytes writes.
static_assert(offsetof(detail::StridedReduceGeometry<2>, kept_shape) == 8);
static_assert(offsetof(detail::StridedReduceGeometry<2>, kept_strides) == 8 * 25);
static_assert(offsetof(detail::StridedReduceGeometry<2>, offsets) == 8 * (25 + 4 * 8));
static_assert(sizeof(detail::StridedReduceGeometry<2>) == 8 * (25 + 4 * 8 + 2 + 5));
static_assert(sizeof(detail::StridedReduceGeometry<1>) == 8 * (25 + 2 * 8 + 1 + 5));

cudaError_t RunStridedReduce(ReduceKind kind, DType value_dtype, const StridedReducePlan& plan,
                             StridedReduceLaunch launch, const void* context, void* out,
                             cudaMemPool_t pool, cudaStream_t stream) {
  // Min, max, argmin and argmax of nothing are undefined; the caller rejects them.
  if (detail::Selects(kind) && plan.extent <= 0 && plan.outputs > 0) return cudaErrorInvalidValue;
  if (plan.path == StridedReducePath::kDense) return cudaErrorInvalidValue;
  return VisitDType(value_dtype, [&](auto zero) {
    return reduce::VisitReduceOp<decltype(zero)>(kind, [&](auto op) {
      return detail::Run<decltype(op)>(plan, launch, context, out, pool, stream);
    });
  });
}

cudaError_t ReduceStridedAsync(ReduceKind kind, DType dtype, const std::vector<int64_t>& shape,
                               const std::vector<int32_t>& axes, const StridedOperand& in,
                               double ddof, void* out, cudaMemPool_t pool, cudaStream_t stream) {
  StridedReducePlan plan;
  // ReduceAsync's kernels serve the kinds of Backend::Reduce only.
  GPUCOMPUTE_KERNEL_RETURN_IF_ERROR(
      PlanStridedReduce(shape, axes, {&in}, IsShapeReduceKind(kind), &plan));
  plan.ddof = ddof;
  if (plan.path == StridedReducePath::kDense) {
    const char* data = static_cast<const char*>(in.data) + in.offset * DTypeSize(dtype);
    return ReduceAsync(kind, dtype, data, plan.dense, out, pool, stream);
  }
  detail::PlainContext context{{}, in.data, out, plan.path, stream};
  const std::vector<uint64_t> geometry = StridedReduceGeometryBytes(plan, 1);
  std::memcpy(static_cast<void*>(&context.geometry), geometry.data(), sizeof(context.geometry));
  StridedReduceLaunch launch = nullptr;
  VisitDType(dtype, [&](auto zero) {
    reduce::VisitReduceOp<decltype(zero)>(kind, [&](auto op) {
      launch = &detail::LaunchPlain<decltype(op)>;
      return 0;
    });
    return 0;
  });
  return RunStridedReduce(kind, dtype, plan, launch, &context, out, pool, stream);
}

}  // namespace gpucompute::cuda
