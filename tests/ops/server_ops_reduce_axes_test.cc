// End-to-end tests of ReduceOp over any axes: axis tuples, negative axes, keepdims,
// var/std with ddof, any/all, argmin/argmax along one axis of N-d arrays, views, and
// reductions of expressions, against float64 references computed here (NumPy's
// definitions and dtypes), and the bits of the requests the API had before.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/cpp/client.h"
#include "kernels/ops.h"
#include "server/cpu/kernels.h"
#include "server/cpu/thread_pool.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

using Axes = std::optional<std::vector<int>>;  // nullopt: every axis

v1::SubmitRequest ReduceAxes(v1::ReduceKind kind, const std::string& input, const Axes& axes,
                             bool keepdims = false, double ddof = 0) {
  v1::SubmitRequest r = Reduce(kind, input);
  v1::ReduceOp* op = r.mutable_reduce();
  if (axes.has_value()) {
    op->mutable_axes();
    for (int a : *axes) op->mutable_axes()->add_axes(a);
  }
  op->set_keepdims(keepdims);
  op->set_ddof(ddof);
  return r;
}

// A reduction of an expression over `inputs` (name, buffer id, view steps).
struct Bound {
  std::string name;
  std::string buffer;
  std::vector<v1::ViewStep> view = {};
};
v1::SubmitRequest ReduceExpression(v1::ReduceKind kind, const std::string& expression,
                                   const std::vector<Bound>& inputs, const Axes& axes) {
  v1::SubmitRequest r = ReduceAxes(kind, "", axes);
  v1::ReduceOp* op = r.mutable_reduce();
  op->set_expression(expression);
  for (const Bound& b : inputs) {
    v1::Operand& operand = (*op->mutable_inputs())[b.name];
    operand.set_buffer(b.buffer);
    for (const v1::ViewStep& s : b.view) *operand.add_view() = s;
  }
  return r;
}

// The inline values of a result as doubles.
std::vector<double> Values(const v1::Operation& op) {
  std::vector<double> out;
  for (const v1::Scalar& s : op.values()) {
    switch (s.value_case()) {
      case v1::Scalar::kFloatValue:
        out.push_back(s.float_value());
        break;
      case v1::Scalar::kIntValue:
        out.push_back(static_cast<double>(s.int_value()));
        break;
      default:
        out.push_back(s.bool_value() ? 1 : 0);
        break;
    }
  }
  return out;
}

std::vector<uint64_t> OutShape(const v1::Operation& op) {
  return {op.outputs(0).shape().begin(), op.outputs(0).shape().end()};
}

// NumPy's reduction of `v` in float64 (two-pass var, as NumPy computes it).
double Reference(v1::ReduceKind kind, const std::vector<double>& v, double ddof = 0) {
  const double n = static_cast<double>(v.size());
  long double sum = 0;
  for (double x : v) sum += x;
  switch (kind) {
    case v1::REDUCE_KIND_SUM:
      return static_cast<double>(sum);
    case v1::REDUCE_KIND_PROD: {
      long double p = 1;
      for (double x : v) p *= x;
      return static_cast<double>(p);
    }
    case v1::REDUCE_KIND_MIN:
    case v1::REDUCE_KIND_MAX: {
      double best = v[0];
      for (double x : v) {
        if (std::isnan(x)) return x;
        best = kind == v1::REDUCE_KIND_MIN ? std::min(best, x) : std::max(best, x);
      }
      return best;
    }
    case v1::REDUCE_KIND_MEAN:
      return static_cast<double>(sum / n);
    case v1::REDUCE_KIND_NORM2: {
      long double s = 0;
      for (double x : v) s += static_cast<long double>(x) * x;
      return static_cast<double>(std::sqrt(s));
    }
    case v1::REDUCE_KIND_ARGMIN:
    case v1::REDUCE_KIND_ARGMAX: {
      size_t best = 0;
      for (size_t i = 0; i < v.size(); ++i) {
        if (std::isnan(v[i])) return static_cast<double>(i);
        if (kind == v1::REDUCE_KIND_ARGMIN ? v[i] < v[best] : v[i] > v[best]) best = i;
      }
      return static_cast<double>(best);
    }
    case v1::REDUCE_KIND_VAR:
    case v1::REDUCE_KIND_STD: {
      const long double mean = sum / n;
      long double m2 = 0;
      for (double x : v) m2 += (x - mean) * (x - mean);
      const double var = static_cast<double>(m2) / std::max(n - ddof, 0.0);
      return kind == v1::REDUCE_KIND_VAR ? var : std::sqrt(var);
    }
    case v1::REDUCE_KIND_ANY:
      return std::any_of(v.begin(), v.end(), [](double x) { return x != 0; }) ? 1 : 0;
    case v1::REDUCE_KIND_ALL:
      return std::all_of(v.begin(), v.end(), [](double x) { return x != 0; }) ? 1 : 0;
    default:
      break;
  }
  return std::nan("");
}

