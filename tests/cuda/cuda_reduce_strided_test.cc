// The CUDA backend's reductions over any axes of strided arrays and of expressions
// (Backend::ReduceStrided; kernels/cuda/reduce_strided.cu, kernels/cuda/
// reduce_expression.cc), against references computed here by brute force in float64 (and
// exactly in 64-bit integers): every kind (var with ddof 1) and dtype over several axis sets of 3-D and 4-D
// views (C-contiguous, transposed, negative steps, broadcast), chunked shapes of every
// path, repeated runs bitwise identical, and fused expressions. Integer results, min, max,
// argmin, argmax, any and all must match exactly; float sums, means and norms within the
// float64 rounding of an n-term sum plus the output's rounding; float products within n
// float roundings of their own type; var and std within a relative 1e-10 of a two-pass
// long double reference, plus the output's rounding.
//
// The code generator's sources must compile for sm_90 with NVRTC without a GPU; the rest
// skips where no CUDA device is usable.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/ops.h"
#include "server/core/backend.h"
#include "server/cuda/cuda_backend.h"
#include "server/cuda/nvrtc_compiler.h"
#include "server/cuda/reduce_codegen.h"
#include "server/expression/expression.h"
#include "tests/backend/backend_conformance.h"
#include "tests/support/test_util.h"

