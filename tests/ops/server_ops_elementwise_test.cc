// End-to-end tests of Submit's elementwise operations: results against float64
// references, NumPy 2 type promotion, existing and named outputs, operations on every
// device, and rejected expressions that change nothing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

double Workload(double x) {
  return std::sqrt(
      std::fabs(std::exp(-std::sin(x * x)) / (std::sqrt(std::fabs(x)) * std::tanh(x))));
}
constexpr std::string_view kWorkload = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";

TEST_F(ServerOpsTest, ElementwiseSumAndAxpy) {
  constexpr size_t n = 100003;  // not a multiple of any block size
  const std::vector<double> x = RandomDoubles(n, -10, 10, 1);
  const std::vector<double> y = RandomDoubles(n, -10, 10, 2);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), y));

  ASSIGN_OR_FAIL(auto sum, RunOp(c(), Elementwise("x + y", {{"x", BufferOperand(bx.id())},
                                                            {"y", BufferOperand(by.id())}})));
  EXPECT_EQ(sum.kind(), v1::OPERATION_KIND_ELEMENTWISE);
  ASSERT_EQ(sum.outputs_size(), 1);
  EXPECT_EQ(sum.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  EXPECT_EQ(std::vector<uint64_t>(sum.outputs(0).shape().begin(), sum.outputs(0).shape().end()),
            std::vector<uint64_t>{n});
  ASSIGN_OR_FAIL(auto got_sum, DownloadArray<double>(c(), sum.outputs(0).id()));
  ASSERT_EQ(got_sum.size(), n);
  for (size_t i = 0; i < n; ++i) {
    // One IEEE addition of two doubles: exact to the bit.
    ASSERT_EQ(got_sum[i], x[i] + y[i]) << i;
  }

  // a*x + y with a scalar a: one multiply and one add, each rounded once (a fused
  // multiply-add would be within the same bound).
  const double a = 2.75;
  ASSIGN_OR_FAIL(auto axpy, RunOp(c(), Elementwise("a*x + y", {{"a", ScalarOperand(a)},
                                                               {"x", BufferOperand(bx.id())},
                                                               {"y", BufferOperand(by.id())}})));
  ASSIGN_OR_FAIL(auto got_axpy, DownloadArray<double>(c(), axpy.outputs(0).id()));
  ASSERT_EQ(got_axpy.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const double ref = static_cast<double>(static_cast<long double>(a) * x[i] + y[i]);
    const double bound = 2 * 0x1.0p-52 * (std::fabs(a * x[i]) + std::fabs(y[i]));
    ASSERT_LE(std::fabs(got_axpy[i] - ref), bound) << i;
  }

  // The same in float32 with an int scalar: the weak scalar keeps float32.
  const std::vector<float> xf = Cast<float>(x);
  const std::vector<float> yf = Cast<float>(y);
  ASSIGN_OR_FAIL(auto bxf, UploadArray(c(), xf));
  ASSIGN_OR_FAIL(auto byf, UploadArray(c(), yf));
  ASSIGN_OR_FAIL(auto axpyf, RunOp(c(), Elementwise("a*x + y", {{"a", ScalarOperand(3)},
                                                                {"x", BufferOperand(bxf.id())},
                                                                {"y", BufferOperand(byf.id())}})));
  ASSERT_EQ(axpyf.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  ASSIGN_OR_FAIL(auto got_axpyf, DownloadArray<float>(c(), axpyf.outputs(0).id()));
  ASSERT_EQ(got_axpyf.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const double ref = 3.0 * xf[i] + static_cast<double>(yf[i]);
    // Two float32 roundings.
    const double bound = 2 * 0x1.0p-23 * (std::fabs(3.0 * xf[i]) + std::fabs(yf[i]));
    ASSERT_LE(std::fabs(got_axpyf[i] - ref), bound) << i;
  }
}

// Several GPUs: buffers live where they are created, operations run on their buffers'
// device and leave their outputs there, and mixing devices in one operation is refused.
// Runs where the server has two devices or more (GPUCOMPUTE_TEST_BACKEND=cuda on a
// multi-GPU machine).
TEST_F(ServerOpsTest, BuffersAndOperationsOnEveryDevice) {
  ASSIGN_OR_FAIL(auto info, c().GetServerInfo());
  if (info.devices_size() < 2) GTEST_SKIP() << "the server has one device";
  constexpr uint64_t n = 1000;
  std::vector<std::string> firsts;
  for (const v1::DeviceInfo& device : info.devices()) {
    SCOPED_TRACE(absl::StrCat("device ", device.index()));
    std::vector<std::string> ids;
    for (double value : {1.5, 2.25}) {
      v1::CreateBufferRequest create;
      create.set_dtype(v1::DTYPE_FLOAT64);
      create.add_shape(n);
      create.set_device(device.index());
      create.mutable_fill()->set_float_value(value);
      ASSIGN_OR_FAIL(auto buffer, c().CreateBuffer(create));
      EXPECT_EQ(buffer.device(), device.index());
      ids.push_back(buffer.id());
    }
    firsts.push_back(ids[0]);
    ASSIGN_OR_FAIL(auto sum, RunOp(c(), Elementwise("x * y + x", {{"x", BufferOperand(ids[0])},
                                                                  {"y", BufferOperand(ids[1])}})));
    ASSERT_EQ(sum.outputs_size(), 1);
    EXPECT_EQ(sum.outputs(0).device(), device.index());
    ASSIGN_OR_FAIL(auto total, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, sum.outputs(0).id())));
    ASSERT_EQ(total.values_size(), 1);
    EXPECT_EQ(total.values(0).float_value(), n * (1.5 * 2.25 + 1.5));
  }
  absl::StatusOr<v1::Operation> mixed = c().Submit(
      Elementwise("x + y", {{"x", BufferOperand(firsts[0])}, {"y", BufferOperand(firsts[1])}}));
  EXPECT_EQ(mixed.status().code(), absl::StatusCode::kInvalidArgument) << mixed.status();
}

