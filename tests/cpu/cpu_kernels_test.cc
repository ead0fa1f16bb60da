// Tests of the CPU backend's kernels (server/cpu/kernels.h) against references computed
// here with plain loops in long double or exact wrapping integer arithmetic.
#include "server/cpu/kernels.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/dtype.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/cpu/thread_pool.h"
#include "tests/support/element_bytes.h"

namespace gpucompute::cpu {
namespace {

using ::gpucompute::testing::ElementAsDouble;
using ::gpucompute::testing::ElementAsInt;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Test data in [0, 1). (std::uniform_real_distribution is slow under clang, which does
// not fold libstdc++'s per-call logarithms in generate_canonical.)
double Unit(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

// Pools live for the whole test binary; several sizes check thread-count independence.
ThreadPool& Pool(int threads) {
  static ThreadPool* one = new ThreadPool(1);
  static ThreadPool* two = new ThreadPool(2);
  static ThreadPool* seven = new ThreadPool(7);
  return threads == 1 ? *one : threads == 2 ? *two : *seven;
}

// Bools are stored as bytes.
template <typename T>
using Stored = std::conditional_t<std::is_same_v<T, bool>, uint8_t, T>;

// ---------------------------------------------------------------------------------
// Reduce
// ---------------------------------------------------------------------------------

// Test data: products use values near 1 (floats) or in {-1, 1, 2, 3} (integers, so they
// wrap); otherwise floats in [-1, 1), int32 in [-1000, 1000] (many ties), int64 over the
// full range (sums wrap), bools half true.
template <typename T>
std::vector<Stored<T>> MakeData(int64_t n, ReduceKind kind, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<Stored<T>> v(static_cast<size_t>(n));
  const bool prod = kind == ReduceKind::kProd;
  for (auto& x : v) {
    if constexpr (std::is_same_v<T, bool>) {
      x = Unit(rng) < (prod ? 0.9999 : 0.5);
    } else if constexpr (std::is_floating_point_v<T>) {
      x = static_cast<T>(prod ? 1.0 + (Unit(rng) - 0.5) * 0.002 : Unit(rng) * 2.0 - 1.0);
    } else if (prod) {
      constexpr T kFactors[] = {-1, 1, 1, 2, 3};
      x = kFactors[rng() % 5];
    } else if constexpr (std::is_same_v<T, int32_t>) {
      x = static_cast<T>(static_cast<int64_t>(rng() % 2001) - 1000);
    } else {
      x = static_cast<T>(rng());
    }
  }
  return v;
}

// What one output should be: a float within `tol` of `value` (NaN matches NaN), or an
// exact integer.
struct Expected {
  bool is_float = false;
  double value = 0.0;
  double tol = 0.0;
  int64_t exact = 0;
};

template <typename T>
Expected Reference(ReduceKind kind, const std::vector<Stored<T>>& v) {
  constexpr DType kIn = DTypeOf<T>::value;
  const DType out = ReduceResultDType(kind, kIn);
  const bool float32_out = out == DType::kFloat32;
  const double eps = float32_out ? 0x1.0p-23 : 0x1.0p-52;
  const double slack = float32_out ? 1e-6 : 1e-12;  // relative to the magnitude bound
  const size_t n = v.size();
  Expected e;
  e.is_float = IsFloat(out);
  auto as_ld = [](Stored<T> x) { return static_cast<long double>(x); };
  switch (kind) {
    case ReduceKind::kSum:
    case ReduceKind::kMean: {
      long double s = 0, sabs = 0;
      uint64_t wrapped = 0;
      for (auto x : v) {
        s += as_ld(x);
        sabs += std::fabs(as_ld(x));
        if constexpr (!std::is_floating_point_v<T>) wrapped += static_cast<uint64_t>(x);
      }
      if (kind == ReduceKind::kSum) {
        e.value = static_cast<double>(s);
        e.tol = static_cast<double>(sabs) * slack;
        e.exact = static_cast<int64_t>(wrapped);
      } else {
        e.value = n == 0 ? kNan : static_cast<double>(s / n);
        e.tol = n == 0 ? 0 : static_cast<double>(sabs / n) * slack;
      }
      break;
    }
    case ReduceKind::kProd: {
      long double p = 1;
      uint64_t wrapped = 1;
      for (auto x : v) {
        p *= as_ld(x);
        if constexpr (!std::is_floating_point_v<T>) wrapped *= static_cast<uint64_t>(x);
      }
      e.value = static_cast<double>(p);
      // Products round once per factor in the result type: a random walk of n roundings.
      e.tol = std::fabs(e.value) * eps * (10.0 + 10.0 * std::sqrt(static_cast<double>(n)));
      e.exact = static_cast<int64_t>(wrapped);
      break;
    }
    case ReduceKind::kNorm2: {
      long double s = 0;
      for (auto x : v) s += as_ld(x) * as_ld(x);
      e.value = static_cast<double>(std::sqrt(s));
      e.tol = e.value * slack;
      break;
    }
    case ReduceKind::kMin:
    case ReduceKind::kMax:
    case ReduceKind::kArgmin:
    case ReduceKind::kArgmax: {
      const bool is_max = kind == ReduceKind::kMax || kind == ReduceKind::kArgmax;
      size_t best = 0;
      for (size_t r = 0; r < n; ++r) {
        if (std::isnan(static_cast<double>(v[r]))) {
          best = r;
          break;
        }
        if (is_max ? v[r] > v[best] : v[r] < v[best]) best = r;
      }
      if (kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax) {
        e.exact = static_cast<int64_t>(best);
      } else {
        e.value = static_cast<double>(v[best]);
        if constexpr (!std::is_floating_point_v<T>) e.exact = static_cast<int64_t>(v[best]);
      }
      break;
    }
    case ReduceKind::kVar:
    case ReduceKind::kStd:
    case ReduceKind::kAny:
    case ReduceKind::kAll:
      ADD_FAILURE() << ReduceKindName(kind) << " takes ReduceStrided, not a ReduceShape";
      break;
  }
  return e;
}

void ExpectOutput(const std::vector<uint8_t>& out, DType dt, int64_t i, const Expected& e,
                  const std::string& what) {
  if (e.is_float) {
    const double got = ElementAsDouble(out, dt, i);
    if (std::isnan(e.value)) {
      EXPECT_TRUE(std::isnan(got)) << what << " output " << i << " got " << got;
    } else {
      EXPECT_NEAR(got, e.value, e.tol) << what << " output " << i;
    }
  } else {
    EXPECT_EQ(ElementAsInt(out, dt, i), e.exact) << what << " output " << i;
  }
}

template <typename T>
std::vector<uint8_t> RunReduce(ReduceKind kind, const std::vector<Stored<T>>& data,
                               const ReduceShape& shape, ThreadPool& pool) {
  const DType out_dtype = ReduceResultDType(kind, DTypeOf<T>::value);
  // One spare element past the end catches writes beyond the outputs.
  const int64_t outputs = shape.outer * shape.inner;
  std::vector<uint8_t> out((outputs + 1) * DTypeSize(out_dtype), 0xA5);
  Reduce(kind, DTypeOf<T>::value, data.data(), shape, out.data(), pool);
  for (size_t b = outputs * DTypeSize(out_dtype); b < out.size(); ++b) {
    EXPECT_EQ(out[b], 0xA5) << "wrote past the last output";
  }
  return out;
}

template <typename T>
class ReduceTest : public ::testing::Test {};

using AllTypes = ::testing::Types<bool, int32_t, int64_t, float, double>;
TYPED_TEST_SUITE(ReduceTest, AllTypes);

TYPED_TEST(ReduceTest, WholeArray) {
  using T = TypeParam;
  const DType in = DTypeOf<T>::value;
  for (int64_t n : {1, 2, 15, 16, 17, 1000, 65537, 1 << 20}) {
    for (ReduceKind kind : kShapeReduceKinds) {
      const auto data = MakeData<T>(n, kind, 1000 + n);
      const auto out = RunReduce<T>(kind, data, {1, n, 1}, Pool(2));
      ExpectOutput(out, ReduceResultDType(kind, in), 0, Reference<T>(kind, data),
                   std::string(ReduceKindName(kind)) + " n=" + std::to_string(n));
    }
  }
}

// A logical m x n matrix stored in C (row-major) or F (column-major) order, reduced
// over either axis with the ReduceShape that ops.h documents for it. The reference
// reduces the logical matrix, so this also checks the shape mapping.
TYPED_TEST(ReduceTest, AxesOfTwoDimensionalArrays) {
  using T = TypeParam;
  const DType in = DTypeOf<T>::value;
  struct Dims {
    int64_t m, n;
  };
  const Dims dims[] = {{1, 1},    {1, 7},    {7, 1},      {3, 5},     {17, 33},
                       {2, 1000}, {1000, 3}, {300, 1000}, {70000, 3}, {3, 70000}};
  for (const Dims& d : dims) {
    for (ReduceKind kind : kShapeReduceKinds) {
      const auto logical = MakeData<T>(d.m * d.n, kind, 7 * d.m + d.n);  // row-major
      for (bool col_major : {false, true}) {
        std::vector<Stored<T>> stored(logical.size());
        for (int64_t i = 0; i < d.m; ++i) {
          for (int64_t j = 0; j < d.n; ++j) {
            stored[col_major ? i + j * d.m : i * d.n + j] = logical[i * d.n + j];
          }
        }
        for (int axis : {0, 1}) {
          ReduceShape shape;
          if (!col_major) {
            shape = axis == 1 ? ReduceShape{d.m, d.n, 1} : ReduceShape{1, d.m, d.n};
          } else {
            shape = axis == 0 ? ReduceShape{d.n, d.m, 1} : ReduceShape{1, d.n, d.m};
          }
          const auto out = RunReduce<T>(kind, stored, shape, Pool(2));
          const int64_t outputs = axis == 0 ? d.n : d.m;
          const int64_t extent = axis == 0 ? d.m : d.n;
          for (int64_t k = 0; k < outputs; ++k) {
            std::vector<Stored<T>> slice(extent);
            for (int64_t r = 0; r < extent; ++r) {
              slice[r] = axis == 0 ? logical[r * d.n + k] : logical[k * d.n + r];
            }
            ExpectOutput(out, ReduceResultDType(kind, in), k, Reference<T>(kind, slice),
                         std::string(ReduceKindName(kind)) + " " + std::to_string(d.m) + "x" +
                             std::to_string(d.n) + (col_major ? " F" : " C") + " axis " +
                             std::to_string(axis));
            if (::testing::Test::HasFailure()) return;  // one report per broken case
          }
        }
      }
    }
  }
}

TYPED_TEST(ReduceTest, BitwiseSameForAnyThreadCount) {
  using T = TypeParam;
  const ReduceShape shapes[] = {
      {1, (1 << 20) + 3, 1}, {1, 70000, 3}, {3, 70000, 1}, {1, 300, 1000}, {5, 1000, 40}};
  for (const ReduceShape& shape : shapes) {
    for (ReduceKind kind : kShapeReduceKinds) {
      const auto data = MakeData<T>(shape.outer * shape.extent * shape.inner, kind, 99);
      const auto one = RunReduce<T>(kind, data, shape, Pool(1));
      EXPECT_EQ(RunReduce<T>(kind, data, shape, Pool(2)), one) << ReduceKindName(kind);
      EXPECT_EQ(RunReduce<T>(kind, data, shape, Pool(7)), one) << ReduceKindName(kind);
      EXPECT_EQ(RunReduce<T>(kind, data, shape, Pool(7)), one) << ReduceKindName(kind) << " rerun";
    }
  }
}

TYPED_TEST(ReduceTest, EmptyExtent) {
  using T = TypeParam;
  const DType in = DTypeOf<T>::value;
  const std::vector<Stored<T>> none;
  const ReduceShape shape{3, 0, 2};
  auto sum = RunReduce<T>(ReduceKind::kSum, none, shape, Pool(2));
  auto prod = RunReduce<T>(ReduceKind::kProd, none, shape, Pool(2));
  auto mean = RunReduce<T>(ReduceKind::kMean, none, shape, Pool(2));
  auto norm2 = RunReduce<T>(ReduceKind::kNorm2, none, shape, Pool(2));
  for (int64_t i = 0; i < 6; ++i) {
    if (IsFloat(in)) {
      EXPECT_EQ(ElementAsDouble(sum, in, i), 0.0);
      EXPECT_EQ(ElementAsDouble(prod, in, i), 1.0);
    } else {
      EXPECT_EQ(ElementAsInt(sum, DType::kInt64, i), 0);
      EXPECT_EQ(ElementAsInt(prod, DType::kInt64, i), 1);
    }
    const DType real = ReduceResultDType(ReduceKind::kMean, in);
    EXPECT_TRUE(std::isnan(ElementAsDouble(mean, real, i)));
    EXPECT_EQ(ElementAsDouble(norm2, real, i), 0.0);
  }
}

template <typename T>
class ReduceFloatTest : public ::testing::Test {};
using FloatTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ReduceFloatTest, FloatTypes);

TYPED_TEST(ReduceFloatTest, NanPropagates) {
  using T = TypeParam;
  const DType in = DTypeOf<T>::value;
  const T nan = std::numeric_limits<T>::quiet_NaN();
  // Whole array: NaNs at 5 and 9, the minimum (-7) before them at 2, a larger maximum after.
  std::vector<T> v(1000, 0.5);
  v[2] = -7;
  v[5] = nan;
  v[9] = nan;
  v[500] = 100;
  const ReduceShape whole{1, 1000, 1};
  EXPECT_TRUE(
      std::isnan(ElementAsDouble(RunReduce<T>(ReduceKind::kMin, v, whole, Pool(2)), in, 0)));
  EXPECT_TRUE(
      std::isnan(ElementAsDouble(RunReduce<T>(ReduceKind::kMax, v, whole, Pool(2)), in, 0)));
  EXPECT_TRUE(
      std::isnan(ElementAsDouble(RunReduce<T>(ReduceKind::kSum, v, whole, Pool(2)), in, 0)));
  EXPECT_EQ(ElementAsInt(RunReduce<T>(ReduceKind::kArgmin, v, whole, Pool(2)), DType::kInt64, 0),
            5);
  EXPECT_EQ(ElementAsInt(RunReduce<T>(ReduceKind::kArgmax, v, whole, Pool(2)), DType::kInt64, 0),
            5);

  // A NaN as the last element of a long extent spanning several blocks, per column.
  const int64_t rows = 200000, cols = 3;
  std::vector<T> m(rows * cols, 1);
  m[(rows - 1) * cols + 1] = nan;          // column 1: NaN last
  m[(rows / 2) * cols + 2] = nan;          // column 2: NaN in the middle ...
  m[(rows - 3) * cols + 2] = nan;          // ... and a later one
  m[7 * cols + 0] = -1;                    // column 0: no NaN
  const ReduceShape axis0{1, rows, cols};  // C layout, axis 0
  const auto mn = RunReduce<T>(ReduceKind::kMin, m, axis0, Pool(7));
  EXPECT_EQ(ElementAsDouble(mn, in, 0), -1.0);
  EXPECT_TRUE(std::isnan(ElementAsDouble(mn, in, 1)));
  EXPECT_TRUE(std::isnan(ElementAsDouble(mn, in, 2)));
  const auto amax = RunReduce<T>(ReduceKind::kArgmax, m, axis0, Pool(7));
  EXPECT_EQ(ElementAsInt(amax, DType::kInt64, 0), 0);
  EXPECT_EQ(ElementAsInt(amax, DType::kInt64, 1), rows - 1);
  EXPECT_EQ(ElementAsInt(amax, DType::kInt64, 2), rows / 2);
  const auto amin = RunReduce<T>(ReduceKind::kArgmin, m, axis0, Pool(7));
  EXPECT_EQ(ElementAsInt(amin, DType::kInt64, 0), 7);
  EXPECT_EQ(ElementAsInt(amin, DType::kInt64, 2), rows / 2);
  // The same along a contiguous extent (whole array of column 2's values).
  std::vector<T> col(rows);
  for (int64_t r = 0; r < rows; ++r) col[r] = m[r * cols + 2];
  EXPECT_EQ(
      ElementAsInt(RunReduce<T>(ReduceKind::kArgmin, col, {1, rows, 1}, Pool(7)), DType::kInt64, 0),
      rows / 2);
  EXPECT_TRUE(std::isnan(
      ElementAsDouble(RunReduce<T>(ReduceKind::kMax, col, {1, rows, 1}, Pool(7)), in, 0)));
}

TYPED_TEST(ReduceFloatTest, InfinitiesAndTies) {
  using T = TypeParam;
  const DType in = DTypeOf<T>::value;
  const T inf = std::numeric_limits<T>::infinity();
  const std::vector<T> v = {inf, 3, -inf, 2, -inf, inf};
  const ReduceShape whole{1, 6, 1};
  EXPECT_EQ(ElementAsDouble(RunReduce<T>(ReduceKind::kMin, v, whole, Pool(2)), in, 0), -inf);
  EXPECT_EQ(ElementAsDouble(RunReduce<T>(ReduceKind::kMax, v, whole, Pool(2)), in, 0), inf);
  EXPECT_EQ(ElementAsInt(RunReduce<T>(ReduceKind::kArgmin, v, whole, Pool(2)), DType::kInt64, 0),
            2);
  EXPECT_EQ(ElementAsInt(RunReduce<T>(ReduceKind::kArgmax, v, whole, Pool(2)), DType::kInt64, 0),
            0);
  // All equal: the first index.
  const std::vector<T> flat(100, 4);
  EXPECT_EQ(
      ElementAsInt(RunReduce<T>(ReduceKind::kArgmax, flat, {1, 100, 1}, Pool(2)), DType::kInt64, 0),
      0);
  EXPECT_EQ(
      ElementAsInt(RunReduce<T>(ReduceKind::kArgmin, flat, {1, 100, 1}, Pool(2)), DType::kInt64, 0),
      0);
}

TEST(ReduceIntegerTest, Wraparound) {
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  const std::vector<int64_t> big = {kMax64, kMax64, 2};  // 2^64 = 0 mod 2^64
  EXPECT_EQ(
      ElementAsInt(RunReduce<int64_t>(ReduceKind::kSum, big, {1, 3, 1}, Pool(2)), DType::kInt64, 0),
      0);
  const std::vector<int64_t> pow2 = {int64_t{1} << 62, 4};
  EXPECT_EQ(ElementAsInt(RunReduce<int64_t>(ReduceKind::kProd, pow2, {1, 2, 1}, Pool(2)),
                         DType::kInt64, 0),
            0);
  const std::vector<int64_t> minus = {std::numeric_limits<int64_t>::min(), -1};
  EXPECT_EQ(ElementAsInt(RunReduce<int64_t>(ReduceKind::kProd, minus, {1, 2, 1}, Pool(2)),
                         DType::kInt64, 0),
            std::numeric_limits<int64_t>::min());
  // int32 sums and products are taken in int64.
  const std::vector<int32_t> i32(100000, std::numeric_limits<int32_t>::max());
  EXPECT_EQ(ElementAsInt(RunReduce<int32_t>(ReduceKind::kSum, i32, {1, 100000, 1}, Pool(2)),
                         DType::kInt64, 0),
            int64_t{100000} * std::numeric_limits<int32_t>::max());
  const std::vector<int32_t> f = {65536, 65536, 3};
  EXPECT_EQ(
      ElementAsInt(RunReduce<int32_t>(ReduceKind::kProd, f, {1, 3, 1}, Pool(2)), DType::kInt64, 0),
      int64_t{3} << 32);
  // Extremes of min and max.
  const std::vector<int32_t> ext = {0, std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max()};
  EXPECT_EQ(
      ElementAsInt(RunReduce<int32_t>(ReduceKind::kMin, ext, {1, 3, 1}, Pool(2)), DType::kInt32, 0),
      std::numeric_limits<int32_t>::min());
  EXPECT_EQ(
      ElementAsInt(RunReduce<int32_t>(ReduceKind::kMax, ext, {1, 3, 1}, Pool(2)), DType::kInt32, 0),
      std::numeric_limits<int32_t>::max());
}

// NumPy's rule, on every backend: float32 products are taken in float32, rounding after
// every multiplication. Fewer than 64 rows of one column are one accumulator taking the
// rows in order (server/cpu/reduce.cc), so the expected value is that chain of float32
// multiplications, written out here; each case is one where multiplying in float64 and
// rounding once at the end gives a different answer.
TEST(ReduceFloat32ProdTest, MultipliesInFloat32) {
  std::mt19937_64 rng(2024);
  std::vector<float> near_one(50);  // roundings that do not cancel exactly
  for (float& x : near_one) x = static_cast<float>(0.5 + 1.5 * Unit(rng));
  const std::vector<std::vector<float>> cases = {
      {0x1p100f, 0x1p100f, 0x1p-100f},   // float32 overflows to inf part way
      {0x1p-100f, 0x1p-100f, 0x1p100f},  // float32 underflows to 0 part way
      near_one,
  };
  for (const std::vector<float>& v : cases) {
    float in_float32 = 1.0f;
    double in_float64 = 1.0;
    for (float x : v) {
      in_float32 *= x;
      in_float64 *= x;
    }
    ASSERT_NE(in_float32, static_cast<float>(in_float64)) << "the case cannot tell the two apart";
    const int64_t n = static_cast<int64_t>(v.size());
    for (int threads : {1, 7}) {
      const auto out = RunReduce<float>(ReduceKind::kProd, v, {1, n, 1}, Pool(threads));
      EXPECT_EQ(ElementAsDouble(out, DType::kFloat32, 0), in_float32) << n << " factors";
    }
  }
}

// ---------------------------------------------------------------------------------
// Gemv
// ---------------------------------------------------------------------------------

template <typename T>
class GemvTest : public ::testing::Test {};
TYPED_TEST_SUITE(GemvTest, FloatTypes);

template <typename T>
std::vector<T> RandomVector(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<T> v(n);
  for (auto& x : v) x = static_cast<T>(Unit(rng) * 2.0 - 1.0);
  return v;
}

TYPED_TEST(GemvTest, AllLayoutsAgainstFloat64Reference) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const double rel = std::is_same_v<T, float> ? 1e-5 : 1e-12;
  struct Dims {
    int64_t m, n;
  };
  const Dims dims[] = {{1, 1}, {3, 5}, {17, 300}, {1000, 1000}, {1, 200000}, {200000, 2}};
  struct Coeffs {
    double alpha, beta;
  };
  const Coeffs coeffs[] = {{1, 0}, {2.5, -0.5}, {-1, 1}, {0, 2}};
  for (const Dims& d : dims) {
    const auto logical = RandomVector<T>(d.m * d.n, d.m * 31 + d.n);  // A(i, j) row-major
    for (bool col_major : {false, true}) {
      std::vector<T> a(logical.size());
      for (int64_t i = 0; i < d.m; ++i) {
        for (int64_t j = 0; j < d.n; ++j) {
          a[col_major ? i + j * d.m : i * d.n + j] = logical[i * d.n + j];
        }
      }
      for (bool transpose : {false, true}) {
        const int64_t xn = transpose ? d.m : d.n;
        const int64_t yn = transpose ? d.n : d.m;
        const auto x = RandomVector<T>(xn, 5);
        const auto y0 = RandomVector<T>(yn, 6);
        for (const Coeffs& c : coeffs) {
          std::vector<T> y = y0;
          Gemv(dtype, GemvShape{d.m, d.n, col_major, transpose}, c.alpha, a.data(), x.data(),
               c.beta, y.data(), Pool(2));
          for (int64_t p = 0; p < yn; ++p) {
            long double dot = 0, mag = 0;
            for (int64_t k = 0; k < xn; ++k) {
              const long double aij = transpose ? logical[k * d.n + p] : logical[p * d.n + k];
              dot += aij * x[k];
              mag += std::fabs(aij * x[k]);
            }
            const double expected = static_cast<double>(c.alpha * dot + c.beta * y0[p]);
            const double scale =
                static_cast<double>(std::fabs(c.alpha) * mag + std::fabs(c.beta * y0[p]));
            ASSERT_NEAR(y[p], expected, rel * scale + 1e-30)
                << d.m << "x" << d.n << (col_major ? " F" : " C") << (transpose ? " T" : "")
                << " alpha " << c.alpha << " beta " << c.beta << " y[" << p << "]";
          }
        }
      }
    }
  }
}

TYPED_TEST(GemvTest, BetaZeroIgnoresNanInY) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  const int64_t m = 37, n = 20;
  const auto a = RandomVector<T>(m * n, 1);
  const auto x = RandomVector<T>(m, 2);  // long enough for either op
  for (bool col_major : {false, true}) {
    for (bool transpose : {false, true}) {
      const int64_t yn = transpose ? n : m;
      std::vector<T> y(yn, std::numeric_limits<T>::quiet_NaN());
      Gemv(dtype, GemvShape{m, n, col_major, transpose}, 1.0, a.data(), x.data(), 0.0, y.data(),
           Pool(2));
      for (T v : y) EXPECT_FALSE(std::isnan(v)) << col_major << transpose;
      // alpha = 0 and beta = 0 gives zeros without reading A, x or y.
      std::vector<T> a_nan(m * n, std::numeric_limits<T>::quiet_NaN());
      std::fill(y.begin(), y.end(), std::numeric_limits<T>::quiet_NaN());
      Gemv(dtype, GemvShape{m, n, col_major, transpose}, 0.0, a_nan.data(), x.data(), 0.0, y.data(),
           Pool(2));
      for (T v : y) EXPECT_EQ(v, 0);
    }
  }
}

TYPED_TEST(GemvTest, BitwiseSameForAnyThreadCount) {
  using T = TypeParam;
  const DType dtype = DTypeOf<T>::value;
  struct Dims {
    int64_t m, n;
  };
  for (const Dims& d : {Dims{1000, 1000}, Dims{3, 300000}, Dims{300000, 3}}) {
    const auto a = RandomVector<T>(d.m * d.n, 11);
    const auto x = RandomVector<T>(std::max(d.m, d.n), 12);
    for (bool col_major : {false, true}) {
      for (bool transpose : {false, true}) {
        const GemvShape shape{d.m, d.n, col_major, transpose};
        const auto y0 = RandomVector<T>(transpose ? d.n : d.m, 13);
        std::vector<T> y1 = y0, y2 = y0, y7 = y0;
        Gemv(dtype, shape, 1.5, a.data(), x.data(), 0.25, y1.data(), Pool(1));
        Gemv(dtype, shape, 1.5, a.data(), x.data(), 0.25, y2.data(), Pool(2));
        Gemv(dtype, shape, 1.5, a.data(), x.data(), 0.25, y7.data(), Pool(7));
        EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(T)), 0);
        EXPECT_EQ(std::memcmp(y1.data(), y7.data(), y1.size() * sizeof(T)), 0);
      }
    }
  }
}

