// Reductions over any set of axes of strided arrays, or of the values of an elementwise
// expression, with the operators of kernels/reduce_ops.h; this file fixes their order.
//
// Combination order (what makes the results deterministic). The outputs are the indices
// of the kept axes in C order. For each output, the reduced axes form a space of M
// positions, numbered in C order; its values are cut into chunks of kChunk consecutive
// positions. Inside a chunk, lane l (of kLanes) folds positions l, l + kLanes, ... in
// order, starting from the identity, and the lanes combine as a balanced tree
// ((0 1)(2 3))((4 5)(6 7)); var and std form a chunk's (count, mean, M2) by two such
// passes instead (the mean, then the squared deviations from it). The chunks of one
// output combine as a balanced tree too:
// neighbours (0 1), (2 3), ... first, then neighbouring pairs, and so on. All of this
// depends on the shape and the reduced axes alone: not on the thread count, nor on the
// inputs' strides or whether the values come from memory or from an expression, so a
// view and its contiguous copy reduce to the same bits.
//
// Work: a task takes kChunksPerSpan consecutive chunks of one output. It reads each input
// in place where the input's reduced positions are contiguous, and otherwise gathers them
// into a small per-thread block; an expression is evaluated over that block by the
// elementwise evaluator (server/cpu/elementwise.h) into another per-thread block, and
// folded from there: one pass over the inputs, no temporary of M values.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/reduce_ops.h"
#include "server/cpu/elementwise.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {
namespace {

constexpr int64_t kChunk = 4096;
constexpr int64_t kChunksPerSpan = 4;
constexpr int64_t kSpan = kChunk * kChunksPerSpan;
constexpr int kLanes = 8;
// A ParallelFor chunk holds at least this many values, so scheduling stays negligible.
constexpr int64_t kTaskValues = int64_t{1} << 16;

using Dims = absl::InlinedVector<int64_t, 8>;

// One input's positions: the start of its memory, its element size, the strides of the
// kept axes, and its reduced axes coalesced (C order kept).
struct InputWalk {
  const std::byte* base = nullptr;  // null: a scalar of the program
  size_t elem_size = 0;
  Dims kept_strides;
  Dims extents;  // reduced, coalesced
  Dims strides;
  bool contiguous = false;  // one reduced axis of stride 1
};

// Copies `len` elements of size sizeof(S), from position `begin` on, of the reduced
// space that `walk` describes (base already at the output's kept offset), to `dst`.
template <typename S>
void GatherTyped(const S* base, const InputWalk& walk, int64_t begin, int64_t len, S* dst) {
  const int nd = static_cast<int>(walk.extents.size());
  Dims idx(nd);
  int64_t off = 0;
  int64_t rest = begin;
  for (int d = nd - 1; d >= 0; --d) {
    idx[d] = rest % walk.extents[d];
    rest /= walk.extents[d];
    off += idx[d] * walk.strides[d];
  }
  const int64_t inner_extent = walk.extents[nd - 1];
  const int64_t inner_stride = walk.strides[nd - 1];
  while (len > 0) {
    const int64_t run = std::min(len, inner_extent - idx[nd - 1]);
    const S* p = base + off;
    for (int64_t i = 0; i < run; ++i) dst[i] = p[i * inner_stride];
    dst += run;
    len -= run;
    off += run * inner_stride;
    idx[nd - 1] += run;
    for (int d = nd - 1; d > 0 && idx[d] == walk.extents[d]; --d) {
      off -= walk.extents[d] * walk.strides[d];
      idx[d] = 0;
      ++idx[d - 1];
      off += walk.strides[d - 1];
    }
  }
}

void Gather(const std::byte* base, const InputWalk& walk, int64_t begin, int64_t len,
            std::byte* dst) {
  switch (walk.elem_size) {
    case 1:
      return GatherTyped(reinterpret_cast<const uint8_t*>(base), walk, begin, len,
                         reinterpret_cast<uint8_t*>(dst));
    case 4:
      return GatherTyped(reinterpret_cast<const uint32_t*>(base), walk, begin, len,
                         reinterpret_cast<uint32_t*>(dst));
    default:
      return GatherTyped(reinterpret_cast<const uint64_t*>(base), walk, begin, len,
                         reinterpret_cast<uint64_t*>(dst));
  }
}

// The lanes' tree of the file comment over per-lane float64 values.
inline double LaneTree(double* lanes) {
  for (int step = 1; step < kLanes; step *= 2) {
    for (int l = 0; l < kLanes; l += 2 * step) lanes[l] += lanes[l + step];
  }
  return lanes[0];
}

// One chunk of var/std: its (count, mean, M2) by two passes over the chunk (which is in
// L1), each summed in the lanes and their tree, rather than by merging every element:
// no division per element, and a more accurate M2 (kernels/reduce_ops.h allows either).
template <class Op>
reduce::Moments ChunkMoments(const typename Op::In* v, int64_t len) {
  double lanes[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += reduce::Widen<double>(v[i + l]);
  }
  for (int l = 0; i < len; ++i, ++l) lanes[l] += reduce::Widen<double>(v[i]);
  const double mean = LaneTree(lanes) / static_cast<double>(len);
  std::fill(lanes, lanes + kLanes, 0.0);
  for (i = 0; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      const double d = reduce::Widen<double>(v[i + l]) - mean;
      lanes[l] += d * d;
    }
  }
  for (int l = 0; i < len; ++i, ++l) {
    const double d = reduce::Widen<double>(v[i]) - mean;
    lanes[l] += d * d;
  }
  return {static_cast<double>(len), mean, LaneTree(lanes)};
}