// NumPy's result dtype.
v1::DType ResultDType(v1::ReduceKind kind, v1::DType in) {
  const bool is_float = in == v1::DTYPE_FLOAT32 || in == v1::DTYPE_FLOAT64;
  switch (kind) {
    case v1::REDUCE_KIND_SUM:
    case v1::REDUCE_KIND_PROD:
      return is_float ? in : v1::DTYPE_INT64;
    case v1::REDUCE_KIND_MIN:
    case v1::REDUCE_KIND_MAX:
      return in;
    case v1::REDUCE_KIND_ARGMIN:
    case v1::REDUCE_KIND_ARGMAX:
      return v1::DTYPE_INT64;
    case v1::REDUCE_KIND_ANY:
    case v1::REDUCE_KIND_ALL:
      return v1::DTYPE_BOOL;
    default:
      return is_float ? in : v1::DTYPE_FLOAT64;
  }
}

const std::vector<v1::ReduceKind> kKinds = {
    v1::REDUCE_KIND_SUM,    v1::REDUCE_KIND_PROD,   v1::REDUCE_KIND_MIN, v1::REDUCE_KIND_MAX,
    v1::REDUCE_KIND_MEAN,   v1::REDUCE_KIND_NORM2,  v1::REDUCE_KIND_ARGMIN,
    v1::REDUCE_KIND_ARGMAX, v1::REDUCE_KIND_VAR,    v1::REDUCE_KIND_STD, v1::REDUCE_KIND_ANY,
    v1::REDUCE_KIND_ALL};

bool IsArg(v1::ReduceKind kind) {
  return kind == v1::REDUCE_KIND_ARGMIN || kind == v1::REDUCE_KIND_ARGMAX;
}

// The groups of a C-order array of `shape` that reducing `axes` combines, one per output
// in C order, each in C order of the reduced positions.
std::vector<std::vector<double>> Groups(const std::vector<double>& a,
                                        const std::vector<int64_t>& shape,
                                        const std::vector<int>& axes) {
  const int nd = static_cast<int>(shape.size());
  std::vector<bool> reduced(nd, false);
  for (int x : axes) reduced[(x + nd) % nd] = true;
  int64_t outputs = 1, count = 1;
  for (int d = 0; d < nd; ++d) (reduced[d] ? count : outputs) *= shape[d];
  std::vector<std::vector<double>> groups(outputs);
  for (int64_t flat = 0; flat < static_cast<int64_t>(a.size()); ++flat) {
    int64_t rest = flat, o = 0, o_scale = 1;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t i = rest % shape[d];
      rest /= shape[d];
      if (!reduced[d]) {
        o += i * o_scale;
        o_scale *= shape[d];
      }
    }
    groups[o].push_back(a[flat]);  // C order visits each group's positions in C order
  }
  return groups;
}

std::vector<uint64_t> ReducedShape(const std::vector<int64_t>& shape, const std::vector<int>& axes,
                                   bool keepdims) {
  const int nd = static_cast<int>(shape.size());
  std::vector<uint64_t> out;
  for (int d = 0; d < nd; ++d) {
    const bool r = std::any_of(axes.begin(), axes.end(), [&](int x) { return (x + nd) % nd == d; });
    if (!r) {
      out.push_back(static_cast<uint64_t>(shape[d]));
    } else if (keepdims) {
      out.push_back(1);
    }
  }
  return out;
}

