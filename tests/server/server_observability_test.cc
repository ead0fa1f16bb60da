// End-to-end tests of what an operator sees, over a real socket: request ids (returned
// on every call, validated, carried in the log lines), transfers that a client broke
// off or left idle (counted in GetStats, their memory released), and the plain Upload's
// idle timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/cpp/client.h"
#include "gpucompute/v1/gpucompute.grpc.pb.h"
#include "gpucompute/v1/limits.h"
#include "server/util/log.h"
#include "tests/support/test_server.h"

namespace gpucompute {
namespace {

using ::gpucompute::testing::CreateFloat64;
using ::gpucompute::testing::Snapshot;
using ::gpucompute::testing::TakeSnapshot;
using ::gpucompute::testing::TestServer;
using Code = absl::StatusCode;

Code GrpcCode(const grpc::Status& s) { return static_cast<Code>(s.error_code()); }

using UploadWriter = std::unique_ptr<grpc::ClientWriter<v1::UploadRequest>>;

bool WriteHeader(UploadWriter& writer, const v1::UploadHeader& header) {
  v1::UploadRequest request;
  *request.mutable_header() = header;
  return writer->Write(request);
}

bool WriteChunk(UploadWriter& writer, std::string bytes) {
  v1::UploadRequest chunk;
  chunk.set_chunk(std::move(bytes));
  return writer->Write(chunk);
}

// The stats of `kind`; all zero if the server has none for it.
v1::KindStats StatsOf(Client& client, v1::OperationKind kind) {
  absl::StatusOr<v1::Stats> stats = client.GetStats();
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) {
    for (const v1::KindStats& k : stats->kinds()) {
      if (k.kind() == kind) return k;
    }
  }
  v1::KindStats none;
  none.set_kind(kind);
  return none;
}

// Waits up to 10 s for `done` to hold.
template <typename Predicate>
bool WaitFor(Predicate done) {
  for (int i = 0; i < 1000; ++i) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return done();
}

// Collects the log lines written while it lives.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](absl::string_view line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(line);
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }

  // The lines that contain every one of `parts`.
  std::vector<std::string> Find(const std::vector<std::string>& parts) {
    std::lock_guard lock(mu_);
    std::vector<std::string> found;
    for (const std::string& line : lines_) {
      bool all = true;
      for (const std::string& p : parts) all = all && line.find(p) != std::string::npos;
      if (all) found.push_back(line);
    }
    return found;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

class ServerObservabilityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = TestServer::StartWith(nullptr, 256 * testing::kMiB, 2, [](ServerOptions& options) {
      // Long enough that a slow machine (or a sanitizer) never idles an upload
      // that is sending.
      options.upload_idle_timeout_seconds = 1;
    });
    ASSERT_NE(server_, nullptr);
    client_ = server_->Connect();
    ASSERT_NE(client_, nullptr);
    stub_ = v1::BufferService::NewStub(server_->RawChannel());
    server_stub_ = v1::ServerService::NewStub(server_->RawChannel());
  }

  std::unique_ptr<TestServer> server_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<v1::BufferService::Stub> stub_;
  std::unique_ptr<v1::ServerService::Stub> server_stub_;
};

TEST_F(ServerObservabilityTest, EveryCallGetsARequestIdBack) {
  // None sent: the server makes one up, a new one per call.
  std::string first;
  for (int i = 0; i < 2; ++i) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(server_stub_->GetServerInfo(&context, {}, &info).ok());
    const auto& md = context.GetServerInitialMetadata();
    auto it = md.find(kRequestIdMetadataKey);
    ASSERT_NE(it, md.end());
    const std::string id(it->second.data(), it->second.size());
    EXPECT_EQ(id.rfind("req-", 0), 0u) << id;
    EXPECT_EQ(id.size(), 4u + 32u) << id;
    EXPECT_NE(id, first);
    first = id;
  }
  // One sent comes back as it was, also on a failed call and on a stream.
  {
    grpc::ClientContext context;
    context.AddMetadata(kRequestIdMetadataKey, "job-7/step 3");
    v1::GetBufferRequest request;
    request.set_buffer("no-such-buffer");
    v1::BufferInfo info;
    EXPECT_EQ(GrpcCode(stub_->GetBuffer(&context, request, &info)), Code::kNotFound);
    auto it = context.GetServerInitialMetadata().find(kRequestIdMetadataKey);
    ASSERT_NE(it, context.GetServerInitialMetadata().end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), "job-7/step 3");
  }
  {
    grpc::ClientContext context;
    context.AddMetadata(kRequestIdMetadataKey, "stream-id");
    v1::UploadResponse response;
    auto writer = stub_->Upload(&context, &response);
    ASSERT_TRUE(WriteHeader(writer, CreateFloat64(4)));
    ASSERT_TRUE(WriteChunk(writer, std::string(32, '\0')));
    writer->WritesDone();
    ASSERT_TRUE(writer->Finish().ok());
    auto it = context.GetServerInitialMetadata().find(kRequestIdMetadataKey);
    ASSERT_NE(it, context.GetServerInitialMetadata().end());
    EXPECT_EQ(std::string(it->second.data(), it->second.size()), "stream-id");
  }
  // The client library: a failed call's status carries the id.
  ClientOptions options;
  options.target = server_->target();
  options.request_id = "lib-id";
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  ASSERT_TRUE(client.ok()) << client.status();
  absl::StatusOr<v1::BufferInfo> missing = (*client)->GetBuffer("no-such-buffer");
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_EQ(RequestIdOf(missing.status()), "lib-id");
  options.request_id = std::string(kMaxRequestIdBytes + 1, 'x');
  EXPECT_EQ(Client::Connect(options).status().code(), Code::kInvalidArgument);
}

