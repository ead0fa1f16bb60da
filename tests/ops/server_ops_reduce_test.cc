// End-to-end tests of Submit's reductions: every kind, axis, layout and dtype against
// NumPy's definition, inline values and result buffers, empty inputs, and rejected
// requests that change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

constexpr size_t kRows = 37, kCols = 53;

// Logical (C-order) test matrix in [0.75, 1.25] with planted ties: the global minimum 0.5 at
// (5, 2) and (30, 1) and maximum 1.5 at (8, 4) and (33, 0) (the first in C order is not the
// first in F memory order); column 7 has its minimum 0.6 at rows 3 and 20 and column 9 its
// maximum 1.4 at rows 2 and 25; row 11 has its minimum 0.6 at columns 10 and 40 and row 15
// its maximum 1.4 at columns 5 and 45. Values are multiples of 2^-12 so the int32 variant
// (x - 1) * 4000 rounds them, keeping the ties, and float32 holds them exactly.
std::vector<double> ReduceMatrix() {
  Lcg g(50);
  std::vector<double> a(kRows * kCols);
  for (double& v : a) v = 1 + std::round(g.Uniform(-0.24, 0.24) * 4096) / 4096;
  auto at = [&](size_t i, size_t j) -> double& { return a[i * kCols + j]; };
  at(5, 2) = at(30, 1) = 0.5;
  at(8, 4) = at(33, 0) = 1.5;
  at(3, 7) = at(20, 7) = 0.625;
  at(2, 9) = at(25, 9) = 1.375;
  at(11, 10) = at(11, 40) = 0.625;
  at(15, 5) = at(15, 45) = 1.375;
  return a;
}

// NumPy's reduction of `v` (in order) in float64; argmin/argmax give the first index.
// Integer sums and products wrap modulo 2^64 as NumPy's int64 do.
double ReferenceReduce(v1::ReduceKind kind, const std::vector<double>& v, bool integer) {
  switch (kind) {
    case v1::REDUCE_KIND_SUM: {
      if (integer) {
        uint64_t s = 0;
        for (double x : v) s += static_cast<uint64_t>(static_cast<int64_t>(x));
        return static_cast<double>(static_cast<int64_t>(s));
      }
      long double s = 0;
      for (double x : v) s += x;
      return static_cast<double>(s);
    }
    case v1::REDUCE_KIND_PROD: {
      long double p = 1;
      for (double x : v) p *= x;
      return static_cast<double>(p);
    }
    case v1::REDUCE_KIND_MIN:
      return *std::min_element(v.begin(), v.end());
    case v1::REDUCE_KIND_MAX:
      return *std::max_element(v.begin(), v.end());
    case v1::REDUCE_KIND_MEAN: {
      long double s = 0;
      for (double x : v) s += x;
      return static_cast<double>(s / v.size());
    }
    case v1::REDUCE_KIND_NORM2: {
      long double s = 0;
      for (double x : v) s += static_cast<long double>(x) * x;
      return static_cast<double>(std::sqrt(s));
    }
    case v1::REDUCE_KIND_ARGMIN:
      return static_cast<double>(std::min_element(v.begin(), v.end()) - v.begin());
    case v1::REDUCE_KIND_ARGMAX:
      return static_cast<double>(std::max_element(v.begin(), v.end()) - v.begin());
    default:
      break;
  }
  return std::nan("");
}

// Product of integers as NumPy's int64: wrapping.
int64_t ReferenceIntProd(const std::vector<double>& v) {
  uint64_t p = 1;
  for (double x : v) p *= static_cast<uint64_t>(static_cast<int64_t>(x));
  return static_cast<int64_t>(p);
}

v1::DType ReduceResultDType(v1::ReduceKind kind, v1::DType in) {
  const bool is_float = in == v1::DTYPE_FLOAT32 || in == v1::DTYPE_FLOAT64;
  switch (kind) {
    case v1::REDUCE_KIND_SUM:
    case v1::REDUCE_KIND_PROD:
      return is_float ? in : v1::DTYPE_INT64;
    case v1::REDUCE_KIND_MEAN:
    case v1::REDUCE_KIND_NORM2:
      return is_float ? in : v1::DTYPE_FLOAT64;
    case v1::REDUCE_KIND_MIN:
    case v1::REDUCE_KIND_MAX:
      return in;
    default:
      return v1::DTYPE_INT64;
  }
}

