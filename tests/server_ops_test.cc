// End-to-end tests of the compute operations: a real in-process server (CPU backend) on a
// loopback port, driven over the socket through the C++ client library. Inputs go up with
// Client::Upload, operations run through Submit, results come back with Download, and every
// value is compared with a reference computed here, in float64, from the inputs alone.
// Every rejected request is checked for its exact gRPC code and for having changed nothing
// (the buffer listing, the server's memory use, and any target buffer byte for byte).
#include <grpc/grpc.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/client.h"
#include "kernels/ops.h"
#include "kernels/philox.h"
#include "server/backend.h"
#include "server/cpu/cpu_backend.h"
#include "tests/test_server.h"

namespace gpucompute {
namespace {

using ::gpucompute::testing::kMiB;
using ::gpucompute::testing::TestBackendName;
using ::gpucompute::testing::TestServer;

// ---------------------------------------------------------------------------
// Helpers

#define ASSERT_OK(expr)                                       \
  do {                                                        \
    const absl::Status assert_ok_status_ = (expr);            \
    ASSERT_TRUE(assert_ok_status_.ok()) << assert_ok_status_; \
  } while (0)

#define GC_CONCAT_INNER(a, b) a##b
#define GC_CONCAT(a, b) GC_CONCAT_INNER(a, b)
// Declares `auto lhs` from a StatusOr, failing the test (and returning) on an error.
#define ASSIGN_OR_FAIL(lhs, expr) ASSIGN_OR_FAIL_IMPL(GC_CONCAT(status_or_, __LINE__), lhs, expr)
#define ASSIGN_OR_FAIL_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                        \
  ASSERT_TRUE(tmp.ok()) << tmp.status();    \
  auto lhs = *std::move(tmp)

template <typename T>
constexpr v1::DType ProtoDType() {
  if constexpr (std::is_same_v<T, float>) return v1::DTYPE_FLOAT32;
  if constexpr (std::is_same_v<T, double>) return v1::DTYPE_FLOAT64;
  if constexpr (std::is_same_v<T, int32_t>) return v1::DTYPE_INT32;
  if constexpr (std::is_same_v<T, int64_t>) return v1::DTYPE_INT64;
  if constexpr (std::is_same_v<T, uint8_t>) return v1::DTYPE_BOOL;
  return v1::DTYPE_UNSPECIFIED;
}

// Creates a buffer holding `data` (bool arrays as uint8_t) with `shape` (default: 1-D).
template <typename T>
absl::StatusOr<v1::BufferInfo> UploadArray(Client& client, const std::vector<T>& data,
                                           std::vector<uint64_t> shape = {}, v1::Layout layout = v1::LAYOUT_C,
                                           const std::string& name = "") {
  if (shape.empty()) shape = {data.size()};
  v1::UploadHeader header;
  v1::CreateBufferRequest* create = header.mutable_create();
  create->set_dtype(ProtoDType<T>());
  for (uint64_t d : shape) create->add_shape(d);
  create->set_layout(layout);
  create->set_name(name);
  absl::StatusOr<v1::UploadResponse> response =
      client.Upload(header, std::as_bytes(std::span<const T>(data)));
  if (!response.ok()) return response.status();
  return response->buffer();
}

absl::StatusOr<std::string> DownloadBytes(Client& client, const std::string& buffer) {
  v1::DownloadRequest request;
  request.set_buffer(buffer);
  std::string data;
  absl::StatusOr<v1::DownloadResponse> response = client.Download(request, &data);
  if (!response.ok()) return response.status();
  if (data.size() != response->buffer().size_bytes()) {
    return absl::InternalError(
        absl::StrCat("downloaded ", data.size(), " bytes of ", response->buffer().size_bytes()));
  }
  return data;
}

template <typename T>
absl::StatusOr<std::vector<T>> DownloadArray(Client& client, const std::string& buffer) {
  absl::StatusOr<std::string> bytes = DownloadBytes(client, buffer);
  if (!bytes.ok()) return bytes.status();
  if (bytes->size() % sizeof(T) != 0) {
    return absl::InternalError(absl::StrCat(bytes->size(), " bytes is no whole number of elements"));
  }
  std::vector<T> out(bytes->size() / sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), bytes->data(), bytes->size());
  return out;
}

// What a rejected request must leave as it was: the client's buffers (ids, names, sizes)
// and the server's memory use and buffer count.
struct World {
  std::vector<std::string> buffers;
  uint64_t total_bytes = 0;
  uint64_t memory_used_bytes = 0;
  uint64_t buffer_count = 0;
  bool operator==(const World&) const = default;
};

std::ostream& operator<<(std::ostream& os, const World& w) {
  os << "{buffers:";
  for (const std::string& b : w.buffers) os << " " << b;
  return os << "; total_bytes " << w.total_bytes << "; memory_used " << w.memory_used_bytes
            << "; buffer_count " << w.buffer_count << "}";
}

World Snapshot(Client& client) {
  World w;
  absl::StatusOr<v1::ListBuffersResponse> list = client.ListBuffers();
  EXPECT_TRUE(list.ok()) << list.status();
  if (list.ok()) {
    for (const v1::BufferInfo& b : list->buffers()) {
      w.buffers.push_back(absl::StrCat(b.id(), "/", b.name(), "/", b.size_bytes()));
    }
    w.total_bytes = list->total_bytes();
  }
  absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
  if (info.ok()) {
    w.memory_used_bytes = info->memory_used_bytes();
    w.buffer_count = info->buffer_count();
  }
  return w;
}

// Submits a request that must be rejected with `code` (and, when given, a message containing
// `needle`), and checks that it changed nothing: the listing, the memory use, and the bytes of
// every buffer in `watched`.
void ExpectRejected(Client& client, const v1::SubmitRequest& request, absl::StatusCode code,
                    std::string_view needle = {}, const std::vector<std::string>& watched = {}) {
  const World before = Snapshot(client);
  std::vector<std::string> contents;
  for (const std::string& b : watched) {
    absl::StatusOr<std::string> bytes = DownloadBytes(client, b);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    contents.push_back(*std::move(bytes));
  }
  absl::StatusOr<v1::Operation> op = client.Submit(request);
  ASSERT_FALSE(op.ok()) << "accepted: " << request.DebugString();
  EXPECT_EQ(op.status().code(), code) << op.status() << "\nrequest: " << request.DebugString();
  if (!needle.empty()) {
    EXPECT_NE(std::string(op.status().message()).find(needle), std::string::npos)
        << "message '" << op.status().message() << "' lacks '" << needle << "'";
  }
  EXPECT_EQ(Snapshot(client), before) << "a rejected request changed the buffers";
  for (size_t i = 0; i < watched.size(); ++i) {
    absl::StatusOr<std::string> bytes = DownloadBytes(client, watched[i]);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    EXPECT_TRUE(*bytes == contents[i]) << "a rejected request changed buffer " << watched[i];
  }
}

v1::SubmitRequest Waiting(v1::SubmitRequest request, std::string_view stream = {}) {
  request.set_wait(true);
  request.set_stream_id(std::string(stream));
  return request;
}

v1::SubmitRequest OnStream(v1::SubmitRequest request, std::string_view stream) {
  request.set_wait(false);
  request.set_stream_id(std::string(stream));
  return request;
}

// Submits with wait and checks that the operation succeeded.
absl::StatusOr<v1::Operation> RunOp(Client& client, v1::SubmitRequest request, std::string_view stream = {}) {
  absl::StatusOr<v1::Operation> op = client.Submit(Waiting(std::move(request), stream));
  if (!op.ok()) return op.status();
  if (!op->done() || op->state() != v1::Operation::STATE_SUCCEEDED) {
    return absl::InternalError(absl::StrCat("operation not succeeded: ", op->DebugString()));
  }
  return op;
}

// Deterministic test data: a 64-bit LCG, uniform doubles in [lo, hi).
class Lcg {
 public:
  explicit Lcg(uint64_t seed) : state_(seed * 6364136223846793005ULL + 1442695040888963407ULL) {}
  double Uniform(double lo, double hi) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return lo + (hi - lo) * static_cast<double>(state_ >> 11) * 0x1.0p-53;
  }
  int64_t Int(int64_t lo, int64_t hi) {  // [lo, hi)
    return lo + static_cast<int64_t>(Uniform(0, 1) * static_cast<double>(hi - lo));
  }

 private:
  uint64_t state_;
};

std::vector<double> RandomDoubles(size_t n, double lo, double hi, uint64_t seed) {
  Lcg g(seed);
  std::vector<double> v(n);
  for (double& x : v) x = g.Uniform(lo, hi);
  return v;
}

template <typename To, typename From>
std::vector<To> Cast(const std::vector<From>& v) {
  std::vector<To> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<To>(v[i]);
  return out;
}

// Compares got[i] with ref[i] within rel * max(|ref[i]|, floor) and reports the first few misses.
template <typename T>
void ExpectClose(const std::vector<T>& got, const std::vector<double>& ref, double rel, double floor = 0,
                 std::string_view what = "") {
  ASSERT_EQ(got.size(), ref.size()) << what;
  int misses = 0;
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double err = std::fabs(g - ref[i]);
    const double scale = std::max(std::fabs(ref[i]), floor);
    if (scale > 0) worst = std::max(worst, err / scale);
    if (!(err <= rel * scale) && misses++ < 5) {
      ADD_FAILURE() << what << " [" << i << "]: got " << g << ", want " << ref[i] << " (error " << err
                    << " > " << rel * scale << ")";
    }
  }
  EXPECT_EQ(misses, 0) << what << ": " << misses << " of " << ref.size()
                       << " elements out of tolerance; worst relative error " << worst;
}

const std::regex kOpIdPattern("op-[0-9a-f]{32}");
const std::regex kStreamIdPattern("str-[0-9a-f]{32}");

class ServerOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::Start(512 * kMiB, 2);
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("ops-test");
    ASSERT_NE(client_, nullptr);
  }

  Client& c() { return *client_; }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

// ---------------------------------------------------------------------------
// 1. Elementwise

double Workload(double x) {
  return std::sqrt(std::fabs(std::exp(-std::sin(x * x)) / (std::sqrt(std::fabs(x)) * std::tanh(x))));
}
constexpr std::string_view kWorkload = "sqrt(abs(exp(-sin(x*x)) / (sqrt(abs(x))*tanh(x))))";

