#include "tests/ops/server_ops_fixture.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/cpp/session.h"

namespace gpucompute::testing {

void ServerOpsTest::SetUp() {
  server_ = TestServer::Start(512 * kMiB, 2);
  ASSERT_NE(server_, nullptr);
  client_ = server_->Connect("ops-test");
  ASSERT_NE(client_, nullptr);
}

v1::SubmitRequest Waiting(v1::SubmitRequest request, std::string_view stream) {
  request.set_wait(true);
  request.set_stream_id(std::string(stream));
  return request;
}

v1::SubmitRequest OnStream(v1::SubmitRequest request, std::string_view stream) {
  request.set_wait(false);
  request.set_stream_id(std::string(stream));
  return request;
}

absl::StatusOr<v1::Operation> RunOp(Client& client, v1::SubmitRequest request,
                                    std::string_view stream) {
  absl::StatusOr<v1::Operation> op = client.Submit(Waiting(std::move(request), stream));
  if (!op.ok()) return op.status();
  if (!op->done() || op->state() != v1::Operation::STATE_SUCCEEDED) {
    return absl::InternalError(absl::StrCat("operation not succeeded: ", op->DebugString()));
  }
  return op;
}

void ExpectRejected(Client& client, const v1::SubmitRequest& request, absl::StatusCode code,
                    std::string_view needle, const std::vector<std::string>& watched) {
  const Snapshot before = TakeSnapshot(client);
  std::vector<std::string> contents;
  for (const std::string& b : watched) {
    ASSIGN_OR_FAIL(std::string bytes, DownloadBytes(client, b));
    contents.push_back(std::move(bytes));
  }
  absl::StatusOr<v1::Operation> op = client.Submit(request);
  ASSERT_FALSE(op.ok()) << "accepted: " << request.DebugString();
  EXPECT_EQ(op.status().code(), code) << op.status() << "\nrequest: " << request.DebugString();
  if (!needle.empty()) {
    EXPECT_NE(std::string(op.status().message()).find(needle), std::string::npos)
        << "message '" << op.status().message() << "' lacks '" << needle << "'";
  }
  EXPECT_EQ(TakeSnapshot(client), before) << "a rejected request changed the buffers";
  for (size_t i = 0; i < watched.size(); ++i) {
    ASSIGN_OR_FAIL(std::string bytes, DownloadBytes(client, watched[i]));
    EXPECT_TRUE(bytes == contents[i]) << "a rejected request changed buffer " << watched[i];
  }
}

uint64_t CompletedCount(Client& client, v1::OperationKind kind) {
  absl::StatusOr<v1::Stats> stats = client.GetStats();
  EXPECT_OK(stats);
  if (!stats.ok()) return 0;
  for (const v1::KindStats& k : stats->kinds()) {
    if (k.kind() == kind) return k.count();
  }
  return 0;
}

std::vector<double> Iota(size_t n, double scale) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<double>(i % 65536) * scale;
  return v;
}

namespace {

// On a GPU, where a plain x + 1 over kBig elements takes microseconds, a link of the chain
// needs ~100 nested sines per element: 0 * sin(...) is exactly 0 for finite x, so the
// result is still x + 1.
std::string IncrementExpression() {
  if (TestBackendName() == "cpu") return "x + 1";
  std::string sines = "x";
  for (int i = 0; i < 100; ++i) sines = absl::StrCat("sin(", sines, ")");
  return absl::StrCat("x + 1 + 0 * ", sines);
}

}  // namespace

void ExpectMemoryReturnsTo(Client& client, uint64_t bytes) {
  uint64_t used = 0;
  for (int i = 0; i < 500; ++i) {
    absl::StatusOr<v1::ServerInfo> info = client.GetServerInfo();
    ASSERT_OK(info);
    used = info->memory_used_bytes();
    if (used == bytes) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(used, bytes) << "memory in use did not return to what it was";
}

void ExpectContains(std::string_view text, std::string_view needle) {
  EXPECT_NE(text.find(needle), std::string_view::npos) << "'" << needle << "' not in: " << text;
}

v1::Operand Tagged(std::string_view tag) { return BufferOperand(TagRef(tag)); }

v1::SubmitRequest Increment(const std::string& buffer, std::string_view stream) {
  static const std::string kExpression = IncrementExpression();
  return OnStream(Elementwise(kExpression, {{"x", BufferOperand(buffer)}}, ExistingOutput(buffer)),
                  stream);
}

std::vector<std::string> QueueChain(Client& client, const std::string& buffer, int count,
                                    std::string_view stream) {
  std::vector<std::string> ids;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<v1::Operation> op = client.Submit(Increment(buffer, stream));
    EXPECT_OK(op);
    if (op.ok()) ids.push_back(op->id());
  }
  return ids;
}

void ExpectShifted(Client& client, const std::string& buffer, const std::vector<double>& base,
                   double delta, std::string_view what) {
  ASSIGN_OR_FAIL(std::vector<double> got, DownloadArray<double>(client, buffer));
  ASSERT_EQ(got.size(), base.size()) << what;
  for (size_t i = 0; i < base.size(); ++i) {
    ASSERT_EQ(got[i], base[i] + delta) << what << " [" << i << "]";
  }
}

}  // namespace gpucompute::testing