namespace gpucompute {
namespace {

using conformance::Download;
using conformance::Upload;
using expr::ArrayInput;

// ---- the arrays: a base buffer of doubles (converted to the dtype) and views of it

struct View {
  std::string name;
  std::vector<int64_t> base_shape;  // the buffer, C order
  StridedLayout layout;             // the view, over the buffer's elements
};

std::vector<int64_t> CStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (int d = static_cast<int>(shape.size()) - 2; d >= 0; --d) {
    strides[d] = strides[d + 1] * shape[d + 1];
  }
  return strides;
}

int64_t Product(const std::vector<int64_t>& v) {
  int64_t p = 1;
  for (int64_t x : v) p *= x;
  return p;
}

View Contiguous(std::vector<int64_t> shape) {
  return {"contiguous", shape, {shape, CStrides(shape), 0}};
}

std::vector<View> Views3d() {
  std::vector<View> views = {Contiguous({4, 5, 6})};
  // (6, 5, 4) transposed to (4, 5, 6).
  views.push_back({"transposed", {6, 5, 4}, {{4, 5, 6}, {1, 4, 20}, 0}});
  // (4, 5, 6)[::-1, :, ::-2]: shape (4, 5, 3).
  views.push_back({"negative", {4, 5, 6}, {{4, 5, 3}, {-30, 6, -2}, 3 * 30 + 5}});
  // A (5, 1) buffer broadcast to (4, 5, 6).
  views.push_back({"broadcast", {5, 1}, {{4, 5, 6}, {0, 1, 0}, 0}});
  return views;
}

std::vector<View> Views4d() {
  // (3, 8, 5, 7)[:, ::2, :, 1:7], and its axes permuted (3, 1, 0, 2).
  View sliced{"sliced4d", {3, 8, 5, 7}, {{3, 4, 5, 6}, {280, 70, 7, 1}, 1}};
  View permuted{"permuted4d", {3, 8, 5, 7}, {{6, 4, 3, 5}, {1, 70, 280, 7}, 1}};
  return {Contiguous({3, 4, 5, 6}), sliced, permuted};
}

std::vector<std::vector<int32_t>> AxisSets(int ndim) {
  if (ndim == 3) return {{}, {0}, {1}, {2}, {0, 1}, {0, 2}, {1, 2}, {0, 1, 2}};
  return {{3}, {0}, {1, 3}, {0, 2}, {0, 1, 2, 3}};
}

// Test values for `kind` as doubles: near 1 for products (floats; integers from {-1, 1, 2,
// 3}), else floats in [-1, 1) and integers in [-1000, 1000] (ties), bools as bytes {0, 1,
// 2, 255}. With `nans`, a few float NaNs.
std::vector<double> MakeValues(DType dtype, ReduceKind kind, int64_t n, uint64_t seed, bool nans) {
  std::mt19937_64 rng(seed);
  auto unit = [&] { return static_cast<double>(rng() >> 11) * 0x1.0p-53; };
  std::vector<double> v(n);
  for (double& x : v) {
    if (dtype == DType::kBool) {
      constexpr double kBytes[] = {0, 1, 2, 255};
      x = kBytes[rng() % 4];
    } else if (kind == ReduceKind::kProd) {
      constexpr double kFactors[] = {-1, 1, 1, 2, 3};
      x = IsFloat(dtype) ? 1.0 + (unit() - 0.5) * 0.002 : kFactors[rng() % 5];
    } else if (IsFloat(dtype)) {
      x = unit() * 2 - 1;
      if (nans && rng() % 97 == 0) x = std::nan("");
    } else {
      x = static_cast<double>(static_cast<int64_t>(rng() % 2001) - 1000);
    }
  }
  return v;
}

std::vector<uint8_t> ToBytes(const std::vector<double>& v, DType dtype) {
  std::vector<uint8_t> bytes(v.size() * DTypeSize(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    uint8_t* p = bytes.data() + i * DTypeSize(dtype);
    switch (dtype) {
      case DType::kBool: *p = static_cast<uint8_t>(v[i]); break;
      case DType::kInt32: { const auto x = static_cast<int32_t>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::kInt64: { const auto x = static_cast<int64_t>(v[i]); std::memcpy(p, &x, 8); break; }
      case DType::kFloat32: { const auto x = static_cast<float>(v[i]); std::memcpy(p, &x, 4); break; }
      case DType::kFloat64: std::memcpy(p, &v[i], 8); break;
    }
  }
  return bytes;
}

// The element as the kernels read it: float32 rounded, bool bytes as 0/1.
double AsRead(double x, DType dtype) {
  if (dtype == DType::kBool) return x != 0 ? 1 : 0;
  if (dtype == DType::kFloat32) return static_cast<float>(x);
  return x;
}

// ---- the reference

// The ddof of every var here (std uses 0): 1, so that a reduction of one value divides by
// zero.
constexpr double kVarDdof = 1;

// Each output's values, gathered in C order over the reduced axes.
std::vector<std::vector<double>> Gather(const std::vector<double>& base, const StridedLayout& layout,
                                        const std::vector<int32_t>& axes,
                                        const std::function<double(int64_t)>& value) {
  const int ndim = layout.ndim();
  std::vector<bool> reduced(ndim, false);
  for (int32_t a : axes) reduced[a] = true;
  int64_t outputs = 1;
  for (int d = 0; d < ndim; ++d) outputs *= reduced[d] ? 1 : layout.shape[d];
  std::vector<std::vector<double>> groups(outputs);
  std::vector<int64_t> index(ndim, 0);
  for (int64_t flat = 0; flat < Product(layout.shape); ++flat) {
    int64_t rest = flat;
    int64_t offset = layout.offset;
    int64_t o = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      index[d] = rest % layout.shape[d];
      rest /= layout.shape[d];
    }
    for (int d = 0; d < ndim; ++d) {
      offset += index[d] * layout.strides[d];
      if (!reduced[d]) o = o * layout.shape[d] + index[d];
    }
    groups[o].push_back(value(offset));
  }
  return groups;
}

// Whether `got` (an output element of dtype `out`) is the reduction of `values` (as read).
::testing::AssertionResult Matches(ReduceKind kind, DType in, DType out, const uint8_t* got,
                                   const std::vector<double>& values) {
  const int64_t n = static_cast<int64_t>(values.size());
  double g = 0;
  int64_t gi = 0;
  switch (out) {
    case DType::kBool: gi = *got; g = gi; break;
    case DType::kInt32: { int32_t x; std::memcpy(&x, got, 4); gi = x; g = x; break; }
    case DType::kInt64: std::memcpy(&gi, got, 8); g = static_cast<double>(gi); break;
    case DType::kFloat32: { float x; std::memcpy(&x, got, 4); g = x; break; }
    case DType::kFloat64: std::memcpy(&g, got, 8); break;
  }
  const bool is_float = IsFloat(in);
  auto fail = [&](const std::string& expected) {
    return ::testing::AssertionFailure() << "got " << (IsFloat(out) ? absl::StrCat(g) : absl::StrCat(gi))
                                         << ", expected " << expected << " over " << n << " values";
  };
  switch (kind) {
    case ReduceKind::kAny:
    case ReduceKind::kAll: {
      bool want = kind == ReduceKind::kAll;
      for (double v : values) want = kind == ReduceKind::kAll ? want && v != 0 : want || v != 0;
      return gi == (want ? 1 : 0) ? ::testing::AssertionSuccess() : fail(want ? "1" : "0");
    }
    case ReduceKind::kVar:
    case ReduceKind::kStd: {
      // Two passes in long double; the kernels merge (count, mean, M2) in float64, within
      // a relative 1e-10 of it for these well-conditioned values.
      long double mean = 0;
      for (double v : values) mean += v;
      mean /= n;
      long double m2 = 0;
      for (double v : values) m2 += (v - mean) * (v - mean);
      const double ddof = kind == ReduceKind::kVar ? kVarDdof : 0;
      double want = static_cast<double>(m2 / (n - ddof > 0 ? n - ddof : 0.0));
      if (kind == ReduceKind::kStd) want = std::sqrt(want);
      if (std::isnan(want)) return std::isnan(g) ? ::testing::AssertionSuccess() : fail("nan");
      if (std::isinf(want)) return g == want ? ::testing::AssertionSuccess() : fail("inf");
      const double ulp = out == DType::kFloat32 ? 0x1.0p-23 : 0x1.0p-52;
      const double tolerance = (1e-10 + ulp) * std::fabs(want);
      return std::fabs(g - want) <= tolerance ? ::testing::AssertionSuccess()
                                              : fail(absl::StrCat(want, " +- ", tolerance));
    }
    case ReduceKind::kArgmin:
    case ReduceKind::kArgmax:
    case ReduceKind::kMin:
    case ReduceKind::kMax: {
      const bool max = kind == ReduceKind::kMax || kind == ReduceKind::kArgmax;
      int64_t best = 0;
      for (int64_t i = 1; i < n; ++i) {
        if (std::isnan(values[best])) break;
        if (std::isnan(values[i]) || (max ? values[i] > values[best] : values[i] < values[best])) best = i;
      }
      if (kind == ReduceKind::kArgmin || kind == ReduceKind::kArgmax) {
        return gi == best ? ::testing::AssertionSuccess() : fail(absl::StrCat(best));
      }
      const double want = values[best];
      if (std::isnan(want)) return std::isnan(g) ? ::testing::AssertionSuccess() : fail("nan");
      return g == want ? ::testing::AssertionSuccess() : fail(absl::StrCat(want));
    }
    case ReduceKind::kSum:
    case ReduceKind::kProd:
      if (!is_float) {
        uint64_t acc = kind == ReduceKind::kSum ? 0 : 1;
        for (double v : values) {
          const auto x = static_cast<uint64_t>(static_cast<int64_t>(v));
          acc = kind == ReduceKind::kSum ? acc + x : acc * x;
        }
        return gi == static_cast<int64_t>(acc) ? ::testing::AssertionSuccess()
                                               : fail(absl::StrCat(static_cast<int64_t>(acc)));
      }
      break;
    default:
      break;
  }
  // Float sums, means, norms (accumulated in float64) and float products.
  long double sum = kind == ReduceKind::kProd ? 1 : 0;
  long double magnitude = 0;
  for (double v : values) {
    if (kind == ReduceKind::kProd) {
      sum *= v;
    } else {
      const long double x = kind == ReduceKind::kNorm2 ? static_cast<long double>(v) * v : v;
      sum += x;
      magnitude += std::fabs(static_cast<double>(x));
    }
  }
  double want = static_cast<double>(sum);
  double tolerance = 2 * n * 0x1.0p-53 * static_cast<double>(magnitude);
  if (kind == ReduceKind::kMean) {
    want /= n;
    tolerance /= n;
  } else if (kind == ReduceKind::kNorm2) {
    want = std::sqrt(want);
    tolerance = want > 0 ? tolerance / want : 0;
  } else if (kind == ReduceKind::kProd) {
    const double u = in == DType::kFloat32 ? 0x1.0p-24 : 0x1.0p-53;
    tolerance = 2 * n * u * std::fabs(want);
  }
  const double ulp = out == DType::kFloat32 ? 0x1.0p-23 : 0x1.0p-52;
  tolerance += ulp * std::fabs(want);
  if (std::isnan(want)) return std::isnan(g) ? ::testing::AssertionSuccess() : fail("nan");
  return std::fabs(g - want) <= tolerance ? ::testing::AssertionSuccess()
                                          : fail(absl::StrCat(want, " +- ", tolerance));
}

constexpr DType kDTypes[] = {DType::kBool, DType::kInt32, DType::kInt64, DType::kFloat32,
                             DType::kFloat64};
constexpr ReduceKind kKinds[] = {ReduceKind::kSum,    ReduceKind::kProd,   ReduceKind::kMin,
                                 ReduceKind::kMax,    ReduceKind::kMean,   ReduceKind::kNorm2,
                                 ReduceKind::kArgmin, ReduceKind::kArgmax, ReduceKind::kVar,
                                 ReduceKind::kStd,    ReduceKind::kAny,    ReduceKind::kAll};

bool Selects(ReduceKind kind) {
  return kind == ReduceKind::kMin || kind == ReduceKind::kMax || kind == ReduceKind::kArgmin ||
         kind == ReduceKind::kArgmax;
}

// The reduction of one array (memory filled in by the fixture's Run).
StridedReduce PlainReduce(ReduceKind kind, DType dtype, const StridedLayout& layout,
                          const std::vector<int32_t>& axes) {
  StridedReduce reduce;
  reduce.kind = kind;
  reduce.dtype = dtype;
  reduce.inputs = {{nullptr, layout}};
  reduce.shape = layout.shape;
  reduce.axes = axes;
  if (kind == ReduceKind::kVar) reduce.ddof = kVarDdof;
  return reduce;
}

class CudaReduceStridedTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device here";
    ASSIGN_OR_FAIL(backend_, cuda::CreateCudaBackend(cuda::CudaBackendOptions{}));
    ASSIGN_OR_FAIL(stream_, backend_->CreateStream(0));
  }

