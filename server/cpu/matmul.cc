// Matmul on the CPU backend, through the system's BLAS (OpenBLAS's cblas_sgemm and
// cblas_dgemm); no GEMM of our own.
//
// Threads. The backend runs its kernels on its ThreadPool, and several streams may run
// kernels at once. OpenBLAS has a thread pool of its own, and letting both run would
// oversubscribe the cores (OpenBLAS's threads also spin for a while after each call,
// taking cores from the pool's next kernel), make a long product impossible to stop
// between chunks at shutdown, and make the rounding depend on how OpenBLAS split the
// work among its threads. So OpenBLAS runs one thread per call (openblas_set_num_threads
// (1), process-wide, when it is opened), and the parallelism is the pool's: C is cut into tiles, each
// tile of each matrix of the batch one chunk of a ParallelFor and one BLAS call over the
// whole of k. The tiles depend on the shape alone, so results do not depend on the
// thread count. OpenBLAS's single-threaded calls are safe from several threads at once.
//
// Loading. OpenBLAS is opened with dlopen at the first matmul rather than linked: its
// 60 KiB of thread-local storage would otherwise be static TLS, which glibc carves out
// of every thread's stack, and threads started with small stacks (the metrics
// endpoint's civetweb workers) then overflow them. Opened later, its TLS is allocated
// apart, and only by the threads that use it.
#include "server/cpu/matmul.h"

#include <cblas.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdint>

#include "absl/strings/str_cat.h"

namespace gpucompute::cpu {
namespace {

// The library's soname, as Debian's libopenblas0 installs it.
constexpr char kOpenBlas[] = "libopenblas.so.0";

struct OpenBlas {
  decltype(&cblas_sgemm) sgemm = nullptr;
  decltype(&cblas_dgemm) dgemm = nullptr;
};

absl::StatusOr<OpenBlas> Open() {
  void* library = dlopen(kOpenBlas, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("matmul on the CPU backend needs OpenBLAS (", kOpenBlas,
                     "; Debian: libopenblas0): ", dlerror()));
  }
  OpenBlas blas;
  blas.sgemm = reinterpret_cast<decltype(&cblas_sgemm)>(dlsym(library, "cblas_sgemm"));
  blas.dgemm = reinterpret_cast<decltype(&cblas_dgemm)>(dlsym(library, "cblas_dgemm"));
  auto set_threads = reinterpret_cast<decltype(&openblas_set_num_threads)>(
      dlsym(library, "openblas_set_num_threads"));
  if (blas.sgemm == nullptr || blas.dgemm == nullptr || set_threads == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(kOpenBlas, " lacks cblas_sgemm, cblas_dgemm or openblas_set_num_threads"));
  }
  set_threads(1);
  return blas;
}

// Opened once, for the life of the process (never closed: calls may be under way).
const absl::StatusOr<OpenBlas>& Loaded() {
  static const absl::StatusOr<OpenBlas>* const loaded = new absl::StatusOr<OpenBlas>(Open());
  return *loaded;
}

// The largest tile edge, and the smallest: tiles shrink from the largest until the batch
// has kMinTiles of them, so that a product of a few large matrices still spreads over
// several threads, while each BLAS call stays large enough to run at its full speed.
// Every tile packs its rows of A and its columns of B again, so halving the edge doubles
// that work (docs/performance.md has what it cost at 1024²). The tiles depend on the
// shape alone, never on the thread count (their edges could change OpenBLAS's rounding),
// so a host of many cores runs a 1024² product on 4 of them; from 2048² on there are 16
// tiles or more.
constexpr int64_t kMaxTileEdge = 512;
constexpr int64_t kMinTileEdge = 128;
constexpr int64_t kMinTiles = 4;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

int64_t TileEdge(const MatmulShape& shape) {
  int64_t edge = kMaxTileEdge;
  while (edge > kMinTileEdge &&
         shape.batch * CeilDiv(shape.m, edge) * CeilDiv(shape.n, edge) < kMinTiles) {
    edge /= 2;
  }
  return edge;
}

