// y = alpha * op(A) * x + beta * y on the CPU.
//
// The four (layout x transpose) cases reduce to two loop shapes over contiguous runs of
// A (rows, or columns, lda apart: A may be a view).
// With P = the length of y and K = the length of x:
//   * dot form (row-major A, or column-major A^T): y[p] is the dot product of the
//     contiguous vector A + p * K with x;
//   * axpy form (column-major A, or row-major A^T): y accumulates x[k] times the
//     contiguous vector A + k * P, for k in order, vectorised across p.
// Products are accumulated in float64 for float32 and float64 alike.
//
// Summation order (what makes the results deterministic): K is cut into blocks whose
// size depends only on the shape, each block is summed in a fixed order (the dot form
// uses kDotLanes interleaved accumulators added up in lane order; the axpy form adds
// k in increasing order), and block sums are added in block order. Tasks write disjoint
// outputs or per-block partials, so the result is bitwise the same for any thread count.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"

namespace gpucompute::cpu {
namespace {

// A task multiplies at most this many elements of A, and a ParallelFor chunk at least
// this many (unless A is smaller).
constexpr int64_t kBlockElements = int64_t{1} << 16;
// Interleaved accumulators of one dot product (enough to vectorise and hide latency).
constexpr int kDotLanes = 8;
// The widest run of y one axpy-form task accumulates; its accumulators stay in L1.
constexpr int64_t kAxpyTile = 256;

// Sum of v[k] * x[k] for k < n: k goes to lane k % kDotLanes, lanes are summed 0..7.
template <typename T>
double Dot(const T* v, const T* x, int64_t n) {
  double lane[kDotLanes] = {};
  const int64_t full = n - n % kDotLanes;
  for (int64_t k = 0; k < full; k += kDotLanes) {
    for (int j = 0; j < kDotLanes; ++j) {
      lane[j] += static_cast<double>(v[k + j]) * static_cast<double>(x[k + j]);
    }
  }
  for (int64_t k = full; k < n; ++k) {
    lane[k - full] += static_cast<double>(v[k]) * static_cast<double>(x[k]);
  }
  double sum = 0.0;
  for (int j = 0; j < kDotLanes; ++j) sum += lane[j];
  return sum;
}

// Calls write(p, acc) for every p < P with acc = sum_k A[p, k] x[k] in the dot form, row
// p of A at a + p * lda.
template <typename T, typename Write>
void DotForm(const T* a, int64_t lda, const T* x, int64_t P, int64_t K, ThreadPool& pool,
             const Write& write) {
  // Long dot products are split into blocks so that a single output still spreads over
  // threads; short ones are one block, and a task then handles one whole row.
  const int64_t block = std::min(K, kBlockElements);
  const int64_t blocks = (K + block - 1) / block;
  const int64_t grain = std::max<int64_t>(1, kBlockElements / block);
  if (blocks == 1) {
    pool.ParallelFor(P, grain, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) write(p, Dot(a + p * lda, x, K));
    });
    return;
  }
  std::vector<double> partial(static_cast<size_t>(P * blocks));  // [P][blocks]
  pool.ParallelFor(P * blocks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t p = task / blocks;
      const int64_t k0 = (task % blocks) * block;
      partial[task] = Dot(a + p * lda + k0, x + k0, std::min(block, K - k0));
    }
  });
  for (int64_t p = 0; p < P; ++p) {
    double sum = 0.0;
    for (int64_t b = 0; b < blocks; ++b) sum += partial[p * blocks + b];
    write(p, sum);
  }
}