// ---------------------------------------------------------------------------------
// Random
// ---------------------------------------------------------------------------------

template <typename T>
std::vector<T> Fill(const RandomParams& p, int64_t n, ThreadPool& pool) {
  std::vector<T> out(n + 1);
  const T sentinel = static_cast<T>(-12345);
  out[n] = sentinel;
  Random(p, DTypeOf<T>::value, out.data(), n, pool);
  EXPECT_EQ(out[n], sentinel) << "wrote past n";
  out.pop_back();
  return out;
}

RandomParams Uniform(uint64_t seed, uint64_t offset = 0) {
  RandomParams p;
  p.distribution = Distribution::kUniform;
  p.seed = seed;
  p.offset = offset;
  return p;
}

RandomParams Normal(uint64_t seed, double mean, double stddev) {
  RandomParams p;
  p.distribution = Distribution::kNormal;
  p.seed = seed;
  p.mean = mean;
  p.stddev = stddev;
  return p;
}

RandomParams Integers(uint64_t seed, int64_t low, int64_t high) {
  RandomParams p;
  p.distribution = Distribution::kIntegers;
  p.seed = seed;
  p.low = low;
  p.high = high;
  return p;
}

template <typename T>
class RandomFloatTest : public ::testing::Test {};
TYPED_TEST_SUITE(RandomFloatTest, FloatTypes);

