// Reductions over the middle axis of an [outer, extent, inner] array, with the operators
// and types of kernels/reduce_ops.h; this file fixes the order in which they combine.
//
// Summation order (what makes the results deterministic). For every output (o, i) the
// extent axis is cut into blocks of rows_per_block = max(1, 2^16 / tile) rows, where
// tile = min(inner, 256) is the width of the inner tile one task handles. Each block is
// reduced on its own (below) and the block results are combined in block order. Inside
// a block:
//   * by default rows are accumulated one after another, in row order, into one
//     accumulator per inner position (vectorised across inner);
//   * except for argmin/argmax, when inner < 16 and extent >= 4 * m with
//     m = ceil(16 / inner): m consecutive rows are viewed as one row of inner * m
//     lanes; lane s * inner + i accumulates rows r0 + s, r0 + s + m, ... in order, the
//     rows left over after the last full group of m go to lane i, and the m lanes of
//     position i are then combined in lane order s = 0, 1, ..., m - 1.
// All of this depends on the shape only. Tasks are independent and write disjoint
// outputs or per-block partials, so the result is bitwise the same for any thread
// count. Only float sums, means, norms and products depend on the order at all; integer
// arithmetic wraps modulo 2^64 (unsigned, so no undefined behaviour) and is exact, and
// min/max/argmin/argmax select an element.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/reduce_ops.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {
namespace {

// A task reduces at most this many elements, and a ParallelFor chunk at least this
// many (unless the whole reduction is smaller), so scheduling costs stay negligible.
constexpr int64_t kBlockElements = int64_t{1} << 16;
// The widest inner tile one task accumulates; its accumulators stay in L1.
constexpr int64_t kMaxTile = 256;
// Minimum accumulator lanes for narrow (inner < kLanes) reductions.
constexpr int64_t kLanes = 16;

// The loops below over an operator of kernels/reduce_ops.h. Start begins an accumulator
// at the first row of a block; Add takes the rows of one accumulator in increasing
// order, after Start (or, with kFoldRows, after Identity); Combine merges a later
// accumulator into an earlier one. kFoldRows: whether the narrow lane folding may be
// used, which needs an operator that ignores row indices.
template <class Rule>
struct CpuOp {
  using In = typename Rule::In;
  using Acc = typename Rule::Acc;
  using Out = typename Rule::Out;
  static constexpr bool kFoldRows = !Rule::kUsesRow;
  static Acc Identity() { return Rule::Identity(); }
  static void Start(Acc& a, In x, int64_t row) {
    a = Rule::Combine(Rule::Identity(), Rule::Convert(x, row));
  }
  static void Add(Acc& a, In x, int64_t row) {
    if constexpr (requires { Rule::Append(a, x, row); }) {
      static_assert(!kFoldRows, "Append needs an accumulator begun by Start");
      a = Rule::Append(a, x, row);
    } else {
      a = Rule::Combine(a, Rule::Convert(x, row));
    }
  }
  static void Combine(Acc& a, const Acc& b) { a = Rule::Combine(a, b); }
  static Out Finalize(const Acc& a, int64_t extent) { return Rule::Finalize(a, extent); }
};

// acc[t] (+)= base[r * stride + t] for r < rows and t < width, rows in order. `row0` is
// the extent index of the first row, for the arg ops.
template <class Op>
void AccumulateRows(const typename Op::In* base, int64_t stride, int64_t rows, int64_t width,
                    int64_t row0, typename Op::Acc* acc) {
  using In = typename Op::In;
  int64_t r = 0;
  // Four rows per sweep load and store acc[t] once for four additions, which still
  // happen in row order, so the result is that of one row per sweep.
  for (; r + 4 <= rows; r += 4) {
    const In* p0 = base + r * stride;
    const In* p1 = p0 + stride;
    const In* p2 = p1 + stride;
    const In* p3 = p2 + stride;
    const int64_t row = row0 + r;
    for (int64_t t = 0; t < width; ++t) {
      typename Op::Acc a = acc[t];
      Op::Add(a, p0[t], row);
      Op::Add(a, p1[t], row + 1);
      Op::Add(a, p2[t], row + 2);
      Op::Add(a, p3[t], row + 3);
      acc[t] = a;
    }
  }
  for (; r < rows; ++r) {
    const In* p = base + r * stride;
    for (int64_t t = 0; t < width; ++t) Op::Add(acc[t], p[t], row0 + r);
  }
}

// The same with a compile-time width, so the accumulators live in registers.
template <class Op, int kWidth>
void AccumulateRowsFixed(const typename Op::In* base, int64_t rows, typename Op::Acc* acc) {
  typename Op::Acc local[kWidth];
  for (int t = 0; t < kWidth; ++t) local[t] = acc[t];
  for (int64_t r = 0; r < rows; ++r) {
    const typename Op::In* row = base + r * kWidth;
    for (int t = 0; t < kWidth; ++t) Op::Add(local[t], row[t], 0);
  }
  for (int t = 0; t < kWidth; ++t) acc[t] = local[t];
}

template <class Op>
void RunReduce(const typename Op::In* in, const ReduceShape& shape, typename Op::Out* out,
               ThreadPool& pool) {
  using Acc = typename Op::Acc;
  const int64_t outer = shape.outer;
  const int64_t extent = shape.extent;
  const int64_t inner = shape.inner;
  if (outer <= 0 || inner <= 0) return;
  if (extent <= 0) {
    // Only sum, prod, mean and norm2 get here: 0, 1, NaN and 0.
    std::fill(out, out + outer * inner, Op::Finalize(Op::Identity(), 0));
    return;
  }

  // Folding needs a few full groups of rows to pay off.
  const int64_t narrow_fold = (kLanes + inner - 1) / inner;
  const bool narrow = Op::kFoldRows && inner < kLanes && extent >= 4 * narrow_fold;
  const int64_t fold = narrow ? narrow_fold : 1;  // m in the file comment
  const int64_t tile = std::min(inner, kMaxTile);
  const int64_t tiles = (inner + tile - 1) / tile;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElements / tile);
  const int64_t blocks = (extent + rows_per_block - 1) / rows_per_block;
  const int64_t task_elements = std::min(extent, rows_per_block) * tile;
  const int64_t grain = std::max<int64_t>(1, kBlockElements / task_elements);