  // Runs `reduce` (inputs' memory filled in from `buffers`) and returns the output bytes.
  std::vector<uint8_t> Run(StridedReduce reduce, const std::vector<const DeviceMemory*>& buffers,
                           DType value_dtype, int64_t outputs) {
    for (size_t i = 0; i < buffers.size(); ++i) reduce.inputs[i].memory = buffers[i];
    const DType out_dtype = ReduceResultDType(reduce.kind, value_dtype);
    const uint64_t bytes = outputs * DTypeSize(out_dtype);
    const std::vector<uint8_t> poison(bytes + 8, 0xA5);  // an unwritten output shows
    absl::StatusOr<DeviceMemory> out = Upload<uint8_t>(*backend_, *stream_, poison);
    EXPECT_OK(out);
    if (!out.ok()) return {};
    EXPECT_OK(backend_->ReduceStrided(*stream_, reduce, *out).status());
    absl::StatusOr<std::vector<uint8_t>> host = Download<uint8_t>(*backend_, *stream_, *out, bytes + 8);
    EXPECT_OK(host);
    if (!host.ok()) return {};
    for (int i = 0; i < 8; ++i) EXPECT_EQ((*host)[bytes + i], 0xA5) << "written past the output";
    host->resize(bytes);
    return *host;
  }