// One chunk's lanes, folded and combined as the file comment says.
template <class Op>
typename Op::Acc FoldChunk(const typename Op::In* v, int64_t len, int64_t row0) {
  if constexpr (std::is_same_v<typename Op::Acc, reduce::Moments>) return ChunkMoments<Op>(v, len);
  typename Op::Acc lanes[kLanes];
  for (int l = 0; l < kLanes; ++l) lanes[l] = Op::Identity();
  int64_t i = 0;
  for (; i + kLanes <= len; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) {
      lanes[l] = Op::Combine(lanes[l], Op::Convert(v[i + l], row0 + i + l));
    }
  }
  for (int l = 0; i < len; ++i, ++l) lanes[l] = Op::Combine(lanes[l], Op::Convert(v[i], row0 + i));
  for (int step = 1; step < kLanes; step *= 2) {
    for (int l = 0; l < kLanes; l += 2 * step) lanes[l] = Op::Combine(lanes[l], lanes[l + step]);
  }
  return lanes[0];
}

// The balanced tree over p[0, n), in place.
template <class Op>
typename Op::Acc CombineTree(typename Op::Acc* p, int64_t n) {
  for (int64_t step = 1; step < n; step *= 2) {
    for (int64_t i = 0; i + step < n; i += 2 * step) p[i] = Op::Combine(p[i], p[i + step]);
  }
  return p[0];
}

// Per-thread blocks for gathered inputs and evaluated values, kept between calls.
std::byte* ThreadBlock(size_t index) {
  thread_local std::vector<std::unique_ptr<std::byte[]>> blocks;
  while (blocks.size() <= index) {
    blocks.push_back(std::make_unique_for_overwrite<std::byte[]>(kSpan * sizeof(uint64_t)));
  }
  return blocks[index].get();
}

// Evaluates programs over one block on the calling thread: a pool without workers runs
// every ParallelFor inline.
ThreadPool& InlinePool() {
  static ThreadPool* pool = new ThreadPool(1);
  return *pool;
}

struct Geometry {
  std::vector<InputWalk> inputs;
  Dims kept_extents;
  int64_t outputs = 1;
  int64_t reduced = 1;  // M
};

