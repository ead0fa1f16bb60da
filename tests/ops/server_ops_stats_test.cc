// End-to-end tests of what the server reports about the work it did: GetStats per
// operation kind, and, through a CPU backend that records and injects, the backend's
// optional services: compile time, a failed compile, and the profiler's named ranges.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "server/core/backend.h"
#include "server/cpu/cpu_backend.h"
#include "tests/ops/server_ops_fixture.h"
#include "tests/support/forwarding_backend.h"
#include "tests/support/test_server.h"

namespace gpucompute::testing {
namespace {

TEST_F(ServerOpsTest, StatsCountOperationsPerKind) {
  constexpr size_t n = 10000, rows = 100, cols = 50;
  uint64_t upload_bytes = 0, download_bytes = 0;
  uint64_t ew_read = 0, ew_written = 0, ew_flops = 0, reduce_read = 0;
  // 3 uploads creating buffers.
  ASSIGN_OR_FAIL(auto bx, UploadArray(c(), RandomDoubles(n, 0, 1, 70)));
  ASSIGN_OR_FAIL(auto by, UploadArray(c(), RandomDoubles(n, 0, 1, 71)));
  ASSIGN_OR_FAIL(auto ba, UploadArray(c(), RandomDoubles(rows * cols, 0, 1, 72), {rows, cols}));
  upload_bytes += 2 * n * 8 + rows * cols * 8;
  // 1 upload into an existing buffer: an UPLOAD and a COPY.
  {
    v1::UploadHeader header;
    header.set_buffer(by.id());
    header.set_offset_bytes(80);
    std::vector<double> part(16, 4.0);
    ASSIGN_OR_FAIL(auto r, c().Upload(header, std::as_bytes(std::span<const double>(part))));
    upload_bytes += 16 * 8;
  }
  // 2 filled buffers.
  for (int i = 0; i < 2; ++i) {
    v1::CreateBufferRequest r;
    r.set_dtype(v1::DTYPE_FLOAT64);
    r.add_shape(cols);
    r.mutable_fill()->set_float_value(1.5);
    ASSIGN_OR_FAIL(auto b, c().CreateBuffer(r));
  }
  // 4 elementwise.
  for (const char* text : {"x + y", "x * y", "sin(x) + y", "x < y"}) {
    ASSIGN_OR_FAIL(auto op, RunOp(c(), Elementwise(text, {{"x", BufferOperand(bx.id())},
                                                          {"y", BufferOperand(by.id())}})));
    ew_read += op.timing().bytes_read();
    ew_written += op.timing().bytes_written();
    ew_flops += op.timing().flops();
  }
  // 2 gemv.
  ASSIGN_OR_FAIL(auto vx, UploadArray(c(), RandomDoubles(cols, 0, 1, 73)));
  upload_bytes += cols * 8;
  for (int i = 0; i < 2; ++i) {
    ASSIGN_OR_FAIL(auto op, RunOp(c(), Gemv(ba.id(), vx.id())));
  }
  // 3 reduce.
  for (v1::ReduceKind kind : {v1::REDUCE_KIND_SUM, v1::REDUCE_KIND_MAX, v1::REDUCE_KIND_ARGMIN}) {
    ASSIGN_OR_FAIL(auto op, RunOp(c(), Reduce(kind, bx.id())));
    reduce_read += op.timing().bytes_read();
  }
  // 5 random.
  for (int i = 0; i < 5; ++i) {
    ASSIGN_OR_FAIL(auto op,
                   RunOp(c(), Random(v1::DISTRIBUTION_UNIFORM, {100}, v1::DTYPE_FLOAT32, i)));
  }
  // Rejected requests count nowhere.
  EXPECT_FALSE(c().Submit(Elementwise("x +", {{"x", BufferOperand(bx.id())}})).ok());
  EXPECT_FALSE(c().Submit(Gemv(bx.id(), vx.id())).ok());
  EXPECT_FALSE(c().Submit(Reduce(v1::REDUCE_KIND_MIN, bx.id(), 1)).ok());  // 1-D: no axis 1
  // 2 downloads.
  ASSIGN_OR_FAIL(auto d1, DownloadBytes(c(), bx.id()));
  ASSIGN_OR_FAIL(auto d2, DownloadBytes(c(), ba.id()));
  download_bytes += d1.size() + d2.size();
  ASSERT_OK(c().SynchronizeStream(""));

  ASSIGN_OR_FAIL(auto stats, c().GetStats());
  std::map<v1::OperationKind, v1::KindStats> by_kind;
  for (const v1::KindStats& k : stats.kinds()) {
    EXPECT_FALSE(by_kind.contains(k.kind()))
        << "kind listed twice: " << v1::OperationKind_Name(k.kind());
    by_kind[k.kind()] = k;
  }
  const std::map<v1::OperationKind, uint64_t> want = {
      {v1::OPERATION_KIND_UPLOAD, 5}, {v1::OPERATION_KIND_COPY, 1},
      {v1::OPERATION_KIND_FILL, 2},   {v1::OPERATION_KIND_ELEMENTWISE, 4},
      {v1::OPERATION_KIND_GEMV, 2},   {v1::OPERATION_KIND_REDUCE, 3},
      {v1::OPERATION_KIND_RANDOM, 5}, {v1::OPERATION_KIND_DOWNLOAD, 2}};
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
  ASSIGN_OR_FAIL(auto list, c().ListBuffers());
  EXPECT_EQ(stats.memory_used_bytes(), list.total_bytes());
  EXPECT_GE(stats.memory_peak_bytes(), stats.memory_used_bytes());
  EXPECT_GT(stats.uptime_seconds(), 0);
}

// ---------------------------------------------------------------------------
// The backend's optional services, through a CPU backend that records and injects

// The CPU backend, with PrepareElementwise that fails on demand or reports a compile
// time, and PushRange/PopRange recorded.
class InstrumentedBackend final : public ForwardingBackend {
 public:
  InstrumentedBackend() : ForwardingBackend(std::make_unique<cpu::CpuBackend>(2)) {}