// Downloads a result buffer of `dtype` as doubles (int64 values are exact up to 2^53; the
// test's integers stay well inside, except wrapped products, compared separately).
absl::StatusOr<std::vector<double>> DownloadAsDoubles(Client& client, const std::string& id,
                                                      v1::DType dtype) {
  std::vector<double> out;
  auto convert = [&](auto typed) -> absl::Status {
    if (!typed.ok()) return typed.status();
    for (auto v : *typed) out.push_back(static_cast<double>(v));
    return absl::OkStatus();
  };
  absl::Status s;
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      s = convert(DownloadArray<float>(client, id));
      break;
    case v1::DTYPE_FLOAT64:
      s = convert(DownloadArray<double>(client, id));
      break;
    case v1::DTYPE_INT32:
      s = convert(DownloadArray<int32_t>(client, id));
      break;
    case v1::DTYPE_INT64:
      s = convert(DownloadArray<int64_t>(client, id));
      break;
    default:
      return absl::InternalError("unexpected dtype");
  }
  if (!s.ok()) return s;
  return out;
}

TEST_F(ServerOpsTest, ReduceAllKindsAxesLayoutsAndDtypes) {
  const std::vector<double> matrix = ReduceMatrix();
  const std::vector<v1::ReduceKind> kinds = {
      v1::REDUCE_KIND_SUM,  v1::REDUCE_KIND_PROD,  v1::REDUCE_KIND_MIN,    v1::REDUCE_KIND_MAX,
      v1::REDUCE_KIND_MEAN, v1::REDUCE_KIND_NORM2, v1::REDUCE_KIND_ARGMIN, v1::REDUCE_KIND_ARGMAX};
  int checked = 0;
  for (v1::DType dtype : {v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT32, v1::DTYPE_INT32}) {
    const bool integer = dtype == v1::DTYPE_INT32;
    // The logical values as the server holds them.
    std::vector<double> values = matrix;
    if (integer) {
      for (double& v : values) v = std::round((v - 1) * 4000);
    }
    // Unit roundoff of the accumulation the result is rounded to.
    const double unit = dtype == v1::DTYPE_FLOAT32 ? 0x1.0p-24 : 0x1.0p-53;
    for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F, v1::LAYOUT_UNSPECIFIED}) {
      // LAYOUT_UNSPECIFIED stands for a 1-D array of the same values (C order).
      const bool one_d = layout == v1::LAYOUT_UNSPECIFIED;
      std::vector<uint64_t> shape =
          one_d ? std::vector<uint64_t>{kRows * kCols} : std::vector<uint64_t>{kRows, kCols};
      const v1::Layout upload_layout = one_d ? v1::LAYOUT_C : layout;
      absl::StatusOr<v1::BufferInfo> buffer;
      switch (dtype) {
        case v1::DTYPE_FLOAT64:
          buffer = UploadArray(c(), ToMemory<double>(values, kRows, kCols, upload_layout), shape,
                               upload_layout);
          break;
        case v1::DTYPE_FLOAT32:
          buffer = UploadArray(c(), ToMemory<float>(values, kRows, kCols, upload_layout), shape,
                               upload_layout);
          break;
        default:
          buffer = UploadArray(c(), ToMemory<int32_t>(values, kRows, kCols, upload_layout), shape,
                               upload_layout);
          break;
      }
      ASSERT_OK(buffer);
      const std::vector<std::optional<int>> axes =
          one_d ? std::vector<std::optional<int>>{std::nullopt}
                : std::vector<std::optional<int>>{std::nullopt, 0, 1, -1, -2};
      for (const std::optional<int>& axis : axes) {
        // The sequences reduced, in index order, one per result element.
        std::vector<std::vector<double>> groups;
        if (!axis.has_value()) {
          groups.push_back(values);  // C order, also for F arrays (as numpy flattens)
        } else if (*axis == 0 || *axis == -2) {
          for (size_t j = 0; j < kCols; ++j) {
            groups.emplace_back();
            for (size_t i = 0; i < kRows; ++i) groups.back().push_back(values[i * kCols + j]);
          }
        } else {
          for (size_t i = 0; i < kRows; ++i) {
            groups.emplace_back(values.begin() + i * kCols, values.begin() + (i + 1) * kCols);
          }
        }
        for (v1::ReduceKind kind : kinds) {
          const std::string what = absl::StrCat(
              v1::DType_Name(dtype), " ", one_d ? "1-D" : v1::Layout_Name(layout), " axis ",
              axis.has_value() ? absl::StrCat(*axis) : "none", " ", v1::ReduceKind_Name(kind));
          SCOPED_TRACE(what);
          ASSIGN_OR_FAIL(auto op, RunOp(c(), Reduce(kind, buffer->id(), axis)));
          EXPECT_EQ(op.kind(), v1::OPERATION_KIND_REDUCE);
          const v1::DType result_dtype = ReduceResultDType(kind, dtype);
          ASSERT_EQ(op.outputs_size(), 1);
          EXPECT_EQ(op.outputs(0).dtype(), result_dtype);
          if (axis.has_value()) {
            ASSERT_EQ(op.outputs(0).shape_size(), 1);
            EXPECT_EQ(op.outputs(0).shape(0), groups.size());
          } else {
            EXPECT_EQ(op.outputs(0).shape_size(), 0);  // a 0-d result
          }
          ASSERT_EQ(op.values_size(), static_cast<int>(groups.size()));
          ASSIGN_OR_FAIL(auto downloaded, DownloadAsDoubles(c(), op.outputs(0).id(), result_dtype));
          ASSERT_EQ(downloaded.size(), groups.size());
          const bool float_result =
              result_dtype == v1::DTYPE_FLOAT32 || result_dtype == v1::DTYPE_FLOAT64;
          for (size_t g = 0; g < groups.size(); ++g) {
            const v1::Scalar& inline_value = op.values(static_cast<int>(g));
            double got_inline;
            if (float_result) {
              ASSERT_EQ(inline_value.value_case(), v1::Scalar::kFloatValue) << g;
              got_inline = inline_value.float_value();
            } else {
              ASSERT_EQ(inline_value.value_case(), v1::Scalar::kIntValue) << g;
              got_inline = static_cast<double>(inline_value.int_value());
            }
            // Inline values and the buffer hold the same result.
            EXPECT_EQ(got_inline, downloaded[g]) << "element " << g;
            const std::vector<double>& group = groups[g];
            if (integer && kind == v1::REDUCE_KIND_PROD) {
              ASSERT_EQ(inline_value.int_value(), ReferenceIntProd(group)) << "element " << g;
              continue;
            }
            const double ref = ReferenceReduce(kind, group, integer);
            const double n = static_cast<double>(group.size());
            double tolerance = 0;  // min, max, arg*, integer sums: exact
            if (!integer && (kind == v1::REDUCE_KIND_SUM || kind == v1::REDUCE_KIND_MEAN ||
                             kind == v1::REDUCE_KIND_PROD || kind == v1::REDUCE_KIND_NORM2)) {
              // Positive values: any summation (or multiplication) order is within
              // gamma_{n+2} of the exact result.
              tolerance = (n + 2) * unit * std::fabs(ref);
            } else if (integer && (kind == v1::REDUCE_KIND_MEAN || kind == v1::REDUCE_KIND_NORM2)) {
              // Exact integer sum (below 2^53) and one rounding for / or sqrt.
              tolerance = 2 * 0x1.0p-53 * std::fabs(ref);
            }
            EXPECT_LE(std::fabs(got_inline - ref), tolerance)
                << "element " << g << ": got " << got_inline << ", want " << ref;
            ++checked;
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
}

TEST_F(ServerOpsTest, ReduceWholeFArrayArgExtremaAreCOrderIndices) {
  // numpy.argmin(a) of a Fortran-ordered array is the index into a.ravel() (C order) of the
  // first extreme in C order. 3 x 4 F array with the minimum -1 at (0, 1) and (2, 0): C order
  // finds (0, 1) first (flat 1), although (2, 0) comes first in memory (position 2 vs 3).
  const std::vector<double> logical = {5,  -1, 7, 8,   // row 0
                                       6,  9,  2, 9,   // row 1: maximum 9 at (1, 1) and (1, 3)
                                       -1, 4,  3, 1};  // row 2
  ASSIGN_OR_FAIL(auto f, UploadArray(c(), ToMemory<double>(logical, 3, 4, v1::LAYOUT_F), {3, 4},
                                     v1::LAYOUT_F));
  ASSIGN_OR_FAIL(auto argmin, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMIN, f.id())));
  ASSERT_EQ(argmin.values_size(), 1);
  EXPECT_EQ(argmin.values(0).int_value(), 1) << "numpy.argmin gives 1 (the first -1 in C order)";
  ASSIGN_OR_FAIL(auto argmax, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMAX, f.id())));
  ASSERT_EQ(argmax.values_size(), 1);
  // Maximum 9 at (1, 1) = flat 5 and (1, 3) = flat 7; in F memory (1, 1) is position 4 and
  // (1, 3) position 10, so both orders agree here: 5.
  EXPECT_EQ(argmax.values(0).int_value(), 5);
  ASSIGN_OR_FAIL(auto downloaded, DownloadArray<int64_t>(c(), argmin.outputs(0).id()));
  ASSERT_EQ(downloaded.size(), 1u);
  EXPECT_EQ(downloaded[0], argmin.values(0).int_value());
  // A NaN wins: the first NaN in C order.
  std::vector<double> with_nan = logical;
  with_nan[6] = std::nan("");  // (1, 2): F position 7
  with_nan[9] = std::nan("");  // (2, 1): F position 5
  ASSIGN_OR_FAIL(auto fn, UploadArray(c(), ToMemory<double>(with_nan, 3, 4, v1::LAYOUT_F), {3, 4},
                                      v1::LAYOUT_F));
  ASSIGN_OR_FAIL(auto argmin_nan, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMIN, fn.id())));
  EXPECT_EQ(argmin_nan.values(0).int_value(), 6)
      << "numpy.argmin gives the first NaN in C order, 6";
}

