// End-to-end tests of Submit's gemv: every layout and transpose, and views of A and x,
// against a float64 reference with a rounding bound, and rejected requests that change
// nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

// y = alpha * op(A) * x + beta * y0 in float64, with the matching bound
// gamma_K * (|alpha| * sum |A||x| + |beta y0|) scale for each element.
struct GemvRef {
  std::vector<double> y;
  std::vector<double> scale;  // |alpha| * sum_k |A||x| + |beta * y0|
};
GemvRef ReferenceGemv(const std::vector<double>& a, size_t rows, size_t cols, bool transpose,
                      double alpha, const std::vector<double>& x, double beta,
                      const std::vector<double>* y0) {
  const size_t p_len = transpose ? cols : rows;
  const size_t k_len = transpose ? rows : cols;
  GemvRef r{std::vector<double>(p_len), std::vector<double>(p_len)};
  for (size_t p = 0; p < p_len; ++p) {
    long double acc = 0, mag = 0;
    for (size_t k = 0; k < k_len; ++k) {
      const double aij = transpose ? a[k * cols + p] : a[p * cols + k];
      acc += static_cast<long double>(aij) * x[k];
      mag += std::fabs(static_cast<long double>(aij) * x[k]);
    }
    const double b = y0 != nullptr ? beta * (*y0)[p] : 0.0;
    r.y[p] = static_cast<double>(alpha * acc + b);
    r.scale[p] = static_cast<double>(std::fabs(alpha) * mag + std::fabs(b));
  }
  return r;
}

template <typename T>
void ExpectGemvClose(const std::vector<T>& got, const GemvRef& ref, double unit, size_t k_len,
                     std::string_view what) {
  ASSERT_EQ(got.size(), ref.y.size()) << what;
  // Any order of summing K products (each exact in float64 for float32 inputs, rounded
  // once for float64) plus the alpha/beta step is within (K + 3) units of the magnitude
  // scale; float32 results add one final rounding to float32.
  const double rel = (static_cast<double>(k_len) + 3) * unit;
  for (size_t p = 0; p < got.size(); ++p) {
    ASSERT_LE(std::fabs(static_cast<double>(got[p]) - ref.y[p]), rel * ref.scale[p] + 1e-300)
        << what << " y[" << p << "]: got " << got[p] << ", want " << ref.y[p];
  }
}