TYPED_TEST(RandomFloatTest, UniformStatistics) {
  using T = TypeParam;
  const int64_t n = 1 << 20;
  const auto v = Fill<T>(Uniform(42), n, Pool(2));
  long double sum = 0;
  for (T x : v) {
    ASSERT_GE(x, 0);
    ASSERT_LT(x, 1);
    sum += x;
  }
  const double sigma = std::sqrt(1.0 / 12.0 / n);
  EXPECT_NEAR(static_cast<double>(sum / n), 0.5, 5 * sigma);
}

TYPED_TEST(RandomFloatTest, NormalStatistics) {
  using T = TypeParam;
  const int64_t n = 1 << 20;
  const double mean = 2.0, stddev = 3.0;
  const auto v = Fill<T>(Normal(7, mean, stddev), n, Pool(2));
  long double s = 0, s2 = 0;
  for (T x : v) {
    ASSERT_TRUE(std::isfinite(x));
    s += x;
  }
  const double m = static_cast<double>(s / n);
  for (T x : v) s2 += (x - m) * (x - m);
  const double sd = std::sqrt(static_cast<double>(s2 / (n - 1)));
  EXPECT_NEAR(m, mean, 5 * stddev / std::sqrt(static_cast<double>(n)));
  // The sample standard deviation of a normal has standard error sigma / sqrt(2n).
  EXPECT_NEAR(sd, stddev, 5 * stddev / std::sqrt(2.0 * n));
}