TEST_F(ServerObservabilityTest, InvalidRequestIdIsRefusedAndChangesNothing) {
  const Snapshot before = TakeSnapshot(*client_);
  for (const std::string& bad : {std::string(kMaxRequestIdBytes + 1, 'a'), std::string("")}) {
    SCOPED_TRACE(bad.size());
    {
      grpc::ClientContext context;
      context.AddMetadata(kRequestIdMetadataKey, bad);
      v1::CreateBufferRequest request;
      request.set_dtype(v1::DTYPE_FLOAT32);
      request.add_shape(16);
      v1::CreateBufferResponse created;
      const grpc::Status status = stub_->CreateBuffer(&context, request, &created);
      EXPECT_EQ(GrpcCode(status), Code::kInvalidArgument) << status.error_message();
      EXPECT_NE(status.error_message().find(kRequestIdMetadataKey), std::string::npos);
    }
    {
      grpc::ClientContext context;
      context.AddMetadata(kRequestIdMetadataKey, bad);
      v1::Stats stats;
      EXPECT_EQ(GrpcCode(server_stub_->GetStats(&context, {}, &stats)), Code::kInvalidArgument);
    }
    {
      grpc::ClientContext context;
      context.AddMetadata(kRequestIdMetadataKey, bad);
      v1::UploadResponse response;
      auto writer = stub_->Upload(&context, &response);
      WriteHeader(writer, CreateFloat64(4));
      writer->WritesDone();
      EXPECT_EQ(GrpcCode(writer->Finish()), Code::kInvalidArgument);
    }
  }
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

TEST_F(ServerObservabilityTest, FailedCallIsLoggedWithItsRequestId) {
  LogCapture log;
  grpc::ClientContext context;
  context.AddMetadata(kRequestIdMetadataKey, "trace \"me\"");
  context.AddMetadata(kClientMetadataKey, "alice");
  v1::DeleteBufferRequest request;
  request.set_buffer("buf-unknown");
  v1::DeleteBufferResponse response;
  EXPECT_EQ(GrpcCode(stub_->DeleteBuffer(&context, request, &response)), Code::kNotFound);
  // The interceptor logs as the status is sent, before the client hears it.
  const std::vector<std::string> lines =
      log.Find({"\"request_id\":\"trace \\\"me\\\"\"",
                "\"method\":\"/gpucompute.v1.BufferService/DeleteBuffer\"", "\"client\":\"alice\"",
                "\"code\":\"NOT_FOUND\"", "\"level\":\"warning\""});
  EXPECT_EQ(lines.size(), 1u);
  // A successful call writes nothing.
  grpc::ClientContext ok_context;
  ok_context.AddMetadata(kRequestIdMetadataKey, "quiet-call");
  v1::ServerInfo info;
  ASSERT_TRUE(server_stub_->GetServerInfo(&ok_context, {}, &info).ok());
  EXPECT_TRUE(log.Find({"quiet-call"}).empty());
}

TEST_F(ServerObservabilityTest, ReportsTheUploadIdleTimeout) {
  absl::StatusOr<v1::ServerInfo> info = client_->GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_DOUBLE_EQ(info->limits().stream_upload_idle_timeout_seconds(), 1.0);
}

// A header that reserves memory, then silence: the upload fails with DEADLINE_EXCEEDED
// after the idle timeout, its memory is released, nothing is published, and GetStats
// counts it.
TEST_F(ServerObservabilityTest, IdleUploadTimesOutAndReleasesItsMemory) {
  const Snapshot before = TakeSnapshot(*client_);
  const v1::KindStats stats_before = StatsOf(*client_, v1::OPERATION_KIND_UPLOAD);
  grpc::ClientContext context;
  v1::UploadResponse response;
  auto writer = stub_->Upload(&context, &response);
  ASSERT_TRUE(WriteHeader(writer, CreateFloat64(1 << 20)));  // 8 MiB
  ASSERT_TRUE(WriteChunk(writer, std::string(4096, '\1')));
  // Reserved while the client is silent...
  EXPECT_TRUE(
      WaitFor([&] { return TakeSnapshot(*client_).memory_used_bytes > before.memory_used_bytes; }));
  const auto start = std::chrono::steady_clock::now();
  const grpc::Status status = writer->Finish();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(GrpcCode(status), Code::kDeadlineExceeded) << status.error_message();
  EXPECT_NE(status.error_message().find("received no data for 1 s"), std::string::npos)
      << status.error_message();
  EXPECT_LT(waited, 5.0);
  // ...and free once it hears the outcome.
  EXPECT_EQ(TakeSnapshot(*client_), before);
  const v1::KindStats after = StatsOf(*client_, v1::OPERATION_KIND_UPLOAD);
  EXPECT_EQ(after.timed_out(), stats_before.timed_out() + 1);
  EXPECT_EQ(after.failed(), stats_before.failed() + 1);
  EXPECT_EQ(after.cancelled(), stats_before.cancelled());
}

TEST_F(ServerObservabilityTest, UploadThatKeepsSendingIsNotTimedOut) {
  grpc::ClientContext context;
  v1::UploadResponse response;
  auto writer = stub_->Upload(&context, &response);
  ASSERT_TRUE(WriteHeader(writer, CreateFloat64(15 * 512)));
  // 15 chunks 0.1 s apart: 1.5 s in all, never 1 s without a chunk.
  for (int i = 0; i < 15; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_TRUE(WriteChunk(writer, std::string(8 * 512, static_cast<char>(i)))) << i;
  }
  writer->WritesDone();
  const grpc::Status status = writer->Finish();
  EXPECT_TRUE(status.ok()) << status.error_message();
}

// Uploads and downloads broken off part-way are counted as cancelled (and failed), and
// their memory comes back.
TEST_F(ServerObservabilityTest, KilledTransfersAreCounted) {
  // 32 MiB: more than gRPC sends ahead of a reader that stopped after one chunk.
  const uint64_t elements = 1 << 22;
  absl::StatusOr<v1::UploadResponse> stored =
      client_->Upload(CreateFloat64(elements), std::vector<std::byte>(8 * elements));
  ASSERT_TRUE(stored.ok()) << stored.status();
  const Snapshot before = TakeSnapshot(*client_);
  const v1::KindStats uploads = StatsOf(*client_, v1::OPERATION_KIND_UPLOAD);
  const v1::KindStats downloads = StatsOf(*client_, v1::OPERATION_KIND_DOWNLOAD);

  {
    grpc::ClientContext context;
    v1::UploadResponse response;
    auto writer = stub_->Upload(&context, &response);
    ASSERT_TRUE(WriteHeader(writer, CreateFloat64(elements)));
    ASSERT_TRUE(WriteChunk(writer, std::string(1 << 20, '\2')));
    // Cancelled once the server has taken the header (and reserved the memory): a stream
    // cancelled before that started no upload.
    EXPECT_TRUE(WaitFor(
        [&] { return TakeSnapshot(*client_).memory_used_bytes > before.memory_used_bytes; }));
    context.TryCancel();
    EXPECT_EQ(GrpcCode(writer->Finish()), Code::kCancelled);
  }
  {
    grpc::ClientContext context;
    v1::DownloadRequest request;
    request.set_buffer(stored->buffer().id());
    request.set_chunk_bytes(64 << 10);
    auto reader = stub_->Download(&context, request);
    v1::DownloadResponse first;
    ASSERT_TRUE(reader->Read(&first));
    context.TryCancel();
    EXPECT_EQ(GrpcCode(reader->Finish()), Code::kCancelled);
  }
  EXPECT_TRUE(WaitFor([&] {
    return StatsOf(*client_, v1::OPERATION_KIND_UPLOAD).cancelled() == uploads.cancelled() + 1 &&
           StatsOf(*client_, v1::OPERATION_KIND_DOWNLOAD).cancelled() == downloads.cancelled() + 1;
  }));
  const v1::KindStats up = StatsOf(*client_, v1::OPERATION_KIND_UPLOAD);
  const v1::KindStats down = StatsOf(*client_, v1::OPERATION_KIND_DOWNLOAD);
  EXPECT_EQ(up.failed(), uploads.failed() + 1);
  EXPECT_EQ(up.count(), uploads.count() + 1);
  EXPECT_EQ(up.timed_out(), uploads.timed_out());
  EXPECT_EQ(down.failed(), downloads.failed() + 1);
  EXPECT_EQ(down.count(), downloads.count() + 1);
  EXPECT_TRUE(WaitFor([&] { return TakeSnapshot(*client_) == before; }));
  EXPECT_EQ(TakeSnapshot(*client_), before);
}

}  // namespace
}  // namespace gpucompute