TEST_F(ServerOpsTest, GemvAllLayoutsAndTransposes) {
  constexpr size_t rows = 300, cols = 77;
  const std::vector<double> a = RandomDoubles(rows * cols, -1, 1, 20);
  for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    ASSIGN_OR_FAIL(auto ba,
                   UploadArray(c(), ToMemory<double>(a, rows, cols, layout), {rows, cols}, layout));
    ASSERT_EQ(ba.layout(), layout);
    ASSIGN_OR_FAIL(auto ba32,
                   UploadArray(c(), ToMemory<float>(a, rows, cols, layout), {rows, cols}, layout));
    for (bool transpose : {false, true}) {
      const std::string what =
          absl::StrCat(layout == v1::LAYOUT_F ? "F" : "C", transpose ? " transposed" : "");
      SCOPED_TRACE(what);
      const size_t k_len = transpose ? rows : cols;
      const size_t p_len = transpose ? cols : rows;
      const std::vector<double> x = RandomDoubles(k_len, -2, 2, 21 + transpose);
      ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));

      // New y: beta is ignored (there is no y to scale).
      ASSIGN_OR_FAIL(auto op,
                     RunOp(c(), Gemv(ba.id(), bx.id(), NewOutput(), transpose, 1.5, 0.75)));
      EXPECT_EQ(op.kind(), v1::OPERATION_KIND_GEMV);
      ASSERT_EQ(op.outputs_size(), 1);
      EXPECT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
      ASSERT_EQ(op.outputs(0).shape_size(), 1);
      EXPECT_EQ(op.outputs(0).shape(0), p_len);
      EXPECT_EQ(op.timing().flops(), 2 * rows * cols);
      EXPECT_EQ(op.timing().bytes_read(), (rows * cols + k_len) * 8);
      EXPECT_EQ(op.timing().bytes_written(), p_len * 8);
      ASSIGN_OR_FAIL(auto y_new, DownloadArray<double>(c(), op.outputs(0).id()));
      ExpectGemvClose(y_new, ReferenceGemv(a, rows, cols, transpose, 1.5, x, 0, nullptr), 0x1.0p-53,
                      k_len, "new y");

      // Existing y with alpha and beta.
      const std::vector<double> y0 = RandomDoubles(p_len, -3, 3, 30 + transpose);
      ASSIGN_OR_FAIL(auto by, UploadArray(c(), y0));
      ASSIGN_OR_FAIL(auto op2, RunOp(c(), Gemv(ba.id(), bx.id(), ExistingOutput(by.id()), transpose,
                                               -0.5, 2.0)));
      EXPECT_EQ(op2.outputs(0).id(), by.id());
      EXPECT_EQ(op2.timing().bytes_read(), (rows * cols + k_len + p_len) * 8);
      ASSIGN_OR_FAIL(auto y_acc, DownloadArray<double>(c(), by.id()));
      ExpectGemvClose(y_acc, ReferenceGemv(a, rows, cols, transpose, -0.5, x, 2.0, &y0), 0x1.0p-53,
                      k_len, "existing y, alpha -0.5, beta 2");

      // alpha left unset defaults to 1; beta unset is 0 (y's old contents do not matter).
      v1::SubmitRequest defaults = Gemv(ba.id(), bx.id(), ExistingOutput(by.id()), transpose);
      defaults.mutable_gemv()->clear_alpha();
      defaults.mutable_gemv()->clear_beta();
      ASSIGN_OR_FAIL(auto op3, RunOp(c(), defaults));
      ASSIGN_OR_FAIL(auto y_def, DownloadArray<double>(c(), by.id()));
      ExpectGemvClose(y_def, ReferenceGemv(a, rows, cols, transpose, 1.0, x, 0, nullptr), 0x1.0p-53,
                      k_len, "default alpha");

      // float32 A and x: products exact in float64; one more rounding to float32.
      ASSIGN_OR_FAIL(auto bx32, UploadArray(c(), Cast<float>(x)));
      ASSIGN_OR_FAIL(auto op4,
                     RunOp(c(), Gemv(ba32.id(), bx32.id(), NewOutput(), transpose, 2.0, 0)));
      EXPECT_EQ(op4.outputs(0).dtype(), v1::DTYPE_FLOAT32);
      ASSIGN_OR_FAIL(auto y32, DownloadArray<float>(c(), op4.outputs(0).id()));
      std::vector<double> a32(a.size()), x32(x.size());
      for (size_t i = 0; i < a.size(); ++i) a32[i] = static_cast<float>(a[i]);
      for (size_t i = 0; i < x.size(); ++i) x32[i] = static_cast<float>(x[i]);
      const GemvRef ref32 = ReferenceGemv(a32, rows, cols, transpose, 2.0, x32, 0, nullptr);
      ASSERT_EQ(y32.size(), p_len);
      for (size_t p = 0; p < p_len; ++p) {
        // The final rounding to float32 (2^-24 relative) dominates; float32 accumulation
        // would be within K * 2^-24 of the scale.
        ASSERT_LE(std::fabs(y32[p] - ref32.y[p]), (k_len + 2) * 0x1.0p-24 * ref32.scale[p]) << p;
      }
    }
  }
}

TEST_F(ServerOpsTest, GemvRejectionsChangeNothing) {
  constexpr size_t rows = 30, cols = 7;
  ASSIGN_OR_FAIL(auto a, UploadArray(c(), RandomDoubles(rows * cols, -1, 1, 40), {rows, cols}));
  ASSIGN_OR_FAIL(auto a1d, UploadArray(c(), RandomDoubles(rows * cols, -1, 1, 41)));
  std::vector<int32_t> ints(rows * cols, 3);
  ASSIGN_OR_FAIL(auto a_int, UploadArray(c(), ints, {rows, cols}));
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), RandomDoubles(cols, -1, 1, 42)));
  ASSIGN_OR_FAIL(auto x_rows, UploadArray(c(), RandomDoubles(rows, -1, 1, 43)));
  ASSIGN_OR_FAIL(auto x32, UploadArray(c(), std::vector<float>(cols, 1.0f)));
  ASSIGN_OR_FAIL(auto xi, UploadArray(c(), std::vector<int32_t>(cols, 1)));
  ASSIGN_OR_FAIL(auto y, UploadArray(c(), RandomDoubles(rows, -1, 1, 44)));
  ASSIGN_OR_FAIL(auto y_short, UploadArray(c(), RandomDoubles(rows - 1, -1, 1, 45)));
  ASSIGN_OR_FAIL(auto y32, UploadArray(c(), std::vector<float>(rows, 2.0f)));
  const std::vector<std::string> watched = {y.id(), y_short.id(), y32.id(), a.id(), x.id()};
  const auto reject = [&](const char* what, const v1::SubmitRequest& r, absl::StatusCode code) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, code, "", watched);
  };
  reject("1-D a", Gemv(a1d.id(), x.id(), ExistingOutput(y.id())),
         absl::StatusCode::kInvalidArgument);
  reject("1-D a, new y", Gemv(a1d.id(), x.id()), absl::StatusCode::kInvalidArgument);
  reject("int32 a", Gemv(a_int.id(), xi.id()), absl::StatusCode::kInvalidArgument);
  reject("float64 a, float32 x", Gemv(a.id(), x32.id(), ExistingOutput(y.id())),
         absl::StatusCode::kInvalidArgument);
  reject("x of the row count without transpose", Gemv(a.id(), x_rows.id(), ExistingOutput(y.id())),
         absl::StatusCode::kInvalidArgument);
  reject("x of the column count with transpose",
         Gemv(a.id(), x.id(), NewOutput(), /*transpose=*/true), absl::StatusCode::kInvalidArgument);
  reject("y of the wrong length", Gemv(a.id(), x.id(), ExistingOutput(y_short.id())),
         absl::StatusCode::kInvalidArgument);
  reject("float32 y for float64 a", Gemv(a.id(), x.id(), ExistingOutput(y32.id())),
         absl::StatusCode::kInvalidArgument);
  reject("new y of another dtype", Gemv(a.id(), x.id(), NewOutput("", v1::DTYPE_FLOAT32)),
         absl::StatusCode::kInvalidArgument);
  reject("unknown a", Gemv("buf-00000000000000000000000000000000", x.id()),
         absl::StatusCode::kNotFound);
  reject("unknown x", Gemv(a.id(), "no-such-x", NewOutput("never")), absl::StatusCode::kNotFound);
  reject("missing a", Gemv("", x.id()), absl::StatusCode::kInvalidArgument);
  // y aliasing x: a square matrix makes the lengths agree.
  ASSIGN_OR_FAIL(auto sq, UploadArray(c(), RandomDoubles(cols * cols, -1, 1, 46), {cols, cols}));
  reject("y is x", Gemv(sq.id(), x.id(), ExistingOutput(x.id())),
         absl::StatusCode::kInvalidArgument);
}