template <typename T>
class RandomAllTest : public ::testing::Test {};
using RandomTypes = ::testing::Types<float, double, int32_t, int64_t>;
TYPED_TEST_SUITE(RandomAllTest, RandomTypes);

std::vector<RandomParams> ParamsFor(DType dtype) {
  if (IsInteger(dtype)) {
    return {Integers(3, -7, 1000003), Integers(0xdeadbeefcafef00du, -2, 3)};
  }
  RandomParams offset = Normal(5, -1.0, 0.5);
  offset.offset = 123456789012345u;
  return {Uniform(3), Uniform(0xdeadbeefcafef00du, 17), Normal(5, 0.0, 1.0), offset};
}

// Element i is what philox.h's formulas give for it, evaluated directly.
template <typename T>
T Direct(const RandomParams& p, uint64_t i) {
  constexpr DType kD = DTypeOf<T>::value;
  if (p.distribution == Distribution::kNormal) return RandomElement<T>(p, i);
  const uint64_t k = ElementsPerCounter(p.distribution, kD);
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + i / k);
  const int lane = static_cast<int>(i % k);
  if constexpr (kD == DType::kFloat32) {
    return static_cast<float>(b.w[lane] >> 8) * 0x1.0p-24f;
  } else if constexpr (kD == DType::kFloat64) {
    const uint64_t x = (uint64_t{b.w[2 * lane + 1]} << 32) | b.w[2 * lane];
    return static_cast<double>(x >> 11) * 0x1.0p-53;
  } else {
    const uint64_t x = (uint64_t{b.w[2 * lane + 1]} << 32) | b.w[2 * lane];
    __extension__ typedef unsigned __int128 Uint128;
    const Uint128 range = static_cast<uint64_t>(p.high) - static_cast<uint64_t>(p.low);
    const uint64_t scaled = static_cast<uint64_t>((x * range) >> 64);
    return static_cast<T>(static_cast<int64_t>(static_cast<uint64_t>(p.low) + scaled));
  }
}