TEST_F(ServerOpsTest, ElementwiseSumAndAxpy) {
  constexpr size_t n = 100003;  // not a multiple of any block size
  const std::vector<double> x = RandomDoubles(n, -10, 10, 1);
  const std::vector<double> y = RandomDoubles(n, -10, 10, 2);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(by, UploadArray(c(), y));

  ASSIGN_OR_FAIL(
      sum, RunOp(c(), Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}})));
  EXPECT_EQ(sum.kind(), v1::OPERATION_KIND_ELEMENTWISE);
  ASSERT_EQ(sum.outputs_size(), 1);
  EXPECT_EQ(sum.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  EXPECT_EQ(std::vector<uint64_t>(sum.outputs(0).shape().begin(), sum.outputs(0).shape().end()),
            std::vector<uint64_t>{n});
  ASSIGN_OR_FAIL(got_sum, DownloadArray<double>(c(), sum.outputs(0).id()));
  ASSERT_EQ(got_sum.size(), n);
  for (size_t i = 0; i < n; ++i) {
    // One IEEE addition of two doubles: exact to the bit.
    ASSERT_EQ(got_sum[i], x[i] + y[i]) << i;
  }

  // a*x + y with a scalar a: one multiply and one add, each rounded once (a fused
  // multiply-add would be within the same bound).
  const double a = 2.75;
  ASSIGN_OR_FAIL(axpy, RunOp(c(), Elementwise("a*x + y", {{"a", ScalarOperand(a)},
                                                          {"x", BufferOperand(bx.id())},
                                                          {"y", BufferOperand(by.id())}})));
  ASSIGN_OR_FAIL(got_axpy, DownloadArray<double>(c(), axpy.outputs(0).id()));
  ASSERT_EQ(got_axpy.size(), n);
  for (size_t i = 0; i < n; ++i) {
    const double ref = static_cast<double>(static_cast<long double>(a) * x[i] + y[i]);
    const double bound = 2 * 0x1.0p-52 * (std::fabs(a * x[i]) + std::fabs(y[i]));
    ASSERT_LE(std::fabs(got_axpy[i] - ref), bound) << i;
  }

  // The same in float32 with an int scalar: the weak scalar keeps float32.
  const std::vector<float> xf = Cast<float>(x);
  const std::vector<float> yf = Cast<float>(y);
  ASSIGN_OR_FAIL(bxf, UploadArray(c(), xf));
  ASSIGN_OR_FAIL(byf, UploadArray(c(), yf));
  ASSIGN_OR_FAIL(axpyf, RunOp(c(), Elementwise("a*x + y", {{"a", ScalarOperand(3)},
                                                           {"x", BufferOperand(bxf.id())},
                                                           {"y", BufferOperand(byf.id())}})));
  ASSERT_EQ(axpyf.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  ASSIGN_OR_FAIL(got_axpyf, DownloadArray<float>(c(), axpyf.outputs(0).id()));
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
  ASSIGN_OR_FAIL(info, c().GetServerInfo());
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
      ASSIGN_OR_FAIL(buffer, c().CreateBuffer(create));
      EXPECT_EQ(buffer.device(), device.index());
      ids.push_back(buffer.id());
    }
    firsts.push_back(ids[0]);
    ASSIGN_OR_FAIL(sum, RunOp(c(), Elementwise("x * y + x", {{"x", BufferOperand(ids[0])}, {"y", BufferOperand(ids[1])}})));
    ASSERT_EQ(sum.outputs_size(), 1);
    EXPECT_EQ(sum.outputs(0).device(), device.index());
    ASSIGN_OR_FAIL(total, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, sum.outputs(0).id())));
    ASSERT_EQ(total.values_size(), 1);
    EXPECT_EQ(total.values(0).float_value(), n * (1.5 * 2.25 + 1.5));
  }
  absl::StatusOr<v1::Operation> mixed =
      c().Submit(Elementwise("x + y", {{"x", BufferOperand(firsts[0])}, {"y", BufferOperand(firsts[1])}}));
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

  ASSIGN_OR_FAIL(bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(op, RunOp(c(), Elementwise(kWorkload, {{"x", BufferOperand(bx.id())}})));
  ASSERT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  ASSIGN_OR_FAIL(got, DownloadArray<double>(c(), op.outputs(0).id()));
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
  ASSIGN_OR_FAIL(bxf, UploadArray(c(), xf));
  ASSIGN_OR_FAIL(op32, RunOp(c(), Elementwise(kWorkload, {{"x", BufferOperand(bxf.id())}})));
  ASSERT_EQ(op32.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(op32.outputs(0).size_bytes(), n * 4);
  ASSIGN_OR_FAIL(got32, DownloadArray<float>(c(), op32.outputs(0).id()));
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
  ASSIGN_OR_FAIL(bxi, UploadArray(c(), xi));
  ASSIGN_OR_FAIL(byf, UploadArray(c(), yf));
  // NumPy 2: int32 + float32 -> float64.
  ASSIGN_OR_FAIL(
      op, RunOp(c(), Elementwise("x + y", {{"x", BufferOperand(bxi.id())}, {"y", BufferOperand(byf.id())}})));
  ASSERT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
  ASSIGN_OR_FAIL(got, DownloadArray<double>(c(), op.outputs(0).id()));
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    // Both convert exactly to float64; the one rounding of the sum is what NumPy gives.
    ASSERT_EQ(got[i], static_cast<double>(xi[i]) + static_cast<double>(yf[i])) << i;
  }

  // Comparison -> bool, one byte per element, 0 or 1. Equal pairs test strictness.
  std::vector<double> a = RandomDoubles(n, -1, 1, 5);
  std::vector<double> b = RandomDoubles(n, -1, 1, 6);
  for (size_t i = 0; i < n; i += 7) b[i] = a[i];
  ASSIGN_OR_FAIL(ba, UploadArray(c(), a));
  ASSIGN_OR_FAIL(bb, UploadArray(c(), b));
  ASSIGN_OR_FAIL(
      cmp, RunOp(c(), Elementwise("a < b", {{"a", BufferOperand(ba.id())}, {"b", BufferOperand(bb.id())}})));
  ASSERT_EQ(cmp.outputs(0).dtype(), v1::DTYPE_BOOL);
  EXPECT_EQ(cmp.outputs(0).size_bytes(), n);
  ASSIGN_OR_FAIL(bits, DownloadArray<uint8_t>(c(), cmp.outputs(0).id()));
  ASSERT_EQ(bits.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits[i], a[i] < b[i] ? 1 : 0) << i;
  ASSIGN_OR_FAIL(
      cmp2,
      RunOp(c(), Elementwise("a >= b", {{"a", BufferOperand(ba.id())}, {"b", BufferOperand(bb.id())}})));
  ASSIGN_OR_FAIL(bits2, DownloadArray<uint8_t>(c(), cmp2.outputs(0).id()));
  ASSERT_EQ(bits2.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(bits2[i], a[i] >= b[i] ? 1 : 0) << i;
}

TEST_F(ServerOpsTest, ElementwiseIntoExistingAndNamedOutputs) {
  constexpr size_t n = 4099;
  const std::vector<double> x = RandomDoubles(n, -100, 100, 7);
  const std::vector<double> y = RandomDoubles(n, -100, 100, 8);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(by, UploadArray(c(), y));
  const auto xy = [&] {
    return Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}});
  };

  // float64 result into an existing float32 buffer (same_kind): each element is the float64
  // sum rounded once to float32. No buffer is created.
  ASSIGN_OR_FAIL(out32, UploadArray(c(), std::vector<float>(n, -1.0f)));
  const World before = Snapshot(c());
  v1::SubmitRequest into32 = xy();
  *into32.mutable_elementwise()->mutable_output() = ExistingOutput(out32.id());
  ASSIGN_OR_FAIL(op, RunOp(c(), into32));
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).id(), out32.id());
  EXPECT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(Snapshot(c()), before);
  ASSIGN_OR_FAIL(got32, DownloadArray<float>(c(), out32.id()));
  ASSERT_EQ(got32.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got32[i], static_cast<float>(x[i] + y[i])) << i;

  // The output referred to by name works the same.
  ASSIGN_OR_FAIL(named64, UploadArray(c(), std::vector<double>(n, 0.0), {}, v1::LAYOUT_C, "dest64"));
  v1::SubmitRequest by_name = xy();
  *by_name.mutable_elementwise()->mutable_output() = ExistingOutput("dest64");
  ASSIGN_OR_FAIL(op_named, RunOp(c(), by_name));
  EXPECT_EQ(op_named.outputs(0).id(), named64.id());
  ASSIGN_OR_FAIL(got_named, DownloadArray<double>(c(), named64.id()));
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_named[i], x[i] + y[i]) << i;

  // A float result into an int32 buffer is never allowed; the target keeps its bytes.
  std::vector<int32_t> sentinel(n);
  for (size_t i = 0; i < n; ++i) sentinel[i] = static_cast<int32_t>(i * 2654435761u);
  ASSIGN_OR_FAIL(out_i32, UploadArray(c(), sentinel));
  v1::SubmitRequest into_int = xy();
  *into_int.mutable_elementwise()->mutable_output() = ExistingOutput(out_i32.id());
  {
    SCOPED_TRACE("float64 into int32");
    ExpectRejected(c(), into_int, absl::StatusCode::kInvalidArgument, "", {out_i32.id()});
  }
  ASSIGN_OR_FAIL(still, DownloadArray<int32_t>(c(), out_i32.id()));
  EXPECT_EQ(still, sentinel);
  // A new output whose requested dtype is int32 is refused as well.
  v1::SubmitRequest new_int = xy();
  *new_int.mutable_elementwise()->mutable_output() = NewOutput("", v1::DTYPE_INT32);
  {
    SCOPED_TRACE("new int32 output of a float result");
    ExpectRejected(c(), new_int, absl::StatusCode::kInvalidArgument);
  }
  // An existing output of another shape.
  ASSIGN_OR_FAIL(short_out, UploadArray(c(), std::vector<double>(n - 1, 5.0)));
  v1::SubmitRequest wrong_shape = xy();
  *wrong_shape.mutable_elementwise()->mutable_output() = ExistingOutput(short_out.id());
  {
    SCOPED_TRACE("output of another shape");
    ExpectRejected(c(), wrong_shape, absl::StatusCode::kInvalidArgument, "", {short_out.id()});
  }

  // A new output with a name: found afterwards by that name.
  v1::SubmitRequest named = xy();
  *named.mutable_elementwise()->mutable_output() = NewOutput("sum_xy");
  ASSIGN_OR_FAIL(op_new, RunOp(c(), named));
  ASSERT_EQ(op_new.outputs_size(), 1);
  EXPECT_EQ(op_new.outputs(0).name(), "sum_xy");
  ASSIGN_OR_FAIL(info, c().GetBuffer("sum_xy"));
  EXPECT_EQ(info.id(), op_new.outputs(0).id());
  EXPECT_EQ(info.dtype(), v1::DTYPE_FLOAT64);
  EXPECT_EQ(info.size_bytes(), n * 8);
  ASSERT_EQ(info.shape_size(), 1);
  EXPECT_EQ(info.shape(0), n);
  ASSIGN_OR_FAIL(got_new, DownloadArray<double>(c(), "sum_xy"));
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
  ASSIGN_OR_FAIL(op_new32, RunOp(c(), new32));
  EXPECT_EQ(op_new32.outputs(0).dtype(), v1::DTYPE_FLOAT32);
  ASSIGN_OR_FAIL(got_new32, DownloadArray<float>(c(), op_new32.outputs(0).id()));
  ASSERT_EQ(got_new32.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(got_new32[i], static_cast<float>(x[i] + y[i])) << i;
}