absl::StatusOr<v1::BufferInfo> Upload(Client& client, const std::vector<double>& values,
                                      const std::vector<uint64_t>& shape, v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return UploadArray(client, Cast<float>(values), shape);
    case v1::DTYPE_INT32:
      return UploadArray(client, Cast<int32_t>(values), shape);
    case v1::DTYPE_INT64:
      return UploadArray(client, Cast<int64_t>(values), shape);
    case v1::DTYPE_BOOL:
      return UploadArray(client, Cast<uint8_t>(values), shape);
    default:
      return UploadArray(client, values, shape);
  }
}

// Every kind over every axis set of a 3-D array, for every dtype.
TEST_F(ServerOpsTest, ReduceEveryKindOverEveryAxisSetOfA3DArray) {
  const std::vector<int64_t> shape = {3, 4, 5};
  const std::vector<uint64_t> ushape = {3, 4, 5};
  const std::vector<std::vector<int>> axis_sets = {{},     {0},    {1},    {2},      {0, 1},
                                                   {0, 2}, {1, 2}, {2, 0}, {0, 1, 2}, {-1, -3}};
  Lcg g(7);
  int checked = 0;
  for (v1::DType dtype : {v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT32, v1::DTYPE_INT32, v1::DTYPE_INT64,
                          v1::DTYPE_BOOL}) {
    std::vector<double> a(60);
    for (double& x : a) {
      // Multiples of 1/8 (exact in float32), integers, or 0/1 for bools; some zeros.
      x = dtype == v1::DTYPE_BOOL ? static_cast<double>(g.Int(0, 2))
          : dtype == v1::DTYPE_INT32 || dtype == v1::DTYPE_INT64
              ? static_cast<double>(g.Int(-9, 10))
              : static_cast<double>(g.Int(-16, 17)) / 8;
    }
    ASSIGN_OR_FAIL(auto buffer, Upload(c(), a, ushape, dtype));
    const double rel = dtype == v1::DTYPE_FLOAT32 ? 1e-6 : 1e-12;
    for (v1::ReduceKind kind : kKinds) {
      for (size_t s = 0; s <= axis_sets.size(); ++s) {
        const bool all = s == axis_sets.size();
        const std::vector<int> axes = all ? std::vector<int>{0, 1, 2} : axis_sets[s];
        if (IsArg(kind) && !all && axes.size() != 1) continue;
        const bool keepdims = s % 2 == 1;
        const double ddof = kind == v1::REDUCE_KIND_VAR || kind == v1::REDUCE_KIND_STD ? s % 3 : 0;
        SCOPED_TRACE(absl::StrCat(v1::DType_Name(dtype), " ", v1::ReduceKind_Name(kind), " axes (",
                                  all ? "all" : absl::StrJoin(axes, ","), ") keepdims ", keepdims,
                                  " ddof ", ddof));
        ASSIGN_OR_FAIL(auto op, RunOp(c(), ReduceAxes(kind, buffer.id(),
                                                      all ? Axes() : Axes(axes), keepdims, ddof)));
        ASSERT_EQ(op.outputs(0).dtype(), ResultDType(kind, dtype));
        EXPECT_EQ(OutShape(op), ReducedShape(shape, axes, keepdims && !all));
        const std::vector<std::vector<double>> groups = Groups(a, shape, axes);
        const std::vector<double> got = Values(op);
        ASSERT_EQ(got.size(), groups.size());
        for (size_t o = 0; o < groups.size(); ++o) {
          const double want = Reference(kind, groups[o], ddof);
          if (std::isnan(want) || std::isinf(want)) {
            EXPECT_EQ(std::isnan(got[o]), std::isnan(want)) << o;
            if (std::isinf(want)) {
              EXPECT_EQ(got[o], want) << o;
            }
            continue;
          }
          // float32 products round in float32 after every factor (kernels/reduce_ops.h).
          const double tol = kind == v1::REDUCE_KIND_PROD && dtype == v1::DTYPE_FLOAT32
                                 ? static_cast<double>(groups[o].size() + 1) * 0x1.0p-24
                                 : rel;
          EXPECT_NEAR(got[o], want, tol * std::max(1.0, std::fabs(want))) << "output " << o;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 3000);
}

TEST_F(ServerOpsTest, ReduceNegativeAxesKeepdimsAndNoAxes) {
  std::vector<double> a(2 * 3 * 4);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>(i);
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), Cast<int32_t>(a), {2, 3, 4}));
  // numpy.sum(x, axis=(0, 2)) of arange(24).reshape(2, 3, 4): [60, 92, 124].
  ASSIGN_OR_FAIL(auto sum02, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_SUM, x.id(), {{0, 2}})));
  EXPECT_EQ(sum02.outputs(0).dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(OutShape(sum02), (std::vector<uint64_t>{3}));
  EXPECT_EQ(Values(sum02), (std::vector<double>{60, 92, 124}));
  ASSIGN_OR_FAIL(auto negative, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_SUM, x.id(), {{-1, -3}})));
  EXPECT_EQ(Values(negative), Values(sum02));
  ASSIGN_OR_FAIL(auto kept,
                 RunOp(c(), ReduceAxes(v1::REDUCE_KIND_SUM, x.id(), {{0, -1}}, /*keepdims=*/true)));
  EXPECT_EQ(OutShape(kept), (std::vector<uint64_t>{1, 3, 1}));
  EXPECT_EQ(Values(kept), Values(sum02));
  // The legacy `axis` works on any N-d array now, negative too: numpy.max(x, axis=-2).
  v1::SubmitRequest legacy = Reduce(v1::REDUCE_KIND_MAX, x.id(), -2);
  ASSIGN_OR_FAIL(auto max1, RunOp(c(), legacy));
  EXPECT_EQ(OutShape(max1), (std::vector<uint64_t>{2, 4}));
  EXPECT_EQ(Values(max1), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  // axis=(): each element alone, in the result dtype (int64 for a sum of int32).
  ASSIGN_OR_FAIL(auto none, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_SUM, x.id(), {{}})));
  EXPECT_EQ(OutShape(none), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(none.outputs(0).dtype(), v1::DTYPE_INT64);
  EXPECT_EQ(Values(none), a);
  // The whole array with keepdims: shape (1, 1, 1).
  ASSIGN_OR_FAIL(auto whole,
                 RunOp(c(), ReduceAxes(v1::REDUCE_KIND_MEAN, x.id(), std::nullopt, true)));
  EXPECT_EQ(OutShape(whole), (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(Values(whole), (std::vector<double>{11.5}));
}

TEST_F(ServerOpsTest, ReduceVarAndStdWithDdof) {
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), std::vector<double>{1, 2, 3, 4}));
  auto var = [&](double ddof, v1::ReduceKind kind = v1::REDUCE_KIND_VAR) -> double {
    absl::StatusOr<v1::Operation> op = RunOp(c(), ReduceAxes(kind, x.id(), std::nullopt, false, ddof));
    EXPECT_OK(op);
    return op.ok() && op->values_size() == 1 ? op->values(0).float_value() : -1;
  };
  EXPECT_EQ(var(0), 1.25);                       // numpy.var([1, 2, 3, 4])
  EXPECT_DOUBLE_EQ(var(1), 5.0 / 3);             // ddof=1
  EXPECT_DOUBLE_EQ(var(0.5), 5.0 / 3.5);         // a fractional ddof divides by 3.5
  EXPECT_EQ(var(4), std::numeric_limits<double>::infinity());  // N - ddof = 0: 5 / 0
  EXPECT_EQ(var(6), std::numeric_limits<double>::infinity());  // N - ddof < 0: also 5 / 0
  EXPECT_DOUBLE_EQ(var(1, v1::REDUCE_KIND_STD), std::sqrt(5.0 / 3));
  // A constant array with ddof = N: 0 / 0.
  ASSIGN_OR_FAIL(auto k, UploadArray(c(), std::vector<float>{2, 2}));
  ASSIGN_OR_FAIL(auto nan,
                 RunOp(c(), ReduceAxes(v1::REDUCE_KIND_VAR, k.id(), std::nullopt, false, 2)));
  EXPECT_EQ(nan.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_TRUE(std::isnan(nan.values(0).float_value()));
  // An inf makes the variance NaN, as in NumPy, even alone.
  ASSIGN_OR_FAIL(auto inf, UploadArray(c(), std::vector<double>{INFINITY}));
  ASSIGN_OR_FAIL(auto var_inf, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_VAR, inf.id(), std::nullopt)));
  EXPECT_TRUE(std::isnan(var_inf.values(0).float_value()));
  // Large offset, small spread: one pass over (count, mean, M2) does not cancel.
  std::vector<double> big(10000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = 1e9 + static_cast<double>(i % 10);
  ASSIGN_OR_FAIL(auto b, UploadArray(c(), big));
  ASSIGN_OR_FAIL(auto var_big, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_VAR, b.id(), std::nullopt)));
  EXPECT_NEAR(var_big.values(0).float_value(), 8.25, 1e-6);
}