// A view of the dense row-major matrix `a` (rows x cols) as a dense row-major matrix:
// element (i, j) of the view is a[row(i, j) * cols + col(i, j)].
struct MatrixView {
  size_t rows, cols;
  std::function<size_t(size_t, size_t)> row, col;
};
std::vector<double> Dense(const std::vector<double>& a, size_t a_cols, const MatrixView& v) {
  std::vector<double> out;
  for (size_t i = 0; i < v.rows; ++i) {
    for (size_t j = 0; j < v.cols; ++j) out.push_back(a[v.row(i, j) * a_cols + v.col(i, j)]);
  }
  return out;
}

// gemv through views of A and x, in both layouts, against the float64 product of the
// elements NumPy's views hold: A transposed, blocks of rows and columns with steps, one
// column, and x at strides, negative ones included.
TEST_F(ServerOpsTest, GemvReadsViewsOfTheMatrixAndTheVector) {
  constexpr size_t kRows = 40, kCols = 30;
  const std::vector<double> a = RandomDoubles(kRows * kCols, -1, 1, 50);
  const std::vector<double> v = RandomDoubles(100, -2, 2, 51);
  ASSIGN_OR_FAIL(auto bv, UploadArray(c(), v, {}, v1::LAYOUT_C, "gv"));
  struct Case {
    std::string a_view;  // applied to "ga_C" or "ga_F"
    MatrixView matrix;
    std::string x;
    std::function<size_t(size_t)> x_at;  // index into v of x[k]
    bool transpose;
    // A step on the axis whose stride is 1 leaves no unit stride: such a view is read
    // in the layout where the step falls on the other axis only.
    v1::Layout only = v1::LAYOUT_UNSPECIFIED;
  };
  const std::vector<Case> cases = {
      {".T", {kCols, kRows, [](size_t, size_t j) { return j; }, [](size_t i, size_t) { return i; }},
       "gv[0:40]", [](size_t k) { return k; }, false},
      {".T", {kCols, kRows, [](size_t, size_t j) { return j; }, [](size_t i, size_t) { return i; }},
       "gv[10:40]", [](size_t k) { return 10 + k; }, true},
      {"[5:35, 2:22]",
       {30, 20, [](size_t i, size_t) { return 5 + i; }, [](size_t, size_t j) { return 2 + j; }},
       "gv[90:70:-1]", [](size_t k) { return 90 - k; }, false},
      {"[::2, 3:13]",
       {20, 10, [](size_t i, size_t) { return 2 * i; }, [](size_t, size_t j) { return 3 + j; }},
       "gv[0:60:3]", [](size_t k) { return 3 * k; }, true, v1::LAYOUT_C},
      {"[2:22, ::2]",
       {20, 15, [](size_t i, size_t) { return 2 + i; }, [](size_t, size_t j) { return 2 * j; }},
       "gv[99:24:-5]", [](size_t k) { return 99 - 5 * k; }, false, v1::LAYOUT_F},
      {"[:, 4:5]", {kRows, 1, [](size_t i, size_t) { return i; }, [](size_t, size_t) { return 4; }},
       "gv[7:8]", [](size_t) { return 7; }, false},
      {"[0:10, 0:25].T",
       {25, 10, [](size_t, size_t j) { return j; }, [](size_t i, size_t) { return i; }},
       "gv[99:59:-4]", [](size_t k) { return 99 - 4 * k; }, false},
  };
  for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    const std::string name = layout == v1::LAYOUT_C ? "ga_C" : "ga_F";
    ASSIGN_OR_FAIL(auto ba, UploadArray(c(), ToMemory<double>(a, kRows, kCols, layout),
                                        {kRows, kCols}, layout, name));
    for (const Case& k : cases) {
      if (k.only != v1::LAYOUT_UNSPECIFIED && k.only != layout) continue;
      const std::string what = absl::StrCat(name, k.a_view, " x=", k.x,
                                            k.transpose ? " transposed" : "");
      SCOPED_TRACE(what);
      ASSIGN_OR_FAIL(ArrayRef av, ArrayRef::Parse(name + k.a_view));
      ASSIGN_OR_FAIL(ArrayRef xv, ArrayRef::Parse(k.x));
      const std::vector<double> dense = Dense(a, kCols, k.matrix);
      const size_t k_len = k.transpose ? k.matrix.rows : k.matrix.cols;
      const size_t p_len = k.transpose ? k.matrix.cols : k.matrix.rows;
      std::vector<double> x;
      for (size_t i = 0; i < k_len; ++i) x.push_back(v[k.x_at(i)]);
      ASSIGN_OR_FAIL(auto op, RunOp(c(), Gemv(av, xv, NewOutput(), k.transpose, 1.5, 0)));
      EXPECT_EQ(op.timing().bytes_read(), (k.matrix.rows * k.matrix.cols + k_len) * 8);
      ASSIGN_OR_FAIL(auto y, DownloadArray<double>(c(), op.outputs(0).id()));
      ExpectGemvClose(y, ReferenceGemv(dense, k.matrix.rows, k.matrix.cols, k.transpose, 1.5, x,
                                       0, nullptr),
                      0x1.0p-53, k_len, what);
      // Into an existing y, with beta.
      const std::vector<double> y0 = RandomDoubles(p_len, -3, 3, 52);
      ASSIGN_OR_FAIL(auto by, UploadArray(c(), y0));
      ASSERT_OK(RunOp(c(), Gemv(av, xv, ExistingOutput(by.id()), k.transpose, -0.5, 2.0)));
      ASSIGN_OR_FAIL(auto y_acc, DownloadArray<double>(c(), by.id()));
      ExpectGemvClose(y_acc, ReferenceGemv(dense, k.matrix.rows, k.matrix.cols, k.transpose,
                                           -0.5, x, 2.0, &y0),
                      0x1.0p-53, k_len, what + ", existing y");
    }
  }
}