TEST_F(ServerOpsTest, ElementwiseRejectionsChangeNothing) {
  constexpr size_t n = 1000;
  ASSIGN_OR_FAIL(bx, UploadArray(c(), RandomDoubles(n, 0, 1, 9)));
  ASSIGN_OR_FAIL(by, UploadArray(c(), RandomDoubles(n, 0, 1, 10)));
  ASSIGN_OR_FAIL(bz, UploadArray(c(), RandomDoubles(n + 1, 0, 1, 11)));
  ASSIGN_OR_FAIL(bm, UploadArray(c(), RandomDoubles(n, 0, 1, 12), {25, 40}, v1::LAYOUT_C));
  ASSIGN_OR_FAIL(bmf, UploadArray(c(), RandomDoubles(n, 0, 1, 13), {25, 40}, v1::LAYOUT_F));
  const std::vector<std::string> all = {bx.id(), by.id(), bz.id()};

  for (const char* text : {"x +", "sin(x", "x $ y", "foo(x)", "x + * y", "(x + y))", "x y"}) {
    SCOPED_TRACE(text);
    ExpectRejected(c(), Elementwise(text, {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}}),
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
    ExpectRejected(c(), Elementwise("x + 1", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}}),
                   absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("unknown input buffer id");
    ExpectRejected(c(),
                   Elementwise("x + y", {{"x", BufferOperand(bx.id())},
                                         {"y", BufferOperand("buf-0123456789abcdef0123456789abcdef")}}),
                   absl::StatusCode::kNotFound, "", all);
  }
  {
    SCOPED_TRACE("unknown input buffer name");
    ExpectRejected(c(), Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand("nosuch")}}),
                   absl::StatusCode::kNotFound);
  }
  {
    SCOPED_TRACE("unknown input with a named new output");
    v1::SubmitRequest r = Elementwise(
        "x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand("nosuch")}}, NewOutput("never"));
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
    EXPECT_EQ(c().GetBuffer("never").status().code(), absl::StatusCode::kNotFound);
  }
  {
    SCOPED_TRACE("inputs of different shapes");
    ExpectRejected(c(), Elementwise("x + z", {{"x", BufferOperand(bx.id())}, {"z", BufferOperand(bz.id())}}),
                   absl::StatusCode::kInvalidArgument, "", all);
  }
  {
    SCOPED_TRACE("1-D and 2-D inputs of the same size");
    ExpectRejected(c(), Elementwise("x + m", {{"x", BufferOperand(bx.id())}, {"m", BufferOperand(bm.id())}}),
                   absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("inputs of different layouts");
    ExpectRejected(c(), Elementwise("m + f", {{"m", BufferOperand(bm.id())}, {"f", BufferOperand(bmf.id())}}),
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
  ASSIGN_OR_FAIL(
      op, RunOp(c(), Elementwise("x - y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}})));
  ASSIGN_OR_FAIL(x, DownloadArray<double>(c(), bx.id()));
  ASSIGN_OR_FAIL(y, DownloadArray<double>(c(), by.id()));
  ASSIGN_OR_FAIL(d, DownloadArray<double>(c(), op.outputs(0).id()));
  ASSERT_EQ(d.size(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(d[i], x[i] - y[i]);
}

// ---------------------------------------------------------------------------
// 2. Gemv

// A (rows x cols), logically A[i][j] = a[i * cols + j], stored in `layout`.
template <typename T>
std::vector<T> ToMemory(const std::vector<double>& a, size_t rows, size_t cols, v1::Layout layout) {
  std::vector<T> mem(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      mem[layout == v1::LAYOUT_F ? j * rows + i : i * cols + j] = static_cast<T>(a[i * cols + j]);
    }
  }
  return mem;
}

// y = alpha * op(A) * x + beta * y0 in float64, with the matching bound
// gamma_K * (|alpha| * sum |A||x| + |beta y0|) scale for each element.
struct GemvRef {
  std::vector<double> y;
  std::vector<double> scale;  // |alpha| * sum_k |A||x| + |beta * y0|
};
GemvRef ReferenceGemv(const std::vector<double>& a, size_t rows, size_t cols, bool transpose, double alpha,
                      const std::vector<double>& x, double beta, const std::vector<double>* y0) {
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
    ASSIGN_OR_FAIL(ba, UploadArray(c(), ToMemory<double>(a, rows, cols, layout), {rows, cols}, layout));
    ASSERT_EQ(ba.layout(), layout);
    ASSIGN_OR_FAIL(ba32, UploadArray(c(), ToMemory<float>(a, rows, cols, layout), {rows, cols}, layout));
    for (bool transpose : {false, true}) {
      const std::string what =
          absl::StrCat(layout == v1::LAYOUT_F ? "F" : "C", transpose ? " transposed" : "");
      SCOPED_TRACE(what);
      const size_t k_len = transpose ? rows : cols;
      const size_t p_len = transpose ? cols : rows;
      const std::vector<double> x = RandomDoubles(k_len, -2, 2, 21 + transpose);
      ASSIGN_OR_FAIL(bx, UploadArray(c(), x));

      // New y: beta is ignored (there is no y to scale).
      ASSIGN_OR_FAIL(op, RunOp(c(), Gemv(ba.id(), bx.id(), NewOutput(), transpose, 1.5, 0.75)));
      EXPECT_EQ(op.kind(), v1::OPERATION_KIND_GEMV);
      ASSERT_EQ(op.outputs_size(), 1);
      EXPECT_EQ(op.outputs(0).dtype(), v1::DTYPE_FLOAT64);
      ASSERT_EQ(op.outputs(0).shape_size(), 1);
      EXPECT_EQ(op.outputs(0).shape(0), p_len);
      EXPECT_EQ(op.timing().flops(), 2 * rows * cols);
      EXPECT_EQ(op.timing().bytes_read(), (rows * cols + k_len) * 8);
      EXPECT_EQ(op.timing().bytes_written(), p_len * 8);
      ASSIGN_OR_FAIL(y_new, DownloadArray<double>(c(), op.outputs(0).id()));
      ExpectGemvClose(y_new, ReferenceGemv(a, rows, cols, transpose, 1.5, x, 0, nullptr), 0x1.0p-53, k_len,
                      "new y");

      // Existing y with alpha and beta.
      const std::vector<double> y0 = RandomDoubles(p_len, -3, 3, 30 + transpose);
      ASSIGN_OR_FAIL(by, UploadArray(c(), y0));
      ASSIGN_OR_FAIL(op2, RunOp(c(), Gemv(ba.id(), bx.id(), ExistingOutput(by.id()), transpose, -0.5, 2.0)));
      EXPECT_EQ(op2.outputs(0).id(), by.id());
      EXPECT_EQ(op2.timing().bytes_read(), (rows * cols + k_len + p_len) * 8);
      ASSIGN_OR_FAIL(y_acc, DownloadArray<double>(c(), by.id()));
      ExpectGemvClose(y_acc, ReferenceGemv(a, rows, cols, transpose, -0.5, x, 2.0, &y0), 0x1.0p-53, k_len,
                      "existing y, alpha -0.5, beta 2");

      // alpha left unset defaults to 1; beta unset is 0 (y's old contents do not matter).
      v1::SubmitRequest defaults = Gemv(ba.id(), bx.id(), ExistingOutput(by.id()), transpose);
      defaults.mutable_gemv()->clear_alpha();
      defaults.mutable_gemv()->clear_beta();
      ASSIGN_OR_FAIL(op3, RunOp(c(), defaults));
      ASSIGN_OR_FAIL(y_def, DownloadArray<double>(c(), by.id()));
      ExpectGemvClose(y_def, ReferenceGemv(a, rows, cols, transpose, 1.0, x, 0, nullptr), 0x1.0p-53, k_len,
                      "default alpha");

      // float32 A and x: products exact in float64; one more rounding to float32.
      ASSIGN_OR_FAIL(bx32, UploadArray(c(), Cast<float>(x)));
      ASSIGN_OR_FAIL(op4, RunOp(c(), Gemv(ba32.id(), bx32.id(), NewOutput(), transpose, 2.0, 0)));
      EXPECT_EQ(op4.outputs(0).dtype(), v1::DTYPE_FLOAT32);
      ASSIGN_OR_FAIL(y32, DownloadArray<float>(c(), op4.outputs(0).id()));
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
  ASSIGN_OR_FAIL(a, UploadArray(c(), RandomDoubles(rows * cols, -1, 1, 40), {rows, cols}));
  ASSIGN_OR_FAIL(a1d, UploadArray(c(), RandomDoubles(rows * cols, -1, 1, 41)));
  std::vector<int32_t> ints(rows * cols, 3);
  ASSIGN_OR_FAIL(a_int, UploadArray(c(), ints, {rows, cols}));
  ASSIGN_OR_FAIL(x, UploadArray(c(), RandomDoubles(cols, -1, 1, 42)));
  ASSIGN_OR_FAIL(x_rows, UploadArray(c(), RandomDoubles(rows, -1, 1, 43)));
  ASSIGN_OR_FAIL(x32, UploadArray(c(), std::vector<float>(cols, 1.0f)));
  ASSIGN_OR_FAIL(xi, UploadArray(c(), std::vector<int32_t>(cols, 1)));
  ASSIGN_OR_FAIL(y, UploadArray(c(), RandomDoubles(rows, -1, 1, 44)));
  ASSIGN_OR_FAIL(y_short, UploadArray(c(), RandomDoubles(rows - 1, -1, 1, 45)));
  ASSIGN_OR_FAIL(y32, UploadArray(c(), std::vector<float>(rows, 2.0f)));
  const std::vector<std::string> watched = {y.id(), y_short.id(), y32.id(), a.id(), x.id()};
  const auto reject = [&](const char* what, const v1::SubmitRequest& r, absl::StatusCode code) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, code, "", watched);
  };
  reject("1-D a", Gemv(a1d.id(), x.id(), ExistingOutput(y.id())), absl::StatusCode::kInvalidArgument);
  reject("1-D a, new y", Gemv(a1d.id(), x.id()), absl::StatusCode::kInvalidArgument);
  reject("int32 a", Gemv(a_int.id(), xi.id()), absl::StatusCode::kInvalidArgument);
  reject("float64 a, float32 x", Gemv(a.id(), x32.id(), ExistingOutput(y.id())),
         absl::StatusCode::kInvalidArgument);
  reject("x of the row count without transpose", Gemv(a.id(), x_rows.id(), ExistingOutput(y.id())),
         absl::StatusCode::kInvalidArgument);
  reject("x of the column count with transpose", Gemv(a.id(), x.id(), NewOutput(), /*transpose=*/true),
         absl::StatusCode::kInvalidArgument);
  reject("y of the wrong length", Gemv(a.id(), x.id(), ExistingOutput(y_short.id())),
         absl::StatusCode::kInvalidArgument);
  reject("float32 y for float64 a", Gemv(a.id(), x.id(), ExistingOutput(y32.id())),
         absl::StatusCode::kInvalidArgument);
  reject("new y of another dtype", Gemv(a.id(), x.id(), NewOutput("", v1::DTYPE_FLOAT32)),
         absl::StatusCode::kInvalidArgument);
  reject("unknown a", Gemv("buf-00000000000000000000000000000000", x.id()), absl::StatusCode::kNotFound);
  reject("unknown x", Gemv(a.id(), "no-such-x", NewOutput("never")), absl::StatusCode::kNotFound);
  reject("missing a", Gemv("", x.id()), absl::StatusCode::kInvalidArgument);
  // y aliasing x: a square matrix makes the lengths agree.
  ASSIGN_OR_FAIL(sq, UploadArray(c(), RandomDoubles(cols * cols, -1, 1, 46), {cols, cols}));
  reject("y is x", Gemv(sq.id(), x.id(), ExistingOutput(x.id())), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// 3. Reduce

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
          buffer =
              UploadArray(c(), ToMemory<double>(values, kRows, kCols, upload_layout), shape, upload_layout);
          break;
        case v1::DTYPE_FLOAT32:
          buffer =
              UploadArray(c(), ToMemory<float>(values, kRows, kCols, upload_layout), shape, upload_layout);
          break;
        default:
          buffer =
              UploadArray(c(), ToMemory<int32_t>(values, kRows, kCols, upload_layout), shape, upload_layout);
          break;
      }
      ASSERT_TRUE(buffer.ok()) << buffer.status();
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
          const std::string what =
              absl::StrCat(v1::DType_Name(dtype), " ", one_d ? "1-D" : v1::Layout_Name(layout), " axis ",
                           axis.has_value() ? absl::StrCat(*axis) : "none", " ", v1::ReduceKind_Name(kind));
          SCOPED_TRACE(what);
          ASSIGN_OR_FAIL(op, RunOp(c(), Reduce(kind, buffer->id(), axis)));
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
          ASSIGN_OR_FAIL(downloaded, DownloadAsDoubles(c(), op.outputs(0).id(), result_dtype));
          ASSERT_EQ(downloaded.size(), groups.size());
          const bool float_result = result_dtype == v1::DTYPE_FLOAT32 || result_dtype == v1::DTYPE_FLOAT64;
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
  ASSIGN_OR_FAIL(f, UploadArray(c(), ToMemory<double>(logical, 3, 4, v1::LAYOUT_F), {3, 4}, v1::LAYOUT_F));
  ASSIGN_OR_FAIL(argmin, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMIN, f.id())));
  ASSERT_EQ(argmin.values_size(), 1);
  EXPECT_EQ(argmin.values(0).int_value(), 1) << "numpy.argmin gives 1 (the first -1 in C order)";
  ASSIGN_OR_FAIL(argmax, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMAX, f.id())));
  ASSERT_EQ(argmax.values_size(), 1);
  // Maximum 9 at (1, 1) = flat 5 and (1, 3) = flat 7; in F memory (1, 1) is position 4 and
  // (1, 3) position 10, so both orders agree here: 5.
  EXPECT_EQ(argmax.values(0).int_value(), 5);
  ASSIGN_OR_FAIL(downloaded, DownloadArray<int64_t>(c(), argmin.outputs(0).id()));
  ASSERT_EQ(downloaded.size(), 1u);
  EXPECT_EQ(downloaded[0], argmin.values(0).int_value());
  // A NaN wins: the first NaN in C order.
  std::vector<double> with_nan = logical;
  with_nan[6] = std::nan("");  // (1, 2): F position 7
  with_nan[9] = std::nan("");  // (2, 1): F position 5
  ASSIGN_OR_FAIL(fn, UploadArray(c(), ToMemory<double>(with_nan, 3, 4, v1::LAYOUT_F), {3, 4}, v1::LAYOUT_F));
  ASSIGN_OR_FAIL(argmin_nan, RunOp(c(), Reduce(v1::REDUCE_KIND_ARGMIN, fn.id())));
  EXPECT_EQ(argmin_nan.values(0).int_value(), 6) << "numpy.argmin gives the first NaN in C order, 6";
}

TEST_F(ServerOpsTest, ReduceIntoExistingOutputAndLargeResults) {
  const std::vector<double> matrix = ReduceMatrix();
  ASSIGN_OR_FAIL(a, UploadArray(c(), matrix, {kRows, kCols}));
  ASSIGN_OR_FAIL(out, UploadArray(c(), std::vector<double>(kCols, -7.0)));
  const World before = Snapshot(c());
  ASSIGN_OR_FAIL(op, RunOp(c(), Reduce(v1::REDUCE_KIND_MAX, a.id(), 0, ExistingOutput(out.id()))));
  EXPECT_EQ(op.outputs(0).id(), out.id());
  EXPECT_EQ(Snapshot(c()), before);
  ASSIGN_OR_FAIL(got, DownloadArray<double>(c(), out.id()));
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
  ASSIGN_OR_FAIL(t, UploadArray(c(), tall, {rows, 2}));
  ASSIGN_OR_FAIL(sums, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, t.id(), 1)));
  EXPECT_EQ(sums.values_size(), 0);
  EXPECT_EQ(sums.outputs(0).dtype(), v1::DTYPE_INT64);
  ASSIGN_OR_FAIL(row_sums, DownloadArray<int64_t>(c(), sums.outputs(0).id()));
  ASSERT_EQ(row_sums.size(), rows);
  for (size_t i = 0; i < rows; ++i) ASSERT_EQ(row_sums[i], int64_t{tall[2 * i]} + tall[2 * i + 1]) << i;
  // Exactly 4096 results are still inline.
  ASSIGN_OR_FAIL(t2, UploadArray(c(), std::vector<int32_t>(4096 * 2, 1), {4096, 2}));
  ASSIGN_OR_FAIL(sums2, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, t2.id(), -1)));
  ASSERT_EQ(sums2.values_size(), 4096);
  for (const v1::Scalar& v : sums2.values()) ASSERT_EQ(v.int_value(), 2);
}