TEST_F(ServerOpsTest, ReduceAnyAndAllCountNanAsTrue) {
  const double nan = std::nan("");
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), std::vector<double>{0, nan, 0, 0, 1, 2}, {2, 3}));
  ASSIGN_OR_FAIL(auto any1, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ANY, x.id(), {{1}})));
  EXPECT_EQ(any1.outputs(0).dtype(), v1::DTYPE_BOOL);
  EXPECT_EQ(Values(any1), (std::vector<double>{1, 1}));
  ASSIGN_OR_FAIL(auto all0, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ALL, x.id(), {{0}})));
  EXPECT_EQ(Values(all0), (std::vector<double>{0, 1, 0}));  // NaN and 2 are true
  ASSIGN_OR_FAIL(auto any0, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ANY, x.id(), {{0}})));
  EXPECT_EQ(Values(any0), (std::vector<double>{0, 1, 1}));
  ASSIGN_OR_FAIL(auto downloaded, DownloadArray<uint8_t>(c(), any0.outputs(0).id()));
  EXPECT_EQ(downloaded, (std::vector<uint8_t>{0, 1, 1}));
  // Empty: any is false, all is true.
  v1::CreateBufferRequest empty;
  empty.set_dtype(v1::DTYPE_FLOAT32);
  empty.add_shape(0);
  ASSIGN_OR_FAIL(auto e, c().CreateBuffer(empty));
  ASSIGN_OR_FAIL(auto any_e, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ANY, e.id(), std::nullopt)));
  ASSIGN_OR_FAIL(auto all_e, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ALL, e.id(), std::nullopt)));
  EXPECT_EQ(Values(any_e), (std::vector<double>{0}));
  EXPECT_EQ(Values(all_e), (std::vector<double>{1}));
}