CBLAS_TRANSPOSE Op(bool transposed) { return transposed ? CblasTrans : CblasNoTrans; }

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha,
          const float* a, int64_t lda, const float* b, int64_t ldb, double beta, float* c,
          int64_t ldc) {
  Loaded()->sgemm(CblasColMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), static_cast<float>(alpha), a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), static_cast<float>(beta), c, static_cast<blasint>(ldc));
}

void Gemm(CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int64_t m, int64_t n, int64_t k, double alpha,
          const double* a, int64_t lda, const double* b, int64_t ldb, double beta, double* c,
          int64_t ldc) {
  Loaded()->dgemm(CblasColMajor, ta, tb, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(lda), b,
              static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

// One tile: C[r0:r0+rows, c0:c0+cols] of one matrix of the batch, whose operands start
// at a, b and c.
template <typename T>
void Tile(const MatmulShape& s, double alpha, const T* a, const T* b, double beta, T* c,
          int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  a += r0 * s.a.row_stride;
  b += c0 * s.b.col_stride;
  c += r0 * s.c.row_stride + c0 * s.c.col_stride;
  BlasMatrix ma = ToBlasMatrix(rows, s.k, s.a.row_stride, s.a.col_stride);
  BlasMatrix mb = ToBlasMatrix(s.k, cols, s.b.row_stride, s.b.col_stride);
  const BlasMatrix mc = ToBlasMatrix(rows, cols, s.c.row_stride, s.c.col_stride);
  if (s.k == 0) {
    // Nothing of A or B is read, but BLAS still checks their leading dimensions.
    ma = {false, std::max<int64_t>(rows, 1)};
    mb = {false, 1};
  }
  if (!mc.transposed) {
    Gemm(Op(ma.transposed), Op(mb.transposed), rows, cols, s.k, alpha, a, ma.ld, b, mb.ld, beta,
         c, mc.ld);
  } else {
    // C is stored transposed (row-major): C^T = B^T A^T, in which an operand stored as
    // itself is the one to transpose.
    Gemm(Op(!mb.transposed), Op(!ma.transposed), cols, rows, s.k, alpha, b, mb.ld, a, ma.ld, beta,
         c, mc.ld);
  }
}

template <typename T>
void TypedMatmul(const MatmulShape& s, double alpha, const T* a, const T* b, double beta, T* c,
                 ThreadPool& pool) {
  const int64_t edge = TileEdge(s);
  const int64_t tile_rows = CeilDiv(s.m, edge);
  const int64_t tile_cols = CeilDiv(s.n, edge);
  const int64_t per_matrix = tile_rows * tile_cols;
  pool.ParallelFor(s.batch * per_matrix, 1, [&](int64_t begin, int64_t end) {
    for (int64_t task = begin; task < end; ++task) {
      const int64_t batch = task / per_matrix;
      const int64_t r0 = (task % per_matrix) / tile_cols * edge;
      const int64_t c0 = (task % per_matrix) % tile_cols * edge;
      Tile(s, alpha, a + s.a.offset + batch * s.a.batch_stride,
           b + s.b.offset + batch * s.b.batch_stride, beta,
           c + s.c.offset + batch * s.c.batch_stride, r0, std::min(edge, s.m - r0), c0,
           std::min(edge, s.n - c0));
    }
  });
}

}  // namespace

absl::Status LoadOpenBlas() { return Loaded().status(); }

void Matmul(DType dtype, const MatmulShape& shape, double alpha, const void* a, const void* b,
            double beta, void* c, ThreadPool& pool) {
  if (shape.batch == 0 || shape.m == 0 || shape.n == 0) return;
  if (dtype == DType::kFloat32) {
    TypedMatmul(shape, alpha, static_cast<const float*>(a), static_cast<const float*>(b), beta,
                static_cast<float*>(c), pool);
  } else {
    TypedMatmul(shape, alpha, static_cast<const double*>(a), static_cast<const double*>(b), beta,
                static_cast<double*>(c), pool);
  }
}

}  // namespace gpucompute::cpu