TEST_F(ServerOpsTest, ReduceEmptyAndRejections) {
  v1::CreateBufferRequest empty_request;
  empty_request.set_dtype(v1::DTYPE_FLOAT64);
  empty_request.add_shape(0);
  ASSIGN_OR_FAIL(empty, c().CreateBuffer(empty_request));
  // Reductions with an identity are defined on zero elements, as in NumPy.
  ASSIGN_OR_FAIL(sum, RunOp(c(), Reduce(v1::REDUCE_KIND_SUM, empty.id())));
  ASSERT_EQ(sum.values_size(), 1);
  EXPECT_EQ(sum.values(0).float_value(), 0.0);
  ASSIGN_OR_FAIL(prod, RunOp(c(), Reduce(v1::REDUCE_KIND_PROD, empty.id())));
  ASSERT_EQ(prod.values_size(), 1);
  EXPECT_EQ(prod.values(0).float_value(), 1.0);

  ASSIGN_OR_FAIL(v, UploadArray(c(), RandomDoubles(100, 0, 1, 60)));
  ASSIGN_OR_FAIL(m, UploadArray(c(), RandomDoubles(60, 0, 1, 61), {6, 10}));
  ASSIGN_OR_FAIL(m_empty_rows, c().CreateBuffer([] {
    v1::CreateBufferRequest r;
    r.set_dtype(v1::DTYPE_FLOAT64);
    r.add_shape(0);
    r.add_shape(5);
    return r;
  }()));
  ASSIGN_OR_FAIL(out_i32, UploadArray(c(), std::vector<int32_t>(1, 77), std::vector<uint64_t>{}));
  ASSIGN_OR_FAIL(out_f64_short, UploadArray(c(), std::vector<double>(9, 1.0)));
  const std::vector<std::string> watched = {v.id(), m.id(), out_i32.id(), out_f64_short.id()};
  const auto reject = [&](const char* what, const v1::SubmitRequest& r, absl::StatusCode code) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, code, "", watched);
  };
  reject("min of empty", Reduce(v1::REDUCE_KIND_MIN, empty.id()), absl::StatusCode::kInvalidArgument);
  reject("max of empty", Reduce(v1::REDUCE_KIND_MAX, empty.id()), absl::StatusCode::kInvalidArgument);
  reject("argmin of empty", Reduce(v1::REDUCE_KIND_ARGMIN, empty.id()), absl::StatusCode::kInvalidArgument);
  reject("argmax of empty, named output", Reduce(v1::REDUCE_KIND_ARGMAX, empty.id(), {}, NewOutput("never")),
         absl::StatusCode::kInvalidArgument);
  reject("min along an empty axis", Reduce(v1::REDUCE_KIND_MIN, m_empty_rows.id(), 0),
         absl::StatusCode::kInvalidArgument);
  reject("axis 0 of 1-D", Reduce(v1::REDUCE_KIND_SUM, v.id(), 0), absl::StatusCode::kInvalidArgument);
  reject("axis -1 of 1-D", Reduce(v1::REDUCE_KIND_SUM, v.id(), -1), absl::StatusCode::kInvalidArgument);
  reject("axis 2 of 2-D", Reduce(v1::REDUCE_KIND_SUM, m.id(), 2), absl::StatusCode::kInvalidArgument);
  reject("axis -3 of 2-D", Reduce(v1::REDUCE_KIND_SUM, m.id(), -3), absl::StatusCode::kInvalidArgument);
  reject("no kind", Reduce(v1::REDUCE_KIND_UNSPECIFIED, m.id()), absl::StatusCode::kInvalidArgument);
  reject("unknown input", Reduce(v1::REDUCE_KIND_SUM, "buf-ffffffffffffffffffffffffffffffff"),
         absl::StatusCode::kNotFound);
  reject("float64 sum into an int32 buffer",
         Reduce(v1::REDUCE_KIND_SUM, v.id(), {}, ExistingOutput(out_i32.id())),
         absl::StatusCode::kInvalidArgument);
  reject("axis result into a buffer of the wrong length",
         Reduce(v1::REDUCE_KIND_SUM, m.id(), 0, ExistingOutput(out_f64_short.id())),
         absl::StatusCode::kInvalidArgument);
  reject("output is the input", Reduce(v1::REDUCE_KIND_SUM, m.id(), std::nullopt, ExistingOutput(m.id())),
         absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------
// 4. Random

// Element i of a fill, computed on its own from the definition in kernels/philox.h: block
// q = offset + i / k of Philox4x32-10 keyed by the seed, lane i % k, and the per-word
// transforms.
template <typename T>
T ReferenceRandom(const RandomParams& p, uint64_t i) {
  constexpr DType kDType = DTypeOf<T>::value;
  const int k = ElementsPerCounter(p.distribution, kDType);
  const PhiloxWords b = PhiloxBlock(p.seed, p.offset + i / static_cast<uint64_t>(k));
  const int lane = static_cast<int>(i % static_cast<uint64_t>(k));
  if constexpr (std::is_same_v<T, float>) {
    if (p.distribution == Distribution::kUniform) return UniformFloat32(b.w[lane]);
    float z[4];
    BoxMullerFloat32(b.w[0], b.w[1], &z[0], &z[1]);
    BoxMullerFloat32(b.w[2], b.w[3], &z[2], &z[3]);
    return static_cast<float>(p.mean) + static_cast<float>(p.stddev) * z[lane];
  } else if constexpr (std::is_same_v<T, double>) {
    if (p.distribution == Distribution::kUniform) return UniformFloat64(b.w[2 * lane], b.w[2 * lane + 1]);
    double z[2];
    BoxMullerFloat64(b, &z[0], &z[1]);
    return p.mean + p.stddev * z[lane];
  } else {
    return static_cast<T>(
        IntegerInRange(b.w[2 * lane], b.w[2 * lane + 1], p.low, IntegerRange(p.low, p.high)));
  }
}

Distribution ToDistribution(v1::Distribution d) {
  switch (d) {
    case v1::DISTRIBUTION_NORMAL:
      return Distribution::kNormal;
    case v1::DISTRIBUTION_INTEGERS:
      return Distribution::kIntegers;
    default:
      return Distribution::kUniform;
  }
}

v1::SubmitRequest RandomRequest(v1::Distribution dist, uint64_t n, v1::DType dtype, const RandomParams& p,
                                bool set_stddev = true) {
  v1::SubmitRequest r = Random(dist, {n}, dtype, p.seed);
  v1::RandomOp* op = r.mutable_random();
  op->set_offset(p.offset);
  op->set_mean(p.mean);
  if (set_stddev) op->set_stddev(p.stddev);
  op->set_low(p.low);
  op->set_high(p.high);
  return r;
}

template <typename T>
void CheckRandomFill(Client& client, v1::Distribution dist, const RandomParams& p, uint64_t n,
                     bool set_stddev = true) {
  constexpr v1::DType dtype = ProtoDType<T>();
  const v1::SubmitRequest request = RandomRequest(dist, n, dtype, p, set_stddev);
  ASSIGN_OR_FAIL(op, RunOp(client, request));
  EXPECT_EQ(op.kind(), v1::OPERATION_KIND_RANDOM);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).dtype(), dtype);
  EXPECT_EQ(op.outputs(0).size_bytes(), n * sizeof(T));
  const uint64_t counters = CountersUsed(ToDistribution(dist), DTypeOf<T>::value, static_cast<int64_t>(n));
  EXPECT_EQ(counters, (n + ElementsPerCounter(ToDistribution(dist), DTypeOf<T>::value) - 1) /
                          ElementsPerCounter(ToDistribution(dist), DTypeOf<T>::value));
  EXPECT_EQ(op.next_offset(), p.offset + counters);
  ASSIGN_OR_FAIL(bytes1, DownloadBytes(client, op.outputs(0).id()));

  // The same request again: the same bytes.
  ASSIGN_OR_FAIL(op2, RunOp(client, request));
  EXPECT_EQ(op2.next_offset(), op.next_offset());
  ASSIGN_OR_FAIL(bytes2, DownloadBytes(client, op2.outputs(0).id()));
  EXPECT_TRUE(bytes1 == bytes2) << "the same random request gave different bytes";

  ASSERT_EQ(bytes1.size(), n * sizeof(T));
  std::vector<T> got(n);
  std::memcpy(got.data(), bytes1.data(), bytes1.size());
  int misses = 0;
  for (uint64_t i = 0; i < n; ++i) {
    const T want = ReferenceRandom<T>(p, i);
    bool ok;
    if constexpr (std::is_floating_point_v<T>) {
      if (dist == v1::DISTRIBUTION_NORMAL) {
        // Box-Muller goes through log/sqrt/cos/sin, whose last bit may differ between
        // builds (see philox.h): a few ulp of the scale.
        const double ulp = std::is_same_v<T, float> ? 0x1.0p-23 : 0x1.0p-52;
        const double scale = std::max(std::fabs(static_cast<double>(want)), p.stddev);
        ok = std::fabs(static_cast<double>(got[i]) - static_cast<double>(want)) <= 8 * ulp * scale;
      } else {
        ok = std::memcmp(&got[i], &want, sizeof(T)) == 0;  // bit-exact
      }
    } else {
      ok = got[i] == want;  // bit-exact
    }
    if (!ok && misses++ < 5) ADD_FAILURE() << "element " << i << ": got " << got[i] << ", want " << want;
    if constexpr (std::is_integral_v<T>) {
      if (!(got[i] >= p.low && static_cast<int64_t>(got[i]) < p.high - 0) && misses++ < 5) {
        ADD_FAILURE() << "element " << i << " = " << got[i] << " outside [" << p.low << ", " << p.high << ")";
      }
    } else if (dist == v1::DISTRIBUTION_UNIFORM) {
      if (!(got[i] >= 0 && got[i] < 1) && misses++ < 5) ADD_FAILURE() << "element " << i << " = " << got[i];
    }
  }
  EXPECT_EQ(misses, 0);
  // A loose statistical sanity check on top of the exact comparison.
  if constexpr (std::is_floating_point_v<T>) {
    double sum = 0, sum2 = 0;
    for (T v : got) {
      sum += v;
      sum2 += static_cast<double>(v) * v;
    }
    const double mean = sum / n, var = sum2 / n - mean * mean;
    if (dist == v1::DISTRIBUTION_UNIFORM) {
      EXPECT_NEAR(mean, 0.5, 0.02);
      EXPECT_NEAR(var, 1.0 / 12, 0.01);
    } else {
      EXPECT_NEAR(mean, p.mean, 0.05 * p.stddev);
      EXPECT_NEAR(std::sqrt(var), p.stddev, 0.05 * p.stddev);
    }
  }
}