TEST_F(ServerOpsTest, ReduceIntoExistingOutputAndLargeResults) {
  const std::vector<double> matrix = ReduceMatrix();
  ASSIGN_OR_FAIL(auto a, UploadArray(c(), matrix, {kRows, kCols}));
  ASSIGN_OR_FAIL(auto out, UploadArray(c(), std::vector<double>(kCols, -7.0)));
  const Snapshot before = TakeSnapshot(c());
  ASSIGN_OR_FAIL(auto op,
                 RunOp(c(), Reduce(v1::REDUCE_KIND_MAX, a.id(), 0, ExistingOutput(out.id()))));
  EXPECT_EQ(op.outputs(0).id(), out.id());
  EXPECT_EQ(TakeSnapshot(c()), before);
  ASSIGN_OR_FAIL(auto got, DownloadArray<double>(c(), out.id()));
  ASSERT_EQ(got.size(), kCols);
  for (size_t j = 0; j < kCols; ++j) {
    double m = -1e300;
    for (size_t i = 0; i < kRows; ++i) m = std::max(m, matrix[i * kCols + j]);
    EXPECT_EQ(got[j], m) << j;
  }
  // More than 4096 results: none inline, all in the buffer.
  constexpr size_t rows = 5000;
  std::vector<int32_t> tall(rows * 2);
  for (size_t i = 0; i < tall.size(); ++i) tall[i] = static_cast<int32_t>(i % 1000) - 500;
  ASSIGN_OR_FAIL(auto t, UploadArray(c(), tall, {rows, 2}));
  ASSIGN_OR_FAIL(auto sums, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, t.id(), 1)));
  EXPECT_EQ(sums.values_size(), 0);
  EXPECT_EQ(sums.outputs(0).dtype(), v1::DTYPE_INT64);
  ASSIGN_OR_FAIL(auto row_sums, DownloadArray<int64_t>(c(), sums.outputs(0).id()));
  ASSERT_EQ(row_sums.size(), rows);
  for (size_t i = 0; i < rows; ++i)
    ASSERT_EQ(row_sums[i], int64_t{tall[2 * i]} + tall[2 * i + 1]) << i;
  // Exactly 4096 results are still inline.
  ASSIGN_OR_FAIL(auto t2, UploadArray(c(), std::vector<int32_t>(4096 * 2, 1), {4096, 2}));
  ASSIGN_OR_FAIL(auto sums2, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, t2.id(), -1)));
  ASSERT_EQ(sums2.values_size(), 4096);
  for (const v1::Scalar& v : sums2.values()) ASSERT_EQ(v.int_value(), 2);
}