TEST_F(ServerOpsTest, ReduceArgExtremaAlongAMiddleAxis) {
  // (2, 4, 3): along axis 1, with ties (the first wins) and one NaN (it wins).
  std::vector<double> a = {5, 1, 7,  2, 1, 9,  5, 0, 9,  1, 8, 3,    // [0]
                           4, 4, 4,  4, 6, 6,  3, 6, 2,  3, 1, 2};   // [1]
  a[1 * 12 + 2 * 3 + 2] = std::nan("");  // [1, 2, 2]
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), a, {2, 4, 3}));
  ASSIGN_OR_FAIL(auto argmin, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMIN, x.id(), 1)));
  EXPECT_EQ(OutShape(argmin), (std::vector<uint64_t>{2, 3}));
  EXPECT_EQ(Values(argmin), (std::vector<double>{3, 2, 3, 2, 3, 2}));
  ASSIGN_OR_FAIL(auto argmax,
                 RunOp(c(), ReduceAxes(v1::REDUCE_KIND_ARGMAX, x.id(), {{-2}}, true)));
  EXPECT_EQ(OutShape(argmax), (std::vector<uint64_t>{2, 1, 3}));
  EXPECT_EQ(Values(argmax), (std::vector<double>{0, 3, 1, 0, 1, 2}));
  // The whole array: the C-order flat index, also of a transposed view.
  ASSIGN_OR_FAIL(auto flat, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMAX, x.id())));
  EXPECT_EQ(Values(flat), (std::vector<double>{20}));  // the NaN at [1, 2, 2]
  v1::SubmitRequest t = Reduce(v1::REDUCE_KIND_ARGMAX, x.id());
  t.mutable_reduce()->add_input_view()->mutable_transpose();  // shape (3, 4, 2)
  ASSIGN_OR_FAIL(auto flat_t, RunOp(c(), t));
  EXPECT_EQ(Values(flat_t), (std::vector<double>{2 * 8 + 2 * 2 + 1}));  // [2, 2, 1]
}