TEST_F(ServerOpsTest, RandomMatchesPhiloxDefinition) {
  constexpr uint64_t n = 10007;  // not a multiple of 2 or 4
  RandomParams p;
  p.seed = 0x0123456789abcdefULL;      // both key words non-zero
  p.offset = (uint64_t{1} << 33) + 5;  // the counter's high word non-zero
  {
    SCOPED_TRACE("uniform float32");
    p.distribution = Distribution::kUniform;
    CheckRandomFill<float>(c(), v1::DISTRIBUTION_UNIFORM, p, n);
  }
  {
    SCOPED_TRACE("uniform float64");
    CheckRandomFill<double>(c(), v1::DISTRIBUTION_UNIFORM, p, n);
  }
  {
    SCOPED_TRACE("normal float32");
    p.distribution = Distribution::kNormal;
    p.mean = 3;
    p.stddev = 0.5;
    CheckRandomFill<float>(c(), v1::DISTRIBUTION_NORMAL, p, n);
  }
  {
    SCOPED_TRACE("normal float64");
    CheckRandomFill<double>(c(), v1::DISTRIBUTION_NORMAL, p, n);
  }
  {
    SCOPED_TRACE("normal float64, stddev left unset (1)");
    p.mean = -1;
    p.stddev = 1;
    CheckRandomFill<double>(c(), v1::DISTRIBUTION_NORMAL, p, n, /*set_stddev=*/false);
  }
  p.distribution = Distribution::kIntegers;
  p.mean = 0;
  for (auto [low, high] : std::vector<std::pair<int64_t, int64_t>>{
           {-5, 17},
           {0, 1},
           {std::numeric_limits<int32_t>::min(), int64_t{std::numeric_limits<int32_t>::max()} + 1}}) {
    SCOPED_TRACE(absl::StrCat("int32 integers in [", low, ", ", high, ")"));
    p.low = low;
    p.high = high;
    CheckRandomFill<int32_t>(c(), v1::DISTRIBUTION_INTEGERS, p, n);
  }
  for (auto [low, high] : std::vector<std::pair<int64_t, int64_t>>{
           {-1000, 1000},
           {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()},
           {std::numeric_limits<int64_t>::max() - 3, std::numeric_limits<int64_t>::max()}}) {
    SCOPED_TRACE(absl::StrCat("int64 integers in [", low, ", ", high, ")"));
    p.low = low;
    p.high = high;
    CheckRandomFill<int64_t>(c(), v1::DISTRIBUTION_INTEGERS, p, n);
  }
  // A small range is covered entirely.
  p.low = -5;
  p.high = 17;
  ASSIGN_OR_FAIL(small, RunOp(c(), RandomRequest(v1::DISTRIBUTION_INTEGERS, n, v1::DTYPE_INT32, p)));
  ASSIGN_OR_FAIL(values, DownloadArray<int32_t>(c(), small.outputs(0).id()));
  std::map<int32_t, int> histogram;
  for (int32_t v : values) ++histogram[v];
  EXPECT_EQ(histogram.size(), 22u);
}

TEST_F(ServerOpsTest, RandomContinuesAtNextOffset) {
  RandomParams p;
  p.seed = 77;
  p.offset = 1000;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_INT64}) {
    SCOPED_TRACE(v1::DType_Name(dtype));
    const v1::Distribution dist =
        dtype == v1::DTYPE_FLOAT32 ? v1::DISTRIBUTION_UNIFORM : v1::DISTRIBUTION_INTEGERS;
    p.low = -50;
    p.high = 50;
    const Distribution d = ToDistribution(dist);
    const DType dt = dtype == v1::DTYPE_FLOAT32 ? DType::kFloat32 : DType::kInt64;
    const uint64_t k = static_cast<uint64_t>(ElementsPerCounter(d, dt));
    const size_t itemsize = 4 + 4 * (dtype == v1::DTYPE_INT64);
    for (uint64_t n1 : {uint64_t{4096}, uint64_t{4097}, uint64_t{4099}}) {  // a multiple of k, and not
      SCOPED_TRACE(absl::StrCat("first fill of ", n1));
      constexpr uint64_t n2 = 3001;
      ASSIGN_OR_FAIL(first, RunOp(c(), RandomRequest(dist, n1, dtype, p)));
      const uint64_t used = CountersUsed(d, dt, static_cast<int64_t>(n1));
      ASSERT_EQ(first.next_offset(), p.offset + used);
      RandomParams p2 = p;
      p2.offset = first.next_offset();
      ASSIGN_OR_FAIL(second, RunOp(c(), RandomRequest(dist, n2, dtype, p2)));
      EXPECT_EQ(second.next_offset(), p2.offset + CountersUsed(d, dt, static_cast<int64_t>(n2)));
      // One fill covering both: the first fill is its head, the second its tail from
      // element used * k (the lanes of the first fill's last block that it left unused are
      // skipped, since counters are never reused).
      const uint64_t total = used * k + n2;
      ASSIGN_OR_FAIL(whole, RunOp(c(), RandomRequest(dist, total, dtype, p)));
      EXPECT_EQ(whole.next_offset(), second.next_offset());
      ASSIGN_OR_FAIL(b1, DownloadBytes(c(), first.outputs(0).id()));
      ASSIGN_OR_FAIL(b2, DownloadBytes(c(), second.outputs(0).id()));
      ASSIGN_OR_FAIL(bw, DownloadBytes(c(), whole.outputs(0).id()));
      ASSERT_EQ(bw.size(), total * itemsize);
      EXPECT_TRUE(bw.compare(0, b1.size(), b1) == 0) << "the first fill is not the head of the whole";
      EXPECT_TRUE(bw.compare(used * k * itemsize, b2.size(), b2) == 0)
          << "the continued fill is not the tail of the whole";
    }
  }
  // A fill into an existing buffer takes its shape and dtype and equals a fill of a new one.
  ASSIGN_OR_FAIL(target, UploadArray(c(), std::vector<double>(999, -1.0)));
  v1::SubmitRequest into =
      Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 5, ExistingOutput(target.id()));
  const World before = Snapshot(c());
  ASSIGN_OR_FAIL(op, RunOp(c(), into));
  EXPECT_EQ(op.outputs(0).id(), target.id());
  EXPECT_EQ(op.next_offset(), 500u);
  EXPECT_EQ(Snapshot(c()), before);
  ASSIGN_OR_FAIL(got, DownloadArray<double>(c(), target.id()));
  RandomParams q;
  q.seed = 5;
  ASSERT_EQ(got.size(), 999u);
  for (uint64_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], ReferenceRandom<double>(q, i)) << i;
}

TEST_F(ServerOpsTest, RandomRejectionsChangeNothing) {
  ASSIGN_OR_FAIL(i32, UploadArray(c(), std::vector<int32_t>(64, 9)));
  ASSIGN_OR_FAIL(f64, UploadArray(c(), std::vector<double>(64, 9.0)));
  const std::vector<std::string> watched = {i32.id(), f64.id()};
  RandomParams p;
  p.seed = 1;
  const auto reject = [&](const char* what, const v1::SubmitRequest& r) {
    SCOPED_TRACE(what);
    ExpectRejected(c(), r, absl::StatusCode::kInvalidArgument, "", watched);
  };
  p.low = 5;
  p.high = 5;
  reject("low == high", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT64, p));
  p.high = 4;
  reject("low > high", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = 0;
  p.high = (int64_t{1} << 31) + 1;
  reject("int32 range overflow (high)", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = int64_t{std::numeric_limits<int32_t>::min()} - 1;
  p.high = 0;
  reject("int32 range overflow (low)", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_INT32, p));
  p.low = 0;
  p.high = 10;
  reject("uniform into a new int32", RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_INT32, p));
  reject("uniform into an existing int32",
         Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(i32.id())));
  reject("normal into a new int64", RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_INT64, p));
  reject("uniform into bool", RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_BOOL, p));
  reject("integers into a new float64", RandomRequest(v1::DISTRIBUTION_INTEGERS, 10, v1::DTYPE_FLOAT64, p));
  v1::SubmitRequest into_f64 =
      Random(v1::DISTRIBUTION_INTEGERS, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id()));
  into_f64.mutable_random()->set_low(0);
  into_f64.mutable_random()->set_high(10);
  reject("integers into an existing float64", into_f64);
  p.stddev = -1;
  reject("normal with negative stddev", RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_FLOAT64, p));
  reject("normal with negative stddev into an existing buffer", [&] {
    v1::SubmitRequest r =
        Random(v1::DISTRIBUTION_NORMAL, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id()));
    r.mutable_random()->set_stddev(-0.5);
    return r;
  }());
  p.stddev = 1;
  p.mean = std::nan("");
  reject("normal with NaN mean", RandomRequest(v1::DISTRIBUTION_NORMAL, 10, v1::DTYPE_FLOAT32, p));
  p.mean = 0;
  reject("no distribution", RandomRequest(v1::DISTRIBUTION_UNSPECIFIED, 10, v1::DTYPE_FLOAT32, p));
  reject("a new buffer without dtype", RandomRequest(v1::DISTRIBUTION_UNIFORM, 10, v1::DTYPE_UNSPECIFIED, p));
  reject("shape differing from the existing output",
         Random(v1::DISTRIBUTION_UNIFORM, {65}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput(f64.id())));
  p.offset = std::numeric_limits<uint64_t>::max() - 2;
  reject("counter overflow", RandomRequest(v1::DISTRIBUTION_UNIFORM, 100, v1::DTYPE_FLOAT64, p));
  {
    SCOPED_TRACE("unknown output");
    ExpectRejected(c(),
                   Random(v1::DISTRIBUTION_UNIFORM, {}, v1::DTYPE_UNSPECIFIED, 1, ExistingOutput("nope")),
                   absl::StatusCode::kNotFound, "", watched);
  }
}

// ---------------------------------------------------------------------------
// 5. Operations

// 1<<22 float64 elements (32 MiB): x + 1 on them takes milliseconds on the CPU backend, so
// a chain of 30 keeps a stream busy for well over 10 ms.
constexpr size_t kBig = size_t{1} << 22;
constexpr int kChain = 30;

std::vector<double> Iota(size_t n, double scale = 1) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i % 65536) * scale;
  return v;
}

// x = x + 1, in place, without waiting.
// x + 1 in an expression slow enough that a chain of them outlasts the RPCs that queue it.
// On a GPU, where a plain x + 1 over kBig elements takes microseconds, that means ~100
// nested sines per element: 0 * sin(...) is exactly 0 for finite x, so the result is still
// x + 1.
std::string IncrementExpression() {
  if (TestBackendName() == "cpu") return "x + 1";
  std::string sines = "x";
  for (int i = 0; i < 100; ++i) sines = absl::StrCat("sin(", sines, ")");
  return absl::StrCat("x + 1 + 0 * ", sines);
}

v1::SubmitRequest Increment(const std::string& buffer, std::string_view stream = {}) {
  static const std::string kExpression = IncrementExpression();
  return OnStream(Elementwise(kExpression, {{"x", BufferOperand(buffer)}}, ExistingOutput(buffer)), stream);
}

// Queues `count` increments of `buffer` and returns the ids.
std::vector<std::string> QueueChain(Client& client, const std::string& buffer, int count,
                                    std::string_view stream = {}) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<v1::Operation> op = client.Submit(Increment(buffer, stream));
    EXPECT_TRUE(op.ok()) << op.status();
    if (op.ok()) ids.push_back(op->id());
  }
  return ids;
}

// Expects every element of `buffer` to be base[i] + delta.
void ExpectShifted(Client& client, const std::string& buffer, const std::vector<double>& base, double delta,
                   std::string_view what) {
  ASSIGN_OR_FAIL(got, DownloadArray<double>(client, buffer));
  ASSERT_EQ(got.size(), base.size()) << what;
  for (size_t i = 0; i < base.size(); ++i) {
    ASSERT_EQ(got[i], base[i] + delta) << what << " [" << i << "]";
  }
}