// Views BLAS cannot read are refused, asking for a copy, and change nothing.
TEST_F(ServerOpsTest, GemvRefusesViewsWithoutAUnitStride) {
  ASSIGN_OR_FAIL(auto ba, UploadArray(c(), RandomDoubles(12, -1, 1, 60), {3, 4}, v1::LAYOUT_C,
                                      "gr_a"));
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), RandomDoubles(8, -1, 1, 61), {}, v1::LAYOUT_C,
                                      "gr_x"));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), RandomDoubles(3, -1, 1, 62), {}, v1::LAYOUT_C,
                                      "gr_y"));
  const std::vector<std::string> watched = {ba.id(), bx.id(), by.id()};
  for (const auto& [a, x, says] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"gr_a[:, ::2]", "gr_x[0:2]", "BLAS needs a unit stride on one of their two axes"},
           {"gr_a[::-1]", "gr_x[0:4]", "BLAS needs a unit stride on one of their two axes"},
           {"gr_x[0:4].broadcast_to(3, 4)", "gr_x[0:4]", "a broadcast view, stride 0"},
           {"gr_a", "gr_x[0:1].broadcast_to(4)", "a broadcast view, stride 0"}}) {
    SCOPED_TRACE(a + " " + x);
    ASSIGN_OR_FAIL(ArrayRef av, ArrayRef::Parse(a));
    ASSIGN_OR_FAIL(ArrayRef xv, ArrayRef::Parse(x));
    ExpectRejected(c(), Gemv(av, xv, ExistingOutput(by.id())), absl::StatusCode::kInvalidArgument,
                   says, watched);
    ExpectRejected(c(), Gemv(av, xv, NewOutput("gr_never")), absl::StatusCode::kInvalidArgument,
                   says, watched);
  }
}

}  // namespace
}  // namespace gpucompute::testing
