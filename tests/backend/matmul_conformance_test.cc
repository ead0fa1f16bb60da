// Backend::Matmul conformance (see tests/backend/backend_conformance.h): every layout the
// contract allows (row- and column-major operands, leading dimensions beyond the extent,
// offsets, a batch with a broadcast operand, vectors, k = 0), alpha and beta, float32 and
// float64, against a float64 reference computed here from the layouts; memory outside C's
// matrices is left alone; results are bitwise the same run to run; and TF32 is used only
// when asked for. Instantiated for the CPU backend and, where the build has it, CUDA
// (skipped without a GPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "kernels/dtype.h"
#include "server/core/backend.h"
#include "server/cpu/cpu_backend.h"
#include "tests/backend/backend_conformance.h"
#include "tests/support/test_util.h"
#if defined(GPUCOMPUTE_HAVE_CUDA)
#include "server/cuda/cuda_backend.h"
#endif

namespace gpucompute::conformance {
namespace {

// Elements a layout reaches, plus one: the size of the memory that holds it.
int64_t Extent(const MatrixLayout& l, int64_t batch, int64_t rows, int64_t cols) {
  if (batch == 0 || rows == 0 || cols == 0) return l.offset + 1;
  return l.offset + (batch - 1) * l.batch_stride + (rows - 1) * l.row_stride +
         (cols - 1) * l.col_stride + 1;
}

int64_t At(const MatrixLayout& l, int64_t b, int64_t i, int64_t j) {
  return l.offset + b * l.batch_stride + i * l.row_stride + j * l.col_stride;
}

// Row-major (ld >= cols) or column-major (ld >= rows) layouts of one matrix, `pad`
// elements wider than needed, batched `stride` apart.
MatrixLayout RowMajor(int64_t cols, int64_t pad = 0, int64_t offset = 0, int64_t stride = 0) {
  return {offset, cols + pad, 1, stride};
}
MatrixLayout ColMajor(int64_t rows, int64_t pad = 0, int64_t offset = 0, int64_t stride = 0) {
  return {offset, 1, rows + pad, stride};
}

struct Case {
  std::string name;
  MatmulShape shape;
  double alpha = 1;
  double beta = 0;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  const int64_t m = 130, n = 141, k = 75;
  const auto add = [&](std::string name, int64_t batch, int64_t mm, int64_t nn, int64_t kk,
                       MatrixLayout a, MatrixLayout b, MatrixLayout c, double alpha = 1,
                       double beta = 0) {
    MatmulShape s;
    s.batch = batch;
    s.m = mm;
    s.n = nn;
    s.k = kk;
    s.a = a;
    s.b = b;
    s.c = c;
    cases.push_back({std::move(name), s, alpha, beta});
  };
  add("row_major", 1, m, n, k, RowMajor(k), RowMajor(n), RowMajor(n));
  add("col_major", 1, m, n, k, ColMajor(m), ColMajor(k), ColMajor(m));
  add("mixed_into_col_major", 1, m, n, k, RowMajor(k), ColMajor(k), ColMajor(m), 1.5);
  add("padded_with_offsets", 1, m, n, k, RowMajor(k, 3, 5), ColMajor(k, 2, 7), RowMajor(n, 4, 3),
      -0.5, 2);
  add("batch_with_broadcast_b", 3, 33, 20, 17, RowMajor(17, 0, 0, 33 * 17), ColMajor(17, 1, 2, 0),
      RowMajor(20, 0, 0, 33 * 20), 1, 0.25);
  add("broadcast_a_into_col_major_c", 4, 9, 12, 5, ColMajor(9), RowMajor(12, 0, 0, 60),
      ColMajor(9, 3, 0, 12 * 12));
  // Vectors: a row for A (m = 1, stride 0 on its rows), a strided column for B.
  add("row_vector_a", 1, 1, n, k, MatrixLayout{0, 0, 1, 0}, RowMajor(n), MatrixLayout{0, 0, 1, 0});
  add("strided_column_b", 1, m, 1, k, RowMajor(k), MatrixLayout{1, 3, 0, 0},
      MatrixLayout{0, 1, 0, 0});
  add("dot_of_vectors", 1, 1, 1, k, MatrixLayout{0, 0, 2, 0}, MatrixLayout{0, 1, 0, 0},
      MatrixLayout{0, 0, 0, 0}, 3);
  add("k_zero_scales_c", 2, 7, 6, 0, RowMajor(0), RowMajor(6), RowMajor(6, 0, 0, 42), 1, 0.5);
  return cases;
}

template <typename T>
std::vector<T> Values(int64_t count, uint64_t seed) {
  std::vector<double> v = testing::RandomDoubles(static_cast<size_t>(count), -1, 1, seed);
  return std::vector<T>(v.begin(), v.end());
}

class MatmulConformance : public BackendConformance {
 protected:
  // Runs the case on the backend over a, b and c (C's memory, read back in full).
  template <typename T>
  std::vector<T> Run(const MatmulShape& s, double alpha, const std::vector<T>& a,
                     const std::vector<T>& b, double beta, const std::vector<T>& c) {
    absl::StatusOr<DeviceMemory> da = Upload(backend(), stream(), a);
    absl::StatusOr<DeviceMemory> db = Upload(backend(), stream(), b);
    absl::StatusOr<DeviceMemory> dc = Upload(backend(), stream(), c);
    EXPECT_OK(da);
    EXPECT_OK(db);
    EXPECT_OK(dc);
    if (!da.ok() || !db.ok() || !dc.ok()) return {};
    EXPECT_OK(backend().Matmul(stream(), DTypeOf<T>::value, s, alpha, *da, *db, beta, *dc));
    absl::StatusOr<std::vector<T>> out = Download<T>(backend(), stream(), *dc, c.size());
    EXPECT_OK(out);
    return out.ok() ? *out : std::vector<T>{};
  }