  // While set, PrepareElementwise fails with it.
  void FailPrepare(absl::Status status) {
    std::lock_guard lock(mu_);
    prepare_error_ = std::move(status);
  }
  // While set, Elementwise fails with it at launch, enqueuing nothing.
  void FailElementwise(absl::Status status) {
    std::lock_guard lock(mu_);
    elementwise_error_ = std::move(status);
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

  absl::StatusOr<double> PrepareElementwise(const expr::Program& program,
                                            DType out_dtype) override {
    std::lock_guard lock(mu_);
    last_prepared_dtype_ = out_dtype;
    if (!prepare_error_.ok()) return prepare_error_;
    return kCompileSeconds;
  }
  void PushRange(const std::string& name) override {
    ++pushes_;
    std::lock_guard lock(mu_);
    ranges_.push_back(name);
  }
  void PopRange() override { ++pops_; }

  absl::StatusOr<LaunchInfo> Elementwise(Stream& stream, const expr::Program& program,
                                         std::span<const DeviceMemory* const> inputs,
                                         DeviceMemory& out, DType out_dtype, int64_t n) override {
    {
      std::lock_guard lock(mu_);
      if (!elementwise_error_.ok()) return elementwise_error_;
    }
    return ForwardingBackend::Elementwise(stream, program, inputs, out, out_dtype, n);
  }

 private:
  mutable std::mutex mu_;
  absl::Status prepare_error_;
  absl::Status elementwise_error_;
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
    EXPECT_OK(info);
    return info.ok() ? info->devices(0).pool_used_bytes() : ~uint64_t{0};
  }

  InstrumentedBackend* backend_ = nullptr;  // owned by the server
  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(InstrumentedServerTest, PrepareElementwiseFailureChangesNothing) {
  const std::vector<double> x = RandomDoubles(1000, -1, 1, 7);
  ASSIGN_OR_FAIL(auto bx, UploadArray(*client_, x, {}, v1::LAYOUT_C, "x"));
  const uint64_t pool_before = PoolUsed();
  backend_->FailPrepare(absl::ResourceExhaustedError("injected compile failure"));

  // Into a new buffer (allocated before compiling, and freed again) and into an existing one.
  v1::SubmitRequest into_new =
      Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput("r", v1::DTYPE_FLOAT32));
  ExpectRejected(*client_, into_new, absl::StatusCode::kResourceExhausted,
                 "injected compile failure", {"x"});
  EXPECT_EQ(backend_->last_prepared_dtype(), DType::kFloat32);
  ExpectRejected(*client_, Elementwise("x * 2", {{"x", BufferOperand("x")}}, ExistingOutput("x")),
                 absl::StatusCode::kResourceExhausted, "injected compile failure", {"x"});
  EXPECT_EQ(backend_->last_prepared_dtype(), DType::kFloat64);
  EXPECT_EQ(PoolUsed(), pool_before);
  absl::StatusOr<v1::Stats> stats = client_->GetStats();
  ASSERT_OK(stats);
  for (const v1::KindStats& k : stats->kinds()) {
    EXPECT_NE(k.kind(), v1::OPERATION_KIND_ELEMENTWISE) << "a rejected operation was counted";
  }