TEST_F(ServerOpsTest, ReduceEmptyAndRejections) {
  v1::CreateBufferRequest empty_request;
  empty_request.set_dtype(v1::DTYPE_FLOAT64);
  empty_request.add_shape(0);
  ASSIGN_OR_FAIL(auto empty, c().CreateBuffer(empty_request));
  // Reductions with an identity are defined on zero elements, as in NumPy.
  ASSIGN_OR_FAIL(auto sum, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, empty.id())));
  ASSERT_EQ(sum.values_size(), 1);
  EXPECT_EQ(sum.values(0).float_value(), 0.0);
  ASSIGN_OR_FAIL(auto prod, RunOp(c(), Reduce(v1::REDUCE_KIND_PROD, empty.id())));
  ASSERT_EQ(prod.values_size(), 1);
  EXPECT_EQ(prod.values(0).float_value(), 1.0);

  ASSIGN_OR_FAIL(auto v, UploadArray(c(), RandomDoubles(100, 0, 1, 60)));
  ASSIGN_OR_FAIL(auto m, UploadArray(c(), RandomDoubles(60, 0, 1, 61), {6, 10}));
  ASSIGN_OR_FAIL(auto m_empty_rows, c().CreateBuffer([] {
    v1::CreateBufferRequest r;
    r.set_dtype(v1::DTYPE_FLOAT64);
    r.add_shape(0);
    r.add_shape(5);
    return r;
  }()));
  ASSIGN_OR_FAIL(auto out_i32,
                 UploadArray(c(), std::vector<int32_t>(1, 77), std::vector<uint64_t>{}));
  ASSIGN_OR_FAIL(auto out_f64_short, UploadArray(c(), std::vector<double>(9, 1.0)));
  const std::vector<std::string> watched = {v.id(), m.id(), out_i32.id(), out_f64_short.id()};
  const auto reject = [&](const char* what, const v1::SubmitRequest& r, absl::StatusCode code) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, code, "", watched);
  };
  reject("min of empty", Reduce(v1::REDUCE_KIND_MIN, empty.id()),
         absl::StatusCode::kInvalidArgument);
  reject("max of empty", Reduce(v1::REDUCE_KIND_MAX, empty.id()),
         absl::StatusCode::kInvalidArgument);
  reject("argmin of empty", Reduce(v1::REDUCE_KIND_ARGMIN, empty.id()),
         absl::StatusCode::kInvalidArgument);
  reject("argmax of empty, named output",
         Reduce(v1::REDUCE_KIND_ARGMAX, empty.id(), {}, NewOutput("never")),
         absl::StatusCode::kInvalidArgument);
  reject("min along an empty axis", Reduce(v1::REDUCE_KIND_MIN, m_empty_rows.id(), 0),
         absl::StatusCode::kInvalidArgument);
  reject("axis 1 of 1-D", Reduce(v1::REDUCE_KIND_SUM, v.id(), 1),
         absl::StatusCode::kInvalidArgument);
  reject("axis -2 of 1-D", Reduce(v1::REDUCE_KIND_SUM, v.id(), -2),
         absl::StatusCode::kInvalidArgument);
  reject("axis 2 of 2-D", Reduce(v1::REDUCE_KIND_SUM, m.id(), 2),
         absl::StatusCode::kInvalidArgument);
  reject("axis -3 of 2-D", Reduce(v1::REDUCE_KIND_SUM, m.id(), -3),
         absl::StatusCode::kInvalidArgument);
  reject("no kind", Reduce(v1::REDUCE_KIND_UNSPECIFIED, m.id()),
         absl::StatusCode::kInvalidArgument);
  reject("unknown input", Reduce(v1::REDUCE_KIND_SUM, "buf-ffffffffffffffffffffffffffffffff"),
         absl::StatusCode::kNotFound);
  reject("float64 sum into an int32 buffer",
         Reduce(v1::REDUCE_KIND_SUM, v.id(), {}, ExistingOutput(out_i32.id())),
         absl::StatusCode::kInvalidArgument);
  reject("axis result into a buffer of the wrong length",
         Reduce(v1::REDUCE_KIND_SUM, m.id(), 0, ExistingOutput(out_f64_short.id())),
         absl::StatusCode::kInvalidArgument);
  reject("output is the input",
         Reduce(v1::REDUCE_KIND_SUM, m.id(), std::nullopt, ExistingOutput(m.id())),
         absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace gpucompute::testing