  // Checks every element of C's matrices against the float64 reference within
  // (k + 3) eps (|alpha| sum |a b| + |beta c|) + tf32 * |alpha| sum |a b|, and that the
  // rest of C's memory kept its values.
  template <typename T>
  void Check(const Case& cs, const std::vector<T>& a, const std::vector<T>& b,
             const std::vector<T>& c0, const std::vector<T>& got, double tf32_rel = 0) {
    SCOPED_TRACE(cs.name);
    const MatmulShape& s = cs.shape;
    ASSERT_EQ(got.size(), c0.size());
    const double eps = sizeof(T) == 4 ? 0x1.0p-24 : 0x1.0p-53;
    std::vector<bool> in_c(c0.size(), false);
    for (int64_t t = 0; t < s.batch; ++t) {
      for (int64_t i = 0; i < s.m; ++i) {
        for (int64_t j = 0; j < s.n; ++j) {
          long double acc = 0, mag = 0;
          for (int64_t p = 0; p < s.k; ++p) {
            const long double prod =
                static_cast<long double>(a[At(s.a, t, i, p)]) * b[At(s.b, t, p, j)];
            acc += prod;
            mag += std::fabs(prod);
          }
          const int64_t at = At(s.c, t, i, j);
          in_c[at] = true;
          const double old = cs.beta == 0 ? 0.0 : cs.beta * static_cast<double>(c0[at]);
          const double want = static_cast<double>(cs.alpha * acc) + old;
          const double scaled = std::fabs(cs.alpha) * static_cast<double>(mag);
          const double bound =
              (static_cast<double>(s.k) + 3) * eps * (scaled + std::fabs(old)) + tf32_rel * scaled;
          ASSERT_LE(std::fabs(static_cast<double>(got[at]) - want), bound + 1e-300)
              << "C[" << t << "][" << i << "][" << j << "]: got " << got[at] << ", want " << want;
        }
      }
    }
    for (size_t e = 0; e < got.size(); ++e) {
      if (!in_c[e]) {
        ASSERT_EQ(std::memcmp(&got[e], &c0[e], sizeof(T)), 0) << "C's memory at " << e
                                                              << " is outside every matrix";
      }
    }
  }

  template <typename T>
  void RunAllCases() {
    uint64_t seed = 1;
    for (const Case& cs : Cases()) {
      const MatmulShape& s = cs.shape;
      const std::vector<T> a = Values<T>(Extent(s.a, s.batch, s.m, s.k), seed++);
      const std::vector<T> b = Values<T>(Extent(s.b, s.batch, s.k, s.n), seed++);
      std::vector<T> c0 = Values<T>(Extent(s.c, s.batch, s.m, s.n), seed++);
      if (cs.beta == 0) {
        // Not read when beta is 0: NaN there must not reach the result.
        for (T& x : c0) x = std::numeric_limits<T>::quiet_NaN();
        // ... but the memory outside C's matrices is compared bitwise, NaN included.
      }
      const std::vector<T> got = Run<T>(s, cs.alpha, a, b, cs.beta, c0);
      Check<T>(cs, a, b, c0, got);
      if (HasFatalFailure()) return;
    }
  }
};

TEST_P(MatmulConformance, Float64MatchesTheReferenceInEveryLayout) { RunAllCases<double>(); }

TEST_P(MatmulConformance, Float32MatchesTheReferenceInEveryLayout) { RunAllCases<float>(); }

TEST_P(MatmulConformance, BitwiseTheSameRunToRun) {
  for (const Case& cs : Cases()) {
    const MatmulShape& s = cs.shape;
    const std::vector<float> a = Values<float>(Extent(s.a, s.batch, s.m, s.k), 100);
    const std::vector<float> b = Values<float>(Extent(s.b, s.batch, s.k, s.n), 101);
    const std::vector<float> c0 = Values<float>(Extent(s.c, s.batch, s.m, s.n), 102);
    const std::vector<float> first = Run<float>(s, cs.alpha, a, b, cs.beta, c0);
    const std::vector<float> second = Run<float>(s, cs.alpha, a, b, cs.beta, c0);
    ASSERT_EQ(first.size(), second.size()) << cs.name;
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * sizeof(float)), 0)
        << cs.name;
  }
}