TEST_F(ServerOpsTest, OperationLifecycleTimingAndErrors) {
  if (TestBackendName() != "cpu") {
    GTEST_SKIP() << "needs a chain that outlasts the RPCs queueing it; a GPU finishes each link in "
                    "well under an RPC's time (the executor logic is the same on every backend)";
  }
  const std::vector<double> x = Iota(kBig, 0.5);
  const std::vector<double> y = Iota(kBig, 0.25);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x));
  ASSIGN_OR_FAIL(by, UploadArray(c(), y));
  ASSIGN_OR_FAIL(bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));

  // A long chain on the default stream, then x + y behind it, without waiting.
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), 2 * kChain);
  ASSERT_EQ(chain.size(), static_cast<size_t>(2 * kChain));
  for (const std::string& id : chain) EXPECT_TRUE(std::regex_match(id, kOpIdPattern)) << id;
  v1::SubmitRequest sum =
      Elementwise("x + y", {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}});
  const auto submit_start = std::chrono::steady_clock::now();
  ASSIGN_OR_FAIL(queued, c().Submit(sum));
  const double submit_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - submit_start).count();
  EXPECT_TRUE(std::regex_match(queued.id(), kOpIdPattern)) << queued.id();
  EXPECT_FALSE(queued.done()) << "returned the result of an operation queued behind " << 2 * kChain
                              << " others";
  // (QUEUED precisely: see OperationBehindAChainIsReportedQueued.)
  EXPECT_TRUE(queued.state() == v1::Operation::STATE_QUEUED || queued.state() == v1::Operation::STATE_RUNNING)
      << v1::Operation::State_Name(queued.state());
  EXPECT_EQ(queued.kind(), v1::OPERATION_KIND_ELEMENTWISE);
  EXPECT_TRUE(std::regex_match(queued.stream_id(), kStreamIdPattern)) << queued.stream_id();
  EXPECT_LT(submit_seconds, 1.0);
  ASSERT_EQ(queued.outputs_size(), 1);  // the new output is known at once
  const std::string out_id = queued.outputs(0).id();

  // A short wait returns the operation not done.
  const auto wait_start = std::chrono::steady_clock::now();
  ASSIGN_OR_FAIL(waited, c().WaitOperation(queued.id(), 0.01));
  const double wait_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wait_start).count();
  EXPECT_FALSE(waited.done());
  EXPECT_TRUE(waited.state() == v1::Operation::STATE_QUEUED || waited.state() == v1::Operation::STATE_RUNNING)
      << v1::Operation::State_Name(waited.state());
  EXPECT_EQ(waited.id(), queued.id());
  EXPECT_GE(wait_seconds, 0.009);
  EXPECT_LT(wait_seconds, 5.0);
  // Submit with wait and a short wait_timeout_seconds behaves alike.
  v1::SubmitRequest short_wait = Increment(bz.id());
  short_wait.set_wait(true);
  short_wait.set_wait_timeout_seconds(0.01);
  ASSIGN_OR_FAIL(short_op, c().Submit(short_wait));
  EXPECT_FALSE(short_op.done());

  ASSIGN_OR_FAIL(done, c().WaitOperation(queued.id()));
  ASSERT_TRUE(done.done());
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(done.error_code(), 0);
  EXPECT_EQ(done.stream_id(), queued.stream_id());
  const v1::Timing& t = done.timing();
  EXPECT_GT(t.device_seconds(), 0);
  EXPECT_GT(t.queued_seconds(), 0);  // it waited behind the chain
  EXPECT_EQ(t.bytes_read(), 2 * kBig * 8);
  EXPECT_EQ(t.bytes_written(), kBig * 8);
  EXPECT_EQ(t.flops(), kBig);  // one addition per element
  EXPECT_EQ(t.stream_id(), queued.stream_id());
  EXPECT_EQ(t.device(), 0);
  ASSERT_GT(t.device_seconds(), 0);
  const double gbps = static_cast<double>(t.bytes_read() + t.bytes_written()) / t.device_seconds() / 1e9;
  EXPECT_NEAR(t.gbps(), gbps, 1e-9 * gbps);
  EXPECT_NEAR(t.gflops(), static_cast<double>(kBig) / t.device_seconds() / 1e9, 1e-9 * t.gflops());
  ASSERT_EQ(done.outputs_size(), 1);
  EXPECT_EQ(done.outputs(0).id(), out_id);

  // GetOperation reports the same finished operation.
  ASSIGN_OR_FAIL(got, c().GetOperation(queued.id()));
  EXPECT_TRUE(got.done());
  EXPECT_EQ(got.state(), v1::Operation::STATE_SUCCEEDED);
  EXPECT_EQ(got.timing().device_seconds(), t.device_seconds());
  EXPECT_EQ(got.timing().bytes_read(), t.bytes_read());
  // The chain ran before it, in order.
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(link, c().GetOperation(id));
    EXPECT_TRUE(link.done()) << id;
    EXPECT_EQ(link.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ASSIGN_OR_FAIL(out, DownloadArray<double>(c(), out_id));
  ASSERT_EQ(out.size(), kBig);
  for (size_t i = 0; i < kBig; ++i) ASSERT_EQ(out[i], x[i] + y[i]) << i;
  ASSERT_TRUE(c().SynchronizeStream("").ok());
  ExpectShifted(c(), bz.id(), std::vector<double>(kBig, 0.0), 2 * kChain + 1, "chain");

  // Unknown ids and bad timeouts.
  for (const char* id : {"op-00000000000000000000000000000000", "op-nope", "buf-0", ""}) {
    SCOPED_TRACE(id);
    EXPECT_EQ(c().GetOperation(id).status().code(), absl::StatusCode::kNotFound);
    EXPECT_EQ(c().WaitOperation(id, 0.01).status().code(), absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(c().WaitOperation(queued.id(), -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation(queued.id(), std::nan("")).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().WaitOperation("op-00000000000000000000000000000000", -1).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::SubmitRequest negative = Waiting(sum);
  negative.set_wait_timeout_seconds(-0.5);
  {
    SCOPED_TRACE("Submit with a negative wait timeout");
    ExpectRejected(c(), negative, absl::StatusCode::kInvalidArgument);
  }
  {
    SCOPED_TRACE("Submit naming no operation");
    ExpectRejected(c(), v1::SubmitRequest(), absl::StatusCode::kInvalidArgument);
  }
}

// Operation.State says QUEUED is "waiting behind earlier work" and RUNNING follows it. An
// operation submitted behind a long chain on its stream has not started while the chain runs.
TEST_F(ServerOpsTest, OperationBehindAChainIsReportedQueued) {
  if (TestBackendName() != "cpu") {
    GTEST_SKIP() << "needs a chain that outlasts the RPCs queueing it; a GPU finishes each link in "
                    "well under an RPC's time (the executor logic is the same on every backend)";
  }
  ASSIGN_OR_FAIL(bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(bx, UploadArray(c(), std::vector<double>(kBig, 1.0)));
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), kChain);
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  ASSIGN_OR_FAIL(last, c().Submit(OnStream(Elementwise("x * 2", {{"x", BufferOperand(bx.id())}}), "")));
  EXPECT_EQ(last.state(), v1::Operation::STATE_QUEUED)
      << "reported while " << kChain << " earlier operations wait";
  ASSIGN_OR_FAIL(polled, c().GetOperation(last.id()));
  ASSIGN_OR_FAIL(last_link, c().GetOperation(chain.back()));
  if (!last_link.done()) {
    EXPECT_EQ(polled.state(), v1::Operation::STATE_QUEUED)
        << "still behind unfinished operation " << chain.back();
  }
  ASSIGN_OR_FAIL(done, c().WaitOperation(last.id()));
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
}

TEST_F(ServerOpsTest, SubmitAsyncChainResolvesInOrder) {
  constexpr size_t n = size_t{1} << 18;
  const std::vector<double> x0 = Iota(n);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  constexpr int kOps = 20;
  std::vector<OperationFuture> futures;
  for (int k = 0; k < kOps; ++k) futures.push_back(c().SubmitAsync(Increment(bx.id())));
  std::vector<std::string> ids;
  for (int k = 0; k < kOps; ++k) {
    SCOPED_TRACE(k);
    ASSERT_TRUE(futures[k].valid());
    ASSERT_TRUE(futures[k].Wait(absl::Seconds(60)));
    const absl::StatusOr<v1::Operation>& op = futures[k].Get();
    ASSERT_TRUE(op.ok()) << op.status();
    EXPECT_TRUE(op->done());
    EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
    EXPECT_TRUE(std::regex_match(op->id(), kOpIdPattern)) << op->id();
    ASSERT_EQ(op->outputs_size(), 1);
    EXPECT_EQ(op->outputs(0).id(), bx.id());
    ids.push_back(op->id());
    // Once op k is done, every earlier one is done on the server.
    for (int j = 0; j < k; ++j) {
      ASSIGN_OR_FAIL(earlier, c().GetOperation(ids[j]));
      EXPECT_TRUE(earlier.done()) << "op " << j << " not done when op " << k << " is";
    }
  }
  EXPECT_EQ(std::set<std::string>(ids.begin(), ids.end()).size(), static_cast<size_t>(kOps));
  ExpectShifted(c(), bx.id(), x0, kOps, "after 20 increments");
}

// Operations on one stream run in the order the server receives them. SubmitAsync calls made
// one after another from one thread must therefore reach the server in that order, or a chain
// of dependent operations built with SubmitAsync computes something else. The chain here does
// not commute: x = 3*x + k (int64, wrapping) for k = 1..200 from x = 1.
TEST_F(ServerOpsTest, SubmitAsyncPreservesSubmissionOrder) {
  constexpr size_t n = 1024;
  constexpr int kOps = 200;
  ASSIGN_OR_FAIL(bo, UploadArray(c(), std::vector<int64_t>(n, 1)));
  std::vector<OperationFuture> futures;
  for (int k = 1; k <= kOps; ++k) {
    futures.push_back(c().SubmitAsync(Elementwise(
        "3*x + k", {{"x", BufferOperand(bo.id())}, {"k", ScalarOperand(k)}}, ExistingOutput(bo.id()))));
  }
  for (const OperationFuture& f : futures) {
    const absl::StatusOr<v1::Operation>& op = f.Get();
    ASSERT_TRUE(op.ok()) << op.status();
    EXPECT_EQ(op->state(), v1::Operation::STATE_SUCCEEDED);
  }
  uint64_t want = 1;
  for (int k = 1; k <= kOps; ++k) want = 3 * want + static_cast<uint64_t>(k);
  // The control: the same chain submitted one call at a time with wait gives `want`.
  ASSIGN_OR_FAIL(control, UploadArray(c(), std::vector<int64_t>(n, 1)));
  for (int k = 1; k <= kOps; ++k) {
    ASSIGN_OR_FAIL(
        op, RunOp(c(), Elementwise("3*x + k", {{"x", BufferOperand(control.id())}, {"k", ScalarOperand(k)}},
                                   ExistingOutput(control.id()))));
  }
  ASSIGN_OR_FAIL(control_values, DownloadArray<int64_t>(c(), control.id()));
  ASSERT_EQ(control_values.size(), n);
  ASSERT_EQ(static_cast<uint64_t>(control_values[0]), want);
  ASSIGN_OR_FAIL(got, DownloadArray<int64_t>(c(), bo.id()));
  ASSERT_EQ(got.size(), n);
  EXPECT_EQ(static_cast<uint64_t>(got[0]), want)
      << "SubmitAsync calls made in order from one thread ran on the stream in another order";
  for (size_t i = 1; i < n; ++i) ASSERT_EQ(got[i], got[0]) << i;
}

// ---------------------------------------------------------------------------
// 6. Streams and ordering

TEST_F(ServerOpsTest, StreamsCreateListSynchronizeDelete) {
  ASSIGN_OR_FAIL(a, c().CreateStream());
  ASSIGN_OR_FAIL(b, c().CreateStream());
  EXPECT_TRUE(std::regex_match(a.id(), kStreamIdPattern)) << a.id();
  EXPECT_TRUE(std::regex_match(b.id(), kStreamIdPattern)) << b.id();
  EXPECT_NE(a.id(), b.id());
  EXPECT_FALSE(a.is_default());
  EXPECT_EQ(a.device(), 0);
  EXPECT_EQ(a.pending_operations(), 0u);

  ASSIGN_OR_FAIL(list, c().ListStreams());
  ASSERT_EQ(list.streams_size(), 3);
  std::string default_id;
  std::set<std::string> listed;
  for (const v1::StreamInfo& s : list.streams()) {
    listed.insert(s.id());
    if (s.is_default()) {
      EXPECT_TRUE(default_id.empty()) << "two default streams";
      default_id = s.id();
    }
  }
  EXPECT_TRUE(listed.contains(a.id()));
  EXPECT_TRUE(listed.contains(b.id()));
  ASSERT_FALSE(default_id.empty());
  EXPECT_TRUE(std::regex_match(default_id, kStreamIdPattern));
  // Another client sees only its own streams.
  std::unique_ptr<Client> other = server_->Connect("someone-else");
  ASSERT_NE(other, nullptr);
  ASSIGN_OR_FAIL(other_list, other->ListStreams());
  ASSERT_EQ(other_list.streams_size(), 1);
  EXPECT_NE(other_list.streams(0).id(), default_id);

  // A chain on A: pending, not idle within 1 ms, idle at the end.
  const std::vector<double> x0 = Iota(kBig);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  const std::vector<std::string> chain = QueueChain(c(), bx.id(), kChain, a.id());
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  ASSIGN_OR_FAIL(busy, c().ListStreams());
  for (const v1::StreamInfo& s : busy.streams()) {
    if (s.id() == a.id()) {
      EXPECT_GT(s.pending_operations(), 0u);
    } else {
      EXPECT_EQ(s.pending_operations(), 0u) << s.id();
    }
  }
  ASSIGN_OR_FAIL(idle_soon, c().SynchronizeStream(a.id(), 0.001));
  EXPECT_FALSE(idle_soon);
  ASSIGN_OR_FAIL(idle_b, c().SynchronizeStream(b.id(), 0.001));
  EXPECT_TRUE(idle_b);  // nothing on B
  ASSIGN_OR_FAIL(idle, c().SynchronizeStream(a.id()));
  EXPECT_TRUE(idle);
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(op, c().GetOperation(id));
    EXPECT_TRUE(op.done());
    EXPECT_EQ(op.stream_id(), a.id());
  }
  ASSIGN_OR_FAIL(after, c().ListStreams());
  for (const v1::StreamInfo& s : after.streams()) EXPECT_EQ(s.pending_operations(), 0u) << s.id();
  ExpectShifted(c(), bx.id(), x0, kChain, "after the chain on A");
  EXPECT_EQ(c().SynchronizeStream(a.id(), -1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(c().SynchronizeStream("str-00000000000000000000000000000000").status().code(),
            absl::StatusCode::kNotFound);

  // Deleting.
  EXPECT_EQ(c().DeleteStream(default_id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(c().DeleteStream("str-00000000000000000000000000000000").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().DeleteStream("").code(), absl::StatusCode::kNotFound);
  ASSIGN_OR_FAIL(still3, c().ListStreams());
  EXPECT_EQ(still3.streams_size(), 3);
  // Delete B while work is queued on it: the work finishes.
  const std::vector<std::string> on_b = QueueChain(c(), bx.id(), 3, b.id());
  ASSERT_OK(c().DeleteStream(b.id()));
  for (const std::string& id : on_b) {
    ASSIGN_OR_FAIL(op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED);
  }
  ExpectShifted(c(), bx.id(), x0, kChain + 3, "after the work on B");
  ASSIGN_OR_FAIL(two, c().ListStreams());
  ASSERT_EQ(two.streams_size(), 2);
  for (const v1::StreamInfo& s : two.streams()) EXPECT_NE(s.id(), b.id());
  {
    SCOPED_TRACE("Submit on a deleted stream");
    v1::SubmitRequest r = Elementwise("x * 2", {{"x", BufferOperand(bx.id())}}, NewOutput("never"));
    r.set_stream_id(b.id());
    ExpectRejected(c(), r, absl::StatusCode::kNotFound, "", {bx.id()});
    r.set_wait(true);
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
    r.set_stream_id("str-00000000000000000000000000000000");
    ExpectRejected(c(), r, absl::StatusCode::kNotFound);
  }
  EXPECT_EQ(c().SynchronizeStream(b.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().DeleteStream(b.id()).code(), absl::StatusCode::kNotFound);
  ASSERT_OK(c().DeleteStream(a.id()));
  ASSIGN_OR_FAIL(one, c().ListStreams());
  ASSERT_EQ(one.streams_size(), 1);
  EXPECT_EQ(one.streams(0).id(), default_id);
}

TEST_F(ServerOpsTest, StreamsReadAfterWriteAcrossStreams) {
  ASSIGN_OR_FAIL(a, c().CreateStream());
  ASSIGN_OR_FAIL(b, c().CreateStream());
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  const std::vector<std::string> chain = QueueChain(c(), bx.id(), kChain, a.id());
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  // y = x * 1 on B, submitted after the chain: it must see all 30 increments.
  ASSIGN_OR_FAIL(read, RunOp(c(), Elementwise("x * 1", {{"x", BufferOperand(bx.id())}}), b.id()));
  EXPECT_EQ(read.stream_id(), b.id());
  EXPECT_GT(read.timing().queued_seconds(), 0);
  // (Whether the writers on A already report done when the reader on B does is not
  // specified: the reader waits for their device work, not for their bookkeeping.)
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ExpectShifted(c(), read.outputs(0).id(), x0, kChain, "y read on B");
  ASSIGN_OR_FAIL(idle, c().SynchronizeStream(a.id()));
  EXPECT_TRUE(idle);
}

TEST_F(ServerOpsTest, StreamsWriteAfterReadAcrossStreams) {
  ASSIGN_OR_FAIL(a, c().CreateStream());
  ASSIGN_OR_FAIL(b, c().CreateStream());
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  // On A: a long chain on z, then the reader y = x * 1, which therefore starts late.
  QueueChain(c(), bz.id(), kChain, a.id());
  ASSIGN_OR_FAIL(reader, c().Submit(OnStream(Elementwise("x * 1", {{"x", BufferOperand(bx.id())}}), a.id())));
  EXPECT_FALSE(reader.done());
  // On B, submitted later: x = x + 100. It must wait for the reader.
  ASSIGN_OR_FAIL(
      writer,
      RunOp(c(), Elementwise("x + 100", {{"x", BufferOperand(bx.id())}}, ExistingOutput(bx.id())), b.id()));
  EXPECT_EQ(writer.stream_id(), b.id());
  ASSIGN_OR_FAIL(reader_done, c().WaitOperation(reader.id()));
  EXPECT_EQ(reader_done.state(), v1::Operation::STATE_SUCCEEDED);
  ExpectShifted(c(), reader.outputs(0).id(), x0, 0, "what the reader saw");
  ExpectShifted(c(), bx.id(), x0, 100, "x after the writer");
}

TEST_F(ServerOpsTest, StreamsWriteAfterWriteAcrossStreams) {
  ASSIGN_OR_FAIL(a, c().CreateStream());
  ASSIGN_OR_FAIL(b, c().CreateStream());
  const std::vector<double> w = Iota(kBig, 3.0);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), std::vector<double>(kBig, -1.0)));
  ASSIGN_OR_FAIL(bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(bw, UploadArray(c(), w));
  // On A: a long chain on z, then x = z * 1 (x becomes 30 everywhere, late).
  QueueChain(c(), bz.id(), kChain, a.id());
  ASSIGN_OR_FAIL(
      first, c().Submit(OnStream(
                 Elementwise("z * 1", {{"z", BufferOperand(bz.id())}}, ExistingOutput(bx.id())), a.id())));
  // On B, later: x = w * 1, which does not read x. The later write must win.
  ASSIGN_OR_FAIL(
      second,
      RunOp(c(), Elementwise("w * 1", {{"w", BufferOperand(bw.id())}}, ExistingOutput(bx.id())), b.id()));
  EXPECT_EQ(second.stream_id(), b.id());
  ASSIGN_OR_FAIL(first_done, c().WaitOperation(first.id()));
  EXPECT_EQ(first_done.state(), v1::Operation::STATE_SUCCEEDED);
  ASSERT_TRUE(c().SynchronizeStream(a.id()).ok());
  ASSERT_TRUE(c().SynchronizeStream(b.id()).ok());
  ExpectShifted(c(), bx.id(), w, 0, "x after both writes");
  ExpectShifted(c(), bz.id(), std::vector<double>(kBig, 0.0), kChain, "z");
}

TEST_F(ServerOpsTest, DownloadWaitsForPendingWriters) {
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(s, c().CreateStream());
  const std::vector<std::string> chain = QueueChain(c(), bx.id(), kChain, s.id());
  ASSERT_EQ(chain.size(), static_cast<size_t>(kChain));
  // Right away, without waiting: the download sees every increment.
  ExpectShifted(c(), bx.id(), x0, kChain, "download right after the chain");
  // Likewise on the default stream, and a ranged download of the end.
  QueueChain(c(), bx.id(), 5);
  v1::DownloadRequest tail;
  tail.set_buffer(bx.id());
  tail.set_offset_bytes((kBig - 10) * 8);
  std::string bytes;
  ASSIGN_OR_FAIL(response, c().Download(tail, &bytes));
  ASSERT_EQ(bytes.size(), 80u);
  for (size_t i = 0; i < 10; ++i) {
    double v;
    std::memcpy(&v, bytes.data() + 8 * i, 8);
    EXPECT_EQ(v, x0[kBig - 10 + i] + kChain + 5) << i;
  }
}

TEST_F(ServerOpsTest, DeleteBufferWhileQueuedOpsUseIt) {
  const std::vector<double> x0 = Iota(kBig, 0.5);
  ASSIGN_OR_FAIL(bx, UploadArray(c(), x0));
  ASSIGN_OR_FAIL(bz, UploadArray(c(), std::vector<double>(kBig, 0.0)));
  ASSIGN_OR_FAIL(s, c().CreateStream());
  ASSIGN_OR_FAIL(info0, c().GetServerInfo());
  // A chain on z, then y = 2 * x behind it, then delete x and z right away.
  const std::vector<std::string> chain = QueueChain(c(), bz.id(), kChain, s.id());
  ASSIGN_OR_FAIL(reader,
                 c().Submit(OnStream(
                     Elementwise("2 * x + z", {{"x", BufferOperand(bx.id())}, {"z", BufferOperand(bz.id())}},
                                 NewOutput("y")),
                     s.id())));
  EXPECT_FALSE(reader.done());
  ASSERT_OK(c().DeleteBuffer(bx.id()));
  ASSERT_OK(c().DeleteBuffer(bz.id()));
  // The ids and names stop resolving at once.
  EXPECT_EQ(c().GetBuffer(bx.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().GetBuffer(bz.id()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(c().DeleteBuffer(bx.id()).code(), absl::StatusCode::kNotFound);
  {
    SCOPED_TRACE("using a deleted buffer");
    ExpectRejected(c(), Elementwise("x + 1", {{"x", BufferOperand(bx.id())}}), absl::StatusCode::kNotFound);
  }
  // The queued work still succeeds and computes from the deleted buffers.
  for (const std::string& id : chain) {
    ASSIGN_OR_FAIL(op, c().WaitOperation(id));
    EXPECT_EQ(op.state(), v1::Operation::STATE_SUCCEEDED) << id;
  }
  ASSIGN_OR_FAIL(done, c().WaitOperation(reader.id()));
  EXPECT_EQ(done.state(), v1::Operation::STATE_SUCCEEDED);
  ASSIGN_OR_FAIL(y, DownloadArray<double>(c(), "y"));
  ASSERT_EQ(y.size(), kBig);
  for (size_t i = 0; i < kBig; ++i) ASSERT_EQ(y[i], 2 * x0[i] + kChain) << i;
  // The memory of x and z is released once that work is done: only y remains of the three.
  ASSIGN_OR_FAIL(info1, c().GetServerInfo());
  EXPECT_EQ(info1.memory_used_bytes(), info0.memory_used_bytes() - kBig * 8);
  EXPECT_EQ(info1.buffer_count(), info0.buffer_count() - 1);
  ASSIGN_OR_FAIL(list, c().ListBuffers());
  ASSERT_EQ(list.buffers_size(), 1);
  EXPECT_EQ(list.buffers(0).name(), "y");
}

// ---------------------------------------------------------------------------
// 7. Stats

TEST_F(ServerOpsTest, StatsCountOperationsPerKind) {
  constexpr size_t n = 10000, rows = 100, cols = 50;
  uint64_t upload_bytes = 0, download_bytes = 0;
  uint64_t ew_read = 0, ew_written = 0, ew_flops = 0, reduce_read = 0;
  // 3 uploads creating buffers.
  ASSIGN_OR_FAIL(bx, UploadArray(c(), RandomDoubles(n, 0, 1, 70)));
  ASSIGN_OR_FAIL(by, UploadArray(c(), RandomDoubles(n, 0, 1, 71)));
  ASSIGN_OR_FAIL(ba, UploadArray(c(), RandomDoubles(rows * cols, 0, 1, 72), {rows, cols}));
  upload_bytes += 2 * n * 8 + rows * cols * 8;
  // 1 upload into an existing buffer: an UPLOAD and a COPY.
  {
    v1::UploadHeader header;
    header.set_buffer(by.id());
    header.set_offset_bytes(80);
    std::vector<double> part(16, 4.0);
    ASSIGN_OR_FAIL(r, c().Upload(header, std::as_bytes(std::span<const double>(part))));
    upload_bytes += 16 * 8;
  }
  // 2 filled buffers.
  for (int i = 0; i < 2; ++i) {
    v1::CreateBufferRequest r;
    r.set_dtype(v1::DTYPE_FLOAT64);
    r.add_shape(cols);
    r.mutable_fill()->set_float_value(1.5);
    ASSIGN_OR_FAIL(b, c().CreateBuffer(r));
  }
  // 4 elementwise.
  for (const char* text : {"x + y", "x * y", "sin(x) + y", "x < y"}) {
    ASSIGN_OR_FAIL(
        op, RunOp(c(), Elementwise(text, {{"x", BufferOperand(bx.id())}, {"y", BufferOperand(by.id())}})));
    ew_read += op.timing().bytes_read();
    ew_written += op.timing().bytes_written();
    ew_flops += op.timing().flops();
  }
  // 2 gemv.
  ASSIGN_OR_FAIL(vx, UploadArray(c(), RandomDoubles(cols, 0, 1, 73)));
  upload_bytes += cols * 8;
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_FAIL(op, RunOp(c(), Gemv(ba.id(), vx.id())));
  }
  // 3 reduce.
  for (v1::ReduceKind kind : {v1::REDUCE_KIND_SUM, v1::REDUCE_KIND_MAX, v1::REDUCE_KIND_ARGMIN}) {
    ASSIGN_OR_FAIL(op, RunOp(c(), Reduce(kind, bx.id())));
    reduce_read += op.timing().bytes_read();
  }
  // 5 random.
  for (int i = 0; i < 5; ++i) {
    ASSIGN_OR_FAIL(op, RunOp(c(), Random(v1::DISTRIBUTION_UNIFORM, {100}, v1::DTYPE_FLOAT32, i)));
  }
  // Rejected requests count nowhere.
  EXPECT_FALSE(c().Submit(Elementwise("x +", {{"x", BufferOperand(bx.id())}})).ok());
  EXPECT_FALSE(c().Submit(Gemv(bx.id(), vx.id())).ok());
  EXPECT_FALSE(c().Submit(Reduce(v1::REDUCE_KIND_MIN, bx.id(), 0)).ok());
  // 2 downloads.
  ASSIGN_OR_FAIL(d1, DownloadBytes(c(), bx.id()));
  ASSIGN_OR_FAIL(d2, DownloadBytes(c(), ba.id()));
  download_bytes += d1.size() + d2.size();
  ASSERT_TRUE(c().SynchronizeStream("").ok());

  ASSIGN_OR_FAIL(stats, c().GetStats());
  std::map<v1::OperationKind, v1::KindStats> by_kind;
  for (const v1::KindStats& k : stats.kinds()) {
    EXPECT_FALSE(by_kind.contains(k.kind())) << "kind listed twice: " << v1::OperationKind_Name(k.kind());
    by_kind[k.kind()] = k;
  }
  const std::map<v1::OperationKind, uint64_t> want = {
      {v1::OPERATION_KIND_UPLOAD, 5},      {v1::OPERATION_KIND_COPY, 1},    {v1::OPERATION_KIND_FILL, 2},
      {v1::OPERATION_KIND_ELEMENTWISE, 4}, {v1::OPERATION_KIND_GEMV, 2},    {v1::OPERATION_KIND_REDUCE, 3},
      {v1::OPERATION_KIND_RANDOM, 5},      {v1::OPERATION_KIND_DOWNLOAD, 2}};
  for (const auto& [kind, count] : want) {
    SCOPED_TRACE(v1::OperationKind_Name(kind));
    ASSERT_TRUE(by_kind.contains(kind));
    EXPECT_EQ(by_kind[kind].count(), count);
    EXPECT_EQ(by_kind[kind].failed(), 0u);
  }
  EXPECT_EQ(by_kind.size(), want.size());
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_ELEMENTWISE].bytes_read(), ew_read);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_ELEMENTWISE].bytes_written(), ew_written);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_ELEMENTWISE].flops(), ew_flops);
  EXPECT_EQ(ew_read, 4 * 2 * n * 8);
  EXPECT_EQ(ew_written, 3 * n * 8 + n);  // the comparison writes bools
  EXPECT_GT(by_kind[v1::OPERATION_KIND_ELEMENTWISE].device_seconds(), 0);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_GEMV].flops(), 2 * 2 * rows * cols);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_GEMV].bytes_written(), 2 * rows * 8);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_REDUCE].bytes_read(), reduce_read);
  EXPECT_EQ(reduce_read, 3 * n * 8);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_RANDOM].bytes_written(), 5 * 100 * 4u);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_FILL].bytes_written(), 2 * cols * 8);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_UPLOAD].bytes_written(), upload_bytes);
  EXPECT_EQ(by_kind[v1::OPERATION_KIND_DOWNLOAD].bytes_read(), download_bytes);
  ASSIGN_OR_FAIL(list, c().ListBuffers());
  EXPECT_EQ(stats.memory_used_bytes(), list.total_bytes());
  EXPECT_GE(stats.memory_peak_bytes(), stats.memory_used_bytes());
  EXPECT_GT(stats.uptime_seconds(), 0);
}