  // Checks every kind of `dtype` over every axis set of `view`.
  void CheckView(const View& view, DType dtype, bool nans) {
    for (ReduceKind kind : kKinds) {
      const std::vector<double> base =
          MakeValues(dtype, kind, Product(view.base_shape), 7 + static_cast<int>(kind), nans);
      ASSIGN_OR_FAIL(DeviceMemory memory,
                     Upload<uint8_t>(*backend_, *stream_, ToBytes(base, dtype)));
      for (const std::vector<int32_t>& axes : AxisSets(view.layout.ndim())) {
        const StridedReduce reduce = PlainReduce(kind, dtype, view.layout, axes);
        const auto groups = Gather(base, view.layout, axes,
                                   [&](int64_t off) { return AsRead(base[off], dtype); });
        const std::vector<uint8_t> got = Run(reduce, {&memory}, dtype, groups.size());
        const DType out = ReduceResultDType(kind, dtype);
        ASSERT_EQ(got.size(), groups.size() * DTypeSize(out));
        for (size_t o = 0; o < groups.size(); ++o) {
          ASSERT_TRUE(Matches(kind, dtype, out, got.data() + o * DTypeSize(out), groups[o]))
              << ReduceKindName(kind) << " " << DTypeName(dtype) << " " << view.name
              << " axes (" << absl::StrJoin(axes, ",") << ") output " << o;
        }
      }
    }
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Stream> stream_;
};

TEST_F(CudaReduceStridedTest, EveryKindAndDTypeOver3dViews) {
  for (const View& view : Views3d()) {
    for (DType dtype : kDTypes) CheckView(view, dtype, /*nans=*/false);
  }
}

TEST_F(CudaReduceStridedTest, EveryKindAndDTypeOver4dViews) {
  for (const View& view : Views4d()) {
    for (DType dtype : kDTypes) CheckView(view, dtype, /*nans=*/false);
  }
}

TEST_F(CudaReduceStridedTest, NansPropagateAndArgReportsTheFirst) {
  for (const View& view : Views3d()) {
    for (DType dtype : {DType::kFloat32, DType::kFloat64}) CheckView(view, dtype, /*nans=*/true);
  }
}

// Shapes whose reduced range is cut into chunks on every path (the merge by warps and by
// blocks), run twice: the results must be right and bitwise the same.
TEST_F(CudaReduceStridedTest, ChunkedPathsAreRightAndBitwiseRepeatable) {
  const std::vector<std::pair<View, std::vector<int32_t>>> cases = {
      // Rows, 12 chunks per output: three long rows of a column slice.
      {{"rows", {3, 200000}, {{3, 100000}, {200000, 2}, 0}}, {1}},
      // Columns, over 512 chunks per output: a (70000, 3) slice reduced over axis 0.
      {{"columns", {70000, 6}, {{70000, 3}, {6, 2}, 1}}, {0}},
      // The whole of a strided array, 64 chunks.
      {{"whole", {1 << 20}, {{1 << 19}, {2}, 0}}, {0}},
      // The middle axis of a transposed array.
      {{"middle", {64, 300, 40}, {{40, 300, 64}, {1, 40, 12000}, 0}}, {1}},
  };
  for (const auto& [view, axes] : cases) {
    for (DType dtype : {DType::kFloat32, DType::kInt64, DType::kFloat64}) {
      for (ReduceKind kind : {ReduceKind::kSum, ReduceKind::kMean, ReduceKind::kMax,
                              ReduceKind::kArgmin, ReduceKind::kNorm2, ReduceKind::kVar,
                              ReduceKind::kAll}) {
        const std::vector<double> base = MakeValues(dtype, kind, Product(view.base_shape), 3, false);
        ASSIGN_OR_FAIL(DeviceMemory memory,
                       Upload<uint8_t>(*backend_, *stream_, ToBytes(base, dtype)));
        const StridedReduce reduce = PlainReduce(kind, dtype, view.layout, axes);
        const auto groups = Gather(base, view.layout, axes,
                                   [&](int64_t off) { return AsRead(base[off], dtype); });
        const std::vector<uint8_t> first = Run(reduce, {&memory}, dtype, groups.size());
        const std::vector<uint8_t> second = Run(reduce, {&memory}, dtype, groups.size());
        EXPECT_EQ(first, second) << view.name << " " << ReduceKindName(kind) << " "
                                 << DTypeName(dtype) << ": runs differ";
        const DType out = ReduceResultDType(kind, dtype);
        for (size_t o = 0; o < groups.size(); ++o) {
          ASSERT_TRUE(Matches(kind, dtype, out, first.data() + o * DTypeSize(out), groups[o]))
              << view.name << " " << ReduceKindName(kind) << " " << DTypeName(dtype)
              << " output " << o;
        }
      }
    }
  }
}

// Empty reductions: sums of nothing are 0, means NaN; nothing is written for no outputs.
TEST_F(CudaReduceStridedTest, EmptyReductions) {
  StridedReduce reduce;
  reduce.dtype = DType::kFloat64;
  reduce.shape = {3, 0};
  reduce.axes = {1};
  reduce.inputs = {{nullptr, {{3, 0}, {0, 1}, 0}}};
  ASSIGN_OR_FAIL(DeviceMemory memory, backend_->Allocate(0, 8));
  reduce.kind = ReduceKind::kSum;
  std::vector<uint8_t> got = Run(reduce, {&memory}, DType::kFloat64, 3);
  std::vector<double> sums(3);
  std::memcpy(sums.data(), got.data(), 24);
  EXPECT_EQ(sums, std::vector<double>(3, 0.0));
  reduce.kind = ReduceKind::kMean;
  got = Run(reduce, {&memory}, DType::kFloat64, 3);
  double mean = 0;
  std::memcpy(&mean, got.data(), 8);
  EXPECT_TRUE(std::isnan(mean));
}

// ---- expressions

struct ExpressionCase {
  std::string text;
  expr::InputMap inputs;
  std::vector<View> views;  // one per array input, in input-name order
  std::vector<int64_t> shape;
  std::vector<int32_t> axes;
  ReduceKind kind;
  // The value at one index from each input's element there, computed in float64 (exact
  // for these cases) before it is rounded to the expression's dtype.
  std::function<double(const std::vector<double>&)> value;
};

std::vector<ExpressionCase> ExpressionCases() {
  const int64_t n = (1 << 20) + 3;
  const View x1d = Contiguous({n});
  std::vector<ExpressionCase> cases;
  cases.push_back({"x*y", {{"x", ArrayInput{DType::kFloat32}}, {"y", ArrayInput{DType::kFloat32}}},
                   {x1d, x1d}, {n}, {0}, ReduceKind::kSum,
                   [](const std::vector<double>& v) { return v[0] * v[1]; }});
  // sum((x - m)**2, axis=1) with m of shape (rows, 1) broadcast along the rows.
  const View x2d = Contiguous({300, 700});
  const View m2d{"m", {300, 1}, {{300, 700}, {1, 0}, 0}};
  cases.push_back({"(x - m)**2", {{"m", ArrayInput{DType::kFloat64}}, {"x", ArrayInput{DType::kFloat64}}},
                   {m2d, x2d}, {300, 700}, {1}, ReduceKind::kSum,
                   [](const std::vector<double>& v) { return (v[1] - v[0]) * (v[1] - v[0]); }});
  // max(abs(a - b)) over the whole of a transposed a and a contiguous b.
  const View at{"a", {50, 40}, {{40, 50}, {1, 40}, 0}};
  const View b2d = Contiguous({40, 50});
  cases.push_back({"abs(a - b)", {{"a", ArrayInput{DType::kFloat64}}, {"b", ArrayInput{DType::kFloat64}}},
                   {at, b2d}, {40, 50}, {0, 1}, ReduceKind::kMax,
                   [](const std::vector<double>& v) { return std::fabs(v[0] - v[1]); }});
  // mean(where(x*x + y*y <= 1, 1, 0)) per column of a (2000, 30) pair.
  const View p2d = Contiguous({2000, 30});
  cases.push_back({"where(x*x + y*y <= 1, 1, 0)",
                   {{"x", ArrayInput{DType::kFloat64}}, {"y", ArrayInput{DType::kFloat64}}},
                   {p2d, p2d}, {2000, 30}, {0}, ReduceKind::kMean,
                   [](const std::vector<double>& v) { return v[0] * v[0] + v[1] * v[1] <= 1 ? 1.0 : 0.0; }});
  // argmax of x + 2.5 along axis 0 of a reversed view (a scalar parameter).
  const View rev{"rev", {500, 9}, {{500, 9}, {-9, 1}, 499 * 9}};
  cases.push_back({"x + s", {{"s", expr::ScalarInput{DType::kFloat64, 2.5}}, {"x", ArrayInput{DType::kFloat32}}},
                   {rev}, {500, 9}, {0}, ReduceKind::kArgmax,
                   [](const std::vector<double>& v) { return v[0] + 2.5; }});
  // any / all of x - x, which is NaN (true) only where x is NaN, over rows and columns.
  const View xn = Contiguous({64, 300});
  for (ReduceKind kind : {ReduceKind::kAny, ReduceKind::kAll}) {
    for (int32_t axis : {0, 1}) {
      cases.push_back({"x - x", {{"x", ArrayInput{DType::kFloat64}}}, {xn}, {64, 300}, {axis},
                       kind, [](const std::vector<double>& v) { return v[0] - v[0]; }});
    }
  }
  // var of x * 2 along the last axis (ddof kVarDdof).
  cases.push_back({"x * 2", {{"x", ArrayInput{DType::kFloat32}}}, {x2d}, {300, 700}, {1},
                   ReduceKind::kVar, [](const std::vector<double>& v) { return v[0] * 2; }});
  return cases;
}

TEST_F(CudaReduceStridedTest, FusedExpressions) {
  for (const ExpressionCase& c : ExpressionCases()) {
    SCOPED_TRACE(c.text);
    ASSIGN_OR_FAIL(const expr::Program program, expr::Compile(c.text, c.inputs));
    std::vector<std::vector<double>> bases;
    std::vector<DeviceMemory> memories;
    std::vector<DType> dtypes;
    for (const auto& [name, type] : c.inputs) {
      if (const auto* array = std::get_if<ArrayInput>(&type)) dtypes.push_back(array->dtype);
    }
    for (size_t i = 0; i < c.views.size(); ++i) {
      const bool nans = c.kind == ReduceKind::kAny || c.kind == ReduceKind::kAll;
      bases.push_back(MakeValues(dtypes[i], c.kind, Product(c.views[i].base_shape), 11 + i, nans));
      ASSIGN_OR_FAIL(DeviceMemory m, Upload<uint8_t>(*backend_, *stream_, ToBytes(bases[i], dtypes[i])));
      memories.push_back(std::move(m));
    }
    StridedReduce reduce;
    reduce.kind = c.kind;
    reduce.dtype = program.result_dtype();
    reduce.ddof = c.kind == ReduceKind::kVar ? kVarDdof : 0;
    reduce.program = &program;
    reduce.shape = c.shape;
    reduce.axes = c.axes;
    std::vector<const DeviceMemory*> buffers;
    size_t next = 0;
    for (const auto& [name, type] : c.inputs) {
      if (std::holds_alternative<ArrayInput>(type)) {
        reduce.inputs.push_back({nullptr, c.views[next].layout});
        buffers.push_back(&memories[next++]);
      } else {
        reduce.inputs.push_back({nullptr, {}});
      }
    }
    // Scalars keep null memory: Run fills in only the arrays' entries, in order.
    std::vector<const DeviceMemory*> all;
    next = 0;
    for (const StridedInput& input : reduce.inputs) {
      all.push_back(input.layout.shape.empty() ? nullptr : buffers[next++]);
    }
    // The reference: gather every input's element at each index of the shape.
    const StridedLayout index_space{c.shape, CStrides(c.shape), 0};
    std::vector<double> flat(Product(c.shape));
    for (int64_t i = 0; i < Product(c.shape); ++i) {
      std::vector<double> args;
      int64_t rest = i;
      std::vector<int64_t> index(c.shape.size());
      for (int d = static_cast<int>(c.shape.size()) - 1; d >= 0; --d) {
        index[d] = rest % c.shape[d];
        rest /= c.shape[d];
      }
      for (size_t a = 0; a < c.views.size(); ++a) {
        int64_t off = c.views[a].layout.offset;
        for (size_t d = 0; d < index.size(); ++d) off += index[d] * c.views[a].layout.strides[d];
        args.push_back(AsRead(bases[a][off], dtypes[a]));
      }
      flat[i] = AsRead(c.value(args), program.result_dtype());
    }
    const auto groups = Gather(flat, index_space, c.axes, [&](int64_t off) { return flat[off]; });
    const DType value_dtype = program.result_dtype();
    const std::vector<uint8_t> first = Run(reduce, all, value_dtype, groups.size());
    const std::vector<uint8_t> second = Run(reduce, all, value_dtype, groups.size());
    EXPECT_EQ(first, second) << "runs differ";
    const DType out = ReduceResultDType(c.kind, value_dtype);
    ASSERT_EQ(first.size(), groups.size() * DTypeSize(out));
    for (size_t o = 0; o < groups.size(); ++o) {
      ASSERT_TRUE(Matches(c.kind, value_dtype, out, first.data() + o * DTypeSize(out), groups[o]))
          << "output " << o;
    }
  }
}

// ---- throughput, for kernels/PERFORMANCE.md (run by hand: --gtest_also_run_disabled_tests)

// Seconds per run of `enqueue`, the median of `runs` timed with the backend's events.
double MedianSeconds(Backend& backend, Stream& stream, const std::function<void()>& enqueue,
                     int runs = 15) {
  enqueue();  // warm-up (and the NVRTC compile)
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) {
    auto start = stream.Record();
    enqueue();
    auto end = stream.Record();
    EXPECT_OK(conformance::Synchronize(stream));
    if (!start.ok() || !end.ok()) return 0;
    seconds.push_back(*backend.ElapsedSeconds(**start, **end));
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

TEST_F(CudaReduceStridedTest, DISABLED_Throughput) {
  const int64_t n = int64_t{1} << 28;
  ASSIGN_OR_FAIL(DeviceMemory x, backend_->Allocate(0, n * 4));
  ASSIGN_OR_FAIL(DeviceMemory y, backend_->Allocate(0, n * 4));
  ASSIGN_OR_FAIL(DeviceMemory out, backend_->Allocate(0, int64_t{1} << 24));
  ASSERT_OK(backend_->Random(*stream_, RandomParams{}, DType::kFloat32, x, n));
  ASSERT_OK(backend_->Random(*stream_, RandomParams{}, DType::kFloat32, y, n));
  // Reading n float32 once, as a copy moves it (half of the copy's bytes are reads).
  const double copy = MedianSeconds(*backend_, *stream_, [&] {
    EXPECT_OK(backend_->Copy(*stream_, x, 0, y, 0, n * 4));
  });
  const double read_seconds = copy / 2;
  std::printf("copy of %lld float32: %.3f ms (%.0f GB/s counting reads and writes)\n",
              static_cast<long long>(n), copy * 1e3, 2.0 * n * 4 / copy / 1e9);
  // The buffer as (1024, 1024, 256) in C order (kDense), and transposed (the general
  // paths).
  const std::vector<std::pair<std::string, StridedLayout>> layouts = {
      {"(1024, 1024, 256)", {{1024, 1024, 256}, {262144, 256, 1}, 0}},
      {"a transposed (256, 1024, 1024)", {{256, 1024, 1024}, {1, 256, 262144}, 0}}};
  for (const auto& [name, layout] : layouts) {
    for (int32_t axis = 0; axis < 3; ++axis) {
      StridedReduce reduce = PlainReduce(ReduceKind::kSum, DType::kFloat32, layout, {axis});
      reduce.inputs[0].memory = &x;
      const double t = MedianSeconds(*backend_, *stream_, [&] {
        EXPECT_OK(backend_->ReduceStrided(*stream_, reduce, out).status());
      });
      std::printf("sum over axis %d of %s float32: %.3f ms, %.2f of reading it once\n", axis,
                  name.c_str(), t * 1e3, read_seconds / t);
    }
  }
  ASSIGN_OR_FAIL(const expr::Program program,
                 expr::Compile("x*y", {{"x", ArrayInput{DType::kFloat32}},
                                       {"y", ArrayInput{DType::kFloat32}}}));
  StridedReduce fused;
  fused.dtype = DType::kFloat32;
  fused.program = &program;
  fused.shape = {n};
  fused.axes = {0};
  fused.inputs = {{&x, {{n}, {1}, 0}}, {&y, {{n}, {1}, 0}}};
  const double t = MedianSeconds(*backend_, *stream_, [&] {
    EXPECT_OK(backend_->ReduceStrided(*stream_, fused, out).status());
  });
  std::printf("sum(x*y) over 2^28 float32: %.3f ms, %.2f of reading x and y once\n", t * 1e3,
              2 * read_seconds / t);
}

// ---- the generated sources, without a GPU

TEST(ReduceCodegenTest, GeneratedSourcesCompileForSm90) {
  cuda::NvrtcCompiler compiler("");
  const expr::InputMap inputs = {{"x", ArrayInput{DType::kFloat32}},
                                 {"y", ArrayInput{DType::kFloat32}},
                                 {"i", ArrayInput{DType::kInt32}},
                                 {"b", ArrayInput{DType::kBool}},
                                 {"s", expr::ScalarInput{DType::kFloat64, 2.5}}};
  struct Case {
    std::string text;
    ReduceKind kind;
    std::vector<std::string> names;  // the inputs it reads
  };
  const std::vector<Case> cases = {
      {"x*y", ReduceKind::kSum, {"x", "y"}},
      {"(x - s)**2", ReduceKind::kMean, {"s", "x"}},
      {"abs(x - y)", ReduceKind::kMax, {"x", "y"}},
      {"x + i", ReduceKind::kArgmin, {"i", "x"}},
      {"b", ReduceKind::kProd, {"b"}},
      {"where(x*x + y*y <= 1, 1, 0)", ReduceKind::kNorm2, {"x", "y"}},
      {"i * 2", ReduceKind::kMin, {"i"}},
      {"x != x", ReduceKind::kArgmax, {"x"}},
      {"x - y", ReduceKind::kVar, {"x", "y"}},
      {"x * s", ReduceKind::kStd, {"s", "x"}},
      {"b", ReduceKind::kAny, {"b"}},
      {"x - x", ReduceKind::kAll, {"x"}},
  };
  for (const Case& c : cases) {
    expr::InputMap used;
    for (const std::string& name : c.names) used.emplace(name, inputs.at(name));
    ASSIGN_OR_FAIL(const expr::Program program, expr::Compile(c.text, used));
    ASSIGN_OR_FAIL(const cuda::ReductionSource source, cuda::GenerateReduction(program, c.kind));
    EXPECT_EQ(source.source.find('@'), std::string::npos) << "an unfilled placeholder";
    EXPECT_OK(compiler.Compile(source.source, 90).status()) << c.text << "\n" << source.source;
  }
}

}  // namespace
}  // namespace gpucompute