template <class Rule>
void Run(const Geometry& g, const expr::Program* program, DType dtype, double ddof, void* out_v,
         ThreadPool& pool) {
  using In = typename Rule::In;
  using Acc = typename Rule::Acc;
  using Out = typename Rule::Out;
  Out* out = static_cast<Out*>(out_v);
  const int64_t m = g.reduced;
  if (g.outputs <= 0) return;
  if (m <= 0) {
    std::fill(out, out + g.outputs, reduce::Finish<Rule>(Rule::Identity(), 0, ddof));
    return;
  }
  const int64_t spans = (m + kSpan - 1) / kSpan;
  const int64_t chunks = (m + kChunk - 1) / kChunk;
  std::vector<Acc> partial(chunks > 1 ? static_cast<size_t>(g.outputs * chunks) : 0);
  const int64_t task_values = std::min(m, kSpan);
  const int64_t grain = std::max<int64_t>(1, kTaskValues / task_values);

  pool.ParallelFor(g.outputs * spans, grain, [&](int64_t begin_task, int64_t end_task) {
    std::vector<const void*> ptrs(g.inputs.size());
    for (int64_t task = begin_task; task < end_task; ++task) {
      const int64_t o = task / spans;
      const int64_t s = task % spans;
      const int64_t begin = s * kSpan;
      const int64_t len = std::min(kSpan, m - begin);
      // Unravel the output's index over the kept axes once for all inputs.
      Dims kept_index(g.kept_extents.size());
      for (int64_t d = static_cast<int64_t>(g.kept_extents.size()) - 1, rest = o; d >= 0; --d) {
        kept_index[d] = rest % g.kept_extents[d];
        rest /= g.kept_extents[d];
      }
      for (size_t k = 0; k < g.inputs.size(); ++k) {
        const InputWalk& w = g.inputs[k];
        if (w.base == nullptr) {
          ptrs[k] = nullptr;
          continue;
        }
        int64_t off = 0;
        for (size_t d = 0; d < kept_index.size(); ++d) off += kept_index[d] * w.kept_strides[d];
        const std::byte* base = w.base + off * static_cast<int64_t>(w.elem_size);
        if (w.contiguous) {
          ptrs[k] = base + begin * static_cast<int64_t>(w.elem_size);
        } else {
          std::byte* block = ThreadBlock(k);
          Gather(base, w, begin, len, block);
          ptrs[k] = block;
        }
      }
      const In* values;
      if (program != nullptr) {
        std::byte* block = ThreadBlock(g.inputs.size());
        EvaluateElementwise(*program, ptrs, block, dtype, len, InlinePool());
        values = reinterpret_cast<const In*>(block);
      } else {
        values = static_cast<const In*>(ptrs[0]);
      }
      for (int64_t c = 0; c * kChunk < len; ++c) {
        const int64_t c0 = c * kChunk;
        const Acc acc = FoldChunk<Rule>(values + c0, std::min(kChunk, len - c0), begin + c0);
        if (chunks == 1) {
          out[o] = reduce::Finish<Rule>(acc, m, ddof);
        } else {
          partial[o * chunks + s * kChunksPerSpan + c] = acc;
        }
      }
    }
  });
  if (chunks == 1) return;
  pool.ParallelFor(g.outputs, std::max<int64_t>(1, kTaskValues / (chunks * 8)),
                   [&](int64_t begin, int64_t end) {
                     for (int64_t o = begin; o < end; ++o) {
                       out[o] = reduce::Finish<Rule>(
                           CombineTree<Rule>(partial.data() + o * chunks, chunks), m, ddof);
                     }
                   });
}

Geometry MakeGeometry(const expr::Program* program, DType dtype,
                      std::span<const StridedOperand> inputs, std::span<const int64_t> shape,
                      std::span<const int32_t> axes) {
  Geometry g;
  std::vector<bool> reduced(shape.size(), false);
  for (int32_t a : axes) reduced[static_cast<size_t>(a)] = true;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (reduced[d]) {
      g.reduced *= shape[d];
    } else {
      g.kept_extents.push_back(shape[d]);
      g.outputs *= shape[d];
    }
  }
  g.inputs.resize(inputs.size());  // each walk is filled in place
  for (size_t k = 0; k < inputs.size(); ++k) {
    InputWalk& w = g.inputs[k];
    if (inputs[k].data == nullptr) continue;
    const StridedLayout& l = inputs[k].layout;
    DType in_dtype = dtype;
    if (program != nullptr) {
      in_dtype = std::get<expr::ArrayInput>(program->input_types()[k]).dtype;
    }
    w.elem_size = DTypeSize(in_dtype);
    w.base = static_cast<const std::byte*>(inputs[k].data) +
             l.offset * static_cast<int64_t>(w.elem_size);
    StridedLayout r;
    for (size_t d = 0; d < shape.size(); ++d) {
      if (reduced[d]) {
        r.shape.push_back(shape[d]);
        r.strides.push_back(l.strides[d]);
      } else {
        w.kept_strides.push_back(l.strides[d]);
      }
    }
    StridedLayout* one[] = {&r};
    CoalesceAxes(one);
    w.extents.assign(r.shape.begin(), r.shape.end());
    w.strides.assign(r.strides.begin(), r.strides.end());
    if (w.extents.empty()) {  // one position: every reduced extent is 1
      w.extents = {1};
      w.strides = {1};
    }
    w.contiguous = w.extents.size() == 1 && (w.strides[0] == 1 || w.extents[0] <= 1);
  }
  return g;
}

}  // namespace

void ReduceStrided(ReduceKind kind, DType dtype, const expr::Program* program,
                   std::span<const StridedOperand> inputs, std::span<const int64_t> shape,
                   std::span<const int32_t> axes, double ddof, void* out, ThreadPool& pool) {
  const Geometry g = MakeGeometry(program, dtype, inputs, shape, axes);
  VisitDType(dtype, [&](auto zero) {
    reduce::VisitReduceOp<decltype(zero)>(
        kind, [&](auto op) { Run<decltype(op)>(g, program, dtype, ddof, out, pool); });
  });
}

}  // namespace gpucompute::cpu