TYPED_TEST(RandomAllTest, MatchesDirectEvaluationForAnyThreadCount) {
  using T = TypeParam;
  const int64_t n = 100003;  // not a multiple of any k
  for (const RandomParams& p : ParamsFor(DTypeOf<T>::value)) {
    const auto one = Fill<T>(p, n, Pool(1));
    for (int64_t i = 0; i < n; ++i) {
      const T direct = Direct<T>(p, i);
      ASSERT_EQ(std::memcmp(&one[i], &direct, sizeof(T)), 0) << "element " << i;
    }
    const auto two = Fill<T>(p, n, Pool(2));
    const auto seven = Fill<T>(p, n, Pool(7));
    const auto again = Fill<T>(p, n, Pool(7));
    EXPECT_EQ(std::memcmp(one.data(), two.data(), n * sizeof(T)), 0);
    EXPECT_EQ(std::memcmp(one.data(), seven.data(), n * sizeof(T)), 0);
    EXPECT_EQ(std::memcmp(one.data(), again.data(), n * sizeof(T)), 0);
    // Short fills and fills at an offset are prefixes and tails of the same stream.
    const int64_t k = ElementsPerCounter(p.distribution, DTypeOf<T>::value);
    for (int64_t len : {0, 1, 3, 5}) {
      const auto prefix = Fill<T>(p, len, Pool(2));
      EXPECT_EQ(std::memcmp(prefix.data(), one.data(), len * sizeof(T)), 0) << len;
    }
    RandomParams shifted = p;
    shifted.offset = p.offset + 1000;
    const auto tail = Fill<T>(shifted, 50000, Pool(7));
    EXPECT_EQ(std::memcmp(tail.data(), one.data() + 1000 * k, 50000 * sizeof(T)), 0);
  }
}