TEST_F(ServerOpsTest, ElementwiseReferenceWorkloadFloat64AndFloat32) {
  constexpr size_t n = size_t{1} << 20;
  // x in [-3, 3], away from 0 (where the workload is 0/0).
  std::vector<double> x = RandomDoubles(n, -3, 3, 3);
  for (double& v : x) {
    if (std::fabs(v) < 1e-3) v = 0.5;
  }
  std::vector<double> ref(n);
  for (size_t i = 0; i < n; ++i) ref[i] = Workload(x[i]);

  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(auto op, RunOp(c(), Elementwise(kWorkload, {{"x", BufferOperand(bx.id())}})));
  ASSERT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  ASSIGN_OR_FAIL(auto got, DownloadArray<double>(c(), op.outputs(0).id()));
  // float64: the same libm functions in the same order; allow a few ulp for a backend
  // that evaluates them differently.
  ExpectClose(got, ref, 1e-14, 0, "float64 workload");

  // float32: the reference is the float64 workload of the float32 inputs (so input rounding
  // is not counted). Each of the ~11 float32 steps is correctly rounded or within ~1 ulp
  // (2^-24 = 6e-8 relative); the worst amplification is the rounding of x*x (up to 9 here),
  // an absolute error of up to 9 * 6e-8 = 5.4e-7 in sin's argument, which becomes a relative
  // error of 5.4e-7 in exp(-sin(.)). Summed that is below ~1.2e-6 before the final sqrt halves
  // it; 1e-5 leaves a margin of about 10x while still catching a float32 result that went
  // wrong (or one silently computed at lower precision).
  const std::vector<float> xf = Cast<float>(x);
  std::vector<double> ref32(n);
  for (size_t i = 0; i < n; ++i) ref32[i] = Workload(static_cast<double>(xf[i]));
  ASSIGN_OR_FAIL(auto bxf, UploadArray(c(), xf));
  ASSIGN_OR_FAIL(auto op32, RunOp(c(), Elementwise(kWorkload, {{"x", BufferOperand(bxf.id())}})));
  ASSERT_EQ(op32.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(op32.outputs(0).size_bytes(), n * 4);
  ASSIGN_OR_FAIL(auto got32, DownloadArray<float>(c(), op32.outputs(0).id()));
  ExpectClose(got32, ref32, 1e-5, 0, "float32 workload");
}

TEST_F(ServerOpsTest, ElementwiseTypePromotionAndComparison) {
  constexpr size_t n = 5000;
  Lcg g(4);
  std::vector<int32_t> xi(n);
  std::vector<float> yf(n);
  for (size_t i = 0; i < n; ++i) {
    xi[i] = static_cast<int32_t>(g.Int(-2000000000, 2000000000));
    yf[i] = static_cast<float>(g.Uniform(-1e6, 1e6));
  }
  ASSIGN_OR_FAIL(auto bxi, UploadArray(c(), xi));
  ASSIGN_OR_FAIL(auto byf, UploadArray(c(), yf));
  // NumPy 2: int32 + float32 -> float64.
  ASSIGN_OR_FAIL(auto op, RunOp(c(), Elementwise("x + y", {{"x", BufferOperand(bxi.id())},
                                                           {"y", BufferOperand(byf.id())}})));
  ASSERT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  ASSIGN_OR_FAIL(auto got, DownloadArray<double>(c(), op.outputs(0).id()));
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    // Both convert exactly to float64; the one rounding of the sum is what NumPy gives.
    ASSERT_EQ(got[i], static_cast<double>(xi[i]) + static_cast<double>(yf[i])) << i;
  }

  // Comparison -> bool, one byte per element, 0 or 1. Equal pairs test strictness.
  std::vector<double> a = RandomDoubles(n, -1, 1, 5);
  std::vector<double> b = RandomDoubles(n, -1, 1, 6);
  for (size_t i = 0; i < n; i += 7) b[i] = a[i];
  ASSIGN_OR_FAIL(auto ba, UploadArray(c(), a));
  ASSIGN_OR_FAIL(auto bb, UploadArray(c(), b));
  ASSIGN_OR_FAIL(auto cmp, RunOp(c(), Elementwise("a < b", {{"a", BufferOperand(ba.id())},
                                                            {"b", BufferOperand(bb.id())}})));
  ASSERT_EQ(cmp.outputs(0).dtype(), v1::DTYPE_BOOL);
  EXPECT_EQ(cmp.outputs(0).size_bytes(), n);
  ASSIGN_OR_FAIL(auto bits, DownloadArray<uint8_t>(c(), cmp.outputs(0).id()));
  ASSERT_EQ(bits.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits[i], a[i] < b[i] ? 1 : 0) << i;
  ASSIGN_OR_FAIL(auto cmp2, RunOp(c(), Elementwise("a >= b", {{"a", BufferOperand(ba.id())},
                                                              {"b", BufferOperand(bb.id())}})));
  ASSIGN_OR_FAIL(auto bits2, DownloadArray<uint8_t>(c(), cmp2.outputs(0).id()));
  ASSERT_EQ(bits2.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits2[i], a[i] >= b[i] ? 1 : 0) << i;
}