  // Per-block results for outputs whose extent spans several blocks: [outer][blocks][inner].
  std::vector<Acc> partial(blocks > 1 ? static_cast<size_t>(outer * blocks * inner) : 0);

  pool.ParallelFor(outer * blocks * tiles, grain, [&](int64_t begin, int64_t end) {
    Acc acc[kMaxTile];
    // task = (o * blocks + block) * tiles + tile_index, stepped without divisions.
    int64_t tile_index = begin % tiles;
    int64_t block = (begin / tiles) % blocks;
    int64_t o = begin / tiles / blocks;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i0 = tile_index * tile;
      const int64_t width = std::min(tile, inner - i0);
      const int64_t r0 = block * rows_per_block;
      const int64_t rows = std::min(extent, r0 + rows_per_block) - r0;
      const typename Op::In* base = in + (o * extent + r0) * inner + i0;
      if (narrow) {
        const int64_t lanes = inner * fold;
        const int64_t groups = rows / fold;
        std::fill(acc, acc + lanes, Op::Identity());
        if (lanes == kLanes) {
          AccumulateRowsFixed<Op, kLanes>(base, groups, acc);
        } else {
          AccumulateRows<Op>(base, lanes, groups, lanes, 0, acc);
        }
        AccumulateRows<Op>(base + groups * lanes, inner, rows - groups * fold, inner, 0, acc);
        for (int64_t s = 1; s < fold; ++s) {
          for (int64_t t = 0; t < inner; ++t) Op::Combine(acc[t], acc[s * inner + t]);
        }
      } else {
        for (int64_t t = 0; t < width; ++t) Op::Start(acc[t], base[t], r0);
        AccumulateRows<Op>(base + inner, inner, rows - 1, width, r0 + 1, acc);
      }
      if (blocks == 1) {
        typename Op::Out* dst = out + o * inner + i0;
        for (int64_t t = 0; t < width; ++t) dst[t] = Op::Finalize(acc[t], extent);
      } else {
        std::copy(acc, acc + width, partial.begin() + (o * blocks + block) * inner + i0);
      }
      if (++tile_index == tiles) {
        tile_index = 0;
        if (++block == blocks) {
          block = 0;
          ++o;
        }
      }
    }
  });
  if (blocks == 1) return;

  const int64_t combine_grain = std::max<int64_t>(1, kBlockElements / (blocks * tile));
  pool.ParallelFor(outer * tiles, combine_grain, [&](int64_t begin, int64_t end) {
    Acc acc[kMaxTile];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i0 = (task % tiles) * tile;
      const int64_t o = task / tiles;
      const int64_t width = std::min(tile, inner - i0);
      const Acc* src = partial.data() + o * blocks * inner + i0;
      std::copy(src, src + width, acc);
      for (int64_t block = 1; block < blocks; ++block) {
        src += inner;
        for (int64_t t = 0; t < width; ++t) Op::Combine(acc[t], src[t]);
      }
      typename Op::Out* dst = out + o * inner + i0;
      for (int64_t t = 0; t < width; ++t) dst[t] = Op::Finalize(acc[t], extent);
    }
  });
}

template <class Rule>
void Run(const void* in, const ReduceShape& shape, void* out, ThreadPool& pool) {
  RunReduce<CpuOp<Rule>>(static_cast<const typename Rule::In*>(in), shape,
                         static_cast<typename Rule::Out*>(out), pool);
}

}  // namespace

void Reduce(ReduceKind kind, DType in_dtype, const void* in, const ReduceShape& shape, void* out,
            ThreadPool& pool) {
  VisitDType(in_dtype, [&](auto zero) {
    reduce::VisitReduceOp<decltype(zero), /*kShapeKindsOnly=*/true>(
        kind, [&](auto op) { Run<decltype(op)>(in, shape, out, pool); });
  });
}

}  // namespace gpucompute::cpu