TEST(RandomIntegersTest, RangeAndBothEnds) {
  for (const auto& [low, high] : {std::pair<int64_t, int64_t>{-3, 4}, {10, 11}, {-1, 1}}) {
    const auto v32 = Fill<int32_t>(Integers(1, low, high), 10000, Pool(2));
    const auto v64 = Fill<int64_t>(Integers(2, low, high), 10000, Pool(2));
    std::vector<int> hits32(high - low), hits64(high - low);
    for (int32_t x : v32) {
      ASSERT_GE(x, low);
      ASSERT_LT(x, high);
      ++hits32[x - low];
    }
    for (int64_t x : v64) {
      ASSERT_GE(x, low);
      ASSERT_LT(x, high);
      ++hits64[x - low];
    }
    for (int64_t j = 0; j < high - low; ++j) {
      EXPECT_GT(hits32[j], 0) << "never drew " << low + j;
      EXPECT_GT(hits64[j], 0) << "never drew " << low + j;
    }
  }
}

TEST(RandomIntegersTest, ExtremeRanges) {
  const int64_t n = 1 << 20;
  constexpr int64_t kMin64 = std::numeric_limits<int64_t>::min();
  constexpr int64_t kMax64 = std::numeric_limits<int64_t>::max();
  const auto v = Fill<int64_t>(Integers(9, kMin64, kMax64), n, Pool(2));
  long double s = 0;
  int64_t negative = 0;
  for (int64_t x : v) {
    ASSERT_LT(x, kMax64);
    s += static_cast<long double>(x) / 0x1.0p63L;
    negative += x < 0;
  }
  // Uniform on [-1, 1) after scaling: mean 0, standard deviation 1 / sqrt(3).
  EXPECT_NEAR(static_cast<double>(s / n), 0.0, 5 / std::sqrt(3.0 * n));
  EXPECT_NEAR(static_cast<double>(negative) / n, 0.5, 5 * 0.5 / std::sqrt(1.0 * n));

  constexpr int32_t kMin32 = std::numeric_limits<int32_t>::min();
  constexpr int32_t kMax32 = std::numeric_limits<int32_t>::max();
  const auto w = Fill<int32_t>(Integers(9, kMin32, kMax32), n, Pool(2));
  long double s32 = 0;
  for (int32_t x : w) {
    ASSERT_LT(x, kMax32);
    s32 += x / 0x1.0p31L;
  }
  EXPECT_NEAR(static_cast<double>(s32 / n), 0.0, 5 / std::sqrt(3.0 * n));
}

}  // namespace
}  // namespace gpucompute::cpu