// Every element of A is 1 + 2^-12 + 2^-13, which float32 holds exactly and TF32 (10
// mantissa bits) rounds to 1: a product with B = 1 over k = 256 loses 3 * 2^-13 of its
// value, far outside the float32 bound, if the backend rounds to TF32.
TEST_P(MatmulConformance, Tf32OnlyWhenAllowed) {
  Case cs;
  cs.name = "tf32 probe";
  cs.shape.m = 64;
  cs.shape.n = 64;
  cs.shape.k = 256;
  cs.shape.a = RowMajor(256);
  cs.shape.b = RowMajor(64);
  cs.shape.c = RowMajor(64);
  const std::vector<float> a(64 * 256, 1.0f + 0x1.0p-12f + 0x1.0p-13f);
  const std::vector<float> b(256 * 64, 1.0f);
  const std::vector<float> c0(64 * 64, 0.0f);
  Check<float>(cs, a, b, c0, Run<float>(cs.shape, 1, a, b, 0, c0));
  // Allowed: each input rounds to TF32 within 2^-11 of itself, so a product within 2^-10.
  cs.shape.allow_tf32 = true;
  const std::vector<float> b_random = Values<float>(256 * 64, 7);
  Check<float>(cs, a, b_random, c0, Run<float>(cs.shape, 1, a, b_random, 0, c0), 0x1.0p-10);
}

// The CPU backend cuts C into tiles by the shape alone, so the pool's size changes
// nothing in the bits (server/cpu/matmul.h).
TEST(CpuMatmul, BitwiseTheSameForAnyThreadCount) {
  MatmulShape s;
  s.m = 300;
  s.n = 290;
  s.k = 201;
  s.a = RowMajor(s.k);
  s.b = ColMajor(s.k);
  s.c = RowMajor(s.n);
  const std::vector<double> a = Values<double>(s.m * s.k, 200);
  const std::vector<double> b = Values<double>(s.k * s.n, 201);
  std::vector<std::vector<double>> results;
  for (size_t threads : {1, 2, 5}) {
    cpu::CpuBackend backend(threads);
    ASSIGN_OR_FAIL(std::unique_ptr<Stream> stream, backend.CreateStream(0));
    ASSIGN_OR_FAIL(DeviceMemory da, Upload(backend, *stream, a));
    ASSIGN_OR_FAIL(DeviceMemory db, Upload(backend, *stream, b));
    ASSIGN_OR_FAIL(DeviceMemory dc, backend.Allocate(0, s.m * s.n * sizeof(double)));
    ASSERT_OK(backend.Matmul(*stream, DType::kFloat64, s, 1.0, da, db, 0.0, dc));
    ASSIGN_OR_FAIL(std::vector<double> c, Download<double>(backend, *stream, dc, s.m * s.n));
    results.push_back(std::move(c));
  }
  for (size_t i = 1; i < results.size(); ++i) {
    EXPECT_EQ(std::memcmp(results[0].data(), results[i].data(), results[0].size() * sizeof(double)),
              0);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cpu, MatmulConformance,
    ::testing::Values(
        BackendFactory{"ThreeThreads", [] { return std::make_unique<cpu::CpuBackend>(3); }},
        BackendFactory{"OneThread", [] { return std::make_unique<cpu::CpuBackend>(1); }}),
    BackendFactoryName);

#if defined(GPUCOMPUTE_HAVE_CUDA)
INSTANTIATE_TEST_SUITE_P(Cuda, MatmulConformance,
                         ::testing::Values(BackendFactory{"Gpu", MaybeCreateCudaBackend}),
                         BackendFactoryName);
#endif

}  // namespace
}  // namespace gpucompute::conformance