// x viewed as x.T and as x[::-1, ::-2]: the view's values reduced, against a float64
// reference. On the CPU backend also with the bits of the same reduction of a contiguous
// copy: its order depends on the shape and the axes alone. The CUDA kernels' order also
// depends on which axes are contiguous (kernels/cuda/reduce_strided.cu), so there a view
// and its copy may differ in the last bits, while each is the same run to run.
TEST_F(ServerOpsTest, ReduceViewsAsTheirContiguousCopies) {
  constexpr int64_t kR = 37, kC = 29;
  std::vector<double> a = RandomDoubles(kR * kC, -1, 1, 3);
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), a, {kR, kC}));
  v1::ViewStep transpose;
  transpose.mutable_transpose();
  v1::ViewStep slice;
  v1::Slice* rows = slice.mutable_index()->add_items()->mutable_slice();
  rows->set_step(-1);
  v1::Slice* cols = slice.mutable_index()->add_items()->mutable_slice();
  cols->set_step(-2);
  struct ViewCase {
    const char* what;
    v1::ViewStep step;
    std::vector<double> values;  // the view in C order
    std::vector<int64_t> shape;
  };
  std::vector<ViewCase> cases = {{"x.T", transpose, {}, {kC, kR}},
                                 {"x[::-1, ::-2]", slice, {}, {kR, (kC + 1) / 2}}};
  for (int64_t j = 0; j < kC; ++j) {
    for (int64_t i = 0; i < kR; ++i) cases[0].values.push_back(a[i * kC + j]);
  }
  for (int64_t i = kR - 1; i >= 0; --i) {
    for (int64_t j = kC - 1; j >= 0; j -= 2) cases[1].values.push_back(a[i * kC + j]);
  }
  for (const ViewCase& vc : cases) {
    ASSIGN_OR_FAIL(auto copy, UploadArray(c(), vc.values, {static_cast<uint64_t>(vc.shape[0]),
                                                           static_cast<uint64_t>(vc.shape[1])}));
    for (v1::ReduceKind kind : {v1::REDUCE_KIND_VAR, v1::REDUCE_KIND_ANY, v1::REDUCE_KIND_MAX,
                                v1::REDUCE_KIND_ARGMIN}) {
      for (int axis : {0, 1, -1}) {
        SCOPED_TRACE(absl::StrCat(vc.what, " ", v1::ReduceKind_Name(kind), " axis ", axis));
        v1::SubmitRequest r = ReduceAxes(kind, x.id(), {{axis}});
        *r.mutable_reduce()->add_input_view() = vc.step;
        ASSIGN_OR_FAIL(auto got, RunOp(c(), r));
        ASSIGN_OR_FAIL(auto want, RunOp(c(), ReduceAxes(kind, copy.id(), {{axis}})));
        EXPECT_EQ(OutShape(got), OutShape(want));
        ASSERT_EQ(got.values_size(), want.values_size());
        const std::vector<std::vector<double>> groups = Groups(vc.values, vc.shape, {axis});
        for (int o = 0; o < got.values_size(); ++o) {
          if (kind == v1::REDUCE_KIND_VAR && TestBackendName() == "cpu") {
            EXPECT_EQ(got.values(o).float_value(), want.values(o).float_value()) << o;
          }
          EXPECT_NEAR(Values(got)[o], Reference(kind, groups[o]), 1e-12) << o;
        }
      }
    }
    // Every element of a view, as a sum of the whole view.
    v1::SubmitRequest whole = Reduce(v1::REDUCE_KIND_SUM, x.id());
    *whole.mutable_reduce()->add_input_view() = vc.step;
    ASSIGN_OR_FAIL(auto sum, RunOp(c(), whole));
    EXPECT_NEAR(sum.values(0).float_value(), Reference(v1::REDUCE_KIND_SUM, vc.values), 1e-12);
  }
}