// ---------------------------------------------------------------------------
// 7. The backend's optional services, through a CPU backend that records and injects

// The CPU backend, with PrepareElementwise that fails on demand or reports a compile
// time, and PushRange/PopRange recorded.
class InstrumentedBackend final : public Backend {
 public:
  InstrumentedBackend() : cpu_(2) {}

  // While set, PrepareElementwise fails with it.
  void FailPrepare(absl::Status status) {
    std::lock_guard lock(mu_);
    prepare_error_ = std::move(status);
  }
  static constexpr double kCompileSeconds = 0.25;
  std::vector<std::string> ranges() const {
    std::lock_guard lock(mu_);
    return ranges_;
  }
  int open_ranges() const { return pushes_.load() - pops_.load(); }
  std::optional<DType> last_prepared_dtype() const {
    std::lock_guard lock(mu_);
    return last_prepared_dtype_;
  }

  absl::StatusOr<double> PrepareElementwise(const expr::Program& program, DType out_dtype) override {
    std::lock_guard lock(mu_);
    last_prepared_dtype_ = out_dtype;
    if (!prepare_error_.ok()) return prepare_error_;
    return kCompileSeconds;
  }
  PoolUsage MemoryPoolUsage(int device) const override { return cpu_.MemoryPoolUsage(device); }
  void PushRange(const std::string& name) override {
    ++pushes_;
    std::lock_guard lock(mu_);
    ranges_.push_back(name);
  }
  void PopRange() override { ++pops_; }