  // Once compiling works, the same request succeeds (the name "r" was never taken) and
  // reports the compile time.
  backend_->FailPrepare(absl::OkStatus());
  ASSIGN_OR_FAIL(auto op, RunOp(*client_, into_new));
  EXPECT_DOUBLE_EQ(op.timing().compile_seconds(), InstrumentedBackend::kCompileSeconds);
  ASSERT_EQ(op.outputs_size(), 1);
  EXPECT_EQ(op.outputs(0).name(), "r");
  ASSIGN_OR_FAIL(auto r, DownloadArray<float>(*client_, "r"));
  ASSERT_EQ(r.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(r[i], static_cast<float>(x[i] * 2)) << i;
  EXPECT_EQ(PoolUsed(), pool_before + 4000);
}

// An operation that fails at launch has already published its new output: the output
// reads as zeros, not as the bytes of the block it was given (a buffer just freed).
TEST_F(InstrumentedServerTest, FailedLaunchLeavesItsNewOutputZeroed) {
  constexpr uint64_t n = uint64_t{1} << 20;
  ASSIGN_OR_FAIL(auto bx, UploadArray(*client_, RandomDoubles(n, -1, 1, 9), {}, v1::LAYOUT_C, "x"));
  v1::CreateBufferRequest old;
  old.set_dtype(v1::DTYPE_FLOAT64);
  old.add_shape(n);
  old.mutable_fill()->set_float_value(7.25);
  ASSIGN_OR_FAIL(auto freed, client_->CreateBuffer(old));
  ASSERT_OK(client_->DeleteBuffer(freed.id()));

  backend_->FailElementwise(absl::InternalError("injected launch failure"));
  absl::StatusOr<v1::Operation> failed = RunOp(
      *client_, Elementwise("x * 2", {{"x", BufferOperand("x")}}, NewOutput("r", v1::DTYPE_FLOAT64)));
  backend_->FailElementwise(absl::OkStatus());
  ASSERT_FALSE(failed.ok());
  ExpectContains(std::string(failed.status().message()), "injected launch failure");
  ASSIGN_OR_FAIL(auto r, DownloadArray<double>(*client_, "r"));
  ASSERT_EQ(r.size(), n);
  EXPECT_EQ(std::count(r.begin(), r.end(), 0.0), static_cast<std::ptrdiff_t>(n))
      << "the first element is " << r.front();
}

TEST_F(InstrumentedServerTest, OperationsAndTransfersAreNamedInProfilerRanges) {
  const std::vector<double> x = RandomDoubles(512, -1, 1, 8);
  ASSIGN_OR_FAIL(auto bx, UploadArray(*client_, x));
  ASSIGN_OR_FAIL(auto y, RunOp(*client_, Elementwise("x + x", {{"x", BufferOperand(bx.id())}})));
  ASSERT_EQ(y.outputs_size(), 1);
  const std::string by = y.outputs(0).id();
  ASSIGN_OR_FAIL(auto sum, RunOp(*client_, Reduce(v1::REDUCE_KIND_SUM, by)));
  ASSERT_EQ(sum.outputs_size(), 1);
  ASSIGN_OR_FAIL(auto down, DownloadArray<double>(*client_, by));
  EXPECT_EQ(down.size(), x.size());

  const std::vector<std::string> ranges = backend_->ranges();
  for (const std::string& want :
       {absl::StrCat("upload ", bx.id()), absl::StrCat("elementwise ", bx.id(), " -> ", by),
        absl::StrCat("reduce ", by, " -> ", sum.outputs(0).id()), absl::StrCat("download ", by)}) {
    EXPECT_NE(std::find(ranges.begin(), ranges.end(), want), ranges.end())
        << "no range '" << want << "'";
  }
  EXPECT_EQ(backend_->open_ranges(), 0) << "every PushRange has its PopRange";
}

}  // namespace
}  // namespace gpucompute::testing