TEST_F(ServerOpsTest, ReduceExpressionsInOnePass) {
  constexpr int64_t kN = 40, kK = 33;
  const std::vector<double> xs = RandomDoubles(kN * kK, -1, 1, 11);
  const std::vector<double> ys = RandomDoubles(kN * kK, -1, 1, 12);
  const std::vector<double> ms = RandomDoubles(kN, -0.5, 0.5, 13);
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), xs, {kN, kK}));
  ASSIGN_OR_FAIL(auto y, UploadArray(c(), ys, {kN, kK}));
  ASSIGN_OR_FAIL(auto m, UploadArray(c(), ms, {kN, 1}));
  ASSIGN_OR_FAIL(auto y32, UploadArray(c(), Cast<float>(ys), {kN, kK}));
  const Snapshot before = TakeSnapshot(c());

  // sum(x*y): a 0-d float64.
  ASSIGN_OR_FAIL(auto dot, RunOp(c(), ReduceExpression(v1::REDUCE_KIND_SUM, "x*y",
                                                       {{"x", x.id()}, {"y", y.id()}},
                                                       std::nullopt)));
  std::vector<double> products;
  for (int64_t i = 0; i < kN * kK; ++i) products.push_back(xs[i] * ys[i]);
  EXPECT_EQ(dot.outputs(0).shape_size(), 0);
  EXPECT_NEAR(dot.values(0).float_value(), Reference(v1::REDUCE_KIND_SUM, products), 1e-12);

  // sum((x - m)**2, axis=1) with m of shape (n, 1): broadcasting inside the expression.
  ASSIGN_OR_FAIL(auto centred,
                 RunOp(c(), ReduceExpression(v1::REDUCE_KIND_SUM, "(x - m)**2",
                                             {{"x", x.id()}, {"m", m.id()}}, {{1}})));
  EXPECT_EQ(OutShape(centred), (std::vector<uint64_t>{kN}));
  for (int64_t i = 0; i < kN; ++i) {
    std::vector<double> row;
    for (int64_t j = 0; j < kK; ++j) row.push_back((xs[i * kK + j] - ms[i]) * (xs[i * kK + j] - ms[i]));
    EXPECT_NEAR(centred.values(static_cast<int>(i)).float_value(),
                Reference(v1::REDUCE_KIND_SUM, row), 1e-12)
        << i;
  }

  // mean(where(x*x + y*y <= 1, 1, 0)): an int64 expression, a float64 mean.
  ASSIGN_OR_FAIL(auto inside,
                 RunOp(c(), ReduceExpression(v1::REDUCE_KIND_MEAN, "where(x*x + y*y <= 1, 1, 0)",
                                             {{"x", x.id()}, {"y", y.id()}}, std::nullopt)));
  int64_t hits = 0;
  for (int64_t i = 0; i < kN * kK; ++i) hits += xs[i] * xs[i] + ys[i] * ys[i] <= 1;
  EXPECT_EQ(inside.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  EXPECT_DOUBLE_EQ(inside.values(0).float_value(),
                   static_cast<double>(hits) / static_cast<double>(kN * kK));

  // max(abs(a - b)) of float64 and float32 arrays: a float64 result (NumPy's promotion),
  // one of them a view (b.T.T is b).
  v1::ViewStep transpose;
  transpose.mutable_transpose();
  ASSIGN_OR_FAIL(auto worst,
                 RunOp(c(), ReduceExpression(v1::REDUCE_KIND_MAX, "abs(a - b)",
                                             {{"a", x.id()}, {"b", y32.id(), {transpose, transpose}}},
                                             std::nullopt)));
  double want = 0;
  for (int64_t i = 0; i < kN * kK; ++i) {
    want = std::max(want, std::fabs(xs[i] - static_cast<double>(static_cast<float>(ys[i]))));
  }
  EXPECT_EQ(worst.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  EXPECT_EQ(worst.values(0).float_value(), want);

  // The inputs are unchanged and only the results were created.
  ASSIGN_OR_FAIL(auto x_after, DownloadArray<double>(c(), x.id()));
  EXPECT_EQ(x_after, xs);
  EXPECT_EQ(TakeSnapshot(c()).buffers.size(), before.buffers.size() + 4);
}

TEST_F(ServerOpsTest, ReduceResultsAreIdenticalAcrossRuns) {
  const std::vector<double> xs = RandomDoubles(300000, -1, 1, 21);
  const std::vector<double> ys = RandomDoubles(300000, -1, 1, 22);
  ASSIGN_OR_FAIL(auto x, UploadArray(c(), Cast<float>(xs), {600, 500}));
  ASSIGN_OR_FAIL(auto y, UploadArray(c(), Cast<float>(ys), {600, 500}));
  for (int axis : {-1, 0, 1}) {
    std::optional<std::string> first_dot, first_var;
    for (int run = 0; run < 3; ++run) {
      ASSIGN_OR_FAIL(auto dot, RunOp(c(), ReduceExpression(v1::REDUCE_KIND_SUM, "x*y",
                                                           {{"x", x.id()}, {"y", y.id()}},
                                                           axis < 0 ? Axes() : Axes({{axis}}))));
      ASSIGN_OR_FAIL(auto var, RunOp(c(), ReduceAxes(v1::REDUCE_KIND_VAR, x.id(),
                                                     axis < 0 ? Axes() : Axes({{axis}}))));
      ASSIGN_OR_FAIL(std::string dot_bytes, DownloadBytes(c(), dot.outputs(0).id()));
      ASSIGN_OR_FAIL(std::string var_bytes, DownloadBytes(c(), var.outputs(0).id()));
      if (!first_dot.has_value()) {
        first_dot = dot_bytes;
        first_var = var_bytes;
      }
      EXPECT_EQ(dot_bytes, *first_dot) << "axis " << axis << " run " << run;
      EXPECT_EQ(var_bytes, *first_var) << "axis " << axis << " run " << run;
    }
  }
}

// The requests the API took before axes existed (whole array, axis 0 or 1 of a 2-D array,
// C or F) give the bits of the ReduceShape kernel they always ran.
TEST_F(ServerOpsTest, ReduceOldRequestsGiveTheirOldBits) {
  // The reference is the CPU backend's own kernel: its bits are the CPU's.
  if (TestBackendName() != "cpu") GTEST_SKIP() << "compares with the CPU backend's bits";
  // float64, whose sums show any change of order in their last bits.
  constexpr int64_t kR = 300, kC = 700;
  const std::vector<double> a = RandomDoubles(kR * kC, 0.5, 1.5, 31);
  cpu::ThreadPool pool(3);
  for (v1::Layout layout : {v1::LAYOUT_C, v1::LAYOUT_F}) {
    ASSIGN_OR_FAIL(auto x, UploadArray(c(), a, {kR, kC}, layout));
    const bool f = layout == v1::LAYOUT_F;
    for (std::optional<int> axis : {std::optional<int>(), std::optional<int>(0),
                                    std::optional<int>(1), std::optional<int>(-1)}) {
      for (v1::ReduceKind kind : {v1::REDUCE_KIND_SUM, v1::REDUCE_KIND_MEAN, v1::REDUCE_KIND_NORM2,
                                  v1::REDUCE_KIND_PROD, v1::REDUCE_KIND_ARGMAX}) {
        SCOPED_TRACE(absl::StrCat(v1::Layout_Name(layout), " axis ",
                                  axis.has_value() ? absl::StrCat(*axis) : "none", " ",
                                  v1::ReduceKind_Name(kind)));
        ReduceShape shape{1, kR * kC, 1};
        if (axis.has_value()) {
          const bool slow = (*axis == 0) != f;  // the axis that strides over the other
          const int64_t outer = f ? kC : kR, inner = f ? kR : kC;
          shape = slow ? ReduceShape{1, outer, inner} : ReduceShape{outer, inner, 1};
        }
        if (f && !axis.has_value()) continue;  // C-order argmax search: covered elsewhere
        const ReduceKind k = kind == v1::REDUCE_KIND_SUM    ? ReduceKind::kSum
                             : kind == v1::REDUCE_KIND_MEAN  ? ReduceKind::kMean
                             : kind == v1::REDUCE_KIND_NORM2 ? ReduceKind::kNorm2
                             : kind == v1::REDUCE_KIND_PROD  ? ReduceKind::kProd
                                                             : ReduceKind::kArgmax;
        const int64_t outputs = shape.outer * shape.inner;
        std::vector<char> want(static_cast<size_t>(outputs) * 8);
        cpu::Reduce(k, DType::kFloat64, a.data(), shape, want.data(), pool);
        ASSIGN_OR_FAIL(auto op, RunOp(c(), Reduce(kind, x.id(), axis)));
        ASSIGN_OR_FAIL(std::string got, DownloadBytes(c(), op.outputs(0).id()));
        EXPECT_EQ(got, std::string(want.begin(), want.end()));
      }
    }
  }
}

}  // namespace
}  // namespace gpucompute::testing