  absl::string_view name() const override { return cpu_.name(); }
  const std::vector<DeviceDescription>& devices() const override { return cpu_.devices(); }
  absl::StatusOr<DeviceMemory> Allocate(int device, uint64_t bytes) override { return cpu_.Allocate(device, bytes); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(int device) override { return cpu_.CreateStream(device); }
  absl::StatusOr<double> ElapsedSeconds(const Event& start, const Event& end) override {
    return cpu_.ElapsedSeconds(start, end);
  }
  absl::Status CopyFromHost(Stream& stream, const void* src, DeviceMemory& dst, uint64_t dst_offset,
                            uint64_t bytes) override {
    return cpu_.CopyFromHost(stream, src, dst, dst_offset, bytes);
  }
  absl::Status CopyToHost(Stream& stream, const DeviceMemory& src, uint64_t src_offset, void* dst,
                          uint64_t bytes) override {
    return cpu_.CopyToHost(stream, src, src_offset, dst, bytes);
  }
  absl::Status Copy(Stream& stream, const DeviceMemory& src, uint64_t src_offset, DeviceMemory& dst,
                    uint64_t dst_offset, uint64_t bytes) override {
    return cpu_.Copy(stream, src, src_offset, dst, dst_offset, bytes);
  }
  absl::Status Fill(Stream& stream, DeviceMemory& dst, DType dtype, uint64_t value_bits, int64_t count) override {
    return cpu_.Fill(stream, dst, dtype, value_bits, count);
  }
  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs, DeviceMemory& out,
                                         DType out_dtype, int64_t n) override {
    return cpu_.Elementwise(stream, program, inputs, out, out_dtype, n);
  }
  absl::Status Reduce(Stream& stream, ReduceKind kind, DType in_dtype, const DeviceMemory& in,
                      const ReduceShape& shape, DeviceMemory& out) override {
    return cpu_.Reduce(stream, kind, in_dtype, in, shape, out);
  }
  absl::Status Gemv(Stream& stream, DType dtype, const GemvShape& shape, double alpha, const DeviceMemory& a,
                    const DeviceMemory& x, double beta, DeviceMemory& y) override {
    return cpu_.Gemv(stream, dtype, shape, alpha, a, x, beta, y);
  }
  absl::Status Random(Stream& stream, const RandomParams& params, DType dtype, DeviceMemory& out,
                      int64_t n) override {
    return cpu_.Random(stream, params, dtype, out, n);
  }

 private:
  cpu::CpuBackend cpu_;
  mutable std::mutex mu_;
  absl::Status prepare_error_;
  std::optional<DType> last_prepared_dtype_;
  std::vector<std::string> ranges_;
  std::atomic<int> pushes_{0};
  std::atomic<int> pops_{0};
};

class InstrumentedServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto backend = std::make_unique<InstrumentedBackend>();
    backend_ = backend.get();
    server_ = TestServer::StartWith(std::move(backend), 64 * kMiB, 2);
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect("instrumented");
    ASSERT_NE(client_, nullptr);
  }

  uint64_t PoolUsed() {
    absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
    EXPECT_TRUE(info.ok()) << info.status();
    return info.ok() ? info->devices(0).pool_used_bytes() : ~uint64_t{0};
  }

  InstrumentedBackend* backend_ = nullptr;  // owned by the server
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(InstrumentedServerTest, PrepareElementwiseFailureChangesNothing) {
  const std::vector<double> x = RandomDoubles(1000, -1, 1, 7);
  ASSIGN_OR_FAIL(bx, UploadArray(*client_, x, {}, v1::LAYOUT_C, "x"));
  const uint64_t pool_before = PoolUsed();
  backend_->FailPrepare(absl::ResourceExhaustedError("injected compile failure"));

  // Into a new buffer (allocated before compiling, and freed again) and into an existing one.
  v1::SubmitRequest into_new = Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput("r", v1::DTYPE_FLOAT32));
  ExpectRejected(*client_, into_new, absl::StatusCode::kResourceExhausted, "injected compile failure", {"x"});
  EXPECT_EQ(backend_->last_prepared_dtype(), DType::kFloat32);
  ExpectRejected(*client_, Elementwise("x * 2", {{"x", BufferOperand("x")}}, ExistingOutput("x")),
                 absl::StatusCode::kResourceExhausted, "injected compile failure", {"x"});
  EXPECT_EQ(backend_->last_prepared_dtype(), DType::kFloat64);
  EXPECT_EQ(PoolUsed(), pool_before);
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const v1::KindStats& k : stats->kinds()) {
    EXPECT_NE(k.kind(), v1::OPERATION_KIND_ELEMENTWISE) << "a rejected operation was counted";
  }

  // Once compiling works, the same request succeeds (the name "r" was never taken) and
  // reports the compile time.
  backend_->FailPrepare(absl::OkStatus());
  ASSIGN_OR_FAIL(op, RunOp(*client_, into_new));
  EXPECT_DOUBLE_EQ(op.timing().compile_seconds(), InstrumentedBackend::kCompileSeconds);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).name(), "r");
  ASSIGN_OR_FAIL(r, DownloadArray<float>(*client_, "r"));
  ASSERT_EQ(r.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(r[i], static_cast<float>(x[i] * 2)) << i;
  EXPECT_EQ(PoolUsed(), pool_before + 4000);
}

TEST_F(InstrumentedServerTest, OperationsAndTransfersAreNamedInProfilerRanges) {
  const std::vector<double> x = RandomDoubles(512, -1, 1, 8);
  ASSIGN_OR_FAIL(bx, UploadArray(*client_, x));
  ASSIGN_OR_FAIL(y, RunOp(*client_, Elementwise("x + x", {{"x", BufferOperand(bx.id())}})));
  ASSERT_EQ(y.outputs_size(), 1);
  const std::string by = y.outputs(0).id();
  ASSIGN_OR_FAIL(sum, RunOp(*client_, Reduce(v1::REDUCE_KIND_SUM, by)));
  ASSERT_EQ(sum.outputs_size(), 1);
  ASSIGN_OR_FAIL(down, DownloadArray<double>(*client_, by));
  EXPECT_EQ(down.size(), x.size());

  const std::vector<std::string> ranges = backend_->ranges();
  for (const std::string& want : {absl::StrCat("upload ", bx.id()),
                                  absl::StrCat("elementwise ", bx.id(), " -> ", by),
                                  absl::StrCat("reduce ", by, " -> ", sum.outputs(0).id()),
                                  absl::StrCat("download ", by)}) {
    EXPECT_NE(std::find(ranges.begin(), ranges.end(), want), ranges.end()) << "no range '" << want << "'";
  }
  EXPECT_EQ(backend_->open_ranges(), 0) << "every PushRange has its PopRange";
}

}  // namespace
}  // namespace gpucompute