// Calls write(p, acc) for every p < P with acc = sum_k x[k] A[k, p] in the axpy form, row
// k of A at a + k * lda.
template <typename T, typename Write>
void AxpyForm(const T* a, int64_t lda, const T* x, int64_t P, int64_t K, ThreadPool& pool,
              const Write& write) {
  const int64_t tile = std::min(P, kAxpyTile);
  const int64_t tiles = (P + tile - 1) / tile;
  const int64_t rows_per_block = std::max<int64_t>(1, kBlockElements / tile);
  const int64_t blocks = std::max<int64_t>(1, (K + rows_per_block - 1) / rows_per_block);
  const int64_t task_elements = std::max<int64_t>(1, std::min(K, rows_per_block) * tile);
  const int64_t grain = std::max<int64_t>(1, kBlockElements / task_elements);
  std::vector<double> partial(blocks > 1 ? static_cast<size_t>(blocks * P) : 0);  // [blocks][P]

  pool.ParallelFor(blocks * tiles, grain, [&](int64_t begin, int64_t end) {
    double acc[kAxpyTile];
    for (int64_t task = begin; task < end; ++task) {
      const int64_t p0 = (task % tiles) * tile;
      const int64_t b = task / tiles;
      const int64_t width = std::min(tile, P - p0);
      const int64_t k0 = b * rows_per_block;
      const int64_t k1 = std::min(K, k0 + rows_per_block);
      std::fill(acc, acc + width, 0.0);
      int64_t k = k0;
      // Four k per sweep load and store acc[t] once for four additions, which still
      // happen in k order, so the result is that of one k per sweep.
      for (; k + 4 <= k1; k += 4) {
        const double x0 = static_cast<double>(x[k]);
        const double x1 = static_cast<double>(x[k + 1]);
        const double x2 = static_cast<double>(x[k + 2]);
        const double x3 = static_cast<double>(x[k + 3]);
        const T* r0 = a + k * lda + p0;
        const T* r1 = r0 + lda;
        const T* r2 = r1 + lda;
        const T* r3 = r2 + lda;
        for (int64_t t = 0; t < width; ++t) {
          double sum = acc[t];
          sum += x0 * static_cast<double>(r0[t]);
          sum += x1 * static_cast<double>(r1[t]);
          sum += x2 * static_cast<double>(r2[t]);
          sum += x3 * static_cast<double>(r3[t]);
          acc[t] = sum;
        }
      }
      for (; k < k1; ++k) {
        const double xk = static_cast<double>(x[k]);
        const T* row = a + k * lda + p0;
        for (int64_t t = 0; t < width; ++t) acc[t] += xk * static_cast<double>(row[t]);
      }
      if (blocks == 1) {
        for (int64_t t = 0; t < width; ++t) write(p0 + t, acc[t]);
      } else {
        std::copy(acc, acc + width, partial.begin() + b * P + p0);
      }
    }
  });
  if (blocks == 1) return;
  const int64_t combine_grain = std::max<int64_t>(1, kBlockElements / blocks);
  pool.ParallelFor(P, combine_grain, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      double sum = partial[p];
      for (int64_t b = 1; b < blocks; ++b) sum += partial[b * P + p];
      write(p, sum);
    }
  });
}

template <typename T>
void GemvTyped(const GemvShape& shape, double alpha, const T* a, const T* x, double beta, T* y,
               ThreadPool& pool) {
  const int64_t P = shape.transpose ? shape.cols : shape.rows;  // length of y
  const int64_t K = shape.transpose ? shape.rows : shape.cols;  // length of x
  if (P <= 0) return;
  // beta == 0 must not read y (it may hold garbage or NaN), as in BLAS.
  auto write = [&](int64_t p, double acc) {
    const double scaled = alpha * acc;
    y[p] = static_cast<T>(beta == 0.0 ? scaled : scaled + beta * static_cast<double>(y[p]));
  };
  if (alpha == 0.0 || K <= 0) {
    // As in BLAS, A and x are not referenced: y = beta * y.
    pool.ParallelFor(P, kBlockElements, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) write(p, 0.0);
    });
    return;
  }
  a += shape.a_offset;
  x += shape.x_offset;
  // x at a stride (a view) is gathered once: K elements, beside the P * K of A.
  std::vector<T> gathered;
  if (shape.incx != 1) {
    gathered.resize(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) gathered[k] = x[k * shape.incx];
    x = gathered.data();
  }
  // The stride between the contiguous runs of A: its rows (row-major) or columns.
  const int64_t lda =
      shape.lda != 0 ? shape.lda : (shape.col_major ? shape.rows : shape.cols);
  // Row-major A, or column-major A^T, has the rows of op(A) contiguous.
  if (shape.col_major == shape.transpose) {
    DotForm(a, lda, x, P, K, pool, write);
  } else {
    AxpyForm(a, lda, x, P, K, pool, write);
  }
}

}  // namespace

void Gemv(DType dtype, const GemvShape& shape, double alpha, const void* a, const void* x,
          double beta, void* y, ThreadPool& pool) {
  if (dtype == DType::kFloat32) {
    GemvTyped(shape, alpha, static_cast<const float*>(a), static_cast<const float*>(x), beta,
              static_cast<float*>(y), pool);
  } else if (dtype == DType::kFloat64) {
    GemvTyped(shape, alpha, static_cast<const double*>(a), static_cast<const double*>(x), beta,
              static_cast<double*>(y), pool);
  }
  // Other dtypes are rejected by the caller.
}

}  // namespace gpucompute::cpu