TEST_F(ServerOpsTest, ElementwiseIntoExistingAndNamedOutputs) {
  constexpr size_t n = 4099;
  const std::vector<double> x = RandomDoubles(n, -100, 100, 7);
  const std::vector<double> y = RandomDoubles(n, -100, 100, 8);
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), y));
  const auto xy = [&] {
    return Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}});
  };

  // float64 result into an existing float32 buffer (same_kind): each element is the float64
  // sum rounded once to float32. No buffer is created.
  ASSIGN_OR_FAIL(auto out32, UploadArray(c(), std::vector<float>(n, -1.0f)));
  const Snapshot before = TakeSnapshot(c());
  v1::SubmitRequest into32 = xy();
  *into32.mutable_elementwise()->mutable_output() = ExistingOutput(out32.id());
  ASSIGN_OR_FAIL(auto op, RunOp(c(), into32));
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).id(), out32.id());
  EXPECT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(TakeSnapshot(c()), before);
  ASSIGN_OR_FAIL(auto got32, DownloadArray<float>(c(), out32.id()));
  ASSERT_EQ(got32.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got32[i], static_cast<float>(x[i] + y[i])) << i;

  // The output referred to by name works the same.
  ASSIGN_OR_FAIL(auto named64,
                 UploadArray(c(), std::vector<double>(n, 0.0), {}, v1::LAYOUT_C, "dest64"));
  v1::SubmitRequest by_name = xy();
  *by_name.mutable_elementwise()->mutable_output() = ExistingOutput("dest64");
  ASSIGN_OR_FAIL(auto op_named, RunOp(c(), by_name));
  EXPECT_EQ(op_named.outputs(0).id(), named64.id());
  ASSIGN_OR_FAIL(auto got_named, DownloadArray<double>(c(), named64.id()));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_named[i], x[i] + y[i]) << i;

  // A float result into an int32 buffer is never allowed; the target keeps its bytes.
  std::vector<int32_t> sentinel(n);
  for (size_t i = 0; i < n; ++i) sentinel[i] = static_cast<int32_t>(i * 2654435761u);
  ASSIGN_OR_FAIL(auto out_i32, UploadArray(c(), sentinel));
  v1::SubmitRequest into_int = xy();
  *into_int.mutable_elementwise()->mutable_output() = ExistingOutput(out_i32.id());
  {
    SCOPED_TRACE("float64 into int32");
    ExpectRejected(c(), into_int, absl::StatusCode::kInvalidArgument, "", {out_i32.id()});
  }
  ASSIGN_OR_FAIL(auto still, DownloadArray<int32_t>(c(), out_i32.id()));
  EXPECT_EQ(still, sentinel);
  // A new output whose requested dtype is int32 is refused as well.
  v1::SubmitRequest new_int = xy();
  *new_int.mutable_elementwise()->mutable_output() = NewOutput("", v1::DTYPE_INT32);
  {
    SCOPED_TRACE("new int32 output of a float result");
    ExpectRejected(c(), new_int, absl::StatusCode::kInvalidArgument);
  }
  // An existing output of another shape.
  ASSIGN_OR_FAIL(auto short_out, UploadArray(c(), std::vector<double>(n - 1, 5.0)));
  v1::SubmitRequest wrong_shape = xy();
  *wrong_shape.mutable_elementwise()->mutable_output() = ExistingOutput(short_out.id());
  {
    SCOPED_TRACE("output of another shape");
    ExpectRejected(c(), wrong_shape, absl::StatusCode::kInvalidArgument, "", {short_out.id()});
  }

  // A new output with a name: found afterwards by that name.
  v1::SubmitRequest named = xy();
  *named.mutable_elementwise()->mutable_output() = NewOutput("sum_xy");
  ASSIGN_OR_FAIL(auto op_new, RunOp(c(), named));
  ASSERT_EQ(op_new.outputs_size(), 1);
  EXPECT_EQ(op_new.outputs(0).name(), "sum_xy");
  ASSIGN_OR_FAIL(auto info, c().GetBuffer("sum_xy"));
  EXPECT_EQ(info.id(), op_new.outputs(0).id());
  EXPECT_EQ(info.dtype(), v1::DTYPE_FLOAT64);
  EXPECT_EQ(info.size_bytes(), n * 8);
  ASSERT_EQ(info.shape_size(), 1);
  EXPECT_EQ(info.shape(0), n);
  ASSIGN_OR_FAIL(auto got_new, DownloadArray<double>(c(), "sum_xy"));
  ASSERT_EQ(got_new.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_new[i], x[i] + y[i]) << i;
  // The name is taken now: a second new output with it is refused and creates nothing.
  {
    SCOPED_TRACE("duplicate output name");
    ExpectRejected(c(), named, absl::StatusCode::kAlreadyExists);
  }
  // A new float32 output of a float64 result.
  v1::SubmitRequest new32 = xy();
  *new32.mutable_elementwise()->mutable_output() = NewOutput("", v1::DTYPE_FLOAT32);
  ASSIGN_OR_FAIL(auto op_new32, RunOp(c(), new32));
  EXPECT_EQ(op_new32.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  ASSIGN_OR_FAIL(auto got_new32, DownloadArray<float>(c(), op_new32.outputs(0).id()));
  ASSERT_EQ(got_new32.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_new32[i], static_cast<float>(x[i] + y[i])) << i;
}

TEST_F(ServerOpsTest, ElementwiseRejectionsChangeNothing) {
  constexpr size_t n = 1000;
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), RandomDoubles(n, 0, 1, 9)));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), RandomDoubles(n, 0, 1, 10)));
  ASSIGN_OR_FAIL(auto bz, UploadArray(c(), RandomDoubles(n + 1, 0, 1, 11)));
  ASSIGN_OR_FAIL(auto bm, UploadArray(c(), RandomDoubles(n, 0, 1, 12), {25, 40}, v1::LAYOUT_C));
  const std::vector<std::string> all = {bx.id(), by.id(), bz.id()};

  for (const char* text : {"x +", "sin(x", "x $ y", "foo(x)", "x + * y", "(x + y))", "x y"}) {
    SCOPED_TRACE(text);
    ExpectRejected(
        c(), Elementwise(text, {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}}),
        absl::StatusCode::kInvalidArgument, "position", all);
  }
  {
    SCOPED_TRACE("foo(x) with only x bound");
    ExpectRejected(c(), Elementwise("foo(x)", {{"x", BufferOperand(bx.id())}}),
                   absl::StatusCode::kInvalidArgument, "position");
  }
  {
    SCOPED_TRACE("unbound name");
    ExpectRejected(c(), Elementwise("x + w", {{"x", BufferOperand(bx.id())}}),
                   absl::StatusCode::kInvalidArgument, "", all);
  }
  {
    SCOPED_TRACE("bound but unused input");
    ExpectRejected(
        c(), Elementwise("x + 1", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}}),
        absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("unknown input buffer id");
    ExpectRejected(
        c(),
        Elementwise("x + y", {{"x", BufferOperand(bx.id())},
                              {"y", BufferOperand("buf-0123456789abcdef0123456789abcdef")}}),
        absl::StatusCode::kNotFound, "", all);
  }
  {
    SCOPED_TRACE("unknown input buffer name");
    ExpectRejected(
        c(), Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand("nosuch")}}),
        absl::StatusCode::kNotFound);
  }
  {
    SCOPED_TRACE("unknown input with a named new output");
    v1::SubmitRequest r =
        Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand("nosuch")}},
                    NewOutput("never"));
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
    EXPECT_EQ(c().GetBuffer("never").status().code(), absl::StatusCode::kNotFound);
  }
  {
    SCOPED_TRACE("inputs of different shapes");
    ExpectRejected(
        c(), Elementwise("x + z", {{"x", BufferOperand(bx.id())}, {"z", BufferOperand(bz.id())}}),
        absl::StatusCode::kInvalidArgument, "", all);
  }
  {
    SCOPED_TRACE("1-D and 2-D inputs of the same size");
    ExpectRejected(
        c(), Elementwise("x + m", {{"x", BufferOperand(bx.id())}, {"m", BufferOperand(bm.id())}}),
        absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("scalar with no value");
    v1::Operand empty;
    empty.mutable_scalar();
    ExpectRejected(c(), Elementwise("x + a", {{"x", BufferOperand(bx.id())}, {"a", empty}}),
                   absl::StatusCode::kInvalidArgument);
  }
  // After all that, a valid request still works and gives the right answer.
  ASSIGN_OR_FAIL(auto op, RunOp(c(), Elementwise("x - y", {{"x", BufferOperand(bx.id())},
                                                           {"y", BufferOperand(by.id())}})));
  ASSIGN_OR_FAIL(auto x, DownloadArray<double>(c(), bx.id()));
  ASSIGN_OR_FAIL(auto y, DownloadArray<double>(c(), by.id()));
  ASSIGN_OR_FAIL(auto d, DownloadArray<double>(c(), op.outputs(0).id()));
  ASSERT_EQ(d.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], x[i] - y[i]);
}

}  // namespace
}  // namespace gpucompute::testing
